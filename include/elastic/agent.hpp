// The agent layer: one node's agent (local_agent), the worker environment contract, the
// workers' output (log tree, relays, prefixes), the agent's log, and elastic::run — a launcher in
// one call.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/agent/agent_log.hpp"
#include "elastic/agent/local_agent.hpp"
#include "elastic/agent/log_tree.hpp"
#include "elastic/agent/output.hpp"
#include "elastic/agent/run.hpp"
#include "elastic/agent/worker_environment.hpp"
#include "elastic/agent/worker_output.hpp"
#include "elastic/policy.hpp"
