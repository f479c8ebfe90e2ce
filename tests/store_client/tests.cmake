# The store client layer's extra target: a libtorch c10d::TCPStore client used by
# test_store_client_torch.cpp against our server. Built once: only in the plain multi-header
# flavour (no sanitizers: libtorch is not instrumented), with c10d headers only and without our
# -Werror flags (its headers warn under -Wpedantic/-Wshadow).
if(TARGET elastic_tests AND NOT ELASTIC_SANITIZE AND NOT ELASTIC_SINGLE_HEADER)
  find_package(Torch QUIET)
  if(Torch_FOUND)
    add_executable(libtorch-store-client "${CMAKE_CURRENT_LIST_DIR}/libtorch_client.cpp")
    target_include_directories(libtorch-store-client SYSTEM PRIVATE ${TORCH_INCLUDE_DIRS})
    target_link_libraries(libtorch-store-client PRIVATE ${TORCH_LIBRARIES})
    target_compile_features(libtorch-store-client PRIVATE cxx_std_17)
    separate_arguments(_elastic_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
    target_compile_options(libtorch-store-client PRIVATE ${_elastic_torch_flags} -w)
    set_target_properties(libtorch-store-client PROPERTIES
      RUNTIME_OUTPUT_DIRECTORY "${ELASTIC_TEST_PROGRAM_DIR}")
    add_dependencies(elastic_tests libtorch-store-client)
    target_compile_definitions(elastic_tests PRIVATE
      ELASTIC_TEST_LIBTORCH_CLIENT="${ELASTIC_TEST_PROGRAM_DIR}/libtorch-store-client")
  endif()
endif()
