// A trivial downstream program: includes the umbrella header and prints the library's version.
#include <elastic.hpp>

#include <cstdio>

int main() {
    std::printf("elastic %s\n", elastic::version_string);
    return elastic::version.major >= 0 ? 0 : 1;
}
