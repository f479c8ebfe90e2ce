// The test runner's main (doctest), and a check that the single-header build compiled only it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

// The suite is elastic's own build, which checks the format strings of elastic's messages at
// compile time (elastic/detail/format.hpp); the CMake option is on wherever the tests are built.
#if !defined(ELASTIC_CHECK_FORMATS)
#error "the test suite is built with ELASTIC_CHECK_FORMATS (CMake option ELASTIC_CHECK_FORMATS)"
#endif

#if defined(ELASTIC_TEST_SINGLE_HEADER)
#include <elastic.hpp>
#if !defined(ELASTIC_AMALGAMATED)
#error "the single-header build must compile single_include/elastic.hpp, not include/"
#endif
#endif
