// SPDX-License-Identifier: MIT
// The process layer — worker processes: spawn, await exits through pidfds, signal and stop groups.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/process/child.hpp"
#include "elastic/process/error.hpp"
#include "elastic/process/exit.hpp"
#include "elastic/process/group.hpp"
#include "elastic/process/signals.hpp"
#include "elastic/process/spawn.hpp"
