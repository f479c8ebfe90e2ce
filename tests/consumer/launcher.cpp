// A downstream launcher built with separate compilation: linked to elastic::compiled, so this
// file compiles no agent (ELASTIC_SEPARATE_COMPILATION comes with the target).
#include <elastic/run.hpp>

#ifndef ELASTIC_SEPARATE_COMPILATION
#error "elastic::compiled defines ELASTIC_SEPARATE_COMPILATION for the programs that link it"
#endif

int main(int argc, char** argv) { return elastic::run(argc, argv); }
