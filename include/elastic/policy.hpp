// SPDX-License-Identifier: MIT
// The restart-policy layer: the restart_policy concept, group_failure / restart_decision,
// max_restarts(n), the built-in policies and combinators, and make_default_policy(settings).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/policy/concepts.hpp"
#include "elastic/policy/max_restarts.hpp"
#include "elastic/policy/clock.hpp"
#include "elastic/policy/spec.hpp"
#include "elastic/policy/combinators.hpp"
#include "elastic/policy/backoff.hpp"
#include "elastic/policy/window.hpp"
#include "elastic/policy/exit_codes.hpp"
#include "elastic/policy/crash_loop.hpp"
#include "elastic/policy/no_progress.hpp"
#include "elastic/policy/default_policy.hpp"
