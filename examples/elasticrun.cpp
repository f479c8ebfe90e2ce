// elasticrun: torchrun's command line for native (and Python) workers — elastic::run with the
// default restart policy, built from --max-restarts. A launcher with its own policy is the same
// line with a third argument: elastic::run(argc, argv, my_policy{}).
#include "elastic/run.hpp"

int main(int argc, char** argv) { return elastic::run(argc, argv); }
