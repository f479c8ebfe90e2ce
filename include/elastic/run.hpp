// elastic::run(argc, argv[, policy]): the launcher in one call (see elastic/agent/run.hpp).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/agent/run.hpp"
