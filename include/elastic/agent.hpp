// The agent layer: one node's agent (local_agent), the worker environment contract, the
// stderr relay, and elastic::run — a launcher in one call.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/agent/local_agent.hpp"
#include "elastic/agent/output.hpp"
#include "elastic/agent/run.hpp"
#include "elastic/agent/worker_environment.hpp"
#include "elastic/policy.hpp"
