# docs/cli.md names every option the launcher's --help lists (tools/check_docs.py, which the
# header stage also runs for the docs' links and paths).
find_program(ELASTIC_PYTHON NAMES python3)
if(TARGET test-agent-elasticrun AND NOT ELASTIC_TEST_TAG AND ELASTIC_PYTHON)
  set(name "docs: every link and path resolves, and docs/cli.md names every option of elasticrun --help")
  add_test(NAME "${name}" COMMAND ${ELASTIC_PYTHON} "${PROJECT_SOURCE_DIR}/tools/check_docs.py"
    --elasticrun "${ELASTIC_TEST_PROGRAM_DIR}/agent-elasticrun")
  set_tests_properties("${name}" PROPERTIES LABELS docs)
endif()
