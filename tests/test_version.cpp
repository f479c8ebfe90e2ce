// The version macros, the constants and the CMake project version agree.
#include <elastic/version.hpp>

#include <doctest/doctest.h>

#include <string>

TEST_CASE("version: the string and the numbers agree") {
    const std::string expected = std::to_string(elastic::version.major) + "." + std::to_string(elastic::version.minor) +
                                 "." + std::to_string(elastic::version.patch);
    CHECK(expected == elastic::version_string);
    CHECK(std::string(ELASTIC_VERSION_STRING) == elastic::version_string);
}
