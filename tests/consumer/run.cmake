# cmake -DMODE=add_subdirectory|single_header -DSOURCE_DIR=... -DWORK_DIR=...
#       -DCXX=... -DGENERATOR=... -P run.cmake
# Builds tests/consumer the way a user would and runs the program it made.
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(consumer "${SOURCE_DIR}/tests/consumer")
# No build type, as a user who sets none gets: the packaging is under test, not the optimizer
# (a Release build of the compiled library alone takes minutes here).
set(common -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=)

if(MODE STREQUAL "single_header")
  # Install the headers and the package alone, nothing compiled. (The full install, programs
  # and find_package(elastic) with elastic::elastic, is docs/quickstart.md's, which
  # tools/check_quickstart.sh runs.)
  run(${CMAKE_COMMAND} -S "${SOURCE_DIR}" -B "${WORK_DIR}/lib" ${common}
      -DELASTIC_DEVELOPER=OFF -DELASTIC_BUILD_PROGRAMS=OFF -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} --install "${WORK_DIR}/lib")
  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer" ${common}
      -DELASTIC_CONSUMER_MODE=find_package_single -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix)
elseif(MODE STREQUAL "add_subdirectory")
  run(${CMAKE_COMMAND} -S "${consumer}" -B "${WORK_DIR}/consumer" ${common}
      -DELASTIC_CONSUMER_MODE=add_subdirectory -DELASTIC_SOURCE_DIR=${SOURCE_DIR})
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()

run(${CMAKE_COMMAND} --build "${WORK_DIR}/consumer")
run("${WORK_DIR}/consumer/consumer")
if(NOT last_output MATCHES "^elastic [0-9]+\\.[0-9]+\\.[0-9]+")
  message(FATAL_ERROR "the consumer printed '${last_output}', not its version")
endif()
if(MODE STREQUAL "add_subdirectory")
  run("${WORK_DIR}/consumer/launcher" --version)
  if(NOT last_output MATCHES "^launcher \\(elastic\\) [0-9]+\\.[0-9]+\\.[0-9]+")
    message(FATAL_ERROR "the elastic::compiled launcher printed '${last_output}', not its version")
  endif()
  run("${WORK_DIR}/consumer/pieces")
  if(NOT last_output STREQUAL "pieces ok\n")
    message(FATAL_ERROR "the elastic::compiled pieces program printed '${last_output}'")
  endif()
endif()
if(MODE STREQUAL "single_header")
  # The installed single header must be alone on the path: no elastic/ tree beside it.
  if(EXISTS "${WORK_DIR}/prefix/include/elastic-single/elastic")
    message(FATAL_ERROR "the single-header install has an elastic/ tree beside it")
  endif()
endif()
message(STATUS "consumer (${MODE}): ${last_output}")
