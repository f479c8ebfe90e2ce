// SPDX-License-Identifier: MIT
// The report layer: worker failures, error files, the root cause, the failure summary in
// torchrun's layout, the agent's own error file, elasticrun's exit codes and the event log
// with its destinations.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/report/agent_error_file.hpp"
#include "elastic/report/error_file.hpp"
#include "elastic/report/event.hpp"
#include "elastic/report/event_destination.hpp"
#include "elastic/report/event_sink.hpp"
#include "elastic/report/exit_codes.hpp"
#include "elastic/report/failure.hpp"
#include "elastic/process/signal_name.hpp"
#include "elastic/report/stderr_tail.hpp"
#include "elastic/report/summary.hpp"
#include "elastic/report/text.hpp"
