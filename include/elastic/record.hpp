// elastic::record(main): torchelastic error files for uncaught exceptions and fatal signals.
#pragma once

#include "elastic/detail/config.hpp"
