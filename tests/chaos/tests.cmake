# The chaos harness's bounded slice (tests/chaos/chaos.py): a few seeded schedules of faults on
# real agents, each checked against the job's invariants; bench/chaos/bench_chaos.py runs
# thousands. The plain and the sanitized flavours run it (an agent that trips a sanitizer under a
# fault exits non-zero, which the harness reports); the ThreadSanitizer flavour builds only the
# concurrent test files. COST starts them first: they mostly wait, and would otherwise end the run
# alone. Each runs five agents with their workers, so it counts as two of ctest's -j slots.
find_program(ELASTIC_PYTHON NAMES python3)
if(TARGET test-chaos-worker AND TARGET test-agent-elasticrun AND NOT ELASTIC_TEST_TAG AND ELASTIC_PYTHON)
  set(chaos "${CMAKE_CURRENT_LIST_DIR}/chaos.py")
  set(programs --elasticrun "${ELASTIC_TEST_PROGRAM_DIR}/agent-elasticrun"
               --worker "${ELASTIC_TEST_PROGRAM_DIR}/chaos-worker")
  set(name "chaos: three seeded fault schedules on 3 to 5 agents on loopback keep every invariant")
  add_test(NAME "${name}" COMMAND ${ELASTIC_PYTHON} "${chaos}" ${programs}
    --schedules 3 --seed 1 --agents 5 --duration 12 --workdir "${CMAKE_BINARY_DIR}/chaos/loopback")
  set_tests_properties("${name}" PROPERTIES LABELS chaos TIMEOUT 600 COST 10000 PROCESSORS 2)
  # Root only (network namespaces); 77 = skipped, with the reason in the output.
  set(name "chaos: two seeded fault schedules with link cuts, each agent on a machine of its own, keep every invariant")
  add_test(NAME "${name}" COMMAND ${ELASTIC_PYTHON} "${chaos}" ${programs} --netns
    --schedules 2 --seed 1 --agents 5 --duration 12 --workdir "${CMAKE_BINARY_DIR}/chaos/netns")
  set_tests_properties("${name}" PROPERTIES LABELS chaos TIMEOUT 600 SKIP_RETURN_CODE 77 COST 10000
                                               PROCESSORS 2)
  set(name "chaos: the log checks of the harness fire on made-up logs that break them")
  add_test(NAME "${name}" COMMAND ${ELASTIC_PYTHON} "${chaos}" --self-test)
  set_tests_properties("${name}" PROPERTIES LABELS chaos)
endif()
