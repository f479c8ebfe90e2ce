// SPDX-License-Identifier: MIT
// elastic::compiled: the definitions ELASTIC_SEPARATE_COMPILATION leaves out of the headers
// (elastic::run's agent, the command-line parser), compiled once. The target defines
// ELASTIC_SEPARATE_COMPILATION for every program that links it and ELASTIC_IMPL_SOURCE here.
#include <elastic/impl/src.hpp>
