// SPDX-License-Identifier: MIT
// torchrun's command line for elastic: every option in dashed and underscored spelling, PET_*
// variables as defaults, --help, and parse_launch_config() that turns them into a launch_config.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/launch/config.hpp"
#include "elastic/launch/nproc.hpp"
#include "elastic/agent/program.hpp"
#include "elastic/usage_error.hpp"
#include "elastic/launch/values.hpp"

// CLI11 only where the parser is compiled: with ELASTIC_SEPARATE_COMPILATION, in
// elastic/impl/src.hpp's file alone (docs/building.md).
#if ELASTIC_DETAIL_BODIES
#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#endif
#include "elastic/detail/format.hpp"
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <variant>
#include <vector>

namespace elastic::inline v0 {

/// The outcome of --help or --version: text for standard output, and exit status 0.
struct help_request {
    std::string text;
};

/// What parse_launch_config() gives: a validated configuration, or text to print and exit 0.
using launch_parse_result = std::variant<launch_config, help_request>;

/// Parses a launcher's arguments (without argv[0]) as torchrun does: options first, then the
/// program and its arguments, which pass through untouched. Every option falls back on its
/// PET_ variable in `env` (an empty variable counts as unset); the command line wins. Returns the
/// validated launch_config, or a help_request for --help / --version; throws usage_error (exit
/// status 2) for bad input. `program_name` is the launcher's name in --help and --version.
[[nodiscard]] ELASTIC_DECL launch_parse_result parse_launch_config(std::vector<std::string> args,
                                                                   const environment& env,
                                                                   std::string_view program_name = "elasticrun");

/// parse_launch_config() over main()'s arguments; the launcher's name is argv[0]'s last path
/// component ("elasticrun" when argv[0] is missing).
[[nodiscard]] ELASTIC_DECL launch_parse_result parse_launch_config(int argc, const char* const* argv,
                                                                   const environment& env);

namespace detail::launch {

/// How far elastic goes with an option (docs/cli.md has the same three states per option).
enum class option_state {
    implemented,    ///< parsed, validated, typed into launch_config, consumed by a later component
    compatibility,  ///< accepted and checked; explained in --help: nothing to do for native workers
    refused,        ///< not implemented yet: refused with a message when given a non-default value
};

/// One torchrun option. `dest` is argparse's dest; its PET_ variable is PET_<DEST upper-cased>.
struct option_spec {
    std::string_view names;     ///< CLI11 names: every spelling
    std::string_view dest;      ///< nproc_per_node
    bool flag;                  ///< a flag (no value)
    bool has_env;               ///< reads PET_<DEST> (torchrun: all but --logs-specs and --numa-binding)
    std::string_view metavar;   ///< value placeholder in --help
    std::string_view fallback;  ///< default as --help shows it
    option_state state;
    int group;
    std::string_view help;
};

/// --help's sections, by option_spec::group (-1: an option --help does not list).
inline constexpr std::array<std::string_view, 7> option_groups{{
    "How the program runs",
    "Workers on this node",
    "Nodes and rendezvous",
    "Static rendezvous (--rdzv-backend=static, the default)",
    "Failures, restarts and shutdown",
    "Output and logs",
    "Accepted for torchrun compatibility (they matter only to Python function workers)",
}};

// clang-format off
inline constexpr std::array<option_spec, 38> option_specs{{
    {"-m,--module", "module", true, true, "", "off", option_state::implemented, 0,
     "Run the program as a Python module: $PYTHON_EXEC -u -m program args..."},
    {"--no-python,--no_python", "no_python", true, true, "", "off", option_state::implemented, 0,
     "Run the program directly, even a .py file. An executable (anything but a .py file) already runs "
     "directly without it."},
    {"--run-path,--run_path", "run_path", true, true, "", "off", option_state::compatibility, 6,
     "torchrun runs the script inside its own Python process (runpy); elastic has no Python inside, so the "
     "script runs as $PYTHON_EXEC -u script, as without the flag."},
    {"--nproc-per-node,--nproc_per_node", "nproc_per_node", false, true, "N|cpu|gpu|auto", "1",
     option_state::implemented, 1,
     "Workers on this node: a number; cpu, one per CPU this process may run on; gpu, one per GPU "
     "(CUDA_VISIBLE_DEVICES if set, else nvidia-smi -L; an error if there is none); auto, one per GPU if "
     "there are any, else one per CPU."},
    {"--role", "role", false, true, "NAME", "default", option_state::implemented, 1,
     "Role of the workers: their ROLE_NAME and the prefix of their output lines."},
    {"--virtual-local-rank,--virtual_local_rank", "virtual_local_rank", true, true, "", "off",
     option_state::implemented, 1,
     "Give every worker LOCAL_RANK=0 and a CUDA_VISIBLE_DEVICES narrowed to its one GPU."},
    {"--nnodes", "nnodes", false, true, "N|MIN:MAX", "1:1", option_state::implemented, 2,
     "Number of nodes, or the elastic range MIN:MAX (0 < MIN <= MAX); a range needs a dynamic backend."},
    {"--rdzv-backend,--rdzv_backend", "rdzv_backend", false, true, "static|c10d|etcd-v3", "static",
     option_state::implemented, 2,
     "Rendezvous implementation: static (fixed membership, node 0 hosts the store at --master-addr), c10d "
     "(elastic, a TCP store hosted by one agent at --rdzv-endpoint) or etcd-v3 (elastic, an etcd server's "
     "v3 API). torchrun's etcd and etcd-v2 use etcd's removed v2 API and are refused."},
    {"--rdzv-endpoint,--rdzv_endpoint", "rdzv_endpoint", false, true, "HOST[:PORT][,...]", "",
     option_state::implemented, 2,
     "Where the rendezvous is: host[:port], an IPv6 address as [addr]:port. Default port 29400 for c10d, 2379 "
     "for etcd-v3; static: defaults to --master-addr:--master-port and needs a port. c10d takes a list: the "
     "store starts at the first; the agent on each other host listed keeps its idle store there, where the "
     "store may move and where a new agent looks for the job first. etcd-v3 takes a list: the etcd cluster's "
     "members."},
    {"--rdzv-id,--rdzv_id", "rdzv_id", false, true, "ID", "none", option_state::implemented, 2,
     "Job id shared by every node of the job; it namespaces the rendezvous."},
    {"--rdzv-conf,--rdzv_conf", "rdzv_conf", false, true, "K=V,...", "", option_state::implemented, 2,
     "Rendezvous settings. c10d: join_timeout (600), last_call_timeout (30), close_timeout (30), read_timeout "
     "(60), keep_alive_interval (1) in seconds, keep_alive_max_attempt (5), is_host (true/false), store_type "
     "(tcp), use_libuv (accepted, no effect), workers_store_peers (members: group rank 0's workers' store "
     "accepts the round's nodes' addresses only; any: every peer, for NAT between the nodes). etcd-v3: the "
     "four timeouts, keep_alive_interval and keep_alive_max_attempt (an agent's etcd lease lives their "
     "product), workers_store_peers, protocol (http or https) and, for https, cacert, cert and key (PEM "
     "files). static: timeout (900). Every backend: exit_barrier_timeout (300), "
     "how long a finished node waits for the others. static and c10d: secret_file (a file holding the job's "
     "secret, which authenticates the rendezvous store's connections; or ELASTIC_RDZV_SECRET holding the secret "
     "itself). A key the backend does not read is ignored with a warning."},
    {"--standalone", "standalone", true, true, "", "off", option_state::implemented, 2,
     "Single-node job: c10d rendezvous on localhost:0 (a free port) under a random run id, --nnodes=1. "
     "Conflicting --rdzv-backend/--rdzv-endpoint/--rdzv-id/--nnodes on the command line are errors."},
    {"--node-rank,--node_rank", "node_rank", false, true, "RANK", "0", option_state::implemented, 2,
     "This node's rank: required by the static rendezvous (0 to N-1) and honoured by c10d and etcd-v3 when "
     "given (torchrun's c10d ignores it)."},
    {"--local-addr,--local_addr", "local_addr", false, true, "ADDR", "this host's name", option_state::implemented,
     2,
     "Address this node advertises to the others (and as MASTER_ADDR when it hosts the workers' store)."},
    {"--master-addr,--master_addr", "master_addr", false, true, "ADDR", "127.0.0.1", option_state::implemented, 3,
     "Address of node 0, which hosts the store."},
    {"--master-port,--master_port", "master_port", false, true, "PORT", "29500; one node: a free port",
     option_state::implemented, 3,
     "Port of that store; 0 picks a free one (single node only). One node without it binds a free port "
     "(torchrun: 29500), so two jobs on a machine never collide."},
    {"--max-restarts,--max_restarts", "max_restarts", false, true, "N", "0", option_state::implemented, 4,
     "Restarts of the worker group allowed after failures before the job fails."},
    {"--restart-backoff,--restart_backoff", "restart_backoff", false, true, "INITIAL:CAP[:RESET]", "none",
     option_state::implemented, 4,
     "Wait before each restart: INITIAL, doubled for each failure in a row up to CAP, shortened by up to 10% "
     "at random; a group that ran RESET (default 10min) starts over at INITIAL. Durations such as 500ms, 2s, "
     "1min, 1h (a bare number counts seconds). Example: 1s:1min."},
    {"--restart-window,--restart_window", "restart_window", false, true, "N/PERIOD", "none",
     option_state::implemented, 4,
     "At most N restarts within any PERIOD, such as 5/1h; the next failure stops the job. A budget that "
     "renews, where --max-restarts counts for the whole job."},
    {"--restart-on-exit,--restart_on_exit", "restart_on_exit", false, true, "CODES", "any",
     option_state::implemented, 4,
     "Restart only when the first worker to fail ended in this set, and stop at once otherwise: exit codes "
     "and ranges (1,75-78), signals (any signal, or exit code 128+N), signal names (SIGKILL) and hang (a worker --watchdog found hung, or its torch file timer ended)."},
    {"--restart-crash-guard,--restart_crash_guard", "restart_crash_guard", false, true, "T[:N]", "none",
     option_state::implemented, 4,
     "A group that fails within T of its start is not restarted (a start-up crash loop); with :N, only the "
     "N-th such start in a row stops the job. Example: 30s."},
    {"--restart-no-progress,--restart_no_progress", "restart_no_progress", false, true, "N", "none",
     option_state::implemented, 4,
     "Stop after N failed attempts in a row that did not take the workers' progress (elastic::progress, "
     "read with --watchdog) past the best earlier attempts reached."},
    {"--watchdog", "watchdog", false, true, "KEY=VALUE,...", "none", option_state::implemented, 4,
     "Find hung workers: first=5min (from start to the first heartbeat), beat=30s (between heartbeats), "
     "section=10min and section:NAME=1h (inside sections); signal=SIGUSR2 asks a hung worker for its stacks, "
     "dump=5s waits for them. A hung worker fails the group like a crash (docs/watchdog.md)."},
    {"--shutdown-timeout,--shutdown_timeout", "shutdown_timeout", false, true, "SECONDS",
     "$TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30", option_state::implemented, 4,
     "Grace period between the stop signal sent to the workers and SIGKILL."},
    {"--signals-to-handle,--signals_to_handle", "signals_to_handle", false, true, "SIG,...",
     "SIGTERM,SIGINT,SIGHUP,SIGQUIT", option_state::implemented, 4,
     "Signals the agent traps and forwards to every worker's process group (add SIGUSR1,SIGUSR2 for Slurm)."},
    {"--monitor-interval,--monitor_interval", "monitor_interval", false, true, "SECONDS", "0.1",
     option_state::compatibility, 4,
     "Accepted and checked (>= 0) for compatibility: torchrun polls its workers at this interval; elastic "
     "learns of every exit the moment it happens, so it has nothing to poll."},
    {"--metrics-port,--metrics_port", "metrics_port", false, true, "[HOST:]PORT", "none", option_state::implemented, 5,
     "Serve /metrics (Prometheus text: restarts, rounds, members, heartbeat ages, hangs, store requests), "
     "/status (JSON) and /health over HTTP on PORT (0: any free port), on every interface unless HOST is "
     "given (docs/status.md)."},
    {"--log-dir,--log_dir", "log_dir", false, true, "DIR", "a new temporary directory", option_state::implemented,
     5,
     "Base directory of the log tree <run_id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log and "
     "error.json; /dev/null writes no files."},
    {"-r,--redirects", "redirects", false, true, "0-3|LR:N,...", "0", option_state::implemented, 5,
     "Send worker streams to the log files only: 0 none, 1 stdout, 2 stderr, 3 both; or per local rank, "
     "such as 0:3,1:2."},
    {"-t,--tee", "tee", false, true, "0-3|LR:N,...", "0", option_state::implemented, 5,
     "Like --redirects, but also copy the lines to the console with a prefix such as [default0]:."},
    {"--local-ranks-filter,--local_ranks_filter", "local_ranks_filter", false, true, "LR,...", "every rank",
     option_state::implemented, 5,
     "Only these local ranks' output reaches the console (files keep everything)."},
    {"--start-method,--start_method", "start_method", false, true, "spawn|fork|forkserver", "spawn",
     option_state::compatibility, 6,
     "Python's multiprocessing start method for function workers; a program always starts as a new process "
     "(fork and exec), so the value is checked and changes nothing."},
    {"--event-log-handler,--event_log_handler", "event_log_handler", false, true, "null|console|file:PATH", "null",
     option_state::implemented, 5,
     "Where the agent's events go, one JSON line each (torch's Event): null, none; console, stderr; "
     "file:PATH, appended to PATH."},
    {"--logs-specs,--logs_specs", "logs_specs", false, false, "NAME", "default", option_state::compatibility, 6,
     "torchrun's LogsSpecs plugin for the log layout: only default, torchrun's own layout, which is elastic's; "
     "elastic has no Python plugins to load another."},
    // Not in --help (docs/cli.md says why); refused with the way to bind instead.
    {"--numa-binding,--numa_binding", "numa_binding", false, false, "node|socket|exclusive|core-complex", "",
     option_state::refused, -1,
     "elastic does not bind workers to NUMA nodes: torchrun binds each near its GPU. Start the program "
     "under numactl, whose arguments may name ${local_rank} (quoted, so the shell leaves it): elasticrun ... "
     "numactl '--cpunodebind=${local_rank}' '--membind=${local_rank}' ./trainer"},
    {"--duplicate-stdout-filters,--duplicate_stdout_filters", "duplicate_stdout_filters", false, true, "TEXT,...",
     "none", option_state::implemented, 5,
     "Also copy each line of a tee'd (-t) stdout that contains one of these texts (,, is a comma inside one) "
     "to the attempt's filtered_stdout.log, every rank's lines in one file."},
    {"--duplicate-stderr-filters,--duplicate_stderr_filters", "duplicate_stderr_filters", false, true, "TEXT,...",
     "none", option_state::implemented, 5,
     "The same for tee'd stderr, into filtered_stderr.log."},
    {"-h,--help", "help", true, false, "", "", option_state::implemented, -1, "Show this help and exit."},
}};
// clang-format on

[[nodiscard]] inline std::string env_name(const option_spec& spec) {
    std::string name = "PET_";
    for (const char c : spec.dest) {
        name += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    return name;
}

/// "--nproc-per-node, --nproc_per_node" from "--nproc-per-node,--nproc_per_node".
[[nodiscard]] inline std::string spellings(const option_spec& spec) {
    std::string out{spec.names};
    for (std::size_t at = out.find(','); at != std::string::npos; at = out.find(',', at + 2)) {
        out.insert(at + 1, " ");
    }
    return out;
}

/// The canonical (first long) name, as messages use it.
[[nodiscard]] inline std::string_view long_name(const option_spec& spec) {
    const auto at = spec.names.find("--");
    const auto end = spec.names.find(',', at);
    return spec.names.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
}

/// Appends `text` wrapped at `width` columns, every line indented by `indent`.
inline void wrap(std::string& out, std::string_view text, std::size_t indent, std::size_t width) {
    std::size_t column = 0;
    for (const auto word : split(text, ' ')) {
        if (word.empty()) {
            continue;
        }
        if (column > 0 && column + 1 + word.size() > width) {
            out += '\n';
            column = 0;
        }
        if (column == 0) {
            out.append(indent, ' ');
            column = indent;
        } else {
            out += ' ';
            ++column;
        }
        out += word;
        column += word.size();
    }
    out += '\n';
}

}  // namespace detail::launch

/// The --help text: usage, the program, every option by group with its spellings, default and
/// PET_ variable, the other variables read, and the exit status of a usage error.
[[nodiscard]] inline std::string help_text(std::string_view program_name = "elasticrun") {
    constexpr std::size_t width = 100;
    std::string out = detail::format(
        "usage: {} [options] program [args...]\n       {} status [--rdzv-id=ID] [--json]\n\n", program_name,
        program_name);
    detail::launch::wrap(out,
                         "Start and supervise this node's workers, as torchrun does: the same options (dashed or "
                         "underscored spellings), the same PET_* variables (the command line wins), the same worker "
                         "environment. `status` shows what the agents of this user on this machine are doing "
                         "(docs/status.md).",
                         0, width);
    out += "\nThe program and its arguments (after all options):\n";
    detail::launch::wrap(
        out,
        "An executable runs directly; a .py script runs as $PYTHON_EXEC -u script.py; with -m a Python "
        "module runs as $PYTHON_EXEC -u -m module. Everything after the program goes to every worker "
        "untouched (even --help), except that ${local_rank} becomes the worker's local rank. Use -- "
        "before a program whose name starts with '-'.",
        2, width);
    for (int group = 0; group < static_cast<int>(detail::launch::option_groups.size()); ++group) {
        out += detail::format("\n{}:\n", detail::launch::option_groups[static_cast<std::size_t>(group)]);
        for (const auto& spec : detail::launch::option_specs) {
            if (spec.group != group) {
                continue;
            }
            out += "  " + detail::launch::spellings(spec);
            if (!spec.flag) {
                out += detail::format(" {}", spec.metavar);
            }
            out += '\n';
            std::string help{spec.help};
            std::string facts;
            if (!spec.fallback.empty()) {
                facts = detail::format("default: {}", spec.fallback);
            }
            if (spec.has_env) {
                facts += detail::format("{}env: {}", facts.empty() ? "" : "; ", detail::launch::env_name(spec));
            }
            if (!facts.empty()) {
                help += detail::format(" [{}]", facts);
            }
            detail::launch::wrap(out, help, 6, width);
        }
    }
    out += "\nOther:\n  -h, --help\n";
    detail::launch::wrap(out, "Show this help and exit.", 6, width);
    out += "  --version\n";
    detail::launch::wrap(out, "Show elastic's version and exit.", 6, width);
    out += "\nEnvironment variables also read:\n";
    constexpr std::array<std::pair<std::string_view, std::string_view>, 9> variables{{
        {"PYTHON_EXEC", "Interpreter for .py scripts and -m modules (default python3, found on PATH)."},
        {"PATH", "Where a program named without a '/' is found, as execvp does."},
        {"CUDA_VISIBLE_DEVICES", "The GPUs --nproc-per-node=gpu|auto counts (else nvidia-smi -L)."},
        {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "Default of --shutdown-timeout."},
        {"TORCHELASTIC_ENABLE_FILE_TIMER",
         "1: serve torch's FileTimerClient; an expired scope gets its worker the signal it asked for."},
        {"TORCHELASTIC_TIMER_FILE", "Where that FIFO is made (default a new one in the temporary directory)."},
        {"TORCHELASTIC_HEALTH_CHECK_PORT", "A port where any HTTP GET gets the agent's health (docs/status.md)."},
        {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
         "Prefix of tee'd lines, with ${role_name}, ${local_rank}, ${rank} (default [${role_name}${local_rank}]:)."},
        {"LOGLEVEL", "The agent's log level: DEBUG, INFO, WARNING (default), ERROR or CRITICAL."},
    }};
    for (const auto& [name, text] : variables) {
        out += detail::format("  {}\n", name);
        detail::launch::wrap(out, text, 6, width);
    }
    out += "\n";
    detail::launch::wrap(
        out,
        "Bad input (an unknown option, a malformed value, a program that cannot run) is reported on one "
        "line and exits with status 2 before any worker starts.",
        0, width);
    return out;
}

#if ELASTIC_DETAIL_BODIES

namespace detail::launch {

/// One option's text and where it came from, for messages ("--nnodes" or "PET_NNODES").
struct raw_option {
    std::string text;
    std::string name;
    bool from_env = false;
};

/// An argument "--opt=" with an empty value would make CLI11 take the next argument as the value
/// (argparse takes the empty string). argv can hold no NUL, so a trailing NUL marks it; it is
/// removed again from values and from the program's arguments.
inline constexpr char empty_mark = '\0';

inline void unmark(std::string& text) {
    if (!text.empty() && text.back() == empty_mark) {
        text.pop_back();
    }
}

/// The torchrun-style message for a CLI11 parse error, on one line.
[[nodiscard]] inline std::string describe_parse_error(const CLI::ParseError& e) {
    std::string message = e.what();
    std::replace(message.begin(), message.end(), '\n', ' ');
    if (e.get_name() == "ArgumentMismatch" && message.find("flag override") != std::string::npos) {
        const auto name = message.substr(0, message.find(' '));
        return detail::format("{}{} is a flag and takes no value", name.size() == 1 ? "-" : "--", name);
    }
    if (e.get_name() == "ArgumentMismatch" && message.find("required") != std::string::npos) {
        return detail::format("{} needs a value", message.substr(0, message.find(':')));
    }
    return message;
}

/// argparse's abbreviations, as torchrun takes them: a long option may be given by any prefix
/// that names one option alone ("--nproc=2" is --nproc-per-node=2); a prefix of several is
/// refused naming them. Only the launcher's own options are read: the scan stops at "--" and
/// at the program, the first argument that is neither an option nor an option's value.
inline void expand_abbreviations(std::vector<std::string>& args) {
    struct known {
        std::string_view spelling;
        const option_spec* spec;  // null: --version
    };
    std::vector<known> spellings{{"--version", nullptr}};
    for (const auto& spec : option_specs) {
        for (const auto name : detail::split(spec.names, ',')) spellings.push_back({name, &spec});
    }
    const auto takes_value = [](const known& k) { return k.spec != nullptr && !k.spec->flag; };
    for (std::size_t i = 0; i < args.size(); ++i) {
        auto& arg = args[i];
        if (arg == "--" || arg.size() < 2 || arg.front() != '-') return;
        const bool long_option = arg[1] == '-';
        const auto equals = long_option ? arg.find('=') : std::string::npos;
        const std::string name = arg.substr(0, equals);
        const auto exact = std::find_if(spellings.begin(), spellings.end(),
                                        [&](const known& k) { return k.spelling == name; });
        if (exact != spellings.end()) {
            if (takes_value(*exact) && equals == std::string::npos) ++i;  // its value
            continue;
        }
        if (!long_option) continue;         // -r3, -t3, or unknown: CLI11 reads or refuses it
        std::vector<const known*> matches;  // one per option, whichever spelling matched
        for (const auto& k : spellings) {
            if (k.spelling.rfind("--", 0) != 0 || k.spelling.rfind(name, 0) != 0) continue;
            if (std::none_of(matches.begin(), matches.end(), [&](const known* m) { return m->spec == k.spec; })) {
                matches.push_back(&k);
            }
        }
        if (matches.size() > 1) {
            std::vector<std::string_view> names;
            for (const auto* m : matches) names.push_back(m->spec ? long_name(*m->spec) : m->spelling);
            throw usage_error{detail::format("ambiguous option: {} could match {}", name, fmt::join(names, ", "))};
        }
        if (matches.empty()) continue;  // unknown: CLI11 refuses it
        arg = std::string{matches.front()->spelling} + arg.substr(name.size());
        if (takes_value(*matches.front()) && equals == std::string::npos) ++i;
    }
}

}  // namespace detail::launch

ELASTIC_DECL launch_parse_result parse_launch_config(std::vector<std::string> args, const environment& env,
                                                     std::string_view program_name) {
    using detail::launch::option_specs;
    CLI::App app{"", std::string{program_name}};
    app.prefix_command();
    app.set_help_flag();
    app.set_version_flag("--version", detail::format("{} (elastic) {}", program_name, version_string));
    std::array<CLI::Option*, option_specs.size()> options{};
    for (std::size_t i = 0; i < option_specs.size(); ++i) {
        const auto& spec = option_specs[i];
        const std::string names{spec.names};
        if (spec.flag) {
            options[i] = app.add_flag(names)->disable_flag_override();
        } else {
            options[i] = app.add_option(names)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
        }
    }
    detail::launch::expand_abbreviations(args);
    for (auto& arg : args) {
        if (arg.size() > 2 && arg.rfind("--", 0) == 0 && arg.back() == '=') {
            arg += detail::launch::empty_mark;
        }
    }
    std::reverse(args.begin(), args.end());
    try {
        app.parse(args);
    } catch (const CLI::CallForVersion& e) {
        return help_request{std::string{e.what()} + "\n"};
    } catch (const CLI::ParseError& e) {
        throw usage_error{detail::launch::describe_parse_error(e)};
    }
    const auto index_of = [&](std::string_view dest) {
        for (std::size_t i = 0; i < option_specs.size(); ++i) {
            if (option_specs[i].dest == dest) {
                return i;
            }
        }
        throw std::logic_error("elastic: unknown option dest");
    };
    if (options[index_of("help")]->count() > 0) {
        return help_request{help_text(program_name)};
    }

    // ---- the program and its arguments: everything from the first positional on ----
    auto rest = app.remaining();
    for (auto& arg : rest) {
        detail::launch::unmark(arg);
    }
    bool after_marker = false;
    if (!rest.empty() && rest.front() == "--") {
        rest.erase(rest.begin());
        after_marker = true;
    }
    if (!rest.empty() && !after_marker && rest.front().size() > 1 && rest.front().front() == '-') {
        throw usage_error{detail::format("unrecognized option {} (see --help; the program and its arguments come after "
                                         "the options)",
                                         rest.front())};
    }
    if (rest.empty()) {
        throw usage_error{detail::format("no program to run (usage: {} [options] program [args...])", program_name)};
    }

    // ---- each option's text: the command line, else PET_<DEST> ----
    detail::launch::option_labels labels;  // messages name the PET_ variable a value came from
    const auto raw = [&](std::string_view dest) -> std::optional<detail::launch::raw_option> {
        const auto i = index_of(dest);
        const auto& spec = option_specs[i];
        if (options[i]->count() > 0 && !options[i]->results().empty()) {
            auto text = options[i]->results().back();
            detail::launch::unmark(text);
            return detail::launch::raw_option{text, std::string{detail::launch::long_name(spec)}, false};
        }
        if (spec.has_env) {
            const auto name = detail::launch::env_name(spec);
            if (const auto* value = detail::find_variable(env, name); value != nullptr && !value->empty()) {
                labels.from_env.insert_or_assign(std::string{dest}, name);
                return detail::launch::raw_option{*value, name, true};
            }
        }
        return std::nullopt;
    };
    const auto flag = [&](std::string_view dest) {
        const auto i = index_of(dest);
        if (options[i]->count() > 0) {
            return true;
        }
        const auto value = raw(dest);
        return value && parse_flag_variable(value->text, value->name);
    };
    const auto on_command_line = [&](std::string_view dest) { return options[index_of(dest)]->count() > 0; };

    launch_config config;

    // ---- refused and compatibility-only options first: they change how the rest reads ----
    for (const auto& spec : option_specs) {
        if (spec.state != detail::launch::option_state::refused) {
            continue;
        }
        const auto value = raw(spec.dest);
        if (!value) continue;
        throw usage_error{detail::format("{}: {}", detail::launch::show(value->name, value->text), spec.help)};
    }
    if (const auto specs = raw("logs_specs"); specs && detail::launch::trim(specs->text) != "default") {
        throw usage_error{detail::format("{}: not implemented; elastic has only default, torchrun's own log layout, "
                                         "and loads no Python LogsSpecs plugin",
                                         detail::launch::show(specs->name, specs->text))};
    }
    if (const auto method = raw("start_method")) {
        const auto word = detail::launch::trim(method->text);
        if (word != "spawn" && word != "fork" && word != "forkserver") {
            throw usage_error{detail::format("{}: must be spawn, fork or forkserver",
                                             detail::launch::show(method->name, method->text))};
        }
    }

    // ---- the program ----
    const bool module = flag("module");
    const bool no_python = flag("no_python");
    const bool run_path = flag("run_path");
    if (static_cast<int>(module) + static_cast<int>(no_python) + static_cast<int>(run_path) > 1) {
        throw usage_error{"-m/--module, --no-python and --run-path each choose how the program runs; give only one "
                          "(torchrun: don't use both --no-python and --module)"};
    }
    config.program.kind = module      ? program_kind::python_module
                          : no_python ? program_kind::executable
                          : run_path  ? program_kind::python_script
                                      : program_kind::automatic;
    config.program.target = rest.front();
    config.program.args.assign(rest.begin() + 1, rest.end());
    if (const auto* python = detail::find_variable(env, "PYTHON_EXEC"); python != nullptr && !python->empty()) {
        config.program.python = *python;
    }

    // ---- workers on this node ----
    if (const auto v = raw("nproc_per_node")) {
        config.nproc_per_node = resolve_nproc_per_node(v->text, v->name, env);
    }
    if (const auto v = raw("role")) {
        config.role = v->text;
        if (detail::launch::trim(config.role).empty()) {
            throw usage_error{detail::format("{}: must not be empty", detail::launch::show(v->name, v->text))};
        }
    }
    config.virtual_local_rank = flag("virtual_local_rank");

    // ---- nodes and rendezvous ----
    const bool standalone = flag("standalone");
    if (standalone) {
        for (const auto dest : {"rdzv_endpoint", "rdzv_id", "master_addr", "master_port"}) {
            if (on_command_line(dest)) {
                throw usage_error{detail::format("{} conflicts with --standalone, which runs the rendezvous on "
                                                 "localhost:0 under a random id",
                                                 detail::launch::long_name(option_specs[index_of(dest)]))};
            }
        }
        if (const auto v = raw("rdzv_backend"); v && !v->from_env && detail::launch::trim(v->text) != "c10d") {
            throw usage_error{detail::format("{} conflicts with --standalone, which uses the c10d backend",
                                             detail::launch::show(v->name, v->text))};
        }
        if (const auto v = raw("nnodes"); v && !v->from_env && parse_node_range(v->text, v->name) != node_range{1, 1}) {
            throw usage_error{detail::format("{} conflicts with --standalone, which runs a single node",
                                             detail::launch::show(v->name, v->text))};
        }
        use_standalone(config);
    } else {
        if (const auto v = raw("nnodes")) {
            config.nnodes = parse_node_range(v->text, v->name);
        }
        if (const auto v = raw("rdzv_backend")) {
            config.rdzv_backend = parse_rendezvous_backend(v->text, v->name);
        }
        if (const auto v = raw("rdzv_endpoint"); v && !detail::launch::trim(v->text).empty()) {
            // c10d takes a list: the store's endpoint first, then where it may move (validate()
            // refuses a list for the other backends).
            std::string_view remaining = v->text;
            for (bool first = true;; first = false) {
                const auto comma = remaining.find(',');
                const auto one = remaining.substr(0, comma);
                if (detail::launch::trim(one).empty()) {
                    throw usage_error{
                        detail::format("{}: an empty endpoint in the list (want host[:port],host[:port],...)",
                                       detail::launch::show(v->name, v->text))};
                }
                auto endpoint = parse_host_port(one, v->name);
                if (first) {
                    config.rdzv_endpoint = std::move(endpoint);
                } else {
                    config.rdzv_successors.push_back(std::move(endpoint));
                }
                if (comma == std::string_view::npos) break;
                remaining.remove_prefix(comma + 1);
            }
            if (!config.rdzv_successors.empty() && config.nnodes.min == config.nnodes.max &&
                config.rdzv_backend == rendezvous_backend::c10d) {
                config.warnings.push_back(detail::format(
                    "{}: with a fixed --nnodes the rendezvous store never moves, so only the first endpoint is "
                    "used (a list names where an elastic job's store may move)",
                    detail::launch::show(v->name, v->text)));
            }
        }
        if (const auto v = raw("rdzv_id")) {
            config.rdzv_id = v->text;
            if (detail::launch::trim(config.rdzv_id).empty()) {
                throw usage_error{detail::format("{}: must not be empty", detail::launch::show(v->name, v->text))};
            }
        }
    }
    if (const auto v = raw("rdzv_conf")) {
        config.rdzv_conf = parse_rendezvous_settings(v->text, v->name, config.rdzv_backend, &config.warnings);
    }
    if (const auto v = raw("node_rank")) {
        config.node_rank = parse_integer(v->text, v->name, 0);
    }
    if (const auto v = raw("local_addr")) {
        config.local_addr = parse_host(v->text, v->name);
    }
    // Schedulers (Kubeflow's training operator among them) export PET_MASTER_ADDR/PORT for every
    // job; they only mean something to a static rendezvous without --rdzv-endpoint, so from the
    // environment they are dropped elsewhere, while on the command line they are errors there.
    const bool static_store = config.rdzv_backend == rendezvous_backend::static_ && !config.rdzv_endpoint;
    if (const auto v = raw("master_addr"); v && (static_store || !v->from_env)) {
        config.master_addr = parse_host(v->text, v->name);
    }
    if (const auto v = raw("master_port"); v && (static_store || !v->from_env)) {
        config.master_port = static_cast<std::uint16_t>(parse_integer(v->text, v->name, 0, 65535));
    }

    // ---- failures, restarts and shutdown ----
    if (const auto v = raw("max_restarts")) {
        config.max_restarts = parse_integer(v->text, v->name, 0);
    }
    if (const auto v = raw("restart_backoff")) {
        config.restart_backoff = parse_backoff_spec(v->text, v->name);
    }
    if (const auto v = raw("restart_window")) {
        config.restart_window = parse_window_spec(v->text, v->name);
    }
    if (const auto v = raw("restart_on_exit")) {
        config.restart_on_exit = parse_exit_code_set(v->text, v->name);
    }
    if (const auto v = raw("restart_crash_guard")) {
        config.restart_crash_guard = parse_crash_guard_spec(v->text, v->name);
    }
    if (const auto v = raw("restart_no_progress")) {
        config.restart_no_progress = parse_integer(v->text, v->name, 1);
    }
    if (const auto v = raw("watchdog")) {
        config.watchdog = parse_watchdog(v->text, v->name);
    }
    if (const auto v = raw("shutdown_timeout")) {
        config.shutdown_timeout = parse_seconds(v->text, v->name, true);
    } else if (const auto* t = detail::find_variable(env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
               t != nullptr && !t->empty()) {
        config.shutdown_timeout = parse_seconds(*t, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", true);
    }
    if (const auto* on = detail::find_variable(env, "TORCHELASTIC_ENABLE_FILE_TIMER"); on != nullptr && !on->empty()) {
        if (*on == "1") {
            config.file_timer = true;
            if (const auto* path = detail::find_variable(env, "TORCHELASTIC_TIMER_FILE"); path != nullptr) {
                config.file_timer_path = *path;
            }
        } else {
            config.warnings.push_back(
                detail::format("TORCHELASTIC_ENABLE_FILE_TIMER={} is not 1: torch's file timer is "
                               "not served (as in torchrun); set it to 1 to serve it",
                               *on));
        }
    }
    if (const auto v = raw("metrics_port")) {
        const auto text = detail::launch::trim(v->text);
        const bool bare = !text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos;
        const auto at = parse_host_port(bare ? detail::format("0.0.0.0:{}", text) : std::string(text), v->name);
        if (!at.port) {
            throw usage_error{detail::format("{}: needs a port ([HOST:]PORT)", detail::launch::show(v->name, v->text))};
        }
        in6_addr address{};
        if (::inet_pton(AF_INET, at.host.c_str(), &address) != 1 &&
            ::inet_pton(AF_INET6, at.host.c_str(), &address) != 1) {
            throw usage_error{
                detail::format("{}: HOST must be an address of this machine (such as 10.0.0.5), not a name",
                               detail::launch::show(v->name, v->text))};
        }
        config.metrics_host = at.host;
        config.metrics_port = *at.port;
    }
    if (const auto* port = detail::find_variable(env, "TORCHELASTIC_HEALTH_CHECK_PORT");
        port != nullptr && !port->empty()) {
        // torch's variable, read by other launchers too: a bad value costs the health check only.
        const auto n = detail::launch::to_integer(*port);
        if (!n || *n < 0 || *n > 65535) {
            config.warnings.push_back(
                detail::format("TORCHELASTIC_HEALTH_CHECK_PORT={}: not a port from 0 to 65535; no "
                               "health check is served",
                               *port));
        } else {
            config.health_check_port = static_cast<std::uint16_t>(*n);
        }
    }
    if (const auto v = raw("signals_to_handle")) {
        config.signals_to_handle = parse_signals(v->text, v->name);
    }
    if (const auto v = raw("monitor_interval")) {
        config.monitor_interval = parse_seconds(v->text, v->name, true);
    }

    // ---- output and logs ----
    if (const auto v = raw("log_dir")) {
        if (detail::launch::trim(v->text).empty()) {
            throw usage_error{detail::format("{}: must not be empty", detail::launch::show(v->name, v->text))};
        }
        config.log_dir = std::filesystem::path{v->text};
    }
    if (const auto v = raw("redirects")) {
        config.redirects = parse_stream_selection(v->text, v->name);
    }
    if (const auto v = raw("tee")) {
        config.tee = parse_stream_selection(v->text, v->name);
    }
    if (const auto v = raw("local_ranks_filter")) {
        config.local_ranks_filter = parse_local_ranks(v->text, v->name);
    }
    if (const auto v = raw("duplicate_stdout_filters"))
        config.duplicate_stdout_filters = parse_duplicate_filters(v->text);
    if (const auto v = raw("duplicate_stderr_filters"))
        config.duplicate_stderr_filters = parse_duplicate_filters(v->text);
    if (const auto* t = detail::find_variable(env, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
        t != nullptr && !t->empty()) {
        config.log_line_prefix_template = *t;
    }
    if (const auto* level = detail::find_variable(env, "LOGLEVEL"); level != nullptr && !level->empty()) {
        config.agent_log_level = parse_log_level(*level, "LOGLEVEL");
    }
    if (const auto v = raw("event_log_handler")) {
        const auto destination = event_destination::parse(v->text);
        if (!destination) {
            throw usage_error{
                detail::format("{}: must be {}", detail::launch::show(v->name, v->text), event_destination::accepted)};
        }
        config.event_log_handler = *destination;
    }

    detail::launch::validate(config, env, labels);
    // Duplicate filters read tee'd streams only, as torchrun's do: say so when none is.
    for (const auto& [filters, stream, name] :
         {std::tuple{&config.duplicate_stdout_filters, std_streams::out, "stdout"},
          std::tuple{&config.duplicate_stderr_filters, std_streams::err, "stderr"}}) {
        if (filters->empty()) continue;
        bool teed = false;
        for (int r = 0; r < config.nproc_per_node && !teed; ++r) {
            teed = (static_cast<unsigned>(config.tee.for_rank(r)) & static_cast<unsigned>(stream)) != 0;
        }
        if (!teed) {
            // -t 1 with stderr filters wants -t 3, not -t 2 (which would drop the stdout tee).
            bool other_teed = false;
            for (int r = 0; r < config.nproc_per_node && !other_teed; ++r) {
                other_teed = config.tee.for_rank(r) != std_streams::none;
            }
            config.warnings.push_back(detail::format(
                "--duplicate-{}-filters: no local rank tees its {} (-t), so filtered_{}.log stays empty; tee it "
                "(-t {})",
                name, name, name,
                other_teed                   ? 3
                : stream == std_streams::out ? 1
                                             : 2));
        } else if (config.logs_disabled()) {
            config.warnings.push_back(detail::format(
                "--duplicate-{}-filters: --log-dir=/dev/null writes no files, filtered_{}.log included", name, name));
        }
    }
    return config;
}

ELASTIC_DECL launch_parse_result parse_launch_config(int argc, const char* const* argv, const environment& env) {
    std::vector<std::string> args;
    for (int i = 1; i < argc; ++i) {
        args.emplace_back(argv[i]);
    }
    std::string_view name = argc > 0 && argv[0] != nullptr && argv[0][0] != '\0' ? argv[0] : "elasticrun";
    if (const auto slash = name.rfind('/'); slash != std::string_view::npos && slash + 1 < name.size()) {
        name.remove_prefix(slash + 1);
    }
    return parse_launch_config(std::move(args), env, name);
}

#endif  // definitions

}  // namespace elastic::inline v0
