// The process layer — worker processes: spawn, await exits through pidfds, signal and stop groups.
#pragma once

#include "elastic/detail/config.hpp"
