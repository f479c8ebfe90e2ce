// SPDX-License-Identifier: MIT
// elastic::run(argc, argv[, policy]): the launcher in one call (see elastic/launch/run.hpp).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/launch/run.hpp"
