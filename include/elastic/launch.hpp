// The launch layer — launch configuration: torchrun's command line and PET_* variables.
#pragma once

#include "elastic/detail/config.hpp"
