// The restart-policy layer: the restart_policy concept, group_failure / restart_decision, and
// the default policy max_restarts(n).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/policy/concepts.hpp"
#include "elastic/policy/max_restarts.hpp"
