// SPDX-License-Identifier: MIT
// What the agent takes: worker_spec (the workers of one node: program, count, role, how they
// are stopped, where their output goes) and agent_options (the agent's own log level and event
// log). The launch layer makes both from the command line (launch_config::workers(),
// launch_config::agent()); a custom launcher may fill them itself.
#pragma once

#include "elastic/agent/watchdog.hpp"
#include "elastic/detail/config.hpp"
#include "elastic/agent/program.hpp"
#include "elastic/report/event_destination.hpp"

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace elastic::inline v0 {

using namespace std::chrono_literals;

/// Which standard streams of a worker go to files (`--redirects`) or files and console (`--tee`).
enum class std_streams : std::uint8_t { none = 0, out = 1, err = 2, all = 3 };

/// A `--redirects` / `--tee` value: one choice for every local rank (`3`) or one per local rank
/// (`0:1,1:3`; local ranks not named get `none`, as in torchrun).
struct stream_selection {
    std_streams every_rank = std_streams::none;  ///< used when per_rank is empty
    std::map<int, std_streams> per_rank;         ///< local rank -> streams
    friend bool operator==(const stream_selection&, const stream_selection&) = default;

    /// The streams chosen for one local rank.
    [[nodiscard]] std_streams for_rank(int local_rank) const {
        if (per_rank.empty()) {
            return every_rank;
        }
        const auto it = per_rank.find(local_rank);
        return it == per_rank.end() ? std_streams::none : it->second;
    }
};

/// The agent's log level (`LOGLEVEL`, Python's level names).
enum class log_level { debug, info, warning, error, critical };

/// The workers of one node, as the agent starts, stops and relays them. Defaults are torchrun's.
struct worker_spec {
    worker_program program;           ///< what each worker runs
    int nproc_per_node = 1;           ///< how many workers (LOCAL_WORLD_SIZE)
    std::string role = "default";     ///< ROLE_NAME and the log prefix
    bool virtual_local_rank = false;  ///< LOCAL_RANK=0 for every worker (one GPU per worker)
    /// TORCHELASTIC_MAX_RESTARTS, as the workers are told it (the restart policy decides).
    int max_restarts = 0;
    /// The grace between the stop signal and SIGKILL.
    std::chrono::milliseconds shutdown_timeout = 30s;
    /// The signals the agent forwards to its workers (TORCHELASTIC_SIGNALS_TO_HANDLE).
    std::vector<int> signals_to_handle{SIGTERM, SIGINT, SIGHUP, SIGQUIT};

    /// The log tree's root; unset: a temporary directory; /dev/null: no files at all.
    std::optional<std::filesystem::path> log_dir;
    stream_selection redirects;        ///< streams that go to files only
    stream_selection tee;              ///< streams that go to files and the console
    std::set<int> local_ranks_filter;  ///< local ranks whose output reaches the console; empty: all
    /// --duplicate-stdout-filters / --duplicate-stderr-filters: a line of a tee'd stream that
    /// contains any of these is also copied, after the rank's prefix, to the attempt's
    /// filtered_stdout.log / filtered_stderr.log (every rank's lines in one file).
    std::vector<std::string> duplicate_stdout_filters;
    std::vector<std::string> duplicate_stderr_filters;
    /// The prefix of each relayed line (`${role_name}`, `${local_rank}`, `${rank}`).
    std::string log_line_prefix_template = "[${role_name}${local_rank}]:";
    /// --watchdog: the hang detection's limits; none set (the default): no watchdog.
    watchdog_settings watchdog;
    /// TORCHELASTIC_ENABLE_FILE_TIMER=1: the agent serves the requests of torch's
    /// FileTimerClient (a FIFO the workers are told in TORCHELASTIC_TIMER_FILE) and signals a
    /// worker whose scope expires (docs/watchdog.md, "torch's file timer").
    bool file_timer = false;
    /// TORCHELASTIC_TIMER_FILE: where that FIFO is made; empty: a fresh one in the temporary
    /// directory.
    std::filesystem::path file_timer_path;

    /// True when log_dir is /dev/null: no stdout/stderr/error files are written.
    [[nodiscard]] bool logs_disabled() const { return log_dir && *log_dir == "/dev/null"; }
};

/// The agent's own settings.
struct agent_options {
    log_level agent_log_level = log_level::warning;  ///< what the agent logs (LOGLEVEL)
    event_destination event_log_handler;             ///< where its events go (--event-log-handler)
    /// --metrics-port: where the agent serves /metrics (Prometheus text), /status (JSON) and
    /// /health while it runs; unset: nowhere. Port 0: one the kernel picks (logged).
    std::optional<std::uint16_t> metrics_port;
    std::string metrics_host = "0.0.0.0";  ///< the address it listens on (--metrics-port=HOST:PORT)
    /// TORCHELASTIC_HEALTH_CHECK_PORT: a port where any GET gets the agent's health.
    std::optional<std::uint16_t> health_check_port;
    /// Whether the agent keeps a status file that `elasticrun status` reads (docs/status.md).
    bool status_file = true;
};

}  // namespace elastic::inline v0
