// The test runner's main (doctest), and a check that the single-header build compiled only it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#if defined(ELASTIC_TEST_SINGLE_HEADER)
#include <elastic.hpp>
#if !defined(ELASTIC_AMALGAMATED)
#error "the single-header build must compile single_include/elastic.hpp, not include/"
#endif
#endif
