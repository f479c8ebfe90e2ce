// SPDX-License-Identifier: MIT
// The agent layer: one node's agent (local_agent), the worker environment contract, the
// workers' output (log tree, relays, prefixes), and the agent's log.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/agent/agent_log.hpp"
#include "elastic/agent/file_timer.hpp"
#include "elastic/agent/http_endpoint.hpp"
#include "elastic/agent/local_agent.hpp"
#include "elastic/agent/log_tree.hpp"
#include "elastic/agent/output.hpp"
#include "elastic/agent/plan.hpp"
#include "elastic/agent/program.hpp"
#include "elastic/agent/spec.hpp"
#include "elastic/agent/status.hpp"
#include "elastic/agent/watchdog.hpp"
#include "elastic/agent/worker_environment.hpp"
#include "elastic/agent/worker_group.hpp"
#include "elastic/agent/worker_output.hpp"
#include "elastic/policy.hpp"
