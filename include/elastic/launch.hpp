// SPDX-License-Identifier: MIT
// The launch layer — launch configuration: torchrun's command line and PET_* variables.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/launch/cli.hpp"
#include "elastic/launch/config.hpp"
#include "elastic/launch/default_policy.hpp"
#include "elastic/launch/nproc.hpp"
#include "elastic/launch/run.hpp"
#include "elastic/launch/values.hpp"
#include "elastic/usage_error.hpp"
