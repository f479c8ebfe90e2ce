// SPDX-License-Identifier: MIT
// elastic::launch_config: everything an agent needs to launch and supervise one node's workers,
// as a plain struct (filled by the command line or by a custom launcher) with validate().
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/random.hpp"
#include "elastic/agent/program.hpp"
#include "elastic/agent/spec.hpp"
#include "elastic/usage_error.hpp"
#include "elastic/launch/values.hpp"
#include "elastic/policy/spec.hpp"
#include "elastic/report/event_destination.hpp"

#include "elastic/detail/format.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace elastic::inline v0 {

/// The launch configuration of one node: torchrun's options (one field per option, named as the
/// option with `_`; docs/cli.md maps each to the component that consumes it) plus the variables
/// torchrun's agent reads. Defaults are torchrun's (newest). Fields are public and plain so a
/// custom launcher fills them in C++; validate() then applies the command line's rules.
///
/// The options about the workers are worker_spec's fields (program, nproc_per_node, role,
/// virtual_local_rank, max_restarts, shutdown_timeout, signals_to_handle, log_dir, redirects,
/// tee, local_ranks_filter, log_line_prefix_template), LOGLEVEL and --event-log-handler are
/// agent_options' (agent_log_level, event_log_handler); workers() and agent() give them to the
/// agent, rendezvous() and restarts() make what the rendezvous and the policy take.
struct launch_config : worker_spec, agent_options {
    // ---- nodes and rendezvous ----
    node_range nnodes;                                              ///< --nnodes
    rendezvous_backend rdzv_backend = rendezvous_backend::static_;  ///< --rdzv-backend
    std::optional<host_port> rdzv_endpoint;    ///< --rdzv-endpoint; unset: see rendezvous_endpoint()
    std::vector<host_port> rdzv_successors;    ///< c10d: the endpoints after the first in a --rdzv-endpoint list
    std::string rdzv_id = "none";              ///< --rdzv-id: the job id, namespaces store keys
    rendezvous_settings rdzv_conf;             ///< --rdzv-conf
    std::optional<int> node_rank;              ///< --node-rank; honoured by every backend when set
    std::optional<std::string> master_addr;    ///< --master-addr (static only); unset: 127.0.0.1
    std::optional<std::uint16_t> master_port;  ///< --master-port (static only); unset: 29500
    std::optional<std::string> local_addr;     ///< --local-addr: the address this node advertises

    // ---- failures and restarts (max_restarts is worker_spec's) ----
    std::optional<backoff_spec> restart_backoff;            ///< --restart-backoff (elastic's; docs/policies.md)
    std::optional<window_spec> restart_window;              ///< --restart-window
    std::optional<exit_code_set> restart_on_exit;           ///< --restart-on-exit
    std::optional<crash_guard_spec> restart_crash_guard;    ///< --restart-crash-guard
    std::optional<int> restart_no_progress;                 ///< --restart-no-progress
    std::chrono::milliseconds monitor_interval = 100ms;     ///< --monitor-interval: accepted, see docs/cli.md
    std::chrono::milliseconds exit_barrier_timeout = 300s;  ///< not an option in torchrun either (hard-coded 300 s)

    /// What the command line asked that elastic accepts as torchrun does while it would do it
    /// differently (a --rdzv-conf key the backend does not read, quotes a shell left): one line
    /// each, which the agent logs as warnings when it starts.
    std::vector<std::string> warnings;

    /// The endpoint the rendezvous uses, defaults applied: for static, --rdzv-endpoint or else
    /// --master-addr:--master-port (127.0.0.1:29500); for c10d and etcd-v3, --rdzv-endpoint with
    /// host `localhost` and port 29400 / 2379 when absent.
    [[nodiscard]] host_port rendezvous_endpoint() const {
        if (rdzv_backend == rendezvous_backend::static_ && !rdzv_endpoint) {
            return host_port{master_addr.value_or("127.0.0.1"), master_port.value_or(std::uint16_t{29500})};
        }
        host_port endpoint = rdzv_endpoint.value_or(host_port{});
        if (endpoint.host.empty()) {
            endpoint.host = "localhost";
        }
        if (!endpoint.port) {
            endpoint.port = default_rendezvous_port(rdzv_backend);
        }
        return endpoint;
    }

    /// What the rendezvous takes: the backend, rendezvous_endpoint(), the job id, --nnodes,
    /// --node-rank, --local-addr and --rdzv-conf. The static backend's port counts as given with
    /// --master-port or --rdzv-endpoint, the others' always. The settings' exit_barrier_timeout
    /// falls back to exit_barrier_timeout.
    [[nodiscard]] rendezvous_parameters rendezvous() const {
        rendezvous_parameters p;
        p.backend = rdzv_backend;
        p.endpoint = rendezvous_endpoint();
        for (auto next : rdzv_successors) {
            if (!next.port) next.port = default_rendezvous_port(rdzv_backend);
            p.successor_endpoints.push_back(std::move(next));
        }
        p.port_given = rdzv_backend != rendezvous_backend::static_ || master_port || rdzv_endpoint;
        p.run_id = rdzv_id;
        p.nnodes = nnodes;
        p.node_rank = node_rank;
        p.local_addr = local_addr;
        p.settings = rdzv_conf;
        if (!p.settings.exit_barrier_timeout) p.settings.exit_barrier_timeout = exit_barrier_timeout;
        return p;
    }

    /// The workers as the agent takes them.
    [[nodiscard]] const worker_spec& workers() const noexcept { return *this; }

    /// LOGLEVEL and --event-log-handler, as the agent takes them.
    [[nodiscard]] const agent_options& agent() const noexcept { return *this; }

    /// --max-restarts and the --restart-* options, as the policy layer takes them.
    [[nodiscard]] restart_settings restarts() const {
        return restart_settings{max_restarts,    restart_backoff,     restart_window,
                                restart_on_exit, restart_crash_guard, restart_no_progress};
    }

    /// The global world size when `nodes` nodes take part.
    [[nodiscard]] long long world_size(int nodes) const { return static_cast<long long>(nodes) * nproc_per_node; }

    /// Checks every rule the command line applies (ranges, combinations, the program can run,
    /// reading PATH from `env`); throws usage_error naming the option and the value.
    void validate(const environment& env) const;

    /// validate() against the process environment.
    void validate() const { validate(current_environment()); }
};

/// A random run id in UUID version 4 form (`--standalone` uses one, as torchrun does).
[[nodiscard]] ELASTIC_DECL std::string random_run_id();

/// `--standalone`, as torchrun (newest): a single node whose c10d rendezvous store listens on a
/// free local port (localhost:0), under a fresh random run id.
ELASTIC_DECL void use_standalone(launch_config& config);

namespace detail::launch {

[[nodiscard]] ELASTIC_DECL std::string streams_text(const stream_selection& selection);

}  // namespace detail::launch

/// The startup banner, in the layout of torchrun's "Starting elastic_operator with launch
/// configs:" log (one `  name : value` line per setting), with elastic's additional settings.
[[nodiscard]] ELASTIC_DECL std::string describe(const launch_config& config);

namespace detail::launch {

/// The `${name}` / `$name` placeholders of a prefix template must be ones the agent fills.
ELASTIC_DECL void check_prefix_template(std::string_view text);

ELASTIC_DECL void check_ranks_exist(const std::set<int>& ranks, int nproc, std::string_view option,
                                    std::string_view nproc_option);

ELASTIC_DECL void check_streams(const stream_selection& selection, int nproc, std::string_view option,
                                std::string_view nproc_option);

}  // namespace detail::launch

namespace detail::launch {

/// How validate() names an option in its messages: `--nnodes` by default; the command-line parser
/// names the PET_ variable instead when that is where the value came from.
struct option_labels {
    std::map<std::string, std::string, std::less<>> from_env;  ///< dest -> PET_ variable

    [[nodiscard]] std::string operator()(std::string_view dest) const {
        if (const auto it = from_env.find(dest); it != from_env.end()) {
            return it->second;
        }
        std::string out = "--";
        for (const char c : dest) {
            out += c == '_' ? '-' : c;
        }
        return out;
    }
};

ELASTIC_DECL void validate(const launch_config& c, const environment& env, const option_labels& label);

}  // namespace detail::launch

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL std::string random_run_id() {
    std::uint64_t high = detail::random_u64();
    std::uint64_t low = detail::random_u64();
    high = (high & ~std::uint64_t{0xF000}) | 0x4000;                         // version 4
    low = (low & ~(std::uint64_t{0xC} << 60)) | (std::uint64_t{0x8} << 60);  // variant 10
    return detail::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", high >> 32, (high >> 16) & 0xFFFF, high & 0xFFFF,
                          low >> 48, low & 0xFFFFFFFFFFFFULL);
}

ELASTIC_DECL void use_standalone(launch_config& config) {
    config.rdzv_backend = rendezvous_backend::c10d;
    config.rdzv_endpoint = host_port{"localhost", std::uint16_t{0}};
    config.rdzv_id = random_run_id();
    config.nnodes = node_range{1, 1};
    config.master_addr.reset();
    config.master_port.reset();
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::launch {

[[nodiscard]] ELASTIC_DECL std::string streams_text(const stream_selection& selection) {
    if (selection.per_rank.empty()) {
        return detail::format("{}", static_cast<int>(selection.every_rank));
    }
    std::string out;
    for (const auto& [rank, streams] : selection.per_rank) {
        out += detail::format("{}{}:{}", out.empty() ? "" : ",", rank, static_cast<int>(streams));
    }
    return out;
}

}  // namespace detail::launch
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL std::string describe(const launch_config& config) {
    using detail::seconds_text;
    using detail::launch::streams_text;
    std::string command = config.program.target;
    for (const auto& arg : config.program.args) {
        command += " " + arg;
    }
    const auto& conf = config.rdzv_conf;
    std::string rdzv_conf;
    switch (config.rdzv_backend) {
        case rendezvous_backend::static_: rdzv_conf = detail::format("timeout={}", seconds_text(conf.timeout)); break;
        case rendezvous_backend::c10d:
        case rendezvous_backend::etcd_v3:
            rdzv_conf = detail::format("join_timeout={}, last_call_timeout={}, close_timeout={}, read_timeout={}",
                                       seconds_text(conf.join_timeout), seconds_text(conf.last_call_timeout),
                                       seconds_text(conf.close_timeout), seconds_text(conf.read_timeout));
            if (conf.is_host) {
                rdzv_conf += detail::format(", is_host={}", *conf.is_host);
            }
            break;
    }
    std::string signals;
    for (const int number : config.signals_to_handle) {
        signals += (signals.empty() ? "" : ",") + signal_to_string(number);
    }
    std::string filter;
    for (const int rank : config.local_ranks_filter) {
        filter += detail::format("{}{}", filter.empty() ? "" : ",", rank);
    }
    std::string out = "Starting elastic agent with launch configs:\n";
    const auto line = [&](std::string_view name, std::string_view value) {
        out += detail::format("  {:<20} : {}\n", name, value);
    };
    line("entrypoint", command);
    line("min_nodes", detail::format("{}", config.nnodes.min));
    line("max_nodes", detail::format("{}", config.nnodes.max));
    line("nproc_per_node", detail::format("{}", config.nproc_per_node));
    line("run_id", config.rdzv_id);
    line("rdzv_backend", to_string(config.rdzv_backend));
    auto endpoints = to_string(config.rendezvous_endpoint());
    for (const auto& next : config.rendezvous().successor_endpoints) endpoints += "," + to_string(next);
    line("rdzv_endpoint", endpoints);
    line("rdzv_configs", rdzv_conf);
    line("node_rank", config.node_rank ? detail::format("{}", *config.node_rank) : "(from the rendezvous)");
    line("local_addr", config.local_addr.value_or("(this host's name)"));
    line("role", config.role);
    line("max_restarts", detail::format("{}", config.max_restarts));
    // The restart policy's other settings appear only when given (docs/policies.md).
    if (config.restart_backoff) line("restart_backoff", config.restart_backoff->flag().substr(18));
    if (config.restart_window) line("restart_window", config.restart_window->flag().substr(17));
    if (config.restart_on_exit) line("restart_on_exit", config.restart_on_exit->to_string());
    if (config.restart_crash_guard) line("restart_crash_guard", config.restart_crash_guard->flag().substr(22));
    if (config.restart_no_progress) line("restart_no_progress", detail::format("{}", *config.restart_no_progress));
    if (config.watchdog.enabled()) line("watchdog", config.watchdog.to_string());
    if (config.metrics_port) line("metrics_port", detail::format("{}:{}", config.metrics_host, *config.metrics_port));
    if (config.health_check_port) line("health_check_port", detail::format("{}", *config.health_check_port));
    if (config.file_timer) {
        line("file_timer", config.file_timer_path.empty() ? "(a new FIFO in the temporary directory)"
                                                          : config.file_timer_path.string());
    }
    line("monitor_interval", seconds_text(config.monitor_interval) + " (unused: exits are events)");
    line("shutdown_timeout", seconds_text(config.shutdown_timeout));
    line("signals_to_handle", signals);
    line("log_dir", config.log_dir ? config.log_dir->string() : "(a new temporary directory)");
    line("redirects", streams_text(config.redirects));
    line("tee", streams_text(config.tee));
    line("local_ranks_filter", filter.empty() ? "(every rank)" : filter);
    line("virtual_local_rank", config.virtual_local_rank ? "true" : "false");
    // Shown only when given, so the default banner stays torchrun's.
    if (config.event_log_handler.what != event_destination::kind::null) {
        line("event_log_handler", config.event_log_handler.to_string());
    }
    return out;
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::launch {

ELASTIC_DECL void check_prefix_template(std::string_view text) {
    static constexpr std::string_view known[] = {"role_name", "local_rank", "rank"};
    for (std::size_t i = 0; i + 1 < text.size(); ++i) {
        if (text[i] != '$') {
            continue;
        }
        if (text[i + 1] == '$') {
            ++i;
            continue;
        }
        const bool braced = text[i + 1] == '{';
        auto start = i + (braced ? 2 : 1);
        auto end = start;
        while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) != 0 || text[end] == '_')) {
            ++end;
        }
        if (end == start) {
            continue;
        }
        const auto name = text.substr(start, end - start);
        if (std::find(std::begin(known), std::end(known), name) == std::end(known)) {
            throw usage_error{
                detail::format("{}: unknown placeholder '{}' (known: ${{role_name}}, ${{local_rank}}, ${{rank}})",
                               show("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", text), name)};
        }
        i = end - 1;
    }
}

ELASTIC_DECL void check_ranks_exist(const std::set<int>& ranks, int nproc, std::string_view option,
                                    std::string_view nproc_option) {
    for (const int rank : ranks) {
        if (rank < 0 || rank >= nproc) {
            throw usage_error{detail::format("{} names local rank {}, but this node runs local ranks 0 to {} "
                                             "({}={})",
                                             option, rank, nproc - 1, nproc_option, nproc)};
        }
    }
}

ELASTIC_DECL void check_streams(const stream_selection& selection, int nproc, std::string_view option,
                                std::string_view nproc_option) {
    std::set<int> ranks;
    for (const auto& [rank, streams] : selection.per_rank) {
        ranks.insert(rank);
        if (static_cast<int>(streams) > 3) {
            throw usage_error{detail::format("{}: local rank {} has streams value {} (want 0 to 3)", option, rank,
                                             static_cast<int>(streams))};
        }
    }
    if (static_cast<int>(selection.every_rank) > 3) {
        throw usage_error{
            detail::format("{}: streams value {} (want 0 to 3)", option, static_cast<int>(selection.every_rank))};
    }
    check_ranks_exist(ranks, nproc, option, nproc_option);
}

ELASTIC_DECL void validate(const launch_config& c, const environment& env, const option_labels& label) {
    const auto nnodes_text = [&] {
        return c.nnodes.min == c.nnodes.max ? detail::format("{}", c.nnodes.min)
                                            : detail::format("{}:{}", c.nnodes.min, c.nnodes.max);
    };
    if (c.nproc_per_node < 1 || c.nproc_per_node > 1'000'000) {
        throw usage_error{
            detail::format("{}={}: must be a positive integer", label("nproc_per_node"), c.nproc_per_node)};
    }
    if (c.nnodes.min < 1 || c.nnodes.min > c.nnodes.max) {
        throw usage_error{detail::format("{}={}:{}: want 0 < MIN <= MAX", label("nnodes"), c.nnodes.min, c.nnodes.max)};
    }
    if (c.world_size(c.nnodes.max) > INT_MAX) {
        throw usage_error{detail::format("{}={} with {}={}: the world size exceeds {}", label("nnodes"), nnodes_text(),
                                         label("nproc_per_node"), c.nproc_per_node, INT_MAX)};
    }
    if (c.role.empty()) {
        throw usage_error{detail::format("{}: must not be empty", label("role"))};
    }
    // The rendezvous carries the role to the other nodes in at most 255 bytes.
    if (c.role.size() > 255) {
        throw usage_error{detail::format("{}: {} bytes, at most 255", label("role"), c.role.size())};
    }
    if (c.rdzv_id.empty()) {
        throw usage_error{
            detail::format("{}: must not be empty (it names the job in the rendezvous store)", label("rdzv_id"))};
    }
    const bool is_static = c.rdzv_backend == rendezvous_backend::static_;
    if (is_static && c.nnodes.min != c.nnodes.max) {
        throw usage_error{detail::format("{}={}: the static rendezvous has a fixed membership; an elastic range needs "
                                         "--rdzv-backend=c10d or etcd-v3",
                                         label("nnodes"), nnodes_text())};
    }
    if (c.node_rank && (*c.node_rank < 0 || *c.node_rank >= c.nnodes.max)) {
        throw usage_error{detail::format("{}={}: must be from 0 to {} (below the {} maximum {})", label("node_rank"),
                                         *c.node_rank, c.nnodes.max - 1, label("nnodes"), c.nnodes.max)};
    }
    if (!is_static && (c.master_addr || c.master_port)) {
        throw usage_error{detail::format("--master-addr/--master-port: only the static rendezvous reads them; the {} "
                                         "backend rendezvouses at --rdzv-endpoint",
                                         to_string(c.rdzv_backend))};
    }
    if (is_static && c.rdzv_endpoint && (c.master_addr || c.master_port)) {
        throw usage_error{"--master-addr/--master-port and --rdzv-endpoint both name the static rendezvous's store; "
                          "give one of them"};
    }
    if (c.master_addr && !valid_host(*c.master_addr)) {
        throw usage_error{detail::format("{}: must be a host name, an IPv4 or an IPv6 address",
                                         show(label("master_addr"), *c.master_addr))};
    }
    if (c.local_addr && !valid_host(*c.local_addr)) {
        throw usage_error{detail::format("{}: must be a host name, an IPv4 or an IPv6 address",
                                         show(label("local_addr"), *c.local_addr))};
    }
    if (c.rdzv_endpoint) {
        const auto text = to_string(*c.rdzv_endpoint);
        if (!valid_host(c.rdzv_endpoint->host)) {
            throw usage_error{detail::format("{}: bad host name", show(label("rdzv_endpoint"), text))};
        }
        if (is_static && !c.rdzv_endpoint->port) {
            throw usage_error{detail::format("{}: the static rendezvous needs a port (host:port)",
                                             show(label("rdzv_endpoint"), text))};
        }
    }
    if (!c.rdzv_successors.empty() && c.rdzv_backend == rendezvous_backend::static_) {
        throw usage_error{detail::format("{}: a list of endpoints is read by the c10d backend (where its store may "
                                         "move) and etcd-v3 (the cluster's members); the {} backend takes one endpoint",
                                         label("rdzv_endpoint"), to_string(c.rdzv_backend))};
    }
    for (const auto& next : c.rdzv_successors) {
        if (!valid_host(next.host)) {
            throw usage_error{detail::format("{}: bad host name", show(label("rdzv_endpoint"), to_string(next)))};
        }
        if (next.port == 0) {
            throw usage_error{detail::format("{}: port 0 picks a free port that other nodes cannot know",
                                             show(label("rdzv_endpoint"), to_string(next)))};
        }
        if (next.host == "0.0.0.0" || next.host == "::" || next.host == "0") {
            throw usage_error{detail::format("{}: names no host (every address); name the member's host",
                                             show(label("rdzv_endpoint"), to_string(next)))};
        }
    }
    const auto endpoint = c.rendezvous_endpoint();
    if (endpoint.port == 0 && c.nnodes.max > 1) {
        throw usage_error{
            detail::format("rendezvous endpoint {}: port 0 picks a free port that other nodes cannot know; "
                           "it needs {}=1",
                           to_string(endpoint), label("nnodes"))};
    }
    const auto non_negative = [](std::chrono::milliseconds d, const std::string& what, bool allow_zero) {
        if (d.count() < 0 || (!allow_zero && d.count() == 0)) {
            throw usage_error{
                detail::format("{}={}ms: must be {} 0 seconds", what, d.count(), allow_zero ? ">=" : ">")};
        }
    };
    const auto conf = label("rdzv_conf");
    non_negative(c.rdzv_conf.join_timeout, conf + " join_timeout", false);
    non_negative(c.rdzv_conf.last_call_timeout, conf + " last_call_timeout", true);  // 0: the round closes at MIN
    non_negative(c.rdzv_conf.close_timeout, conf + " close_timeout", false);
    non_negative(c.rdzv_conf.read_timeout, conf + " read_timeout", false);
    non_negative(c.rdzv_conf.timeout, conf + " timeout", false);
    if (c.rdzv_conf.exit_barrier_timeout) {
        non_negative(*c.rdzv_conf.exit_barrier_timeout, conf + " exit_barrier_timeout", true);  // 0: no wait
    }
    if (c.max_restarts < 0) {
        throw usage_error{detail::format("{}={}: must be an integer >= 0", label("max_restarts"), c.max_restarts)};
    }
    non_negative(c.shutdown_timeout, label("shutdown_timeout"), true);
    if (const auto& b = c.restart_backoff;
        b && (b->initial.count() <= 0 || b->cap < b->initial || b->reset_after.count() < 0 || !(b->factor >= 1.0) ||
              !std::isfinite(b->factor) || !(b->jitter >= 0.0 && b->jitter < 1.0))) {
        throw usage_error{
            detail::format("{}: want 0 < initial <= cap, reset >= 0, factor >= 1 and 0 <= jitter < 1", b->flag())};
    }
    if (const auto& w = c.restart_window; w && (w->restarts < 1 || w->period.count() <= 0)) {
        throw usage_error{detail::format("{}: want at least 1 restart and a period above 0", w->flag())};
    }
    if (const auto& g = c.restart_crash_guard; g && (g->within.count() <= 0 || g->in_a_row < 1)) {
        throw usage_error{detail::format("{}: want a time above 0 and N >= 1", g->flag())};
    }
    if (c.restart_no_progress && *c.restart_no_progress < 1) {
        throw usage_error{detail::format("--restart-no-progress={}: want N >= 1", *c.restart_no_progress)};
    }
    non_negative(c.monitor_interval, label("monitor_interval"), true);
    non_negative(c.exit_barrier_timeout, "exit_barrier_timeout", true);
    if (c.watchdog.enabled() && std::find(c.signals_to_handle.begin(), c.signals_to_handle.end(), c.watchdog.signal) !=
                                    c.signals_to_handle.end()) {
        throw usage_error{detail::format("--watchdog signal={} is also in --signals-to-handle: the agent would forward "
                                         "it as a stop and the workers take it for a request for stacks; choose "
                                         "another (signal=SIGUSR1, or SIGRTMIN+N)",
                                         signal_name(c.watchdog.signal))};
    }
    if (c.signals_to_handle.empty()) {
        throw usage_error{detail::format("{}: must name at least one signal", label("signals_to_handle"))};
    }
    for (const int number : c.signals_to_handle) {
        if (std::find(forwardable_signal_numbers.begin(), forwardable_signal_numbers.end(), number) ==
            forwardable_signal_numbers.end()) {
            throw usage_error{
                detail::format("{}: signal {} cannot be trapped and forwarded", label("signals_to_handle"), number)};
        }
    }
    if (c.log_dir) {
        if (c.log_dir->empty()) {
            throw usage_error{detail::format("{}: must not be empty", label("log_dir"))};
        }
        struct stat st {};
        if (!c.logs_disabled() && ::stat(c.log_dir->c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
            throw usage_error{
                detail::format("{}: exists and is not a directory", show(label("log_dir"), c.log_dir->string()))};
        }
    }
    check_streams(c.redirects, c.nproc_per_node, label("redirects"), label("nproc_per_node"));
    check_streams(c.tee, c.nproc_per_node, label("tee"), label("nproc_per_node"));
    check_ranks_exist(c.local_ranks_filter, c.nproc_per_node, label("local_ranks_filter"), label("nproc_per_node"));
    check_prefix_template(c.log_line_prefix_template);
    (void)resolve_program(c.program, env);
}

}  // namespace detail::launch
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL void launch_config::validate(const environment& env) const { detail::launch::validate(*this, env, {}); }

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
