// elasticrun: torchrun's command line for native (and Python) workers — elastic::run with the
// default restart policy (--max-restarts and the --restart-* options). A launcher with a policy
// of its own is the same line with a third argument: elastic::run(argc, argv, my_policy{}).
#include "elastic/run.hpp"

int main(int argc, char** argv) { return elastic::run(argc, argv); }
