# Helpers for elastic's own programs (tests, examples, fuzzers): warnings, sanitizers, and the
# choice between the multi-header tree and the single header.

set(ELASTIC_WARNING_FLAGS -Wall -Wextra -Wpedantic -Wconversion -Wshadow)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
  # g++ 12 at -O2/-O3 reports impossible overlaps inside std::string's own memcpy
  # (GCC bug 105329, fixed in 13); it fires on ordinary assignments in optimized builds only.
  list(APPEND ELASTIC_WARNING_FLAGS -Wno-restrict)
endif()
if(ELASTIC_WERROR)
  list(APPEND ELASTIC_WARNING_FLAGS -Werror)
endif()

set(ELASTIC_SANITIZER_FLAGS "")
if(ELASTIC_SANITIZE)
  set(ELASTIC_SANITIZER_FLAGS -fsanitize=${ELASTIC_SANITIZE} -fno-omit-frame-pointer)
  if(ELASTIC_SANITIZE MATCHES "undefined")
    list(APPEND ELASTIC_SANITIZER_FLAGS -fno-sanitize-recover=all)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      # clang 14's -fsanitize=function rejects the indirect calls Asio's coroutine frames make.
      list(APPEND ELASTIC_SANITIZER_FLAGS -fno-sanitize=function)
    endif()
  endif()
endif()

# The interface our programs build against: include/ (default) or single_include/ only.
if(ELASTIC_SINGLE_HEADER)
  set(_fwd "${CMAKE_BINARY_DIR}/single_fwd")
  file(REMOVE_RECURSE "${_fwd}")
  file(GLOB_RECURSE _headers CONFIGURE_DEPENDS RELATIVE "${PROJECT_SOURCE_DIR}/include"
       "${PROJECT_SOURCE_DIR}/include/elastic/*.hpp")
  foreach(h IN LISTS _headers)
    file(WRITE "${_fwd}/${h}"
         "// Generated: in the single-header build every elastic header is the single header.\n"
         "#pragma once\n#include <elastic.hpp>\n")
  endforeach()
  add_library(elastic_programs_base INTERFACE)
  target_include_directories(elastic_programs_base INTERFACE "${_fwd}")
  target_link_libraries(elastic_programs_base INTERFACE elastic_single)
  target_compile_definitions(elastic_programs_base INTERFACE ELASTIC_TEST_SINGLE_HEADER=1)
else()
  add_library(elastic_programs_base INTERFACE)
  target_link_libraries(elastic_programs_base INTERFACE elastic)
endif()

# elastic_program(<target> [COMPILED]): our flags and the chosen interface on one of our own
# programs. COMPILED builds it with ELASTIC_SEPARATE_COMPILATION, linked to
# elastic_programs_compiled: elastic/impl/src.hpp compiled once, through the same interface.
function(elastic_program target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "COMPILED" "" "")
  if(arg_COMPILED)
    if(NOT TARGET elastic_programs_compiled)
      add_library(elastic_programs_compiled STATIC "${PROJECT_SOURCE_DIR}/src/compiled.cpp")
      target_link_libraries(elastic_programs_compiled PUBLIC elastic_programs_base)
      target_compile_definitions(elastic_programs_compiled PUBLIC ELASTIC_SEPARATE_COMPILATION=1
                                                           PRIVATE ELASTIC_IMPL_SOURCE=1)
      target_compile_options(elastic_programs_compiled PRIVATE ${ELASTIC_WARNING_FLAGS}
                                                               ${ELASTIC_SANITIZER_FLAGS})
      set_target_properties(elastic_programs_compiled PROPERTIES CXX_EXTENSIONS OFF)
    endif()
    target_link_libraries(${target} PRIVATE elastic_programs_compiled)
  endif()
  target_link_libraries(${target} PRIVATE elastic_programs_base)
  target_compile_options(${target} PRIVATE ${ELASTIC_WARNING_FLAGS} ${ELASTIC_SANITIZER_FLAGS})
  target_link_options(${target} PRIVATE ${ELASTIC_SANITIZER_FLAGS})
  set_target_properties(${target} PROPERTIES CXX_EXTENSIONS OFF)
endfunction()

# One translation unit per header under include/, including only that header (twice, to prove
# the include guard), so a header that leans on another's includes fails to build. They are
# checked, not compiled (cmake/syntax_only.sh adds -fsyntax-only): the front end parses and
# instantiates all the same, every warning it gives holds, and no code is emitted, which takes
# about a third off the time of 100-odd files.
function(elastic_add_header_checks)
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS RELATIVE "${PROJECT_SOURCE_DIR}/include"
       "${PROJECT_SOURCE_DIR}/include/*.hpp")
  set(sources "")
  foreach(h IN LISTS headers)
    string(MAKE_C_IDENTIFIER "${h}" id)
    set(src "${CMAKE_BINARY_DIR}/header_checks/${id}.cpp")
    file(CONFIGURE OUTPUT "${src}" CONTENT "#include <${h}>\n#include <${h}>\n")
    list(APPEND sources "${src}")
  endforeach()
  # The umbrella without its launcher part, as a worker includes it: builds, and no CLI11
  # (CLI/CLI.hpp defines CLI11_VERSION).
  set(src "${CMAKE_BINARY_DIR}/header_checks/no_launcher_elastic_hpp.cpp")
  file(CONFIGURE OUTPUT "${src}" CONTENT [=[
#define ELASTIC_NO_LAUNCHER
#include <elastic.hpp>
#include <elastic.hpp>
#ifdef CLI11_VERSION
#error "CLI11 reaches a file that defines ELASTIC_NO_LAUNCHER"
#endif
]=])
  list(APPEND sources "${src}")
  add_library(elastic_header_checks OBJECT ${sources})
  target_link_libraries(elastic_header_checks PRIVATE elastic)
  target_compile_options(elastic_header_checks PRIVATE ${ELASTIC_WARNING_FLAGS})
  set_target_properties(elastic_header_checks PROPERTIES CXX_EXTENSIONS OFF
    CXX_COMPILER_LAUNCHER "${PROJECT_SOURCE_DIR}/cmake/syntax_only.sh")
  # The headers that ELASTIC_SEPARATE_COMPILATION changes, alone in that mode too.
  set(sources "")
  foreach(h elastic/run.hpp elastic/launch/run.hpp elastic/launch/cli.hpp elastic/dist.hpp)
    string(MAKE_C_IDENTIFIER "${h}" id)
    set(src "${CMAKE_BINARY_DIR}/header_checks/separate_${id}.cpp")
    file(CONFIGURE OUTPUT "${src}" CONTENT "#include <${h}>\n#include <${h}>\n")
    list(APPEND sources "${src}")
  endforeach()
  add_library(elastic_header_checks_separate OBJECT ${sources})
  target_link_libraries(elastic_header_checks_separate PRIVATE elastic)
  target_compile_definitions(elastic_header_checks_separate PRIVATE ELASTIC_SEPARATE_COMPILATION=1)
  target_compile_options(elastic_header_checks_separate PRIVATE ${ELASTIC_WARNING_FLAGS})
  set_target_properties(elastic_header_checks_separate PROPERTIES CXX_EXTENSIONS OFF
    CXX_COMPILER_LAUNCHER "${PROJECT_SOURCE_DIR}/cmake/syntax_only.sh")
endfunction()
