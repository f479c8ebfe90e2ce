// A minimal native worker: prints what the environment contract gives it.
#include <elastic.hpp>

#include <cstdio>

int main() {
    std::printf("elastic %s worker\n", elastic::version_string);
    return 0;
}
