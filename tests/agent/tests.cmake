# The agent layer's extra wiring: the libtorch example, when built, is run by
# test_libtorch_trainer.cpp (a trainer on c10d::ProcessGroupGloo under the real launcher).
if(TARGET elastic_tests AND TARGET example-libtorch-trainer)
  add_dependencies(elastic_tests example-libtorch-trainer)
  target_compile_definitions(elastic_tests PRIVATE
    ELASTIC_TEST_LIBTORCH_TRAINER="$<TARGET_FILE:example-libtorch-trainer>")
endif()
