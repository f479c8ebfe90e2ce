// SPDX-License-Identifier: MIT
// elastic 0.1.0 — single-header distribution.
// GENERATED FILE — DO NOT EDIT. Made by tools/amalgamate.py from include/elastic.hpp;
// edit the headers under include/ and run the tool again.
//
// WHAT A PROGRAM USING THIS FILE NEEDS (docs/building.md, "Vendoring the single header"):
//   C++20; on the include path: standalone Asio 1.22+, fmt, nlohmann/json, CLI11 (header-only)
//   and OpenSSL's headers; LINK fmt and OpenSSL's libcrypto: -lfmt -lcrypto -pthread.
//   On Debian 12 (libasio-dev libfmt-dev nlohmann-json3-dev libcli11-dev libssl-dev):
//       g++ -std=c++20 -I<this file's directory> main.cpp -lfmt -lcrypto -pthread
//   A worker may #define ELASTIC_NO_LAUNCHER before including this file: it leaves out the
//   command line and elastic::run, and then needs no CLI11.
//   Separate compilation: define ELASTIC_SEPARATE_COMPILATION in every file of the program,
//   and in exactly one of them also ELASTIC_IMPL_SOURCE before including this file.
// Licence: MIT (the LICENSE file beside the sources; keep this notice with the file).
//
#pragma once
#define ELASTIC_AMALGAMATED 1
// ---- begin elastic.hpp ----
// elastic — a header-only C++20 launcher framework: rendezvous, worker supervision, fault
// tolerance and elasticity for native distributed trainers. This umbrella header includes every
// public header; single_include/elastic.hpp is generated from it by tools/amalgamate.py.

// ---- begin elastic/detail/config.hpp ----
// Library version, feature macros and the configuration every elastic header starts from.

#define ELASTIC_VERSION_MAJOR 0
#define ELASTIC_VERSION_MINOR 1
#define ELASTIC_VERSION_PATCH 0
#define ELASTIC_VERSION_STRING "0.1.0"

// Standalone Asio, not Boost.Asio. clang 14 does not announce coroutine support to Asio 1.22, so
// asio::awaitable would be missing; the CMake target sets both too, this covers users who vendor
// single_include/elastic.hpp without our CMake. It must come before the first Asio include.
#ifndef ASIO_STANDALONE
#define ASIO_STANDALONE 1
#endif
#if defined(__clang__) && !defined(ASIO_HAS_CO_AWAIT)
#define ASIO_HAS_CO_AWAIT 1
#endif

#if !defined(__cplusplus) || __cplusplus < 202002L
#error "elastic needs C++20 (-std=c++20)"
#endif

#if !defined(__linux__)
#error "elastic supports Linux only (it relies on pidfd, prctl and /proc)"
#endif

// ELASTIC_SEPARATE_COMPILATION (docs/building.md): defined in every file of a program, it leaves
// the heavy non-template definitions (elastic::run's agent, the command-line parser,
// elastic::dist::group's members) out of the headers; one file compiles them by defining
// ELASTIC_IMPL_SOURCE and including elastic/impl/src.hpp (or the single header). ELASTIC_DECL
// marks the functions concerned: inline when header-only, ordinary functions of that one file
// otherwise.
#if defined(ELASTIC_SEPARATE_COMPILATION)
#define ELASTIC_DECL
#else
#define ELASTIC_DECL inline
#endif
// ELASTIC_DETAIL_BODIES: 1 where those definitions are compiled (every file header-only, the one
// file of ELASTIC_IMPL_SOURCE otherwise); the headers guard them, and what only they include,
// with it.
#if !defined(ELASTIC_SEPARATE_COMPILATION) || defined(ELASTIC_IMPL_SOURCE)
#define ELASTIC_DETAIL_BODIES 1
#else
#define ELASTIC_DETAIL_BODIES 0
#endif
#if defined(ELASTIC_IMPL_SOURCE)
#define ELASTIC_DETAIL_IMPL_SOURCE_SEEN 1  // the definitions were not skipped (elastic/impl/src.hpp checks)
#endif

namespace elastic::inline v0 {

/// The library's version, as "major.minor.patch".
inline constexpr const char* version_string = ELASTIC_VERSION_STRING;

/// The library's version as numbers.
struct version_info {
    int major;
    int minor;
    int patch;
};
inline constexpr version_info version{ELASTIC_VERSION_MAJOR, ELASTIC_VERSION_MINOR, ELASTIC_VERSION_PATCH};

}  // namespace elastic::inline v0
// ---- end elastic/detail/config.hpp ----
// ---- begin elastic/error.hpp ----
// elastic::error, the base of every exception the library throws.


#include <stdexcept>
#include <string>

namespace elastic::inline v0 {

/// Base of every exception elastic throws. Each layer derives its own (env_error, store_error,
/// process_error, ...); the message always names the thing, the value and the rule or remedy.
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

}  // namespace elastic::inline v0
// ---- end elastic/error.hpp ----
// ---- begin elastic/version.hpp ----
// The library's version: elastic::version and elastic::version_string.

// ---- end elastic/version.hpp ----

// Worker side.
// ---- begin elastic/env.hpp ----
// elastic::env(): the worker's typed, validated view of the environment contract (torchrun's
// variables, composer's NODE_RANK, Slurm and Open MPI fallbacks), read once.


#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// Where a `worker_env` came from, in the order `worker_env::from` tries them
/// (docs/environment.md, "Precedence").
enum class env_source {
    defaults,  ///< no launcher variable at all: a single-rank run (rank 0 of 1)
    torchrun,  ///< torchrun / elasticrun / composer variables (RANK, WORLD_SIZE, ...)
    open_mpi,  ///< mpirun's OMPI_COMM_WORLD_* variables
    slurm,     ///< srun's SLURM_* variables
};

/// The name of a source, as docs/environment.md spells it ("defaults", "torchrun", ...).
[[nodiscard]] constexpr const char* to_string(env_source source) noexcept {
    switch (source) {
        case env_source::defaults: return "defaults";
        case env_source::torchrun: return "torchrun";
        case env_source::open_mpi: return "open_mpi";
        case env_source::slurm: return "slurm";
    }
    return "unknown";
}

/// A worker environment that breaks a rule: the message names the variable(s), their value(s)
/// and the rule; `variables()` lists the names involved, for programs that want to point at them.
class env_error : public error {
public:
    env_error(const std::string& message, std::vector<std::string> variables)
        : error(message), variables_(std::move(variables)) {}

    /// The environment variables the message is about, in the order it names them.
    [[nodiscard]] const std::vector<std::string>& variables() const noexcept { return variables_; }

private:
    std::vector<std::string> variables_;
};

/// What the launcher told this worker: every variable torchrun sets, typed and checked.
/// Defaults (docs/environment.md) make a program started by hand a single-rank run.
struct worker_env {
    int rank = 0;                              ///< RANK: global rank, 0 <= rank < world_size
    int local_rank = 0;                        ///< LOCAL_RANK: rank on this node, 0 <= local_rank < local_world_size
    int world_size = 1;                        ///< WORLD_SIZE: workers in the job
    int local_world_size = 1;                  ///< LOCAL_WORLD_SIZE: workers on this node
    int node_rank = 0;                         ///< GROUP_RANK (alias NODE_RANK): this node's (agent's) rank
    int node_count = 1;                        ///< GROUP_WORLD_SIZE: nodes (agents) in the job
    int role_rank = 0;                         ///< ROLE_RANK: rank among workers of the same role
    int role_world_size = 1;                   ///< ROLE_WORLD_SIZE: workers of the same role
    std::string role_name = "default";         ///< ROLE_NAME (torchrun's --role)
    std::optional<std::string> master_addr;    ///< MASTER_ADDR: host of the rank-0 store
    std::optional<std::uint16_t> master_port;  ///< MASTER_PORT: its port, 1..65535
    int restart_count = 0;                     ///< TORCHELASTIC_RESTART_COUNT: restarts of the group so far
    int max_restarts = 0;                      ///< TORCHELASTIC_MAX_RESTARTS: the launcher's budget
    std::string run_id;                        ///< TORCHELASTIC_RUN_ID: the rendezvous (job) id
    bool use_agent_store = false;              ///< TORCHELASTIC_USE_AGENT_STORE ("True"/"False")
    std::optional<std::string> error_file;     ///< TORCHELASTIC_ERROR_FILE (empty means none)
    env_source source = env_source::defaults;  ///< which launcher's variables these came from

    /// True when a launcher (torchrun, elasticrun, composer, srun, mpirun) started this worker;
    /// false for the single-rank default of a program started by hand.
    [[nodiscard]] bool launched() const noexcept { return source != env_source::defaults; }

    /// Builds and validates a worker_env from `variables` (name -> value: a std::map of strings,
    /// with any comparator, such as the launch layer's `elastic::environment`), exactly as `env()`
    /// does from the process environment. Throws `env_error`.
    template <class Map = std::map<std::string, std::string>>
    [[nodiscard]] static worker_env from(const Map& variables);

    /// Reads and validates the process environment now (`env()` does this once and keeps it).
    /// Throws `env_error`.
    [[nodiscard]] static worker_env from_process();
};

namespace detail {

// Reads variables through a lookup and knows how to complain about them. Every message names
// the variable, its value and the rule, because the person reading it usually did not write the
// launcher's command line that produced the value.
class env_reader {
public:
    using lookup_fn = std::optional<std::string> (*)(const void* context, const char* name);

    env_reader(lookup_fn lookup, const void* context) : lookup_(lookup), context_(context) {}

    [[nodiscard]] std::optional<std::string> get(const char* name) const { return lookup_(context_, name); }
    [[nodiscard]] bool has(const char* name) const { return get(name).has_value(); }

    // The first of `names` that is set, or nullptr.
    [[nodiscard]] const char* first_set(std::initializer_list<const char*> names) const {
        for (const char* name : names) {
            if (has(name)) return name;
        }
        return nullptr;
    }

    [[noreturn]] static void fail(const std::string& what, std::vector<std::string> names) {
        throw env_error("invalid worker environment: " + what, std::move(names));
    }

    // A non-negative decimal integer that fits an int.
    [[nodiscard]] std::optional<int> integer(const char* name) const {
        const auto text = get(name);
        if (!text) return std::nullopt;
        long long value = 0;
        const char* const first = text->data();
        const char* const last = first + text->size();
        const auto [end, ec] = std::from_chars(first, last, value);
        if (text->empty() || ec == std::errc::invalid_argument || end != last) {
            fail(std::string(name) + "='" + *text +
                     "' is not an integer (launcher variables hold decimal integers such as 0 or 8)",
                 {name});
        }
        if (ec == std::errc::result_out_of_range || value > INT_MAX || value < INT_MIN) {
            fail(std::string(name) + "=" + *text + " is out of range (the largest accepted value is " +
                     std::to_string(INT_MAX) + ")",
                 {name});
        }
        if (value < 0) {
            fail(std::string(name) + "=" + *text + " is negative (ranks, sizes and counts are 0 or more)", {name});
        }
        return static_cast<int>(value);
    }

    [[nodiscard]] std::optional<int> size(const char* name) const {
        const auto value = integer(name);
        if (value && *value == 0) {
            fail(std::string(name) + "=0 is not a valid size (sizes are 1 or more)", {name});
        }
        return value;
    }

    [[nodiscard]] std::optional<bool> boolean(const char* name) const {
        const auto text = get(name);
        if (!text) return std::nullopt;
        // torchrun writes str(bool): "True"/"False". Accept the usual shell spellings too.
        for (const char* yes : {"True", "true", "TRUE", "1", "yes"}) {
            if (*text == yes) return true;
        }
        for (const char* no : {"False", "false", "FALSE", "0", "no"}) {
            if (*text == no) return false;
        }
        fail(std::string(name) + "='" + *text +
                 "' is not a boolean (use True or False; true/false/1/0 are accepted too)",
             {name});
    }

private:
    lookup_fn lookup_;
    const void* context_;
};

// An integer with the words that describe where it came from, for messages: "RANK=3", or "the
// node count 2 (GROUP_WORLD_SIZE is unset: WORLD_SIZE / LOCAL_WORLD_SIZE, rounded up)".
struct env_value {
    int value = 0;
    std::string describe;
    std::vector<std::string> names;  // variables behind the value (empty for a pure default)
};

inline env_value from_variable(const char* name, int value) {
    return {value, std::string(name) + "=" + std::to_string(value), {name}};
}

inline env_value from_default(int value, const char* quantity, const std::string& why) {
    return {value, std::string(quantity) + " " + std::to_string(value) + " (" + why + ")", {}};
}

// An optional integer variable as an env_value, or the default.
inline env_value integer_or(const env_reader& reader, const char* name, bool is_size, int fallback,
                            const char* quantity, const std::string& why) {
    const auto value = is_size ? reader.size(name) : reader.integer(name);
    return value ? from_variable(name, *value) : from_default(fallback, quantity, why);
}

inline env_value required(const env_reader& reader, const char* name, bool is_size, const char* launcher,
                          const char* trigger) {
    const auto value = is_size ? reader.size(name) : reader.integer(name);
    if (!value) {
        const auto trigger_value = reader.get(trigger).value_or("");
        env_reader::fail(std::string(name) + " is not set, but " + trigger + "=" + trigger_value +
                             " is: a worker started by " + launcher +
                             " needs it (unset every launcher variable for a single-rank run)",
                         {name, trigger});
    }
    return from_variable(name, *value);
}

inline void check_less(const env_value& low, const env_value& high, const char* rule) {
    if (low.value < high.value) return;
    std::vector<std::string> names = low.names;
    names.insert(names.end(), high.names.begin(), high.names.end());
    env_reader::fail(low.describe + " is not less than " + high.describe + " (" + rule + ")", std::move(names));
}

inline void check_not_more(const env_value& low, const env_value& high, const char* rule) {
    if (low.value <= high.value) return;
    std::vector<std::string> names = low.names;
    names.insert(names.end(), high.names.begin(), high.names.end());
    env_reader::fail(low.describe + " exceeds " + high.describe + " (" + rule + ")", std::move(names));
}

// a >= 0, b > 0; written without a + b - 1, which overflows for sizes near INT_MAX.
inline int ceil_div(int a, int b) { return a / b + (a % b != 0 ? 1 : 0); }

// The local pair: both set, or neither (then the single-node values: the whole job is local).
inline void local_pair(const env_reader& reader, const char* rank_name, const char* size_name, const env_value& rank,
                       const env_value& world, env_value& local_rank, env_value& local_size) {
    const bool has_rank = reader.has(rank_name);
    const bool has_size = reader.has(size_name);
    if (has_rank != has_size) {
        const char* set = has_rank ? rank_name : size_name;
        const char* unset = has_rank ? size_name : rank_name;
        env_reader::fail(std::string(unset) + " is not set, but " + set + "=" + reader.get(set).value_or("") +
                             " is: set both or neither (neither means one node: " + rank_name + " = the global rank, " +
                             size_name + " = the world size)",
                         {unset, set});
    }
    if (!has_rank) {
        local_rank = from_default(rank.value, "the local rank", std::string(rank_name) + " is unset: the global rank");
        local_size = from_default(world.value, "the local world size",
                                  std::string(size_name) + " is unset: the world size");
        return;
    }
    local_rank = from_variable(rank_name, *reader.integer(rank_name));
    local_size = from_variable(size_name, *reader.size(size_name));
}

// The first host of a Slurm hostlist expression: "gpu[07-09,12],cpu1" -> "gpu07";
// "rack[1-2]-n[01-04]" -> "rack1-n01". Returns "" for an empty or malformed list.
inline std::string slurm_first_host(std::string_view list) {
    std::string host;
    int depth = 0;
    bool in_range_tail = false;  // inside [...] after the first number of the first range
    for (const char c : list) {
        if (depth == 0 && c == ',') break;
        if (c == '[') {
            ++depth;
            in_range_tail = false;
            continue;
        }
        if (c == ']') {
            if (depth == 0) return "";
            --depth;
            continue;
        }
        if (depth > 0) {
            if (in_range_tail) continue;
            if (c == '-' || c == ',') {
                in_range_tail = true;
                continue;
            }
        }
        host += c;
    }
    return depth == 0 ? host : std::string();
}

// Slurm's compressed tasks-per-node list: "2(x3),1" is 2,2,2,1. The count of node `node`.
inline std::optional<int> slurm_tasks_on_node(std::string_view list, int node) {
    int index = 0;
    while (!list.empty()) {
        const auto comma = list.find(',');
        const std::string_view item = list.substr(0, comma);
        list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
        int count = 0;
        int repeat = 1;
        auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), count);
        if (ec != std::errc() || count < 0) return std::nullopt;
        const std::string_view rest(end, static_cast<std::size_t>(item.data() + item.size() - end));
        if (!rest.empty()) {
            if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')') return std::nullopt;
            const auto digits = rest.substr(2, rest.size() - 3);
            auto [e2, ec2] = std::from_chars(digits.data(), digits.data() + digits.size(), repeat);
            if (ec2 != std::errc() || e2 != digits.data() + digits.size() || repeat < 1) {
                return std::nullopt;
            }
        }
        if (node < index + repeat) return count;
        index += repeat;
    }
    return std::nullopt;
}

// The variables whose presence means "torchrun (or elasticrun, or composer) started me". The
// rendezvous endpoint (MASTER_ADDR/MASTER_PORT) and TORCHELASTIC_ERROR_FILE are read in every mode
// but do not count: people export them by hand around srun and mpirun.
// clang-format off
inline constexpr const char* torchrun_triggers[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "NODE_RANK", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"};

inline constexpr const char* open_mpi_triggers[] = {
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE"};
// clang-format on

inline const char* first_of(const env_reader& reader, const auto& names) {
    for (const char* name : names) {
        if (reader.has(name)) return name;
    }
    return nullptr;
}

inline void read_torchrun(const env_reader& reader, const char* trigger, worker_env& out) {
    const env_value world = required(reader, "WORLD_SIZE", true, "a launcher", trigger);
    const env_value rank = required(reader, "RANK", false, "a launcher", trigger);
    check_less(rank, world, "ranks run from 0 to WORLD_SIZE-1");
    env_value local_rank;
    env_value local_size;
    local_pair(reader, "LOCAL_RANK", "LOCAL_WORLD_SIZE", rank, world, local_rank, local_size);
    check_less(local_rank, local_size, "local ranks run from 0 to LOCAL_WORLD_SIZE-1");
    check_not_more(local_size, world, "a node cannot run more workers than the whole job");

    // GROUP_RANK is torchrun's name for the node rank, NODE_RANK composer's; both may be set.
    env_value node;
    const auto group_rank = reader.integer("GROUP_RANK");
    const auto node_rank = reader.integer("NODE_RANK");
    if (group_rank && node_rank && *group_rank != *node_rank) {
        env_reader::fail("GROUP_RANK=" + std::to_string(*group_rank) + " and NODE_RANK=" + std::to_string(*node_rank) +
                             " disagree (both name this node's rank: set one, or both alike)",
                         {"GROUP_RANK", "NODE_RANK"});
    }
    if (group_rank) {
        node = from_variable("GROUP_RANK", *group_rank);
    } else if (node_rank) {
        node = from_variable("NODE_RANK", *node_rank);
    } else {
        node = from_default(rank.value / local_size.value, "the node rank",
                            "GROUP_RANK is unset: global rank / local world size");
    }
    const env_value nodes = integer_or(reader, "GROUP_WORLD_SIZE", true, ceil_div(world.value, local_size.value),
                                       "the node count",
                                       "GROUP_WORLD_SIZE is unset: world size / local world size, rounded up");
    check_less(node, nodes, "node ranks run from 0 to GROUP_WORLD_SIZE-1");

    const env_value role_size = integer_or(reader, "ROLE_WORLD_SIZE", true, world.value, "the role world size",
                                           "ROLE_WORLD_SIZE is unset: the world size");
    const env_value role_rank = integer_or(reader, "ROLE_RANK", false, rank.value, "the role rank",
                                           "ROLE_RANK is unset: the global rank");
    check_less(role_rank, role_size, "role ranks run from 0 to ROLE_WORLD_SIZE-1");

    out.world_size = world.value;
    out.rank = rank.value;
    out.local_rank = local_rank.value;
    out.local_world_size = local_size.value;
    out.node_rank = node.value;
    out.node_count = nodes.value;
    out.role_rank = role_rank.value;
    out.role_world_size = role_size.value;
    if (auto name = reader.get("ROLE_NAME")) out.role_name = std::move(*name);
    out.restart_count = reader.integer("TORCHELASTIC_RESTART_COUNT").value_or(0);
    out.max_restarts = reader.integer("TORCHELASTIC_MAX_RESTARTS").value_or(0);
    out.run_id = reader.get("TORCHELASTIC_RUN_ID").value_or("");
    out.use_agent_store = reader.boolean("TORCHELASTIC_USE_AGENT_STORE").value_or(false);
    out.source = env_source::torchrun;
}

inline void read_open_mpi(const env_reader& reader, const char* trigger, worker_env& out) {
    const env_value world = required(reader, "OMPI_COMM_WORLD_SIZE", true, "mpirun", trigger);
    const env_value rank = required(reader, "OMPI_COMM_WORLD_RANK", false, "mpirun", trigger);
    check_less(rank, world, "ranks run from 0 to OMPI_COMM_WORLD_SIZE-1");
    env_value local_rank;
    env_value local_size;
    local_pair(reader, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", rank, world, local_rank, local_size);
    check_less(local_rank, local_size, "local ranks run from 0 to OMPI_COMM_WORLD_LOCAL_SIZE-1");
    check_not_more(local_size, world, "a node cannot run more workers than the whole job");
    out.world_size = world.value;
    out.rank = rank.value;
    out.local_rank = local_rank.value;
    out.local_world_size = local_size.value;
    // Open MPI exports no node index (OMPI_COMM_WORLD_NODE_RANK is a rank *on* the node). With
    // mpirun's default by-slot mapping, node = rank / ranks per node.
    out.node_rank = rank.value / local_size.value;
    out.node_count = ceil_div(world.value, local_size.value);
    out.role_rank = out.rank;
    out.role_world_size = out.world_size;
    out.source = env_source::open_mpi;
}

inline void read_slurm(const env_reader& reader, worker_env& out) {
    const char* const trigger = "SLURM_PROCID";
    // A step may run fewer tasks than the allocation: prefer the step's count.
    const char* const world_name = reader.first_set({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"});
    const env_value world = required(reader, world_name ? world_name : "SLURM_NTASKS", true, "srun", trigger);
    const env_value rank = required(reader, "SLURM_PROCID", false, "srun", trigger);
    check_less(rank, world, "Slurm task ids run from 0 to the task count - 1");
    const env_value local_rank = required(reader, "SLURM_LOCALID", false, "srun", trigger);
    const env_value node = integer_or(reader, "SLURM_NODEID", false, 0, "the node id", "SLURM_NODEID is unset: node 0");
    // This node's entry of the step's list is exact (nodes may differ, a step may differ from
    // the allocation); SLURM_NTASKS_PER_NODE is the allocation's uniform request.
    const auto from_list = [&](const char* list_name) {
        const auto list = reader.get(list_name).value_or("");
        const auto count = slurm_tasks_on_node(list, node.value);
        if (!count || *count == 0) {
            env_reader::fail(std::string(list_name) + "='" + list + "' gives no task count for node " +
                                 std::to_string(node.value) +
                                 " (expected a list such as 2(x3),1 indexed by SLURM_NODEID)",
                             {list_name, "SLURM_NODEID"});
        }
        return env_value{*count,
                         std::string(list_name) + "='" + list + "' (" + std::to_string(*count) + " on node " +
                             std::to_string(node.value) + ")",
                         {list_name}};
    };
    env_value local_size;
    if (reader.has("SLURM_STEP_TASKS_PER_NODE")) {
        local_size = from_list("SLURM_STEP_TASKS_PER_NODE");
    } else if (const auto per_node = reader.size("SLURM_NTASKS_PER_NODE")) {
        local_size = from_variable("SLURM_NTASKS_PER_NODE", *per_node);
    } else if (reader.has("SLURM_TASKS_PER_NODE")) {
        local_size = from_list("SLURM_TASKS_PER_NODE");
    } else {
        env_reader::fail("SLURM_NTASKS_PER_NODE is not set, and neither is SLURM_STEP_TASKS_PER_NODE"
                         " nor SLURM_TASKS_PER_NODE, but SLURM_PROCID=" +
                             reader.get(trigger).value_or("") +
                             " is: the local world size is unknown (run under srun, or set "
                             "LOCAL_WORLD_SIZE with the torchrun variables)",
                         {"SLURM_NTASKS_PER_NODE", "SLURM_PROCID"});
    }
    check_less(local_rank, local_size, "local task ids run below the tasks on this node");
    check_not_more(local_size, world, "a node cannot run more tasks than the whole step");
    const char* const nodes_name = reader.first_set({"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
    const env_value nodes = nodes_name ? from_variable(nodes_name, *reader.size(nodes_name))
                                       : from_default(ceil_div(world.value, local_size.value), "the node count",
                                                      "no SLURM_*NUM_NODES: tasks / tasks per node, rounded up");
    check_less(node, nodes, "node ids run below the node count");

    out.world_size = world.value;
    out.rank = rank.value;
    out.local_rank = local_rank.value;
    out.local_world_size = local_size.value;
    out.node_rank = node.value;
    out.node_count = nodes.value;
    out.role_rank = out.rank;
    out.role_world_size = out.world_size;
    out.run_id = reader.get("SLURM_JOB_ID").value_or("");
    if (const char* list_name = reader.first_set({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})) {
        const auto host = slurm_first_host(reader.get(list_name).value_or(""));
        if (!host.empty()) out.master_addr = host;
    }
    out.source = env_source::slurm;
}

// Variables read whatever the source: the rendezvous endpoint and the error file.
inline void read_common(const env_reader& reader, worker_env& out) {
    if (auto addr = reader.get("MASTER_ADDR")) {
        if (addr->empty()) {
            env_reader::fail("MASTER_ADDR is set but empty (give the rank-0 host's name or "
                             "address, or unset it)",
                             {"MASTER_ADDR"});
        }
        out.master_addr = std::move(*addr);
    }
    if (const auto text = reader.get("MASTER_PORT")) {
        const auto port = reader.integer("MASTER_PORT");
        if (*port < 1 || *port > 65535) {
            env_reader::fail("MASTER_PORT=" + *text + " is outside 1-65535 (a TCP port number)", {"MASTER_PORT"});
        }
        out.master_port = static_cast<std::uint16_t>(*port);
    }
    // torchrun sets it to "" when logs go to /dev/null: no file then.
    if (auto file = reader.get("TORCHELASTIC_ERROR_FILE"); file && !file->empty()) {
        out.error_file = std::move(*file);
    }
}

inline worker_env read_environment(const env_reader& reader) {
    worker_env out;
    // The innermost launcher wins: torchrun under srun or mpirun sees the outer launcher's
    // variables too (SLURM_PROCID is then the agent's task id), and mpirun inside an sbatch
    // script inherits the batch step's SLURM_PROCID=0.
    if (const char* trigger = first_of(reader, torchrun_triggers)) {
        read_torchrun(reader, trigger, out);
    } else if (const char* mpi = first_of(reader, open_mpi_triggers)) {
        read_open_mpi(reader, mpi, out);
    } else if (reader.has("SLURM_PROCID")) {
        read_slurm(reader, out);
    }
    read_common(reader, out);
    return out;
}

}  // namespace detail

template <class Map>
worker_env worker_env::from(const Map& variables) {
    const detail::env_reader reader(
        [](const void* context, const char* name) -> std::optional<std::string> {
            const auto& map = *static_cast<const Map*>(context);
            const auto it = map.find(std::string(name));
            if (it == map.end()) return std::nullopt;
            return it->second;
        },
        &variables);
    return detail::read_environment(reader);
}

inline worker_env worker_env::from_process() {
    const detail::env_reader reader(
        [](const void*, const char* name) -> std::optional<std::string> {
            const char* value = std::getenv(name);
            if (value == nullptr) return std::nullopt;
            return std::string(value);
        },
        nullptr);
    return detail::read_environment(reader);
}

/// The worker's environment, read from the process environment at the first call and kept.
/// Thread-safe. Throws `env_error` (at each call, until the environment is valid) when a
/// variable breaks a rule of docs/environment.md.
[[nodiscard]] inline const worker_env& env() {
    static const worker_env cached = worker_env::from_process();
    return cached;
}

}  // namespace elastic::inline v0
// ---- end elastic/env.hpp ----
// ---- begin elastic/record.hpp ----
// elastic::record(main): torchelastic error files for uncaught exceptions, std::terminate and
// fatal signals, with a C++ backtrace taken where the exception was thrown.

// ---- begin elastic/detail/backtrace.hpp ----
// Backtraces for elastic::record: capture with the unwinder, name frames from the executable's own
// ELF symbol table (so no -rdynamic is needed) or dladdr(3), with async-signal-safe code paths.


#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unwind.h>

namespace elastic::inline v0::detail {

// A bounded character sink over a caller's buffer: no allocation, so the signal handler can use
// it. Output past the end is dropped and remembered (`truncated`).
class fixed_writer {
public:
    fixed_writer(char* buffer, std::size_t capacity) noexcept : buffer_(buffer), capacity_(capacity) {}

    void put(char c) noexcept {
        if (length_ + 1 < capacity_) {
            buffer_[length_++] = c;
            buffer_[length_] = '\0';
        } else {
            truncated_ = true;
        }
    }
    void put(const char* text, std::size_t size) noexcept {
        for (std::size_t i = 0; i < size; ++i) put(text[i]);
    }
    void put(const char* text) noexcept {
        if (text != nullptr) put(text, std::strlen(text));
    }
    void put_unsigned(std::uintmax_t value) noexcept {
        char digits[24];
        std::size_t n = 0;
        do {
            digits[n++] = static_cast<char>('0' + value % 10);
            value /= 10;
        } while (value != 0);
        while (n > 0) put(digits[--n]);
    }
    void put_signed(std::intmax_t value) noexcept {
        if (value < 0) {
            put('-');
            put_unsigned(static_cast<std::uintmax_t>(-(value + 1)) + 1);
        } else {
            put_unsigned(static_cast<std::uintmax_t>(value));
        }
    }
    void put_hex(std::uintptr_t value, int min_digits = 1) noexcept {
        char digits[2 * sizeof(value)];
        int n = 0;
        do {
            digits[n++] = "0123456789abcdef"[value & 0xf];
            value >>= 4;
        } while (value != 0);
        while (n < min_digits && n < static_cast<int>(sizeof(digits))) digits[n++] = '0';
        put("0x", 2);
        while (n > 0) put(digits[--n]);
    }

    [[nodiscard]] const char* data() const noexcept { return buffer_; }
    [[nodiscard]] std::size_t size() const noexcept { return length_; }
    [[nodiscard]] bool truncated() const noexcept { return truncated_; }

private:
    char* buffer_;
    std::size_t capacity_;
    std::size_t length_ = 0;
    bool truncated_ = false;
};

// JSON string content the way Python's json.dump writes it (ensure_ascii): ASCII as is except
// quote, backslash and controls; everything else as \uXXXX (UTF-16, surrogate pairs above the BMP);
// bytes that are not UTF-8 become U+FFFD. Works on any sink with put(char).
template <class Sink>
void json_escape(Sink& out, const char* text, std::size_t size) noexcept {
    const auto hex4 = [&out](unsigned code) noexcept {
        out.put('\\');
        out.put('u');
        for (int shift = 12; shift >= 0; shift -= 4) out.put("0123456789abcdef"[(code >> shift) & 0xf]);
    };
    std::size_t i = 0;
    while (i < size) {
        const auto byte = static_cast<unsigned char>(text[i]);
        if (byte < 0x80) {
            ++i;
            switch (byte) {
                case '"':
                    out.put('\\');
                    out.put('"');
                    break;
                case '\\':
                    out.put('\\');
                    out.put('\\');
                    break;
                case '\n':
                    out.put('\\');
                    out.put('n');
                    break;
                case '\r':
                    out.put('\\');
                    out.put('r');
                    break;
                case '\t':
                    out.put('\\');
                    out.put('t');
                    break;
                case '\b':
                    out.put('\\');
                    out.put('b');
                    break;
                case '\f':
                    out.put('\\');
                    out.put('f');
                    break;
                default:
                    if (byte < 0x20 || byte == 0x7f) {  // Python escapes all but ' '..'~'
                        hex4(byte);
                    } else {
                        out.put(static_cast<char>(byte));
                    }
            }
            continue;
        }
        // Decode one UTF-8 sequence, strictly (no overlongs, no surrogates, at most U+10FFFF).
        std::size_t length = 0;
        unsigned code = 0;
        unsigned minimum = 0;
        if ((byte & 0xe0) == 0xc0) {
            length = 2;
            code = byte & 0x1fu;
            minimum = 0x80;
        } else if ((byte & 0xf0) == 0xe0) {
            length = 3;
            code = byte & 0x0fu;
            minimum = 0x800;
        } else if ((byte & 0xf8) == 0xf0) {
            length = 4;
            code = byte & 0x07u;
            minimum = 0x10000;
        }
        bool valid = length != 0 && i + length <= size;
        for (std::size_t k = 1; valid && k < length; ++k) {
            const auto next = static_cast<unsigned char>(text[i + k]);
            if ((next & 0xc0) != 0x80) {
                valid = false;
            } else {
                code = (code << 6) | (next & 0x3fu);
            }
        }
        if (valid && (code < minimum || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff))) {
            valid = false;
        }
        if (!valid) {
            hex4(0xfffd);
            ++i;
            continue;
        }
        i += length;
        if (code >= 0x10000) {
            code -= 0x10000;
            hex4(0xd800 + (code >> 10));
            hex4(0xdc00 + (code & 0x3ff));
        } else {
            hex4(code);
        }
    }
}

/// One symbolized frame. Pointers refer to the mapped executable, the dynamic loader's tables or
/// static storage: nothing here is allocated.
struct frame_symbol {
    const char* function = nullptr;      // mangled name, or nullptr when unknown
    std::uintptr_t function_offset = 0;  // pc - start of the function
    const char* object = nullptr;        // the executable or shared object holding pc
    std::uintptr_t object_offset = 0;    // pc - load base of that object (what addr2line takes)
};

// The executable's static symbol table (.symtab), mapped read-only at install time. dladdr only
// sees the dynamic symbol table, which in an executable linked without -rdynamic holds almost
// nothing: the functions a user wants to see (the thrower, main) are only in .symtab.
struct executable_symbols {
    const unsigned char* image = nullptr;
    std::size_t image_size = 0;
    const ElfW(Sym) * symbols = nullptr;
    std::size_t symbol_count = 0;
    const char* strings = nullptr;
    std::size_t strings_size = 0;
    std::uintptr_t bias = 0;  // runtime address = st_value + bias
    bool loaded = false;
    char path[4096] = {};
};

inline executable_symbols exe_symbols_storage{};

// Maps /proc/self/exe and finds .symtab. Best effort and idempotent: on any failure frames fall
// back to dladdr. Done lazily, at the first symbolization (i.e. at the crash, by the one thread
// that reports), so that a healthy worker pays nothing: it only makes system calls (readlink,
// open, fstat, mmap, close), reads memory and getauxval, all usable in a signal handler.
inline void load_executable_symbols() noexcept {
    auto& exe = exe_symbols_storage;
    if (exe.loaded) return;
    exe.loaded = true;
    const ssize_t length = ::readlink("/proc/self/exe", exe.path, sizeof(exe.path) - 1);
    exe.path[length > 0 ? length : 0] = '\0';
    const int fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat info {};
    if (::fstat(fd, &info) != 0 || info.st_size < static_cast<off_t>(sizeof(ElfW(Ehdr)))) {
        ::close(fd);
        return;
    }
    const auto size = static_cast<std::size_t>(info.st_size);
    void* const map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return;
    const auto* image = static_cast<const unsigned char*>(map);
    ElfW(Ehdr) header;
    std::memcpy(&header, image, sizeof(header));
    const bool usable = std::memcmp(header.e_ident, ELFMAG, SELFMAG) == 0 && header.e_shentsize == sizeof(ElfW(Shdr)) &&
                        header.e_shoff != 0 &&
                        header.e_shoff + std::size_t{header.e_shnum} * sizeof(ElfW(Shdr)) <= size;
    if (!usable) {
        ::munmap(map, size);
        return;
    }
    const auto* sections = reinterpret_cast<const ElfW(Shdr)*>(image + header.e_shoff);
    for (std::size_t i = 0; i < header.e_shnum; ++i) {
        if (sections[i].sh_type != SHT_SYMTAB || sections[i].sh_link >= header.e_shnum) continue;
        const auto& strings = sections[sections[i].sh_link];
        if (sections[i].sh_offset + sections[i].sh_size > size || strings.sh_offset + strings.sh_size > size) {
            continue;
        }
        exe.symbols = reinterpret_cast<const ElfW(Sym)*>(image + sections[i].sh_offset);
        exe.symbol_count = sections[i].sh_size / sizeof(ElfW(Sym));
        exe.strings = reinterpret_cast<const char*>(image + strings.sh_offset);
        exe.strings_size = strings.sh_size;
        break;
    }
    if (exe.symbols == nullptr) {  // stripped: dladdr will do what it can
        ::munmap(map, size);
        return;
    }
    // The load bias of a PIE: where the kernel put the program headers minus where the file says
    // they are (PT_PHDR, or the PT_LOAD segment that holds e_phoff).
    const auto at_phdr = static_cast<std::uintptr_t>(::getauxval(AT_PHDR));
    const auto phnum = static_cast<std::size_t>(::getauxval(AT_PHNUM));
    const auto* phdrs = reinterpret_cast<const ElfW(Phdr)*>(at_phdr);
    bool found = false;
    for (std::size_t i = 0; phdrs != nullptr && i < phnum && !found; ++i) {
        if (phdrs[i].p_type == PT_PHDR) {
            exe.bias = at_phdr - phdrs[i].p_vaddr;
            found = true;
        }
    }
    for (std::size_t i = 0; phdrs != nullptr && i < phnum && !found; ++i) {
        if (phdrs[i].p_type == PT_LOAD && phdrs[i].p_offset <= header.e_phoff &&
            header.e_phoff < phdrs[i].p_offset + phdrs[i].p_filesz) {
            exe.bias = at_phdr - (phdrs[i].p_vaddr + header.e_phoff - phdrs[i].p_offset);
            found = true;
        }
    }
    if (!found) {
        exe.symbols = nullptr;
        ::munmap(map, size);
        return;
    }
    exe.image = image;
    exe.image_size = size;
}

// Names the function holding `lookup` (a pc, or a return address minus one); offsets are reported
// against `pc`. Async-signal-safe as far as dladdr is (glibc's backtrace_symbols_fd relies on it
// the same way); the executable's table is mapped on first use (load_executable_symbols).
inline frame_symbol symbolize(std::uintptr_t pc, std::uintptr_t lookup) noexcept {
    load_executable_symbols();
    frame_symbol out;
    const auto& exe = exe_symbols_storage;
    if (exe.symbols != nullptr) {
        for (std::size_t i = 0; i < exe.symbol_count; ++i) {
            const auto& symbol = exe.symbols[i];
            if (ELF64_ST_TYPE(symbol.st_info) != STT_FUNC || symbol.st_size == 0 || symbol.st_value == 0 ||
                symbol.st_name >= exe.strings_size) {
                continue;
            }
            const std::uintptr_t start = symbol.st_value + exe.bias;
            if (lookup >= start && lookup < start + symbol.st_size) {
                out.function = exe.strings + symbol.st_name;
                out.function_offset = pc - start;
                out.object = exe.path;
                out.object_offset = pc - exe.bias;
                return out;
            }
        }
    }
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(lookup), &info) != 0) {
        out.object = info.dli_fname;
        out.object_offset = pc - reinterpret_cast<std::uintptr_t>(info.dli_fbase);
        if (info.dli_sname != nullptr && info.dli_saddr != nullptr) {
            out.function = info.dli_sname;
            out.function_offset = pc - reinterpret_cast<std::uintptr_t>(info.dli_saddr);
        }
        // dladdr names the executable by argv[0] or ""; the real path is more use to addr2line.
        if (exe.path[0] != '\0' && exe.symbols != nullptr &&
            reinterpret_cast<std::uintptr_t>(info.dli_fbase) == exe.bias) {
            out.object = exe.path;
        }
    }
    return out;
}

inline _Unwind_Reason_Code backtrace_step(_Unwind_Context* context, void* argument) noexcept {
    auto& state = *static_cast<std::pair<void**, int>*>(argument);
    auto& [frames, remaining] = state;
    if (remaining == 0) return _URC_END_OF_STACK;
    *frames++ = reinterpret_cast<void*>(_Unwind_GetIP(context));
    --remaining;
    return _URC_NO_REASON;
}

/// Captures the calling thread's stack (innermost first; frame 0 is this function). It calls the
/// unwinder every C++ program already links (libgcc_s) directly: glibc's backtrace(3) would
/// dlopen it on first use, which costs ~0.2 ms at start-up (to warm it) or is unsafe in a signal
/// handler (if not warmed). Walks through signal frames (the unwinder knows the kernel's
/// trampoline).
inline int capture_backtrace(void** frames, int capacity) noexcept {
    std::pair<void**, int> state{frames, capacity};
    _Unwind_Backtrace(backtrace_step, &state);
    return capacity - state.second;
}

}  // namespace elastic::inline v0::detail
// ---- end elastic/detail/backtrace.hpp ----

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include <cxxabi.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

namespace elastic::inline v0 {

/// The exit status of a process that `record` saw end with an uncaught exception: 1, as Python's.
/// A fatal signal is re-raised instead (the parent sees the signal itself), and `std::terminate`
/// without an exception ends in SIGABRT, as it would without `record`.
inline constexpr int uncaught_exception_exit_code = 1;

namespace detail {

inline constexpr int record_max_frames = 128;

// Everything the crash paths touch is allocated before the crash: the paths, the buffers, the
// alternate signal stack. The buffers live in .bss and cost no memory until a crash writes them.
struct record_state {
    std::atomic<int> phase{0};          // 0: nothing reported, 1: reporting, 2: reported
    std::atomic<long> reporter_tid{0};  // the thread writing the report
    std::atomic<bool> installed{false};
    bool has_error_file = false;
    char error_file[4096] = {};
    char scratch_path[4096 + 32] = {};
    char message[16 * 1024] = {};
    char callstack[64 * 1024] = {};
    alignas(16) char signal_stack[64 * 1024] = {};
};

inline record_state record_storage{};

inline long current_tid() noexcept { return ::syscall(SYS_gettid); }

// Buffered output to a file descriptor with write(2): unbounded, allocation-free, signal-safe.
class fd_writer {
public:
    explicit fd_writer(int fd) noexcept : fd_(fd) {}
    fd_writer(const fd_writer&) = delete;
    fd_writer& operator=(const fd_writer&) = delete;
    ~fd_writer() { flush(); }

    void put(char c) noexcept {
        if (size_ == sizeof(buffer_)) flush();
        buffer_[size_++] = c;
    }
    void put(const char* text, std::size_t size) noexcept {
        for (std::size_t i = 0; i < size; ++i) put(text[i]);
    }
    void put(const char* text) noexcept {
        if (text != nullptr) put(text, std::strlen(text));
    }
    void flush() noexcept {
        std::size_t done = 0;
        while (done < size_ && !failed_) {
            const ssize_t n = ::write(fd_, buffer_ + done, size_ - done);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                failed_ = true;
            } else {
                done += static_cast<std::size_t>(n);
            }
        }
        size_ = 0;
    }
    [[nodiscard]] bool failed() const noexcept { return failed_; }

private:
    int fd_;
    char buffer_[4096];
    std::size_t size_ = 0;
    bool failed_ = false;
};

// torchelastic's error-file JSON, byte for byte as Python's json.dump writes it:
// {"message": {"message": "<T>: <what>", "extraInfo": {"py_callstack": "...", "timestamp": "<s>"}}}
template <class Sink>
void write_error_json(Sink& out, const char* message, std::size_t message_size, const char* callstack,
                      std::size_t callstack_size, std::int64_t timestamp) {
    out.put("{\"message\": {\"message\": \"");
    json_escape(out, message, message_size);
    out.put("\", \"extraInfo\": {\"py_callstack\": \"");
    json_escape(out, callstack, callstack_size);
    out.put("\", \"timestamp\": \"");
    char digits[24];
    fixed_writer number(digits, sizeof(digits));
    number.put_signed(timestamp);
    out.put(number.data(), number.size());
    out.put("\"}}}");
}

// Creates the missing parents of `path` (mkdir(2) only: signal-safe). The agent normally made
// them; a hand-set TORCHELASTIC_ERROR_FILE may point anywhere.
inline void make_parent_directories(char* path) noexcept {
    for (char* p = path + 1; *p != '\0'; ++p) {
        if (*p != '/') continue;
        *p = '\0';
        (void)::mkdir(path, 0755);
        *p = '/';
    }
}

// Writes the error file as "<path>.tmp.<pid>" and renames it over <path>, so a reader (the agent)
// sees the whole file or none. Returns 0 or the errno of the step that failed.
inline int write_error_file_atomically(const char* message, std::size_t message_size, const char* callstack,
                                       std::size_t callstack_size, std::int64_t timestamp) noexcept {
    auto& state = record_storage;
    fixed_writer temporary(state.scratch_path, sizeof(state.scratch_path));
    temporary.put(state.error_file);
    temporary.put(".tmp.");
    temporary.put_unsigned(static_cast<std::uintmax_t>(::getpid()));
    if (temporary.truncated()) return ENAMETOOLONG;
    make_parent_directories(state.scratch_path);
    const int fd = ::open(state.scratch_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errno;
    bool failed = false;
    {
        fd_writer out(fd);
        write_error_json(out, message, message_size, callstack, callstack_size, timestamp);
        out.flush();
        failed = out.failed();
    }
    const int saved = errno;
    ::close(fd);
    if (failed) {
        ::unlink(state.scratch_path);
        return saved != 0 ? saved : EIO;
    }
    if (::rename(state.scratch_path, state.error_file) != 0) {
        const int error = errno;
        ::unlink(state.scratch_path);
        return error;
    }
    return 0;
}

// "elastic::v0::env_error" reads better as "elastic::env_error"; likewise std::__cxx11::.
inline void put_type_name(fixed_writer& out, const char* name) noexcept {
    struct rename {
        const char* from;
        const char* to;
    };
    static constexpr rename renames[] = {{"elastic::v0::", "elastic::"}, {"std::__cxx11::", "std::"}};
    while (*name != '\0') {
        bool renamed = false;
        for (const auto& r : renames) {
            const std::size_t length = std::strlen(r.from);
            if (std::strncmp(name, r.from, length) == 0) {
                out.put(r.to);
                name += length;
                renamed = true;
                break;
            }
        }
        if (!renamed) out.put(*name++);
    }
}

// The human form of a frame, one line: "  #3 0x55d0c0de1234 in f(int)+0x1c (/bin/prog+0x1234)".
inline void put_frame(fixed_writer& out, int index, std::uintptr_t pc, const frame_symbol& symbol, bool demangle) {
    out.put("  #");
    out.put_unsigned(static_cast<std::uintmax_t>(index));
    out.put(' ');
    out.put_hex(pc);
    out.put(" in ");
    if (symbol.function == nullptr) {
        out.put("??");
    } else {
        char* readable = nullptr;
        if (demangle) {
            int status = 0;
            readable = abi::__cxa_demangle(symbol.function, nullptr, nullptr, &status);
        }
        out.put(readable != nullptr ? readable : symbol.function);
        std::free(readable);
        out.put('+');
        out.put_hex(symbol.function_offset);
    }
    if (symbol.object != nullptr && symbol.object[0] != '\0') {
        out.put(" (");
        out.put(symbol.object);
        out.put('+');
        out.put_hex(symbol.object_offset);
        out.put(')');
    }
    out.put('\n');
}

struct crash_report {
    const char* type = nullptr;  // "std::runtime_error", "SIGSEGV", ...
    const char* what = nullptr;  // what(), or the signal's description
    void* const* frames = nullptr;
    int frame_count = 0;
    int first_frame = 0;    // frames before it are the reporting machinery
    int exact_frame = -1;   // a frame whose pc is not a return address (signals)
    bool demangle = false;  // only outside signal handlers: it allocates
};

// Writes the report: the error file when TORCHELASTIC_ERROR_FILE was set, and a readable copy on
// stderr in every case. Signal-safe when `demangle` is false.
inline void write_report(const crash_report& report) noexcept {
    auto& state = record_storage;
    fixed_writer message(state.message, sizeof(state.message));
    put_type_name(message, report.type);
    message.put(": ");
    message.put(report.what);

    fixed_writer stack(state.callstack, sizeof(state.callstack));
    stack.put("C++ backtrace (most recent call first):\n");
    for (int i = report.first_frame; i < report.frame_count; ++i) {
        const auto pc = reinterpret_cast<std::uintptr_t>(report.frames[i]);
        // A return address points after the call: look up pc - 1 so a call that ends a function
        // is not attributed to the next one.
        const auto lookup = i == report.exact_frame || pc == 0 ? pc : pc - 1;
        put_frame(stack, i - report.first_frame, pc, symbolize(pc, lookup), report.demangle);
    }
    if (stack.truncated()) stack.put("  ... (truncated)\n");

    struct timespec now {};
    ::clock_gettime(CLOCK_REALTIME, &now);

    int file_error = 0;
    if (state.has_error_file) {
        file_error = write_error_file_atomically(message.data(), message.size(), stack.data(), stack.size(),
                                                 static_cast<std::int64_t>(now.tv_sec));
    }
    fd_writer err(STDERR_FILENO);
    err.put("elastic::record: ");
    err.put(message.data(), message.size());
    err.put('\n');
    err.put(stack.data(), stack.size());
    if (state.has_error_file) {
        if (file_error == 0) {
            err.put("elastic::record: error file written to ");
            err.put(state.error_file);
        } else {
            fixed_writer code(state.scratch_path, sizeof(state.scratch_path));
            code.put_unsigned(static_cast<std::uintmax_t>(file_error));
            err.put("elastic::record: could not write the error file ");
            err.put(state.error_file);
            err.put(" (errno ");
            err.put(code.data(), code.size());
            err.put(")");
        }
        err.put('\n');
    }
    err.flush();
}

// Claims the right to report. False when another report is under way or done; a second thread
// that crashes while the first reports then waits for the first to end the process.
inline bool begin_report() noexcept {
    auto& state = record_storage;
    int expected = 0;
    if (state.phase.compare_exchange_strong(expected, 1)) {
        state.reporter_tid.store(current_tid());
        return true;
    }
    if (expected == 1 && state.reporter_tid.load() != current_tid()) {
        for (;;) ::pause();
    }
    return false;
}

inline void restore_default_action(int signal_number) noexcept {
    struct sigaction action {};
    action.sa_handler = SIG_DFL;
    sigemptyset(&action.sa_mask);
    ::sigaction(signal_number, &action, nullptr);
}

inline const char* fatal_signal_name(int signal_number) noexcept {
    switch (signal_number) {
        case SIGSEGV: return "SIGSEGV";
        case SIGBUS: return "SIGBUS";
        case SIGFPE: return "SIGFPE";
        case SIGILL: return "SIGILL";
        case SIGABRT: return "SIGABRT";
        default: return "SIG?";
    }
}

inline const char* signal_description(int signal_number) noexcept {
    switch (signal_number) {
        case SIGSEGV: return "segmentation fault";
        case SIGBUS: return "bus error";
        case SIGFPE: return "arithmetic exception";
        case SIGILL: return "illegal instruction";
        case SIGABRT: return "aborted";
        default: return "fatal signal";
    }
}

inline constexpr int record_fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

// The handler of the fatal signals: report once, then re-raise with the default action so the
// parent sees the true signal (and a core is dumped where enabled). Signal-safe throughout.
inline void on_fatal_signal(int signal_number, siginfo_t* info, void* context) noexcept {
    const int saved_errno = errno;
    if (begin_report()) {
        void* frames[record_max_frames];
        const int count = capture_backtrace(frames, record_max_frames);
        // Frames above the interrupted instruction are this handler and the kernel's trampoline.
        std::uintptr_t interrupted = 0;
#if defined(__x86_64__)
        interrupted = static_cast<std::uintptr_t>(static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
        interrupted = static_cast<std::uintptr_t>(static_cast<ucontext_t*>(context)->uc_mcontext.pc);
#else
        (void)context;
#endif
        int first = 0;
        for (int i = 0; i < count && interrupted != 0; ++i) {
            if (reinterpret_cast<std::uintptr_t>(frames[i]) == interrupted) {
                first = i;
                break;
            }
        }
        char what[160];
        fixed_writer text(what, sizeof(what));
        text.put(signal_description(signal_number));
        text.put(" (signal ");
        text.put_unsigned(static_cast<std::uintmax_t>(signal_number));
        text.put(") in PID ");
        text.put_unsigned(static_cast<std::uintmax_t>(::getpid()));
        if (signal_number != SIGABRT && info != nullptr && info->si_code > 0) {
            text.put(", fault address ");
            text.put_hex(reinterpret_cast<std::uintptr_t>(info->si_addr));
        }
        crash_report report;
        report.type = fatal_signal_name(signal_number);
        report.what = text.data();
        report.frames = frames;
        report.frame_count = count;
        report.first_frame = first;
        report.exact_frame = interrupted != 0 ? first : -1;
        write_report(report);
        record_storage.phase.store(2);
    }
    restore_default_action(signal_number);
    // Blocked until the handler returns; a fault then re-faults under the default action.
    ::raise(signal_number);
    errno = saved_errno;
}

inline std::string demangled(const char* name) {
    int status = 0;
    char* readable = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string out = readable != nullptr ? readable : name;
    std::free(readable);
    return out;
}

// Where the failure happened in a stack taken inside the terminate handler: just below the last
// frame of __cxa_throw, __cxa_rethrow, std::rethrow_exception, std::terminate or clang's
// __clang_call_terminate (ASan's interceptor of __cxa_throw shows up as one more such frame).
inline int first_frame_after_throw(void* const* frames, int count) noexcept {
    int first = 1;  // at least drop the handler itself
    for (int i = 0; i < count && i < 24; ++i) {
        const auto pc = reinterpret_cast<std::uintptr_t>(frames[i]);
        const frame_symbol symbol = symbolize(pc, pc - 1);
        if (symbol.function == nullptr) continue;
        for (const char* marker :
             {"__cxa_throw", "__cxa_rethrow", "rethrow_exception", "_ZSt9terminatev", "__clang_call_terminate"}) {
            if (std::strstr(symbol.function, marker) != nullptr) first = i + 1;
        }
    }
    return first < count ? first : 0;
}

// The terminate handler. An exception nobody catches makes the C++ runtime call terminate from
// inside __cxa_throw, *before* any unwinding (the search phase found no handler): the stack here
// still holds the throwing function. That is why record() never catches.
[[noreturn]] inline void on_terminate() noexcept {
    void* frames[record_max_frames];
    const int count = capture_backtrace(frames, record_max_frames);
    if (!begin_report()) {  // this thread failed while reporting: give up the standard way
        restore_default_action(SIGABRT);
        std::abort();
    }
    crash_report report;
    report.frames = frames;
    report.frame_count = count;
    report.demangle = true;
    const std::exception_ptr current = std::current_exception();
    if (current == nullptr) {
        report.type = "std::terminate";
        report.what = "called without an active exception";
        report.first_frame = first_frame_after_throw(frames, count);
        write_report(report);
        record_storage.phase.store(2);
        std::fflush(nullptr);
        restore_default_action(SIGABRT);
        std::abort();
    }
    const std::type_info* const type = abi::__cxa_current_exception_type();
    std::string type_name;
    std::string what;
    try {
        std::rethrow_exception(current);
    } catch (const std::exception& e) {
        type_name = demangled(typeid(e).name());
        what = e.what();
    } catch (...) {
        type_name = type != nullptr ? demangled(type->name()) : "<unknown type>";
        what = "(an exception that is not a std::exception carries no message)";
    }
    report.type = type_name.c_str();
    report.what = what.c_str();
    report.first_frame = first_frame_after_throw(frames, count);
    write_report(report);
    record_storage.phase.store(2);
    // No unwinding happened and other threads may still run: flush stdio and leave without
    // running static destructors under their feet.
    std::fflush(nullptr);
    std::_Exit(uncaught_exception_exit_code);
}

}  // namespace detail

/// Installs what `record` relies on, once per process: the terminate handler and the fatal-signal
/// handlers (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) on an alternate stack. Reads
/// TORCHELASTIC_ERROR_FILE now. Costs a few system calls; symbols are only read at a crash. Call it
/// yourself when you cannot wrap main (e.g. in a library's init); calling it again does nothing.
inline void install_error_handlers() {
    auto& state = detail::record_storage;
    if (state.installed.exchange(true)) return;
    if (const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
        path != nullptr && path[0] != '\0' && std::strlen(path) < sizeof(state.error_file)) {
        std::strcpy(state.error_file, path);
        state.has_error_file = true;
    }
    std::set_terminate(detail::on_terminate);

    // A stack overflow leaves no stack to run a handler on: give this thread an alternate one,
    // unless someone (ASan does) already did.
    stack_t current{};
    if (::sigaltstack(nullptr, &current) == 0 && (current.ss_flags & SS_DISABLE) != 0) {
        stack_t alternate{};
        alternate.ss_sp = state.signal_stack;
        alternate.ss_size = sizeof(state.signal_stack);
        alternate.ss_flags = 0;
        (void)::sigaltstack(&alternate, nullptr);
    }
    for (const int signal_number : detail::record_fatal_signals) {
        struct sigaction action {};
        action.sa_sigaction = detail::on_fatal_signal;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        ::sigaction(signal_number, &action, nullptr);
    }
}

/// Runs a worker's main under torchelastic's error reporting and returns what it returns (0 for a
/// void entry). An uncaught exception — here or in any thread — writes TORCHELASTIC_ERROR_FILE
/// (or, without it, stderr only) with "<type>: <what()>" and a backtrace from the throw site, then
/// exits with `uncaught_exception_exit_code`; std::terminate and fatal signals are reported too.
///
///     int main(int argc, char** argv) { return elastic::record(real_main, argc, argv); }
///
/// It deliberately has no try block: catching would unwind the stack before we could see it.
template <class Entry, class... Args>
int record(Entry&& entry, Args&&... args) {
    install_error_handlers();
    if constexpr (std::is_void_v<std::invoke_result_t<Entry, Args...>>) {
        std::forward<Entry>(entry)(std::forward<Args>(args)...);
        return 0;
    } else {
        return static_cast<int>(std::forward<Entry>(entry)(std::forward<Args>(args)...));
    }
}

}  // namespace elastic::inline v0
// ---- end elastic/record.hpp ----

// Layers (each of these includes the public headers of its folder).
// ---- begin elastic/store.hpp ----
// The store layer: the store concepts, the in-memory and prefix models, the wire codec, the TCP
// server and the TCP client (PyTorch's TCPStore protocol, both dialects), and leases.

// ---- begin elastic/store/blocking_client.hpp ----
// blocking_store_client: tcp_store_client behind plain blocking calls, for worker code that is
// not asynchronous (each call runs a private io_context until the operation is done).

// ---- begin elastic/store/client.hpp ----
// tcp_store_client: a client of PyTorch's TCPStore protocol (both dialects) that models the
// `store` concept as coroutines; connect with backoff, a deadline on every operation; leases
// kept alive by heartbeats, and a lost connection reported as an event.

// ---- begin elastic/detail/coro.hpp ----
// Coroutine primitives for code that runs on one thread (an executor's): a FIFO lock, a signal
// that wakes every waiter, a latch over a count of tasks, and settle() for racing an operation
// that may throw with `||`. The waits sleep on steady_timers that never expire by themselves;
// cancelling the timer is the wake-up.
//
// The classes are templates over an unused parameter, used through their aliases: g++ compiles
// every non-template inline coroutine in every file that sees it, a template's only where it
// is used (docs/building.md, "Compile time").


#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <iterator>
#include <list>
#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

namespace elastic::inline v0::detail {

/// asio::use_awaitable, and as_tuple of it, named through a template parameter. An operation
/// completed with them depends on `Defer`, so g++ compiles the operation's coroutine only where
/// the template that awaits it is used; with asio::use_awaitable it would compile it wherever
/// the template is seen (docs/building.md, "Compile time").
template <class Defer>
inline constexpr asio::use_awaitable_t<> use_awaitable{};
template <class Defer>
inline constexpr asio::experimental::as_tuple_t<asio::use_awaitable_t<>> as_tuple_awaitable{};
/// asio::detached, named the same way: a co_spawn completed with it compiles its entry point
/// only where the spawning template is used.
template <class Defer>
inline constexpr asio::detached_t detached{};

/// A FIFO lock for coroutines, taken without suspension when free. A queued waiter sleeps on
/// its own timer; unlock() hands the lock over by marking the first waiter granted and
/// cancelling its timer. Use it on one thread.
template <class Defer = void>
class basic_async_mutex {
public:
    explicit basic_async_mutex(const asio::any_io_executor& executor) : executor_(executor) {}
    basic_async_mutex(const basic_async_mutex&) = delete;
    basic_async_mutex& operator=(const basic_async_mutex&) = delete;

    /// Takes the lock, in turn. A waiter cancelled while queued leaves the queue and throws
    /// operation_aborted with `cancelled` as its message.
    asio::awaitable<void> lock(const char* cancelled = "cancelled while queued for the lock") {
        if (try_lock()) co_return;
        waiter w(executor_);
        w.timer.expires_at(asio::steady_timer::time_point::max());
        queue_.push_back(&w);
        const auto it = std::prev(queue_.end());
        co_await w.timer.async_wait(as_tuple_awaitable<Defer>);
        if (!w.granted) {  // cancelled by our caller while queued
            queue_.erase(it);
            throw std::system_error(asio::error::operation_aborted, cancelled);
        }
    }

    /// Takes the lock when it is free; whether it did.
    bool try_lock() noexcept {
        if (locked_) return false;
        locked_ = true;
        return true;
    }

    /// Releases the lock: to the first waiter, or free.
    void unlock() noexcept {
        if (queue_.empty()) {
            locked_ = false;
            return;
        }
        auto* next = queue_.front();
        queue_.pop_front();
        next->granted = true;
        next->timer.cancel();
    }

    [[nodiscard]] bool locked() const noexcept { return locked_; }

private:
    struct waiter {
        explicit waiter(const asio::any_io_executor& ex) : timer(ex) {}
        asio::steady_timer timer;
        bool granted = false;
    };

    asio::any_io_executor executor_;
    bool locked_ = false;
    std::list<waiter*> queue_;
};
using async_mutex = basic_async_mutex<>;

/// Wakes every coroutine that waits on it at each notify(); a waiter then checks what it
/// waits for and waits again if need be. A notify() with nobody waiting is lost. Use it on one
/// thread.
template <class Defer = void>
class basic_async_signal {
public:
    explicit basic_async_signal(const asio::any_io_executor& executor)
        : timer_(executor, asio::steady_timer::time_point::max()) {}

    /// Wakes every current waiter.
    void notify() noexcept { timer_.cancel(); }

    /// Completes at the next notify(), when the signal is destroyed, or when the caller is
    /// cancelled (it cannot tell which: check the cancellation state or what it waits for). It
    /// touches nothing of the signal once woken, so the signal may be gone by then.
    asio::awaitable<void> wait() { (void)co_await timer_.async_wait(as_tuple_awaitable<Defer>); }

private:
    asio::steady_timer timer_;
};
using async_signal = basic_async_signal<>;

/// Counts running tasks and lets one coroutine await the moment none is left (an event: the
/// last `done()` cancels the timer the waiter sleeps on; nothing polls).
template <class Defer = void>
class basic_task_latch {
public:
    explicit basic_task_latch(const asio::any_io_executor& executor) : timer_(executor) {
        timer_.expires_at(asio::steady_timer::time_point::max());
    }
    void add() noexcept { ++count_; }
    void done() noexcept {
        if (--count_ == 0) timer_.cancel();
    }
    [[nodiscard]] std::size_t count() const noexcept { return count_; }
    /// Counts chunks the tasks handled: lets a bounded wait tell a stream still flowing from one
    /// held open by a process that writes nothing.
    void progressed() noexcept { ++progress_; }
    [[nodiscard]] std::uint64_t progress() const noexcept { return progress_; }

    /// Returns once count() is 0, or when the await is cancelled (it may be awaited again then).
    /// One latch per attempt's streams.
    asio::awaitable<void> wait() {
        if (count_ == 0) co_return;
        co_await timer_.async_wait(as_tuple_awaitable<Defer>);
    }

private:
    asio::steady_timer timer_;
    std::size_t count_ = 0;
    std::uint64_t progress_ = 0;
};
using task_latch = basic_task_latch<>;

/// An operation's value or the exception it ended with. The agent races rendezvous and policy
/// operations against its signals with `||`; an exception escaping one side of `||` left the
/// agent waiting for ever in Asio 1.22 (found with a join timeout), so the operation's
/// exception is caught inside the race and rethrown after it.
template <class T>
struct settled {
    std::optional<T> value;
    std::exception_ptr error;

    T take() {
        if (error) std::rethrow_exception(error);
        return std::move(*value);
    }
};

/// Runs `op` to its end and returns its value or its exception (settled<std::monostate> for
/// awaitable<void>).
template <class T>
auto settle(asio::awaitable<T> op)
    -> asio::awaitable<settled<std::conditional_t<std::is_void_v<T>, std::monostate, T>>> {
    settled<std::conditional_t<std::is_void_v<T>, std::monostate, T>> out;
    try {
        if constexpr (std::is_void_v<T>) {
            co_await std::move(op);
            out.value.emplace();
        } else {
            out.value.emplace(co_await std::move(op));
        }
    } catch (...) {
        out.error = std::current_exception();
    }
    co_return out;
}

}  // namespace elastic::inline v0::detail
// ---- end elastic/detail/coro.hpp ----
// ---- begin elastic/store/auth.hpp ----
// The store's authentication handshake: a mutual HMAC-SHA256 challenge-response over a shared
// job secret, as two pure state machines (client and server) that consume bytes and produce
// bytes, so they can be tested and fuzzed without sockets. Byte layout in docs/store.md.

// ---- begin elastic/store/errors.hpp ----
// The store layer's exceptions: store_error, store_timeout and store_auth_error.


#include <string>
#include <system_error>
#include <utility>

namespace elastic::inline v0 {

/// A store operation failed: bad input (ADD on a non-numeric value, mismatched sizes), a broken
/// connection, a server that cannot bind. The message names the key or address and the rule.
class store_error : public error {
public:
    using error::error;
};

/// A server cannot listen where it was told; `code()` says why, as Asio reported it
/// (`asio::error::address_in_use`: another program holds the port; `access_denied`: a port below
/// 1024 without the privilege; ...).
class store_listen_error : public store_error {
public:
    store_listen_error(const std::string& message, std::error_code code) : store_error(message), code_(code) {}
    [[nodiscard]] std::error_code code() const noexcept { return code_; }

private:
    std::error_code code_;
};

/// A `wait` (or a `get`, which waits for its key) did not see its keys before the deadline.
class store_timeout : public store_error {
public:
    using store_error::store_error;
};

/// The store and this client do not share a secret: the server refused the client's proof, or
/// the server could not prove it knows the client's secret (it has another, none, or it is not
/// the job's store). Retrying does not help; the message says which secret option to fix.
class store_auth_error : public store_error {
public:
    using store_error::store_error;
};

}  // namespace elastic::inline v0
// ---- end elastic/store/errors.hpp ----

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

// Why this shape (docs/store.md, "Authentication"):
// - The first byte, 0xEA, is no opcode of either TCPStore dialect (legacy opcodes are 0..12,
//   the current dialect starts 00 CE F7 85 3C), so a server tells a handshake from a request
//   by its first byte, and a server without a secret rejects it as an unknown opcode.
// - The server proves itself first: a client sends nothing derived from the secret to a server
//   that has not shown it knows the secret.
// - Each MAC covers a direction label and both nonces, so neither side's proof can be replayed
//   on another connection (fresh nonces) or reflected back as the other side's (labels).
namespace elastic::inline v0::store_auth {

/// Bytes of a nonce and of a MAC (HMAC-SHA256).
inline constexpr std::size_t nonce_size = 32;
inline constexpr std::size_t mac_size = 32;
/// The version this code speaks (the byte after the magic).
inline constexpr std::uint8_t version = 1;
/// The 8 bytes that open both hellos: 0xEA then "elastic".
inline constexpr std::array<char, 8> magic{'\xEA', 'e', 'l', 'a', 's', 't', 'i', 'c'};
/// The client's hello: magic, version, client nonce.
inline constexpr std::size_t client_hello_size = magic.size() + 1 + nonce_size;
/// The server's challenge: magic, version, server nonce, server MAC.
inline constexpr std::size_t server_challenge_size = magic.size() + 1 + nonce_size + mac_size;
/// The client's proof: its MAC.
inline constexpr std::size_t client_proof_size = mac_size;
/// The server's verdict: one byte, `accepted`. A refused client is closed instead.
inline constexpr std::size_t verdict_size = 1;
inline constexpr std::uint8_t accepted = 0x01;

/// The labels each side's MAC starts with (same length, so the MAC input is unambiguous).
inline constexpr std::string_view server_label = "elastic-store-auth v1 server";
inline constexpr std::string_view client_label = "elastic-store-auth v1 client";
static_assert(server_label.size() == client_label.size());

using nonce = std::array<unsigned char, nonce_size>;
using mac = std::array<unsigned char, mac_size>;

/// A fresh nonce from OpenSSL's CSPRNG; store_error when it has no entropy.
ELASTIC_DECL nonce random_nonce();

/// HMAC-SHA256(secret, label || client nonce || server nonce).
ELASTIC_DECL mac compute_mac(std::string_view secret, std::string_view label, const nonce& client, const nonce& server);

/// What one `feed` did.
enum class status : std::uint8_t {
    need_more,  ///< `size` is how many bytes of input the next step needs; nothing consumed
    ok,         ///< `size` bytes consumed; the reply (if any) was appended to `out`
    refused,    ///< the peer failed; `reason` says how. Close the connection
};

struct step {
    store_auth::status status = status::need_more;
    std::size_t size = 0;
    std::string reason;
};

namespace detail {

ELASTIC_DECL std::string hex(std::string_view bytes, std::size_t at_most = 8);

// How many leading bytes of `in` match magic + version: all available ones, or the index of
// the first that differs.
ELASTIC_DECL std::size_t matching_prefix(std::string_view in);

ELASTIC_DECL void put_nonce(std::string& out, const nonce& n);

ELASTIC_DECL nonce get_nonce(std::string_view in);

ELASTIC_DECL void put_header(std::string& out);

ELASTIC_DECL bool same_mac(const mac& expected, std::string_view got);

}  // namespace detail

/// The server's side: reads the client's hello, answers with its nonce and proof, reads the
/// client's proof and answers `accepted`. Feed it the unconsumed input until done() or refused.
class server_handshake {
public:
    /// `secret` must not be empty. `server_nonce` is injectable for tests and fuzzing.
    server_handshake(std::string secret, const nonce& server_nonce)
        : secret_(std::move(secret)), server_nonce_(server_nonce) {}
    explicit server_handshake(std::string secret) : server_handshake(std::move(secret), random_nonce()) {}

    /// Consumes the next message from the front of `in`, appending the reply to `out`.
    step feed(std::string_view in, std::string& out) {
        switch (phase_) {
            case phase::hello: {
                const auto match = detail::matching_prefix(in);
                if (match < std::min(in.size(), magic.size() + 1)) {
                    phase_ = phase::failed;
                    return {status::refused, 0, describe_stranger(in, match)};
                }
                if (in.size() < client_hello_size) return {status::need_more, client_hello_size, {}};
                client_nonce_ = detail::get_nonce(in.substr(magic.size() + 1));
                detail::put_header(out);
                detail::put_nonce(out, server_nonce_);
                const auto m = compute_mac(secret_, server_label, client_nonce_, server_nonce_);
                out.append(reinterpret_cast<const char*>(m.data()), m.size());
                phase_ = phase::proof;
                return {status::ok, client_hello_size, {}};
            }
            case phase::proof: {
                if (in.size() < client_proof_size) return {status::need_more, client_proof_size, {}};
                const auto expected = compute_mac(secret_, client_label, client_nonce_, server_nonce_);
                if (!detail::same_mac(expected, in.substr(0, client_proof_size))) {
                    phase_ = phase::failed;
                    return {status::refused, 0,
                            "its proof does not verify: the client was given another secret "
                            "than this server's"};
                }
                out.push_back(static_cast<char>(accepted));
                phase_ = phase::done;
                return {status::ok, client_proof_size, {}};
            }
            case phase::done:
            case phase::failed: break;
        }
        return {status::refused, 0, "no handshake in progress (it has ended)"};
    }

    /// The client has proved it knows the secret.
    [[nodiscard]] bool done() const noexcept { return phase_ == phase::done; }
    /// This server's challenge is out; the client's proof is awaited.
    [[nodiscard]] bool challenged() const noexcept { return phase_ == phase::proof; }

private:
    enum class phase : std::uint8_t { hello, proof, done, failed };

    // The first bytes are not a handshake: say what they look like, for the log.
    static std::string describe_stranger(std::string_view in, std::size_t match) {
        const auto first = static_cast<unsigned char>(in[0]);
        if (match >= magic.size())
            return fmt::format("its handshake has version {}, this server speaks {}",
                               static_cast<unsigned>(static_cast<unsigned char>(in[match])), version);
        // 00 CE ...: the current dialect's VALIDATE; 00 anything else: a legacy SET.
        if (first == 0x00 && (in.size() == 1 || in[1] == '\xCE'))
            return fmt::format("it sent a TCPStore request (bytes {}) without authenticating; "
                               "this store needs the job's secret",
                               detail::hex(in));
        if (first <= 12)
            return fmt::format("it sent a TCPStore request of the PyTorch 1.13 dialect (opcode "
                               "{}) without authenticating; this store needs the job's secret",
                               static_cast<unsigned>(first));
        return fmt::format("its first bytes ({}) are neither an authentication handshake nor a "
                           "TCPStore request",
                           detail::hex(in));
    }

    std::string secret_;
    nonce server_nonce_;
    nonce client_nonce_{};
    phase phase_ = phase::hello;
};

/// The client's side: start() gives the hello; feed() reads the server's challenge (checking
/// the server's proof before sending anything derived from the secret), appends the client's
/// proof, then reads the verdict.
class client_handshake {
public:
    /// `secret` must not be empty. `client_nonce` is injectable for tests and fuzzing.
    client_handshake(std::string secret, const nonce& client_nonce)
        : secret_(std::move(secret)), client_nonce_(client_nonce) {}
    explicit client_handshake(std::string secret) : client_handshake(std::move(secret), random_nonce()) {}

    /// Appends the hello to `out`.
    void start(std::string& out) const {
        detail::put_header(out);
        detail::put_nonce(out, client_nonce_);
    }

    /// Consumes the next server message from the front of `in`, appending the reply to `out`.
    step feed(std::string_view in, std::string& out) {
        switch (phase_) {
            case phase::challenge: {
                const auto match = detail::matching_prefix(in);
                if (match < std::min(in.size(), magic.size() + 1)) {
                    phase_ = phase::failed;
                    return {status::refused, 0,
                            match >= magic.size()
                                ? fmt::format("it answered with handshake version {}, this "
                                              "client speaks {}",
                                              static_cast<unsigned>(static_cast<unsigned char>(in[match])), version)
                                : fmt::format("it answered the authentication handshake with "
                                              "bytes {}: it is not an elastic store with a "
                                              "secret",
                                              detail::hex(in))};
                }
                if (in.size() < server_challenge_size) return {status::need_more, server_challenge_size, {}};
                const auto server_nonce = detail::get_nonce(in.substr(magic.size() + 1));
                const auto expected = compute_mac(secret_, server_label, client_nonce_, server_nonce);
                if (!detail::same_mac(expected, in.substr(magic.size() + 1 + nonce_size, mac_size))) {
                    phase_ = phase::failed;
                    return {status::refused, 0,
                            "its proof does not verify: the server was given another secret "
                            "than this client's (or it is not the job's store)"};
                }
                const auto m = compute_mac(secret_, client_label, client_nonce_, server_nonce);
                out.append(reinterpret_cast<const char*>(m.data()), m.size());
                phase_ = phase::verdict;
                return {status::ok, server_challenge_size, {}};
            }
            case phase::verdict: {
                if (in.size() < verdict_size) return {status::need_more, verdict_size, {}};
                if (static_cast<unsigned char>(in[0]) != accepted) {
                    phase_ = phase::failed;
                    return {status::refused, 0,
                            fmt::format("it answered the proof with verdict 0x{:02x}, not "
                                        "0x{:02x}",
                                        static_cast<unsigned char>(in[0]), accepted)};
                }
                phase_ = phase::done;
                return {status::ok, verdict_size, {}};
            }
            case phase::done:
            case phase::failed: break;
        }
        return {status::refused, 0, "no handshake in progress (it has ended)"};
    }

    /// The server has accepted this client's proof.
    [[nodiscard]] bool done() const noexcept { return phase_ == phase::done; }
    /// The client's proof is sent: a close now means the server refused the secret.
    [[nodiscard]] bool proof_sent() const noexcept { return phase_ == phase::verdict; }

private:
    enum class phase : std::uint8_t { challenge, verdict, done, failed };

    std::string secret_;
    nonce client_nonce_;
    phase phase_ = phase::challenge;
};

}  // namespace elastic::inline v0::store_auth

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::store_auth {

ELASTIC_DECL nonce random_nonce() {
    nonce n{};
    if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
        throw store_error("the store's authentication cannot draw a random nonce (OpenSSL "
                          "RAND_bytes failed): the system has no entropy source");
    return n;
}

ELASTIC_DECL mac compute_mac(std::string_view secret, std::string_view label, const nonce& client,
                             const nonce& server) {
    std::array<unsigned char, server_label.size() + 2 * nonce_size> input{};
    auto* p = input.data();
    for (const char c : label) *p++ = static_cast<unsigned char>(c);
    for (const auto b : client) *p++ = b;
    for (const auto b : server) *p++ = b;
    mac out{};
    unsigned int len = 0;
    if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), input.data(), input.size(), out.data(),
             &len) == nullptr ||
        len != out.size())
        throw store_error("the store's authentication cannot compute HMAC-SHA256 (OpenSSL HMAC "
                          "failed)");
    return out;
}

}  // namespace elastic::inline v0::store_auth

namespace elastic::inline v0::store_auth {
namespace detail {

ELASTIC_DECL std::string hex(std::string_view bytes, std::size_t at_most) {
    std::string out;
    for (std::size_t i = 0; i < bytes.size() && i < at_most; ++i)
        out += fmt::format("{}{:02x}", i ? " " : "", static_cast<unsigned char>(bytes[i]));
    if (bytes.size() > at_most) out += " ...";
    return out;
}

ELASTIC_DECL std::size_t matching_prefix(std::string_view in) {
    const std::size_t n = std::min(in.size(), magic.size() + 1);
    for (std::size_t i = 0; i < n; ++i) {
        const char want = i < magic.size() ? magic[i] : static_cast<char>(version);
        if (in[i] != want) return i;
    }
    return n;
}

ELASTIC_DECL void put_nonce(std::string& out, const nonce& n) {
    out.append(reinterpret_cast<const char*>(n.data()), n.size());
}

ELASTIC_DECL nonce get_nonce(std::string_view in) {
    nonce n{};
    for (std::size_t i = 0; i < n.size(); ++i) n[i] = static_cast<unsigned char>(in[i]);
    return n;
}

ELASTIC_DECL void put_header(std::string& out) {
    out.append(magic.data(), magic.size());
    out.push_back(static_cast<char>(version));
}

ELASTIC_DECL bool same_mac(const mac& expected, std::string_view got) {
    return got.size() == expected.size() && CRYPTO_memcmp(expected.data(), got.data(), expected.size()) == 0;
}

}  // namespace detail
}  // namespace elastic::inline v0::store_auth

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/store/auth.hpp ----
// ---- begin elastic/store/client_connection.hpp ----
// One connection of a tcp_store_client: its socket and the deadline every operation on it has,
// and the backoff between connection attempts.


#include <asio/any_io_executor.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <system_error>

namespace elastic::inline v0::detail::store {

// One TCP connection and its deadline timer. Shared with the timer's handler (weakly), which
// may run after the client or the connection is gone.
struct store_client_connection : std::enable_shared_from_this<store_client_connection> {
    explicit store_client_connection(const asio::any_io_executor& ex) : socket(ex), timer(ex) {}
    asio::ip::tcp::socket socket;
    asio::steady_timer timer;
    std::uint64_t generation = 0;  // bumped by each arm/disarm; stale expiries are ignored
    bool expired = false;          // the armed deadline passed: pending I/O was cancelled

    // Arms the connection's deadline: when it passes, pending socket I/O is cancelled and
    // `expired` set, so the operation reports a timeout instead of hanging.
    // `may_extend`: false for a deadline that only schedules something (a heartbeat's send
    // time), which must never move later.
    ELASTIC_DECL void arm_deadline(std::chrono::steady_clock::time_point deadline, bool may_extend = true);

    // The timer of one arm: at `deadline`, unless the peer's bytes wait unread, which is this
    // process's delay (stopped, or starved of CPU), not the peer's: then once more after `span`.
    ELASTIC_DECL void watch(std::chrono::steady_clock::time_point deadline, std::uint64_t armed,
                            std::chrono::steady_clock::duration span, bool may_extend);

    ELASTIC_DECL void disarm() noexcept;

    // Shuts the socket down and closes it; the deadline lapses.
    ELASTIC_DECL void close() noexcept;
};

// The delay after failed connection attempt `attempt` (from 1): `initial`, doubled up to
// `max`, multiplied by a random factor in [0.5, 1] so many clients do not retry in lockstep.
ELASTIC_DECL std::chrono::milliseconds connect_backoff(int attempt, std::chrono::milliseconds initial,
                                                       std::chrono::milliseconds max, std::minstd_rand& rng);

}  // namespace elastic::inline v0::detail::store

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::store {

ELASTIC_DECL std::chrono::milliseconds connect_backoff(int attempt, std::chrono::milliseconds initial,
                                                       std::chrono::milliseconds max, std::minstd_rand& rng) {
    auto d = initial;
    for (int i = 1; i < attempt && d < max; ++i) d *= 2;
    d = std::min(d, max);
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    return std::chrono::milliseconds(static_cast<std::chrono::milliseconds::rep>(static_cast<double>(d.count()) *
                                                                                 jitter(rng)));
}

}  // namespace elastic::inline v0::detail::store

namespace elastic::inline v0::detail::store {

ELASTIC_DECL void store_client_connection::arm_deadline(std::chrono::steady_clock::time_point deadline,
                                                        bool may_extend) {
    expired = false;
    const auto armed = ++generation;
    watch(deadline, armed, deadline - std::chrono::steady_clock::now(), may_extend);
}

ELASTIC_DECL void store_client_connection::watch(std::chrono::steady_clock::time_point deadline, std::uint64_t armed,
                                                 std::chrono::steady_clock::duration span, bool may_extend) {
    timer.expires_at(deadline);
    timer.async_wait([weak = weak_from_this(), armed, span, may_extend](const std::error_code& ec) {
        if (ec) return;
        const auto conn = weak.lock();
        if (!conn || conn->generation != armed) return;
        // Not the peer's delay but this process's: the peer's bytes wait unread, or the timer
        // ran long after its time (this process was stopped, or starved of CPU, and could not
        // have read a reply). Once per arm, one more span.
        const auto now = std::chrono::steady_clock::now();
        const auto late = now - conn->timer.expiry();
        std::error_code unread;
        const bool spoke = conn->socket.is_open() && conn->socket.available(unread) > 0 && !unread;
        const bool stalled = late >
                             std::max<std::chrono::steady_clock::duration>(span / 4, std::chrono::milliseconds(100));
        if (may_extend && (spoke || stalled)) {
            conn->watch(now + span, armed, span, false);
            return;
        }
        conn->expired = true;
        std::error_code ignored;
        conn->socket.cancel(ignored);
    });
}

ELASTIC_DECL void store_client_connection::disarm() noexcept {
    ++generation;
    timer.cancel();
}

ELASTIC_DECL void store_client_connection::close() noexcept {
    std::error_code ignored;
    socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    disarm();
}

}  // namespace elastic::inline v0::detail::store

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/store/client_connection.hpp ----
// ---- begin elastic/store/client_dialect.hpp ----
// client_dialect: which wire dialect a TCP store client speaks, apart from the client itself so
// that options naming it (elastic::dist::group_options) need not parse the client.


#include <cstdint>

namespace elastic::inline v0 {

/// Which wire dialect a client speaks: the current one (PyTorch >= 2.2) or the legacy one (1.13 to
/// 2.1); docs/store-client.md explains why a stall during detection means legacy.
enum class client_dialect : std::uint8_t {
    /// Try the current handshake (VALIDATE + PING); a reset, an EOF or a stall (no PING echo
    /// within `detect_timeout`) means a PyTorch <= 2.1 server: reconnect in the legacy dialect.
    /// The answer is kept for reconnections.
    detect,
    current,  ///< PyTorch >= 2.2 servers (and ours): VALIDATE + PING first; no fallback
    legacy,   ///< PyTorch 1.13 servers (and ours): no handshake, SET = 0
};

}  // namespace elastic::inline v0
// ---- end elastic/store/client_dialect.hpp ----
// ---- begin elastic/store/client_leases.hpp ----
// The leases of a tcp_store_client (docs/store-client.md, "Leases"): the keys it holds on its
// connection, the heartbeat that keeps them alive on the wire, and the loss of the connection
// that held them, latched until someone awaits it.

// ---- begin elastic/store/wire.hpp ----
// The c10d TCPStore wire codec: opcode tables of both dialects, primitive encodings, dialect
// detection and an incremental request parser shared by the server and the client.


#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// Byte layouts follow PyTorch's torch/csrc/distributed/c10d/TCPStore*.cpp (docs/store.md describes
// the dialects and their semantics). Integers are host-order memcpy copies in PyTorch, i.e.
// little-endian on every platform it runs on; we encode little-endian explicitly so the bytes are
// the same on any host.
namespace elastic::inline v0::wire {

/// The opcode numbering a connection speaks, chosen from its first bytes (`detect_dialect`).
enum class dialect : std::uint8_t {
    legacy,   ///< PyTorch 1.13 (SET=0 ... WATCH_KEY=7, DELETE_KEY=8), ~2.0's 9..12; no handshake
    current,  ///< PyTorch >= ~2.2: VALIDATE=0, SET=1, ..., PING=13, QUEUE_*, LIST_KEYS, BARRIER
};

/// A request's operation, independent of the numbering.
enum class op : std::uint8_t {
    validate,
    set,
    compare_set,
    get,
    add,
    check,
    wait,
    num_keys,
    watch_key,
    delete_key,
    append,
    multi_get,
    multi_set,
    cancel_wait,
    ping,
    queue_push,
    queue_pop,
    queue_len,
    list_keys,
    barrier,
};

/// VALIDATE's magic (u32 0x3C85F7CE, on the wire `CE F7 85 3C`).
inline constexpr std::uint32_t validate_magic = 0x3C85F7CEu;

/// `CheckResponseType`: the reply to CHECK.
enum class check_response : std::uint8_t { ready = 0, not_ready = 1 };
/// `WaitResponseType`: STOP_WAITING answers WAIT (maybe later); WAIT_CANCELED answers CANCEL_WAIT.
enum class wait_response : std::uint8_t { stop_waiting = 0, wait_canceled = 1 };
/// `WatchResponseType` (legacy dialect only): the first byte of a WATCH_KEY notification.
enum class watch_response : std::uint8_t {
    key_updated = 0,
    key_created = 1,
    key_deleted = 2,
    key_callback_registered = 3,
    key_appended = 4,
};

namespace detail {
inline constexpr std::array<op, 13> legacy_ops{op::set,        op::compare_set, op::get,       op::add,
                                               op::check,      op::wait,        op::num_keys,  op::watch_key,
                                               op::delete_key, op::append,      op::multi_get, op::multi_set,
                                               op::cancel_wait};
inline constexpr std::array<op, 19> current_ops{op::validate,    op::set,       op::compare_set, op::get,
                                                op::add,         op::check,     op::wait,        op::num_keys,
                                                op::delete_key,  op::append,    op::multi_get,   op::multi_set,
                                                op::cancel_wait, op::ping,      op::queue_push,  op::queue_pop,
                                                op::queue_len,   op::list_keys, op::barrier};
}  // namespace detail

/// The operation a byte means in `d`, or nothing for a byte the dialect does not define.
constexpr std::optional<op> to_op(dialect d, std::uint8_t byte) noexcept {
    if (d == dialect::legacy) {
        if (byte < detail::legacy_ops.size()) return detail::legacy_ops[byte];
    } else if (byte < detail::current_ops.size()) {
        return detail::current_ops[byte];
    }
    return std::nullopt;
}

/// The byte of `o` in `d`, or nothing when the dialect has no such operation (VALIDATE, PING,
/// queues, LIST_KEYS and BARRIER are current-only; WATCH_KEY is legacy-only).
constexpr std::optional<std::uint8_t> to_byte(dialect d, op o) noexcept {
    const auto find = [o](const auto& table) -> std::optional<std::uint8_t> {
        for (std::size_t i = 0; i < table.size(); ++i)
            if (table[i] == o) return static_cast<std::uint8_t>(i);
        return std::nullopt;
    };
    return d == dialect::legacy ? find(detail::legacy_ops) : find(detail::current_ops);
}

/// PyTorch's upper-case name of an operation (for logs).
constexpr std::string_view name(op o) noexcept {
    constexpr std::array<std::string_view, 20> names{"VALIDATE",  "SET",         "COMPARE_SET", "GET",
                                                     "ADD",       "CHECK",       "WAIT",        "GETNUMKEYS",
                                                     "WATCH_KEY", "DELETE_KEY",  "APPEND",      "MULTI_GET",
                                                     "MULTI_SET", "CANCEL_WAIT", "PING",        "QUEUE_PUSH",
                                                     "QUEUE_POP", "QUEUE_LEN",   "LIST_KEYS",   "BARRIER"};
    return names[static_cast<std::size_t>(o)];
}

/// Size limits a parser enforces (documented in docs/store.md). A request beyond one is
/// malformed: the server closes that connection and logs why.
struct limits {
    std::size_t max_key_size = 64 * 1024;             ///< bytes in one key
    std::size_t max_value_size = 16 * 1024 * 1024;    ///< bytes in one value
    std::size_t max_keys_per_request = 128 * 1024;    ///< n of CHECK/WAIT/MULTI_GET/MULTI_SET
    std::size_t max_request_size = 64 * 1024 * 1024;  ///< bytes of one whole request
};

// ---- primitive encodings -------------------------------------------------------------------

/// Appends one byte.
inline void put_u8(std::string& out, std::uint8_t v) { out.push_back(static_cast<char>(v)); }

/// Appends a little-endian unsigned integer of N bytes.
template <class T>
inline void put_le(std::string& out, T v) {
    char bytes[sizeof(T)];
    for (std::size_t i = 0; i < sizeof(T); ++i)
        bytes[i] = static_cast<char>(static_cast<std::uint8_t>(static_cast<std::uint64_t>(v) >> (8 * i)));
    out.append(bytes, sizeof(T));
}

/// Appends a u32 (VALIDATE magic, PING nonce).
inline void put_u32(std::string& out, std::uint32_t v) { put_le(out, v); }
/// Appends a u64 (lengths, counts).
inline void put_u64(std::string& out, std::uint64_t v) { put_le(out, v); }
/// Appends an i64 (ADD delta and result, GETNUMKEYS, DELETE_KEY's count): two's complement LE.
inline void put_i64(std::string& out, std::int64_t v) { put_le(out, static_cast<std::uint64_t>(v)); }
/// Appends a key or value: u64 length, then the raw bytes.
inline void put_bytes(std::string& out, std::string_view s) {
    put_u64(out, s.size());
    out.append(s);
}

/// Reads a little-endian integer from exactly sizeof(T) bytes at `p`.
template <class T>
inline T get_le(const char* p) noexcept {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i)
        v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
    return static_cast<T>(v);
}

// ---- dialect detection ---------------------------------------------------------------------

/// What the first bytes of a connection say: not enough yet, or which dialect.
enum class detection : std::uint8_t { need_more, legacy, current };

/// Chooses a connection's dialect from its first bytes: `00 CE F7 85 3C` (VALIDATE with its
/// magic) is the current dialect, anything else legacy. A first byte other than 0x00 decides at
/// once; after 0x00 five bytes are needed. A legacy SET would only match with a key length whose
/// low 32 bits are 0x3C85F7CE (about 1 GB), which is beyond any limit.
constexpr detection detect_dialect(std::string_view first) noexcept {
    if (first.empty()) return detection::need_more;
    if (first[0] != '\0') return detection::legacy;
    constexpr char magic[] = {'\0', '\xCE', '\xF7', '\x85', '\x3C'};
    for (std::size_t i = 1; i < 5; ++i) {
        if (i >= first.size()) return detection::need_more;
        if (first[i] != magic[i]) return detection::legacy;
    }
    return detection::current;
}

// ---- requests ------------------------------------------------------------------------------

/// One decoded request. Views point into the parsed buffer: valid until it changes. The parser
/// reuses the vectors' capacity, so keep one `request` per connection.
struct request {
    op operation = op::num_keys;
    /// SET, COMPARE_SET, GET, ADD, WATCH_KEY, DELETE_KEY, APPEND, QUEUE_*, BARRIER
    std::string_view key;
    std::string_view value;                ///< SET, APPEND, QUEUE_PUSH; COMPARE_SET's desired value
    std::string_view expected;             ///< COMPARE_SET's expected value
    std::int64_t number = 0;               ///< ADD's delta, BARRIER's world size
    std::uint32_t nonce = 0;               ///< VALIDATE's magic, PING's nonce
    std::vector<std::string_view> keys;    ///< CHECK, WAIT, MULTI_GET, MULTI_SET
    std::vector<std::string_view> values;  ///< MULTI_SET (same length as keys)
};

/// The state of a parse.
enum class parse_status : std::uint8_t {
    need_more,  ///< incomplete: read at least up to `size` bytes in total, then parse again
    complete,   ///< a whole request of `size` bytes is at the front of the buffer
    malformed,  ///< unknown opcode or a limit exceeded: `reason` says which; close the peer
};

/// The result of `parse_request`.
struct parse_result {
    parse_status status = parse_status::need_more;
    std::size_t size = 0;  ///< complete: bytes consumed; need_more: lower bound of the total
    std::string reason;    ///< malformed: what and why, for the log
};

namespace detail {

// A cursor over the input that records how far it got and why it stopped.
class request_reader {
public:
    request_reader(std::string_view in, const limits& lim) noexcept : in_(in), lim_(lim) {}

    // Each returns false when it cannot complete; status() then says need_more or malformed.
    bool fixed(std::size_t n, const char*& at) noexcept {
        if (in_.size() - pos_ < n) return need(pos_ + n);
        at = in_.data() + pos_;
        pos_ += n;
        return true;
    }
    bool u32(std::uint32_t& v) noexcept {
        const char* p = nullptr;
        if (!fixed(4, p)) return false;
        v = get_le<std::uint32_t>(p);
        return true;
    }
    bool i64(std::int64_t& v) noexcept {
        const char* p = nullptr;
        if (!fixed(8, p)) return false;
        v = static_cast<std::int64_t>(get_le<std::uint64_t>(p));
        return true;
    }
    bool count(std::size_t& n) {
        const char* p = nullptr;
        if (!fixed(8, p)) return false;
        const auto v = get_le<std::uint64_t>(p);
        if (v > lim_.max_keys_per_request)
            return fail(fmt::format("{} keys in one request exceed the limit of {} "
                                    "(wire::limits::max_keys_per_request)",
                                    v, lim_.max_keys_per_request));
        n = static_cast<std::size_t>(v);
        return true;
    }
    bool str(std::string_view& s, bool is_key) {
        const char* p = nullptr;
        if (!fixed(8, p)) return false;
        const auto len = get_le<std::uint64_t>(p);
        const auto max = is_key ? lim_.max_key_size : lim_.max_value_size;
        if (len > max)
            return fail(fmt::format("a {} of {} bytes exceeds the limit of {} (wire::limits::{})",
                                    is_key ? "key" : "value", len, max, is_key ? "max_key_size" : "max_value_size"));
        const auto n = static_cast<std::size_t>(len);
        if (pos_ + n > lim_.max_request_size)
            return fail(fmt::format("a request of at least {} bytes exceeds the limit of {} "
                                    "(wire::limits::max_request_size)",
                                    pos_ + n, lim_.max_request_size));
        if (in_.size() - pos_ < n) return need(pos_ + n);
        s = in_.substr(pos_, n);
        pos_ += n;
        return true;
    }
    bool fail(std::string reason) {
        status_ = parse_status::malformed;
        reason_ = std::move(reason);
        return false;
    }

    parse_result result(bool ok) && {
        if (ok) return {parse_status::complete, pos_, {}};
        return {status_, status_ == parse_status::need_more ? needed_ : 0, std::move(reason_)};
    }

private:
    bool need(std::size_t total) noexcept {
        status_ = parse_status::need_more;
        needed_ = total;
        return false;
    }

    std::string_view in_;
    const limits& lim_;
    std::size_t pos_ = 0;
    std::size_t needed_ = 0;
    parse_status status_ = parse_status::need_more;
    std::string reason_;
};

}  // namespace detail

/// Parses the request at the front of `in` (the connection's unconsumed bytes) in dialect `d`.
/// Incremental: call again with more bytes after `need_more`; nothing is consumed until
/// `complete`. Never reads past `in`, never allocates beyond the reused vectors of `out` (and
/// the reason string when malformed), whatever the input.
ELASTIC_DECL parse_result parse_request(dialect d, std::string_view in, request& out, const limits& lim = {});

/// Appends the bytes of `req` in dialect `d` (for clients and tests). Throws std::invalid_argument
/// when `d` has no opcode for the operation.
ELASTIC_DECL void encode_request(dialect d, const request& req, std::string& out);

}  // namespace elastic::inline v0::wire

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::wire {

ELASTIC_DECL parse_result parse_request(dialect d, std::string_view in, request& out, const limits& lim) {
    detail::request_reader r{in, lim};
    const char* p = nullptr;
    if (!r.fixed(1, p)) return std::move(r).result(false);
    const auto byte = static_cast<std::uint8_t>(*p);
    const auto o = to_op(d, byte);
    if (!o) {
        r.fail(fmt::format("unknown opcode 0x{:02x} in the {} dialect", byte,
                           d == dialect::legacy ? "legacy (1.13)" : "current (VALIDATE)"));
        return std::move(r).result(false);
    }
    out.operation = *o;
    out.key = out.value = out.expected = {};  // no view may survive from an earlier request
    out.number = 0;
    out.nonce = 0;
    out.keys.clear();
    out.values.clear();
    bool ok = true;
    switch (*o) {
        case op::validate:
        case op::ping: ok = r.u32(out.nonce); break;
        case op::set:
        case op::append:
        case op::queue_push: ok = r.str(out.key, true) && r.str(out.value, false); break;
        case op::compare_set: ok = r.str(out.key, true) && r.str(out.expected, false) && r.str(out.value, false); break;
        case op::get:
        case op::watch_key:
        case op::delete_key:
        case op::queue_pop:
        case op::queue_len: ok = r.str(out.key, true); break;
        case op::add:
        case op::barrier: ok = r.str(out.key, true) && r.i64(out.number); break;
        case op::check:
        case op::wait:
        case op::multi_get:
        case op::multi_set: {
            std::size_t n = 0;
            ok = r.count(n);
            const bool pairs = *o == op::multi_set;
            for (std::size_t i = 0; ok && i < n; ++i) {
                std::string_view k;
                ok = r.str(k, true);
                if (ok) out.keys.push_back(k);
                if (ok && pairs) {
                    std::string_view v;
                    ok = r.str(v, false);
                    if (ok) out.values.push_back(v);
                }
            }
            break;
        }
        case op::num_keys:
        case op::cancel_wait:
        case op::list_keys: break;
    }
    return std::move(r).result(ok);
}

ELASTIC_DECL void encode_request(dialect d, const request& req, std::string& out) {
    const auto byte = to_byte(d, req.operation);
    if (!byte)
        throw std::invalid_argument(fmt::format("{} does not exist in the {} dialect", name(req.operation),
                                                d == dialect::legacy ? "legacy" : "current"));
    put_u8(out, *byte);
    switch (req.operation) {
        case op::validate:
        case op::ping: put_u32(out, req.nonce); break;
        case op::set:
        case op::append:
        case op::queue_push:
            put_bytes(out, req.key);
            put_bytes(out, req.value);
            break;
        case op::compare_set:
            put_bytes(out, req.key);
            put_bytes(out, req.expected);
            put_bytes(out, req.value);
            break;
        case op::get:
        case op::watch_key:
        case op::delete_key:
        case op::queue_pop:
        case op::queue_len: put_bytes(out, req.key); break;
        case op::add:
        case op::barrier:
            put_bytes(out, req.key);
            put_i64(out, req.number);
            break;
        case op::check:
        case op::wait:
        case op::multi_get:
            put_u64(out, req.keys.size());
            for (auto k : req.keys) put_bytes(out, k);
            break;
        case op::multi_set:
            if (req.keys.size() != req.values.size())
                throw std::invalid_argument(
                    fmt::format("MULTI_SET needs as many values as keys, got {} keys and {} values", req.keys.size(),
                                req.values.size()));
            put_u64(out, req.keys.size());
            for (std::size_t i = 0; i < req.keys.size(); ++i) {
                put_bytes(out, req.keys[i]);
                put_bytes(out, req.values[i]);
            }
            break;
        case op::num_keys:
        case op::cancel_wait:
        case op::list_keys: break;
    }
}

}  // namespace elastic::inline v0::wire

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/store/wire.hpp ----

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/error.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <unistd.h>

namespace elastic::inline v0 {

/// What `tcp_store_client::connection_lost()` reports: the connection that held leases ended,
/// and with it the leases (the server records them lost).
struct store_connection_loss {
    std::string reason;               ///< why: the store's silence, its EOF or reset, close()
    std::vector<std::string> leases;  ///< the keys that were held, as given to hold_lease
};

namespace detail::store {

// A request whose reply proves the server is there: PING (u32 nonce echoed) in the current
// dialect, an empty CHECK (READY) in the legacy one, which has no PING.
ELASTIC_DECL std::uint32_t heartbeat_nonce();

ELASTIC_DECL void encode_heartbeat(wire::dialect dialect, std::string& out);

ELASTIC_DECL std::size_t heartbeat_reply_size(wire::dialect dialect);

ELASTIC_DECL bool heartbeat_reply_ok(wire::dialect dialect, const char* p);

// The lease keys a client holds on its connection, and the loss of that connection: reported
// once, to whoever awaits (or next awaits) next_loss(). Use it on the client's thread.
template <class Defer = void>
class basic_store_client_leases {
public:
    explicit basic_store_client_leases(const asio::any_io_executor& executor) : lost_(executor) {}

    [[nodiscard]] const std::vector<std::string>& keys() const noexcept { return keys_; }
    [[nodiscard]] bool empty() const noexcept { return keys_.empty(); }

    void add(std::string key) {
        if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) keys_.push_back(std::move(key));
    }
    void remove(const std::string& key) { std::erase(keys_, key); }
    void clear() noexcept { keys_.clear(); }

    // The held connection ended: the leases are gone with it.
    void lose(std::string_view reason) noexcept {
        if (keys_.empty()) return;
        try {
            loss_ = store_connection_loss{std::string(reason), std::move(keys_)};
        } catch (...) {
            loss_.reset();
        }
        keys_.clear();
        lost_.notify();
    }

    // The next loss (at once for one latched before the call). `alive` is the client's: once it
    // is false, `this` is gone and nothing of it is touched.
    asio::awaitable<store_connection_loss> next_loss(std::shared_ptr<bool> alive) {
        while (!loss_) {
            co_await lost_.wait();
            if (!*alive) throw std::system_error(asio::error::operation_aborted, "store client destroyed");
            const auto cs = co_await asio::this_coro::cancellation_state;
            if (!loss_ && cs.cancelled() != asio::cancellation_type::none)
                throw std::system_error(asio::error::operation_aborted, "connection_lost() cancelled");
        }
        auto loss = std::move(*loss_);
        loss_.reset();
        co_return loss;
    }

private:
    std::vector<std::string> keys_;
    std::optional<store_connection_loss> loss_;
    async_signal lost_;
};
using store_client_leases = basic_store_client_leases<>;

}  // namespace detail::store

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::store {

ELASTIC_DECL std::uint32_t heartbeat_nonce() { return static_cast<std::uint32_t>(::getpid()); }

ELASTIC_DECL void encode_heartbeat(wire::dialect dialect, std::string& out) {
    if (dialect == wire::dialect::current) {
        wire::put_u8(out, *wire::to_byte(wire::dialect::current, wire::op::ping));
        wire::put_u32(out, heartbeat_nonce());
    } else {
        wire::put_u8(out, *wire::to_byte(wire::dialect::legacy, wire::op::check));
        wire::put_u64(out, 0);
    }
}

ELASTIC_DECL std::size_t heartbeat_reply_size(wire::dialect dialect) {
    return dialect == wire::dialect::current ? 4 : 1;
}

ELASTIC_DECL bool heartbeat_reply_ok(wire::dialect dialect, const char* p) {
    if (dialect == wire::dialect::current) return wire::get_le<std::uint32_t>(p) == heartbeat_nonce();
    return static_cast<std::uint8_t>(*p) == static_cast<std::uint8_t>(wire::check_response::ready);
}

}  // namespace detail::store
}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/store/client_leases.hpp ----
// ---- begin elastic/store/concepts.hpp ----
// The store concepts: what every store model provides (store) and the batch operations some add
// (multi_key_store).


#include <asio/awaitable.hpp>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

namespace elastic::inline v0 {

/*
 * store: a key-value store shared by the agents and workers of a job, with PyTorch's
 * c10d::Store semantics. Keys and values are bytes held in std::string (any byte, NUL included).
 * Every operation is a coroutine on Asio, awaited as a plain verb (`co_await s.get(key)`).
 * Arguments are taken by value, so the coroutine frame owns them.
 *
 * A model provides:
 *   set(key, value)                 -> awaitable<void>         overwrite, wake waiters of key
 *   get(key)                        -> awaitable<std::string>  wait for key (default timeout), read
 *   add(key, delta)                 -> awaitable<int64_t>      decimal counter, returns new value
 *   compare_set(key, expected, desired) -> awaitable<std::string>
 *        absent & expected empty: create; absent & expected non-empty: return expected;
 *        equal: replace; different: return current. Success <=> result == desired.
 *   wait(keys)  / wait(keys, timeout) -> awaitable<void>       until all exist; store_timeout
 *   check(keys)                     -> awaitable<bool>         all exist now
 *   delete_key(key)                 -> awaitable<bool>         whether it existed
 *   num_keys()                      -> awaitable<int64_t>
 *   timeout() / set_timeout(ms)                                the default for get and wait
 * It promises: a wait is answered the moment its keys exist (push, never polling); a timeout
 * leaves no registration behind; ADD stores decimal ASCII and rejects a non-numeric value with
 * store_error.
 */
template <class S>
concept store = requires(S& s, const S& cs, std::string key, std::string value, std::vector<std::string> keys,
                         std::int64_t delta, std::chrono::milliseconds timeout) {
    { s.set(key, value) } -> std::same_as<asio::awaitable<void>>;
    { s.get(key) } -> std::same_as<asio::awaitable<std::string>>;
    { s.add(key, delta) } -> std::same_as<asio::awaitable<std::int64_t>>;
    { s.compare_set(key, value, value) } -> std::same_as<asio::awaitable<std::string>>;
    { s.wait(keys) } -> std::same_as<asio::awaitable<void>>;
    { s.wait(keys, timeout) } -> std::same_as<asio::awaitable<void>>;
    { s.check(keys) } -> std::same_as<asio::awaitable<bool>>;
    { s.delete_key(key) } -> std::same_as<asio::awaitable<bool>>;
    { s.num_keys() } -> std::same_as<asio::awaitable<std::int64_t>>;
    { cs.timeout() } -> std::convertible_to<std::chrono::milliseconds>;
    s.set_timeout(timeout);
};

/*
 * multi_key_store: a store with PyTorch >= 2.0's batch operations.
 *   multi_get(keys)           -> awaitable<std::vector<std::string>>  waits for all, then reads
 *   multi_set(keys, values)   -> awaitable<void>   each like set; store_error on size mismatch
 *   append(key, value)        -> awaitable<void>   concatenate or create; wakes waiters
 */
// clang-format off
template <class S>
concept multi_key_store =
    store<S> && requires(S& s, std::string key, std::string value, std::vector<std::string> keys,
                         std::vector<std::string> values) {
        { s.multi_get(keys) } -> std::same_as<asio::awaitable<std::vector<std::string>>>;
        { s.multi_set(keys, values) } -> std::same_as<asio::awaitable<void>>;
        { s.append(key, value) } -> std::same_as<asio::awaitable<void>>;
    // clang-format on
};

}  // namespace elastic::inline v0
// ---- end elastic/store/concepts.hpp ----
// ---- begin elastic/store/lease.hpp ----
// Leases in the TCP store: the reserved key namespace `<group>/__lease__/<name>`, the keys an
// observer reads (`__epoch`, `__silent`, `__lost/<n>`) and the parser the server and the client share.


#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

// A lease is a key bound to the connection that set it: when that connection closes, or stays
// silent longer than the server's heartbeat deadline, the server deletes the key and records the
// loss in keys next to it, so observers are woken by push (docs/store.md, "Leases"):
//
//   <group>/__lease__/<name>       the lease itself; its value is whatever the holder set
//   <group>/__lease__/__epoch      decimal count of losses in the group ("0" once a lease exists)
//   <group>/__lease__/__silent     decimal count of those losses that were silent ("0" likewise)
//   <group>/__lease__/__lost/<n>   the name of the n-th lost lease (n = 1, 2, ...)
//
// An observer that has read epoch e waits for `__lost/<e+1>`: one WAIT, answered by the loss.
// Names starting with "__" are the server's; clients may read them but never write them.
namespace elastic::inline v0 {

/// The segment that marks a lease key: at the start of a wire key or right after a '/'.
inline constexpr std::string_view lease_marker = "__lease__/";

namespace detail::store {

ELASTIC_DECL std::string lease_space(std::string_view group);

}  // namespace detail::store

/// The key of lease `name` in `group` ("" for none): `<group>/__lease__/<name>`. `name` must
/// not be empty nor start with "__" (hold_lease and the server refuse such names).
ELASTIC_DECL std::string lease_key(std::string_view group, std::string_view name);

/// The loss counter of `group`: `<group>/__lease__/__epoch` (decimal, "0" when the first lease
/// of the group is bound, +1 per lost lease).
ELASTIC_DECL std::string lease_epoch_key(std::string_view group);

/// The silent-loss counter of `group`: `<group>/__lease__/__silent` (decimal, "0" when the
/// first lease of the group is bound, +1 per lease lost without word from its holder's side: its
/// heartbeat deadline passed, its bytes stopped mid-request or mid-reply, or its connection ended
/// while the server itself had not run for a while, so the holder may have given up on the
/// server's silence). A holder that was killed closes its connection at once; one cut off by the
/// network, stopped, or on a machine that died goes silent: the counter tells the two apart.
ELASTIC_DECL std::string lease_silent_key(std::string_view group);

/// The key that names the `epoch`-th lost lease of `group`: `<group>/__lease__/__lost/<epoch>`.
/// Waiting for `lease_lost_key(group, e + 1)` after reading epoch e wakes at the next loss.
ELASTIC_DECL std::string lease_lost_key(std::string_view group, std::int64_t epoch);

/// A wire key split at its lease marker.
struct lease_key_parts {
    std::string_view space;  ///< everything up to and including "__lease__/"
    std::string_view name;   ///< what follows (may be empty: a malformed lease key)
    /// The name is the server's (starts with "__": `__epoch`, `__silent`, `__lost/<n>`).
    [[nodiscard]] bool reserved() const noexcept { return name.substr(0, 2) == "__"; }
};

/// Splits `key` at its first lease marker (one at the start or right after a '/'), or nothing
/// when `key` is an ordinary key.
ELASTIC_DECL std::optional<lease_key_parts> parse_lease_key(std::string_view key) noexcept;

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::store {

ELASTIC_DECL std::string lease_space(std::string_view group) {
    std::string out(group);
    if (!out.empty() && out.back() != '/') out.push_back('/');
    out.append(lease_marker);
    return out;
}

}  // namespace detail::store
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL std::string lease_key(std::string_view group, std::string_view name) {
    return detail::store::lease_space(group).append(name);
}

ELASTIC_DECL std::string lease_epoch_key(std::string_view group) {
    return detail::store::lease_space(group).append("__epoch");
}

ELASTIC_DECL std::string lease_silent_key(std::string_view group) {
    return detail::store::lease_space(group).append("__silent");
}

ELASTIC_DECL std::string lease_lost_key(std::string_view group, std::int64_t epoch) {
    return detail::store::lease_space(group).append("__lost/").append(std::to_string(epoch));
}

ELASTIC_DECL std::optional<lease_key_parts> parse_lease_key(std::string_view key) noexcept {
    for (std::size_t pos = key.find(lease_marker); pos != std::string_view::npos;
         pos = key.find(lease_marker, pos + 1)) {
        if (pos == 0 || key[pos - 1] == '/') {
            const auto end = pos + lease_marker.size();
            return lease_key_parts{key.substr(0, end), key.substr(end)};
        }
    }
    return std::nullopt;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/store/lease.hpp ----

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <unistd.h>

namespace elastic::inline v0 {

/// One failed connection attempt, reported to `store_client_options::on_retry` before the
/// client sleeps `delay` and tries again.
struct store_connect_attempt {
    int attempt = 0;                  ///< 1 for the first attempt
    std::error_code error;            ///< why it failed (refused, reset, timed out, ...)
    std::chrono::milliseconds delay;  ///< the backoff before the next attempt
};

/// How a tcp_store_client reaches its server and how long it waits.
struct store_client_options {
    std::string host = "127.0.0.1";  ///< IPv4/IPv6 literal or a host name
    std::uint16_t port = 29500;      ///< PyTorch's default MASTER_PORT
    client_dialect dialect = client_dialect::detect;
    /// Prepended to every key, as PyTorch's TCPStore client does ("/"): a key "k" set by a
    /// Python or libtorch TCPStore is the key "k" here too. Empty gives raw wire keys.
    std::string key_prefix = "/";
    /// Default for `get` and `wait`, and the deadline of every other operation's reply
    /// (PyTorch's default store timeout, 300 s).
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};
    /// How long connection attempts go on (refused, reset, unreachable) before store_error.
    std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
    /// `detect`: how long to wait for the PING echo before calling the server legacy.
    std::chrono::milliseconds detect_timeout{std::chrono::seconds(1)};
    /// Exponential backoff between connection attempts: initial, doubled up to max, each
    /// multiplied by a random factor in [0.5, 1] so many clients do not retry in lockstep.
    std::chrono::milliseconds initial_backoff{10};
    std::chrono::milliseconds max_backoff{std::chrono::seconds(1)};
    /// Called after each failed connection attempt that will be retried (logging, tests).
    std::function<void(const store_connect_attempt&)> on_retry;
    /// Leases (hold_lease, docs/store-client.md "Leases"): while the client holds one it sends a
    /// heartbeat every `lease_heartbeat_interval` when the connection is idle (PING in the
    /// current dialect, an empty CHECK in the legacy one). A heartbeat unanswered for
    /// `lease_missed_heartbeats` intervals, or a closed connection, ends the connection and its
    /// leases: connection_lost() reports it. Use the server's values
    /// (store_server_options::lease_heartbeat_interval, lease_missed_heartbeats).
    std::chrono::milliseconds lease_heartbeat_interval{std::chrono::seconds(1)};
    unsigned lease_missed_heartbeats = 5;
    /// The store's secret (store_server_options::secret; docs/store.md, "Authentication"): each
    /// connection, reconnections included, runs the handshake first, within connect_timeout.
    /// A server that does not prove it knows the same secret, or refuses this client's proof,
    /// is a store_auth_error (not retried). Empty: no authentication (PyTorch's servers).
    std::optional<std::string> secret;
};

/// A client of a c10d TCPStore server: ours, PyTorch 1.13's, or a current PyTorch's. One TCP
/// connection, one request at a time (concurrent calls on one client queue up in order; a long
/// `wait` holds the connection, so give concurrent waiters their own clients). Connects on
/// first use and again after a failure. Use it on one thread (the executor's).
///
/// Errors: store_error naming host:port for a vanished, refusing or misbehaving server;
/// store_timeout when a wait (or the wait inside get) or a reply misses its deadline.
template <class Defer = void>
class basic_tcp_store_client {
public:
    basic_tcp_store_client(const asio::any_io_executor& executor, store_client_options options)
        : executor_(executor),
          options_(std::move(options)),
          rng_(std::random_device{}()),
          lock_(executor),
          leases_(executor),
          heartbeat_timer_(executor) {
        if (options_.dialect != client_dialect::detect)
            dialect_ = options_.dialect == client_dialect::current ? wire::dialect::current : wire::dialect::legacy;
        if (options_.secret && options_.secret->empty())
            throw store_error("store_client_options::secret is empty: give the store's secret, "
                              "or no secret (std::nullopt) for a store without authentication");
        if (options_.lease_heartbeat_interval.count() <= 0 || options_.lease_missed_heartbeats == 0)
            throw store_error(fmt::format("store_client_options: lease_heartbeat_interval {} ms and "
                                          "lease_missed_heartbeats {} must both be positive",
                                          options_.lease_heartbeat_interval.count(), options_.lease_missed_heartbeats));
    }

    basic_tcp_store_client(const basic_tcp_store_client&) = delete;
    basic_tcp_store_client& operator=(const basic_tcp_store_client&) = delete;

    // The heartbeat coroutine may still be suspended: it sees *alive_ false and leaves.
    ~basic_tcp_store_client() {
        *alive_ = false;
        leases_.clear();
        drop();
    }

    /// Connects now (otherwise the first operation does). Throws store_error naming the address
    /// when no attempt succeeds within `connect_timeout`.
    asio::awaitable<void> connect() {
        auto lock = co_await acquire();
        co_await ensure_connected();
    }

    /// Closes the connection; the next operation reconnects. Leases held end with it
    /// (connection_lost() reports "close() was called").
    void close() noexcept { drop("close() was called"); }

    /// The dialect in use: chosen by options, or known after `detect` has connected.
    [[nodiscard]] std::optional<wire::dialect> dialect() const noexcept { return dialect_; }

    /// "host:port" of the server, as error messages name it.
    [[nodiscard]] std::string address() const {
        if (options_.host.find(':') != std::string::npos) return fmt::format("[{}]:{}", options_.host, options_.port);
        return fmt::format("{}:{}", options_.host, options_.port);
    }

    [[nodiscard]] const store_client_options& options() const noexcept { return options_; }

    /// The default timeout of get and wait.
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return options_.timeout; }
    void set_timeout(std::chrono::milliseconds t) noexcept { options_.timeout = t; }

    /// Writes `value` at `key` (no reply in the protocol: an error shows on a later operation).
    asio::awaitable<void> set(std::string key, std::string value) {
        auto lock = co_await acquire();
        co_await ensure_connected();
        const auto k = wire_key(key);
        begin(wire::op::set);
        req_.key = k;
        req_.value = value;
        co_await send(std::string_view("SET"), k);
        track_lease(std::move(key), k);
    }

    /// Waits for `key` (as PyTorch's clients do: a 1.13 server drops a connection that GETs a
    /// missing key), then reads it. store_timeout after `timeout()`.
    asio::awaitable<std::string> get(std::string key) {
        auto lock = co_await acquire();
        const auto k = wire_key(key);
        std::vector<std::string> keys(1, k);  // not `{k}`: g++ 12 rejects it in co_await
        co_await wait_locked(std::move(keys), options_.timeout, std::string_view("get"));
        begin(wire::op::get);
        req_.key = k;
        co_await send(std::string_view("GET"), k);
        co_return co_await read_bytes(std::string_view("GET"), k);
    }

    /// Adds `delta` to the decimal counter at `key` (created at 0) and returns the new value.
    asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta) {
        auto lock = co_await acquire();
        co_await ensure_connected();
        const auto k = wire_key(key);
        begin(wire::op::add);
        req_.key = k;
        req_.number = delta;
        co_await send(std::string_view("ADD"), k);
        co_return co_await read_i64(std::string_view("ADD"), k);
    }

    /// PyTorch's compare_set: returns `desired` on success, otherwise the current value (or
    /// `expected` when the key is absent and `expected` is not empty).
    asio::awaitable<std::string> compare_set(std::string key, std::string expected, std::string desired) {
        auto lock = co_await acquire();
        co_await ensure_connected();
        const auto k = wire_key(key);
        begin(wire::op::compare_set);
        req_.key = k;
        req_.expected = expected;
        req_.value = desired;
        co_await send(std::string_view("COMPARE_SET"), k);
        auto now = co_await read_bytes(std::string_view("COMPARE_SET"), k);
        if (now == desired) track_lease(std::move(key), k);
        co_return now;
    }

    /// Waits until every key exists; store_timeout after `timeout()`.
    asio::awaitable<void> wait(std::vector<std::string> keys) { co_await wait(std::move(keys), options_.timeout); }

    /// Waits until every key exists; store_timeout after `timeout`. The connection stays
    /// usable: the current dialect cancels the wait (CANCEL_WAIT), the legacy one reconnects
    /// (PyTorch 1.13 has no CANCEL_WAIT and would answer the stale wait later).
    asio::awaitable<void> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
        auto lock = co_await acquire();
        for (auto& k : keys) k = wire_key(k);
        co_await wait_locked(std::move(keys), timeout, std::string_view("wait"));
    }

    /// Whether every key exists now.
    asio::awaitable<bool> check(std::vector<std::string> keys) {
        auto lock = co_await acquire();
        co_await ensure_connected();
        for (auto& k : keys) k = wire_key(k);
        begin(wire::op::check);
        for (const auto& k : keys) req_.keys.emplace_back(k);
        co_await send(std::string_view("CHECK"), first_of(keys));
        const auto byte = co_await read_u8(std::string_view("CHECK"), first_of(keys));
        co_return byte == static_cast<std::uint8_t>(wire::check_response::ready);
    }

    /// Deletes `key`; whether it existed.
    asio::awaitable<bool> delete_key(std::string key) {
        auto lock = co_await acquire();
        co_await ensure_connected();
        const auto k = wire_key(key);
        begin(wire::op::delete_key);
        req_.key = k;
        leases_.remove(key);
        co_await send(std::string_view("DELETE_KEY"), k);
        co_return co_await read_i64(std::string_view("DELETE_KEY"), k) > 0;
    }

    /// The number of keys on the server (all of them, whatever their prefix).
    asio::awaitable<std::int64_t> num_keys() {
        auto lock = co_await acquire();
        co_await ensure_connected();
        begin(wire::op::num_keys);
        co_await send(std::string_view("GETNUMKEYS"), {});
        co_return co_await read_i64(std::string_view("GETNUMKEYS"), {});
    }

    /// Waits for every key, then reads them in order. The legacy dialect pipelines one GET per
    /// key (PyTorch 1.13 has no MULTI_GET).
    asio::awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys) {
        auto lock = co_await acquire();
        for (auto& k : keys) k = wire_key(k);
        co_await wait_locked(keys, options_.timeout, std::string_view("multi_get"));
        std::vector<std::string> out;
        if (keys.empty()) co_return out;
        if (*dialect_ == wire::dialect::current) {
            begin(wire::op::multi_get);
            for (const auto& k : keys) req_.keys.emplace_back(k);
            co_await send(std::string_view("MULTI_GET"), keys.front());
        } else {
            arm();
            wbuf_.clear();
            for (const auto& k : keys) {
                req_.operation = wire::op::get;
                req_.key = k;
                wire::encode_request(*dialect_, req_, wbuf_);
            }
            co_await flush(std::string_view("GET"), keys.front());
        }
        out.reserve(keys.size());
        for (const auto& k : keys) out.push_back(co_await read_bytes(std::string_view("MULTI_GET"), k));
        co_return out;
    }

    /// Writes every pair (store_error when the sizes differ). The legacy dialect pipelines one
    /// SET per pair.
    asio::awaitable<void> multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
        if (keys.size() != values.size())
            throw store_error(fmt::format("multi_set needs as many values as keys, got {} keys "
                                          "and {} values",
                                          keys.size(), values.size()));
        auto lock = co_await acquire();
        co_await ensure_connected();
        if (keys.empty()) co_return;
        for (auto& k : keys) k = wire_key(k);
        if (*dialect_ == wire::dialect::current) {
            begin(wire::op::multi_set);
            for (std::size_t i = 0; i < keys.size(); ++i) {
                req_.keys.emplace_back(keys[i]);
                req_.values.emplace_back(values[i]);
            }
            co_await send(std::string_view("MULTI_SET"), keys.front());
        } else {
            arm();
            wbuf_.clear();
            for (std::size_t i = 0; i < keys.size(); ++i) {
                req_.operation = wire::op::set;
                req_.key = keys[i];
                req_.value = values[i];
                wire::encode_request(*dialect_, req_, wbuf_);
            }
            co_await flush(std::string_view("SET"), keys.front());
        }
        for (std::size_t i = 0; i < keys.size(); ++i) track_lease(keys[i].substr(options_.key_prefix.size()), keys[i]);
    }

    /// Appends `value` to `key` (creates it). PyTorch 1.13 servers lack APPEND and close the
    /// connection: a store_error here (the legacy dialect follows APPEND with an empty CHECK,
    /// whose reply proves the server took it, since APPEND itself has no reply).
    asio::awaitable<void> append(std::string key, std::string value) {
        auto lock = co_await acquire();
        co_await ensure_connected();
        const auto k = wire_key(key);
        begin(wire::op::append);
        req_.key = k;
        req_.value = value;
        wbuf_.clear();
        wire::encode_request(*dialect_, req_, wbuf_);
        if (*dialect_ == wire::dialect::current) {
            co_await flush(std::string_view("APPEND"), k);
            co_return;
        }
        req_.operation = wire::op::check;
        wire::encode_request(*dialect_, req_, wbuf_);
        co_await flush(std::string_view("APPEND"), k);
        (void)co_await read_u8(std::string_view("APPEND"), k);
    }

    // ---- leases ----------------------------------------------------------------------------

    /// Sets `key` to `value` as a lease bound to this client's connection, and returns once the
    /// server has it (a heartbeat's reply follows the SET). `key` is in the client's key space,
    /// like set's, and must be a lease key: `lease_key(group, name)`, i.e. `<group>/__lease__/
    /// <name>`, name neither empty nor starting with "__" (store_error otherwise). Our server
    /// deletes the key and records the loss (`lease_epoch_key`, `lease_lost_key`) when the
    /// connection closes or stays silent; a PyTorch server stores it as an ordinary key.
    /// Heartbeats start with the first lease. The lease does not survive the connection: after
    /// connection_lost(), hold it again (the next operation reconnects).
    asio::awaitable<void> hold_lease(std::string key, std::string value) {
        const auto k = wire_key(key);
        const auto parts = parse_lease_key(k);
        if (!parts || parts->name.empty() || parts->reserved())
            throw store_error(fmt::format("hold_lease('{}'): not a lease key; use lease_key(group, name): "
                                          "<group>/{}<name>, with a name neither empty nor starting with '__'",
                                          key, lease_marker));
        auto lock = co_await acquire();
        co_await ensure_connected();
        begin(wire::op::set);
        req_.key = k;
        req_.value = value;
        wbuf_.clear();
        wire::encode_request(*dialect_, req_, wbuf_);
        detail::store::encode_heartbeat(*dialect_, wbuf_);
        co_await flush(std::string_view("SET"), k);
        co_await read_heartbeat(std::string_view("SET"), k);
        leases_.add(std::move(key));
        start_heartbeat();
    }

    /// Ends the lease at `key` without a loss (DELETE_KEY, as `delete_key` of a lease key
    /// does); whether the key existed.
    asio::awaitable<bool> release_lease(std::string key) { co_return co_await delete_key(std::move(key)); }

    /// The lease keys this client holds now.
    [[nodiscard]] const std::vector<std::string>& leases() const noexcept { return leases_.keys(); }

    /// Completes when the connection that held this client's leases ends: a heartbeat left
    /// unanswered for lease_missed_heartbeats x lease_heartbeat_interval (a hung, stopped or
    /// unreachable server), an EOF or reset (a server that died: seen by the next heartbeat,
    /// within one interval), a failed operation, or close(). A loss that happened before the
    /// call is reported at once; each loss is reported once. Cancel it as any awaitable.
    asio::awaitable<store_connection_loss> connection_lost() { return leases_.next_loss(alive_); }

private:
    using clock = std::chrono::steady_clock;

    std::chrono::milliseconds heartbeat_deadline() const {
        return options_.lease_heartbeat_interval * options_.lease_missed_heartbeats;
    }

    asio::awaitable<void> read_heartbeat(std::string_view what, std::string_view key) {
        const auto n = detail::store::heartbeat_reply_size(*dialect_);
        if (const auto ec = co_await fill(n)) fail(what, key, ec);
        if (!detail::store::heartbeat_reply_ok(*dialect_, rbuf_.data() + rbeg_))
            throw_protocol(what, key, "a wrong heartbeat reply");
        rbeg_ += n;
    }

    // set, multi_set and a winning compare_set of a lease key bind it on our server, as
    // hold_lease does: keep it alive the same way, so code written against the `store` concept
    // holds leases correctly through this client.
    void track_lease(std::string key, std::string_view wire) {
        const auto parts = parse_lease_key(wire);
        if (!parts || parts->name.empty() || parts->reserved()) return;
        leases_.add(std::move(key));
        start_heartbeat();
    }

    void start_heartbeat() {
        if (heartbeat_running_) return;
        heartbeat_running_ = true;
        asio::co_spawn(executor_, heartbeat(alive_), detail::detached<Defer>);
    }

    // Every interval while leases are held: one heartbeat when the connection is idle. A busy
    // connection is skipped: the operation on it is traffic the server hears (a long WAIT is
    // not: docs/store-client.md). `this` is touched only after checking *alive: the client may
    // be destroyed while this coroutine is suspended.
    asio::awaitable<void> heartbeat(std::shared_ptr<bool> alive) {
        for (;;) {
            heartbeat_timer_.expires_after(options_.lease_heartbeat_interval);
            co_await heartbeat_timer_.async_wait(detail::as_tuple_awaitable<Defer>);
            if (!*alive) co_return;
            if (leases_.empty()) {
                heartbeat_running_ = false;
                co_return;
            }
            if (!conn_ || !lock_.try_lock()) continue;
            co_await beat(alive);
            if (!*alive) co_return;
            release();
        }
    }

    // One heartbeat on the held connection, read into the frame (not rbuf_), so a destroyed
    // client is never touched after a suspension.
    asio::awaitable<void> beat(std::shared_ptr<bool> alive) {
        const auto conn = conn_;
        if (rbeg_ != rend_) {
            drop(fmt::format("the store at {} sent {} bytes nobody asked for", address(), rend_ - rbeg_));
            co_return;
        }
        std::string out;
        detail::store::encode_heartbeat(*dialect_, out);
        arm_deadline(clock::now() + heartbeat_deadline());
        auto [ec, n] = co_await asio::async_write(conn->socket, asio::buffer(out), detail::as_tuple_awaitable<Defer>);
        (void)n;
        if (!*alive) co_return;
        std::array<char, 4> reply{};
        if (!ec) {
            const auto [rec, got] = co_await asio::async_read(
                conn->socket, asio::buffer(reply.data(), detail::store::heartbeat_reply_size(*dialect_)),
                detail::as_tuple_awaitable<Defer>);
            (void)got;
            if (!*alive) co_return;
            ec = rec;
        }
        if (conn != conn_) co_return;  // closed meanwhile (close()): already reported
        if (!ec && detail::store::heartbeat_reply_ok(*dialect_, reply.data())) {
            disarm();
            co_return;
        }
        if (conn->expired) drop(silent_server_message());
        else if (ec)
            drop(fmt::format("the store at {} closed the connection ({}): the server stopped "
                             "or died, or it ended this connection (see its log)",
                             address(), ec.message()));
        else
            drop(fmt::format("the store at {} answered a heartbeat with a wrong reply: not our "
                             "server, or a desynchronised stream",
                             address()));
    }

    std::string silent_server_message() const {
        return fmt::format("the store at {} did not answer a heartbeat within {} ms ({} missed "
                           "heartbeats of {} ms): the server is hung, stopped or unreachable "
                           "(store_client_options::lease_heartbeat_interval, "
                           "lease_missed_heartbeats)",
                           address(), heartbeat_deadline().count(), options_.lease_missed_heartbeats,
                           options_.lease_heartbeat_interval.count());
    }

    // ---- one request at a time ---------------------------------------------------------------
    // Every operation holds lock_ for its whole length; the guard's release also ends the
    // operation's deadline.
    class lock_guard {
    public:
        explicit lock_guard(basic_tcp_store_client* c) noexcept : client_(c) {}
        lock_guard(lock_guard&& o) noexcept : client_(std::exchange(o.client_, nullptr)) {}
        lock_guard& operator=(lock_guard&&) = delete;
        ~lock_guard() {
            if (client_) client_->release();
        }

    private:
        basic_tcp_store_client* client_;
    };

    asio::awaitable<lock_guard> acquire() {
        co_await lock_.lock("store operation cancelled while queued");
        co_return lock_guard(this);
    }

    void release() noexcept {
        disarm();
        lock_.unlock();
    }

    // ---- connection --------------------------------------------------------------------------
    std::string wire_key(std::string_view key) const {
        std::string k;
        k.reserve(options_.key_prefix.size() + key.size());
        k.append(options_.key_prefix).append(key);
        return k;
    }

    static std::string_view first_of(const std::vector<std::string>& keys) {
        return keys.empty() ? std::string_view{} : std::string_view(keys.front());
    }

    void drop(std::string_view reason = "the connection was closed") noexcept {
        if (!conn_) return;
        leases_.lose(reason);  // reported once, to whoever awaits (or next awaits) connection_lost()
        conn_->close();
        conn_.reset();
        rbeg_ = rend_ = 0;
    }

    void arm_deadline(clock::time_point deadline, bool may_extend = true) { conn_->arm_deadline(deadline, may_extend); }

    // Every request, even one without a reply, is bounded by `timeout` (its write too).
    void arm() { arm_deadline(clock::now() + options_.timeout); }

    void disarm() noexcept {
        if (conn_) conn_->disarm();
    }

    void begin(wire::op o) {
        req_.operation = o;
        req_.keys.clear();
        req_.values.clear();
        req_.key = {};
        req_.value = {};
        req_.expected = {};
        req_.number = 0;
        arm();
    }

    asio::awaitable<void> ensure_connected() {
        if (conn_ && conn_->socket.is_open()) co_return;
        co_await open();
    }

    // Resolves (once per open) and connects, retrying with backoff until connect_timeout; then
    // the handshake of the dialect, detecting it if asked.
    asio::awaitable<void> open() {
        drop();
        const auto deadline = clock::now() + options_.connect_timeout;
        std::error_code last;
        std::vector<asio::ip::tcp::endpoint> endpoints;
        for (int attempt = 1;; ++attempt) {
            last = co_await connect_once(endpoints, deadline);
            if (!last) {
                if (dialect_ == wire::dialect::legacy) co_return;
                last = co_await handshake(deadline);
                if (!last) {
                    dialect_ = wire::dialect::current;
                    co_return;
                }
                drop();
                if (!dialect_) {
                    // detect: a 1.13 server resets on VALIDATE (read as a SET with a huge
                    // key) or waits for more bytes; either way it is legacy.
                    dialect_ = wire::dialect::legacy;
                    last = co_await connect_once(endpoints, deadline);
                    if (!last) co_return;
                    drop();
                }
            }
            const auto delay = detail::store::connect_backoff(attempt, options_.initial_backoff, options_.max_backoff,
                                                              rng_);
            if (clock::now() + delay >= deadline) {
                throw store_error(fmt::format(
                    "cannot connect to the store at {} after {} attempt{} in {} ms: {}{}; is the "
                    "server (the agent, or rank 0) running and is MASTER_ADDR/MASTER_PORT right? "
                    "(store_client_options::connect_timeout)",
                    address(), attempt, attempt == 1 ? "" : "s", options_.connect_timeout.count(), last.message(),
                    options_.dialect == client_dialect::current
                        ? " (current dialect forced: a PyTorch <= 2.1 server resets the "
                          "VALIDATE handshake; use client_dialect::detect or legacy)"
                        : ""));
            }
            if (options_.on_retry) options_.on_retry({attempt, last, delay});
            asio::steady_timer t(executor_);
            t.expires_after(delay);
            co_await t.async_wait(detail::as_tuple_awaitable<Defer>);
        }
    }

    asio::awaitable<std::error_code> connect_once(std::vector<asio::ip::tcp::endpoint>& endpoints,
                                                  clock::time_point deadline) {
        if (endpoints.empty()) {
            std::error_code ec;
            const auto address = asio::ip::make_address(options_.host, ec);
            if (!ec) {
                endpoints.emplace_back(address, options_.port);
            } else {
                asio::ip::tcp::resolver resolver(executor_);
                const auto [rec, results] = co_await resolver.async_resolve(options_.host,
                                                                            std::to_string(options_.port),
                                                                            detail::as_tuple_awaitable<Defer>);
                if (rec) co_return rec;
                for (const auto& r : results) endpoints.push_back(r.endpoint());
            }
        }
        conn_ = std::make_shared<detail::store::store_client_connection>(executor_);
        rbeg_ = rend_ = 0;
        arm_deadline(deadline);
        const auto [ec, ep] = co_await asio::async_connect(conn_->socket, endpoints, detail::as_tuple_awaitable<Defer>);
        (void)ep;
        const bool expired = conn_->expired;
        disarm();
        if (ec) {
            drop();
            co_return expired ? make_error_code(asio::error::timed_out) : ec;
        }
        std::error_code local_error;
        std::error_code remote_error;
        const auto local = conn_->socket.local_endpoint(local_error);
        const auto remote = conn_->socket.remote_endpoint(remote_error);
        if (!local_error && !remote_error && local == remote) {
            // Connected to itself: the kernel drew the server's port as this socket's own
            // (TCP's simultaneous open, possible when that port is in the ephemeral range and
            // nothing listens there). No server answered.
            drop();
            co_return make_error_code(asio::error::connection_refused);
        }
        std::error_code ignored;
        conn_->socket.set_option(asio::ip::tcp::no_delay(true), ignored);
        if (options_.secret) co_return co_await authenticate(deadline);
        co_return std::error_code{};
    }

    // The authentication handshake (store/auth.hpp), before any request of either dialect. A
    // refusal throws store_auth_error; a timeout is returned, to be retried like a connection.
    asio::awaitable<std::error_code> authenticate(clock::time_point deadline) {
        store_auth::client_handshake hs(*options_.secret);
        wbuf_.clear();
        hs.start(wbuf_);
        arm_deadline(deadline);
        for (;;) {
            if (!wbuf_.empty()) {
                const auto [wec, n] = co_await asio::async_write(conn_->socket, asio::buffer(wbuf_),
                                                                 detail::as_tuple_awaitable<Defer>);
                (void)n;
                wbuf_.clear();
                if (wec) co_return auth_io_failed(hs, wec);
            }
            if (hs.done()) break;
            const auto s = hs.feed(std::string_view(rbuf_.data() + rbeg_, rend_ - rbeg_), wbuf_);
            if (s.status == store_auth::status::refused) {
                disarm();
                drop();
                throw store_auth_error(
                    fmt::format("the store at {} failed the authentication handshake: {}; give every agent "
                                "and the store the same secret (store_client_options::secret, "
                                "store_server_options::secret)",
                                address(), s.reason));
            }
            if (s.status == store_auth::status::need_more) {
                if (const auto ec = co_await fill(s.size)) co_return auth_io_failed(hs, ec);
                continue;
            }
            rbeg_ += s.size;
        }
        disarm();
        co_return std::error_code{};
    }

    // The connection failed during the handshake. A close is the server's answer (it refused
    // the secret, or it has none and refused the handshake as an unknown request): thrown.
    // Anything else (a timeout) is returned, to be retried until connect_timeout.
    std::error_code auth_io_failed(const store_auth::client_handshake& hs, std::error_code ec) {
        const bool expired = conn_->expired;
        disarm();
        drop();
        if (expired) return make_error_code(asio::error::timed_out);
        if (ec != asio::error::eof && ec != asio::error::connection_reset && ec != asio::error::broken_pipe) return ec;
        if (hs.proof_sent())
            throw store_auth_error(
                fmt::format("the store at {} refused this client's secret (it closed the connection after "
                            "the proof: {}); give the client the store's secret "
                            "(store_client_options::secret = store_server_options::secret)",
                            address(), ec.message()));
        throw store_auth_error(
            fmt::format("the store at {} closed the connection during the authentication handshake ({}): it "
                        "has no secret (store_server_options::secret), or it is not an elastic store; give "
                        "the server the same secret, or the client none",
                        address(), ec.message()));
    }

    // VALIDATE then PING (nonce = pid), as current PyTorch clients do; the echo proves the
    // dialect. A reset, an EOF or no echo within the limit is returned as an error.
    asio::awaitable<std::error_code> handshake(clock::time_point deadline) {
        const auto limit = dialect_ ? deadline : std::min(deadline, clock::now() + options_.detect_timeout);
        const auto nonce = static_cast<std::uint32_t>(::getpid());
        wbuf_.clear();
        wire::put_u8(wbuf_, *wire::to_byte(wire::dialect::current, wire::op::validate));
        wire::put_u32(wbuf_, wire::validate_magic);
        wire::put_u8(wbuf_, *wire::to_byte(wire::dialect::current, wire::op::ping));
        wire::put_u32(wbuf_, nonce);
        arm_deadline(limit);
        const auto [wec, n] = co_await asio::async_write(conn_->socket, asio::buffer(wbuf_),
                                                         detail::as_tuple_awaitable<Defer>);
        (void)n;
        std::error_code ec = wec;
        if (!ec) ec = co_await fill(4);
        if (ec) {
            const bool expired = conn_->expired;
            disarm();
            co_return expired ? make_error_code(asio::error::timed_out) : ec;
        }
        disarm();
        const auto echo = wire::get_le<std::uint32_t>(rbuf_.data() + rbeg_);
        rbeg_ += 4;
        if (echo != nonce)
            throw store_error(fmt::format("the store at {} answered PING {} with {}: not a "
                                          "TCPStore server, or a desynchronised stream",
                                          address(), nonce, echo));
        co_return std::error_code{};
    }

    // ---- I/O ---------------------------------------------------------------------------------
    [[noreturn]] void fail(std::string_view what, std::string_view key, std::error_code ec) {
        const bool timed_out = conn_ && conn_->expired;
        const auto about = key.empty() ? std::string(what) : fmt::format("{} '{}'", what, key);
        if (timed_out) {
            auto message = fmt::format("the store at {} did not answer {} within {} ms; the server is stuck or "
                                       "overloaded (store_client_options::timeout)",
                                       address(), about, options_.timeout.count());
            drop(message);
            throw store_timeout(message);
        }
        std::string message;
        if (ec == asio::error::eof || ec == asio::error::connection_reset || ec == asio::error::broken_pipe)
            message = fmt::format("the store at {} closed the connection during {} ({}): the server stopped, or "
                                  "rejected the request (ADD on a non-numeric value, a write to a lease key it "
                                  "refuses, or an operation a PyTorch 1.13 server lacks: APPEND, MULTI_*)",
                                  address(), about, ec.message());
        else message = fmt::format("the store at {}: {} failed: {}", address(), about, ec.message());
        drop(message);
        throw store_error(message);
    }

    asio::awaitable<void> send(std::string_view what, std::string_view key) {
        wbuf_.clear();
        wire::encode_request(*dialect_, req_, wbuf_);
        co_await flush(what, key);
    }

    asio::awaitable<void> flush(std::string_view what, std::string_view key) {
        if (conn_->expired) fail(what, key, asio::error::timed_out);
        const auto [ec, n] = co_await asio::async_write(conn_->socket, asio::buffer(wbuf_),
                                                        detail::as_tuple_awaitable<Defer>);
        (void)n;
        if (ec) fail(what, key, ec);
    }

    // Makes n bytes available at rbuf_[rbeg_, ...). An error code, not an exception, so WAIT
    // can tell its timeout from a failure.
    asio::awaitable<std::error_code> fill(std::size_t n) {
        while (rend_ - rbeg_ < n) {
            if (rbeg_ > 0 && rbeg_ == rend_) rbeg_ = rend_ = 0;
            if (rbuf_.size() - rbeg_ < n) {
                if (rbeg_ > 0) {
                    std::memmove(rbuf_.data(), rbuf_.data() + rbeg_, rend_ - rbeg_);
                    rend_ -= rbeg_;
                    rbeg_ = 0;
                }
                if (rbuf_.size() < n) rbuf_.resize(std::max(n, rbuf_.size() * 2));
            }
            if (rbuf_.size() - rend_ < 4096 && rbuf_.size() < 64 * 1024) rbuf_.resize(64 * 1024);
            if (conn_->expired) co_return make_error_code(asio::error::timed_out);
            const auto [ec, got] = co_await conn_->socket.async_read_some(asio::buffer(rbuf_.data() + rend_,
                                                                                       rbuf_.size() - rend_),
                                                                          detail::as_tuple_awaitable<Defer>);
            rend_ += got;
            if (ec && rend_ - rbeg_ < n) co_return ec;
        }
        co_return std::error_code{};
    }

    asio::awaitable<std::uint64_t> read_u64(std::string_view what, std::string_view key) {
        if (const auto ec = co_await fill(8)) fail(what, key, ec);
        const auto v = wire::get_le<std::uint64_t>(rbuf_.data() + rbeg_);
        rbeg_ += 8;
        co_return v;
    }

    asio::awaitable<std::int64_t> read_i64(std::string_view what, std::string_view key) {
        co_return static_cast<std::int64_t>(co_await read_u64(what, key));
    }

    asio::awaitable<std::uint8_t> read_u8(std::string_view what, std::string_view key) {
        if (const auto ec = co_await fill(1)) fail(what, key, ec);
        const auto v = static_cast<std::uint8_t>(rbuf_[rbeg_]);
        ++rbeg_;
        co_return v;
    }

    asio::awaitable<std::string> read_bytes(std::string_view what, std::string_view key) {
        const auto len = co_await read_u64(what, key);
        if (len > max_reply_value) throw_protocol(what, key, fmt::format("a value of {} bytes", len));
        const auto n = static_cast<std::size_t>(len);
        if (const auto ec = co_await fill(n)) fail(what, key, ec);
        std::string v(rbuf_.data() + rbeg_, n);
        rbeg_ += n;
        co_return v;
    }

    [[noreturn]] void throw_protocol(std::string_view what, std::string_view key, std::string_view got) {
        auto message = fmt::format("the store at {} answered {} '{}' with {}: not a TCPStore "
                                   "server of the expected dialect, or a desynchronised stream",
                                   address(), what, key, got);
        drop(message);
        throw store_error(message);
    }

    // WAIT with its own deadline. On timeout the current dialect sends CANCEL_WAIT and reads
    // WAIT_CANCELED (after a STOP_WAITING that raced it, if any: the keys were written before the
    // cancel arrived, so the server's 0x00 comes first); the legacy dialect drops the connection,
    // which is the only way to clear a wait on a 1.13 server.
    //
    // While the client holds leases, a long WAIT must not silence the connection: every
    // heartbeat interval it also sends an empty CHECK. Its reply (READY, 0x00) is the same byte
    // as STOP_WAITING, and the server answers in order, so the wait is over when the zeros read
    // number the CHECKs sent plus one. CHECK number i (from 1) is surely unanswered while fewer
    // than i zeros have come; one that stays so past the heartbeat deadline means a silent
    // server, as for an idle heartbeat.
    asio::awaitable<void> wait_locked(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                                      std::string_view what) {
        co_await ensure_connected();
        req_.operation = wire::op::wait;
        req_.keys.clear();
        for (const auto& k : keys) req_.keys.emplace_back(k);
        wbuf_.clear();
        wire::encode_request(*dialect_, req_, wbuf_);
        const auto wait_deadline = clock::now() + timeout;
        const auto interval = options_.lease_heartbeat_interval;
        std::vector<clock::time_point> checks_sent;  // send times of the CHECKs
        std::size_t zeros = 0;                       // STOP_WAITING and READY bytes read
        auto next_beat = clock::now() + interval;
        const auto stop = static_cast<std::uint8_t>(wire::wait_response::stop_waiting);
        const auto next_deadline = [&] {
            auto d = wait_deadline;
            if (!leases_.empty()) d = std::min(d, next_beat);
            if (checks_sent.size() > zeros) d = std::min(d, checks_sent[zeros] + heartbeat_deadline());
            return d;
        };
        // A heartbeat's send time is a schedule, not a deadline to forgive: after a stall it
        // is sent at once, never a span later.
        const auto arm_next = [&] {
            const auto d = next_deadline();
            arm_deadline(d, leases_.empty() || d != next_beat);
        };
        arm_next();
        co_await flush(std::string_view("WAIT"), first_of(keys));
        for (;;) {
            const auto ec = co_await fill(1);
            if (!ec) {
                const auto byte = static_cast<std::uint8_t>(rbuf_[rbeg_++]);
                if (byte != stop) throw_protocol("WAIT", first_of(keys), fmt::format("byte {}", byte));
                if (++zeros == checks_sent.size() + 1) {
                    disarm();
                    co_return;
                }
                continue;
            }
            if (!conn_->expired) fail("WAIT", first_of(keys), ec);
            const auto now = clock::now();
            if (now >= wait_deadline) break;
            if (checks_sent.size() > zeros && now >= checks_sent[zeros] + heartbeat_deadline()) {
                auto message = silent_server_message();
                drop(message);
                throw store_error(fmt::format("{} of {}: {}", what, describe_keys(keys), message));
            }
            if (!leases_.empty() && now >= next_beat) {
                wbuf_.clear();
                wire::put_u8(wbuf_, *wire::to_byte(*dialect_, wire::op::check));
                wire::put_u64(wbuf_, 0);
                checks_sent.push_back(now);
                next_beat = now + interval;
                arm_next();
                co_await flush(std::string_view("CHECK (heartbeat)"), first_of(keys));
                continue;
            }
            arm_next();
        }
        const auto message = fmt::format(
            "{} on the store at {}: {} not set within {} ms (a rank or agent that should set "
            "{} has not; store_client_options::timeout or the wait's timeout)",
            what, address(), describe_keys(keys), timeout.count(), keys.size() == 1 ? "it" : "them");
        if (*dialect_ == wire::dialect::legacy) {
            drop(message);
            throw store_timeout(message);
        }
        // The deadline cancelled only our read: the WAIT is still registered on the server.
        // Before WAIT_CANCELED come the replies still owed: the CHECKs' and maybe a
        // STOP_WAITING that raced the cancel.
        req_.operation = wire::op::cancel_wait;
        wbuf_.clear();
        wire::encode_request(*dialect_, req_, wbuf_);
        arm();
        co_await flush(std::string_view("CANCEL_WAIT"), first_of(keys));
        auto byte = co_await read_u8(std::string_view("CANCEL_WAIT"), first_of(keys));
        while (byte == stop && zeros < checks_sent.size() + 1) {
            ++zeros;
            arm();
            byte = co_await read_u8(std::string_view("CANCEL_WAIT"), first_of(keys));
        }
        if (byte != static_cast<std::uint8_t>(wire::wait_response::wait_canceled))
            throw_protocol("CANCEL_WAIT", first_of(keys), fmt::format("byte {}", byte));
        throw store_timeout(message);
    }

    static std::string describe_keys(const std::vector<std::string>& keys) {
        std::string out = keys.size() == 1 ? "key " : "keys ";
        for (std::size_t i = 0; i < keys.size() && i < 8; ++i) {
            if (i) out += ", ";
            out += fmt::format("'{}'", keys[i]);
        }
        if (keys.size() > 8) out += fmt::format(" and {} more", keys.size() - 8);
        return out;
    }

    static constexpr std::uint64_t max_reply_value = std::uint64_t{1} << 34;  // 16 GiB: sanity

    asio::any_io_executor executor_;
    store_client_options options_;
    std::optional<wire::dialect> dialect_;
    std::shared_ptr<detail::store::store_client_connection> conn_;
    std::minstd_rand rng_;
    wire::request req_;
    std::string wbuf_;
    std::vector<char> rbuf_;
    std::size_t rbeg_ = 0;
    std::size_t rend_ = 0;
    detail::async_mutex lock_;  // one request at a time (acquire())
    // Leases: the keys held on conn_ and the latched loss for connection_lost(); the heartbeat.
    detail::store::store_client_leases leases_;
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
    asio::steady_timer heartbeat_timer_;
    bool heartbeat_running_ = false;
};
using tcp_store_client = basic_tcp_store_client<>;

static_assert(store<tcp_store_client>);
static_assert(multi_key_store<tcp_store_client>);

}  // namespace elastic::inline v0
// ---- end elastic/store/client.hpp ----

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// The TCP store client for synchronous code: the same operations, options, errors and
/// timeouts as tcp_store_client, each call returning when its operation is done. It owns its
/// io_context, so nothing runs between calls (no thread, no CPU). Not thread-safe: one
/// object per thread, or a mutex around it.
template <class Defer = void>
class basic_blocking_store_client {
public:
    explicit basic_blocking_store_client(store_client_options options)
        : client_(ctx_.get_executor(), std::move(options)) {}

    basic_blocking_store_client(const basic_blocking_store_client&) = delete;
    basic_blocking_store_client& operator=(const basic_blocking_store_client&) = delete;

    /// Connects now (otherwise the first operation does).
    void connect() { run(client_.connect()); }
    void close() noexcept { client_.close(); }

    void set(std::string key, std::string value) { run(client_.set(std::move(key), std::move(value))); }
    std::string get(std::string key) { return run(client_.get(std::move(key))); }
    std::int64_t add(std::string key, std::int64_t delta) { return run(client_.add(std::move(key), delta)); }
    std::string compare_set(std::string key, std::string expected, std::string desired) {
        return run(client_.compare_set(std::move(key), std::move(expected), std::move(desired)));
    }
    void wait(std::vector<std::string> keys) { run(client_.wait(std::move(keys))); }
    void wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
        run(client_.wait(std::move(keys), timeout));
    }
    bool check(std::vector<std::string> keys) { return run(client_.check(std::move(keys))); }
    bool delete_key(std::string key) { return run(client_.delete_key(std::move(key))); }
    std::int64_t num_keys() { return run(client_.num_keys()); }
    std::vector<std::string> multi_get(std::vector<std::string> keys) {
        return run(client_.multi_get(std::move(keys)));
    }
    void multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
        run(client_.multi_set(std::move(keys), std::move(values)));
    }
    void append(std::string key, std::string value) { run(client_.append(std::move(key), std::move(value))); }

    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return client_.timeout(); }
    void set_timeout(std::chrono::milliseconds t) noexcept { client_.set_timeout(t); }
    [[nodiscard]] std::optional<wire::dialect> dialect() const noexcept { return client_.dialect(); }
    [[nodiscard]] std::string address() const { return client_.address(); }

    /// The asynchronous client underneath (to co_spawn on `context()` yourself).
    tcp_store_client& async_client() noexcept { return client_; }
    asio::io_context& context() noexcept { return ctx_; }

private:
    template <class T>
    T run(asio::awaitable<T> op) {
        std::exception_ptr error;
        std::optional<T> result;
        asio::co_spawn(ctx_, std::move(op), [&](std::exception_ptr e, T v) {
            error = e;
            if (!e) result.emplace(std::move(v));
        });
        drive();
        if (error) std::rethrow_exception(error);
        return std::move(*result);
    }

    void run(asio::awaitable<void> op) {
        std::exception_ptr error;
        asio::co_spawn(ctx_, std::move(op), [&](std::exception_ptr e) { error = e; });
        drive();
        if (error) std::rethrow_exception(error);
    }

    void drive() {
        ctx_.restart();
        ctx_.run();
    }

    // Declared first: destroyed last, after the client that uses its executor.
    asio::io_context ctx_{1};
    tcp_store_client client_;
};
using blocking_store_client = basic_blocking_store_client<>;

}  // namespace elastic::inline v0
// ---- end elastic/store/blocking_client.hpp ----
// ---- begin elastic/store/engine.hpp ----
// The store's semantics in one place: the key table, waiters woken by push, and watchers. The
// in-memory store and the TCP server are both front-ends to this engine.


#include <fmt/format.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ranges>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace elastic::inline v0::detail::store {

// Heterogeneous lookup: find a std::string key with a std::string_view, no temporary string.
struct store_string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

/// Someone waiting for keys to exist. The engine calls `on_ready` exactly once, when the last
/// awaited key has been written, after it has forgotten the waiter; `on_ready` may destroy the
/// waiter but must not call back into the engine or destroy other waiters: it only schedules
/// (posts a wake-up, queues a reply). A waiter that is destroyed while registered must first be
/// `cancel`ed.
class store_waiter {
public:
    store_waiter() = default;
    store_waiter(const store_waiter&) = delete;
    store_waiter& operator=(const store_waiter&) = delete;

    /// Whether the waiter is registered (some awaited key is still missing).
    bool registered() const noexcept { return pending_ != 0; }

protected:
    ~store_waiter() = default;

private:
    friend class store_engine;
    virtual void on_ready() = 0;

    std::size_t pending_ = 0;        // registrations not yet consumed by a write
    std::vector<std::string> keys_;  // where it is registered, for cancel
};

/// What happened to a watched key (PyTorch 1.13's WATCH_KEY notifications).
enum class store_change : std::uint8_t { updated = 0, created = 1, deleted = 2, appended = 4 };

/// Someone told of every change to a key (legacy WATCH_KEY). Same rules as `store_waiter`:
/// `on_change` only schedules; a watcher is `unwatch`ed before it is destroyed.
class store_watcher {
public:
    store_watcher() = default;
    store_watcher(const store_watcher&) = delete;
    store_watcher& operator=(const store_watcher&) = delete;

protected:
    ~store_watcher() = default;

private:
    friend class store_engine;
    virtual void on_change(store_change change, std::string_view key, std::string_view old_value,
                           std::string_view new_value) = 0;
};

/// The key table with PyTorch's semantics (the libuv server's, where it improved on the legacy
/// one). Keys and values are bytes held in std::string. Not thread-safe: use it from one thread
/// (the io_context's). Every write that creates a key wakes the waiters of that key by a direct
/// call: no timer, no polling.
class store_engine {
public:
    store_engine() = default;
    store_engine(const store_engine&) = delete;
    store_engine& operator=(const store_engine&) = delete;

    /// The value of `key`, or null when absent. Valid until the next write.
    ELASTIC_DECL const std::string* find(std::string_view key) const;

    /// Sets `key` to `value` (overwrites) and wakes its waiters.
    ELASTIC_DECL void set(std::string_view key, std::string_view value);
    /// Sets `key`, taking the value's storage.
    ELASTIC_DECL void set(std::string_view key, std::string&& value);

    /// Appends to `key`'s value, creating it when absent; wakes its waiters.
    ELASTIC_DECL void append(std::string_view key, std::string_view value);

    /// Adds `delta` to the decimal integer at `key` (absent counts as 0), stores the result as
    /// decimal ASCII like PyTorch (`std::to_string`), wakes waiters and returns it. Throws
    /// store_error, leaving the value as it was, when the value is not a decimal int64 or the sum
    /// overflows.
    ELASTIC_DECL std::int64_t add(std::string_view key, std::int64_t delta);

    /// PyTorch's compare-and-set: absent and `expected` empty -> create with `desired`; absent
    /// and `expected` non-empty -> write nothing, return `expected`; present and equal to
    /// `expected` -> replace with `desired`; present and different -> return the current value.
    /// Returns the value now stored (or `expected` in the second case); the view is valid until
    /// the next write or as long as the arguments. Creating a key wakes its waiters (the libuv
    /// server does; 1.13 did not).
    ELASTIC_DECL std::string_view compare_set(std::string_view key, std::string_view expected,
                                              std::string_view desired);

    /// Removes `key`; true when it existed. Waiters are untouched (they wait for missing keys).
    ELASTIC_DECL bool erase(std::string_view key);

    /// Whether every key exists.
    template <std::ranges::input_range R>
    bool check(const R& keys) const {
        for (const auto& k : keys)
            if (!table_.contains(std::string_view(k))) return false;
        return true;
    }

    /// The number of keys.
    std::size_t size() const noexcept { return table_.size(); }

    /// Bytes the engine holds for keys, values and awaited keys, counted as their lengths plus
    /// a fixed overhead per entry (the hash node and the string headers). Not the allocator's
    /// exact figure, but it grows and shrinks with every entry, which is what a memory limit
    /// needs (store_server_options::max_memory).
    std::size_t bytes() const noexcept { return table_bytes_ + waiter_bytes_ + watcher_bytes_; }

    /// Bytes that writing `value_size` bytes under `key` would add (0 when it would not grow).
    ELASTIC_DECL std::size_t growth(std::string_view key, std::size_t value_size) const;

    /// What one entry of `key_size` and `value_size` bytes is counted as.
    static constexpr std::size_t entry_bytes(std::size_t key_size, std::size_t value_size) {
        return key_size + value_size + entry_overhead;
    }
    /// What one awaited key is counted as (the engine keeps it twice: in its index and in the
    /// waiter's own list, for cancel).
    static constexpr std::size_t awaited_bytes(std::size_t key_size) { return 2 * key_size + entry_overhead; }

    /// Calls `f(key, value)` for every entry.
    template <class F>
    void for_each(F&& f) const {
        for (const auto& [k, v] : table_) f(std::string_view(k), std::string_view(v));
    }

    /// Registers `w` for the missing ones among `keys`. Returns true (registering nothing) when
    /// all exist already; otherwise `w.on_ready()` runs when the last one is written. `w` must
    /// not be registered already.
    template <std::ranges::input_range R>
    bool wait(store_waiter& w, const R& keys) {
        for (const auto& k : keys) {
            const std::string_view key(k);
            if (table_.contains(key)) continue;
            auto it = waiters_.find(key);
            if (it == waiters_.end()) it = waiters_.emplace(std::string(key), waiter_list{}).first;
            it->second.push_back(&w);
            w.keys_.emplace_back(key);
            ++w.pending_;
            waiter_bytes_ += awaited_bytes(key.size());
        }
        return w.pending_ == 0;
    }

    /// Forgets `w` wherever it is registered (a timeout, CANCEL_WAIT, a closed connection).
    /// Harmless when it is not registered.
    ELASTIC_DECL void cancel(store_waiter& w) noexcept;

    /// The number of keys someone waits for (for tests and metrics).
    std::size_t awaited_keys() const noexcept { return waiters_.size(); }

    /// Tells `w` of every later change of `key` until `unwatch`. Watching a key twice is
    /// watching it once. Returns whether this registered anything new.
    ELASTIC_DECL bool watch(store_watcher& w, std::string_view key);

    /// What watching `key` may add (for a memory limit checked before the call).
    static constexpr std::size_t watch_bytes(std::size_t key_size) {
        return entry_bytes(key_size, 0) + sizeof(store_watcher*);
    }

    /// Stops every watch of `w`.
    ELASTIC_DECL void unwatch(store_watcher& w) noexcept;

    /// A key shown in a message: printable ASCII as is, other bytes as \xNN, long keys cut.
    static ELASTIC_DECL std::string printable(std::string_view key);

private:
    using waiter_list = std::vector<store_waiter*>;
    using watcher_list = std::vector<store_watcher*>;

    static ELASTIC_DECL std::int64_t parse_int(std::string_view key, const std::string& v);

    // Applies `mutate(value, created)` to the entry of `key` (creating it), then tells watchers
    // and wakes waiters. Waiters only exist for keys that were absent, so only a creation can
    // wake anyone; the list is moved out before the calls, so on_ready may free its waiter.
    template <class Mutate>
    void write(std::string_view key, Mutate&& mutate, store_change change) {
        auto it = table_.find(key);
        const bool created = it == table_.end();
        const auto watched = watchers_.find(key);
        std::string old;
        if (watched != watchers_.end() && !created) old = it->second;
        if (created) {
            it = table_.emplace(std::string(key), std::string{}).first;
            table_bytes_ += entry_bytes(key.size(), 0);
        }
        const std::size_t before = it->second.size();
        mutate(it->second, created);
        table_bytes_ += it->second.size();
        table_bytes_ -= before;
        if (watched != watchers_.end()) {
            const auto kind = created ? store_change::created : change;
            for (auto* w : watched->second) w->on_change(kind, key, old, it->second);
        }
        if (created) wake(key);
    }

    ELASTIC_DECL void wake(std::string_view key);

    std::unordered_map<std::string, std::string, store_string_hash, std::equal_to<>> table_;
    std::unordered_map<std::string, waiter_list, store_string_hash, std::equal_to<>> waiters_;
    std::unordered_map<std::string, watcher_list, store_string_hash, std::equal_to<>> watchers_;
    std::size_t table_bytes_ = 0;    // entry_bytes of every key and value
    std::size_t waiter_bytes_ = 0;   // awaited_bytes of every registration not yet consumed
    std::size_t watcher_bytes_ = 0;  // watched keys and their registrations

    static constexpr std::size_t entry_overhead = 64;
};

}  // namespace elastic::inline v0::detail::store

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::store {

ELASTIC_DECL const std::string* store_engine::find(std::string_view key) const {
    const auto it = table_.find(key);
    return it == table_.end() ? nullptr : &it->second;
}

ELASTIC_DECL void store_engine::set(std::string_view key, std::string_view value) {
    write(
        key, [&](std::string& v, bool) { v.assign(value); }, store_change::updated);
}

ELASTIC_DECL void store_engine::set(std::string_view key, std::string&& value) {
    write(
        key, [&](std::string& v, bool) { v = std::move(value); }, store_change::updated);
}

ELASTIC_DECL void store_engine::append(std::string_view key, std::string_view value) {
    write(
        key, [&](std::string& v, bool) { v.append(value); }, store_change::appended);
}

ELASTIC_DECL std::int64_t store_engine::add(std::string_view key, std::int64_t delta) {
    std::int64_t current = 0;
    if (const auto* v = find(key)) current = parse_int(key, *v);
    std::int64_t sum = 0;
    if (__builtin_add_overflow(current, delta, &sum))
        throw store_error(fmt::format("ADD {} to key '{}' holding {} overflows a 64-bit "
                                      "integer",
                                      delta, printable(key), current));
    char digits[24];
    const auto res = std::to_chars(digits, digits + sizeof digits, sum);
    const std::string_view text(digits, static_cast<std::size_t>(res.ptr - digits));
    write(
        key, [&](std::string& v, bool) { v.assign(text); }, store_change::updated);
    return sum;
}

ELASTIC_DECL std::string_view store_engine::compare_set(std::string_view key, std::string_view expected,
                                                        std::string_view desired) {
    const auto it = table_.find(key);
    if (it == table_.end()) {
        if (!expected.empty()) return expected;
    } else if (it->second != expected) {
        return it->second;
    }
    write(
        key, [&](std::string& v, bool) { v.assign(desired); }, store_change::updated);
    return *find(key);
}

ELASTIC_DECL bool store_engine::erase(std::string_view key) {
    const auto it = table_.find(key);
    if (it == table_.end()) return false;
    table_bytes_ -= entry_bytes(it->first.size(), it->second.size());
    if (const auto w = watchers_.find(key); w != watchers_.end()) {
        const std::string old = std::move(it->second);
        table_.erase(it);
        for (auto* watcher : w->second) watcher->on_change(store_change::deleted, key, old, {});
        return true;
    }
    table_.erase(it);
    return true;
}

ELASTIC_DECL std::size_t store_engine::growth(std::string_view key, std::size_t value_size) const {
    const auto* v = find(key);
    if (!v) return entry_bytes(key.size(), value_size);
    return value_size > v->size() ? value_size - v->size() : 0;
}

ELASTIC_DECL void store_engine::cancel(store_waiter& w) noexcept {
    for (const auto& k : w.keys_) {
        const auto it = waiters_.find(std::string_view(k));
        if (it == waiters_.end()) continue;
        auto& list = it->second;
        waiter_bytes_ -= std::erase(list, &w) * awaited_bytes(k.size());
        if (list.empty()) waiters_.erase(it);
    }
    w.keys_.clear();
    w.pending_ = 0;
}

ELASTIC_DECL bool store_engine::watch(store_watcher& w, std::string_view key) {
    auto it = watchers_.find(key);
    if (it == watchers_.end()) {
        it = watchers_.emplace(std::string(key), watcher_list{}).first;
        watcher_bytes_ += entry_bytes(key.size(), 0);
    } else if (std::ranges::find(it->second, &w) != it->second.end()) {
        return false;
    }
    it->second.push_back(&w);
    watcher_bytes_ += sizeof(store_watcher*);
    return true;
}

ELASTIC_DECL void store_engine::unwatch(store_watcher& w) noexcept {
    for (auto it = watchers_.begin(); it != watchers_.end();) {
        watcher_bytes_ -= std::erase(it->second, &w) * sizeof(store_watcher*);
        if (it->second.empty()) {
            watcher_bytes_ -= entry_bytes(it->first.size(), 0);
            it = watchers_.erase(it);
        } else {
            it = std::next(it);
        }
    }
}

ELASTIC_DECL std::string store_engine::printable(std::string_view key) {
    std::string out;
    for (const char c : key.substr(0, 200)) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u < 0x7f && u != '\\') out.push_back(c);
        else out += fmt::format("\\x{:02x}", u);
    }
    if (key.size() > 200) out += fmt::format("...({} bytes)", key.size());
    return out;
}

ELASTIC_DECL std::int64_t store_engine::parse_int(std::string_view key, const std::string& v) {
    std::int64_t n = 0;
    const auto* first = v.data();
    const auto* last = v.data() + v.size();
    const auto res = std::from_chars(first, last, n);
    if (v.empty() || res.ec != std::errc{} || res.ptr != last)
        throw store_error(fmt::format("ADD on key '{}' whose value '{}' is not a decimal "
                                      "64-bit integer; ADD needs a counter written by ADD",
                                      printable(key), printable(v)));
    return n;
}

ELASTIC_DECL void store_engine::wake(std::string_view key) {
    const auto it = waiters_.find(key);
    if (it == waiters_.end()) return;
    waiter_list list = std::move(it->second);
    waiters_.erase(it);
    waiter_bytes_ -= list.size() * awaited_bytes(key.size());
    for (auto* w : list) {
        // A waiter listed twice under this key (WAIT [k, k]) counts twice; it is ready at
        // its last registration, after which no list holds it any more.
        if (--w->pending_ == 0) {
            w->keys_.clear();
            w->on_ready();
        }
    }
}

}  // namespace elastic::inline v0::detail::store

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/store/engine.hpp ----
// ---- begin elastic/store/memory_store.hpp ----
// memory_store: the store concept over the shared engine, in process (unit tests, one-node jobs).


#include <asio/experimental/as_tuple.hpp>
#include <asio/awaitable.hpp>
#include <asio/error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// An in-memory store with exactly the TCP server's semantics (both front the same engine).
/// Use it from coroutines on one thread; it must outlive every operation awaited on it.
template <class Defer = void>
class basic_memory_store {
public:
    /// A store whose get/wait without a timeout wait up to `timeout` (PyTorch's default 300 s).
    explicit basic_memory_store(std::chrono::milliseconds timeout = std::chrono::seconds(300))
        : owned_(std::make_unique<detail::store::store_engine>()), engine_(owned_.get()), timeout_(timeout) {}

    /// A view of an existing engine, e.g. `tcp_store_server::engine()`: the agent that hosts the
    /// server uses the same keys and waiters in process, without a loopback connection. The
    /// engine must outlive the store; use both on the engine's thread.
    explicit basic_memory_store(detail::store::store_engine& engine,
                                std::chrono::milliseconds timeout = std::chrono::seconds(300))
        : engine_(&engine), timeout_(timeout) {}

    /// The default timeout of get, multi_get and wait(keys).
    std::chrono::milliseconds timeout() const noexcept { return timeout_; }
    /// Changes the default timeout.
    void set_timeout(std::chrono::milliseconds timeout) noexcept { timeout_ = timeout; }

    /// Overwrites `key` and wakes its waiters.
    asio::awaitable<void> set(std::string key, std::string value) {
        engine_->set(key, std::move(value));
        co_return;
    }

    /// Waits (up to timeout()) for `key`, then returns its value.
    asio::awaitable<std::string> get(std::string key) {
        // (g++ 12 miscompiles a braced temporary inside co_await: "array used as initializer")
        std::vector<std::string> keys;
        keys.push_back(key);
        co_await wait_for(std::move(keys), timeout_);
        const auto* v = engine_->find(key);
        // Deleted between the wake-up and now: PyTorch's libuv server answers empty.
        co_return v ? *v : std::string{};
    }

    /// Adds `delta` to the decimal counter at `key`; store_error when it holds something else.
    asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta) { co_return engine_->add(key, delta); }

    /// PyTorch's compare_set (see the `store` concept); creating a key wakes its waiters.
    asio::awaitable<std::string> compare_set(std::string key, std::string expected, std::string desired) {
        co_return std::string(engine_->compare_set(key, expected, desired));
    }

    /// Waits up to timeout() until every key exists.
    asio::awaitable<void> wait(std::vector<std::string> keys) { co_await wait_for(std::move(keys), timeout_); }

    /// Waits up to `timeout` until every key exists; store_timeout after that.
    asio::awaitable<void> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
        co_await wait_for(std::move(keys), timeout);
    }

    /// Whether every key exists now.
    asio::awaitable<bool> check(std::vector<std::string> keys) { co_return engine_->check(keys); }

    /// Removes `key`; true when it existed.
    asio::awaitable<bool> delete_key(std::string key) { co_return engine_->erase(key); }

    /// The number of keys.
    asio::awaitable<std::int64_t> num_keys() { co_return static_cast<std::int64_t>(engine_->size()); }

    /// Waits (up to timeout()) for every key, then returns their values in order.
    asio::awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys) {
        co_await wait_for(keys, timeout_);
        std::vector<std::string> values;
        values.reserve(keys.size());
        for (const auto& k : keys) {
            const auto* v = engine_->find(k);
            values.push_back(v ? *v : std::string{});
        }
        co_return values;
    }

    /// Sets each key to the value at the same position.
    asio::awaitable<void> multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
        if (keys.size() != values.size())
            throw store_error(fmt::format("multi_set needs as many values as keys: got {} keys "
                                          "and {} values",
                                          keys.size(), values.size()));
        for (std::size_t i = 0; i < keys.size(); ++i) engine_->set(keys[i], std::move(values[i]));
        co_return;
    }

    /// Appends to `key`'s value (creates it) and wakes its waiters.
    asio::awaitable<void> append(std::string key, std::string value) {
        engine_->append(key, value);
        co_return;
    }

    /// The engine (shared semantics; the server exposes the same).
    detail::store::store_engine& engine() noexcept { return *engine_; }

private:
    // One timer is both the deadline and the wake-up: on_ready cancels it. `done` is the truth,
    // so a deadline that expires in the same turn as the write still counts as success.
    struct timed_waiter final : detail::store::store_waiter {
        explicit timed_waiter(const asio::any_io_executor& ex) : timer(ex) {}
        void on_ready() override {
            done = true;
            timer.cancel();
        }
        asio::steady_timer timer;
        bool done = false;
    };

    asio::awaitable<void> wait_for(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
        timed_waiter w(co_await asio::this_coro::executor);
        if (engine_->wait(w, keys)) co_return;
        w.timer.expires_after(timeout);
        const auto [ec] = co_await w.timer.async_wait(detail::as_tuple_awaitable<Defer>);
        if (w.done) co_return;
        engine_->cancel(w);
        if (ec == asio::error::operation_aborted)  // our own caller cancelled us
            throw std::system_error(ec, "store wait cancelled");
        std::string names;
        for (const auto& k : keys)
            if (!engine_->find(k)) names += (names.empty() ? "" : ", ") + detail::store::store_engine::printable(k);
        throw store_timeout(fmt::format("wait timed out after {} ms; keys still missing: {}", timeout.count(), names));
    }

    std::unique_ptr<detail::store::store_engine> owned_;  // null when viewing another's engine
    detail::store::store_engine* engine_;
    std::chrono::milliseconds timeout_;
};
using memory_store = basic_memory_store<>;

static_assert(store<memory_store>);
static_assert(multi_key_store<memory_store>);

}  // namespace elastic::inline v0
// ---- end elastic/store/memory_store.hpp ----
// ---- begin elastic/store/prefix_store.hpp ----
// prefix_store: a view of another store whose keys all start with "<prefix>/" (PyTorch's
// PrefixStore).


#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// Every key goes to the inner store as `prefix + "/" + key`, as PyTorch's PrefixStore joins
/// them, so Python and native workers sharing a prefix see the same keys. Nested prefixes nest
/// ("b" over "a" gives "a/b/key"). `num_keys` counts the inner store's keys, as PyTorch does.
/// The inner store must outlive the prefix store.
template <store Inner>
class prefix_store {
public:
    /// A view of `inner` under `prefix`.
    prefix_store(std::string prefix, Inner& inner) : prefix_(std::move(prefix)), inner_(&inner) {}

    /// The prefix (without the joining '/').
    const std::string& prefix() const noexcept { return prefix_; }
    /// The store underneath.
    Inner& inner() const noexcept { return *inner_; }

    /// The inner store's key for `key`.
    std::string join(std::string_view key) const {
        std::string out;
        out.reserve(prefix_.size() + 1 + key.size());
        out.append(prefix_).push_back('/');
        out.append(key);
        return out;
    }

    std::chrono::milliseconds timeout() const { return inner_->timeout(); }
    void set_timeout(std::chrono::milliseconds t) { inner_->set_timeout(t); }

    asio::awaitable<void> set(std::string key, std::string value) { return inner_->set(join(key), std::move(value)); }
    asio::awaitable<std::string> get(std::string key) { return inner_->get(join(key)); }
    asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta) { return inner_->add(join(key), delta); }
    asio::awaitable<std::string> compare_set(std::string key, std::string expected, std::string desired) {
        return inner_->compare_set(join(key), std::move(expected), std::move(desired));
    }
    asio::awaitable<void> wait(std::vector<std::string> keys) { return inner_->wait(join_all(std::move(keys))); }
    asio::awaitable<void> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
        return inner_->wait(join_all(std::move(keys)), timeout);
    }
    asio::awaitable<bool> check(std::vector<std::string> keys) { return inner_->check(join_all(std::move(keys))); }
    asio::awaitable<bool> delete_key(std::string key) { return inner_->delete_key(join(key)); }
    asio::awaitable<std::int64_t> num_keys() { return inner_->num_keys(); }

    // clang-format off
    asio::awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys)
        requires multi_key_store<Inner>
    {
        return inner_->multi_get(join_all(std::move(keys)));
    }
    asio::awaitable<void> multi_set(std::vector<std::string> keys, std::vector<std::string> values)
        requires multi_key_store<Inner>
    {
        return inner_->multi_set(join_all(std::move(keys)), std::move(values));
    }
    asio::awaitable<void> append(std::string key, std::string value)
        requires multi_key_store<Inner>
    {
        return inner_->append(join(key), std::move(value));
    }
    // clang-format on

private:
    std::vector<std::string> join_all(std::vector<std::string> keys) const {
        for (auto& k : keys) k = join(k);
        return keys;
    }

    std::string prefix_;
    Inner* inner_;
};

}  // namespace elastic::inline v0
// ---- end elastic/store/prefix_store.hpp ----
// ---- begin elastic/store/server.hpp ----
// tcp_store_server: PyTorch's TCPStore server protocol, both dialects per connection, one
// coroutine per connection on one io_context, waits answered by push, leases bound to
// connections.

// ---- begin elastic/store/server_accept.hpp ----
// The accept loop of a tcp_store_server: who is let in (max_connections, accept_peer, out of
// descriptors), the connection shed for a newcomer, and the server's stop.

// ---- begin elastic/store/server_connection.hpp ----
// One connection of a tcp_store_server: reads its requests, runs them on the key table (the
// request dispatch), writes the replies in order; its memory, its deadlines, its leases.

// ---- begin elastic/store/server_core.hpp ----
// What a tcp_store_server is given (store_server_options) and the state it shares with its
// connections (detail::store::store_server_core).

// ---- begin elastic/store/server_leases.hpp ----
// The server's leases (docs/store.md, "Leases"): which connection holds each lease key, which
// writes to lease keys are refused, and how a lost lease is recorded in the key table.


#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace elastic::inline v0::detail::store {

class store_connection;

class store_lease_table {
public:
    // Why a write to a lease key is refused, or empty when it is allowed. `binds`: SET,
    // MULTI_SET and COMPARE_SET bind a lease; ADD and APPEND cannot (a lease's value is the
    // holder's, set whole); nobody writes the server's own names (__epoch, __silent, __lost/<n>).
    static ELASTIC_DECL std::string refusal(wire::op o, std::string_view key, bool binds);

    // The connection that holds the lease at `key`, or null.
    ELASTIC_DECL store_connection* holder(std::string_view key) const;

    // `key` now belongs to `c`; false when it was bound already.
    ELASTIC_DECL bool bind(std::string_view key, store_connection* c);

    // `key` is bound no more (released or lost); the connection that held it, or null.
    ELASTIC_DECL store_connection* unbind(std::string_view key) noexcept;

    // The number of leases held now, and lost since the start.
    std::size_t size() const noexcept { return holders_.size(); }
    std::uint64_t lost() const noexcept { return lost_; }

    // A lease ends without its holder: delete the key, count the loss in the group's epoch (and
    // a silent one in __silent) and name the lost lease under __lost/<epoch>, whose creation
    // wakes the observers by push. `records_kept`: store_server_options::lease_lost_records_kept;
    // `log` takes a line.
    template <class Log>
    void record_loss(store_engine& engine, std::int64_t records_kept, std::string_view key, std::string_view holder,
                     std::string_view why, bool silent, const Log& log) {
        const auto parts = parse_lease_key(key);
        if (!parts) return;
        engine.erase(key);
        const std::string space(parts->space);
        std::int64_t epoch = 0;
        try {
            epoch = engine.add(space + "__epoch", 1);
        } catch (const store_error& e) {
            // Only an in-process writer (memory_store over engine()) can have spoiled it.
            log(fmt::format("lease '{}' of {} lost ({}), but its epoch cannot count it: {}",
                            store_engine::printable(key), holder, why, e.what()));
            return;
        }
        ++lost_;
        // Counted before the record that wakes the observers, so that they read it with the loss.
        if (silent) {
            try {
                (void)engine.add(space + "__silent", 1);
            } catch (...) {
                // Spoiled in process (memory_store over engine()), or out of memory: the loss is
                // still recorded below; the count stays as it is (never lowered).
                log(fmt::format("lease '{}' of {} lost silently, but {}__silent cannot count it",
                                store_engine::printable(key), holder, store_engine::printable(space)));
            }
        }
        engine.set(fmt::format("{}__lost/{}", space, epoch), parts->name);
        // The records do not pile up: an observer reads each one as it comes (it waits for the
        // next by push), and a new observer starts at the epoch. Older ones than this go.
        const auto kept = std::max<std::int64_t>(records_kept, 1);
        if (epoch > kept) engine.erase(fmt::format("{}__lost/{}", space, epoch - kept));
        log(fmt::format("lease '{}' of {} lost{}: {}; {}__epoch is now {}", store_engine::printable(key), holder,
                        silent ? " (silent)" : "", why, store_engine::printable(space), epoch));
    }

private:
    // Which connection holds each lease key (wire key -> holder).
    std::unordered_map<std::string, store_connection*, store_string_hash, std::equal_to<>> holders_;
    std::uint64_t lost_ = 0;
};

}  // namespace elastic::inline v0::detail::store

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::store {

ELASTIC_DECL std::string store_lease_table::refusal(wire::op o, std::string_view key, bool binds) {
    const auto parts = parse_lease_key(key);
    if (!parts) return {};
    if (parts->reserved())
        return fmt::format("malformed lease request: {} of '{}', a name the server keeps "
                           "(names after '{}' starting with '__' are read-only; "
                           "docs/store.md, Leases)",
                           wire::name(o), store_engine::printable(key), lease_marker);
    if (parts->name.empty())
        return fmt::format("malformed lease request: {} of '{}' names no lease (a lease key "
                           "is <group>/{}<name>, name not empty)",
                           wire::name(o), store_engine::printable(key), lease_marker);
    if (!binds)
        return fmt::format("malformed lease request: {} of lease key '{}' (a lease is bound "
                           "by SET, MULTI_SET or COMPARE_SET and released by DELETE_KEY)",
                           wire::name(o), store_engine::printable(key));
    return {};
}

ELASTIC_DECL store_connection* store_lease_table::holder(std::string_view key) const {
    const auto it = holders_.find(key);
    return it == holders_.end() ? nullptr : it->second;
}

ELASTIC_DECL bool store_lease_table::bind(std::string_view key, store_connection* c) {
    if (holders_.find(key) != holders_.end()) return false;
    holders_.emplace(std::string(key), c);
    return true;
}

ELASTIC_DECL store_connection* store_lease_table::unbind(std::string_view key) noexcept {
    const auto it = holders_.find(key);
    if (it == holders_.end()) return nullptr;
    auto* c = it->second;
    holders_.erase(it);
    return c;
}

}  // namespace elastic::inline v0::detail::store

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/store/server_leases.hpp ----

#include <asio/any_io_executor.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

namespace elastic::inline v0 {

/// Where the server's log lines go (one line per call, no trailing newline). The agent may
/// replace it; the default prints "elastic-store: <line>" to stderr.
using store_log = std::function<void(std::string_view line)>;

/// How a tcp_store_server listens and what it accepts (limits are documented in docs/store.md).
struct store_server_options {
    /// Address to bind: an IPv4/IPv6 literal or a host name; "0.0.0.0" every IPv4 interface,
    /// "::" dual-stack. Loopback by default: a store others can reach is a choice to make.
    std::string host = "127.0.0.1";
    /// Port to bind; 0 picks a free one (read it back with port()).
    std::uint16_t port = 0;
    /// Per-request limits; a request beyond one closes only its connection.
    wire::limits limits{};
    /// Connections served at once; one more is accepted, logged and closed at once.
    std::size_t max_connections = 16384;
    /// WAITs pending on one connection (a 1.13 client that times out leaves one behind each
    /// time); also the keys one connection may watch (WATCH_KEY).
    std::size_t max_waits_per_connection = 4096;
    /// Replies buffered before the server stops reading that connection's requests and writes.
    std::size_t max_pending_output = 4 * 1024 * 1024;
    /// The largest reply one request may ask for (MULTI_GET, LIST_KEYS), checked before the
    /// reply is built; a request asking for more closes its connection.
    std::size_t max_reply_size = 64 * 1024 * 1024;
    /// Bytes queued for one connection that it has not read: replies and pushed notifications
    /// (WAIT wake-ups, WATCH_KEY changes). A client that stops reading is disconnected when its
    /// queue would pass this, never buffered without end. At least max_pending_output plus
    /// max_reply_size, and room for a WATCH_KEY notification of two values.
    std::size_t max_queued_output = 128 * 1024 * 1024;
    /// Bytes the whole server may hold: keys and values, awaited keys, requests being read and
    /// replies being written. A request that would pass it is refused (its connection closed,
    /// the refusal logged); the store keeps serving everyone else.
    std::size_t max_memory = std::size_t{1} << 30;
    /// Once the first byte of a request has arrived, the whole request must arrive within this
    /// (and a reply being written must be taken by the client within it); otherwise the
    /// connection is closed. Zero disables it.
    std::chrono::milliseconds request_timeout{std::chrono::seconds(60)};
    /// A connection that sends nothing for this long while it holds no WAIT, WATCH_KEY or lease
    /// is closed. Zero (the default) keeps idle connections: PyTorch's clients hold theirs for
    /// the whole job, idle between collectives' set-up, and do not reconnect.
    std::chrono::milliseconds idle_timeout{0};
    /// Out of descriptors or at max_connections, a new client is served by closing the newest
    /// connection that has never sent a request and has been open at least this long (an
    /// idle flood's, typically; a fresh client has its first request on the way). When there
    /// is no such connection the new one is accepted and closed at once, never left hanging in
    /// the kernel's backlog. Empty: never close one connection for another.
    std::optional<std::chrono::milliseconds> shed_unused_after{std::chrono::seconds(1)};
    /// Log sink; empty means stderr.
    store_log log;
    /// Called after each request has run (tracing, metrics, tests); may be empty.
    std::function<void(wire::op)> on_request;
    /// Leases (docs/store.md, "Leases"): a connection that holds one must be heard from (any
    /// request: PING, an empty CHECK, ...) at least once per `lease_heartbeat_interval`; after
    /// `lease_missed_heartbeats` intervals of silence the server closes it and records its
    /// leases as lost. One timer per leasing connection, re-armed lazily (no per-request cost
    /// beyond reading the clock).
    std::chrono::milliseconds lease_heartbeat_interval{std::chrono::seconds(1)};
    unsigned lease_missed_heartbeats = 5;
    /// How many `__lost/<n>` records of a lease group the server keeps (the newest ones; at
    /// least 1). An observer that falls further behind finds the older ones erased, counts
    /// them by `__epoch` and names no lease for them.
    std::int64_t lease_lost_records_kept = 1024;
    /// Which peers may connect (docs/store.md, "Who may connect"): asked with each accepted
    /// connection's remote address before anything is read; a refused peer is logged and
    /// closed. Empty: everyone. For clients that cannot authenticate (PyTorch workers).
    std::function<bool(const asio::ip::address&)> accept_peer;
    /// Authentication (docs/store.md, "Authentication"): with a secret, a connection must
    /// complete the handshake (store/auth.hpp) before any request, within `auth_timeout`, or it
    /// is closed and logged; nothing it sends reaches the key table. Without one (PyTorch's
    /// clients cannot authenticate) every connection is served as it comes. Not empty.
    std::optional<std::string> secret;
    std::chrono::milliseconds auth_timeout{std::chrono::seconds(10)};
};

namespace detail::store {

class store_connection;

// State shared by the server object and its connections, so a connection that finishes after
// the server object is gone still finds its engine.
struct store_server_core {
    store_server_core(const asio::any_io_executor& ex, store_server_options opts)
        : executor(ex), acceptor(ex), resume_accept(ex), options(std::move(opts)) {
        reserve_descriptor();
    }

    store_server_core(const store_server_core&) = delete;
    store_server_core& operator=(const store_server_core&) = delete;

    ~store_server_core() { release_descriptor(); }

    // Bytes held now: the key table and its waiters, and every connection's buffers.
    std::size_t held() const noexcept { return engine.bytes() + buffered; }

    // One descriptor kept open for the moment the process runs out: closing it lets the
    // acceptor take the waiting client, to be refused with a log line instead of left hanging.
    void reserve_descriptor() noexcept {
        if (spare_fd < 0) spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    ELASTIC_DECL void release_descriptor() noexcept;

    ELASTIC_DECL void log(std::string_view line) const;

    // How long a leasing connection may stay silent.
    std::chrono::steady_clock::duration lease_timeout() const {
        return options.lease_heartbeat_interval * options.lease_missed_heartbeats;
    }

    asio::any_io_executor executor;
    asio::ip::tcp::acceptor acceptor;
    async_signal resume_accept;  // notified when a connection closes (after EMFILE)
    store_server_options options;
    store_engine engine;
    std::unordered_set<store_connection*> connections;
    store_lease_table leases;
    std::size_t buffered = 0;  // bytes in the connections' input and output buffers
    int spare_fd = -1;         // reserve_descriptor()
    bool stopped = false;
    // When the server last said it had not run for a while (said once per stall, not per lease).
    std::chrono::steady_clock::time_point stall_said{};
};

ELASTIC_DECL std::string format_peer(const asio::ip::tcp::socket& s);

}  // namespace detail::store

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::store {

ELASTIC_DECL std::string format_peer(const asio::ip::tcp::socket& s) {
    std::error_code ec;
    const auto ep = s.remote_endpoint(ec);
    if (ec) return "unknown peer";
    if (ep.address().is_v6()) return fmt::format("[{}]:{}", ep.address().to_string(), ep.port());
    return fmt::format("{}:{}", ep.address().to_string(), ep.port());
}

}  // namespace detail::store
}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::store {

ELASTIC_DECL void store_server_core::release_descriptor() noexcept {
    if (spare_fd >= 0) ::close(spare_fd);
    spare_fd = -1;
}

ELASTIC_DECL void store_server_core::log(std::string_view line) const {
    if (options.log) options.log(line);
    else fmt::print(stderr, "elastic-store: {}\n", line);
}

}  // namespace detail::store
}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/store/server_core.hpp ----

#include <asio/awaitable.hpp>
#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iterator>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace elastic::inline v0::detail::store {

// One client connection: reads requests, runs them on the engine, writes replies in order. A
// WAIT whose keys are missing is answered later by on_ready, which queues STOP_WAITING in the
// same output stream and wakes the coroutine (wake()) so it flushes it.
class store_connection : public std::enable_shared_from_this<store_connection> {
public:
    store_connection(std::shared_ptr<store_server_core> core, asio::ip::tcp::socket socket)
        : core_(std::move(core)),
          socket_(std::move(socket)),
          timer_(socket_.get_executor()),
          peer_(format_peer(socket_)),
          watcher_(*this),
          opened_(clock::now()),
          last_heard_(opened_) {
        if (core_->options.secret) auth_ = std::make_unique<store_auth::server_handshake>(*core_->options.secret);
    }

    store_connection(const store_connection&) = delete;
    store_connection& operator=(const store_connection&) = delete;

    ~store_connection() { delete[] buf_; }

    template <class Defer = void>
    static asio::awaitable<void> serve(std::shared_ptr<store_connection> self) {
        // Whatever ends the loop — including a throw (out of memory, a throwing log sink, the
        // random source failing) — the connection must leave the engine and the server's set:
        // a waiter left registered would be called after the connection is gone.
        try {
            co_await self->loop();
        } catch (const std::exception& e) {
            self->expire(fmt::format("internal error: {}", e.what()));
        } catch (...) {
            self->expire("internal error");
        }
        self->finish();
    }

    ELASTIC_DECL void close() noexcept;

    // Whether the server may close this connection to serve a new client (out of descriptors
    // or at max_connections): it has never sent a request nor begun one, holds nothing, and
    // has been open at least `after`.
    // A connection that is authenticating or part-way through its first request counts too:
    // one byte each must not let a flood hold every slot.
    ELASTIC_DECL bool unused_since(std::chrono::steady_clock::time_point now,
                                   std::chrono::steady_clock::duration after) const noexcept;
    std::chrono::steady_clock::time_point opened() const noexcept { return opened_; }
    bool is_open() const noexcept { return socket_.is_open(); }

    // Closes the connection for the reason given (logged, and kept for the lease log).
    ELASTIC_DECL void expire(std::string reason);

    // `key` was released (DELETE_KEY by its holder): it is no longer this connection's to lose.
    void forget_lease(std::string_view key) noexcept { std::erase(leases_, key); }

    const std::string& peer() const noexcept { return peer_; }

private:
    using clock = std::chrono::steady_clock;

    // A pending WAIT of this connection.
    struct pending_wait final : store_waiter {
        explicit pending_wait(store_connection& c) : conn(c) {}
        void on_ready() override { conn.wait_ready(self); }
        store_connection& conn;
        std::list<pending_wait>::iterator self;
    };

    // WATCH_KEY registrations (legacy dialect): every change is pushed as a notification.
    struct key_watcher final : store_watcher {
        explicit key_watcher(store_connection& c) : conn(c) {}
        void on_change(store_change change, std::string_view key, std::string_view old_value,
                       std::string_view new_value) override {
            if (!conn.room_to_push(1 + 3 * 8 + key.size() + old_value.size() + new_value.size())) return;
            wire::put_u8(conn.out_, static_cast<std::uint8_t>(change));
            wire::put_bytes(conn.out_, key);
            wire::put_bytes(conn.out_, old_value);
            wire::put_bytes(conn.out_, new_value);
            conn.account();
            conn.wake();
        }
        store_connection& conn;
    };

    ELASTIC_DECL void wait_ready(std::list<pending_wait>::iterator it);

    template <class Defer = void>
    asio::awaitable<void> loop() {
        for (;;) {
            // After a malformed request the replies to the requests before it still go out.
            const bool ok = process();
            account();
            schedule();
            if (!out_.empty() && socket_.is_open()) {
                wbuf_.swap(out_);
                write_since_ = clock::now();
                schedule();
                const auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(wbuf_),
                                                                detail::as_tuple_awaitable<Defer>);
                (void)n;
                write_since_.reset();
                wbuf_.clear();
                // A large reply grew the buffer: give the memory back once it is written.
                if (wbuf_.capacity() > 1024 * 1024) std::string().swap(wbuf_);
                account();
                if (ec) co_return;
                if (ok) continue;
            }
            if (!ok) co_return;
            if (!waits_.empty() || watching_) {
                // A reply may be pushed while we wait for input: wait for readiness, which a
                // push cancels (wake()); cancelling a readiness wait loses no bytes. One
                // operation, not a race of two: nothing to outlive the other.
                if (!out_.empty()) continue;  // pushed while the last write was in flight
                in_readiness_wait_ = true;
                const auto [ec] = co_await socket_.async_wait(asio::ip::tcp::socket::wait_read,
                                                              detail::as_tuple_awaitable<Defer>);
                in_readiness_wait_ = false;
                if (!socket_.is_open()) co_return;
                if (ec == asio::error::operation_aborted) continue;  // woken: flush
                if (ec) co_return;
            }
            if (!socket_.is_open() || !reserve()) co_return;
            const auto [ec, n] = co_await socket_.async_read_some(asio::buffer(buf_ + end_, cap_ - end_),
                                                                  detail::as_tuple_awaitable<Defer>);
            if (ec) {  // EOF, reset or stop(): the client is gone
                // Replies it has not acknowledged for so long that they were sent again: it ended
                // while this server's bytes did not reach it (a one-way cut: it gave up on a
                // server it could no longer hear). Silent. (A reply merely in flight — a push to
                // a holder killed a moment ago — has not been retransmitted yet.)
                if (!leases_.empty() && unheard()) silent_ = true;
                co_return;
            }
            end_ += n;
            const auto now = clock::now();  // the only per-read cost of the deadlines
            // Bytes read after a gap longer than the lease deadline: it would have closed the
            // connection had this process run meanwhile (docs/store.md, "Silent or not").
            if (!leases_.empty() && now - last_heard_ > core_->lease_timeout() + stall_threshold()) stalled_at_ = now;
            last_heard_ = now;
            forgiven_ = false;
        }
    }

    // A reply was queued from outside the loop (a WAIT answered, a watched key changed): end
    // the loop's readiness wait so it writes it. Outside that wait the loop finds out_ full on
    // its own; cancelling then would cancel a write.
    ELASTIC_DECL void wake() noexcept;

    // ---- memory ------------------------------------------------------------------------------

    // Tells the server how many bytes this connection's buffers hold now.
    ELASTIC_DECL void account() noexcept;

    // Why `n` more bytes for `what` would pass the server's memory limit; empty when they fit.
    ELASTIC_DECL std::string no_memory_for(std::size_t n, std::string_view what) const;

    // What appending `n` bytes to `out_` allocates: std::string grows its capacity by doubling,
    // so a queue of 32 MiB that takes 2 MiB more takes 32 MiB more of memory.
    ELASTIC_DECL std::size_t output_growth(std::size_t n) const noexcept;

    // Why a reply of `n` bytes to `what` cannot be queued; empty when it can.
    ELASTIC_DECL std::string no_room_for_reply(std::size_t n, std::string_view what) const;

    // Whether a notification of `n` bytes may be queued; if not, the client, which is not
    // reading what it is sent, is disconnected.
    ELASTIC_DECL bool room_to_push(std::size_t n);

    // Makes room for the next read; false (logged) when the server's memory limit forbids it.
    // The buffer grows with the bytes that arrive, at most doubling, never to the size a
    // request's header announces: a client that announces 16 MiB and sends 10 bytes holds
    // 4 KiB, not 16 MiB.
    ELASTIC_DECL bool reserve();

    // Runs every complete request in the buffer; false closes the connection.
    ELASTIC_DECL bool process();

    ELASTIC_DECL bool fail(std::string_view reason);

    // ---- authentication ----------------------------------------------------------------------

    ELASTIC_DECL bool refuse(std::string_view reason);

    // ---- leases ------------------------------------------------------------------------------

    // Why a write (or DELETE_KEY) of `key` by this connection is refused because another live
    // connection holds that lease, or empty. Only the holder writes its lease: otherwise any
    // client could take a node's lease and drop it at will (a loss the job acts on), and a
    // holder that reconnects holds a lease under a new name anyway (its old one was lost).
    ELASTIC_DECL std::string lease_held_elsewhere(wire::op o, std::string_view key) const;

    // The key now belongs to this connection (the write has been done; lease_held_elsewhere
    // refused it before if another connection held it).
    ELASTIC_DECL void bind_lease(std::string_view key);

    // DELETE_KEY of a lease key: the lease ends without a loss (its holder, or someone on its
    // behalf, released it).
    void release_lease(std::string_view key) {
        if (auto* holder = core_->leases.unbind(key)) holder->forget_lease(key);
    }

    // ---- deadlines ---------------------------------------------------------------------------

    // One timer per connection for every deadline it has: a lease's silence, a request begun
    // and not finished, a reply the client does not take, idleness. It is not moved by each
    // request (that would cost a cancel per request): it fires at the earliest deadline known
    // when it was armed, and then either closes the connection or re-arms for what is left.
    std::optional<clock::time_point> next_deadline() const {
        std::optional<clock::time_point> at;
        const auto consider = [&](clock::time_point t) {
            if (!at || t < *at) at = t;
        };
        const auto& o = core_->options;
        if (!leases_.empty()) consider(last_heard_ + core_->lease_timeout());
        if (o.request_timeout.count() > 0) {
            if (partial_since_) consider(*partial_since_ + o.request_timeout);
            if (write_since_) consider(*write_since_ + o.request_timeout);
        }
        if (o.idle_timeout.count() > 0 && idle()) consider(last_heard_ + o.idle_timeout);
        // Half a handshake must not hold a connection: it has auth_timeout from the accept.
        if (auth_) consider(opened_ + o.auth_timeout);
        return at;
    }

    // Whether bytes this server sent wait unacknowledged past a retransmission (Linux TCP_INFO):
    // the client's side has not heard this server for at least a retransmission timeout.
    bool unheard() noexcept {
        ::tcp_info info{};
        ::socklen_t size = sizeof info;
        if (!socket_.is_open() || ::getsockopt(socket_.native_handle(), IPPROTO_TCP, TCP_INFO, &info, &size) != 0)
            return false;
        return info.tcpi_unacked > 0 && (info.tcpi_retransmits > 0 || info.tcpi_backoff > 0);
    }

    // How late a deadline must be handled to show that this process did not run meanwhile
    // (stopped, or starved of CPU): a heartbeat interval, at least 100 ms.
    clock::duration stall_threshold() const {
        return std::max<clock::duration>(core_->options.lease_heartbeat_interval, std::chrono::milliseconds(100));
    }

    // Nothing to wait for on this connection's behalf (the idle timeout's subject).
    bool idle() const noexcept {
        return begin_ == end_ && waits_.empty() && !watching_ && leases_.empty() && !write_since_;
    }

    // Arms the timer for the next deadline unless it is armed for an earlier one already.
    ELASTIC_DECL void schedule();

    ELASTIC_DECL void deadline_passed();

    ELASTIC_DECL bool execute();

    ELASTIC_DECL void cancel_waits() noexcept;

    // The coroutine has ended: forget every registration, lose the leases (unless the whole
    // server is stopping) and leave the server's set.
    ELASTIC_DECL void finish() noexcept;

    ELASTIC_DECL void lose_leases() noexcept;

    std::shared_ptr<store_server_core> core_;
    asio::ip::tcp::socket socket_;
    asio::steady_timer timer_;  // schedule()
    std::string peer_;
    std::optional<wire::dialect> dialect_;
    wire::request req_;
    char* buf_ = nullptr;  // [begin_, end_) unconsumed input; no zero-fill on growth
    std::size_t cap_ = 0;
    std::size_t begin_ = 0;
    std::size_t end_ = 0;
    std::size_t needed_ = 0;  // bytes of input the pending request needs at least
    std::string out_;         // replies not yet written, in order
    std::string wbuf_;        // the bytes of the write in flight
    std::list<pending_wait> waits_;
    key_watcher watcher_;
    bool watching_ = false;
    bool in_readiness_wait_ = false;   // the loop awaits readability (wake() may cancel it)
    std::size_t watches_ = 0;          // keys watched
    std::vector<std::string> leases_;  // lease keys this connection holds
    clock::time_point opened_;
    clock::time_point last_heard_;                    // the last read (or the lease's binding)
    bool forgiven_ = false;                           // a lease window given for a stall, since the last read
    bool silent_ = false;                             // closed for the client's silence (a silent lease loss)
    std::optional<clock::time_point> stalled_at_;     // when this process was last found not to have run
    std::optional<clock::time_point> partial_since_;  // the head request's first byte
    std::optional<clock::time_point> write_since_;    // the write in flight's start
    clock::time_point timer_at_{};
    std::uint64_t timer_generation_ = 0;
    bool timer_armed_ = false;
    std::uint64_t requests_ = 0;                          // requests run
    std::size_t accounted_ = 0;                           // bytes of this connection in core_->buffered
    std::string close_reason_;                            // why the server ended the connection, for the lease log
    std::unique_ptr<store_auth::server_handshake> auth_;  // until authenticated (with a secret)
};

}  // namespace elastic::inline v0::detail::store

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::store {

ELASTIC_DECL void store_connection::close() noexcept {
    std::error_code ignored;
    socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    timer_.cancel();
}

ELASTIC_DECL bool store_connection::unused_since(std::chrono::steady_clock::time_point now,
                                                 std::chrono::steady_clock::duration after) const noexcept {
    return requests_ == 0 && waits_.empty() && !watching_ && leases_.empty() && socket_.is_open() &&
           now - opened_ >= after;
}

ELASTIC_DECL void store_connection::expire(std::string reason) {
    if (!socket_.is_open()) return;
    core_->log(fmt::format("closing connection from {}: {}", peer_, reason));
    if (close_reason_.empty()) close_reason_ = fmt::format("the server closed it: {}", reason);
    close();
}

ELASTIC_DECL void store_connection::wait_ready(std::list<pending_wait>::iterator it) {
    wire::put_u8(out_, static_cast<std::uint8_t>(wire::wait_response::stop_waiting));
    waits_.erase(it);
    wake();
}

ELASTIC_DECL void store_connection::wake() noexcept {
    if (!in_readiness_wait_) return;
    std::error_code ignored;
    socket_.cancel(ignored);
}

ELASTIC_DECL void store_connection::account() noexcept {
    const std::size_t now = cap_ + out_.capacity() + wbuf_.capacity();
    core_->buffered += now;
    core_->buffered -= accounted_;
    accounted_ = now;
}

ELASTIC_DECL std::string store_connection::no_memory_for(std::size_t n, std::string_view what) const {
    const auto& o = core_->options;
    const std::size_t held = core_->held();
    if (n <= o.max_memory && held <= o.max_memory - n) return {};
    return fmt::format("{} needs {} bytes more while the server holds {} of its {} "
                       "(store_server_options::max_memory); the store is full",
                       what, n, held, o.max_memory);
}

ELASTIC_DECL std::size_t store_connection::output_growth(std::size_t n) const noexcept {
    const std::size_t need = out_.size() + n;
    if (need <= out_.capacity()) return 0;
    return std::max(need, 2 * out_.capacity()) - out_.capacity();
}

ELASTIC_DECL std::string store_connection::no_room_for_reply(std::size_t n, std::string_view what) const {
    const auto& o = core_->options;
    if (n > o.max_reply_size)
        return fmt::format("{} asks for a reply of {} bytes, over the limit of {} "
                           "(store_server_options::max_reply_size); ask for fewer keys",
                           what, n, o.max_reply_size);
    if (out_.size() + n > o.max_queued_output)
        return fmt::format("the client has left {} bytes of replies unread and {} wants {} "
                           "more (store_server_options::max_queued_output)",
                           out_.size(), what, n);
    return no_memory_for(output_growth(n), what);
}

ELASTIC_DECL bool store_connection::room_to_push(std::size_t n) {
    if (!socket_.is_open()) return false;
    const auto& o = core_->options;
    const std::size_t queued = out_.size() + wbuf_.size();
    std::string why;
    if (queued + n > o.max_queued_output)
        why = fmt::format("it does not read what it is sent: {} bytes of replies and "
                          "notifications are queued for it, and {} more would pass "
                          "store_server_options::max_queued_output ({})",
                          queued, n, o.max_queued_output);
    else if (auto full = no_memory_for(output_growth(n), "its next notification"); !full.empty())
        why = fmt::format("it does not read what it is sent ({} bytes are queued for it), "
                          "and {}",
                          queued, full);
    if (why.empty()) return true;
    expire(std::move(why));
    return false;
}

ELASTIC_DECL bool store_connection::reserve() {
    const std::size_t have = end_ - begin_;
    std::size_t want = 4096;
    if (needed_ > have) want = std::max(want, std::min(needed_ - have, have));
    if (cap_ - end_ >= want) return true;
    if (begin_ > 0) {
        std::memmove(buf_, buf_ + begin_, have);
        begin_ = 0;
        end_ = have;
        if (cap_ - end_ >= want) return true;
    }
    const std::size_t cap = std::max(cap_ * 2, have + want);
    if (auto why = no_memory_for(cap - cap_, "a request being read"); !why.empty()) return fail(why);
    char* bigger = new char[cap];
    if (have) std::memcpy(bigger, buf_, have);
    delete[] buf_;
    buf_ = bigger;
    cap_ = cap;
    account();
    return true;
}

ELASTIC_DECL bool store_connection::process() {
    bool completed = false;  // a request ran: a partial one after it is a new one
    while (out_.size() < core_->options.max_pending_output && socket_.is_open()) {
        const std::string_view data(buf_ + begin_, end_ - begin_);
        if (data.empty() || data.size() < needed_) break;
        if (auth_) {  // the handshake comes before anything else
            const auto s = auth_->feed(data, out_);
            if (s.status == store_auth::status::refused) return refuse(s.reason);
            if (s.status == store_auth::status::need_more) {
                needed_ = s.size;
                break;
            }
            begin_ += s.size;
            needed_ = 0;
            if (auth_->done()) auth_.reset();  // its deadline (schedule()) lapses
            continue;
        }
        if (!dialect_) {
            const auto d = wire::detect_dialect(data);
            if (d == wire::detection::need_more) {
                needed_ = data.size() + 1;
                break;
            }
            dialect_ = d == wire::detection::current ? wire::dialect::current : wire::dialect::legacy;
        }
        auto r = wire::parse_request(*dialect_, data, req_, core_->options.limits);
        if (r.status == wire::parse_status::need_more) {
            needed_ = r.size;
            break;
        }
        if (r.status == wire::parse_status::malformed) return fail(r.reason);
        needed_ = 0;
        if (!execute()) return false;
        ++requests_;
        completed = true;
        begin_ += r.size;
        if (core_->options.on_request) core_->options.on_request(req_.operation);
    }
    if (begin_ == end_) {
        begin_ = end_ = 0;
        // A huge request grew the buffer: give the memory back once it is consumed.
        if (cap_ > 1024 * 1024) {
            delete[] buf_;
            buf_ = nullptr;
            cap_ = 0;
        }
    }
    // The request timeout runs from the first byte of the request at the head of the
    // buffer: restarted by every request that completes, stopped when none is begun.
    if (begin_ == end_ || end_ - begin_ >= needed_) partial_since_.reset();
    else if (completed || !partial_since_) partial_since_ = clock::now();
    return true;
}

ELASTIC_DECL bool store_connection::fail(std::string_view reason) {
    core_->log(fmt::format("closing connection from {} ({} dialect): {}", peer_,
                           dialect_ == wire::dialect::current ? "current" : "legacy", reason));
    if (close_reason_.empty()) close_reason_ = fmt::format("the server closed it: {}", reason);
    return false;
}

ELASTIC_DECL bool store_connection::refuse(std::string_view reason) {
    core_->log(fmt::format("closing connection from {}: authentication failed: {}", peer_, reason));
    auth_.reset();  // said once
    return false;
}

ELASTIC_DECL std::string store_connection::lease_held_elsewhere(wire::op o, std::string_view key) const {
    const auto* holder = core_->leases.holder(key);
    if (!holder || holder == this) return {};
    return fmt::format("{} of lease '{}', which the connection from {} holds (only a lease's "
                       "holder writes or deletes it; docs/store.md, Leases)",
                       wire::name(o), store_engine::printable(key), holder->peer());
}

ELASTIC_DECL void store_connection::bind_lease(std::string_view key) {
    if (!core_->leases.bind(key, this)) return;  // this connection's already
    leases_.emplace_back(key);
    const std::string space(parse_lease_key(key)->space);
    for (const auto* counter : {"__epoch", "__silent"}) {
        if (!core_->engine.find(space + counter)) core_->engine.set(space + counter, std::string_view("0"));
    }
    last_heard_ = clock::now();
    schedule();
}

ELASTIC_DECL void store_connection::schedule() {
    if (!socket_.is_open()) return;
    const auto at = next_deadline();
    if (!at || (timer_armed_ && timer_at_ <= *at)) return;
    timer_armed_ = true;
    timer_at_ = *at;
    const auto generation = ++timer_generation_;  // a re-arm cancels the wait before it
    timer_.expires_at(*at);
    timer_.async_wait([weak = weak_from_this(), generation](const std::error_code& ec) {
        const auto self = weak.lock();
        if (!self || self->timer_generation_ != generation) return;
        self->timer_armed_ = false;
        if (!ec) self->deadline_passed();
    });
}

ELASTIC_DECL void store_connection::deadline_passed() {
    if (!socket_.is_open()) return;
    const auto now = clock::now();
    const auto& o = core_->options;
    const auto ms = [](clock::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
    if (!leases_.empty() && now >= last_heard_ + core_->lease_timeout()) {
        // The silence may be this process's own, not the client's: its bytes wait unread, or
        // this timer ran long after its time (the server was stopped, or starved of CPU, and a
        // holder in the same process, the store's host agent, could not speak either). The
        // lease's silence is then counted from now: one more window, once per read, so that
        // neither a loop that keeps running late nor a client that sends but takes no replies
        // (the server cannot read while it cannot write) keeps a lease for ever.
        if (!forgiven_) {
            std::error_code unread;
            const bool spoke = socket_.available(unread) > 0 && !unread;
            const auto late = now - timer_at_;
            const bool stalled = late > stall_threshold();
            if (spoke || stalled) {
                forgiven_ = true;
                if (stalled) stalled_at_ = now;
                if (stalled && now - core_->stall_said > core_->lease_timeout()) {  // once per stall
                    core_->stall_said = now;
                    core_->log(fmt::format("the store did not run for {} ms (its process was stopped, or starved of "
                                           "CPU): the leases' silence is counted from now, not from before",
                                           ms(late)));
                }
                last_heard_ = now;
                schedule();
                return;
            }
        }
        silent_ = true;
        close_reason_ = fmt::format("silent for {} ms ({} missed heartbeats of {} ms; "
                                    "store_server_options::lease_heartbeat_interval, lease_missed_heartbeats)",
                                    ms(now - last_heard_), o.lease_missed_heartbeats,
                                    o.lease_heartbeat_interval.count());
        core_->log(fmt::format("closing connection from {}: {}", peer_, close_reason_));
        close();
        return;
    }
    if (auth_ && now >= opened_ + o.auth_timeout) {
        auth_.reset();  // said once
        return expire(fmt::format("authentication failed: no complete handshake within {} "
                                  "ms (store_server_options::auth_timeout)",
                                  o.auth_timeout.count()));
    }
    // A client whose bytes stop mid-request or mid-reply went silent too (a cut-off link
    // leaves a write unacknowledged).
    if (o.request_timeout.count() > 0 && partial_since_ && now >= *partial_since_ + o.request_timeout) {
        silent_ = true;
        return expire(fmt::format("a request begun {} ms ago is still incomplete ({} of at least {} bytes "
                                  "arrived; store_server_options::request_timeout is {} ms)",
                                  ms(now - *partial_since_), end_ - begin_, needed_, o.request_timeout.count()));
    }
    if (o.request_timeout.count() > 0 && write_since_ && now >= *write_since_ + o.request_timeout) {
        silent_ = true;
        return expire(fmt::format("it has not taken a reply of {} bytes in {} ms (store_server_options::"
                                  "request_timeout)",
                                  wbuf_.size(), ms(now - *write_since_)));
    }
    if (o.idle_timeout.count() > 0 && idle() && now >= last_heard_ + o.idle_timeout)
        return expire(fmt::format("idle for {} ms (store_server_options::idle_timeout)", ms(now - last_heard_)));
    schedule();
}

ELASTIC_DECL bool store_connection::execute() {
    using wire::op;
    auto& engine = core_->engine;
    auto& r = req_;
    switch (r.operation) {
        case op::validate:
            if (r.nonce != wire::validate_magic)
                return fail(fmt::format("VALIDATE with magic 0x{:08x}, expected 0x{:08x}", r.nonce,
                                        wire::validate_magic));
            return true;
        case op::ping: wire::put_u32(out_, r.nonce); return true;
        case op::set:
            if (auto why = store_lease_table::refusal(r.operation, r.key, true); !why.empty()) return fail(why);
            if (auto why = lease_held_elsewhere(r.operation, r.key); !why.empty()) return fail(why);
            if (auto why = no_memory_for(engine.growth(r.key, r.value.size()), "SET"); !why.empty()) return fail(why);
            engine.set(r.key, r.value);
            if (parse_lease_key(r.key)) bind_lease(r.key);
            return true;
        case op::compare_set: {
            if (auto why = store_lease_table::refusal(r.operation, r.key, true); !why.empty()) return fail(why);
            // Whether this CAS writes (PyTorch's rules), known before it runs: a lease is
            // bound only by the CAS that wins; one that would not write only reads.
            const auto* before = engine.find(r.key);
            const bool writes = before ? *before == r.expected : r.expected.empty();
            if (auto why = lease_held_elsewhere(r.operation, r.key); writes && !why.empty()) return fail(why);
            const std::size_t reply = 8 + std::max(r.value.size(), before ? before->size() : r.expected.size());
            if (auto why = no_room_for_reply(reply, "COMPARE_SET"); !why.empty()) return fail(why);
            if (writes)
                if (auto why = no_memory_for(engine.growth(r.key, r.value.size()) + output_growth(reply),
                                             "COMPARE_SET");
                    !why.empty())
                    return fail(why);
            wire::put_bytes(out_, engine.compare_set(r.key, r.expected, r.value));
            if (writes && parse_lease_key(r.key)) bind_lease(r.key);
            return true;
        }
        case op::get: {
            // Missing: an empty value, like the libuv server (clients WAIT first anyway).
            const auto* v = engine.find(r.key);
            if (auto why = no_room_for_reply(8 + (v ? v->size() : 0), "GET"); !why.empty()) return fail(why);
            wire::put_bytes(out_, v ? std::string_view(*v) : std::string_view{});
            return true;
        }
        case op::add:
            if (auto why = store_lease_table::refusal(r.operation, r.key, false); !why.empty()) return fail(why);
            if (auto why = no_memory_for(engine.growth(r.key, 20), "ADD"); !why.empty()) return fail(why);
            try {
                wire::put_i64(out_, engine.add(r.key, r.number));
            } catch (const store_error& e) {
                return fail(e.what());
            }
            return true;
        case op::check:
            wire::put_u8(out_, static_cast<std::uint8_t>(engine.check(r.keys) ? wire::check_response::ready
                                                                              : wire::check_response::not_ready));
            return true;
        case op::wait: {
            if (waits_.size() >= core_->options.max_waits_per_connection)
                return fail(fmt::format("{} WAITs pending on one connection reach the limit "
                                        "(store_server_options::max_waits_per_connection)",
                                        waits_.size()));
            std::size_t awaited = 0;
            for (const auto k : r.keys) awaited += store_engine::awaited_bytes(k.size());
            if (auto why = no_memory_for(awaited, "WAIT"); !why.empty()) return fail(why);
            auto& w = waits_.emplace_back(*this);
            w.self = std::prev(waits_.end());
            if (engine.wait(w, r.keys)) {
                waits_.pop_back();
                wire::put_u8(out_, static_cast<std::uint8_t>(wire::wait_response::stop_waiting));
            }
            return true;
        }
        case op::num_keys: wire::put_i64(out_, static_cast<std::int64_t>(engine.size())); return true;
        case op::watch_key:
            if (watches_ >= core_->options.max_waits_per_connection)
                return fail(fmt::format("{} keys watched on one connection reach the limit "
                                        "(store_server_options::max_waits_per_connection)",
                                        watches_));
            if (auto why = no_memory_for(store_engine::watch_bytes(r.key.size()), "WATCH_KEY"); !why.empty())
                return fail(why);
            if (engine.watch(watcher_, r.key)) ++watches_;
            watching_ = true;
            wire::put_u8(out_, static_cast<std::uint8_t>(wire::watch_response::key_callback_registered));
            return true;
        case op::delete_key:
            if (const auto parts = parse_lease_key(r.key)) {
                if (parts->reserved() || parts->name.empty())
                    return fail(store_lease_table::refusal(r.operation, r.key, true));
                if (auto why = lease_held_elsewhere(r.operation, r.key); !why.empty()) return fail(why);
                release_lease(r.key);
            }
            wire::put_i64(out_, engine.erase(r.key) ? 1 : 0);
            return true;
        case op::append:
            if (auto why = store_lease_table::refusal(r.operation, r.key, false); !why.empty()) return fail(why);
            if (const auto* v = engine.find(r.key);
                v && v->size() + r.value.size() > core_->options.limits.max_value_size)
                return fail(fmt::format("APPEND of {} bytes to '{}' would make a value of {} "
                                        "bytes, over the limit of {} "
                                        "(wire::limits::max_value_size)",
                                        r.value.size(), store_engine::printable(r.key), v->size() + r.value.size(),
                                        core_->options.limits.max_value_size));
            if (auto why = no_memory_for(engine.growth(r.key, r.value.size()), "APPEND"); !why.empty())
                return fail(why);
            engine.append(r.key, r.value);
            return true;
        case op::multi_get: {
            // The reply's size is known before it is built: a request naming one large
            // value many times is refused, not answered with gigabytes.
            std::size_t reply = 0;
            for (const auto k : r.keys) {
                const auto* v = engine.find(k);
                reply += 8 + (v ? v->size() : 0);
            }
            if (auto why = no_room_for_reply(reply, fmt::format("MULTI_GET of {} keys", r.keys.size())); !why.empty())
                return fail(why);
            for (const auto k : r.keys) {
                const auto* v = engine.find(k);
                wire::put_bytes(out_, v ? std::string_view(*v) : std::string_view{});
            }
            return true;
        }
        case op::multi_set: {
            // All or nothing: a refused lease key refuses the whole request.
            std::size_t growth = 0;
            for (std::size_t i = 0; i < r.keys.size(); ++i) {
                if (auto why = store_lease_table::refusal(r.operation, r.keys[i], true); !why.empty()) return fail(why);
                if (auto why = lease_held_elsewhere(r.operation, r.keys[i]); !why.empty()) return fail(why);
                growth += engine.growth(r.keys[i], r.values[i].size());
            }
            if (auto why = no_memory_for(growth, "MULTI_SET"); !why.empty()) return fail(why);
            for (std::size_t i = 0; i < r.keys.size(); ++i) {
                engine.set(r.keys[i], r.values[i]);
                if (parse_lease_key(r.keys[i])) bind_lease(r.keys[i]);
            }
            return true;
        }
        case op::cancel_wait:
            // Any STOP_WAITING already queued stays in front of this reply: a client that
            // raced reads 0x00 then 0x01, as PyTorch's client expects (it reads a second byte
            // after a 0x00).
            cancel_waits();
            wire::put_u8(out_, static_cast<std::uint8_t>(wire::wait_response::wait_canceled));
            return true;
        case op::list_keys: {
            std::size_t reply = 8;
            engine.for_each([&](std::string_view k, std::string_view) { reply += 8 + k.size(); });
            if (auto why = no_room_for_reply(reply, "LIST_KEYS"); !why.empty()) return fail(why);
            wire::put_i64(out_, static_cast<std::int64_t>(engine.size()));
            engine.for_each([&](std::string_view k, std::string_view) { wire::put_bytes(out_, k); });
            return true;
        }
        case op::queue_push:
        case op::queue_pop:
        case op::queue_len:
        case op::barrier:
            return fail(fmt::format("{} is not supported by this server (docs/store.md)", wire::name(r.operation)));
    }
    return fail("unreachable opcode");
}

ELASTIC_DECL void store_connection::cancel_waits() noexcept {
    for (auto& w : waits_) core_->engine.cancel(w);
    waits_.clear();
}

ELASTIC_DECL void store_connection::finish() noexcept {
    if (auth_ && auth_->challenged() && !core_->stopped) {
        try {
            core_->log(fmt::format("connection from {} closed during the authentication "
                                   "handshake, after this server's challenge: the client "
                                   "did not accept this server's proof (it has another "
                                   "secret) or left",
                                   peer_));
        } catch (...) {
            // Out of memory for a log line: the connection ends either way.
        }
    }
    cancel_waits();
    if (watching_) core_->engine.unwatch(watcher_);
    watching_ = false;
    close();
    lose_leases();
    delete[] buf_;
    buf_ = nullptr;
    cap_ = begin_ = end_ = 0;
    out_ = std::string();
    wbuf_ = std::string();
    core_->buffered -= accounted_;
    accounted_ = 0;
    core_->connections.erase(this);
    core_->resume_accept.notify();
}

ELASTIC_DECL void store_connection::lose_leases() noexcept {
    auto leases = std::move(leases_);
    leases_.clear();
    if (leases.empty()) return;
    // A connection that ended while its deadline was overdue and not yet handled ended while
    // this process did not run: its holder may have given up on the server's silence (a store
    // host stopped past the keep-alive), so the loss counts as silent, not as a death.
    // So does one that ended soon after such a stall was found: the holder's bytes sent during
    // the stall, read first, moved its deadline, and its end may be read after the deadline ran.
    // (The lease deadline itself, not the timer's: the timer is a periodic check, and a loop
    // merely late for it must not make a killed holder's loss look silent.)
    const auto now = clock::now();
    const bool stalled = now - (last_heard_ + core_->lease_timeout()) > stall_threshold() ||
                         (stalled_at_ && now - *stalled_at_ <= core_->lease_timeout());
    const bool silent = silent_ || stalled;
    const std::string why = !close_reason_.empty() ? close_reason_
                            : core_->stopped       ? std::string("the server stopped")
                            : stalled
                                ? std::string("the connection closed while the server did not run (its process was "
                                              "stopped or starved of CPU)")
                                : std::string("the connection closed");
    for (const auto& key : leases) {
        core_->leases.unbind(key);
        if (core_->stopped) continue;  // the store goes away with its keys: nobody to tell
        try {
            core_->leases.record_loss(core_->engine, core_->options.lease_lost_records_kept, key, peer_, why, silent,
                                      [&](std::string_view line) { core_->log(line); });
        } catch (...) {
            // Out of memory while writing the loss: the key is gone either way.
        }
    }
}

}  // namespace elastic::inline v0::detail::store

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/store/server_connection.hpp ----

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string_view>
#include <system_error>
#include <utility>

#include <poll.h>

namespace elastic::inline v0::detail::store {

// Whether a client waits in the listening socket's queue (never blocks).
inline bool client_waiting(asio::ip::tcp::acceptor& acceptor) noexcept {
    pollfd p{acceptor.native_handle(), POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

// Stops accepting and closes every connection (their waits are dropped).
inline void stop_server(store_server_core& core) noexcept {
    if (core.stopped) return;
    core.stopped = true;
    std::error_code ignored;
    core.acceptor.close(ignored);
    core.resume_accept.notify();
    core.release_descriptor();
    for (auto* c : core.connections) c->close();
}

// Closes the newest connection that never sent a request (store_server_options::
// shed_unused_after) so a new client can be served; false when there is none.
inline bool shed_unused(store_server_core& core, std::string_view why) {
    if (!core.options.shed_unused_after) return false;
    const auto after = *core.options.shed_unused_after;
    const auto now = std::chrono::steady_clock::now();
    store_connection* victim = nullptr;
    for (auto* c : core.connections)
        if (c->unused_since(now, after) && (!victim || c->opened() > victim->opened())) victim = c;
    if (!victim) return false;
    victim->expire(fmt::format("{}: it has completed no request in the {} ms since it connected, and a new client "
                               "is served in its place (store_server_options::shed_unused_after)",
                               why,
                               std::chrono::duration_cast<std::chrono::milliseconds>(now - victim->opened()).count()));
    return true;
}

// Accepts connections until the server stops, each served by a coroutine of its own; out of
// descriptors or at max_connections, makes room or refuses the newcomer plainly.
template <class Defer = void>
asio::awaitable<void> accept_loop(std::shared_ptr<store_server_core> core) {
    while (!core->stopped) {
        auto [ec, socket] = co_await core->acceptor.async_accept(detail::as_tuple_awaitable<Defer>);
        if (ec == asio::error::operation_aborted || core->stopped) break;
        if (ec == asio::error::no_descriptors || ec == std::errc::too_many_files_open_in_system) {
            // Out of descriptors. The kernel says so before it looks at the queue, so
            // first see whether a client is waiting at all; if none, wait for one (stop()
            // closes the acceptor, which ends the wait), without a retry loop.
            if (!client_waiting(core->acceptor)) {
                co_await core->acceptor.async_wait(asio::ip::tcp::acceptor::wait_read,
                                                   detail::as_tuple_awaitable<Defer>);
                continue;
            }
            // A client waits: close an unused connection for it, or take it with the
            // reserve descriptor and refuse it plainly.
            if (shed_unused(*core, "the process is out of file descriptors")) continue;
            if (core->spare_fd >= 0) {
                core->release_descriptor();
                auto [ec2, refused] = co_await core->acceptor.async_accept(detail::as_tuple_awaitable<Defer>);
                if (!ec2) {
                    core->log(fmt::format("refusing connection from {}: the process is out of file "
                                          "descriptors ({}) and no connection can make room; raise `ulimit "
                                          "-n` or lower store_server_options::max_connections",
                                          format_peer(refused), ec.message()));
                    std::error_code ignored;
                    refused.close(ignored);
                }
                if (core->stopped) break;
                core->reserve_descriptor();
                if (!ec2 || ec2 == asio::error::operation_aborted) continue;
            }
            core->log(fmt::format("cannot accept: {}; waiting until a connection closes", ec.message()));
            co_await core->resume_accept.wait();
            continue;
        }
        if (ec) {
            core->log(fmt::format("accept failed: {}", ec.message()));
            continue;
        }
        std::error_code ignored;
        if (core->options.accept_peer) {
            const auto remote = socket.remote_endpoint(ignored);
            if (ignored || !core->options.accept_peer(remote.address())) {
                core->log(fmt::format("refusing connection from {}: not a peer this store "
                                      "accepts (store_server_options::accept_peer)",
                                      format_peer(socket)));
                socket.close(ignored);
                continue;
            }
        }
        socket.set_option(asio::ip::tcp::no_delay(true), ignored);
        // Connections already closed (shed a moment ago) leave the set when their coroutine
        // runs: they do not count, or each new client would shed one more.
        if (core->connections.size() >= core->options.max_connections &&
            static_cast<std::size_t>(std::ranges::count_if(core->connections,
                                                           [](const auto* c) { return c->is_open(); })) >=
                core->options.max_connections &&
            !shed_unused(*core, "max_connections is reached")) {
            core->log(fmt::format("refusing connection from {}: {} connections reach the "
                                  "limit (store_server_options::max_connections)",
                                  format_peer(socket), core->connections.size()));
            socket.close(ignored);
            continue;
        }
        auto conn = std::make_shared<store_connection>(core, std::move(socket));
        core->connections.insert(conn.get());
        asio::co_spawn(core->executor, store_connection::serve<Defer>(std::move(conn)), detail::detached<Defer>);
    }
    stop_server(*core);
}

}  // namespace elastic::inline v0::detail::store
// ---- end elastic/store/server_accept.hpp ----

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/ip/v6_only.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <utility>

namespace elastic::inline v0 {

/// PyTorch's TCPStore server. Both wire dialects are served side by side, chosen per connection
/// from its first bytes, over one key table. Bind in the constructor; serve with `start()` (or
/// `co_await run()`); stop with `stop()`, the destructor, or by cancelling `run()`. Use it on one
/// thread (run the io_context on one thread).
template <class Defer = void>
class basic_tcp_store_server {
public:
    /// Binds and listens on `options.host`:`options.port`; throws store_error when it cannot.
    explicit basic_tcp_store_server(const asio::any_io_executor& executor, store_server_options options = {})
        : core_(std::make_shared<detail::store::store_server_core>(executor, std::move(options))) {
        auto& o = core_->options;
        auto& acc = core_->acceptor;
        if (o.lease_heartbeat_interval.count() <= 0 || o.lease_missed_heartbeats == 0)
            throw store_error(fmt::format("store_server_options: lease_heartbeat_interval {} ms and "
                                          "lease_missed_heartbeats {} must both be positive",
                                          o.lease_heartbeat_interval.count(), o.lease_missed_heartbeats));
        // A client that reads everything must never be cut off: its queue holds what reading
        // stops at plus one reply, or a WATCH_KEY notification of two values.
        const std::size_t notification = 25 + o.limits.max_key_size + 2 * o.limits.max_value_size;
        if (o.max_queued_output < o.max_pending_output + std::max(o.max_reply_size, notification))
            throw store_error(
                fmt::format("store_server_options: max_queued_output {} is less than max_pending_output {} "
                            "plus the largest reply ({}) or notification ({})",
                            o.max_queued_output, o.max_pending_output, o.max_reply_size, notification));
        if (o.secret && o.secret->empty())
            throw store_error("store_server_options::secret is empty: give the job's secret, or "
                              "no secret (std::nullopt) for a store without authentication");
        if (o.secret && o.auth_timeout.count() <= 0)
            throw store_error(fmt::format("store_server_options::auth_timeout {} ms must be "
                                          "positive",
                                          o.auth_timeout.count()));
        try {
            asio::ip::tcp::endpoint ep;
            std::error_code ec;
            const auto address = asio::ip::make_address(o.host, ec);
            if (!ec) {
                ep = {address, o.port};
            } else {
                asio::ip::tcp::resolver resolver(executor);
                const auto results = resolver.resolve(o.host, std::to_string(o.port), asio::ip::resolver_base::passive);
                ep = results.begin()->endpoint();
            }
            acc.open(ep.protocol());
            acc.set_option(asio::socket_base::reuse_address(true));
            if (ep.address().is_v6()) acc.set_option(asio::ip::v6_only(false));
            acc.bind(ep);
            acc.listen(asio::socket_base::max_listen_connections);
        } catch (const std::system_error& e) {
            throw store_listen_error(fmt::format("cannot listen on {}:{}: {}; choose another port (0 "
                                                 "picks a free one) or address",
                                                 o.host, o.port, e.code().message()),
                                     e.code());
        }
    }

    basic_tcp_store_server(const basic_tcp_store_server&) = delete;
    basic_tcp_store_server& operator=(const basic_tcp_store_server&) = delete;

    ~basic_tcp_store_server() { stop(); }

    /// The bound address and port.
    asio::ip::tcp::endpoint local_endpoint() const { return core_->acceptor.local_endpoint(); }
    /// The bound port (the chosen one when options.port was 0).
    std::uint16_t port() const { return local_endpoint().port(); }

    /// Serves in the background on the executor (the agent's usual way).
    void start() { asio::co_spawn(core_->executor, detail::store::accept_loop<Defer>(core_), detail::detached<Defer>); }

    /// Accepts and serves until stop() or until the awaiting coroutine is cancelled (which also
    /// stops the server). The coroutine owns the server's shared state, not `this`, so it may
    /// outlive the server object.
    asio::awaitable<void> run() { return detail::store::accept_loop(core_); }

    /// Stops accepting and closes every connection (their waits are dropped).
    void stop() noexcept { detail::store::stop_server(*core_); }

    /// The key table the connections share (for an embedding agent and for tests).
    detail::store::store_engine& engine() noexcept { return core_->engine; }

    /// The number of open connections.
    std::size_t connections() const noexcept { return core_->connections.size(); }

    /// Bytes held now, as store_server_options::max_memory counts them: keys, values, awaited
    /// keys, and the connections' request and reply buffers.
    std::size_t memory() const noexcept { return core_->held(); }

    /// The number of leases held now, and lost since the start (docs/store.md, "Leases").
    std::size_t leases() const noexcept { return core_->leases.size(); }
    std::uint64_t leases_lost() const noexcept { return core_->leases.lost(); }

private:
    std::shared_ptr<detail::store::store_server_core> core_;
};
using tcp_store_server = basic_tcp_store_server<>;

}  // namespace elastic::inline v0
// ---- end elastic/store/server.hpp ----

namespace elastic::inline v0 {

static_assert(store<prefix_store<memory_store>>);
static_assert(multi_key_store<prefix_store<memory_store>>);
static_assert(store<prefix_store<prefix_store<memory_store>>>);

}  // namespace elastic::inline v0
// ---- end elastic/store.hpp ----
// The worker's collectives, after the store: dist.hpp includes the store client only where
// its definitions are compiled, and the single header keeps a header's first inclusion only.
// ---- begin elastic/dist.hpp ----
// elastic::dist: composer-style collectives for native C++ workers (barrier, broadcast,
// all_gather, all_reduce of scalars, rank and size helpers) over the job's TCP store.

// The store client only where group's members are compiled: with ELASTIC_SEPARATE_COMPILATION,
// in elastic/impl/src.hpp's file alone, so a worker's files parse none of Asio.
#if ELASTIC_DETAIL_BODIES
#endif

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// A collective did not complete in time because some ranks never arrived. The message names
/// them, the collective and the store; `missing_ranks()` lists them in order.
class dist_timeout : public store_timeout {
public:
    dist_timeout(const std::string& message, std::vector<int> missing)
        : store_timeout(message), missing_(std::move(missing)) {}

    /// The ranks that had not arrived when the timeout expired.
    [[nodiscard]] const std::vector<int>& missing_ranks() const noexcept { return missing_; }

private:
    std::vector<int> missing_;
};

template <class>
class basic_blocking_store_client;  // elastic/store/blocking_client.hpp

namespace dist {

/// How `all_reduce` combines the ranks' values.
enum class reduce_op : std::uint8_t { sum, min, max };

/// What a `group` needs: who we are, where the store is, and the key namespace.
struct group_options {
    int rank = 0;                    ///< this process's rank, 0 <= rank < world_size
    int world_size = 1;              ///< processes in the group; 1 needs no store
    std::string host = "127.0.0.1";  ///< the store (MASTER_ADDR)
    std::uint16_t port = 29500;      ///< the store's port (MASTER_PORT)
    /// Prefix of every key the group writes. `from_env` makes it "elastic.dist/attempt_<N>"
    /// with N = TORCHELASTIC_RESTART_COUNT, so a restarted group never sees the keys a previous
    /// attempt left behind (a rank that died mid-barrier, for instance).
    std::string key_namespace = "elastic.dist/attempt_0";
    /// How long a collective waits for the other ranks (PyTorch's process group default).
    std::chrono::milliseconds timeout{std::chrono::minutes(30)};
    /// How long connecting to the store may take (attempts back off exponentially).
    std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
    client_dialect dialect = client_dialect::detect;
};

/// The options for this worker, from what the launcher set (`elastic::env()` or a test's
/// `worker_env::from(map)`). A multi-rank environment without MASTER_ADDR/MASTER_PORT is an
/// env_error naming them.
inline group_options options_from(const worker_env& e) {
    group_options o;
    o.rank = e.rank;
    o.world_size = e.world_size;
    o.key_namespace = fmt::format("elastic.dist/attempt_{}", e.restart_count);
    if (e.world_size > 1) {
        if (!e.master_addr || !e.master_port)
            throw env_error(fmt::format("invalid worker environment: elastic::dist needs the "
                                        "store at MASTER_ADDR:MASTER_PORT for a world of {} ranks, "
                                        "but {} is not set; start the workers with elasticrun "
                                        "or torchrun, or set both",
                                        e.world_size, !e.master_addr ? "MASTER_ADDR" : "MASTER_PORT"),
                            {"MASTER_ADDR", "MASTER_PORT"});
        o.host = *e.master_addr;
        o.port = *e.master_port;
    }
    return o;
}

/// A group of ranks synchronising through a TCP store. Every rank must call the same
/// collectives in the same order (as with torch.distributed). Each collective uses fresh keys
/// `<namespace>/<n>/...` (n counts collectives); once all ranks have passed collective n, the
/// keys this rank wrote before n are deleted, so the store does not grow with the run. With
/// world_size 1 every collective is a local no-op and no store is needed. Not thread-safe; the
/// free functions below lock around the process-wide group.
class group {
public:
    ELASTIC_DECL explicit group(group_options options);
    ELASTIC_DECL ~group();
    group(const group&) = delete;
    group& operator=(const group&) = delete;

    [[nodiscard]] int rank() const noexcept { return options_.rank; }
    [[nodiscard]] int world_size() const noexcept { return options_.world_size; }
    [[nodiscard]] const group_options& options() const noexcept { return options_; }

    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return options_.timeout; }
    /// Changes how long later collectives wait for the other ranks.
    ELASTIC_DECL void set_timeout(std::chrono::milliseconds t);

    /// Returns when every rank has called barrier(). dist_timeout names the ranks missing.
    ELASTIC_DECL void barrier();

    /// Returns `root`'s bytes on every rank (the others' `bytes` are ignored). Only the root's
    /// arrival is awaited; dist_timeout names it when it does not come.
    ELASTIC_DECL std::string broadcast(std::string bytes, int root = 0);

    /// Every rank's bytes, indexed by rank.
    ELASTIC_DECL std::vector<std::string> all_gather(std::string bytes);

    /// Combines every rank's value with `op`; every rank gets the same result (sums are taken
    /// in rank order, so floating-point results agree bit for bit).
    // clang-format off
    template <class T>
        requires std::is_arithmetic_v<T>
    T all_reduce(T value, reduce_op op = reduce_op::sum) {
        // clang-format on
        if (options_.world_size == 1) return value;
        std::string bytes(sizeof(T), '\0');
        std::memcpy(bytes.data(), &value, sizeof(T));
        const auto all = exchange("all_reduce", std::move(bytes), true);
        T result{};
        for (std::size_t r = 0; r < all.size(); ++r) {
            if (all[r].size() != sizeof(T))
                throw store_error(
                    fmt::format("elastic::dist::all_reduce: rank {} sent {} bytes, expected {} (a value of "
                                "another type: every rank must reduce the same type)",
                                r, all[r].size(), sizeof(T)));
            T v;
            std::memcpy(&v, all[r].data(), sizeof(T));
            if (r == 0) result = v;
            else if (op == reduce_op::sum) result = static_cast<T>(result + v);
            else if (op == reduce_op::min) result = std::min(result, v);
            else result = std::max(result, v);
        }
        return result;
    }

private:
    ELASTIC_DECL void check_rank(int r, std::string_view what) const;
    // Each rank writes `<ns>/<n>/<rank>` and waits for all of them: every rank has arrived.
    ELASTIC_DECL std::vector<std::string> exchange(std::string_view what, std::string payload, bool read);
    ELASTIC_DECL dist_timeout timeout_error(std::string_view what, std::uint64_t n, std::vector<int> missing);

    group_options options_;
    std::unique_ptr<basic_blocking_store_client<void>> client_;  // null for a world of 1
    std::uint64_t next_ = 0;                                     // collectives started by this rank
    std::vector<std::string> written_;                           // keys written since the last full synchronisation
};

}  // namespace dist

// group's members, out of the class so that ELASTIC_SEPARATE_COMPILATION can leave them (and the
// store client) to elastic/impl/src.hpp's file.
#if ELASTIC_DETAIL_BODIES
namespace dist {

ELASTIC_DECL group::group(group_options options) : options_(std::move(options)) {
    if (options_.world_size < 1)
        throw std::invalid_argument(fmt::format("elastic::dist::group: world_size {} is not a size (1 or more)",
                                                options_.world_size));
    if (options_.rank < 0 || options_.rank >= options_.world_size)
        throw std::invalid_argument(fmt::format("elastic::dist::group: rank {} is outside 0..{} (world size {})",
                                                options_.rank, options_.world_size - 1, options_.world_size));
    if (options_.world_size > 1) {
        store_client_options c;
        c.host = options_.host;
        c.port = options_.port;
        c.dialect = options_.dialect;
        c.timeout = options_.timeout;
        c.connect_timeout = options_.connect_timeout;
        client_ = std::make_unique<blocking_store_client>(std::move(c));
    }
}

ELASTIC_DECL group::~group() = default;

ELASTIC_DECL void group::set_timeout(std::chrono::milliseconds t) {
    options_.timeout = t;
    if (client_) client_->set_timeout(t);
}

ELASTIC_DECL void group::barrier() {
    if (options_.world_size == 1) return;
    (void)exchange("barrier", {}, false);
}

ELASTIC_DECL std::string group::broadcast(std::string bytes, int root) {
    check_rank(root, "broadcast root");
    if (options_.world_size == 1) return bytes;
    const auto n = next_++;
    const auto key = fmt::format("{}/{}/root", options_.key_namespace, n);
    if (options_.rank == root) {
        client_->set(key, bytes);
        written_.push_back(key);
        return bytes;
    }
    try {
        std::vector<std::string> keys(1, key);
        client_->wait(std::move(keys), options_.timeout);
    } catch (const store_timeout&) {
        throw timeout_error("broadcast", n, {root});
    }
    return client_->get(key);
}

ELASTIC_DECL std::vector<std::string> group::all_gather(std::string bytes) {
    if (options_.world_size == 1) return {std::move(bytes)};
    return exchange("all_gather", std::move(bytes), true);
}

ELASTIC_DECL void group::check_rank(int r, std::string_view what) const {
    if (r < 0 || r >= options_.world_size)
        throw std::invalid_argument(fmt::format("elastic::dist: {} {} is outside 0..{}", what, r,
                                                options_.world_size - 1));
}

ELASTIC_DECL std::vector<std::string> group::exchange(std::string_view what, std::string payload, bool read) {
    const auto n = next_++;
    std::vector<std::string> keys;
    keys.reserve(static_cast<std::size_t>(options_.world_size));
    for (int r = 0; r < options_.world_size; ++r) keys.push_back(fmt::format("{}/{}/{}", options_.key_namespace, n, r));
    const auto& mine = keys[static_cast<std::size_t>(options_.rank)];
    client_->set(mine, std::move(payload));
    try {
        client_->wait(keys, options_.timeout);
    } catch (const store_timeout&) {
        std::vector<int> missing;
        for (int r = 0; r < options_.world_size; ++r) {
            std::vector<std::string> one(1, keys[static_cast<std::size_t>(r)]);
            if (!client_->check(std::move(one))) missing.push_back(r);
        }
        throw timeout_error(what, n, std::move(missing));
    }
    std::vector<std::string> out;
    if (read) out = client_->multi_get(keys);
    // Every rank has written its key of collective n, so each has finished everything
    // before n: nobody reads the keys this rank wrote earlier any more.
    for (const auto& k : written_) (void)client_->delete_key(k);
    written_.clear();
    written_.push_back(mine);
    return out;
}

ELASTIC_DECL dist_timeout group::timeout_error(std::string_view what, std::uint64_t n, std::vector<int> missing) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 32; ++i) list += fmt::format("{}{}", i ? ", " : "", missing[i]);
    if (missing.size() > 32) list += fmt::format(" and {} more", missing.size() - 32);
    // The message first: the vector is moved into the exception after it.
    auto message = fmt::format("elastic::dist::{} #{} on rank {} of {}: rank{} {} did not arrive within "
                               "{} ms (exited, hung, or called the collectives in another order); "
                               "store {}:{}, keys '{}/{}/'",
                               what, n, options_.rank, options_.world_size, missing.size() == 1 ? "" : "s",
                               missing.empty() ? "?" : list, options_.timeout.count(), options_.host, options_.port,
                               options_.key_namespace, n);
    return dist_timeout(message, std::move(missing));
}

}  // namespace dist
#endif  // definitions

namespace detail::worker {

// The process-wide group of elastic::dist's free functions, built on first use.
struct dist_world {
    std::mutex mutex;
    std::optional<dist::group> world;
};

inline dist_world& dist_world_instance() {
    static dist_world s;
    return s;
}

// Runs f on the process-wide group (built from elastic::env() on first use) under its lock.
template <class F>
decltype(auto) with_dist_world(F&& f) {
    auto& s = dist_world_instance();
    const std::lock_guard lock(s.mutex);
    if (!s.world) s.world.emplace(dist::options_from(env()));
    return std::forward<F>(f)(*s.world);
}

}  // namespace detail::worker

namespace dist {

/// RANK: this worker's global rank, 0 <= rank < WORLD_SIZE (0 when started by hand).
inline int get_global_rank() { return env().rank; }
/// LOCAL_RANK: the rank on this node.
inline int get_local_rank() { return env().local_rank; }
/// WORLD_SIZE: the number of workers in the job.
inline int get_world_size() { return env().world_size; }
/// LOCAL_WORLD_SIZE: the number of workers on this node.
inline int get_local_world_size() { return env().local_world_size; }
/// GROUP_RANK (NODE_RANK): this node's rank.
inline int get_node_rank() { return env().node_rank; }

/// Waits for every rank (see group::barrier).
inline void barrier() {
    elastic::detail::worker::with_dist_world([](group& g) { g.barrier(); });
}
/// `root`'s bytes on every rank (see group::broadcast).
inline std::string broadcast(std::string bytes, int root = 0) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.broadcast(std::move(bytes), root); });
}
/// Every rank's bytes, by rank (see group::all_gather).
inline std::vector<std::string> all_gather(std::string bytes) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.all_gather(std::move(bytes)); });
}
/// A scalar combined over every rank (see group::all_reduce).
// clang-format off
template <class T>
    requires std::is_arithmetic_v<T>
T all_reduce(T value, reduce_op op = reduce_op::sum) {
    // clang-format on
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.all_reduce(value, op); });
}
/// How long the process-wide group's collectives wait for the other ranks (default 30 min).
inline void set_timeout(std::chrono::milliseconds t) {
    elastic::detail::worker::with_dist_world([&](group& g) { g.set_timeout(t); });
}

}  // namespace dist
}  // namespace elastic::inline v0
// ---- end elastic/dist.hpp ----
// ---- begin elastic/process.hpp ----
// The process layer — worker processes: spawn, await exits through pidfds, signal and stop groups.

// ---- begin elastic/process/child.hpp ----
// child_process: one spawned worker — its pidfd, its exit as an awaitable event, its pipes.

// ---- begin elastic/process/cgroup.hpp ----
// Internals: a cgroup (v2) per worker, so whatever a worker starts ends with it.

// ---- begin elastic/process/sys.hpp ----
// Internals of the process layer: an owning descriptor and the Linux calls glibc 2.36 lacks.

// ---- begin elastic/process/error.hpp ----
// The process layer's exceptions: process_error, and spawn_error with the errno of a failed spawn.


#include <string>

namespace elastic::inline v0 {

/// A failure of the process layer (a system call the agent needed failed, a misuse of a child).
class process_error : public error {
public:
    using error::error;
};

/// A program could not be started. `code()` is the errno of the step that failed (for example
/// ENOENT or EACCES from execve, reported by the child through a close-on-exec pipe), so the
/// caller sees why, not a child that exits 127.
class spawn_error : public process_error {
public:
    spawn_error(const std::string& message, int code, bool program_fault = false)
        : process_error(message), code_(code), program_fault_(program_fault) {}

    /// The errno value of the failed step.
    [[nodiscard]] int code() const noexcept { return code_; }

    /// The program itself cannot run: not found, not executable, neither a binary nor a #!
    /// script, a #! interpreter that does not exist. The user's to fix, not the machine's
    /// (false for a failure of fork, descriptors, memory or cgroups).
    [[nodiscard]] bool program_fault() const noexcept { return program_fault_; }

private:
    int code_;
    bool program_fault_;
};

}  // namespace elastic::inline v0
// ---- end elastic/process/error.hpp ----

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace elastic::inline v0::detail::process {

/// Owns one file descriptor; closes it on destruction. Move-only.
class owned_fd {
public:
    owned_fd() noexcept = default;
    explicit owned_fd(int fd) noexcept : fd_(fd) {}
    owned_fd(owned_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    owned_fd& operator=(owned_fd&& other) noexcept {
        if (this != &other) reset(std::exchange(other.fd_, -1));
        return *this;
    }
    owned_fd(const owned_fd&) = delete;
    owned_fd& operator=(const owned_fd&) = delete;
    ~owned_fd() { reset(); }

    [[nodiscard]] int get() const noexcept { return fd_; }
    [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
    int release() noexcept { return std::exchange(fd_, -1); }
    void reset(int fd = -1) noexcept {
        if (fd_ >= 0) ::close(fd_);
        fd_ = fd;
    }

private:
    int fd_ = -1;
};

/// `strerror` text for an errno value, thread-safe.
ELASTIC_DECL std::string errno_string(int err);

/// A pidfd for `pid` (always close-on-exec). glibc 2.36's <sys/pidfd.h> has no extern "C" guard
/// for C++, hence the raw system call.
ELASTIC_DECL int pidfd_open(pid_t pid) noexcept;

/// Signals the process behind a pidfd: unlike kill(pid), it cannot hit a recycled pid.
ELASTIC_DECL int pidfd_send_signal(int pidfd, int sig) noexcept;

/// waitid's P_PIDFD (Linux 5.4); glibc 2.36's idtype_t does not name it.
inline constexpr idtype_t p_pidfd = static_cast<idtype_t>(3);

/// Whether the process behind `pidfd` (our child) has exited, leaving it a zombie (WNOWAIT) so its
/// pid, and so its process-group id, cannot be reused while we may still signal the group.
/// Returns true and fills `info` when it has.
ELASTIC_DECL bool peek_exit(int pidfd, siginfo_t& info) noexcept;

/// Reaps our exited child behind `pidfd`; returns false if it has not exited yet.
ELASTIC_DECL bool reap_now(int pidfd) noexcept;

/// What every agent that spawns needs from its process-wide signal dispositions (idempotent):
/// SIGPIPE ignored, so writing to a pipe whose reader died (a worker's stdin, the watcher) is an
/// EPIPE error instead of the agent's death; and SIGCHLD not ignored, because with SIGCHLD set to
/// SIG_IGN the kernel reaps children itself and their exit status is lost to waitid.
ELASTIC_DECL void prepare_agent_signals() noexcept;

/// The soft open-files limit the process had before raise_open_files_limit (RLIM_INFINITY
/// until it is called): what a worker gets back, so it sees the limit its user set.
ELASTIC_DECL rlim_t& original_open_files_soft_limit() noexcept;

/// Raises the soft RLIMIT_NOFILE to the hard limit: a store host holds one descriptor per
/// client, and a job of many nodes and workers passes a default soft limit of 1024 long before
/// the hard one. Idempotent; returns the soft limit now in force.
ELASTIC_DECL rlim_t raise_open_files_limit() noexcept;

/// Moves `fd` to a number above 2 (close-on-exec), so a child's dup2 onto 0, 1, 2 cannot clobber
/// a descriptor it still needs when the agent runs with one of its standard streams closed.
ELASTIC_DECL owned_fd raise_above_stdio(owned_fd fd);

}  // namespace elastic::inline v0::detail::process

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::process {

ELASTIC_DECL std::string errno_string(int err) { return std::system_category().message(err); }

ELASTIC_DECL int pidfd_open(pid_t pid) noexcept { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0U)); }

ELASTIC_DECL int pidfd_send_signal(int pidfd, int sig) noexcept {
    return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0U));
}

ELASTIC_DECL bool peek_exit(int pidfd, siginfo_t& info) noexcept {
    info = siginfo_t{};
    for (;;) {
        const int rc = ::waitid(p_pidfd, static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG | WNOWAIT);
        if (rc == 0) return info.si_pid != 0;
        if (errno != EINTR) return false;
    }
}

ELASTIC_DECL bool reap_now(int pidfd) noexcept {
    siginfo_t info{};
    for (;;) {
        const int rc = ::waitid(p_pidfd, static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG);
        if (rc == 0) return info.si_pid != 0;
        if (errno != EINTR) return errno == ECHILD;  // already reaped: nothing left to do
    }
}

ELASTIC_DECL void prepare_agent_signals() noexcept {
    struct sigaction current {};
    // SIGPIPE: a dead worker's pipe is EPIPE. SIGXFSZ: a log file past `ulimit -f` is EFBIG,
    // reported as a failed log write, not the agent's death.
    for (const int sig : {SIGPIPE, SIGXFSZ}) {
        if (::sigaction(sig, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
            (current.sa_flags & SA_SIGINFO) == 0) {
            struct sigaction ignore {};
            ignore.sa_handler = SIG_IGN;
            ::sigaction(sig, &ignore, nullptr);
        }
    }
    if (::sigaction(SIGCHLD, nullptr, &current) == 0 &&
        ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_IGN)) {
        struct sigaction deflt {};
        deflt.sa_handler = SIG_DFL;
        ::sigaction(SIGCHLD, &deflt, nullptr);
    }
    if (::sigaction(SIGCHLD, nullptr, &current) == 0 && (current.sa_flags & SA_NOCLDWAIT) != 0) {
        current.sa_flags &= ~SA_NOCLDWAIT;  // same effect as SIG_IGN on our children's status
        ::sigaction(SIGCHLD, &current, nullptr);
    }
}

ELASTIC_DECL rlim_t& original_open_files_soft_limit() noexcept {
    static rlim_t soft = RLIM_INFINITY;
    return soft;
}

ELASTIC_DECL rlim_t raise_open_files_limit() noexcept {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
    if (original_open_files_soft_limit() == RLIM_INFINITY) original_open_files_soft_limit() = limit.rlim_cur;
    if (limit.rlim_cur < limit.rlim_max) {
        const rlim_t before = limit.rlim_cur;
        limit.rlim_cur = limit.rlim_max;
        if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return before;
    }
    return limit.rlim_cur;
}

ELASTIC_DECL owned_fd raise_above_stdio(owned_fd fd) {
    if (!fd || fd.get() > 2) return fd;
    const int moved = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 3);
    if (moved < 0) {
        throw process_error("cannot move descriptor " + std::to_string(fd.get()) +
                            " above 2 for a child: " + errno_string(errno) + " (raise the open-files limit)");
    }
    return owned_fd(moved);
}

}  // namespace elastic::inline v0::detail::process

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/process/sys.hpp ----

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace elastic::inline v0::detail::process {

// Why cgroups: a worker's process group holds what the worker starts, until a descendant calls
// setsid or setpgid (a daemon, a double fork, some MPI and data-loading helpers). Such a process
// survives any signal sent to the group. A cgroup holds every descendant whatever it does, and
// writing "1" to its cgroup.kill (Linux 5.14) SIGKILLs all of them at once.
//
// The layout: the agent makes one directory in its own cgroup of the v2 hierarchy,
// "elastic.<agent pid>.<random>" (mkdir is exclusive: two agents with one pid in different pid
// namespaces never share one), and one per worker in it, "w<n>". The child moves itself into its
// cgroup between fork and exec (by writing "0" to the cgroup.procs opened for it), so it has no
// descendant outside it. When the worker is reaped its cgroup is killed and removed: what the
// worker left running ends with it. When the agent dies, the watcher process kills and removes
// the agent's directory (watcher.hpp).
//
// When there is none — no cgroup2 mount, a cgroup the agent may not write (an unprivileged user
// without a delegated cgroup), a kernel without cgroup.kill — workers are contained by their
// process group alone, and `cgroups::reason()` says why.

/// The name of the cgroup.kill file, and what the kernel wants written to it.
inline constexpr const char* cgroup_kill_file = "cgroup.kill";

/// Async-signal-safe. SIGKILLs every process in the cgroup at `dir_fd` and its descendants.
inline bool cgroup_kill_at(int dir_fd) noexcept {
    const int fd = ::openat(dir_fd, cgroup_kill_file, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = ::write(fd, "1", 1) == 1;
    ::close(fd);
    return ok;
}

/// Async-signal-safe. Removes the cgroup `name` in the directory `parent_fd` and every cgroup
/// below it, deepest first (a cgroup directory is removed with rmdir, and only once it has no
/// child cgroup and no process). Returns false if one could not be removed yet (EBUSY: a
/// process is still exiting), true once `name` is gone.
inline bool cgroup_remove_tree(int parent_fd, const char* name, int depth) noexcept {
    if (::unlinkat(parent_fd, name, AT_REMOVEDIR) == 0 || errno == ENOENT) return true;
    if (depth <= 0 || (errno != EBUSY && errno != ENOTEMPTY)) return false;
    const int fd = ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT;
    alignas(8) char buffer[2048];
    for (;;) {
        const ssize_t n = ::getdents64(fd, buffer, sizeof buffer);
        if (n <= 0) break;
        for (ssize_t at = 0; at < n;) {
            const auto* entry = reinterpret_cast<const dirent64*>(buffer + at);
            at += entry->d_reclen;
            const char* child = entry->d_name;
            if (entry->d_type != DT_DIR || std::strcmp(child, ".") == 0 || std::strcmp(child, "..") == 0) continue;
            cgroup_remove_tree(fd, child, depth - 1);
        }
    }
    ::close(fd);
    return ::unlinkat(parent_fd, name, AT_REMOVEDIR) == 0 || errno == ENOENT;
}

/// One worker's cgroup, before the spawn hands it to its child_process.
struct worker_cgroup {
    std::string path;  ///< the directory
    owned_fd procs;    ///< its cgroup.procs, open for writing (above 2, close-on-exec)
};

/// The agent's cgroup directory and the workers' cgroups in it. Thread-safe.
class cgroups {
public:
    static ELASTIC_DECL cgroups& instance();

    /// The agent's directory ("…/elastic.<pid>.<random>"), made on first use; empty when there
    /// is none. It stays the agent's after disable(): workers made before still live in it.
    ELASTIC_DECL std::string root();

    /// Why the last worker got no cgroup of its own (empty while each one got one).
    ELASTIC_DECL std::string reason();

    /// The reason, the first time it is asked for after it was set; then empty (for a log line
    /// said once per agent).
    ELASTIC_DECL std::string reason_once();

    /// A new cgroup for one worker; nullopt when there is no root, cgroups were disabled, or
    /// it cannot be made (reason() says why).
    ELASTIC_DECL std::optional<worker_cgroup> make();

    /// Gives up on cgroups for the rest of the agent's life, with the reason (a child could
    /// not move itself into its cgroup).
    ELASTIC_DECL void disable(std::string why);

    /// Kills what is left in a worker's cgroup and removes it, now or, while its processes are
    /// still exiting, at a later sweep.
    ELASTIC_DECL void retire(const std::string& path) noexcept;

    /// Kills the retired cgroups again (idempotent) and removes those whose processes have
    /// exited since.
    ELASTIC_DECL void sweep() noexcept;

    cgroups(const cgroups&) = delete;
    cgroups& operator=(const cgroups&) = delete;

private:
    cgroups() = default;

    ELASTIC_DECL void probe_locked();
    ELASTIC_DECL void set_reason_locked(std::string why);
    ELASTIC_DECL void sweep_locked() noexcept;

    std::mutex mutex_;
    bool probed_ = false;
    bool enabled_ = false;
    std::string root_;
    std::string reason_;
    bool reported_ = false;
    std::uint64_t next_ = 0;
    std::vector<std::string> pending_;
};

/// A process's cgroup in the v2 hierarchy as a directory ("<cgroup2 mount><path>"), from the
/// texts of its /proc/<pid>/mountinfo and /proc/<pid>/cgroup: the cgroup2 mount whose root is
/// the cgroup or one of its ancestors (octal escapes such as \040 decoded). Empty, with `why`
/// set, when there is none — a root of "/.." (a cgroup namespace entered without a remount)
/// included.
ELASTIC_DECL std::string cgroup2_dir_from(std::string_view mountinfo, std::string_view proc_cgroup, std::string& why);

/// This process's cgroup directory (cgroup2_dir_from on its own files), checked: its
/// cgroup.procs lists this process. Empty, with `why` set, when there is none.
ELASTIC_DECL std::string own_cgroup2_dir(std::string& why);

}  // namespace elastic::inline v0::detail::process

#if ELASTIC_DETAIL_BODIES

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

namespace elastic::inline v0::detail::process {

namespace cgroup_detail {

// mountinfo escapes space, tab, newline and backslash as \ooo.
inline std::string unescape(std::string_view field) {
    std::string out;
    for (std::size_t i = 0; i < field.size(); ++i) {
        if (field[i] == '\\' && i + 3 < field.size() && field[i + 1] >= '0' && field[i + 1] <= '3' &&
            field[i + 2] >= '0' && field[i + 2] <= '7' && field[i + 3] >= '0' && field[i + 3] <= '7') {
            out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 + (field[i + 3] - '0'));
            i += 3;
        } else {
            out += field[i];
        }
    }
    return out;
}

inline std::vector<std::string_view> words(std::string_view line) {
    std::vector<std::string_view> out;
    std::size_t at = 0;
    while (at < line.size()) {
        const auto end = line.find(' ', at);
        const auto stop = end == std::string_view::npos ? line.size() : end;
        if (stop > at) out.push_back(line.substr(at, stop - at));
        at = stop + 1;
    }
    return out;
}

}  // namespace cgroup_detail

ELASTIC_DECL std::string cgroup2_dir_from(std::string_view mountinfo, std::string_view proc_cgroup, std::string& why) {
    std::string path;
    for (std::size_t at = 0; at < proc_cgroup.size();) {
        const auto end = std::min(proc_cgroup.find('\n', at), proc_cgroup.size());
        const auto line = proc_cgroup.substr(at, end - at);
        if (line.substr(0, 3) == "0::") path = std::string(line.substr(3));
        at = end + 1;
    }
    if (path.empty() || path.front() != '/') {
        why = "this process has no cgroup in a v2 hierarchy (/proc/self/cgroup has no \"0::/\" line)";
        return {};
    }
    if (path.find("/..") != std::string::npos || path.find("(deleted)") != std::string::npos) {
        why = "this process's cgroup " + path + " lies outside what its cgroup namespace shows";
        return {};
    }
    bool mounted = false;
    for (std::size_t at = 0; at < mountinfo.size();) {
        const auto end = std::min(mountinfo.find('\n', at), mountinfo.size());
        const auto line = mountinfo.substr(at, end - at);
        at = end + 1;
        // "id parent major:minor root mount-point options [optional...] - fstype source options"
        const auto fields = cgroup_detail::words(line);
        const auto dash = std::find(fields.begin(), fields.end(), std::string_view("-"));
        if (fields.size() < 5 || dash == fields.end() || dash + 1 == fields.end() || *(dash + 1) != "cgroup2") {
            continue;
        }
        mounted = true;
        const std::string root = cgroup_detail::unescape(fields[3]);
        const std::string mount_point = cgroup_detail::unescape(fields[4]);
        std::string below;  // the cgroup's path under this mount's root
        if (root == "/") {
            below = path;
        } else if (path == root) {
            below = "/";
        } else if (path.size() > root.size() && path.compare(0, root.size(), root) == 0 && path[root.size()] == '/') {
            below = path.substr(root.size());
        } else {
            continue;  // a mount of another subtree (or of "/..")
        }
        return mount_point + (below == "/" ? std::string() : below);
    }
    why = mounted ? "no cgroup2 mount shows this process's cgroup " + path : "no cgroup2 file system is mounted";
    return {};
}

ELASTIC_DECL std::string own_cgroup2_dir(std::string& why) {
    const auto slurp = [](const char* name) {
        std::ifstream file(name);
        std::ostringstream text;
        text << file.rdbuf();
        return text.str();
    };
    const std::string dir = cgroup2_dir_from(slurp("/proc/self/mountinfo"), slurp("/proc/self/cgroup"), why);
    if (dir.empty()) return dir;
    std::ifstream procs(dir + "/cgroup.procs");
    const pid_t self = ::getpid();
    for (long pid = 0; procs >> pid;) {
        if (pid == self) return dir;
    }
    why = "the cgroup " + dir + " does not list this process (a cgroup namespace or a mount of another one?)";
    return {};
}

ELASTIC_DECL cgroups& cgroups::instance() {
    static cgroups* const self = new cgroups();  // leaked: used until the very end
    return *self;
}

ELASTIC_DECL void cgroups::probe_locked() {
    if (probed_) return;
    probed_ = true;
    std::string why;
    const std::string own = own_cgroup2_dir(why);
    if (own.empty()) {
        reason_ = why;
        return;
    }
    // Exclusive: another agent with this pid (in another pid namespace), or a dead one's
    // leftover, has its own directory.
    std::random_device random;
    std::string dir;
    for (int attempt = 0;; ++attempt) {
        dir = own + "/elastic." + std::to_string(::getpid()) + "." + std::to_string(random() % 1000000);
        if (::mkdir(dir.c_str(), 0755) == 0) break;
        const int e = errno;
        if (e == EEXIST && attempt < 16) continue;
        reason_ = "cannot make the cgroup " + dir + ": " + errno_string(e) +
                  (e == EROFS                  ? " (the cgroup file system is mounted read-only)"
                   : e == EACCES || e == EPERM ? " (the agent's cgroup is not delegated to this user)"
                                               : "");
        return;
    }
    // Asked of the new directory: the root cgroup has no cgroup.kill of its own.
    struct stat st {};
    if (::stat((dir + "/" + cgroup_kill_file).c_str(), &st) != 0) {
        reason_ = "the cgroup " + dir + " has no " + cgroup_kill_file + " (it needs Linux 5.14)";
        ::rmdir(dir.c_str());
        return;
    }
    root_ = std::move(dir);
    enabled_ = true;
}

ELASTIC_DECL std::string cgroups::root() {
    std::lock_guard lock(mutex_);
    probe_locked();
    return root_;
}

ELASTIC_DECL std::string cgroups::reason() {
    std::lock_guard lock(mutex_);
    return reason_;
}

ELASTIC_DECL void cgroups::set_reason_locked(std::string why) {
    if (why == reason_) return;
    reason_ = std::move(why);
    reported_ = false;  // a new reason is said again, once
}

ELASTIC_DECL std::string cgroups::reason_once() {
    std::lock_guard lock(mutex_);
    if (reason_.empty() || reported_) return {};
    reported_ = true;
    return reason_;
}

ELASTIC_DECL std::optional<worker_cgroup> cgroups::make() {
    std::lock_guard lock(mutex_);
    probe_locked();
    sweep_locked();
    if (!enabled_) return std::nullopt;
    worker_cgroup made;
    made.path = root_ + "/w" + std::to_string(next_++);
    if (::mkdir(made.path.c_str(), 0755) != 0) {
        set_reason_locked("cannot make the cgroup " + made.path + ": " + errno_string(errno));
        return std::nullopt;
    }
    made.procs = owned_fd(::open((made.path + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!made.procs) {
        set_reason_locked("cannot open " + made.path + "/cgroup.procs: " + errno_string(errno));
        ::rmdir(made.path.c_str());
        return std::nullopt;
    }
    made.procs = raise_above_stdio(std::move(made.procs));
    return made;
}

ELASTIC_DECL void cgroups::disable(std::string why) {
    // The root stays: workers made before may live in it, and the watcher removes it at the end.
    std::lock_guard lock(mutex_);
    enabled_ = false;
    set_reason_locked(std::move(why));
}

ELASTIC_DECL void cgroups::retire(const std::string& path) noexcept {
    if (path.empty()) return;
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        cgroup_kill_at(fd);
        ::close(fd);
    }
    std::lock_guard lock(mutex_);
    try {
        pending_.push_back(path);
    } catch (...) {
        return;  // out of memory: the directory stays until the agent exits (the watcher)
    }
    sweep_locked();
}

ELASTIC_DECL void cgroups::sweep() noexcept {
    std::lock_guard lock(mutex_);
    sweep_locked();
}

ELASTIC_DECL void cgroups::sweep_locked() noexcept {
    for (auto it = pending_.begin(); it != pending_.end();) {
        // Killed again first: retire() may have failed to open it (out of descriptors, say).
        if (const int dir = ::open(it->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
            cgroup_kill_at(dir);
            ::close(dir);
        }
        const auto slash = it->rfind('/');
        const std::string parent = it->substr(0, slash);
        const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        const bool gone = fd < 0 ? errno == ENOENT : cgroup_remove_tree(fd, it->c_str() + slash + 1, 8);
        if (fd >= 0) ::close(fd);
        it = gone ? pending_.erase(it) : it + 1;
    }
}

}  // namespace elastic::inline v0::detail::process

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/process/cgroup.hpp ----
// ---- begin elastic/process/exit.hpp ----
// How a process ended (exit_status: its code or signal, its numbers and its description) and
// when the agent saw it end (process_exit: the status with the pid and two timestamps).

// ---- begin elastic/process/signal_name.hpp ----
// Names of Linux signals (the one table), the signals an agent can forward, and torchrun's
// "Signal N (SIGNAME) received by PID p" message.


#include <algorithm>
#include <array>
#include <cctype>
#include <csignal>
#include <iterator>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace elastic::inline v0 {

/// The name Python's `signal.Signals(n).name` gives signal `n` on Linux ("SIGKILL" for 9), so a
/// summary reads like torchrun's. Real-time signals Python does not name are spelled the way
/// glibc's `kill -l` does ("SIGRTMIN+3", "SIGRTMAX-2"). Numbers that are no signal (0, 32 and 33,
/// which glibc keeps for itself, negatives, anything past SIGRTMAX) give "<N/A>", torchrun's
/// placeholder, instead of failing.
namespace detail::process {
// Indexed by number; Linux x86-64/arm64 numbering (the only platform elastic supports).
inline constexpr std::string_view standard_signal_names[] = {
    "",          "SIGHUP",  "SIGINT",    "SIGQUIT", "SIGILL",   "SIGTRAP", "SIGABRT", "SIGBUS",
    "SIGFPE",    "SIGKILL", "SIGUSR1",   "SIGSEGV", "SIGUSR2",  "SIGPIPE", "SIGALRM", "SIGTERM",
    "SIGSTKFLT", "SIGCHLD", "SIGCONT",   "SIGSTOP", "SIGTSTP",  "SIGTTIN", "SIGTTOU", "SIGURG",
    "SIGXCPU",   "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO",   "SIGPWR",  "SIGSYS"};
}  // namespace detail::process

ELASTIC_DECL std::string signal_name(int signal_number);

/// The number of the signal that signal_name() spells `name`, in any case ("SIGTERM",
/// "sigrtmin+3"), or 0.
[[nodiscard]] ELASTIC_DECL int signal_number(std::string_view name);

/// Signals an agent can trap and forward to its workers (`--signals-to-handle`). SIGKILL and
/// SIGSTOP cannot be trapped, SIGCHLD is how the agent learns of exits, and fault signals (SEGV,
/// BUS, ...) are the agent's own.
inline constexpr std::array<int, 16> forwardable_signal_numbers{SIGHUP,  SIGINT,  SIGQUIT, SIGTERM,   SIGUSR1, SIGUSR2,
                                                                SIGALRM, SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF, SIGWINCH,
                                                                SIGURG,  SIGCONT, SIGTSTP, SIGPWR};

/// The name of a signal as `--signals-to-handle` writes it (`SIGTERM`), or its number.
[[nodiscard]] ELASTIC_DECL std::string signal_to_string(int number);

/// torchrun's message for a worker killed by a signal (its ProcessFailure's):
/// `Signal 9 (SIGKILL) received by PID 1234`.
ELASTIC_DECL std::string signal_message(int signal_number, long pid);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL std::string signal_name(int signal_number) {
    constexpr int standard_count = static_cast<int>(std::size(detail::process::standard_signal_names));
    if (signal_number >= 1 && signal_number < standard_count) {
        return std::string(detail::process::standard_signal_names[signal_number]);
    }
    // SIGRTMIN/SIGRTMAX are glibc function calls (34 and 64 here: NPTL keeps 32 and 33).
    const int rt_min = SIGRTMIN;
    const int rt_max = SIGRTMAX;
    if (signal_number < rt_min || signal_number > rt_max) {
        return "<N/A>";
    }
    if (signal_number == rt_min) {
        return "SIGRTMIN";
    }
    if (signal_number == rt_max) {
        return "SIGRTMAX";
    }
    // kill -l's split: the lower half counts up from SIGRTMIN, the upper half down from SIGRTMAX.
    if (signal_number - rt_min <= (rt_max - rt_min) / 2) {
        return fmt::format("SIGRTMIN+{}", signal_number - rt_min);
    }
    return fmt::format("SIGRTMAX-{}", rt_max - signal_number);
}

[[nodiscard]] ELASTIC_DECL int signal_number(std::string_view name) {
    const auto same = [](std::string_view a, std::string_view b) {
        return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
                   return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
               });
    };
    const int last = SIGRTMAX;
    for (int n = 1; n <= last; ++n) {
        if (same(signal_name(n), name)) return n;
    }
    return 0;
}

[[nodiscard]] ELASTIC_DECL std::string signal_to_string(int number) {
    for (const int s : forwardable_signal_numbers) {
        if (s == number) return signal_name(number);
    }
    return std::to_string(number);
}

ELASTIC_DECL std::string signal_message(int signal_number, long pid) {
    return fmt::format("Signal {} ({}) received by PID {}", signal_number, signal_name(signal_number), pid);
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/process/signal_name.hpp ----

#include <chrono>
#include <climits>
#include <csignal>
#include <string>

#include <sys/types.h>
#include <sys/wait.h>

namespace elastic::inline v0 {

/// How a process ended: it exited with a code, or a signal killed it (perhaps dumping core).
/// Every layer uses this one value: the process layer fills it from waitid, a failure report
/// prints it, a restart policy matches it against exit-code sets.
///
/// Its numbers, and the one rule for numbers that cannot be what they stand for:
///   - returncode(): Python's `Popen.returncode`, what torchrun's summary prints as "exitcode" and
///     an error file's errorCode holds: the code, or -N for signal N (INT_MAX for INT_MIN, whose
///     negation would overflow);
///   - shell_code(): the shell's convention, which elasticrun exits with: the code, or 128 + N
///     for signal N; 255 when N is no signal number a shell could report (N <= 0 or N >= 127), so
///     the sum can neither overflow nor read as an exit code.
struct exit_status {
    enum class kind { exited, signaled };

    kind how = kind::exited;
    /// The exit code (0..255) when `how == exited`, the signal number when `how == signaled`.
    int value = 0;
    /// The signal produced a core dump (only ever true when signaled).
    bool core_dumped = false;

    static constexpr exit_status from_exit_code(int code) noexcept { return {kind::exited, code, false}; }
    static constexpr exit_status from_signal(int signal_number, bool core_dumped = false) noexcept {
        return {kind::signaled, signal_number, core_dumped};
    }
    /// From a waitpid() status word.
    static exit_status from_wait_status(int status) noexcept {
        if (WIFSIGNALED(status)) return from_signal(WTERMSIG(status), WCOREDUMP(status) != 0);
        return from_exit_code(WIFEXITED(status) ? WEXITSTATUS(status) : status);
    }
    /// From waitid()'s siginfo (what a pidfd wait gives): si_code CLD_EXITED, or CLD_KILLED /
    /// CLD_DUMPED, and si_status.
    static constexpr exit_status from_siginfo(int code, int status_or_signal) noexcept {
        return code == CLD_EXITED ? from_exit_code(status_or_signal)
                                  : from_signal(status_or_signal, code == CLD_DUMPED);
    }
    static exit_status from_siginfo(const siginfo_t& info) noexcept {
        return from_siginfo(info.si_code, info.si_status);
    }

    /// The process called exit (or returned from main).
    [[nodiscard]] constexpr bool exited() const noexcept { return how == kind::exited; }
    /// A signal ended the process.
    [[nodiscard]] constexpr bool signaled() const noexcept { return how == kind::signaled; }
    /// Exited with code 0.
    [[nodiscard]] constexpr bool success() const noexcept { return how == kind::exited && value == 0; }
    /// The exit code, or -1 when a signal ended the process.
    [[nodiscard]] constexpr int code() const noexcept { return exited() ? value : -1; }
    /// The terminating signal, or 0 when the process exited.
    [[nodiscard]] constexpr int signal() const noexcept { return signaled() ? value : 0; }

    /// torchrun's number (Popen.returncode): the code, or -N for signal N.
    [[nodiscard]] constexpr int returncode() const noexcept {
        if (exited()) return value;
        return value == INT_MIN ? INT_MAX : -value;
    }
    /// The shell's number: the code, or 128 + N for signal N (255 for no signal number).
    [[nodiscard]] constexpr int shell_code() const noexcept {
        if (exited()) return value;
        return value <= 0 || value >= 127 ? 255 : 128 + value;
    }

    /// The one text for an ending, which every log line and message uses: "exited with code 3",
    /// "killed by signal 9 (SIGKILL)", "killed by signal 6 (SIGABRT), core dumped". (Failure
    /// reports in torchrun's layout keep torchrun's own wording: see report/failure.hpp.)
    [[nodiscard]] std::string describe() const {
        if (exited()) return "exited with code " + std::to_string(value);
        std::string text = "killed by signal " + std::to_string(value) + " (" + signal_name(value) + ")";
        if (core_dumped) text += ", core dumped";
        return text;
    }

    friend constexpr bool operator==(const exit_status&, const exit_status&) = default;
};

/// A process's end as the agent observed it: its pid, how it ended, and when the agent saw it
/// (its pidfd became readable), on both clocks: `steady_time` orders failures within one agent,
/// `system_time` is what a failure report prints and compares across hosts.
struct process_exit {
    pid_t pid = 0;                                        ///< the process id
    exit_status status;                                   ///< how it ended
    std::chrono::steady_clock::time_point steady_time{};  ///< when seen, monotonic
    std::chrono::system_clock::time_point system_time{};  ///< when seen, wall clock

    /// The exit waitid reported, stamped now.
    static process_exit from_siginfo(const siginfo_t& info) {
        process_exit observed;
        observed.pid = info.si_pid;
        observed.status = exit_status::from_siginfo(info);
        observed.steady_time = std::chrono::steady_clock::now();
        observed.system_time = std::chrono::system_clock::now();
        return observed;
    }
};

}  // namespace elastic::inline v0
// ---- end elastic/process/exit.hpp ----
// ---- begin elastic/process/watcher.hpp ----
// Internals: the watcher process that SIGKILLs every worker process group when the agent dies.

// ---- begin elastic/process/spawner.hpp ----
// Internals: the one thread that forks every child, so PR_SET_PDEATHSIG means "the agent died".


#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>

#include <pthread.h>

namespace elastic::inline v0::detail::process {

/// Runs callables on a dedicated thread that lives as long as the process.
///
/// Why a thread of our own: PR_SET_PDEATHSIG fires when the *thread* that forked the child exits,
/// not the process (that is how Linux defines it). Forking on the caller's thread would tie every
/// worker's life to whichever thread happened to call spawn — an io_context thread of a pool that
/// shrinks, a std::thread the user joins — and the workers would be SIGKILLed when it ends. This
/// thread is started on first use, detached and never stopped, so it ends only with the process:
/// the parent death signal then means exactly "the agent died".
///
/// The thread blocks every signal, so it never runs a signal handler (Asio's included), and the
/// children it forks start with every signal blocked: a signal that arrives between fork and exec
/// stays pending until the child has reset the dispositions, and then acts by default instead of
/// running the agent's handler in the child.
///
/// The object is deliberately leaked: a detached thread must never touch a destroyed mutex during
/// static destruction at exit.
class spawner {
public:
    static ELASTIC_DECL spawner& instance();

    /// Runs `f()` on the spawner thread and returns when it has returned. Callers are serialized.
    template <class F>
    void run(F& f) {
        std::lock_guard serial(callers_);
        std::unique_lock lock(mutex_);
        job_ = [](void* arg) { (*static_cast<F*>(arg))(); };
        arg_ = &f;
        done_ = false;
        cv_.notify_all();
        cv_.wait(lock, [this] { return done_; });
    }

    spawner(const spawner&) = delete;
    spawner& operator=(const spawner&) = delete;

private:
    spawner() {
        // Start the thread with every signal blocked (it inherits the creator's mask), then give
        // the creating thread its own mask back.
        sigset_t all;
        sigset_t old;
        ::sigfillset(&all);
        ::pthread_sigmask(SIG_SETMASK, &all, &old);
        try {
            std::thread(&spawner::loop, this).detach();
        } catch (...) {
            ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
            throw;
        }
        ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    }

    ELASTIC_DECL void loop();

    std::mutex callers_;
    std::mutex mutex_;
    std::condition_variable cv_;
    void (*job_)(void*) = nullptr;
    void* arg_ = nullptr;
    bool done_ = false;
};

}  // namespace elastic::inline v0::detail::process

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::process {

ELASTIC_DECL spawner& spawner::instance() {
    static spawner* const self = new spawner();  // leaked on purpose, see above
    return *self;
}

ELASTIC_DECL void spawner::loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
        cv_.wait(lock, [this] { return job_ != nullptr; });
        job_(arg_);
        job_ = nullptr;
        done_ = true;
        cv_.notify_all();
    }
}

}  // namespace elastic::inline v0::detail::process

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/process/spawner.hpp ----

#include <algorithm>
#include <array>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

namespace elastic::inline v0::detail::process {

// Why a watcher process: PR_SET_PDEATHSIG kills the worker when the agent dies, but it is not
// inherited, so a worker's own children (wrapper scripts, data-loader processes) would survive an
// agent killed with SIGKILL; cgroup.kill is not available here, and a subreaper dies with the
// agent. So the first spawn forks a tiny process that holds one end of a Unix socket pair whose
// other end only the agent holds (close-on-exec, and every child closes descriptors above 2).
// The agent sends "add pgid" / "remove pgid" records on it; when the agent dies — however — the
// kernel closes its end, the watcher reads EOF, sends SIGKILL to every process group still
// registered and exits. It then dies with the agent by construction. (A socket rather than a
// pipe: send(MSG_NOSIGNAL) reports a dead watcher as EPIPE whatever the agent's SIGPIPE
// disposition is.)
//
// Where the agent has a cgroup directory (cgroup.hpp), the watcher also kills it and everything
// below it on EOF, and removes the directories: that reaches the descendants that left their
// worker's process group (setsid, setpgid). Without one, those are out of reach.
//
// Limits, on purpose: a group id is removed before the agent reaps the group's leader (whose zombie
// keeps the id reserved until then), so the watcher never holds an id that the kernel may hand
// to an unrelated process — except in the instant between the agent's death and the watcher's
// kill, when init may reap a leader whose number then has to be reused at once, a full wrap of
// pid_max (4 Mi on 64-bit) within microseconds.

/// One record on the watcher socket: 8 bytes, each sent whole by one send.
struct watcher_record {
    std::int32_t op;    ///< watcher_add or watcher_remove
    std::int32_t pgid;  ///< the process group
};
inline constexpr std::int32_t watcher_add = 1;
inline constexpr std::int32_t watcher_remove = 2;

/// How many worker process groups may be registered at once.
inline constexpr std::size_t watcher_capacity = 8192;

/// The watcher's whole life, in the forked child. Only async-signal-safe calls: the agent is
/// multithreaded, so after fork any lock (malloc's included) may be held by a thread that no
/// longer exists here. `table` and `buffer` were allocated by the parent before the fork.
/// `cgroup_parent` and `cgroup_name` name the agent's cgroup directory (nullptr: none).
[[noreturn]] inline void watcher_main(int read_end, pid_t* table, std::size_t capacity, unsigned char* buffer,
                                      std::size_t buffer_size, int max_fd, const char* cgroup_parent,
                                      const char* cgroup_name) noexcept {
    // Own session: a Ctrl-C or a kill aimed at the agent's process group must not end the
    // watcher before it has done its job, and no terminal hangup reaches it.
    ::setsid();
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM, SIGTSTP, SIGTTIN, SIGTTOU}) {
        ::sigaction(sig, &ignore, nullptr);
    }
    ::prctl(PR_SET_NAME, "elastic-watch", 0, 0, 0);
    if (::chdir("/") != 0) { /* keep going: only a mount point stays pinned */
    }
    // Keep nothing but the socket: not the agent's sockets (a port would stay bound), not its
    // stdout (a reader of the agent's output would never see EOF).
    if (::close_range(0, static_cast<unsigned>(read_end - 1), 0) != 0 ||
        ::close_range(static_cast<unsigned>(read_end + 1), ~0U, 0) != 0) {
        for (int fd = 0; fd < max_fd; ++fd) {
            if (fd != read_end) ::close(fd);
        }
    }
    std::size_t have = 0;
    for (;;) {
        const ssize_t n = ::read(read_end, buffer + have, buffer_size - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // EOF: the agent is gone (or the socket broke, same verdict)
        have += static_cast<std::size_t>(n);
        std::size_t used = 0;
        for (; have - used >= sizeof(watcher_record); used += sizeof(watcher_record)) {
            watcher_record record;
            std::memcpy(&record, buffer + used, sizeof record);
            if (record.op == watcher_add) {
                for (std::size_t i = 0; i < capacity; ++i) {
                    if (table[i] == 0) {
                        table[i] = record.pgid;
                        break;
                    }
                }
            } else if (record.op == watcher_remove) {
                for (std::size_t i = 0; i < capacity; ++i) {
                    if (table[i] == record.pgid) {
                        table[i] = 0;
                        break;
                    }
                }
            }
        }
        std::memmove(buffer, buffer + used, have - used);
        have -= used;
    }
    for (std::size_t i = 0; i < capacity; ++i) {
        if (table[i] > 0) ::kill(-table[i], SIGKILL);
    }
    const int parent = cgroup_parent == nullptr ? -1 : ::open(cgroup_parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent >= 0) {
        const int dir = ::openat(parent, cgroup_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir >= 0) {
            cgroup_kill_at(dir);
            ::close(dir);
        }
        // The killed processes leave their cgroups within microseconds, unless one sleeps
        // uninterruptibly (a device driver finishing a DMA, a dead network file system): try
        // every 10 ms for a second, then every second for 10 minutes — the watcher has nothing
        // else to do — then leave the directories to the system.
        for (int attempt = 0; attempt < 700 && !cgroup_remove_tree(parent, cgroup_name, 8); ++attempt) {
            const timespec pause{attempt < 100 ? 0 : 1, attempt < 100 ? 10'000'000 : 0};
            ::nanosleep(&pause, nullptr);
        }
    }
    ::_exit(0);
}

/// The agent's side of the watcher: starts it on first use, registers and retires groups,
/// restarts it (re-registering every live group) if someone killed it.
class watcher {
public:
    static ELASTIC_DECL watcher& instance();

    /// Starts the watcher if it is not running; returns its pid.
    ELASTIC_DECL pid_t ensure_started();

    /// Registers a worker's process group: it is SIGKILLed if the agent dies.
    ELASTIC_DECL void add(pid_t pgid);

    /// Retires a group. Call it before reaping the group's leader, whose zombie keeps the id
    /// reserved until then.
    ELASTIC_DECL void remove(pid_t pgid) noexcept;

    watcher(const watcher&) = delete;
    watcher& operator=(const watcher&) = delete;

private:
    watcher() = default;

    ELASTIC_DECL void start_locked();

    // Returns false if the watcher is gone (EPIPE). MSG_NOSIGNAL: no SIGPIPE, whatever the
    // agent's disposition.
    ELASTIC_DECL bool write_locked(std::int32_t op, pid_t pgid);

    ELASTIC_DECL void send_locked(std::int32_t op, pid_t pgid);

    std::mutex mutex_;
    owned_fd write_end_;
    pid_t pid_ = -1;
    std::vector<pid_t> groups_;
};

}  // namespace elastic::inline v0::detail::process

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::process {

ELASTIC_DECL watcher& watcher::instance() {
    static watcher* const self = new watcher();  // leaked: used until the very end
    return *self;
}

ELASTIC_DECL pid_t watcher::ensure_started() {
    std::lock_guard lock(mutex_);
    if (pid_ <= 0) start_locked();
    return pid_;
}

ELASTIC_DECL void watcher::add(pid_t pgid) {
    std::lock_guard lock(mutex_);
    if (groups_.size() >= watcher_capacity) {
        throw process_error("cannot watch process group " + std::to_string(pgid) + ": " +
                            std::to_string(watcher_capacity) +
                            " worker process groups are already registered (stop some first)");
    }
    groups_.push_back(pgid);
    try {
        send_locked(watcher_add, pgid);
    } catch (...) {
        groups_.pop_back();  // the caller kills and reaps the child: forget its id now
        throw;
    }
}

ELASTIC_DECL void watcher::remove(pid_t pgid) noexcept {
    std::lock_guard lock(mutex_);
    const auto it = std::find(groups_.begin(), groups_.end(), pgid);
    if (it == groups_.end()) return;
    groups_.erase(it);
    try {
        send_locked(watcher_remove, pgid);
    } catch (...) {
        // The watcher cannot be told; keeping a stale id is the lesser harm, because the
        // group's leader is still unreaped when this is called.
    }
}

ELASTIC_DECL void watcher::start_locked() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
        throw process_error("cannot create the watcher socket: " + errno_string(errno) +
                            " (raise the open-files limit)");
    }
    owned_fd read_end = raise_above_stdio(owned_fd(fds[0]));
    owned_fd write_end(fds[1]);
    // Everything the child touches is allocated here, before the fork.
    std::vector<pid_t> table(watcher_capacity, 0);
    std::vector<unsigned char> buffer(sizeof(watcher_record) * 512);
    const std::string cgroup = cgroups::instance().root();
    const std::string cgroup_parent = cgroup.substr(0, cgroup.rfind('/'));
    const std::string cgroup_name = cgroup.substr(cgroup.rfind('/') + 1);
    rlimit limit{};
    int max_fd = 1024;
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
        max_fd = static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 20));
    }
    pid_t pid = -1;
    int fork_errno = 0;
    const int rfd = read_end.get();
    auto job = [&] {
        pid = ::fork();
        if (pid == 0) {
            watcher_main(rfd, table.data(), table.size(), buffer.data(), buffer.size(), max_fd,
                         cgroup.empty() ? nullptr : cgroup_parent.c_str(), cgroup_name.c_str());
        }
        if (pid < 0) fork_errno = errno;
    };
    spawner::instance().run(job);
    if (pid < 0) {
        throw process_error("cannot fork the watcher process: " + errno_string(fork_errno) +
                            " (check the process limit, ulimit -u)");
    }
    pid_ = pid;
    write_end_ = std::move(write_end);
    for (pid_t group : groups_) write_locked(watcher_add, group);
}

ELASTIC_DECL bool watcher::write_locked(std::int32_t op, pid_t pgid) {
    const watcher_record record{op, static_cast<std::int32_t>(pgid)};
    for (;;) {
        const ssize_t n = ::send(write_end_.get(), &record, sizeof record, MSG_NOSIGNAL);
        if (n == static_cast<ssize_t>(sizeof record)) return true;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return false;
        throw process_error("cannot write to the watcher socket: " + errno_string(n < 0 ? errno : EIO));
    }
}

ELASTIC_DECL void watcher::send_locked(std::int32_t op, pid_t pgid) {
    if (pid_ <= 0) start_locked();  // start_locked registers groups_, op already applied
    else if (!write_locked(op, pgid)) {
        // Someone killed the watcher: reap it and start another, which learns every live
        // group. (Only the next record notices; the restart re-sends every group.)
        write_end_.reset();
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        start_locked();
    }
}

}  // namespace elastic::inline v0::detail::process

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/process/watcher.hpp ----

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/use_awaitable.hpp>

#include <csignal>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include <signal.h>
#include <sys/types.h>

namespace elastic::inline v0 {

namespace detail::process {

/// Children whose child_process was destroyed while they still ran: they were sent SIGKILL and
/// are reaped here, without blocking anyone, at the next spawn or destruction.
class graveyard {
public:
    static ELASTIC_DECL graveyard& instance();

    ELASTIC_DECL void bury(pid_t pid, owned_fd pidfd);

    ELASTIC_DECL void sweep();

private:
    struct grave {
        pid_t pid;
        owned_fd pidfd;
    };

    ELASTIC_DECL void sweep_locked() noexcept;

    std::mutex mutex_;
    std::list<grave> graves_;
};

class child_process_factory;

}  // namespace detail::process

/// One worker process started by `spawn` (spawn.hpp): the leader of its own process group (and by
/// default its own session), whose exit is an awaitable event on its pidfd.
///
/// Lifetime of the pid: the exit is observed without reaping (`waitid(WNOWAIT)`): the leader
/// stays a zombie, which keeps its pid — the group's id — from being reused, so signalling the
/// group stays safe until `reap()` (or `stop()`, group.hpp, or the destructor) releases it.
///
/// Destroying a child_process that has not been reaped sends SIGKILL to its group: nothing is
/// orphaned by forgetting a worker. A still-running one is then reaped later, without blocking.
///
/// Not thread-safe: use one child_process from one strand. Move-only.
class child_process {
public:
    child_process(child_process&& other) noexcept
        : pid_(std::exchange(other.pid_, -1)),
          reaped_(std::exchange(other.reaped_, true)),
          pidfd_(std::move(other.pidfd_)),
          status_(std::move(other.status_)),
          stdin_(std::move(other.stdin_)),
          stdout_(std::move(other.stdout_)),
          stderr_(std::move(other.stderr_)),
          cgroup_(std::move(other.cgroup_)) {}

    ELASTIC_DECL child_process& operator=(child_process&& other) noexcept;

    child_process(const child_process&) = delete;
    child_process& operator=(const child_process&) = delete;

    ~child_process() { abandon(); }

    /// The process id.
    [[nodiscard]] pid_t pid() const noexcept { return pid_; }
    /// Its process-group id: the worker leads its own group, so this is its pid.
    [[nodiscard]] pid_t pgid() const noexcept { return pid_; }

    /// The exit, once observed (by `wait`, `check_exit`, `wait_any` or `stop`).
    [[nodiscard]] const std::optional<process_exit>& status() const noexcept { return status_; }
    /// Whether the leader has been reaped: its pid is free, the group can no longer be signalled.
    [[nodiscard]] bool reaped() const noexcept { return reaped_; }

    /// The worker's own cgroup directory (spawn_options::own_cgroup), killed and removed when it
    /// is reaped; empty when its process group alone contains it.
    [[nodiscard]] const std::string& cgroup() const noexcept { return cgroup_; }

    /// Without waiting: records the exit if it has happened. Returns whether it has.
    ELASTIC_DECL bool check_exit();

    /// Awaits the exit (an event on the pidfd: no polling, no SIGCHLD handler) and returns it.
    /// Returns at once if it was already observed. Cancellable (Asio per-operation cancellation).
    template <class Defer = void>
    asio::awaitable<process_exit> wait() {
        if (pid_ <= 0) throw process_error("cannot wait for a moved-from child_process");
        while (!check_exit()) {
            if (reaped_)
                throw process_error("cannot wait for pid " + std::to_string(pid_) +
                                    ": it was reaped before its exit was observed");
            co_await pidfd_.async_wait(asio::posix::descriptor_base::wait_read, detail::use_awaitable<Defer>);
        }
        co_return *status_;
    }

    /// Sends `sig` to the leader only, through its pidfd (never a recycled pid). Returns false if
    /// it has already exited (a zombie would accept the signal and ignore it).
    ELASTIC_DECL bool signal(int sig);

    /// Sends `sig` to the whole process group (the worker and the descendants that stayed in
    /// it). Safe against pid reuse because the leader is not reaped yet. Returns false if no
    /// process is left in the group, or the leader was already reaped.
    ELASTIC_DECL bool signal_group(int sig);

    /// Releases an exited worker: SIGKILLs whatever is left in its group and its cgroup (the
    /// worker is over, and so is what it started), retires the group from the watcher, and reaps
    /// the leader. Throws if it is still running.
    ELASTIC_DECL void reap();

    /// The write end of the worker's stdin pipe, when spawned with `stdio::pipe()` for stdin.
    std::optional<asio::posix::stream_descriptor> take_stdin() { return take(stdin_); }
    /// The read end of the worker's stdout pipe, when spawned with `stdio::pipe()` for stdout.
    std::optional<asio::posix::stream_descriptor> take_stdout() { return take(stdout_); }
    /// The read end of the worker's stderr pipe, when spawned with `stdio::pipe()` for stderr.
    std::optional<asio::posix::stream_descriptor> take_stderr() { return take(stderr_); }

    /// The pidfd, for composing waits (it becomes readable when the process exits).
    [[nodiscard]] int native_pidfd() noexcept { return pidfd_.native_handle(); }

    /// The executor the child's descriptors are bound to.
    [[nodiscard]] asio::any_io_executor get_executor() noexcept { return pidfd_.get_executor(); }

private:
    friend class detail::process::child_process_factory;

    child_process(asio::posix::stream_descriptor pidfd, pid_t pid, std::optional<asio::posix::stream_descriptor> in,
                  std::optional<asio::posix::stream_descriptor> out, std::optional<asio::posix::stream_descriptor> err,
                  std::string cgroup) noexcept
        : pid_(pid),
          reaped_(false),
          pidfd_(std::move(pidfd)),
          stdin_(std::move(in)),
          stdout_(std::move(out)),
          stderr_(std::move(err)),
          cgroup_(std::move(cgroup)) {}

    static ELASTIC_DECL std::optional<asio::posix::stream_descriptor> take(
        std::optional<asio::posix::stream_descriptor>& slot);

    ELASTIC_DECL void abandon() noexcept;

    pid_t pid_ = -1;
    bool reaped_ = true;
    asio::posix::stream_descriptor pidfd_;
    std::optional<process_exit> status_;
    std::optional<asio::posix::stream_descriptor> stdin_;
    std::optional<asio::posix::stream_descriptor> stdout_;
    std::optional<asio::posix::stream_descriptor> stderr_;
    std::string cgroup_;
};

namespace detail::process {

/// The one place that builds child_process objects (spawn.hpp).
class child_process_factory {
public:
    static child_process make(asio::posix::stream_descriptor pidfd, pid_t pid,
                              std::optional<asio::posix::stream_descriptor> in,
                              std::optional<asio::posix::stream_descriptor> out,
                              std::optional<asio::posix::stream_descriptor> err, std::string cgroup) {
        return child_process(std::move(pidfd), pid, std::move(in), std::move(out), std::move(err), std::move(cgroup));
    }
};

}  // namespace detail::process

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL child_process& child_process::operator=(child_process&& other) noexcept {
    if (this != &other) {
        abandon();
        pid_ = std::exchange(other.pid_, -1);
        reaped_ = std::exchange(other.reaped_, true);
        pidfd_ = std::move(other.pidfd_);
        status_ = std::move(other.status_);
        stdin_ = std::move(other.stdin_);
        stdout_ = std::move(other.stdout_);
        stderr_ = std::move(other.stderr_);
        cgroup_ = std::move(other.cgroup_);
    }
    return *this;
}

ELASTIC_DECL bool child_process::check_exit() {
    if (status_) return true;
    if (pid_ <= 0 || reaped_) return false;
    siginfo_t info;
    if (!detail::process::peek_exit(pidfd_.native_handle(), info)) return false;
    status_ = process_exit::from_siginfo(info);
    return true;
}

ELASTIC_DECL bool child_process::signal(int sig) {
    if (pid_ <= 0 || reaped_ || check_exit()) return false;
    if (detail::process::pidfd_send_signal(pidfd_.native_handle(), sig) == 0) return true;
    if (errno == ESRCH) return false;
    throw process_error("cannot send " + signal_name(sig) + " to pid " + std::to_string(pid_) + ": " +
                        detail::process::errno_string(errno));
}

ELASTIC_DECL bool child_process::signal_group(int sig) {
    if (pid_ <= 0 || reaped_) return false;
    if (::kill(-pid_, sig) == 0) return true;
    if (errno == ESRCH) return false;
    throw process_error("cannot send " + signal_name(sig) + " to process group " + std::to_string(pid_) + ": " +
                        detail::process::errno_string(errno));
}

ELASTIC_DECL void child_process::reap() {
    if (pid_ <= 0 || reaped_) return;
    if (!check_exit()) {
        throw process_error("cannot reap pid " + std::to_string(pid_) +
                            ": it is still running (await wait() or stop() it first)");
    }
    ::kill(-pid_, SIGKILL);
    detail::process::cgroups::instance().retire(std::exchange(cgroup_, {}));
    detail::process::watcher::instance().remove(pid_);  // before the reap frees the group id
    detail::process::reap_now(pidfd_.native_handle());
    reaped_ = true;
    asio::error_code ignored;
    pidfd_.close(ignored);
}

ELASTIC_DECL std::optional<asio::posix::stream_descriptor> child_process::take(
    std::optional<asio::posix::stream_descriptor>& slot) {
    std::optional<asio::posix::stream_descriptor> out;
    out.swap(slot);
    return out;
}

ELASTIC_DECL void child_process::abandon() noexcept {
    if (pid_ <= 0 || reaped_) return;
    try {
        if (check_exit()) {
            reap();
        } else {
            ::kill(-pid_, SIGKILL);  // the leader is unreaped: the group id is still ours
            detail::process::cgroups::instance().retire(std::exchange(cgroup_, {}));
            detail::process::graveyard::instance().bury(pid_, detail::process::owned_fd(pidfd_.release()));
        }
    } catch (...) {
        // Out of memory in the graveyard: the zombie stays, the group is already killed.
    }
    reaped_ = true;
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::process {

ELASTIC_DECL graveyard& graveyard::instance() {
    static graveyard* const self = new graveyard();  // leaked: see spawner
    return *self;
}

ELASTIC_DECL void graveyard::bury(pid_t pid, owned_fd pidfd) {
    std::lock_guard lock(mutex_);
    graves_.push_back({pid, std::move(pidfd)});
    sweep_locked();
}

ELASTIC_DECL void graveyard::sweep() {
    std::lock_guard lock(mutex_);
    sweep_locked();
}

ELASTIC_DECL void graveyard::sweep_locked() noexcept {
    for (auto it = graves_.begin(); it != graves_.end();) {
        siginfo_t info;
        if (peek_exit(it->pidfd.get(), info)) {
            watcher::instance().remove(it->pid);  // before the reap, which frees the pgid
            reap_now(it->pidfd.get());
            it = graves_.erase(it);
        } else {
            ++it;
        }
    }
}

}  // namespace detail::process
}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/process/child.hpp ----
// ---- begin elastic/process/group.hpp ----
// Groups of workers: await the first exit among many, and stop them all (signal, grace, SIGKILL).


#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

namespace elastic::inline v0 {

namespace detail::process {

/// Many pidfds awaited as one event source: a private epoll instance (level-triggered) holding
/// them, itself awaited as one descriptor by Asio. Each exit is seen when it happens, not when
/// a sequential wait reaches it, so exit times stay exact.
class exit_set {
public:
    explicit exit_set(const asio::any_io_executor& executor) : epoll_(executor) {
        const int fd = ::epoll_create1(EPOLL_CLOEXEC);
        if (fd < 0) throw process_error("cannot create an epoll instance: " + errno_string(errno));
        epoll_.assign(fd);
    }

    /// Watches `pidfd` (borrowed: it must outlive the watch); `token` names it in `next`.
    ELASTIC_DECL void add(int pidfd, std::size_t token);

    /// How many watched processes have not been reported by `next` yet.
    [[nodiscard]] std::size_t size() const noexcept { return tokens_.size(); }

    /// The token of one process that exited (removed from the set). Cancellable.
    template <class Defer = void>
    asio::awaitable<std::size_t> next() {
        for (;;) {
            epoll_event event{};
            const int n = ::epoll_wait(epoll_.native_handle(), &event, 1, 0);
            if (n == 1) {
                const std::size_t token = event.data.u64;
                const auto it = std::find_if(tokens_.begin(), tokens_.end(),
                                             [token](const entry& e) { return e.token == token; });
                if (it != tokens_.end()) {
                    ::epoll_ctl(epoll_.native_handle(), EPOLL_CTL_DEL, it->fd, nullptr);
                    tokens_.erase(it);
                }
                co_return token;
            }
            if (n < 0 && errno != EINTR) {
                throw process_error("cannot wait on an epoll instance: " + errno_string(errno));
            }
            co_await epoll_.async_wait(asio::posix::descriptor_base::wait_read, detail::use_awaitable<Defer>);
        }
    }

    /// The tokens not reported yet.
    [[nodiscard]] ELASTIC_DECL std::vector<std::size_t> pending() const;

private:
    struct entry {
        std::size_t token;
        int fd;
    };
    asio::posix::stream_descriptor epoll_;
    std::vector<entry> tokens_;
};

/// The process-group id in /proc/<pid>/stat; -1 if the process is gone or already dead (a zombie
/// whose reaper has not come by yet: dead is what stop waits for).
ELASTIC_DECL pid_t read_pgid(pid_t pid);

/// A process found in a group, held by a pidfd so its number cannot be recycled under us.
struct group_member {
    pid_t pid;
    owned_fd pidfd;
};

/// Every process in the groups `pgids`, except `skip` (the leaders): one scan of /proc (at stop
/// time, not a polling loop). Each is held by a pidfd, then its group is checked again, so a pid
/// recycled between the scan and pidfd_open is not mistaken for a member.
ELASTIC_DECL std::vector<group_member> group_members(const std::vector<pid_t>& pgids, const std::vector<pid_t>& skip);

/// Pointers to each of `children`, for the overloads that take workers by value.
ELASTIC_DECL std::vector<child_process*> addresses(std::span<child_process> children);

}  // namespace detail::process

/// Waits until one of `children` that has not exited yet exits, and returns its index (its
/// status() is then set). Returns `children.size()` at once if none is left running. Exit
/// times are exact for all of them: the waits run side by side. Cancellable.
template <class Defer = void>
asio::awaitable<std::size_t> wait_any(std::span<child_process* const> children) {
    detail::process::exit_set set(co_await asio::this_coro::executor);
    for (std::size_t i = 0; i < children.size(); ++i) {
        if (children[i]->reaped() || children[i]->status()) continue;
        if (children[i]->check_exit()) co_return i;
        set.add(children[i]->native_pidfd(), i);
    }
    if (set.size() == 0) co_return children.size();
    for (;;) {
        const std::size_t i = co_await set.next();
        if (children[i]->check_exit()) co_return i;
    }
}

/// `wait_any` for workers held by value (a std::vector<child_process>, say).
template <class Defer = void>
asio::awaitable<std::size_t> wait_any(std::span<child_process> children) {
    const auto pointers = detail::process::addresses(children);
    co_return co_await wait_any(std::span<child_process* const>(pointers));
}

/// How one worker ended during `stop`.
enum class stop_outcome {
    already_exited,  ///< it had exited before the stop signal was sent
    exited,          ///< it exited during the grace period, not by the stop signal (it handled it)
    signaled,        ///< the stop signal ended it during the grace period
    killed,          ///< it was still running after the grace period and SIGKILL ended it
    unkillable,      ///< still not gone after SIGKILL and the kill timeout (uninterruptible sleep)
};

/// "exited", "killed", ... for logs.
inline const char* to_string(stop_outcome outcome) noexcept {
    switch (outcome) {
        case stop_outcome::already_exited: return "already exited";
        case stop_outcome::exited: return "exited";
        case stop_outcome::signaled: return "ended by the stop signal";
        case stop_outcome::killed: return "killed after the grace period";
        case stop_outcome::unkillable: return "not reaped after SIGKILL";
    }
    return "unknown";
}

/// One worker in a stop_result.
struct stopped_worker {
    pid_t pid = 0;
    stop_outcome outcome = stop_outcome::already_exited;
    std::optional<process_exit> status;  ///< absent only when unkillable
};

/// What `stop` did.
struct stop_result {
    std::vector<stopped_worker> workers;  ///< one per child, in the order given
    /// Other members of the groups (a worker's children) still running after the grace period,
    /// which got SIGKILL with the group.
    std::vector<pid_t> killed_descendants;
    /// Processes (workers or descendants) still not gone when the kill timeout expired: in
    /// uninterruptible sleep, typically. A worker among them is left unreaped and registered
    /// with the watcher; calling `stop` again retries.
    std::vector<pid_t> unkillable;

    /// Nothing was left behind.
    [[nodiscard]] bool clean() const noexcept { return unkillable.empty(); }
};

/// The time limits of `stop`.
struct stop_options {
    int signal = SIGTERM;                     ///< sent first to each group (torchrun: SIGTERM, or the signal it got)
    std::chrono::milliseconds grace{30'000};  ///< --shutdown-timeout: one deadline for all groups
    std::chrono::milliseconds kill_timeout{10'000};  ///< how long to await deaths after SIGKILL
};

namespace detail::process {

// Awaits every process in `set`; each child's exit is recorded the moment it is seen.
template <class Defer = void>
asio::awaitable<void> await_exits(exit_set& set, std::span<child_process* const> children) {
    while (set.size() > 0) {
        const std::size_t token = co_await set.next();
        if (token < children.size()) children[token]->check_exit();
    }
}

template <class Defer = void>
asio::awaitable<void> await_exits_or_timeout(exit_set& set, std::span<child_process* const> children,
                                             std::chrono::milliseconds timeout) {
    using namespace asio::experimental::awaitable_operators;
    if (set.size() == 0) co_return;
    asio::steady_timer timer(co_await asio::this_coro::executor, timeout);
    co_await (await_exits(set, children) || timer.async_wait(detail::use_awaitable<Defer>));
}

}  // namespace detail::process

/// Stops a group of workers as torchrun's `PContext.close` does, without its faults:
///   1. sends `options.signal` to every worker's process group (its descendants included);
///   2. awaits, against one shared deadline `options.grace`, every worker and every other process
///      that was in their groups then;
///   3. sends SIGKILL to every group (what is left: a worker that ignored the signal, a child
///      that outlived its worker), awaits those deaths for at most `options.kill_timeout`, and
///      reaps the workers. A process still there is reported in `unkillable`, not waited on
///      forever.
/// Every wait is an event (pidfds in an epoll set) raced against a timer with `||`.
/// Workers already reaped are reported `already_exited` and not signalled (their group id is
/// no longer reserved).
template <class Defer = void>
asio::awaitable<stop_result> stop(std::span<child_process* const> children, stop_options options = {}) {
    auto executor = co_await asio::this_coro::executor;
    stop_result result;
    result.workers.resize(children.size());
    std::vector<bool> exited_before(children.size(), false);
    std::vector<bool> outlived_grace(children.size(), false);
    std::vector<pid_t> pgids;
    std::vector<pid_t> leaders;
    // Descendants still there when the grace ran out, held by the pidfds taken at stop time.
    std::vector<detail::process::group_member> outlived;

    // 1. The stop signal, to every group whose leader is still unreaped (so its id is ours).
    for (std::size_t i = 0; i < children.size(); ++i) {
        auto& child = *children[i];
        result.workers[i].pid = child.pid();
        if (child.pid() <= 0) continue;
        leaders.push_back(child.pid());
        if (child.reaped()) {
            exited_before[i] = true;
            continue;
        }
        exited_before[i] = child.check_exit();
        child.signal_group(options.signal);
        pgids.push_back(child.pgid());
    }

    // 2. The grace period: workers and the other members of their groups, one deadline.
    {
        detail::process::exit_set set(executor);
        for (std::size_t i = 0; i < children.size(); ++i) {
            if (!children[i]->reaped() && !children[i]->check_exit()) {
                set.add(children[i]->native_pidfd(), i);
            }
        }
        auto members = detail::process::group_members(pgids, leaders);
        for (std::size_t m = 0; m < members.size(); ++m) {
            set.add(members[m].pidfd.get(), children.size() + m);
        }
        co_await detail::process::await_exits_or_timeout(set, children, options.grace);
        for (std::size_t token : set.pending()) {
            if (token < children.size()) {
                outlived_grace[token] = true;
            } else {
                auto& member = members[token - children.size()];
                result.killed_descendants.push_back(member.pid);
                outlived.push_back(std::move(member));
            }
        }
    }

    // 3. SIGKILL to every group; await the deaths, bounded; reap.
    for (child_process* child : children) {
        if (!child->reaped()) child->signal_group(SIGKILL);
    }
    {
        detail::process::exit_set set(executor);
        for (std::size_t i = 0; i < children.size(); ++i) {
            if (!children[i]->reaped() && !children[i]->check_exit()) {
                set.add(children[i]->native_pidfd(), i);
            }
        }
        // Members again: a process forked during the grace period is found here. The ones that
        // outlived the grace are awaited by the pidfds held since: a scan passes over a process
        // whose main thread is already a zombie while its other threads still exit, and a pidfd
        // reads as ended only once every thread has.
        auto members = detail::process::group_members(pgids, leaders);
        for (auto& held : outlived) {
            if (std::none_of(members.begin(), members.end(),
                             [&](const detail::process::group_member& m) { return m.pid == held.pid; })) {
                members.push_back(std::move(held));
            }
        }
        for (std::size_t m = 0; m < members.size(); ++m) {
            set.add(members[m].pidfd.get(), children.size() + m);
            auto& killed = result.killed_descendants;
            if (std::find(killed.begin(), killed.end(), members[m].pid) == killed.end()) {
                killed.push_back(members[m].pid);
            }
        }
        co_await detail::process::await_exits_or_timeout(set, children, options.kill_timeout);
        for (std::size_t token : set.pending()) {
            result.unkillable.push_back(token < children.size() ? children[token]->pid()
                                                                : members[token - children.size()].pid);
        }
    }

    for (std::size_t i = 0; i < children.size(); ++i) {
        auto& child = *children[i];
        auto& worker = result.workers[i];
        if (child.pid() <= 0) continue;
        worker.status = child.status();
        if (!child.status()) {
            worker.outcome = stop_outcome::unkillable;
            continue;
        }
        if (exited_before[i]) {
            worker.outcome = stop_outcome::already_exited;
        } else if (outlived_grace[i] && child.status()->status.signal() == SIGKILL) {
            worker.outcome = stop_outcome::killed;
        } else if (child.status()->status.signal() == options.signal) {
            worker.outcome = stop_outcome::signaled;
        } else {
            worker.outcome = stop_outcome::exited;
        }
        child.reap();
    }
    co_return result;
}

/// `stop` for workers held by value (a std::vector<child_process>, say).
template <class Defer = void>
asio::awaitable<stop_result> stop(std::span<child_process> children, stop_options options = {}) {
    const auto pointers = detail::process::addresses(children);
    co_return co_await stop(std::span<child_process* const>(pointers), options);
}

/// `stop` for one worker.
template <class Defer = void>
asio::awaitable<stop_result> stop(child_process& child, stop_options options = {}) {
    child_process* const one[] = {&child};
    co_return co_await stop(std::span<child_process* const>(one), options);
}

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::process {

ELASTIC_DECL pid_t read_pgid(pid_t pid) {
    const std::string path = "/proc/" + std::to_string(pid) + "/stat";
    owned_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return -1;
    char buffer[1024];
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer - 1);
    if (n <= 0) return -1;
    buffer[n] = '\0';
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, skip to the last ')'.
    const char* p = std::strrchr(buffer, ')');
    if (p == nullptr) return -1;
    char state = 0;
    long ppid = 0;
    long pgrp = 0;
    if (std::sscanf(p + 1, " %c %ld %ld", &state, &ppid, &pgrp) != 3) return -1;
    if (state == 'Z' || state == 'X') return -1;
    return static_cast<pid_t>(pgrp);
}

ELASTIC_DECL std::vector<group_member> group_members(const std::vector<pid_t>& pgids, const std::vector<pid_t>& skip) {
    std::vector<group_member> out;
    if (pgids.empty()) return out;
    DIR* proc = ::opendir("/proc");
    if (proc == nullptr) return out;
    while (const dirent* entry = ::readdir(proc)) {
        char* end = nullptr;
        const long value = std::strtol(entry->d_name, &end, 10);
        if (end == entry->d_name || *end != '\0' || value <= 0) continue;
        const auto pid = static_cast<pid_t>(value);
        if (std::find(skip.begin(), skip.end(), pid) != skip.end()) continue;
        const pid_t pgid = read_pgid(pid);
        if (std::find(pgids.begin(), pgids.end(), pgid) == pgids.end()) continue;
        owned_fd pidfd(pidfd_open(pid));
        if (!pidfd || read_pgid(pid) != pgid) continue;
        out.push_back({pid, std::move(pidfd)});
    }
    ::closedir(proc);
    return out;
}

ELASTIC_DECL std::vector<child_process*> addresses(std::span<child_process> children) {
    std::vector<child_process*> out;
    out.reserve(children.size());
    for (auto& child : children) out.push_back(&child);
    return out;
}

}  // namespace detail::process
}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::process {

ELASTIC_DECL void exit_set::add(int pidfd, std::size_t token) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = token;
    if (::epoll_ctl(epoll_.native_handle(), EPOLL_CTL_ADD, pidfd, &event) != 0) {
        throw process_error("cannot watch pidfd " + std::to_string(pidfd) + ": " + errno_string(errno));
    }
    tokens_.push_back({token, pidfd});
}

ELASTIC_DECL std::vector<std::size_t> exit_set::pending() const {
    std::vector<std::size_t> out;
    for (const auto& e : tokens_) out.push_back(e.token);
    return out;
}

}  // namespace detail::process
}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/process/group.hpp ----
// ---- begin elastic/process/signals.hpp ----
// The signals the agent receives, as awaitable events; the agent's process-wide dispositions.


#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/signal_set.hpp>
#include <asio/use_awaitable.hpp>

#include <array>
#include <csignal>
#include <initializer_list>

namespace elastic::inline v0 {

/// The signals torchrun turns into a stop of its workers (and forwards to them): SIGINT,
/// SIGTERM, SIGHUP, SIGQUIT.
inline constexpr std::array<int, 4> forwarded_signals{SIGINT, SIGTERM, SIGHUP, SIGQUIT};

/// Makes the agent's process-wide signal dispositions fit for supervising children (idempotent;
/// `spawn` calls it too): SIGPIPE ignored, so writing to a dead worker's pipe is an EPIPE error
/// rather than the agent's death; SIGXFSZ ignored, so a log file past the file-size limit is an
/// EFBIG write error (reported) rather than the agent's death; SIGCHLD not ignored (nor SA_NOCLDWAIT), or the kernel would
/// reap the workers itself and their exit status would be lost.
ELASTIC_DECL void prepare_agent_signals() noexcept;

/// Signals delivered to the agent, one `co_await next()` at a time (Asio's signal_set: a
/// handler that writes to a self-pipe, so the wait is an ordinary event).
///
/// While one exists, the signals it holds no longer have their default action (SIGINT no longer
/// kills the agent): the agent decides, typically by stopping its workers with the same signal.
/// Children never inherit the handler: `spawn` resets every disposition in the child.
class signal_events {
public:
    /// Catches `signals` (by default the forwarded ones).
    explicit signal_events(const asio::any_io_executor& executor,
                           std::initializer_list<int> signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
        : set_(executor) {
        prepare_agent_signals();
        for (int sig : signals) set_.add(sig);
    }

    /// The next signal received (signals that arrive while nobody waits are queued by Asio).
    /// Cancellable; throws asio::system_error(operation_aborted) when cancelled.
    template <class Defer = void>
    asio::awaitable<int> next() {
        co_return co_await set_.async_wait(detail::use_awaitable<Defer>);
    }

    /// Cancels a pending `next`.
    ELASTIC_DECL void cancel();

private:
    asio::signal_set set_;
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL void prepare_agent_signals() noexcept { detail::process::prepare_agent_signals(); }

}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL void signal_events::cancel() {
    asio::error_code ignored;
    set_.cancel(ignored);
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/process/signals.hpp ----
// ---- begin elastic/process/spawn.hpp ----
// spawn: start a worker program in its own process group, tied to the agent's life.

// ---- begin elastic/detail/path_search.hpp ----
// The one PATH search of the library (execvp's rules), shared by the process layer's spawn and
// the launcher's program validation; each wraps the result in its own error.


#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <string_view>

namespace elastic::inline v0::detail {

/// What stat(2)/access(2) say of a path the launcher wants to run or read.
enum class file_check { ok, missing, directory, not_executable, not_readable };

[[nodiscard]] ELASTIC_DECL file_check check_file(const std::string& path, int access_mode);

/// execvp's search path when PATH is unset (glibc >= 2.24: the current directory is no longer in it).
inline constexpr std::string_view default_search_path = "/bin:/usr/bin";

/// The outcome of a search: `found` is the path to execute (empty: none); `first_not_executable`
/// the first match that exists but may not be executed (for a better message than "not found").
struct path_search_result {
    std::string found;
    std::string first_not_executable;
};

/// Searches each directory of `search_path` in order, as execvp(3) does; an empty entry is the
/// current directory (returned as `./name`). `name` must not contain a slash.
[[nodiscard]] ELASTIC_DECL path_search_result search_path(std::string_view name, std::string_view search_path);

}  // namespace elastic::inline v0::detail

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail {

[[nodiscard]] ELASTIC_DECL file_check check_file(const std::string& path, int access_mode) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        return file_check::missing;
    }
    if (S_ISDIR(st.st_mode)) {
        return file_check::directory;
    }
    if (::access(path.c_str(), access_mode) != 0) {
        return access_mode == X_OK ? file_check::not_executable : file_check::not_readable;
    }
    return file_check::ok;
}

[[nodiscard]] ELASTIC_DECL path_search_result search_path(std::string_view name, std::string_view search_path) {
    path_search_result result;
    for (;;) {
        const auto colon = search_path.find(':');
        const auto dir = search_path.substr(0, colon);
        std::string candidate = dir.empty() ? "./" : std::string(dir) + "/";
        candidate += name;
        const auto check = check_file(candidate, X_OK);
        if (check == file_check::ok) {
            result.found = std::move(candidate);
            return result;
        }
        if (check == file_check::not_executable && result.first_not_executable.empty()) {
            result.first_not_executable = std::move(candidate);
        }
        if (colon == std::string_view::npos) return result;
        search_path.remove_prefix(colon + 1);
    }
}

}  // namespace elastic::inline v0::detail

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/detail/path_search.hpp ----

#include <asio/any_io_executor.hpp>
#include <asio/posix/stream_descriptor.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace elastic::inline v0 {

/// Where one of a child's standard streams goes.
class stdio {
public:
    /// What the stream is connected to.
    enum class kind { inherit, pipe, null, descriptor };

    /// The agent's own stream (the default).
    static stdio inherit() noexcept { return stdio(kind::inherit, -1); }
    /// A pipe whose other end the caller takes from the child_process (take_stdout, ...).
    static stdio pipe() noexcept { return stdio(kind::pipe, -1); }
    /// /dev/null.
    static stdio null() noexcept { return stdio(kind::null, -1); }
    /// A descriptor of the caller's (a log file, say); the child gets a copy, the caller keeps
    /// its own.
    static stdio descriptor(int fd) noexcept { return stdio(kind::descriptor, fd); }

    [[nodiscard]] kind which() const noexcept { return kind_; }
    [[nodiscard]] int fd() const noexcept { return fd_; }

private:
    stdio(kind k, int fd) noexcept : kind_(k), fd_(fd) {}
    kind kind_;
    int fd_;
};

/// How a worker is separated from the agent's terminal job control.
enum class process_isolation {
    session,        ///< setsid: own session and group, no controlling terminal (torchrun's choice)
    process_group,  ///< setpgid: own group, same session and terminal
};

/// What to start and how.
struct spawn_options {
    /// A path, or a name searched in the child's PATH (as execvp and Python's subprocess do).
    std::string program;
    /// The arguments after argv[0]; argv[0] is `program` as given.
    std::vector<std::string> args;
    /// "NAME=value" entries; when empty (nullopt), a copy of the agent's environment.
    std::optional<std::vector<std::string>> env;
    /// The working directory; empty means the agent's.
    std::string cwd;
    stdio in = stdio::inherit();   ///< stdin
    stdio out = stdio::inherit();  ///< stdout
    stdio err = stdio::inherit();  ///< stderr
    process_isolation isolation = process_isolation::session;
    /// Whether the child gets a cgroup of its own (cgroup.hpp), so that whatever it starts —
    /// a daemon that left its process group included — is killed when it is reaped, and when
    /// the agent dies. Where the agent can make none, the process group alone contains it.
    bool own_cgroup = true;
};

namespace detail::process {

/// The agent's environment as "NAME=value" entries (the caller must not race setenv).
ELASTIC_DECL std::vector<std::string> environ_entries();

/// The steps of the child's set-up, reported back with errno when one fails.
enum class child_step : std::int32_t { group = 1, pdeathsig, stdio, chdir, close_fds, exec, cgroup };

/// What the child writes to the close-on-exec error pipe before _exit(127).
struct child_failure {
    child_step step;
    std::int32_t error;
};

/// Everything the child needs, prepared before the fork so the child allocates nothing.
struct child_plan {
    const char* path;
    char* const* argv;
    char* const* envp;
    const char* cwd;   // nullptr: keep the agent's
    int stdio_fds[3];  // -1: inherit; else a descriptor above 2 to dup onto 0, 1, 2
    bool new_session;
    pid_t parent;
    int error_fd;        // above 2, close-on-exec
    int max_fd;          // for the close loop if close_range is missing
    rlim_t nofile_soft;  // the soft open-files limit to give the child; RLIM_INFINITY: keep
    int cgroup_procs;    // above 2, close-on-exec: the cgroup.procs to join; -1: stay in the agent's
};

/// The child between vfork and exec. Only async-signal-safe calls: the agent is multithreaded,
/// so any lock (malloc's, stdio's) may be held by a thread that does not exist in the child.
[[noreturn]] inline void child_main(const child_plan& plan) noexcept {
    const auto fail = [&plan](child_step step) {
        const child_failure failure{step, errno};
        [[maybe_unused]] const ssize_t n = ::write(plan.error_fd, &failure, sizeof failure);
        ::_exit(127);
    };
    // First the cgroup, before anything can start a descendant that would stay outside it.
    if (plan.cgroup_procs >= 0 && ::write(plan.cgroup_procs, "0", 1) != 1) fail(child_step::cgroup);
    // Every signal is blocked here (inherited from the spawner thread). Reset every disposition:
    // handled ones would reset at exec anyway, but ignored ones (the agent ignores SIGPIPE)
    // would be inherited by the worker.
    struct sigaction deflt {};
    deflt.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) {
        if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &deflt, nullptr);  // EINVAL ok
    }
    if (plan.new_session ? ::setsid() < 0 : ::setpgid(0, 0) != 0) fail(child_step::group);
    // Forked by the spawner thread, which lives as long as the agent: this fires when the
    // agent dies. If it died before the prctl, we were reparented already: give up now.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) fail(child_step::pdeathsig);
    if (::getppid() != plan.parent) ::_exit(127);
    for (int target = 0; target < 3; ++target) {
        // Sources are above 2 (see raise_above_stdio), so no dup2 clobbers a later source.
        if (plan.stdio_fds[target] >= 0 && ::dup2(plan.stdio_fds[target], target) < 0) {
            fail(child_step::stdio);
        }
    }
    if (plan.cwd != nullptr && ::chdir(plan.cwd) != 0) fail(child_step::chdir);
    // Asio opens sockets without SOCK_CLOEXEC: close everything above 2 but the error pipe
    // (close-on-exec, so execve closes it and the agent reads EOF: success).
    const auto e = static_cast<unsigned>(plan.error_fd);
    if ((e > 3 && ::close_range(3, e - 1, 0) != 0) || ::close_range(e + 1, ~0U, 0) != 0) {
        if (errno != ENOSYS && errno != EINVAL) fail(child_step::close_fds);
        for (int fd = 3; fd < plan.max_fd; ++fd) {  // kernels before 5.9
            if (fd != plan.error_fd) ::close(fd);
        }
    }
    // The agent raised its own open-files limit (raise_open_files_limit); the worker gets the
    // one its user set, as it would under any other launcher.
    if (plan.nofile_soft != RLIM_INFINITY) {
        rlimit limit{};
        if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && plan.nofile_soft < limit.rlim_cur) {
            limit.rlim_cur = plan.nofile_soft;
            ::setrlimit(RLIMIT_NOFILE, &limit);
        }
    }
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(plan.path, plan.argv, plan.envp);
    fail(child_step::exec);
    ::_exit(127);  // not reached
}

/// Starts the child with vfork: it borrows the agent's memory until execve, so nothing is
/// copied — on this machine fork costs 3 to 5 ms (copying the page tables), vfork 0.1 ms — and
/// the spawner thread is suspended until the exec, which `spawn` waits for anyway. What makes
/// that safe is what glibc's posix_spawn relies on: every signal is blocked (the spawner thread
/// blocks them all) until the dispositions are back to SIG_DFL, so no handler of the agent ever
/// runs on the borrowed stack; the child writes no memory but its own frames below this one and
/// never returns into them; its descriptor table and signal dispositions are its own (no
/// CLONE_FILES, no CLONE_SIGHAND). (ThreadSanitizer turns vfork into fork; ASan supports it.)
/// noinline: the child's frames must lie below a frame that is not the caller's.
[[gnu::noinline]] inline pid_t vfork_child(const child_plan& plan) noexcept {
    const pid_t pid = ::vfork();
    if (pid == 0) child_main(plan);
    return pid;
}

/// The path execve will get: `program` itself if it has a slash, else the first executable
/// regular file named `program` in the PATH of the child's environment.
ELASTIC_DECL std::string find_executable(const std::string& program, const std::vector<std::string>& env);

ELASTIC_DECL std::string describe_failure(const child_failure& failure, const spawn_options& options,
                                          const std::string& path);

// One standard stream: the descriptor the child gets, and the caller's end of a pipe.
struct stdio_ends {
    owned_fd child;
    owned_fd parent;
};

ELASTIC_DECL stdio_ends open_stdio(const stdio& target, bool child_reads);

// Kills and reaps a child that exists but will not be handed to the caller.
ELASTIC_DECL void discard_child(pid_t pid, int pidfd) noexcept;

}  // namespace detail::process

/// Starts `options.program` and returns the running child, bound to `executor`.
///
/// The child leads its own session (or process group); its signal dispositions are reset to the
/// defaults and its signal mask emptied; every descriptor above 2 is closed; it gets SIGKILL when
/// the agent dies (PR_SET_PDEATHSIG, from the spawner thread, spawner.hpp), and its process group
/// gets SIGKILL from the watcher process (watcher.hpp) even if the agent was SIGKILLed. With
/// `options.own_cgroup`, where the agent can make one, it also runs in a cgroup of its own
/// (cgroup.hpp), killed with everything in it when the child is reaped or the agent dies.
///
/// Returns once the program has been executed. Throws spawn_error, with errno's text and value,
/// when it cannot be: a missing program, a file without execute permission, a bad working
/// directory — the caller never sees a child that silently exits 127.
///
/// Blocks the calling thread for the fork and the exec handshake (well under a millisecond for
/// a small agent), so it is a plain function, not a coroutine.
ELASTIC_DECL child_process spawn(const asio::any_io_executor& executor, const spawn_options& options);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::process {

ELASTIC_DECL std::vector<std::string> environ_entries() {
    std::vector<std::string> out;
    for (char** entry = ::environ; entry != nullptr && *entry != nullptr; ++entry) {
        out.emplace_back(*entry);
    }
    return out;
}

ELASTIC_DECL std::string find_executable(const std::string& program, const std::vector<std::string>& env) {
    if (program.find('/') != std::string::npos) return program;
    std::string path_var(default_search_path);  // execvp's, when the environment has no PATH
    for (const auto& entry : env) {
        if (entry.rfind("PATH=", 0) == 0) path_var = entry.substr(5);
    }
    if (auto result = search_path(program, path_var); !result.found.empty()) return std::move(result.found);
    throw spawn_error("cannot spawn '" + program + "': no executable file of that name in PATH=" + path_var +
                          " (give a path, or set PATH in the worker's environment)",
                      ENOENT, true);
}

ELASTIC_DECL std::string describe_failure(const child_failure& failure, const spawn_options& options,
                                          const std::string& path) {
    const char* name = ::strerrorname_np(failure.error);
    const std::string why = errno_string(failure.error) + " (" + (name != nullptr ? name : "errno") + ")";
    switch (failure.step) {
        case child_step::exec: {
            std::string text = "cannot execute '" + path + "'";
            if (path != options.program) text += " (found for '" + options.program + "')";
            text += ": " + why;
            if (failure.error == EACCES) text += "; it must be an executable file (chmod +x)";
            if (failure.error == ENOENT) text += "; check the path (or the #! interpreter)";
            if (failure.error == ENOEXEC) text += "; it is neither a binary nor a #! script";
            return text;
        }
        case child_step::chdir:
            return "cannot start '" + options.program + "' in working directory '" + options.cwd + "': " + why;
        case child_step::stdio: return "cannot connect the standard streams of '" + options.program + "': " + why;
        case child_step::group: return "cannot give '" + options.program + "' its own process group: " + why;
        case child_step::pdeathsig: return "cannot set the parent-death signal for '" + options.program + "': " + why;
        case child_step::close_fds: return "cannot close the agent's descriptors in '" + options.program + "': " + why;
        case child_step::cgroup: return "cannot move '" + options.program + "' into its own cgroup: " + why;
    }
    return "cannot start '" + options.program + "': " + why;
}

ELASTIC_DECL stdio_ends open_stdio(const stdio& target, bool child_reads) {
    stdio_ends ends;
    switch (target.which()) {
        case stdio::kind::inherit: break;
        case stdio::kind::pipe: {
            int fds[2];
            if (::pipe2(fds, O_CLOEXEC) != 0) {
                throw process_error("cannot create a pipe for a worker's standard stream: " + errno_string(errno) +
                                    " (raise the open-files limit)");
            }
            ends.child = owned_fd(child_reads ? fds[0] : fds[1]);
            ends.parent = owned_fd(child_reads ? fds[1] : fds[0]);
            break;
        }
        case stdio::kind::null:
            ends.child = owned_fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
            if (!ends.child) throw process_error("cannot open /dev/null: " + errno_string(errno));
            break;
        case stdio::kind::descriptor:
            ends.child = owned_fd(::fcntl(target.fd(), F_DUPFD_CLOEXEC, 3));
            if (!ends.child) {
                throw process_error("cannot use descriptor " + std::to_string(target.fd()) +
                                    " for a worker's standard stream: " + errno_string(errno));
            }
            break;
    }
    ends.child = raise_above_stdio(std::move(ends.child));
    return ends;
}

ELASTIC_DECL void discard_child(pid_t pid, int pidfd) noexcept {
    ::kill(pid, SIGKILL);
    watcher::instance().remove(pid);
    if (pidfd >= 0) {
        siginfo_t info{};
        while (::waitid(p_pidfd, static_cast<id_t>(pidfd), &info, WEXITED) != 0 && errno == EINTR) {
        }
    } else {
        while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
    }
}

}  // namespace detail::process
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL child_process spawn(const asio::any_io_executor& executor, const spawn_options& options) {
    if (options.program.empty()) {
        throw spawn_error("cannot spawn a worker: the program is empty (give a path or a name)", EINVAL, true);
    }
    detail::process::prepare_agent_signals();
    const std::vector<std::string> env = options.env ? *options.env : detail::process::environ_entries();
    const std::string path = detail::process::find_executable(options.program, env);

    std::vector<std::string> arg_strings;
    arg_strings.reserve(options.args.size() + 1);
    arg_strings.push_back(options.program);
    arg_strings.insert(arg_strings.end(), options.args.begin(), options.args.end());
    std::vector<char*> argv;
    for (auto& arg : arg_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings = env;
    std::vector<char*> envp;
    for (auto& entry : env_strings) envp.push_back(entry.data());
    envp.push_back(nullptr);

    detail::process::stdio_ends in = detail::process::open_stdio(options.in, true);
    detail::process::stdio_ends out = detail::process::open_stdio(options.out, false);
    detail::process::stdio_ends err = detail::process::open_stdio(options.err, false);

    int error_pipe[2];
    if (::pipe2(error_pipe, O_CLOEXEC) != 0) {
        throw process_error("cannot create the exec-status pipe for '" + options.program +
                            "': " + detail::process::errno_string(errno) + " (raise the open-files limit)");
    }
    detail::process::owned_fd error_read(error_pipe[0]);
    detail::process::owned_fd error_write = detail::process::raise_above_stdio(
        detail::process::owned_fd(error_pipe[1]));

    detail::process::watcher::instance().ensure_started();  // before any worker can be orphaned
    detail::process::graveyard::instance().sweep();
    std::optional<detail::process::worker_cgroup> cgroup;
    if (options.own_cgroup) cgroup = detail::process::cgroups::instance().make();
    // Whatever happens from here on, a cgroup no child_process took is removed.
    struct cgroup_guard {
        std::optional<detail::process::worker_cgroup>& cgroup;
        ~cgroup_guard() {
            if (cgroup) detail::process::cgroups::instance().retire(cgroup->path);
        }
    } cgroup_cleanup{cgroup};

    rlimit limit{};
    int max_fd = 1024;
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
        max_fd = static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 20));
    }
    const detail::process::child_plan plan{
        path.c_str(),
        argv.data(),
        envp.data(),
        options.cwd.empty() ? nullptr : options.cwd.c_str(),
        {in.child.get(), out.child.get(), err.child.get()},
        options.isolation == process_isolation::session,
        ::getpid(),
        error_write.get(),
        max_fd,
        detail::process::original_open_files_soft_limit(),
        cgroup ? cgroup->procs.get() : -1,
    };
    pid_t pid = -1;
    int fork_errno = 0;
    auto job = [&] {
        const pid_t forked = detail::process::vfork_child(plan);
        if (forked < 0) fork_errno = errno;
        pid = forked;
    };
    detail::process::spawner::instance().run(job);
    if (pid < 0) {
        throw spawn_error("cannot fork to start '" + options.program +
                              "': " + detail::process::errno_string(fork_errno) +
                              " (check the process limit, ulimit -u, and free memory)",
                          fork_errno);
    }
    in.child.reset();
    out.child.reset();
    err.child.reset();
    error_write.reset();

    // The child exists: from here on, any failure kills and reaps it.
    try {
        detail::process::watcher::instance().add(pid);
    } catch (...) {
        ::kill(pid, SIGKILL);
        while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
        throw;
    }
    // Safe after fork: the pid is our unreaped child (SIGCHLD is not ignored, see
    // prepare_agent_signals), so it cannot have been recycled.
    detail::process::owned_fd pidfd(detail::process::pidfd_open(pid));
    if (!pidfd) {
        const int e = errno;
        detail::process::discard_child(pid, -1);
        throw spawn_error("cannot open a pidfd for pid " + std::to_string(pid) + ": " +
                              detail::process::errno_string(e) + " (needs Linux 5.3 or later)",
                          e);
    }

    detail::process::child_failure failure{};
    ssize_t n = 0;
    do {
        n = ::read(error_read.get(), &failure, sizeof failure);
    } while (n < 0 && errno == EINTR);
    if (n != 0) {
        const bool reported = n == static_cast<ssize_t>(sizeof failure);  // by the child, whole
        if (!reported) {
            failure = {detail::process::child_step::exec, n < 0 ? errno : EIO};
        }
        detail::process::discard_child(pid, pidfd.get());
        if (failure.step == detail::process::child_step::cgroup) {
            // The agent could make the cgroup but not move a process into it (a cgroup it
            // does not own, say). Containment by process group is what is left: go on with
            // that, for this worker and every later one; cgroups::reason() says why.
            detail::process::cgroups::instance().disable(detail::process::describe_failure(failure, options, path) +
                                                         " (" + cgroup->path + ")");
            return spawn(executor, options);
        }
        // execve's refusals that are the program's own (its path, its mode, its format, its #!
        // interpreter); any other errno (memory, descriptors, a busy text file, I/O, the
        // agent's own read of the report) is not.
        const int e = failure.error;
        const bool program_fault = reported && failure.step == detail::process::child_step::exec &&
                                   (e == ENOENT || e == EACCES || e == ENOEXEC || e == ENOTDIR || e == ELOOP ||
                                    e == ENAMETOOLONG || e == ELIBBAD || e == EISDIR);
        throw spawn_error(detail::process::describe_failure(failure, options, path), failure.error, program_fault);
    }

    // Hand the descriptors to Asio; assign() takes ownership only once it succeeds, so on
    // failure each one is still closed by its owned_fd, and the child is not left behind.
    const auto adopt = [&](detail::process::owned_fd& fd) -> std::optional<asio::posix::stream_descriptor> {
        if (!fd) return std::nullopt;
        asio::posix::stream_descriptor stream(executor);
        stream.assign(fd.get());
        fd.release();
        return stream;
    };
    try {
        auto in_pipe = adopt(in.parent);
        auto out_pipe = adopt(out.parent);
        auto err_pipe = adopt(err.parent);
        auto pid_stream = adopt(pidfd);
        std::string cgroup_path = cgroup ? std::move(cgroup->path) : std::string();
        cgroup.reset();
        return detail::process::child_process_factory::make(std::move(*pid_stream), pid, std::move(in_pipe),
                                                            std::move(out_pipe), std::move(err_pipe),
                                                            std::move(cgroup_path));
    } catch (...) {
        detail::process::discard_child(pid, pidfd ? pidfd.get() : -1);
        throw;
    }
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/process/spawn.hpp ----
// ---- end elastic/process.hpp ----
// ---- begin elastic/report.hpp ----
// The report layer: worker failures, error files, the root cause, the failure summary in
// torchrun's layout, the agent's own error file, elasticrun's exit codes and the event log
// with its destinations.

// ---- begin elastic/report/agent_error_file.hpp ----
// The agent's own error file: the root cause written into $TORCHELASTIC_ERROR_FILE with errorCode,
// as torchrun's @record-decorated main does, so an outer launcher or scheduler sees it.

// ---- begin elastic/report/failure.hpp ----
// worker_failure: one worker's end as the agent saw it, what a report says about it, the root
// cause of a group's failure (the earliest), and elasticrun's exit code.

// ---- begin elastic/detail/host_name.hpp ----
// This host's name: host_name() as gethostname() gives it (no DNS), host_fqdn() fully qualified
// as Python's socket.getfqdn() finds it (may ask DNS).


#include <string>

#include <netdb.h>
#include <unistd.h>

namespace elastic::inline v0 {

/// This host's name as gethostname() gives it, without asking DNS; "localhost" when it fails.
/// What the event log's `hostname` shows, and this node's name when every node is on this machine.
[[nodiscard]] inline std::string host_name() {
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
    return name;
}

/// This host's fully qualified name, as Python's socket.getfqdn() finds it (the canonical name
/// from the resolver when it has a dot, else host_name()). It may ask DNS: call it once, at agent
/// start, not when a failure arrives.
[[nodiscard]] inline std::string host_fqdn() {
    std::string host = host_name();
    addrinfo hints{};
    hints.ai_flags = AI_CANONNAME;
    hints.ai_family = AF_UNSPEC;
    addrinfo* result = nullptr;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &result) == 0 && result != nullptr) {
        std::string canonical = result->ai_canonname ? result->ai_canonname : "";
        ::freeaddrinfo(result);
        if (canonical.find('.') != std::string::npos) return canonical;
    }
    return host;
}

}  // namespace elastic::inline v0
// ---- end elastic/detail/host_name.hpp ----
// ---- begin elastic/report/error_file_content.hpp ----
// What reading a torchelastic error file gives: error_file_format, error_file_status,
// error_file_content and error_file_read, and the limits the reader applies. Only the types:
// the reader itself (and the full JSON library) is in elastic/report/error_file.hpp.


#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace elastic::inline v0 {

/// Which of the two shapes PyTorch's ProcessFailure accepts a file has.
enum class error_file_format {
    /// What `@record` (ErrorHandler.record_exception) and elastic::record write:
    /// `{"message": {"message": "<Type>: <what>", "extraInfo": {"py_callstack": "...",
    /// "timestamp": "<unix seconds>"}}}`, and, after a parent copied it up, `"errorCode": <int>`
    /// inside the outer "message" object.
    nested,
    /// The "new format" the reader also accepts: `{"message": "<text>", "timestamp": <seconds>}`.
    flat,
};

/// What reading a worker's error file found.
enum class error_file_status {
    /// No path was given, or no file exists there: the worker wrote nothing (a signal, a native
    /// binary without elastic::record, a Python script without @record). torchrun shows "<N/A>".
    absent,
    /// A well-formed file in one of the two formats.
    parsed,
    /// Something is there but cannot be used; `problem` says why.
    malformed,
};

/// The content of a well-formed error file.
struct error_file_content {
    error_file_format format = error_file_format::nested;
    /// "ValueError: boom" (nested) or the flat message. Empty when a nested file has none.
    std::string message;
    /// extraInfo.py_callstack of a nested file (a Python traceback, or elastic::record's C++
    /// backtrace), when present.
    std::optional<std::string> traceback;
    /// When the worker recorded the error, when the file says so.
    std::optional<std::chrono::system_clock::time_point> timestamp;
    /// True when the timestamp was a whole number of seconds (what PyTorch writes): the error
    /// then happened somewhere in [timestamp, timestamp + 1 s).
    bool timestamp_whole_seconds = true;
    /// message.errorCode (nested) or a top-level errorCode, set by a launcher that copied a
    /// child's file up.
    std::optional<long long> error_code;
    /// The file as parsed, key order kept, for copying into a parent's error file (shared and
    /// read-only, so that this header needs only <nlohmann/json_fwd.hpp>; null when not parsed).
    std::shared_ptr<const nlohmann::ordered_json> document;
};

/// The outcome of reading one error file; never an exception.
struct error_file_read {
    error_file_status status = error_file_status::absent;
    /// The path that was read (empty when the worker had none).
    std::string path;
    /// Meaningful when status == parsed.
    error_file_content content;
    /// When status == malformed: what is wrong, as one line of valid UTF-8.
    std::string problem;

    bool parsed() const noexcept { return status == error_file_status::parsed; }
};

/// Files larger than this are reported as malformed instead of read: a Python traceback is a
/// few kilobytes (RecursionError's is folded by Python), so megabytes mean garbage.
inline constexpr std::size_t max_error_file_bytes = std::size_t{4} << 20;

/// Nesting deeper than this is malformed (the formats need three levels); checked before
/// parsing so hostile input cannot make the parser or the copy recurse deeply.
inline constexpr int max_error_file_depth = 32;

/// The latest timestamp an error file may carry (2200-01-01 UTC, in seconds since the epoch).
inline constexpr double max_error_file_timestamp = 7258118400.0;

}  // namespace elastic::inline v0
// ---- end elastic/report/error_file_content.hpp ----
// ---- begin elastic/report/stderr_tail.hpp ----
// stderr_tail: the last lines a worker wrote to stderr, kept in a bounded ring for its failure
// report.

// ---- begin elastic/report/text.hpp ----
// Text hygiene for what workers write: UTF-8 repair and display width, so reports and JSON never
// carry invalid bytes.


#include <cstddef>
#include <string>
#include <string_view>

namespace elastic::inline v0::detail::report {

/// Length of the well-formed UTF-8 sequence at the start of `s` (1..4), or 0 when the first byte
/// does not begin one (stray continuation, overlong form, surrogate, past U+10FFFF, cut short).
ELASTIC_DECL std::size_t utf8_sequence_length(std::string_view s) noexcept;

/// `s` with every byte that is not part of well-formed UTF-8 replaced by U+FFFD (what Python's
/// errors="replace" does), so the text can go into JSON and onto a terminal unchanged otherwise.
ELASTIC_DECL std::string valid_utf8(std::string_view s);

/// The length of `s` in code points (Python's len() of the decoded text, which is how torchrun
/// measures the summary's width). Bytes outside well-formed UTF-8 count one each.
ELASTIC_DECL std::size_t code_points(std::string_view s) noexcept;

/// The longest prefix of `s` of at most `max_bytes` bytes that does not end inside a UTF-8
/// sequence (so truncating never manufactures an invalid byte).
ELASTIC_DECL std::string_view utf8_prefix(std::string_view s, std::size_t max_bytes) noexcept;

/// `s` without a UTF-8 sequence cut short at its end (what remains when a byte stream is cut at
/// an arbitrary byte); anything else, valid or not, is left alone.
ELASTIC_DECL std::string_view utf8_incomplete_tail_trimmed(std::string_view s) noexcept;

}  // namespace elastic::inline v0::detail::report

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::report {

ELASTIC_DECL std::size_t utf8_sequence_length(std::string_view s) noexcept {
    if (s.empty()) {
        return 0;
    }
    const auto b0 = static_cast<unsigned char>(s[0]);
    if (b0 < 0x80) {
        return 1;
    }
    std::size_t n = 0;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;
    // Ranges of the second byte from the Unicode standard, table 3-7.
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        n = 2;
    } else if (b0 == 0xE0) {
        n = 3;
        lo = 0xA0;
    } else if (b0 >= 0xE1 && b0 <= 0xEC) {
        n = 3;
    } else if (b0 == 0xED) {
        n = 3;
        hi = 0x9F;
    } else if (b0 >= 0xEE && b0 <= 0xEF) {
        n = 3;
    } else if (b0 == 0xF0) {
        n = 4;
        lo = 0x90;
    } else if (b0 >= 0xF1 && b0 <= 0xF3) {
        n = 4;
    } else if (b0 == 0xF4) {
        n = 4;
        hi = 0x8F;
    } else {
        return 0;
    }
    if (s.size() < n) {
        return 0;
    }
    const auto b1 = static_cast<unsigned char>(s[1]);
    if (b1 < lo || b1 > hi) {
        return 0;
    }
    for (std::size_t i = 2; i < n; ++i) {
        const auto b = static_cast<unsigned char>(s[i]);
        if (b < 0x80 || b > 0xBF) {
            return 0;
        }
    }
    return n;
}

ELASTIC_DECL std::string valid_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    while (!s.empty()) {
        const std::size_t n = utf8_sequence_length(s);
        if (n == 0) {
            out += "\xEF\xBF\xBD";
            s.remove_prefix(1);
        } else {
            out.append(s.data(), n);
            s.remove_prefix(n);
        }
    }
    return out;
}

ELASTIC_DECL std::size_t code_points(std::string_view s) noexcept {
    std::size_t count = 0;
    while (!s.empty()) {
        const std::size_t n = utf8_sequence_length(s);
        s.remove_prefix(n == 0 ? 1 : n);
        ++count;
    }
    return count;
}

ELASTIC_DECL std::string_view utf8_prefix(std::string_view s, std::size_t max_bytes) noexcept {
    if (s.size() <= max_bytes) {
        return s;
    }
    std::size_t end = max_bytes;
    // Step back over continuation bytes to the start of the sequence that straddles the cut.
    std::size_t back = 0;
    while (end > 0 && back < 3 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) {
        --end;
        ++back;
    }
    return s.substr(0, end);
}

ELASTIC_DECL std::string_view utf8_incomplete_tail_trimmed(std::string_view s) noexcept {
    for (std::size_t i = 1; i <= 3 && i <= s.size(); ++i) {
        const auto b = static_cast<unsigned char>(s[s.size() - i]);
        if ((b & 0xC0) == 0x80) {
            continue;  // a continuation byte: keep looking for the lead byte
        }
        std::size_t expected = 1;
        if ((b & 0xE0) == 0xC0) {
            expected = 2;
        } else if ((b & 0xF0) == 0xE0) {
            expected = 3;
        } else if ((b & 0xF8) == 0xF0) {
            expected = 4;
        }
        return expected > i ? s.substr(0, s.size() - i) : s;
    }
    return s;
}

}  // namespace elastic::inline v0::detail::report

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/report/text.hpp ----

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace elastic::inline v0 {

/// What a stderr_tail holds at one moment: the last lines, already valid UTF-8.
struct stderr_tail_snapshot {
    /// The last lines, oldest first, without their line terminators. A final unterminated line
    /// (the worker died mid-line) is included.
    std::vector<std::string> lines;
    /// Every line seen, including those the ring dropped (so a report can say "last 20 of 5000").
    std::uint64_t total_lines = 0;
    /// Every byte fed.
    std::uint64_t total_bytes = 0;

    bool empty() const noexcept { return lines.empty(); }
};

/// The last `max_lines` lines of a byte stream fed in arbitrary chunks (as they come off the
/// worker's stderr pipe: partial lines, several lines, any bytes).
///
/// Bounded memory whatever the worker writes: at most `max_lines` lines of at most
/// `max_line_bytes` bytes each are kept. A longer line keeps its beginning (where messages put
/// what matters) and ends in a marker saying how many bytes were cut. Lines end at "\n" or
/// "\r\n"; a lone "\r" (a progress bar redrawing itself) starts the line over, as a terminal
/// would show it. Bytes that are not well-formed UTF-8 become U+FFFD when a line is completed, so
/// every line can go into JSON. Not thread-safe: one reader (the agent's pipe coroutine) feeds it.
class stderr_tail {
public:
    /// 20 lines: enough for a C++ "terminate called ... what():" pair, a glog FATAL block or a
    /// short Python traceback, small enough that 64 failed workers stay readable.
    static constexpr std::size_t default_max_lines = 20;
    /// 2 KiB per line: any human-written message fits; a megabyte of base64 does not.
    static constexpr std::size_t default_max_line_bytes = 2048;

    explicit stderr_tail(std::size_t max_lines = default_max_lines, std::size_t max_line_bytes = default_max_line_bytes)
        : max_lines_(max_lines == 0 ? 1 : max_lines), max_line_bytes_(max_line_bytes < 16 ? 16 : max_line_bytes) {}

    /// Feed the next chunk of the stream.
    ELASTIC_DECL void feed(std::string_view chunk);

    /// The tail as it stands, including the line still being written.
    ELASTIC_DECL stderr_tail_snapshot snapshot() const;

    /// Forget everything (a new attempt of the same worker).
    ELASTIC_DECL void clear();

    std::size_t max_lines() const noexcept { return max_lines_; }
    std::size_t max_line_bytes() const noexcept { return max_line_bytes_; }

private:
    ELASTIC_DECL std::string finish(std::string_view line, std::uint64_t cut) const;

    ELASTIC_DECL void end_line();

    ELASTIC_DECL void restart_line();

    std::size_t max_lines_;
    std::size_t max_line_bytes_;
    std::deque<std::string> lines_;
    std::string current_;
    std::uint64_t cut_bytes_ = 0;
    bool pending_cr_ = false;
    std::uint64_t total_lines_ = 0;
    std::uint64_t total_bytes_ = 0;
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL void stderr_tail::feed(std::string_view chunk) {
    total_bytes_ += chunk.size();
    for (const char c : chunk) {
        if (pending_cr_) {
            pending_cr_ = false;
            if (c == '\n') {
                end_line();
                continue;
            }
            restart_line();
        }
        if (c == '\n') {
            end_line();
        } else if (c == '\r') {
            pending_cr_ = true;
        } else if (current_.size() < max_line_bytes_) {
            current_ += c;
        } else {
            ++cut_bytes_;
        }
    }
}

ELASTIC_DECL stderr_tail_snapshot stderr_tail::snapshot() const {
    stderr_tail_snapshot s;
    s.lines.assign(lines_.begin(), lines_.end());
    s.total_lines = total_lines_;
    s.total_bytes = total_bytes_;
    if (!current_.empty() || cut_bytes_ > 0) {
        s.lines.push_back(finish(current_, cut_bytes_));
        ++s.total_lines;
        if (s.lines.size() > max_lines_) {
            s.lines.erase(s.lines.begin());
        }
    }
    return s;
}

ELASTIC_DECL void stderr_tail::clear() {
    lines_.clear();
    current_.clear();
    cut_bytes_ = 0;
    pending_cr_ = false;
    total_lines_ = 0;
    total_bytes_ = 0;
}

ELASTIC_DECL std::string stderr_tail::finish(std::string_view line, std::uint64_t cut) const {
    // Cutting at max_line_bytes_ may have split a UTF-8 sequence: drop its first bytes too
    // rather than show them as U+FFFD.
    std::string_view kept = line;
    if (cut > 0) {
        const std::string_view whole = detail::report::utf8_incomplete_tail_trimmed(line);
        cut += kept.size() - whole.size();
        kept = whole;
    }
    std::string out = detail::report::valid_utf8(kept);
    if (cut > 0) {
        out += " [... ";
        out += std::to_string(cut);
        out += " more bytes]";
    }
    return out;
}

ELASTIC_DECL void stderr_tail::end_line() {
    std::string line = finish(current_, cut_bytes_);
    current_.clear();
    cut_bytes_ = 0;
    ++total_lines_;
    lines_.push_back(std::move(line));
    if (lines_.size() > max_lines_) {
        lines_.pop_front();
    }
}

ELASTIC_DECL void stderr_tail::restart_line() {
    current_.clear();
    cut_bytes_ = 0;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/report/stderr_tail.hpp ----

#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace elastic::inline v0 {

/// Why a worker is in a failure report.
enum class failure_state {
    /// It ended unsuccessfully on its own: a candidate for root cause.
    failed,
    /// The agent ended it while stopping the group after another worker failed (or on a signal
    /// to the agent): listed, never a root cause.
    stopped_by_agent,
};

/// One worker's end, as the agent observed it: everything a failure report says about it.
struct worker_failure {
    int local_rank = 0;
    int global_rank = 0;
    std::string role = "default";
    long pid = 0;
    /// The agent's host name, fully qualified (torchrun prints socket.getfqdn()); see host_fqdn().
    std::string host;
    exit_status status;
    /// When the agent saw the exit: steady for ordering, system for display (taken together).
    std::chrono::steady_clock::time_point observed_steady{};
    std::chrono::system_clock::time_point observed_system{};
    /// The worker's error file as read after its exit (its path is error_file.path).
    error_file_read error_file;
    /// The last lines of the worker's stderr (empty when it was not captured).
    stderr_tail_snapshot stderr_tail;
    failure_state state = failure_state::failed;

    /// Stamp both observation clocks with "now"; the agent calls it when the exit arrives.
    void observe_now() noexcept {
        observed_steady = std::chrono::steady_clock::now();
        observed_system = std::chrono::system_clock::now();
    }
};

/// torchrun's message for a failure without an error file and without a signal.
inline constexpr const char* no_traceback_hint =
    "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";

/// The one-line description of a failure: the error file's message when it has one, else
/// "Signal 9 (SIGKILL) received by PID 1234", else
/// "Process 1234 (rank: 3, local_rank: 1) exited with code 3".
ELASTIC_DECL std::string failure_headline(const worker_failure& f);

/// The stderr tail as a report shows it: a heading line, then the lines indented by two.
ELASTIC_DECL std::string stderr_tail_text(const stderr_tail_snapshot& tail);

/// What the summary prints after "traceback :" (multi-line; the summary indents continuation
/// lines). With a well-formed error file: torchrun's choice (py_callstack, else the message, else
/// "<N/A>"), with the message put first when the callstack does not contain it (a C++ backtrace
/// from elastic::record; a Python traceback always ends with it). Without one, what torchrun would
/// print (the signal message, or its hint) improved by the tail of the worker's stderr when there
/// is one. A malformed file is named as such first.
ELASTIC_DECL std::string failure_traceback(const worker_failure& f);

/// The instant used to order failures, on the agent's steady clock (see docs/failure-report.md):
/// the agent's observation of the exit, unless the worker's error file proves the error happened
/// earlier. A whole-second file timestamp t stands for [t, t+1), so it counts as the last instant
/// of that second (t+1 s minus one clock tick): it moves a failure earlier only when that second
/// ended before the agent saw the exit. The file's wall-clock time is related to the steady
/// clock through the same failure's pair of observation stamps (the worker runs on the agent's
/// host, so both read the same wall clock).
ELASTIC_DECL std::chrono::steady_clock::time_point failure_time(const worker_failure& f) noexcept;

/// The wall-clock time a report shows for a failure: the error file's timestamp when it has one
/// (as torchrun shows), else when the agent observed the exit.
ELASTIC_DECL std::chrono::system_clock::time_point failure_display_time(const worker_failure& f) noexcept;

/// The index of the root cause among `failures`: the earliest failure_time() among those in
/// state failed, the lowest global rank on a tie. Workers stopped by the agent are never chosen;
/// nullopt when there is no failed worker.
ELASTIC_DECL std::optional<std::size_t> root_cause(std::span<const worker_failure> failures) noexcept;

/// The exit code elasticrun ends with for a failure: the worker's own code, 128+N when signal N
/// killed it (the shell's convention), and at least 1 (a failure never reads as success).
constexpr int launcher_exit_code(const worker_failure& f) noexcept {
    const int code = f.status.shell_code();
    return code == 0 ? 1 : code;
}

/// The exit code for a group's failures: the root cause's (see the overload); nullopt when no
/// worker failed (the caller decides, e.g. 0, or 128+N for a signal the agent itself received).
ELASTIC_DECL std::optional<int> launcher_exit_code(std::span<const worker_failure> failures) noexcept;

/// torchrun's log line when a group fails (multiprocessing/api.py, logged at error level for the
/// first failure): `failed (exitcode: -9) local_rank: 1 (pid: 4201) of binary: train.py`.
ELASTIC_DECL std::string failure_log_line(const worker_failure& f, std::string_view entrypoint);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL std::string failure_headline(const worker_failure& f) {
    if (f.error_file.parsed() && !f.error_file.content.message.empty()) {
        return f.error_file.content.message;
    }
    if (f.status.signaled()) {
        return signal_message(f.status.signal(), f.pid);
    }
    return fmt::format("Process {} (rank: {}, local_rank: {}) exited with code {}", f.pid, f.global_rank, f.local_rank,
                       f.status.code());
}

ELASTIC_DECL std::string stderr_tail_text(const stderr_tail_snapshot& tail) {
    std::string out;
    if (tail.total_lines == tail.lines.size()) {
        out = fmt::format("stderr ({} line{}):", tail.lines.size(), tail.lines.size() == 1 ? "" : "s");
    } else {
        out = fmt::format("stderr (last {} of {} lines):", tail.lines.size(), tail.total_lines);
    }
    for (const auto& line : tail.lines) {
        out += "\n  ";
        out += line;
    }
    return out;
}

ELASTIC_DECL std::string failure_traceback(const worker_failure& f) {
    const auto& ef = f.error_file;
    if (ef.parsed()) {
        const auto& c = ef.content;
        if (c.format == error_file_format::flat) {
            return c.message;
        }
        if (c.traceback) {
            // A Python traceback ends with the message; elastic::record's C++ backtrace does not,
            // and torchrun's rule would then never show what the exception said.
            if (!c.message.empty() && c.traceback->find(c.message) == std::string::npos) {
                return c.message + "\n" + *c.traceback;
            }
            return *c.traceback;
        }
        return c.message.empty() ? std::string("<N/A>") : c.message;
    }
    std::string out;
    if (ef.status == error_file_status::malformed) {
        out = fmt::format("Malformed error file: {}", ef.problem);
    }
    if (f.status.signaled()) {
        if (!out.empty()) {
            out += '\n';
        }
        out += signal_message(f.status.signal(), f.pid);
    }
    if (!f.stderr_tail.empty()) {
        if (!out.empty()) {
            out += '\n';
        }
        out += stderr_tail_text(f.stderr_tail);
    }
    if (out.empty()) {
        out = no_traceback_hint;
    }
    return out;
}

ELASTIC_DECL std::chrono::steady_clock::time_point failure_time(const worker_failure& f) noexcept {
    if (f.error_file.parsed() && f.error_file.content.timestamp) {
        auto latest = *f.error_file.content.timestamp;
        if (f.error_file.content.timestamp_whole_seconds) {
            latest += std::chrono::seconds(1) - std::chrono::system_clock::duration(1);
        }
        if (latest < f.observed_system) {
            const auto earlier_by = f.observed_system - latest;
            return f.observed_steady - std::chrono::duration_cast<std::chrono::steady_clock::duration>(earlier_by);
        }
    }
    return f.observed_steady;
}

ELASTIC_DECL std::chrono::system_clock::time_point failure_display_time(const worker_failure& f) noexcept {
    if (f.error_file.parsed() && f.error_file.content.timestamp) {
        return *f.error_file.content.timestamp;
    }
    return f.observed_system;
}

ELASTIC_DECL std::optional<std::size_t> root_cause(std::span<const worker_failure> failures) noexcept {
    std::optional<std::size_t> best;
    for (std::size_t i = 0; i < failures.size(); ++i) {
        const auto& f = failures[i];
        if (f.state != failure_state::failed) {
            continue;
        }
        if (!best) {
            best = i;
            continue;
        }
        const auto& b = failures[*best];
        const auto ft = failure_time(f);
        const auto bt = failure_time(b);
        if (ft < bt || (ft == bt && f.global_rank < b.global_rank)) {
            best = i;
        }
    }
    return best;
}

ELASTIC_DECL std::optional<int> launcher_exit_code(std::span<const worker_failure> failures) noexcept {
    if (const auto root = root_cause(failures)) {
        return launcher_exit_code(failures[*root]);
    }
    return std::nullopt;
}

ELASTIC_DECL std::string failure_log_line(const worker_failure& f, std::string_view entrypoint) {
    return fmt::format("failed (exitcode: {}) local_rank: {} (pid: {}) of binary: {}", f.status.returncode(),
                       f.local_rank, f.pid, detail::report::valid_utf8(entrypoint));
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/report/failure.hpp ----

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json_fwd.hpp>
#if ELASTIC_DETAIL_BODIES
#include <nlohmann/json.hpp>
#endif

namespace elastic::inline v0 {

/// Writing a report file failed (the message names the path and the system's reason).
class report_error : public error {
public:
    using error::error;
};

/// The JSON the agent writes for its root cause. As torchrun's @record on main
/// (ErrorHandler.dump_error_file): the worker's own error file, copied, with
/// `message.errorCode` set to the worker's exit code in torchrun's numbering (-N for signal N).
/// Two additions where torchrun writes nothing useful:
/// - a flat-format file ("message" is a string), where torchrun skips the errorCode, gets it as
///   a top-level "errorCode";
/// - a worker without a well-formed file (a signal, a native binary, a malformed file), where
///   torchrun writes no file at all, gets one in @record's nested format: message = the
///   failure's headline ("Signal 9 (SIGKILL) received by PID 1234"), py_callstack = what the
///   summary shows as its traceback (the stderr tail), timestamp = the failure's time.
ELASTIC_DECL nlohmann::ordered_json agent_error_document(const worker_failure& root);

/// The agent's error file when the agent itself failed and no worker's failure explains it (a
/// rendezvous error, an internal error): @record's nested format, as torch's @record on
/// torchrun's main writes it for an exception (`message` = "<type>: <what>", `py_callstack`,
/// `timestamp` in whole seconds), plus `errorCode` = elasticrun's exit code (torch's @record
/// sets none here; an outer launcher reads it as this process's code).
ELASTIC_DECL nlohmann::ordered_json agent_exception_document(
    std::string_view type, std::string_view what, int exit_code,
    std::chrono::system_clock::time_point when = std::chrono::system_clock::now());

/// Replace the file at `path` with `contents` atomically: a temporary file in the same directory,
/// written, flushed to disk and renamed over `path`, so a reader sees the old file or the whole
/// new one, never a part. Throws report_error naming the path and the reason.
ELASTIC_DECL void write_file_atomically(const std::string& path, std::string_view contents);

/// Write the root cause into the error file at `path` (agent_error_document, replacing any file
/// there atomically). Throws report_error when the file cannot be written.
ELASTIC_DECL void write_agent_error_file(const std::string& path, const worker_failure& root);

/// Write the root cause into $TORCHELASTIC_ERROR_FILE, as torchrun's own main does. Returns
/// false, writing nothing, when the variable is unset or empty (no outer launcher asked).
ELASTIC_DECL bool write_agent_error_file(const worker_failure& root);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL nlohmann::ordered_json agent_error_document(const worker_failure& root) {
    using json = nlohmann::ordered_json;
    const int error_code = root.status.returncode();
    if (root.error_file.parsed()) {
        json doc = root.error_file.content.document ? *root.error_file.content.document : json();
        if (root.error_file.content.format == error_file_format::nested) {
            doc["message"]["errorCode"] = error_code;
        } else {
            doc["errorCode"] = error_code;
        }
        return doc;
    }
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(failure_display_time(root).time_since_epoch())
                             .count();
    json extra = json::object();
    extra["py_callstack"] = detail::report::valid_utf8(failure_traceback(root));
    extra["timestamp"] = std::to_string(seconds);
    json message = json::object();
    message["message"] = detail::report::valid_utf8(failure_headline(root));
    message["extraInfo"] = std::move(extra);
    message["errorCode"] = error_code;
    json doc = json::object();
    doc["message"] = std::move(message);
    return doc;
}

ELASTIC_DECL nlohmann::ordered_json agent_exception_document(std::string_view type, std::string_view what,
                                                             int exit_code,
                                                             std::chrono::system_clock::time_point when) {
    using json = nlohmann::ordered_json;
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(when.time_since_epoch()).count();
    const std::string message = detail::report::valid_utf8(fmt::format("{}: {}", type, what));
    json extra = json::object();
    extra["py_callstack"] = message;
    extra["timestamp"] = std::to_string(seconds);
    json inner = json::object();
    inner["message"] = message;
    inner["extraInfo"] = std::move(extra);
    inner["errorCode"] = exit_code;
    json doc = json::object();
    doc["message"] = std::move(inner);
    return doc;
}

ELASTIC_DECL void write_file_atomically(const std::string& path, std::string_view contents) {
    const auto slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? std::string(".") : path.substr(0, slash);
    const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
    if (base.empty()) {
        throw report_error(fmt::format("cannot write the error file \"{}\": the path names a "
                                       "directory, not a file",
                                       path));
    }
    std::string temp = fmt::format("{}/.{}.XXXXXX", dir, base);
    const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
    if (fd < 0) {
        throw report_error(fmt::format("cannot write the error file \"{}\": creating a temporary "
                                       "file in \"{}\" failed: {}",
                                       path, dir, std::strerror(errno)));
    }
    const auto fail = [&](const char* step) {
        const int err = errno;
        ::close(fd);
        ::unlink(temp.c_str());
        throw report_error(fmt::format("cannot write the error file \"{}\": {} \"{}\" failed: {}", path, step, temp,
                                       std::strerror(err)));
    };
    // mkstemp makes it 0600; an error file is read by whoever launched us, as torchrun's is.
    if (::fchmod(fd, 0644) != 0) {
        fail("setting the mode of");
    }
    std::string_view rest = contents;
    while (!rest.empty()) {
        const ssize_t n = ::write(fd, rest.data(), rest.size());
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            fail("writing");
        }
        rest.remove_prefix(static_cast<std::size_t>(n));
    }
    if (::fsync(fd) != 0) {
        fail("flushing");
    }
    if (::close(fd) != 0) {
        const int err = errno;
        ::unlink(temp.c_str());
        throw report_error(fmt::format("cannot write the error file \"{}\": closing \"{}\" "
                                       "failed: {}",
                                       path, temp, std::strerror(err)));
    }
    if (::rename(temp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(temp.c_str());
        throw report_error(fmt::format("cannot write the error file \"{}\": renaming \"{}\" to it "
                                       "failed: {}",
                                       path, temp, std::strerror(err)));
    }
}

ELASTIC_DECL void write_agent_error_file(const std::string& path, const worker_failure& root) {
    write_file_atomically(path, agent_error_document(root).dump());
}

ELASTIC_DECL bool write_agent_error_file(const worker_failure& root) {
    const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (path == nullptr || *path == '\0') {
        return false;
    }
    write_agent_error_file(std::string(path), root);
    return true;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/report/agent_error_file.hpp ----
// ---- begin elastic/report/error_file.hpp ----
// Reading torchelastic error files: both JSON shapes PyTorch reads (and elastic::record writes),
// with every way a file can be broken reported as "malformed", never thrown.


#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#if ELASTIC_DETAIL_BODIES
#include <nlohmann/json.hpp>
#endif

namespace elastic::inline v0 {

/// Parse the bytes of an error file (`path` is only recorded in the result). Never throws: every
/// defect, including running out of memory, comes back as status malformed with the reason.
ELASTIC_DECL error_file_read parse_error_file(std::string_view bytes, std::string path = {}) noexcept;

/// Read the error file at `path` (what the agent set as the worker's TORCHELASTIC_ERROR_FILE).
/// An empty path or no file there gives status absent. Anything that is not a readable regular
/// file of at most max_error_file_bytes holding one of the two formats gives status malformed
/// with the reason. Never throws and never blocks: a FIFO is opened non-blocking and rejected.
ELASTIC_DECL error_file_read read_error_file(const std::string& path) noexcept;

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

namespace detail::report {

/// Deepest [ / { nesting of a JSON text, strings skipped; stops counting past `limit`.
inline int json_depth(std::string_view text, int limit) noexcept {
    int depth = 0;
    int deepest = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') {
                ++i;
            } else if (c == '"') {
                in_string = false;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > deepest) {
                deepest = depth;
                if (deepest > limit) {
                    return deepest;
                }
            }
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return deepest;
}

inline int hex_digit(char c) noexcept {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/// The code unit of a "\uXXXX" escape starting at text[i] (the backslash), or -1.
inline long json_u_escape(std::string_view text, std::size_t i) noexcept {
    if (i + 6 > text.size() || text[i] != '\\' || text[i + 1] != 'u') {
        return -1;
    }
    long v = 0;
    for (std::size_t k = 2; k < 6; ++k) {
        const int d = hex_digit(text[i + k]);
        if (d < 0) {
            return -1;
        }
        v = v * 16 + d;
    }
    return v;
}

/// `text` with every unpaired UTF-16 surrogate escape ("\udc80") replaced by "\ufffd". Python's
/// json.dump writes those for undecodable bytes in a traceback (surrogateescape) and json.load
/// accepts them; nlohmann rejects them, so a reader that wants to agree with PyTorch repairs them.
inline std::string repair_lone_surrogates(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    bool in_string = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (!in_string) {
            in_string = c == '"';
            out += c;
            continue;
        }
        if (c == '"') {
            in_string = false;
            out += c;
            continue;
        }
        if (c != '\\' || i + 1 >= text.size()) {
            out += c;
            continue;
        }
        const long unit = json_u_escape(text, i);
        if (unit < 0) {
            out += c;
            out += text[++i];  // any other escape, copied whole so "\\u" is not misread
            continue;
        }
        if (unit >= 0xD800 && unit <= 0xDBFF) {
            const long next = json_u_escape(text, i + 6);
            if (next >= 0xDC00 && next <= 0xDFFF) {
                out.append(text.substr(i, 12));
                i += 11;
                continue;
            }
            out += "\\ufffd";
            i += 5;
            continue;
        }
        if (unit >= 0xDC00 && unit <= 0xDFFF) {
            out += "\\ufffd";
        } else {
            out.append(text.substr(i, 6));
        }
        i += 5;
    }
    return out;
}

/// nlohmann's exception text without its "[json.exception.parse_error.101] " prefix.
inline std::string json_error_text(const char* what) {
    std::string_view s = what;
    if (!s.empty() && s.front() == '[') {
        const auto close = s.find("] ");
        if (close != std::string_view::npos) {
            s.remove_prefix(close + 2);
        }
    }
    return valid_utf8(s);
}

/// A seconds-since-epoch value as JSON holds it: a number or a string of one (PyTorch writes
/// str(int(time.time()))). Returns nullopt when it is neither or out of any sane range.
inline std::optional<std::pair<std::chrono::system_clock::time_point, bool>> parse_epoch_seconds(
    const nlohmann::ordered_json& v) {
    double seconds = 0;
    bool whole = true;
    if (v.is_number_integer()) {
        seconds = v.is_number_unsigned() ? static_cast<double>(v.get<std::uint64_t>())
                                         : static_cast<double>(v.get<std::int64_t>());
    } else if (v.is_number_float()) {
        seconds = v.get<double>();
        whole = std::floor(seconds) == seconds;
    } else if (v.is_string()) {
        const auto& s = v.get_ref<const std::string&>();
        if (s.empty() || s.size() > 32) {
            return std::nullopt;
        }
        // from_chars, not stod: independent of the C locale's decimal point. Only plain
        // decimal numbers: "1700000000" or "1700000000.25", no "inf", "0x10", "1e9".
        for (const char c : s) {
            if (!((c >= '0' && c <= '9') || c == '.' || c == '-')) {
                return std::nullopt;
            }
        }
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), seconds);
        if (ec != std::errc{} || end != s.data() + s.size()) {
            return std::nullopt;
        }
        whole = s.find('.') == std::string::npos || std::floor(seconds) == seconds;
    } else {
        return std::nullopt;
    }
    // 1970 .. 2200: anything else is garbage. The bound matters: system_clock counts int64
    // nanoseconds, which end in 2262 (found by the fuzzer: a stamp in 2280 overflowed).
    if (!std::isfinite(seconds) || seconds < 0 || seconds > max_error_file_timestamp) {
        return std::nullopt;
    }
    // A double holds about 0.2 us at today's epoch values: round to whole microseconds.
    const auto since_epoch = std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::round<std::chrono::microseconds>(std::chrono::duration<double>(seconds)));
    return std::pair{std::chrono::system_clock::time_point(since_epoch), whole};
}

inline std::optional<long long> parse_error_code(const nlohmann::ordered_json& v) {
    if (v.is_number_integer()) {
        if (v.is_number_unsigned()) {
            const auto u = v.get<std::uint64_t>();
            if (u > static_cast<std::uint64_t>(INT64_MAX)) {
                return std::nullopt;
            }
            return static_cast<long long>(u);
        }
        return static_cast<long long>(v.get<std::int64_t>());
    }
    return std::nullopt;
}

inline error_file_read malformed(std::string path, std::string problem) {
    error_file_read r;
    r.status = error_file_status::malformed;
    r.path = std::move(path);
    r.problem = valid_utf8(problem);
    return r;
}

inline error_file_read parse_error_document(nlohmann::ordered_json doc, std::string path) {
    using json = nlohmann::ordered_json;
    if (!doc.is_object()) {
        return malformed(std::move(path), fmt::format("the top level is a JSON {}, not an object", doc.type_name()));
    }
    const auto message_it = doc.find("message");
    if (message_it == doc.end()) {
        return malformed(std::move(path), "no \"message\" key at the top level");
    }
    error_file_content c;
    const json& message = *message_it;
    if (message.is_string()) {
        c.format = error_file_format::flat;
        c.message = message.get<std::string>();
        if (const auto ts = doc.find("timestamp"); ts != doc.end() && !ts->is_null()) {
            const auto parsed = parse_epoch_seconds(*ts);
            if (!parsed) {
                return malformed(std::move(path), fmt::format("\"timestamp\" {} is not a number of seconds since "
                                                              "the epoch",
                                                              valid_utf8(ts->dump().substr(0, 64))));
            }
            c.timestamp = parsed->first;
            c.timestamp_whole_seconds = parsed->second;
        }
    } else if (message.is_object()) {
        c.format = error_file_format::nested;
        if (const auto m = message.find("message"); m != message.end()) {
            if (!m->is_string()) {
                return malformed(std::move(path),
                                 fmt::format("\"message.message\" is a JSON {}, not a string", m->type_name()));
            }
            c.message = m->get<std::string>();
        }
        if (const auto extra = message.find("extraInfo"); extra != message.end()) {
            if (!extra->is_object()) {
                return malformed(std::move(path),
                                 fmt::format("\"message.extraInfo\" is a JSON {}, not an object", extra->type_name()));
            }
            if (const auto cs = extra->find("py_callstack"); cs != extra->end()) {
                if (!cs->is_string()) {
                    return malformed(std::move(path),
                                     fmt::format("\"message.extraInfo.py_callstack\" is a JSON {}, not a "
                                                 "string",
                                                 cs->type_name()));
                }
                c.traceback = cs->get<std::string>();
            }
            if (const auto ts = extra->find("timestamp"); ts != extra->end() && !ts->is_null()) {
                const auto parsed = parse_epoch_seconds(*ts);
                if (!parsed) {
                    return malformed(std::move(path),
                                     fmt::format("\"message.extraInfo.timestamp\" {} is not a number of "
                                                 "seconds since the epoch",
                                                 valid_utf8(ts->dump().substr(0, 64))));
                }
                c.timestamp = parsed->first;
                c.timestamp_whole_seconds = parsed->second;
            }
        }
        if (const auto code = message.find("errorCode"); code != message.end()) {
            c.error_code = parse_error_code(*code);
            if (!c.error_code) {
                return malformed(std::move(path), fmt::format("\"message.errorCode\" {} is not an integer",
                                                              valid_utf8(code->dump().substr(0, 64))));
            }
        }
    } else {
        return malformed(std::move(path),
                         fmt::format("\"message\" is a JSON {}, neither a string nor an object", message.type_name()));
    }
    if (!c.error_code) {
        if (const auto code = doc.find("errorCode"); code != doc.end()) {
            c.error_code = parse_error_code(*code);
        }
    }
    c.document = std::make_shared<const nlohmann::ordered_json>(std::move(doc));
    error_file_read r;
    r.status = error_file_status::parsed;
    r.path = std::move(path);
    r.content = std::move(c);
    return r;
}

inline error_file_read parse_error_text(std::string_view bytes, std::string path) {
    using json = nlohmann::ordered_json;
    if (bytes.size() > max_error_file_bytes) {
        return malformed(std::move(path), fmt::format("{} bytes, more than the {} bytes an error "
                                                      "file may have",
                                                      bytes.size(), max_error_file_bytes));
    }
    std::size_t first = 0;
    while (first < bytes.size() &&
           (bytes[first] == ' ' || bytes[first] == '\n' || bytes[first] == '\r' || bytes[first] == '\t')) {
        ++first;
    }
    if (first == bytes.size()) {
        return malformed(std::move(path), bytes.empty() ? "the file is empty" : "the file holds only white space");
    }
    if (json_depth(bytes, max_error_file_depth) > max_error_file_depth) {
        return malformed(std::move(path), fmt::format("JSON nested deeper than {} levels", max_error_file_depth));
    }
    json doc;
    try {
        doc = json::parse(bytes);
    } catch (const json::exception& first_error) {
        // Retry once with Python's lone-surrogate escapes repaired (see repair_lone_surrogates).
        try {
            doc = json::parse(repair_lone_surrogates(bytes));
        } catch (const json::exception&) {
            return malformed(std::move(path), fmt::format("not valid JSON: {}", json_error_text(first_error.what())));
        }
    }
    return parse_error_document(std::move(doc), std::move(path));
}

}  // namespace detail::report

ELASTIC_DECL error_file_read parse_error_file(std::string_view bytes, std::string path) noexcept {
    try {
        return detail::report::parse_error_text(bytes, std::move(path));
    } catch (const std::exception& e) {
        try {
            return detail::report::malformed({}, fmt::format("could not be read: {}", e.what()));
        } catch (...) {
        }
    } catch (...) {
    }
    error_file_read r;
    r.status = error_file_status::malformed;
    return r;
}

ELASTIC_DECL error_file_read read_error_file(const std::string& path) noexcept {
    try {
        error_file_read r;
        r.path = path;
        if (path.empty()) {
            return r;
        }
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
        if (fd < 0) {
            const int err = errno;
            if (err == ENOENT || err == ENOTDIR) {
                return r;
            }
            return detail::report::malformed(path, fmt::format("cannot be opened: {}", std::strerror(err)));
        }
        struct closer {
            int fd;
            ~closer() { ::close(fd); }
        } close_on_exit{fd};
        struct stat st {};
        if (::fstat(fd, &st) != 0) {
            return detail::report::malformed(path, fmt::format("cannot be examined: {}", std::strerror(errno)));
        }
        if (!S_ISREG(st.st_mode)) {
            return detail::report::malformed(path, "not a regular file");
        }
        if (static_cast<unsigned long long>(st.st_size) > max_error_file_bytes) {
            return detail::report::malformed(path, fmt::format("{} bytes, more than the {} bytes an "
                                                               "error file may have",
                                                               st.st_size, max_error_file_bytes));
        }
        // Read to EOF rather than trust st_size: the file may still be growing.
        std::string bytes;
        char buffer[16384];
        for (;;) {
            const ssize_t n = ::read(fd, buffer, sizeof buffer);
            if (n < 0) {
                if (errno == EINTR) {
                    continue;
                }
                return detail::report::malformed(path, fmt::format("cannot be read: {}", std::strerror(errno)));
            }
            if (n == 0) {
                break;
            }
            bytes.append(buffer, static_cast<std::size_t>(n));
            if (bytes.size() > max_error_file_bytes) {
                return detail::report::malformed(path, fmt::format("more than the {} bytes an error "
                                                                   "file may have",
                                                                   max_error_file_bytes));
            }
        }
        return parse_error_file(bytes, path);
    } catch (...) {
        // Out of memory (the only thing left that throws). A short literal stays in the
        // string's own buffer, so building this result allocates nothing.
        error_file_read r;
        r.status = error_file_status::malformed;
        r.problem = "out of memory";
        return r;
    }
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/report/error_file.hpp ----
// ---- begin elastic/report/event.hpp ----
// Events in torchelastic's shape (torch.distributed.elastic.events.Event), the per-worker status
// event the agent records when a group ends, and an append-only JSON-lines event log.


#include <cerrno>
#include <chrono>
#include <cstdint>
#include <concepts>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>
#if ELASTIC_DETAIL_BODIES
#include <nlohmann/json.hpp>
#endif

namespace elastic::inline v0 {

/// Who produced an event (torch's EventSource).
enum class event_source { agent, worker };

/// One metadata value of an event: null, a boolean, an integer, a floating-point number or a
/// string, what torch's Event metadata may hold. Made implicitly from any of them (an integer
/// of at most 64 bits that fits in std::int64_t), so `m["pid"] = 42` and `m["state"] = "FAILED"`
/// read as they would with a JSON object.
class event_value {
public:
    using storage = std::variant<std::nullptr_t, bool, std::int64_t, double, std::string>;

    event_value() noexcept = default;
    event_value(std::nullptr_t) noexcept {}
    event_value(bool b) noexcept : value_(b) {}
    // clang-format off
    template <std::integral I>
        requires(!std::same_as<I, bool> && (std::signed_integral<I> || sizeof(I) < sizeof(std::int64_t)))
    event_value(I i) noexcept : value_(static_cast<std::int64_t>(i)) {}
    // clang-format on
    event_value(double d) noexcept : value_(d) {}
    event_value(std::string s) noexcept : value_(std::move(s)) {}
    event_value(std::string_view s) : value_(std::string(s)) {}
    event_value(const char* s) : value_(std::string(s)) {}

    [[nodiscard]] bool is_null() const noexcept { return std::holds_alternative<std::nullptr_t>(value_); }
    [[nodiscard]] bool is_bool() const noexcept { return std::holds_alternative<bool>(value_); }
    [[nodiscard]] bool is_integer() const noexcept { return std::holds_alternative<std::int64_t>(value_); }
    [[nodiscard]] bool is_float() const noexcept { return std::holds_alternative<double>(value_); }
    [[nodiscard]] bool is_string() const noexcept { return std::holds_alternative<std::string>(value_); }

    /// The value as `T` (bool, std::int64_t, double or std::string); std::bad_variant_access
    /// when it holds another type.
    template <class T>
    [[nodiscard]] const T& get() const {
        return std::get<T>(value_);
    }
    [[nodiscard]] const storage& value() const noexcept { return value_; }

    /// Equal when both hold the same type and value (1 and 1.0 differ).
    friend bool operator==(const event_value&, const event_value&) = default;

private:
    storage value_;
};

/// An event's metadata: keys in the order they were first set, each with an event_value.
class event_metadata {
public:
    using entry = std::pair<std::string, event_value>;
    using const_iterator = std::vector<entry>::const_iterator;

    /// The value at `key`; a new null one, last, when there is none.
    event_value& operator[](std::string_view key) {
        for (auto& e : entries_) {
            if (e.first == key) return e.second;
        }
        return entries_.emplace_back(std::string(key), event_value{}).second;
    }
    /// The value at `key`; std::out_of_range when there is none.
    [[nodiscard]] const event_value& operator[](std::string_view key) const {
        if (const auto* v = find(key)) return *v;
        throw std::out_of_range("event metadata has no key \"" + std::string(key) + "\"");
    }
    /// The value at `key`, or null when there is none.
    [[nodiscard]] const event_value* find(std::string_view key) const noexcept {
        for (const auto& e : entries_) {
            if (e.first == key) return &e.second;
        }
        return nullptr;
    }
    [[nodiscard]] bool contains(std::string_view key) const noexcept { return find(key) != nullptr; }
    /// Removes `key`; whether it was there.
    bool erase(std::string_view key) noexcept {
        for (auto it = entries_.begin(); it != entries_.end(); ++it) {
            if (it->first == key) {
                entries_.erase(it);
                return true;
            }
        }
        return false;
    }
    [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
    [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }
    [[nodiscard]] const_iterator begin() const noexcept { return entries_.begin(); }
    [[nodiscard]] const_iterator end() const noexcept { return entries_.end(); }

    friend bool operator==(const event_metadata&, const event_metadata&) = default;

private:
    std::vector<entry> entries_;
};

/// One event, serialised as torch's Event.serialize() does:
/// `{"name": ..., "source": "AGENT"|"WORKER", "timestamp": <ms>, "metadata": {...}}`, so torch's
/// Event.deserialize() reads ours. Metadata values are strings, numbers, booleans or null.
struct event {
    std::string name;
    event_source source = event_source::agent;
    /// Milliseconds since the epoch (torch documents this and leaves it 0; we set it).
    std::int64_t timestamp = 0;
    event_metadata metadata;

    /// One line of JSON (no newline). Bytes that are not UTF-8 become U+FFFD, so this never
    /// throws on what a worker wrote. A floating-point value that is not finite is written null.
    ELASTIC_DECL std::string serialize() const;
};

/// What a worker status event says beyond the failure itself: the agent's view of the run.
struct worker_event_context {
    std::string run_id;
    int group_rank = 0;
    int group_world_size = 1;
    /// The world size of the worker's role (ROLE_WORLD_SIZE), and what its role rank adds to its
    /// global rank (ROLE_RANK - RANK: the same for every worker of a node).
    int role_world_size = 1;
    int role_rank_offset = 0;
    std::string entry_point;
    std::string rdzv_backend;
    /// Whole seconds since the agent started running workers (torch's total_run_time).
    std::int64_t total_run_time = 0;
    /// Restarts so far (torch: max_restarts - remaining_restarts).
    int agent_restarts = 0;
    std::string hostname;
};

/// torch's state string for a worker in a failure report: "FAILED", or "TERMINATED" for a worker
/// the agent stopped (torch's _get_worker_state uses the same word for them).
inline std::string_view worker_event_state(const worker_failure& f) noexcept {
    return f.state == failure_state::failed ? "FAILED" : "TERMINATED";
}

/// One worker as a status event names it.
struct worker_status_subject {
    long pid = 0;
    int local_rank = 0;
    int global_rank = 0;
    std::string role;
};

/// The `torchelastic.worker.status.<STATE>` event for one worker of a failed group, with torch
/// 1.13's metadata keys (agent/server/api.py, _construct_event): run_id, global_rank, group_rank,
/// worker_id (the pid, as a string), role, hostname, state, total_run_time, rdzv_backend,
/// raw_error (the error file as JSON text; `{"message": "<NONE>"}` without one and null for a
/// worker the agent stopped, as torch), a
/// JSON-text "metadata" (group_world_size, entry_point, and local_rank / role_rank /
/// role_world_size as one-element lists, which is what torch's trailing commas produce), and
/// agent_restarts. Both JSON texts are written byte for byte as torch's json.dumps writes them
/// (", " and ": ", \uXXXX escapes). Additions: "exitcode" (torch's numbering) and the event's timestamp, the
/// failure's time in milliseconds.
ELASTIC_DECL event worker_status_event(const worker_failure& f, const worker_event_context& ctx);

/// The `torchelastic.worker.status.SUCCEEDED` event for one worker of a group that succeeded
/// (torch records one per worker at the end of a successful run): the same keys, raw_error
/// null, exitcode 0, stamped `when` (the agent's end of the run).
ELASTIC_DECL event worker_succeeded_event(const worker_status_subject& w, const worker_event_context& ctx,
                                          std::chrono::system_clock::time_point when);

/// An append-only log of events, one JSON line each. Each line goes out in one write(2) on a file
/// opened with O_APPEND, so several agents sharing the file (one per node on a shared file
/// system that honours O_APPEND, or several on one host) never interleave inside a line.
/// Recording never throws: an event log must not take the agent down.
class event_log {
public:
    /// Append to the file at `path`, creating it (0644). Throws report_error when it cannot be
    /// opened.
    explicit event_log(const std::string& path)
        : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)), owned_(true) {
        if (fd_ < 0) {
            throw report_error(fmt::format("cannot open the event log \"{}\": {}", path, std::strerror(errno)));
        }
    }

    /// Write to a descriptor the caller keeps open (e.g. 2 for a "console" log).
    static event_log to_descriptor(int fd) noexcept { return event_log(fd); }

    event_log(event_log&& other) noexcept
        : fd_(std::exchange(other.fd_, -1)), owned_(std::exchange(other.owned_, false)) {}
    ELASTIC_DECL event_log& operator=(event_log&& other) noexcept;
    event_log(const event_log&) = delete;
    event_log& operator=(const event_log&) = delete;
    ~event_log() { close(); }

    /// Append one event. Returns false (and loses only this event) when it cannot be written
    /// whole.
    ELASTIC_DECL bool record(const event& e) noexcept;

private:
    explicit event_log(int fd) noexcept : fd_(fd), owned_(false) {}

    ELASTIC_DECL void close() noexcept;

    int fd_ = -1;
    bool owned_ = false;
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

namespace detail::report {

struct string_sink {
    std::string& text;
    void put(char c) { text.push_back(c); }
};

// What Python's json.dumps(value) writes, byte for byte, for what torch builds its status events
// from: separators ", " and ": ", non-ASCII as \uXXXX (ensure_ascii), keys in their order.
// Numbers, booleans and null are spelt alike in both.
inline void python_json(std::string& out, const nlohmann::ordered_json& value) {
    string_sink sink{out};
    const auto quoted = [&](const std::string& text) {
        out.push_back('"');
        detail::json_escape(sink, text.data(), text.size());
        out.push_back('"');
    };
    if (value.is_object()) {
        out.push_back('{');
        bool first = true;
        for (auto it = value.begin(); it != value.end(); ++it) {
            if (!first) out += ", ";
            first = false;
            quoted(it.key());
            out += ": ";
            python_json(out, it.value());
        }
        out.push_back('}');
    } else if (value.is_array()) {
        out.push_back('[');
        for (std::size_t i = 0; i < value.size(); ++i) {
            if (i != 0) out += ", ";
            python_json(out, value[i]);
        }
        out.push_back(']');
    } else if (value.is_string()) {
        quoted(value.get_ref<const std::string&>());
    } else {
        out += value.dump();
    }
}

inline std::string python_json(const nlohmann::ordered_json& value) {
    std::string out;
    python_json(out, value);
    return out;
}

// torch 1.13's _construct_event for a worker, with our two additions (exitcode, timestamp).
inline event worker_status(std::string_view state, const worker_status_subject& w, event_value raw_error, int exitcode,
                           std::chrono::system_clock::time_point when, const worker_event_context& ctx) {
    using json = nlohmann::ordered_json;
    json md = json::object();
    md["group_world_size"] = ctx.group_world_size;
    md["entry_point"] = ctx.entry_point;
    md["local_rank"] = json::array({w.local_rank});
    md["role_rank"] = json::array({w.global_rank + ctx.role_rank_offset});
    md["role_world_size"] = json::array({ctx.role_world_size});

    event e;
    e.name = "torchelastic.worker.status." + std::string(state);
    e.source = event_source::worker;
    e.timestamp = std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count();
    auto& m = e.metadata;
    m["run_id"] = ctx.run_id;
    m["global_rank"] = w.global_rank;
    m["group_rank"] = ctx.group_rank;
    m["worker_id"] = std::to_string(w.pid);
    m["role"] = w.role;
    m["hostname"] = ctx.hostname;
    m["state"] = std::string(state);
    m["total_run_time"] = ctx.total_run_time;
    m["rdzv_backend"] = ctx.rdzv_backend;
    m["raw_error"] = std::move(raw_error);
    m["metadata"] = python_json(md);  // torch: json.dumps(md)
    m["agent_restarts"] = ctx.agent_restarts;
    m["exitcode"] = exitcode;
    return e;
}

// The metadata as a JSON object, in its order.
inline nlohmann::ordered_json to_json(const event_metadata& metadata) {
    auto out = nlohmann::ordered_json::object();
    for (const auto& entry : metadata) {
        std::visit([&out, &entry](const auto& v) { out[entry.first] = v; }, entry.second.value());
    }
    return out;
}

}  // namespace detail::report

ELASTIC_DECL std::string event::serialize() const {
    nlohmann::ordered_json j;
    j["name"] = name;
    j["source"] = source == event_source::agent ? "AGENT" : "WORKER";
    j["timestamp"] = timestamp;
    j["metadata"] = detail::report::to_json(metadata);
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

ELASTIC_DECL event worker_status_event(const worker_failure& f, const worker_event_context& ctx) {
    using json = nlohmann::ordered_json;
    // torch: json.dumps(failure.error_file_data) for a failure, None for a terminated worker.
    event_value raw_error;
    if (f.state == failure_state::stopped_by_agent) {
        raw_error = nullptr;
    } else if (f.error_file.parsed()) {
        raw_error = detail::report::python_json(f.error_file.content.document ? *f.error_file.content.document
                                                                              : json());
    } else if (f.error_file.status == error_file_status::malformed) {
        raw_error = detail::report::python_json(json{{"message", "Malformed error file: " + f.error_file.problem}});
    } else {
        raw_error = R"({"message": "<NONE>"})";
    }
    return detail::report::worker_status(worker_event_state(f), {f.pid, f.local_rank, f.global_rank, f.role},
                                         std::move(raw_error), f.status.returncode(), failure_display_time(f), ctx);
}

ELASTIC_DECL event worker_succeeded_event(const worker_status_subject& w, const worker_event_context& ctx,
                                          std::chrono::system_clock::time_point when) {
    return detail::report::worker_status("SUCCEEDED", w, nullptr, 0, when, ctx);
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL event_log& event_log::operator=(event_log&& other) noexcept {
    if (this != &other) {
        close();
        fd_ = std::exchange(other.fd_, -1);
        owned_ = std::exchange(other.owned_, false);
    }
    return *this;
}

ELASTIC_DECL bool event_log::record(const event& e) noexcept {
    try {
        std::string line = e.serialize();
        line += '\n';
        std::string_view rest = line;
        while (!rest.empty()) {
            const ssize_t n = ::write(fd_, rest.data(), rest.size());
            if (n < 0) {
                if (errno == EINTR) {
                    continue;
                }
                return false;
            }
            rest.remove_prefix(static_cast<std::size_t>(n));
        }
        return true;
    } catch (...) {
        return false;
    }
}

ELASTIC_DECL void event_log::close() noexcept {
    if (owned_ && fd_ >= 0) {
        ::close(fd_);
    }
    fd_ = -1;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/report/event.hpp ----
// ---- begin elastic/report/event_destination.hpp ----
// event_destination: the value of --event-log-handler (null, console, or file:PATH), parsed
// and printed; kept apart from the event sink so the launch configuration stays light.


#include <optional>
#include <string>
#include <string_view>

namespace elastic::inline v0 {

/// The value of --event-log-handler. torch's handler names `null` (the default: events are
/// dropped) and `console` (torch's logging.StreamHandler: each event's JSON on stderr, one line),
/// plus elastic's `file:PATH`: appended to PATH as JSON lines (created 0644 when absent; a
/// relative PATH is the agent's working directory's).
struct event_destination {
    enum class kind { null, console, file };
    kind what = kind::null;
    std::string path;  ///< for kind::file

    /// Reads `null`, `console` or `file:PATH` (PATH not empty); nullopt for anything else.
    /// Surrounding blanks are ignored, as everywhere on torchrun's command line.
    [[nodiscard]] static std::optional<event_destination> parse(std::string_view text) {
        while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
        while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
        if (text == "null") return event_destination{};
        if (text == "console") return event_destination{kind::console, {}};
        constexpr std::string_view file_prefix = "file:";
        if (text.substr(0, file_prefix.size()) == file_prefix && text.size() > file_prefix.size()) {
            return event_destination{kind::file, std::string(text.substr(file_prefix.size()))};
        }
        return std::nullopt;
    }

    /// What --event-log-handler accepts, for messages and --help.
    static constexpr std::string_view accepted = "null, console or file:PATH";

    /// The option's text: `null`, `console`, `file:PATH`.
    [[nodiscard]] std::string to_string() const {
        switch (what) {
            case kind::console: return "console";
            case kind::file: return "file:" + path;
            case kind::null: break;
        }
        return "null";
    }

    friend bool operator==(const event_destination&, const event_destination&) = default;
};

}  // namespace elastic::inline v0
// ---- end elastic/report/event_destination.hpp ----
// ---- begin elastic/report/event_sink.hpp ----
// Where the agent's events go (--event-log-handler: null, console, or file:PATH) and
// event_sink, which stamps each event with the agent's clocks and writes it as one JSON line.


#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace elastic::inline v0 {

/// Records events where an event_destination says. Each recorded event is stamped with three
/// clocks, all for the same instant (the moment the event happened as the agent knows it; for
/// a worker's exit, when the agent observed it):
/// - `timestamp` (torch's field): wall clock, milliseconds since the epoch;
/// - metadata `monotonic_ns`: the raw steady clock (CLOCK_MONOTONIC on Linux, comparable with
///   what other processes on the host read from it), nanoseconds;
/// - metadata `since_start_ns`: nanoseconds since the sink was made (the agent's start).
/// The wall clock may step (NTP); the monotonic stamps order a log.
///
/// Recording never throws and never blocks on anything but the write itself: an event log must
/// not take the agent down. A line is written with one write(2) (O_APPEND for a file), so lines
/// of several agents sharing a file never mix.
class event_sink {
public:
    /// The null sink: records nothing.
    event_sink() = default;

    /// A sink for `destination`. A file is opened (created, appended) now: throws report_error
    /// naming the path and the reason when it cannot be. `console_fd` is where `console` writes
    /// (stderr, as torch's StreamHandler).
    explicit event_sink(event_destination destination, int console_fd = 2) : destination_(std::move(destination)) {
        switch (destination_.what) {
            case event_destination::kind::console: log_.emplace(event_log::to_descriptor(console_fd)); break;
            case event_destination::kind::file: log_.emplace(event_log(destination_.path)); break;
            case event_destination::kind::null: break;
        }
    }

    /// False for the null sink: callers may skip building events.
    [[nodiscard]] bool enabled() const noexcept { return log_.has_value(); }
    [[nodiscard]] const event_destination& destination() const noexcept { return destination_; }
    /// The steady instant `since_start_ns` counts from.
    [[nodiscard]] std::chrono::steady_clock::time_point origin() const noexcept { return origin_; }

    /// Stamps `e` with the instant (`steady`, `wall`) and writes it. Returns false when nothing
    /// was written (null sink, or a failed write that loses this event only).
    ELASTIC_DECL bool record(event e, std::chrono::steady_clock::time_point steady,
                             std::chrono::system_clock::time_point wall) noexcept;

    /// Stamps `e` with now and writes it.
    bool record(event e) noexcept {
        return record(std::move(e), std::chrono::steady_clock::now(), std::chrono::system_clock::now());
    }

private:
    event_destination destination_;
    std::optional<event_log> log_;
    std::chrono::steady_clock::time_point origin_ = std::chrono::steady_clock::now();
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL bool event_sink::record(event e, std::chrono::steady_clock::time_point steady,
                                     std::chrono::system_clock::time_point wall) noexcept {
    if (!log_) return false;
    try {
        using namespace std::chrono;
        e.timestamp = duration_cast<milliseconds>(wall.time_since_epoch()).count();
        e.metadata["monotonic_ns"] = static_cast<std::int64_t>(
            duration_cast<nanoseconds>(steady.time_since_epoch()).count());
        e.metadata["since_start_ns"] = static_cast<std::int64_t>(duration_cast<nanoseconds>(steady - origin_).count());
        return log_->record(e);
    } catch (...) {
        return false;
    }
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/report/event_sink.hpp ----
// ---- begin elastic/report/exit_codes.hpp ----
// elasticrun's exit codes (docs/exit-codes.md): the root cause's code on a worker failure, and
// fixed codes for a usage error, a rendezvous error and the agent's own failure.


namespace elastic::inline v0::exit_codes {

// Schedulers act on these (Kubernetes' podFailurePolicy onExitCodes, Slurm's job state), so they
// must be told apart from what a worker passes through: a worker's own code 1..255 and 128 + N
// for signal N (129..192, N <= SIGRTMAX = 64). The agent's codes stay clear of every convention
// a worker or a wrapper commonly produces: 1 (any error, Python's uncaught exception), 2
// (argparse, torchrun), 64..78 (sysexits.h, e.g. a worker's "requeue me" 75), 124..127
// (timeout(1), docker, the shell's "cannot execute" / "not found"), 129..192 (signals),
// 200..243 (systemd decodes these as its own set-up failures: `status=243/CREDENTIALS`), and 255
// (exit(-1)). A worker that exits 250 or 251 itself still collides: the agent's error file
// ($TORCHELASTIC_ERROR_FILE) and the failure summary say which it was.

/// Every worker succeeded.
inline constexpr int success = 0;
/// The command line or the launch_config is invalid, or asks for something not implemented;
/// nothing was started (argparse's and torchrun's 2).
inline constexpr int usage = 2;
/// A worker failed and was not restarted, but the root cause reads as success (it exited 0
/// though judged failed): never report a failure as 0.
inline constexpr int failure_without_code = 1;
/// The rendezvous failed (elastic::rendezvous_error): the nodes could not agree on a round
/// (a timeout, an unreachable or vanished store, a run owned by another launcher). Often worth
/// retrying the whole job: nothing is wrong with the program.
inline constexpr int rendezvous = 250;
/// The agent itself failed (elastic::agent_error, or any unexpected exception): a directory it
/// cannot create, a store it cannot host, a worker it cannot start after validation.
inline constexpr int internal = 251;
/// The agent received signal N (and forwarded it to the workers): 128 + N, the shell's code.
[[nodiscard]] constexpr int signal(int number) noexcept { return 128 + number; }

}  // namespace elastic::inline v0::exit_codes
// ---- end elastic/report/exit_codes.hpp ----
// ---- begin elastic/report/summary.hpp ----
// The failure summary elasticrun prints when a group fails, in torchrun's layout
// (ChildFailedError's message).


#include <algorithm>
#include <chrono>
#include <cstddef>
#include <ctime>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace elastic::inline v0 {

/// How a summary is rendered.
struct summary_options {
    /// Show times in UTC instead of local time (torchrun uses local time; tests use UTC).
    bool utc = false;
    /// torchrun caps the borders at 60 columns.
    std::size_t max_width = 60;
};

namespace detail::report {

/// "YYYY-MM-DD_HH:MM:SS", Python's datetime.fromtimestamp(t).isoformat(sep="_") for whole t.
ELASTIC_DECL std::string summary_time(std::chrono::system_clock::time_point t, bool utc);

/// `text` with every line after the first indented by two spaces, as torchrun indents a
/// traceback (a trailing newline therefore leaves a line of two spaces, as in torchrun).
ELASTIC_DECL std::string indent_continuation(std::string_view text);

ELASTIC_DECL std::string failure_block(std::size_t idx, const worker_failure& f, bool utc);

ELASTIC_DECL std::size_t widest_line(std::string_view text);

}  // namespace detail::report

/// The summary of a group's failure in torchrun's layout: for failures torchrun
/// can express, byte for byte its ChildFailedError message (docs/failure-report.md lists the
/// deliberate differences). It starts with a newline and has no trailing newline. `name` is the entrypoint's name (the title is "<name> FAILED").
///
/// Failed workers are listed in global-rank order, numbered by that order; the root cause
/// (root_cause()) is shown under "Root Cause (first observed failure):", the others under
/// "Failures:". One addition to torchrun's layout, present only when some worker was stopped by
/// the agent: a section "Stopped by the agent (not failures):" between those two, one line per
/// such worker (torchrun lists them nowhere, or, newest, as failures).
ELASTIC_DECL std::string format_summary(std::string_view name, std::span<const worker_failure> failures,
                                        const summary_options& options = {});

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::report {

ELASTIC_DECL std::string summary_time(std::chrono::system_clock::time_point t, bool utc) {
    const std::time_t secs = std::chrono::system_clock::to_time_t(std::chrono::floor<std::chrono::seconds>(t));
    std::tm tm{};
    if (utc) {
        ::gmtime_r(&secs, &tm);
    } else {
        ::localtime_r(&secs, &tm);
    }
    return fmt::format("{:04}-{:02}-{:02}_{:02}:{:02}:{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                       tm.tm_min, tm.tm_sec);
}

ELASTIC_DECL std::string indent_continuation(std::string_view text) {
    std::string out;
    out.reserve(text.size() + 16);
    for (const char c : text) {
        out += c;
        if (c == '\n') {
            out += "  ";
        }
    }
    return out;
}

ELASTIC_DECL std::string failure_block(std::size_t idx, const worker_failure& f, bool utc) {
    const std::string error_file = f.error_file.status == error_file_status::absent || f.error_file.path.empty()
                                       ? std::string("<N/A>")
                                       : valid_utf8(f.error_file.path);
    return fmt::format("[{}]:\n"
                       "  time      : {}\n"
                       "  host      : {}\n"
                       "  rank      : {} (local_rank: {})\n"
                       "  exitcode  : {} (pid: {})\n"
                       "  error_file: {}\n"
                       "  traceback : {}",
                       idx, summary_time(failure_display_time(f), utc), valid_utf8(f.host), f.global_rank, f.local_rank,
                       f.status.returncode(), f.pid, error_file, indent_continuation(valid_utf8(failure_traceback(f))));
}

ELASTIC_DECL std::size_t widest_line(std::string_view text) {
    std::size_t widest = 0;
    std::size_t start = 0;
    while (start <= text.size()) {
        auto end = text.find('\n', start);
        if (end == std::string_view::npos) {
            end = text.size();
        }
        widest = std::max(widest, code_points(text.substr(start, end - start)));
        start = end + 1;
    }
    return widest;
}

}  // namespace detail::report
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL std::string format_summary(std::string_view name, std::span<const worker_failure> failures,
                                        const summary_options& options) {
    const std::string title = fmt::format("{} FAILED", detail::report::valid_utf8(name));
    std::vector<std::size_t> order(failures.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return failures[a].global_rank < failures[b].global_rank; });
    const auto root = root_cause(failures);

    std::size_t width = detail::report::code_points(title);
    std::string root_block;
    std::vector<std::string> other_blocks;
    std::vector<std::string> stopped_lines;
    std::size_t idx = 0;
    for (const std::size_t i : order) {
        const auto& f = failures[i];
        if (f.state == failure_state::stopped_by_agent) {
            std::string line = fmt::format("  rank {} (local_rank: {}): exitcode {} (pid: {})", f.global_rank,
                                           f.local_rank, f.status.returncode(), f.pid);
            width = std::max(width, detail::report::code_points(line));
            stopped_lines.push_back(std::move(line));
            continue;
        }
        std::string block = detail::report::failure_block(idx++, f, options.utc);
        width = std::max(width, detail::report::widest_line(block));
        if (root && i == *root) {
            root_block = std::move(block);
        } else {
            other_blocks.push_back(std::move(block));
        }
    }
    width = std::min(width, options.max_width);
    const std::string border(width, '=');
    const std::string section(width, '-');

    std::string out = fmt::format("\n{}\n{}\n{}\nFailures:\n", border, title, section);
    if (other_blocks.empty()) {
        out += "  <NO_OTHER_FAILURES>";
    }
    for (std::size_t k = 0; k < other_blocks.size(); ++k) {
        if (k > 0) {
            out += '\n';
        }
        out += other_blocks[k];
    }
    out += '\n';
    out += section;
    if (!stopped_lines.empty()) {
        out += "\nStopped by the agent (not failures):";
        for (const auto& line : stopped_lines) {
            out += '\n';
            out += line;
        }
        out += '\n';
        out += section;
    }
    out += "\nRoot Cause (first observed failure):\n";
    out += root ? root_block : std::string("  <NO_ROOT_CAUSE>");
    out += '\n';
    out += border;
    return out;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/report/summary.hpp ----
// ---- end elastic/report.hpp ----
// ---- begin elastic/rendezvous.hpp ----
// The rendezvous layer: how the agents of a job agree on a round (docs/rendezvous.md).

// ---- begin elastic/rendezvous/codec.hpp ----
// The rendezvous's store values (docs/rendezvous.md, "What the agents trust"): how a node's
// info, an assignment, an abort notice and a decision are written, and how each is read back
// and checked, since any client of the store may have written it.

// ---- begin elastic/rendezvous/concepts.hpp ----
// The rendezvous concept: how one node's agent joins a round of the job, learns its ranks and
// the workers' store, and hears of the job's events (a failure anywhere, the end of the job).


#include <asio/awaitable.hpp>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace elastic::inline v0 {

/// What a node tells the others when it joins a round.
struct node_info {
    std::string host;                  ///< its name, for messages (getfqdn() or --local-addr)
    std::string store_addr;            ///< where its fresh workers' store for this round listens
    std::uint16_t store_port = 0;      ///< that store's port
    int nproc = 1;                     ///< its workers (--nproc-per-node)
    std::string role = "default";      ///< its workers' role (--role): ROLE_RANK counts within a role
    std::optional<int> node_rank;      ///< --node-rank: the group rank it must get
    std::optional<int> previous_rank;  ///< its group rank in the previous round (stable order)
    long pid = 0;                      ///< the agent's process id, for messages
    std::string id;                    ///< its lease's name in the job (unique; empty: no liveness)
    std::uint16_t backup_port = 0;     ///< its idle store server at store_addr, should the job's move there
    bool hosts_store = false;          ///< it hosts the rendezvous store now
    /// The literal addresses of its interfaces (no loopback, no link-local IPv6): where its
    /// connections to group rank 0's workers' store may come from.
    std::vector<std::string> addrs;
};

/// Where the rendezvous store may move when its host is lost: an idle store server of a member.
struct store_successor {
    std::string id;          ///< the member's lease name
    std::string addr;        ///< its address
    std::uint16_t port = 0;  ///< its idle server's port
};

/// One completed round, as every node sees it (equal everywhere but group_rank and rank_base).
struct rendezvous_round {
    int number = 0;            ///< the round (0, 1, ...)
    int restart_count = 0;     ///< job-wide restarts before this round: TORCHELASTIC_RESTART_COUNT
    int group_rank = 0;        ///< this node's GROUP_RANK
    int group_world_size = 1;  ///< nodes in the round: GROUP_WORLD_SIZE
    int rank_base = 0;         ///< the global rank of this node's local rank 0
    int world_size = 1;        ///< workers in the round: WORLD_SIZE
    /// ROLE_RANK of this node's local rank 0: the workers of this node's role on the nodes of
    /// lower group rank (equal to rank_base when every node has the same role). -1: the
    /// rendezvous knows no roles, and the agent uses rank_base.
    int role_rank_base = -1;
    int role_world_size = -1;                 ///< workers of this node's role: ROLE_WORLD_SIZE; -1: world_size
    std::int64_t epoch = 0;                   ///< lease losses the round's completer had accounted for
    std::vector<store_successor> successors;  ///< where the store moves if its host is lost, in order
    bool host_in_round = false;               ///< the store's host is a member of this round
    std::string master_addr;                  ///< MASTER_ADDR: group rank 0's workers' store
    std::uint16_t master_port = 0;            ///< MASTER_PORT
    /// Group rank 0 only: every member's interface addresses (literals; a member that published
    /// none: its host and advertised address, names or literals), for its workers' store to
    /// accept connections from the round's nodes alone (empty on the other nodes).
    std::vector<std::string> peers;

    /// ROLE_RANK of local rank 0 and ROLE_WORLD_SIZE, the global ones when the rendezvous knows no
    /// roles (-1).
    [[nodiscard]] int role_base() const noexcept { return role_rank_base >= 0 ? role_rank_base : rank_base; }
    [[nodiscard]] int role_size() const noexcept { return role_world_size >= 0 ? role_world_size : world_size; }
};

/// Why a round ended early, or that the job ended: the first notice written wins (compare-and-set).
struct abort_notice {
    enum class kind {
        failure,     ///< a worker failed: the reporting node's policy decides (await_decision)
        membership,  ///< a node was lost, left or waits to join: every node rejoins the next round
        closed,      ///< the job ended: every node finished (standbys exit 0)
    };
    int group_rank = -1;  ///< the reporting node
    std::string host;     ///< its host
    std::string reason;   ///< one line: which local rank, which exit code or signal; which node
    kind what = kind::failure;
    bool admission = false;  ///< membership: a node waits to join (the next round then takes a last call)
    /// The reporting node's lease name (node_info::id), filled in by the rendezvous: a failure's
    /// reporter decides the round, and the others take the decision over when it is gone.
    std::string node{};
};

/// What the job does after an aborted round, decided by the node that aborted it.
struct job_decision {
    bool restart = false;  ///< true: every node rejoins the next round
    int exit_code = 1;     ///< when stopping: the code every node exits with (the root cause's)
    std::string reason;    ///< the policy's reason
    /// A restart taken over from a deciding node that was lost before it decided: the nodes
    /// re-form without it, as after any node loss (a membership restart, not counted).
    bool regroup = false;
};

/// How a node's exit barrier ended.
struct barrier_result {
    enum class kind { complete, aborted, timed_out };
    kind how = kind::complete;
    std::vector<int> missing;                ///< timed_out: the group ranks that did not finish
    std::vector<std::string> missing_hosts;  ///< timed_out: their hosts (same order)
    std::optional<abort_notice> abort;       ///< aborted: why
};

/*
 * rendezvous: one node's handle on the job's rounds. A model provides
 *   next_round(node_info)          -> awaitable<rendezvous_round>  join and await the round
 *   wait_for_abort()               -> awaitable<abort_notice>      the current round's abort
 *                                                                  (push; cancellable)
 *   abort(abort_notice)            -> awaitable<bool>   report a failure; true: this node won
 *   decide(job_decision)           -> awaitable<job_decision>  the winner publishes restart/
 *                                                       stop; returns the decision that stands
 *                                                       (another node's takeover, when this one
 *                                                       was taken for lost meanwhile)
 *   await_decision()               -> awaitable<job_decision>  the decision; taken over (a
 *                                                       regroup) when the decider is gone
 *   finish(timeout)                -> awaitable<barrier_result>  this node is done; exit barrier
 *   leave()                        -> awaitable<void>   this node is leaving the job for good
 * Waiting is by store notification, never by polling.
 */
template <class R>
concept rendezvous = requires(R& r, node_info info, abort_notice notice, job_decision decision,
                              std::chrono::milliseconds timeout) {
    { r.next_round(info) } -> std::same_as<asio::awaitable<rendezvous_round>>;
    { r.wait_for_abort() } -> std::same_as<asio::awaitable<abort_notice>>;
    { r.abort(notice) } -> std::same_as<asio::awaitable<bool>>;
    { r.decide(decision) } -> std::same_as<asio::awaitable<job_decision>>;
    { r.await_decision() } -> std::same_as<asio::awaitable<job_decision>>;
    { r.finish(timeout) } -> std::same_as<asio::awaitable<barrier_result>>;
    { r.leave() } -> std::same_as<asio::awaitable<void>>;
};

/*
 * agent_rendezvous: a rendezvous an agent runs a whole job over. Beside the rounds it provides
 *   join(node_info)                -> awaitable<void>   reach the job (host or connect to its
 *                                                       store) and hold this node's liveness
 *   keep_membership()              -> awaitable<void>   runs for as long as the node is in the
 *                                                       job (observes lost nodes); ends only by
 *                                                       cancellation or an error
 *   recover(reason, node_info)     -> awaitable<std::string>  the job's store was lost (`reason`):
 *                                                       rejoin it or move the job elsewhere and
 *                                                       say in one line what was done; throws
 *                                                       rendezvous_error when the job cannot go on
 *   restart_count()                -> int    job-wide restarts so far (TORCHELASTIC_RESTART_COUNT)
 *   stop()                         -> void   closes what it holds (after leave(); noexcept)
 * The agent's loop (local_agent) is written once over this concept: single_node_rendezvous is
 * the trivial model for one node, tcp_rendezvous the model for several.
 */
template <class R>
concept agent_rendezvous = rendezvous<R> && requires(R& r, const R& cr, node_info info, std::string reason) {
    { r.join(info) } -> std::same_as<asio::awaitable<void>>;
    { r.keep_membership() } -> std::same_as<asio::awaitable<void>>;
    { r.recover(reason, info) } -> std::same_as<asio::awaitable<std::string>>;
    { cr.restart_count() } -> std::convertible_to<int>;
    { r.stop() }
    noexcept;
};

}  // namespace elastic::inline v0
// ---- end elastic/rendezvous/concepts.hpp ----
// ---- begin elastic/rendezvous/error.hpp ----
// elastic::rendezvous_error: the nodes of a job could not agree on a round (a timeout, a store
// that vanished, a rendezvous owned by another launcher). elasticrun exits with its own code.
// elastic::store_lost_error: the rendezvous store itself is gone (a store_error).


#include <string>
#include <utility>

namespace elastic::inline v0 {

/// The rendezvous failed: the message names what was awaited (which nodes, which key, for how
/// long) and the remedy. No worker of the failed round was started.
class rendezvous_error : public error {
public:
    using error::error;
};

/// The job ended while this node waited as a standby (its round was full): not a failure;
/// elasticrun exits 0 with the message.
class rendezvous_closed : public rendezvous_error {
public:
    using rendezvous_error::rendezvous_error;
};

/// The rendezvous store is lost: the connection that held this node's lease ended (the store's
/// host died, or the network between them failed), so every operation of the rendezvous ends with
/// this error instead of waiting for its timeout. what() is "lost the rendezvous store: <reason>";
/// reason() is why the connection ended. The agent catches it by type: an elastic job moves its
/// rendezvous to a member's spare store, any other job ends with a rendezvous_error.
class store_lost_error : public store_error {
public:
    explicit store_lost_error(std::string reason)
        : store_error("lost the rendezvous store: " + reason), reason_(std::move(reason)) {}

    /// Why the lease connection ended, as the store client reported it.
    [[nodiscard]] const std::string& reason() const noexcept { return reason_; }

private:
    std::string reason_;
};

}  // namespace elastic::inline v0
// ---- end elastic/rendezvous/error.hpp ----

#include <asio/ip/address.hpp>
#include <fmt/format.h>
#if ELASTIC_DETAIL_BODIES
#include <nlohmann/json.hpp>
#endif

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

namespace detail::rendezvous {

/// A store value that is not what the rendezvous wrote there: bad JSON, a wrong type, a value
/// out of range. The rendezvous reports it (naming the key) and ignores it.
struct invalid_value : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// At most this many bytes of a value are shown in a message, non-printable bytes escaped.
inline std::string shown(std::string_view value, std::size_t limit = 120) {
    std::string out;
    for (const char c : value.substr(0, std::min(value.size(), limit))) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u < 0x7f && c != '\\') out += c;
        else out += fmt::format("\\x{:02x}", u);
    }
    if (value.size() > limit) out += fmt::format("... ({} bytes)", value.size());
    return out;
}

/// Bounds of what a node may say of itself: names and addresses as DNS allows them, a reason
/// of a few lines, a node's workers and ranks as counted in int.
inline constexpr std::size_t max_host = 255;
inline constexpr std::size_t max_id = 512;
inline constexpr std::size_t max_reason = 4096;
inline constexpr int max_nproc = 1 << 20;
inline constexpr int max_nodes = 1 << 20;
inline constexpr std::size_t max_addrs = 64;  ///< interface addresses one node publishes

/// What collect() deletes once no node can need a round any more: its arrivals (`k`), its size
/// (`n`) and its members' lease names.
struct round_manifest {
    int k = 0;
    int n = 0;
    std::vector<std::string> ids;
    /// The lease group's silent-loss count (`__silent`) when the round completed; -1: not read.
    std::int64_t silent = -1;
};

/// Whether `text` is an IPv4 or IPv6 address literal.
inline bool is_address_literal(const std::string& text) {
    std::error_code ec;
    (void)asio::ip::make_address(text, ec);
    return !ec;
}

// Each decoder reads a value any client of the store may have written: invalid_value (never
// another exception) when it is not what the rendezvous writes there. The JSON code is compiled
// where ELASTIC_DETAIL_BODIES says (with ELASTIC_SEPARATE_COMPILATION, in one file only).

/// A node's info, as an arrival writes it.
ELASTIC_DECL std::string encode(const node_info& i);
/// A node's info (an arrival).
ELASTIC_DECL node_info decode_node(std::string_view text);
/// A node's assignment, as the completer writes it (with `peers` for group rank 0 only).
ELASTIC_DECL std::string encode(const rendezvous_round& r);
/// A node's assignment as the completer wrote it; rendezvous_error when the round failed;
/// nothing when the round lost a node while forming and everyone rejoins the next one;
/// invalid_value when it is no assignment of a round of at most `nnodes` nodes.
ELASTIC_DECL std::optional<rendezvous_round> decode_assignment(std::string_view text, int nnodes);
/// The assignment every arrival gets when the round lost a node while forming; `majority_of`
/// (when above 0): too few joined after a member went silent, and the rounds that follow need a
/// majority of the last round's `majority_of` nodes.
ELASTIC_DECL std::string encode_retry(int majority_of = 0);
/// The `majority_of` of a retry (0 when it names none, or `text` is no retry); invalid_value
/// when it is outside 1..nnodes.
ELASTIC_DECL int decode_retry_majority(std::string_view text, int nnodes);
/// The assignment every arrival gets when the round failed: `message` says why.
ELASTIC_DECL std::string encode_round_error(std::string_view message);
/// `<round>/successors`, for a standby: whether the store's host was a member, and the list.
ELASTIC_DECL std::string encode_round_successors(bool host_in, const std::vector<store_successor>& successors);
ELASTIC_DECL std::pair<bool, std::vector<store_successor>> decode_round_successors(std::string_view text);
/// `<round>/hosts`: each group rank's host.
ELASTIC_DECL std::string encode_hosts(const std::vector<std::string>& hosts);
ELASTIC_DECL std::vector<std::string> decode_hosts(std::string_view text);
/// `<round>/manifest`; decoded with at most `nnodes` arrivals.
ELASTIC_DECL std::string encode(const round_manifest& m);
ELASTIC_DECL round_manifest decode_manifest(std::string_view text, int nnodes);
ELASTIC_DECL std::string encode(const abort_notice& a);
/// A round's abort notice; invalid_value when it is none, or names a group rank outside a round
/// of `size` nodes (-1: a node that is no member, a standby or a lost node's observer).
ELASTIC_DECL abort_notice decode_abort(std::string_view text, int size);
ELASTIC_DECL std::string encode(const job_decision& d);
/// A decision after an aborted round; invalid_value when it is none (an exit code is 0..255).
ELASTIC_DECL job_decision decode_decision(std::string_view text);

/// A counter the rendezvous keeps as decimal text (`__epoch`, `<round>/size`): invalid_value
/// unless it is a whole number within [lo, hi].
inline std::int64_t decode_count(std::string_view text, std::int64_t lo, std::int64_t hi) {
    std::int64_t v = 0;
    const auto* end = text.data() + text.size();
    const auto [p, ec] = std::from_chars(text.data(), end, v);
    if (ec != std::errc{} || p != end || text.empty()) throw invalid_value("not a whole number");
    if (v < lo || v > hi) throw invalid_value(fmt::format("{} is outside {}..{}", v, lo, hi));
    return v;
}

/// What a torchrun agent's C10dRendezvousBackend keeps its pickled state under.
inline std::string torchrun_key(const std::string& run_id) { return "torch.rendezvous." + run_id; }

/// What elastic writes at that key: not base64 of a pickle, so a torchrun agent joining the
/// same run stops with "the rendezvous state is corrupt" instead of mixing with us.
inline std::string guard_value(const std::string& run_id) {
    return fmt::format("elasticrun rendezvous of run '{}' (not a torchrun state)", run_id);
}

}  // namespace detail::rendezvous

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::rendezvous {

namespace codec {

inline nlohmann::json parse_object(std::string_view text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) throw invalid_value("not JSON");
    if (!j.is_object()) throw invalid_value("not a JSON object");
    return j;
}

/// Field `name` of `j` as an integer within [lo, hi].
inline std::int64_t field_int(const nlohmann::json& j, const char* name, std::int64_t lo, std::int64_t hi) {
    const auto it = j.find(name);
    if (it == j.end()) throw invalid_value(fmt::format("no '{}'", name));
    if (!it->is_number_integer()) throw invalid_value(fmt::format("'{}' is not an integer", name));
    const auto v = it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(hi)
                       ? hi + 1
                       : it->get<std::int64_t>();
    if (v < lo || v > hi) throw invalid_value(fmt::format("'{}' = {} is outside {}..{}", name, v, lo, hi));
    return v;
}

inline int field_small(const nlohmann::json& j, const char* name, std::int64_t lo, std::int64_t hi) {
    return static_cast<int>(field_int(j, name, lo, std::min<std::int64_t>(hi, 1'000'000'000)));
}

/// Field `name` of `j` as a string of at most `max` bytes (and at least `min`).
inline std::string field_string(const nlohmann::json& j, const char* name, std::size_t max, std::size_t min = 0) {
    const auto it = j.find(name);
    if (it == j.end()) throw invalid_value(fmt::format("no '{}'", name));
    if (!it->is_string()) throw invalid_value(fmt::format("'{}' is not a string", name));
    auto v = it->get<std::string>();
    if (v.size() > max || v.size() < min)
        throw invalid_value(fmt::format("'{}' has {} bytes (allowed: {}..{})", name, v.size(), min, max));
    return v;
}

/// A lease name: 1..max_id bytes, not the server's own ("__epoch", "__lost/<n>": a key that
/// always exists would pass for a lease that is held).
inline std::string lease_name(const nlohmann::json& j, const char* name) {
    auto v = field_string(j, name, max_id, 1);
    if (v.rfind("__", 0) == 0) throw invalid_value(fmt::format("'{}' is the store's own name, no lease", name));
    return v;
}

inline bool field_bool(const nlohmann::json& j, const char* name, std::optional<bool> absent = std::nullopt) {
    const auto it = j.find(name);
    if (it == j.end()) {
        if (absent) return *absent;
        throw invalid_value(fmt::format("no '{}'", name));
    }
    if (!it->is_boolean()) throw invalid_value(fmt::format("'{}' is not true or false", name));
    return it->get<bool>();
}

/// `decode()`, with any exception of the JSON library as invalid_value (the checks above leave
/// none, but a decoder's promise should not rest on that).
template <class Decode>
auto decoded(Decode decode) -> decltype(decode()) {
    try {
        return decode();
    } catch (const nlohmann::json::exception& e) {
        throw invalid_value(e.what());
    }
}

/// The successors a completer named: [{"id", "addr", "port"}, ...] (at most 3 are written).
inline std::vector<store_successor> decode_successors(const nlohmann::json& list) {
    if (!list.is_array()) throw invalid_value("'successors' is not a list");
    if (list.size() > 16)
        throw invalid_value(fmt::format("'successors' names {} servers (at most 3 are written)", list.size()));
    std::vector<store_successor> out;
    for (const auto& x : list) {
        if (!x.is_object()) throw invalid_value("a successor is not a JSON object");
        out.push_back({field_string(x, "id", max_id, 1), field_string(x, "addr", max_host, 1),
                       static_cast<std::uint16_t>(field_int(x, "port", 1, 65535))});
    }
    return out;
}

inline nlohmann::json encode_successors(const std::vector<store_successor>& successors) {
    auto out = nlohmann::json::array();
    for (const auto& x : successors) out.push_back({{"id", x.id}, {"addr", x.addr}, {"port", x.port}});
    return out;
}

/// A list of at most `max` strings of at most max_host bytes each.
inline std::vector<std::string> string_list(const nlohmann::json& list, std::size_t max, const char* what) {
    if (!list.is_array() || list.size() > max)
        throw invalid_value(fmt::format("'{}' is not a list of at most {} entries", what, max));
    std::vector<std::string> out;
    for (const auto& x : list) {
        if (!x.is_string() || x.get_ref<const std::string&>().size() > max_host)
            throw invalid_value(fmt::format("an entry of '{}' is not a host name or address", what));
        out.push_back(x.get<std::string>());
    }
    return out;
}

}  // namespace codec

ELASTIC_DECL std::string encode(const node_info& i) {
    nlohmann::json j{
        {"host", i.host}, {"addr", i.store_addr}, {"port", i.store_port}, {"nproc", i.nproc}, {"pid", i.pid}};
    if (i.node_rank) j["node_rank"] = *i.node_rank;
    if (i.role != "default") j["role"] = i.role;
    if (i.previous_rank) j["previous_rank"] = *i.previous_rank;
    if (!i.id.empty()) j["id"] = i.id;
    if (i.backup_port != 0) j["backup"] = i.backup_port;
    if (i.hosts_store) j["hosts_store"] = true;
    if (!i.addrs.empty()) j["addrs"] = i.addrs;
    return j.dump();
}

ELASTIC_DECL node_info decode_node(std::string_view text) {
    return codec::decoded([&] {
        using namespace codec;
        const auto j = parse_object(text);
        node_info i;
        i.host = field_string(j, "host", max_host);
        i.store_addr = field_string(j, "addr", max_host, 1);
        i.store_port = static_cast<std::uint16_t>(field_int(j, "port", 1, 65535));
        i.nproc = field_small(j, "nproc", 1, max_nproc);
        if (j.contains("role")) i.role = field_string(j, "role", max_host, 1);
        i.pid = static_cast<long>(field_int(j, "pid", 1, std::numeric_limits<std::int32_t>::max()));
        if (j.contains("node_rank")) i.node_rank = field_small(j, "node_rank", 0, max_nodes - 1);
        if (j.contains("previous_rank")) i.previous_rank = field_small(j, "previous_rank", 0, max_nodes - 1);
        if (j.contains("id")) i.id = lease_name(j, "id");
        if (j.contains("backup")) i.backup_port = static_cast<std::uint16_t>(field_int(j, "backup", 0, 65535));
        i.hosts_store = field_bool(j, "hosts_store", false);
        if (const auto it = j.find("addrs"); it != j.end()) {
            if (!it->is_array() || it->size() > max_addrs)
                throw invalid_value(fmt::format("'addrs' is not a list of at most {} addresses", max_addrs));
            for (const auto& a : *it) {
                if (!a.is_string() || a.get<std::string>().size() > max_host ||
                    !is_address_literal(a.get<std::string>()))
                    throw invalid_value("an entry of 'addrs' is not an IP address literal");
                i.addrs.push_back(a.get<std::string>());
            }
        }
        return i;
    });
}

ELASTIC_DECL std::string encode(const rendezvous_round& r) {
    auto j = nlohmann::json{{"group_rank", r.group_rank},
                            {"rank_base", r.rank_base},
                            {"world_size", r.world_size},
                            {"size", r.group_world_size},
                            {"epoch", r.epoch},
                            {"master_addr", r.master_addr},
                            {"master_port", r.master_port},
                            {"restarts", r.restart_count},
                            {"host_in", r.host_in_round},
                            {"successors", codec::encode_successors(r.successors)}};
    if (r.role_rank_base >= 0) j["role_rank_base"] = r.role_rank_base;
    if (r.role_world_size >= 0) j["role_world_size"] = r.role_world_size;
    if (r.group_rank == 0) j["peers"] = r.peers;
    return j.dump();
}

ELASTIC_DECL std::optional<rendezvous_round> decode_assignment(std::string_view text, int nnodes) {
    return codec::decoded([&]() -> std::optional<rendezvous_round> {
        using namespace codec;
        const auto j = parse_object(text);
        if (j.contains("error")) throw rendezvous_error(field_string(j, "error", max_reason));
        if (j.contains("retry")) return std::nullopt;
        rendezvous_round r;
        r.group_world_size = field_small(j, "size", 1, nnodes);
        r.epoch = field_int(j, "epoch", 0, std::numeric_limits<std::int64_t>::max());
        r.host_in_round = field_bool(j, "host_in", false);
        if (const auto it = j.find("successors"); it != j.end()) r.successors = decode_successors(*it);
        r.restart_count = field_small(j, "restarts", 0, std::numeric_limits<int>::max());
        r.group_rank = field_small(j, "group_rank", 0, r.group_world_size - 1);
        r.world_size = field_small(j, "world_size", r.group_world_size, std::numeric_limits<int>::max());
        r.rank_base = field_small(j, "rank_base", 0, r.world_size - 1);
        // A completer that predates roles sent neither: one role, the whole world.
        r.role_world_size = j.contains("role_world_size") ? field_small(j, "role_world_size", 1, r.world_size)
                                                          : r.world_size;
        r.role_rank_base = j.contains("role_rank_base") ? field_small(j, "role_rank_base", 0, r.role_world_size - 1)
                                                        : r.rank_base;
        r.master_addr = field_string(j, "master_addr", max_host, 1);
        r.master_port = static_cast<std::uint16_t>(field_int(j, "master_port", 1, 65535));
        if (const auto it = j.find("peers"); it != j.end()) {
            if (!it->is_array() || it->size() > (max_addrs + 2) * static_cast<std::size_t>(nnodes))
                throw invalid_value(fmt::format("'peers' is not a list of at most {} addresses per node",
                                                max_addrs + 2));
            for (const auto& p : *it) {
                if (!p.is_string() || p.get<std::string>().size() > max_host)
                    throw invalid_value("a peer is not a host name or address");
                r.peers.push_back(p.get<std::string>());
            }
        }
        return r;
    });
}

ELASTIC_DECL std::string encode_retry(int majority_of) {
    nlohmann::json j{{"retry", true}};
    if (majority_of > 0) j["majority_of"] = majority_of;
    return j.dump();
}

ELASTIC_DECL int decode_retry_majority(std::string_view text, int nnodes) {
    return codec::decoded([&] {
        using namespace codec;
        const auto j = parse_object(text);
        if (!j.contains("retry") || !j.contains("majority_of")) return 0;
        return field_small(j, "majority_of", 1, nnodes);
    });
}

ELASTIC_DECL std::string encode_round_error(std::string_view message) {
    return nlohmann::json{{"error", std::string(message)}}.dump();
}

ELASTIC_DECL std::string encode_round_successors(bool host_in, const std::vector<store_successor>& successors) {
    return nlohmann::json{{"host_in", host_in}, {"successors", codec::encode_successors(successors)}}.dump();
}

ELASTIC_DECL std::pair<bool, std::vector<store_successor>> decode_round_successors(std::string_view text) {
    return codec::decoded([&] {
        const auto j = codec::parse_object(text);
        const bool host_in = codec::field_bool(j, "host_in");
        const auto it = j.find("successors");
        if (it == j.end()) throw invalid_value("no 'successors'");
        return std::pair{host_in, codec::decode_successors(*it)};
    });
}

ELASTIC_DECL std::string encode_hosts(const std::vector<std::string>& hosts) { return nlohmann::json(hosts).dump(); }

ELASTIC_DECL std::vector<std::string> decode_hosts(std::string_view text) {
    return codec::decoded([&] {
        const auto j = nlohmann::json::parse(text, nullptr, false);
        if (j.is_discarded()) throw invalid_value("not JSON");
        return codec::string_list(j, static_cast<std::size_t>(max_nodes), "hosts");
    });
}

ELASTIC_DECL std::string encode(const round_manifest& m) {
    nlohmann::json j{{"k", m.k}, {"n", m.n}, {"ids", m.ids}};
    if (m.silent >= 0) j["silent"] = m.silent;
    return j.dump();
}

ELASTIC_DECL round_manifest decode_manifest(std::string_view text, int nnodes) {
    return codec::decoded([&] {
        using namespace codec;
        const auto j = parse_object(text);
        round_manifest m;
        m.k = field_small(j, "k", 0, nnodes);
        m.n = field_small(j, "n", 0, nnodes);
        const auto ids = j.find("ids");
        if (ids == j.end() || !ids->is_array() || ids->size() > static_cast<std::size_t>(m.k))
            throw invalid_value("'ids' is not a list of the arrivals");
        for (const auto& id : *ids) {
            if (!id.is_string()) throw invalid_value("an id is not a string");
            m.ids.push_back(id.get<std::string>());
        }
        if (j.contains("silent")) m.silent = field_int(j, "silent", 0, std::numeric_limits<std::int64_t>::max());
        return m;
    });
}

ELASTIC_DECL std::string encode(const abort_notice& a) {
    const char* what = a.what == abort_notice::kind::membership ? "membership"
                       : a.what == abort_notice::kind::closed   ? "closed"
                                                                : "failure";
    nlohmann::json j{{"group_rank", a.group_rank}, {"host", a.host}, {"reason", a.reason}, {"kind", what}};
    if (a.admission) j["admission"] = true;
    if (!a.node.empty()) j["node"] = a.node;
    return j.dump();
}

ELASTIC_DECL abort_notice decode_abort(std::string_view text, int size) {
    return codec::decoded([&] {
        using namespace codec;
        const auto j = parse_object(text);
        abort_notice a{field_small(j, "group_rank", -1, size - 1), field_string(j, "host", max_host),
                       field_string(j, "reason", max_reason)};
        const auto what = field_string(j, "kind", 16);
        if (what == "membership") a.what = abort_notice::kind::membership;
        else if (what == "closed") a.what = abort_notice::kind::closed;
        else if (what == "failure") a.what = abort_notice::kind::failure;
        else throw invalid_value(fmt::format("unknown kind '{}'", shown(what)));
        a.admission = field_bool(j, "admission", false);
        if (j.contains("node")) a.node = lease_name(j, "node");
        return a;
    });
}

ELASTIC_DECL std::string encode(const job_decision& d) {
    nlohmann::json j{{"restart", d.restart}, {"exit_code", d.exit_code}, {"reason", d.reason}};
    if (d.regroup) j["regroup"] = true;
    return j.dump();
}

ELASTIC_DECL job_decision decode_decision(std::string_view text) {
    return codec::decoded([&] {
        using namespace codec;
        const auto j = parse_object(text);
        job_decision d{field_bool(j, "restart"), field_small(j, "exit_code", 0, 255),
                       field_string(j, "reason", max_reason)};
        d.regroup = field_bool(j, "regroup", false);
        if (d.regroup && !d.restart) throw invalid_value("a regroup that is no restart");
        return d;
    });
}

}  // namespace elastic::inline v0::detail::rendezvous

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/rendezvous/codec.hpp ----
// ---- begin elastic/rendezvous/membership.hpp ----
// What a node learns of the job's membership from its lease connection: the lease losses in
// order, and whether the store itself was lost (docs/rendezvous.md, "Elastic membership").


#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/error.hpp>
#include <asio/this_coro.hpp>
#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

namespace detail::rendezvous {

/// A lease name as a person reads it: "host (pid N)" from "host:pid:tag".
ELASTIC_DECL std::string describe_node_id(std::string_view id);

/// What the node's lease connection learnt of the job's membership (docs/rendezvous.md,
/// "Elastic membership"), shared by the monitor and whoever waits for a change.
template <class Defer = void>
struct basic_membership_log {
    explicit basic_membership_log(const asio::any_io_executor& executor) : wake(executor) {}
    std::vector<std::pair<std::int64_t, std::string>> lost;  ///< (epoch, lease name), in order
    std::int64_t epoch = 0;                                  ///< the last loss seen (the group's __epoch)
    std::optional<std::string> store_lost;                   ///< why the lease connection ended
    async_signal wake;                                       ///< notified at each change: wakes every waiter

    void changed() { wake.notify(); }
    /// Completes at the next change; throws operation_aborted once cancelled (so no loop
    /// over it can spin on a cancelled wait).
    asio::awaitable<void> next() {
        co_await wake.wait();
        const auto state = co_await asio::this_coro::cancellation_state;
        if (state.cancelled() != asio::cancellation_type::none) {
            throw std::system_error(asio::error::operation_aborted, "membership wait cancelled");
        }
    }
    /// Completes when the store is lost, with why.
    asio::awaitable<std::string> until_store_lost() {
        while (!store_lost) co_await next();
        co_return *store_lost;
    }
};
using membership_log = basic_membership_log<>;

}  // namespace detail::rendezvous

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::rendezvous {

ELASTIC_DECL std::string describe_node_id(std::string_view id) {
    const auto last = id.rfind(':');
    if (last == std::string_view::npos || last == 0) return std::string(id);
    const auto mid = id.rfind(':', last - 1);
    if (mid == std::string_view::npos) return std::string(id);
    return fmt::format("{} (pid {})", id.substr(0, mid), id.substr(mid + 1, last - mid - 1));
}

}  // namespace detail::rendezvous
}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/rendezvous/membership.hpp ----
// ---- begin elastic/rendezvous/parameters.hpp ----
// What a rendezvous takes: the backend, the endpoint, the job's id, how many nodes, and the
// settings of `--rdzv-conf` (rendezvous_parameters). The launch layer makes one from the command
// line (launch_config::rendezvous()); a custom launcher may fill one itself.


#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace elastic::inline v0 {

using namespace std::chrono_literals;

/// `--nnodes`: how many nodes (agents) the job has, fixed (`N`, min == max) or elastic (`MIN:MAX`).
struct node_range {
    int min = 1;  ///< the job starts once this many nodes have joined
    int max = 1;  ///< nodes beyond this wait as standbys
    friend bool operator==(const node_range&, const node_range&) = default;
};

/// A `host[:port]` endpoint; an IPv6 host is written in brackets (`[::1]:29400`) and held without.
struct host_port {
    std::string host;
    std::optional<std::uint16_t> port;  ///< absent: the backend's default port
    friend bool operator==(const host_port&, const host_port&) = default;
};

/// The rendezvous implementation (`--rdzv-backend`).
enum class rendezvous_backend {
    static_,  ///< "static": fixed membership; node 0 hosts a store at --master-addr:--master-port
    c10d,     ///< "c10d": dynamic membership over a TCP store hosted by one agent
    etcd_v3,  ///< "etcd-v3": dynamic membership over an etcd server's v3 API
};

/// The name of a backend as written on the command line.
[[nodiscard]] constexpr std::string_view to_string(rendezvous_backend backend) noexcept {
    switch (backend) {
        case rendezvous_backend::static_: return "static";
        case rendezvous_backend::c10d: return "c10d";
        case rendezvous_backend::etcd_v3: return "etcd-v3";
    }
    return "?";
}

/// The default port of a backend's endpoint (torchrun's: 29400 for c10d, 2379 for etcd; the
/// static backend's endpoint is --master-addr:--master-port).
[[nodiscard]] constexpr std::uint16_t default_rendezvous_port(rendezvous_backend backend) noexcept {
    switch (backend) {
        case rendezvous_backend::static_: return 29500;
        case rendezvous_backend::c10d: return 29400;
        case rendezvous_backend::etcd_v3: return 2379;
    }
    return 0;
}

/// Settings of the rendezvous from `--rdzv-conf key=value,...`, with torchrun's defaults. Which
/// keys a backend reads is in docs/cli.md; a key the chosen backend does not read is an error.
struct rendezvous_settings {
    std::chrono::milliseconds join_timeout = 600s;      ///< c10d, etcd-v3: a round must form within
    std::chrono::milliseconds last_call_timeout = 30s;  ///< c10d, etcd-v3: wait for more after min
    std::chrono::milliseconds close_timeout = 30s;      ///< c10d, etcd-v3: closing the rendezvous
    std::chrono::milliseconds read_timeout = 60s;       ///< c10d, etcd-v3: connect and each request
    std::chrono::milliseconds timeout = 900s;           ///< static: all nodes must arrive within
    std::optional<bool> is_host;  ///< c10d: host the store here; unset: when the endpoint is this host
    /// elastic's own key (torchrun hard-codes 300 s): how long a node whose workers succeeded
    /// waits for the other nodes; unset: 300 s (torchrun's fixed value).
    std::optional<std::chrono::milliseconds> exit_barrier_timeout;
    /// c10d: how often an agent proves to the rendezvous store that it lives (its lease's
    /// heartbeat); torchrun's name, elastic's default (torchrun: 5 s).
    std::chrono::milliseconds keep_alive_interval = 1s;
    /// c10d: heartbeats missed in a row before an agent counts as lost (the store's verdict) or
    /// an agent counts its store as lost; torchrun's name, elastic's default (torchrun: 3).
    int keep_alive_max_attempt = 5;
    /// static, c10d: the file holding the job's secret, which authenticates every connection
    /// to the rendezvous store (docs/rendezvous.md, "Security"); elastic's own key.
    std::optional<std::string> secret_file;
    /// The job's secret itself: read from `secret_file` or ELASTIC_RDZV_SECRET by the agent
    /// (load_rendezvous_secret), never from the command line. Unset: no authentication.
    std::optional<std::string> secret;
    /// c10d: `workers_store_peers=any`: group rank 0's workers' store accepts every peer, not
    /// only the round's members' addresses (for NAT between the nodes); elastic's own key.
    bool workers_store_any_peer = false;
    friend bool operator==(const rendezvous_settings&, const rendezvous_settings&) = default;
};

/// `host:port` as it would be written again (IPv6 in brackets).
[[nodiscard]] ELASTIC_DECL std::string to_string(const host_port& endpoint);

/// Everything a rendezvous over TCP (tcp_rendezvous) takes, defaults applied.
struct rendezvous_parameters {
    rendezvous_backend backend = rendezvous_backend::static_;  ///< --rdzv-backend
    /// Where the rendezvous store is, defaults applied (launch_config::rendezvous_endpoint()):
    /// --rdzv-endpoint, else for static --master-addr:--master-port; host `localhost` and the
    /// backend's default port (default_rendezvous_port) when absent.
    host_port endpoint{"127.0.0.1", std::uint16_t{29500}};
    /// The endpoint's port was given (--rdzv-endpoint, --master-port) rather than defaulted. A
    /// single node binds the workers' store there only when it was given: two one-node jobs on
    /// a host would otherwise collide on the static backend's 29500.
    bool port_given = false;
    std::string run_id = "none";            ///< --rdzv-id: the job id, namespaces store keys
    node_range nnodes;                      ///< --nnodes
    std::optional<int> node_rank;           ///< --node-rank; static: rank 0 hosts the store
    std::optional<std::string> local_addr;  ///< --local-addr: the address this node advertises
    rendezvous_settings settings;           ///< --rdzv-conf
    friend bool operator==(const rendezvous_parameters&, const rendezvous_parameters&) = default;
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL std::string to_string(const host_port& endpoint) {
    const bool v6 = endpoint.host.find(':') != std::string::npos;
    auto out = v6 ? fmt::format("[{}]", endpoint.host) : endpoint.host;
    if (endpoint.port) {
        out += fmt::format(":{}", *endpoint.port);
    }
    return out;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/rendezvous/parameters.hpp ----
// ---- begin elastic/rendezvous/planner.hpp ----
// The round planner: what a round is, decided from its members alone (docs/rendezvous.md):
// group ranks, rank bases, the world size, the master, where the store may move and who may
// reach group rank 0's workers' store; and what an arrival or a seal of a round leads to.
// Pure functions of their arguments: no store, no coroutines. store_rendezvous runs them.


#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace elastic::inline v0 {

namespace detail::rendezvous {

/// The group rank of each node (by arrival order) or a message naming the conflict.
/// `--node-rank` first; the rest keep their previous order (stable), newcomers by arrival.
/// `strict` (fixed membership): a --node-rank outside the round or given twice is an error;
/// otherwise (elastic membership, where the round's size varies) it is a preference, honoured
/// when it fits the round and nobody before took it.
ELASTIC_DECL std::variant<std::vector<int>, std::string> assign_group_ranks(const std::vector<node_info>& nodes,
                                                                            bool strict = true);

/// Where the round's nodes connect to group rank 0's workers' store from: each node's published
/// interface addresses and its advertised address when that is a literal; for a node that
/// published none, its host and advertised address (names, resolved by group rank 0). Each
/// once, in order.
ELASTIC_DECL std::vector<std::string> peers_of(const std::vector<node_info>& nodes);

/// Added to a round's arrival counter to seal it: an arrival that reads at least this is late.
inline constexpr std::int64_t seal_increment = std::int64_t{1} << 32;

/// At most this many successors (idle servers of members) are named for the store.
inline constexpr std::size_t max_successors = 3;

/// A round decided from its members (in arrival order): what its completer writes.
struct round_plan {
    std::vector<int> group_rank;  ///< each member's group rank, in arrival order
    std::vector<int> rank_base;   ///< by group rank: the global rank of its local rank 0
    int world_size = 0;           ///< the round's workers (every member's nproc)
    /// By group rank: the ROLE_RANK of its local rank 0 (its role's workers on lower group
    /// ranks) and its role's workers in the round, as torchrun counts them.
    std::vector<int> role_rank_base;
    std::vector<int> role_world_size;
    std::size_t master = 0;          ///< the member (arrival order) of group rank 0: MASTER_ADDR/PORT
    std::vector<std::string> hosts;  ///< by group rank: each member's host, for messages
    bool host_in = false;            ///< the store's host is a member
    /// Where the store moves if its host is lost: the first members by group rank that have
    /// an idle server and do not host it now (docs/rendezvous.md).
    std::vector<store_successor> successors;
    std::vector<std::string> peers;  ///< peers_of(members), for group rank 0
};

/// The round `nodes` (its members, in arrival order) form, or a message naming why they form
/// none (assign_group_ranks: a --node-rank conflict under `strict`).
ELASTIC_DECL std::variant<round_plan, std::string> plan_round(const std::vector<node_info>& nodes, bool strict);

/// What decides a round's completion besides its arrivals.
struct round_rules {
    int nnodes = 1;        ///< MAX: the MAX-th arrival completes the round
    bool elastic = false;  ///< MIN < MAX
    int needed = 1;        ///< the nodes a round needs: MIN, or after the store moved a majority
    int target = 0;        ///< after the store moved: the arrival that seals the round (0: none)
};

/// What a node does once it arrived at a round as the `arrival`-th (the round's counter after
/// its add; a sealed round's counter holds seal_increment more).
enum class arrival_step {
    late,      ///< past MAX, or the round is sealed: the node is late for it
    complete,  ///< the MAX-th arrival: it completes the round with every arrival
    seal,      ///< the target arrival after the store moved: it seals the round
    try_seal,  ///< elastic, at least the nodes needed: it seals once every live node joined
    wait,      ///< it waits for its assignment
};

ELASTIC_DECL arrival_step on_arrival(std::int64_t arrival, const round_rules& rules);

/// Whether the `arrival`-th node's wait has a last call (after which it seals the round, or
/// marks the last call over for the live nodes still to come).
ELASTIC_DECL bool has_last_call(std::int64_t arrival, const round_rules& rules);

/// A seal's add returned `sealed`: the arrivals the sealer completes the round with, or nothing
/// when another seal came first or the MAX-th arrival completes the round.
ELASTIC_DECL std::optional<int> sealed_arrivals(std::int64_t sealed, int nnodes);

/// Whether a round whose counter reads `count` may be sealed once every live node joined: not
/// sealed, short of MAX (that arrival completes it), and with the nodes needed.
ELASTIC_DECL bool may_seal_when_all_live(std::int64_t count, const round_rules& rules);

/// Whether round r completes as soon as every live node joined: not the job's first round
/// (nodes are still starting), nor one that admits new nodes (others may be starting with
/// them: torchrun's last call lets a batch of new nodes in with one restart), nor the first
/// after the store moved.
ELASTIC_DECL bool quick_round(int r, bool admission, int target) noexcept;

/// The rules of the first round after the store moved, from the last round's size and whether
/// the store's lost host was among its members: a majority of them (`quorum`), and the arrival
/// that seals the round at once (every other member of the last round; at least the quorum).
struct moved_round {
    int quorum = 1;
    int target = 1;
};

ELASTIC_DECL moved_round after_store_moved(int last_size, bool host_in_round) noexcept;

}  // namespace detail::rendezvous

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::rendezvous {

ELASTIC_DECL std::variant<std::vector<int>, std::string> assign_group_ranks(const std::vector<node_info>& nodes,
                                                                            bool strict) {
    const int n = static_cast<int>(nodes.size());
    std::vector<int> rank(nodes.size(), -1);
    std::vector<int> owner(nodes.size(), -1);
    for (int i = 0; i < n; ++i) {
        const auto& given = nodes[static_cast<std::size_t>(i)].node_rank;
        if (!given) continue;
        if (!strict && (*given < 0 || *given >= n || owner[static_cast<std::size_t>(*given)] >= 0)) continue;
        if (*given < 0 || *given >= n) {
            return fmt::format("--node-rank={} of {} (pid {}) is outside 0..{} for --nnodes={}", *given,
                               nodes[static_cast<std::size_t>(i)].host, nodes[static_cast<std::size_t>(i)].pid, n - 1,
                               n);
        }
        auto& o = owner[static_cast<std::size_t>(*given)];
        if (o >= 0) {
            const auto& a = nodes[static_cast<std::size_t>(o)];
            const auto& b = nodes[static_cast<std::size_t>(i)];
            return fmt::format("--node-rank={} given by two nodes, {} (pid {}) and {} (pid {}); each node needs its "
                               "own --node-rank",
                               *given, a.host, a.pid, b.host, b.pid);
        }
        o = i;
        rank[static_cast<std::size_t>(i)] = *given;
    }
    std::vector<int> rest;
    for (int i = 0; i < n; ++i)
        if (rank[static_cast<std::size_t>(i)] < 0) rest.push_back(i);
    // Survivors first in their previous order, then newcomers in arrival order.
    std::stable_sort(rest.begin(), rest.end(), [&](int a, int b) {
        const auto& pa = nodes[static_cast<std::size_t>(a)].previous_rank;
        const auto& pb = nodes[static_cast<std::size_t>(b)].previous_rank;
        if (pa && pb) return *pa < *pb;
        return pa.has_value() && !pb.has_value();
    });
    std::size_t next = 0;
    for (int r = 0; r < n; ++r) {
        if (owner[static_cast<std::size_t>(r)] >= 0) continue;
        rank[static_cast<std::size_t>(rest[next++])] = r;
    }
    return rank;
}

ELASTIC_DECL std::vector<std::string> peers_of(const std::vector<node_info>& nodes) {
    std::vector<std::string> out;
    auto add = [&](const std::string& p) {
        if (!p.empty() && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    };
    for (const auto& node : nodes) {
        if (node.addrs.empty()) {
            add(node.host);
            add(node.store_addr);
            continue;
        }
        for (const auto& a : node.addrs) add(a);
        if (is_address_literal(node.store_addr)) add(node.store_addr);
    }
    return out;
}

ELASTIC_DECL std::variant<round_plan, std::string> plan_round(const std::vector<node_info>& nodes, bool strict) {
    if (nodes.empty()) return std::string("a round needs at least one node");
    auto assigned = assign_group_ranks(nodes, strict);
    if (auto* message = std::get_if<std::string>(&assigned)) return std::move(*message);
    round_plan plan;
    plan.group_rank = std::get<0>(std::move(assigned));
    const auto n = nodes.size();
    std::vector<std::size_t> by_rank(n);
    for (std::size_t i = 0; i < n; ++i) by_rank[static_cast<std::size_t>(plan.group_rank[i])] = i;
    plan.rank_base.reserve(n);
    for (std::size_t g = 0; g < n; ++g) {
        const auto& node = nodes[by_rank[g]];
        plan.rank_base.push_back(plan.world_size);
        plan.world_size += node.nproc;
        plan.hosts.push_back(node.host);
    }
    std::map<std::string, int, std::less<>> role_workers;
    plan.role_rank_base.reserve(n);
    for (std::size_t g = 0; g < n; ++g) {
        int& seen = role_workers[nodes[by_rank[g]].role];
        plan.role_rank_base.push_back(seen);
        seen += nodes[by_rank[g]].nproc;
    }
    plan.role_world_size.reserve(n);
    for (std::size_t g = 0; g < n; ++g) plan.role_world_size.push_back(role_workers[nodes[by_rank[g]].role]);
    plan.master = by_rank[0];
    for (std::size_t g = 0; g < n; ++g) {
        const auto& node = nodes[by_rank[g]];
        if (node.hosts_store) plan.host_in = true;
        if (node.hosts_store || node.backup_port == 0 || plan.successors.size() >= max_successors) continue;
        plan.successors.push_back({node.id, node.store_addr, node.backup_port});
    }
    plan.peers = peers_of(nodes);
    return plan;
}

ELASTIC_DECL arrival_step on_arrival(std::int64_t arrival, const round_rules& rules) {
    if (arrival > rules.nnodes) return arrival_step::late;
    if (arrival == rules.nnodes) return arrival_step::complete;
    if (rules.target > 0 && arrival == rules.target) return arrival_step::seal;
    if (rules.elastic && arrival >= rules.needed) return arrival_step::try_seal;
    return arrival_step::wait;
}

ELASTIC_DECL bool has_last_call(std::int64_t arrival, const round_rules& rules) {
    return (rules.elastic || rules.target > 0) && arrival >= rules.needed;
}

ELASTIC_DECL std::optional<int> sealed_arrivals(std::int64_t sealed, int nnodes) {
    if (sealed < seal_increment || sealed >= 2 * seal_increment) return std::nullopt;
    const auto joined = sealed - seal_increment;
    if (joined >= nnodes || joined < 1) return std::nullopt;
    return static_cast<int>(joined);
}

ELASTIC_DECL bool may_seal_when_all_live(std::int64_t count, const round_rules& rules) {
    return count < seal_increment && count < rules.nnodes && count >= rules.needed;
}

ELASTIC_DECL bool quick_round(int r, bool admission, int target) noexcept { return r > 0 && !admission && target == 0; }

ELASTIC_DECL moved_round after_store_moved(int last_size, bool host_in_round) noexcept {
    const int before = std::max(last_size, 1);
    moved_round m;
    m.quorum = before / 2 + 1;
    m.target = std::max(1, before - (host_in_round ? 1 : 0));
    if (m.target < m.quorum) m.target = m.quorum;
    return m;
}

}  // namespace detail::rendezvous
}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/rendezvous/planner.hpp ----
// ---- begin elastic/rendezvous/single_node.hpp ----
// single_node_rendezvous: the rendezvous of a job that is one node — the trivial model of
// agent_rendezvous, so the agent runs one loop for one node and many.


#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <utility>

namespace elastic::inline v0 {

/// One node is the whole job: every round completes at once with this node as group rank 0 and
/// its own workers' store as MASTER_ADDR:MASTER_PORT; no other node can abort a round, so this
/// node's abort always wins and its decision is the job's; the exit barrier is already complete.
/// There is no shared store to lose. The restart count is the decisions to restart so far.
template <class Defer = void>
class basic_single_node_rendezvous {
public:
    asio::awaitable<void> join(node_info) { co_return; }

    /// Nothing to observe: waits until cancelled.
    asio::awaitable<void> keep_membership() { co_await forever(); }

    asio::awaitable<rendezvous_round> next_round(node_info me) {
        rendezvous_round round;
        round.number = rounds_++;
        round.restart_count = restarts_;
        round.group_rank = 0;
        round.group_world_size = 1;
        round.rank_base = 0;
        round.world_size = me.nproc;
        round.role_rank_base = 0;
        round.role_world_size = me.nproc;
        round.host_in_round = true;
        round.master_addr = std::move(me.store_addr);
        round.master_port = me.store_port;
        decision_.reset();
        co_return round;
    }

    /// No other node: waits until cancelled.
    asio::awaitable<abort_notice> wait_for_abort() {
        co_await forever();
        co_return abort_notice{};
    }

    asio::awaitable<bool> abort(abort_notice) { co_return true; }

    asio::awaitable<job_decision> decide(job_decision decision) {
        if (decision.restart) ++restarts_;
        decision_ = std::move(decision);
        co_return *decision_;
    }

    /// The decision this node made for the round. It is the only node: with none made there is
    /// nothing to await, and rendezvous_error says so.
    asio::awaitable<job_decision> await_decision() {
        if (!decision_) throw rendezvous_error("no decision to await: one node decides its own rounds");
        co_return *decision_;
    }

    asio::awaitable<barrier_result> finish(std::chrono::milliseconds) { co_return barrier_result{}; }
    asio::awaitable<void> leave() { co_return; }

    /// Unreachable in practice (there is no store to lose): the job cannot go on.
    asio::awaitable<std::string> recover(std::string reason, node_info) {
        throw rendezvous_error(std::move(reason));
        co_return std::string();
    }

    [[nodiscard]] int restart_count() const noexcept { return restarts_; }
    void stop() noexcept {}

private:
    static asio::awaitable<void> forever() {
        asio::steady_timer never(co_await asio::this_coro::executor, asio::steady_timer::time_point::max());
        co_await never.async_wait(detail::use_awaitable<Defer>);
    }

    int rounds_ = 0;
    int restarts_ = 0;
    std::optional<job_decision> decision_;
};
using single_node_rendezvous = basic_single_node_rendezvous<>;

static_assert(agent_rendezvous<single_node_rendezvous>);

}  // namespace elastic::inline v0
// ---- end elastic/rendezvous/single_node.hpp ----
// ---- begin elastic/rendezvous/store_rendezvous.hpp ----
// store_rendezvous: the fixed-membership rendezvous over any `store` model (docs/rendezvous.md):
// per-node keys, O(1) store operations per node per round, waiting by store notification.


#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace elastic::inline v0 {

/// How a store_rendezvous behaves.
struct store_rendezvous_options {
    std::string run_id = "none";  ///< --rdzv-id: namespaces every key
    int nnodes = 1;               ///< MAX: a round completes at once when this many nodes joined
    int min_nodes = 0;            ///< MIN (0: nnodes, fixed membership)
    /// A round must complete within this (--rdzv-conf join_timeout; static: timeout).
    std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
    /// MIN < MAX: how long the job's first round waits for more nodes once MIN joined; later
    /// rounds complete as soon as every live node joined, and wait at most this for a straggler.
    std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
    /// The store's host waits this long for the others to leave before it stops serving.
    std::chrono::milliseconds close_timeout{std::chrono::seconds(30)};
    /// Whether this node hosts the store: leave() then waits for every other node to leave.
    bool hosts_store = false;
    /// Check (and claim) torchrun's key for the run id, so a Python agent and ours never mix.
    bool torchrun_guard = true;
    /// Where the rendezvous reports what a user should see (standby, membership); may be empty.
    std::function<void(std::string_view)> log;
    /// Where it reports a store value it ignored (not valid: a broken or hostile client wrote
    /// it); `log` when empty. The agent logs these as warnings.
    std::function<void(std::string_view)> warn;
    /// The job's restart budget when every node's policy is --max-restarts (a restart decision
    /// past it is ignored); none: any count the job's `restarts` key backs is accepted.
    std::optional<int> max_restarts;

    [[nodiscard]] int min() const noexcept { return min_nodes > 0 ? min_nodes : nnodes; }
    [[nodiscard]] bool elastic() const noexcept { return min() < nnodes; }
};

/// The rendezvous over any `store` (docs/rendezvous.md has the algorithm). Per round and node:
/// one `add` (arrival index), one `set` (its info), one `wait` and one `get` (its assignment);
/// the node that completes the round also does one `multi_get` of every info and one
/// `multi_set` of every assignment. Nothing polls: waits are store pushes.
///
/// Fixed membership (MIN = MAX): a round completes when MAX nodes joined. Elastic membership
/// (MIN < MAX): the job's first round completes at MAX, or last_call_timeout after MIN joined;
/// a later round as soon as every live node joined (at least MIN). A node arriving at a round
/// that runs with fewer than MAX nodes aborts it (the members restart to admit it); one arriving
/// at a full round waits as a standby until a member goes or the job ends.
///
/// Liveness (start_liveness, on a connection of its own that holds this node's lease): a lost
/// member aborts the running round at once, and a lost node no longer counts as live for a
/// forming one. `store` serves requests in turn; `watcher` carries the long waits (a TCP client
/// serves one request at a time; a memory_store may be passed twice). All must outlive this
/// object. Use it on the stores' thread.
template <store Store>
class store_rendezvous {
public:
    store_rendezvous(Store& store, Store& watcher, store_rendezvous_options options)
        : store_(&store), watcher_(&watcher), options_(std::move(options)) {}

    [[nodiscard]] const store_rendezvous_options& options() const noexcept { return options_; }
    /// The current round (-1 before the first).
    [[nodiscard]] int round_number() const noexcept { return round_; }
    /// Job-wide restarts so far (agreed through the store).
    [[nodiscard]] int restart_count() const noexcept { return restarts_; }

    // ---- liveness ---------------------------------------------------------------------------

    /// The lease group of this job's nodes.
    [[nodiscard]] std::string lease_group() const { return job_key("nodes"); }

    /// Holds this node's lease (name `me.id`) on `lease`, a connection used for nothing else,
    /// and counts the node as registered. Call once, before the first round; then run
    /// keep_membership() for as long as the node is in the job.
    // clang-format off
    asio::awaitable<void> start_liveness(Store& lease, node_info me)
        requires requires(Store& s, std::string k, std::string v) {
            { s.hold_lease(k, v) } -> std::same_as<asio::awaitable<void>>;
        }
    {
        // clang-format on
        auto log = std::make_shared<detail::rendezvous::membership_log>(co_await asio::this_coro::executor);
        co_await lease.hold_lease(lease_key(lease_group(), me.id), detail::rendezvous::encode(me));
        // A store that keeps leases counts their losses from the first lease it binds: no
        // counter now means a store that does not (PyTorch's TCPStore), where every wait for a
        // loss would wait for ever. Said at once, before anything else is written there.
        if (std::vector<std::string> epoch{lease_epoch_key(lease_group())}; !co_await lease.check(std::move(epoch))) {
            std::vector<std::string> torchrun{detail::rendezvous::torchrun_key(options_.run_id)};
            if (options_.torchrun_guard && co_await lease.check(std::move(torchrun)))
                throw rendezvous_error(torchrun_state_message());
            throw rendezvous_error(
                "it keeps no leases, so it is no elastic store: a PyTorch TCPStore (one a torchrun agent "
                "hosts, or one a finished job's workers left on this port) or another program listens there; point "
                "--rdzv-endpoint at the port an elasticrun agent hosts its store on, or free this one");
        }
        (void)co_await lease.add(job_key("registered"), 1);
        log->epoch = co_await read_epoch(lease, 0);
        lease_ = &lease;
        id_ = me.id;
        auto previous = std::exchange(members_, std::move(log));
        if (previous) previous->changed();  // a moved store: the observer follows
    }

    /// The rendezvous store was lost and the job moves to `store` and `watcher` (connections
    /// to a successor's idle server): the next round continues the numbering, needs a majority
    /// of the last round's members (a minority cut off from the store never goes on alone),
    /// and completes at once when every other member of the last round joined, else
    /// last_call_timeout after the majority. Then call start_liveness() with a new connection.
    void move_to(Store& store, Store& watcher, bool hosts_it) {
        store_ = &store;
        watcher_ = &watcher;
        options_.hosts_store = hosts_it;
        const auto moved = detail::rendezvous::after_store_moved(size_, host_in_round_);
        quorum_ = moved.quorum;
        majority_of_ = 0;
        target_ = moved.target;
        phase_ = phase::idle;
    }

    /// This node reconnected to the same store (which had dropped it): new connections; then
    /// call start_liveness() with a new lease connection. It rejoins at the next round.
    void reconnected(Store& store, Store& watcher) {
        store_ = &store;
        watcher_ = &watcher;
        phase_ = phase::idle;
        rediscover_ = true;  // the others went on without this node: find the job's round again
    }

    /// The last round's successors (where the store may move), after next_round().
    [[nodiscard]] const std::vector<store_successor>& successors() const noexcept { return successors_; }
    /// The size of the last round this node took part in or waited beside as a standby.
    [[nodiscard]] int last_round_size() const noexcept { return size_; }
    /// Whether this node hosts the rendezvous store.
    [[nodiscard]] bool hosts_store() const noexcept { return options_.hosts_store; }

    /// Observes the job's lease losses for ever (cancel it to stop): a lost member of the
    /// running round aborts the round; a loss during a forming round may complete it. When the
    /// lease connection ends, the store counts as lost (until_store_lost()); it never throws.
    asio::awaitable<void> keep_membership() {
        if (!members_) co_return;
        for (;;) {
            auto log = members_;
            auto* lease = lease_;
            try {
                for (;;) {
                    const auto k = lease_lost_key(lease_group(), log->epoch + 1);
                    if (const auto missed = co_await erased_losses(*lease, log->epoch); missed > 0) {
                        // Counted, named by nobody: the same as a record that names no lease.
                        log->epoch += missed;
                        log->lost.emplace_back(log->epoch, std::string{});
                        log->changed();
                        if (log == members_) co_await on_loss(*lease, log->epoch, std::string{});
                        continue;
                    }
                    co_await wait_long(*lease, k);
                    auto name = co_await lease->get(k);
                    if (name.empty() || name.size() > detail::rendezvous::max_id) {
                        // Not a lease name the server wrote: the loss is counted, nobody is named.
                        ignored(k, name, "not a lease name", "no member is taken for lost by it");
                        name.clear();
                    }
                    ++log->epoch;
                    log->lost.emplace_back(log->epoch, name);
                    log->changed();
                    if (log == members_) co_await on_loss(*lease, log->epoch, name);
                }
            } catch (const std::system_error& e) {
                if (e.code() == asio::error::operation_aborted) throw;
                log->store_lost = e.what();
            } catch (const std::exception& e) {
                log->store_lost = e.what();
            }
            log->changed();
            // Lost: wait until the job moves to another store (start_liveness), or for ever.
            while (members_ == log) co_await log->next();
        }
    }

    /// Whether this node's lease connection ends within `within` (true at once when it has):
    /// the store's own verdict on an error seen on another connection.
    asio::awaitable<bool> confirm_store_lost(std::chrono::milliseconds within) {
        using namespace asio::experimental::awaitable_operators;
        if (!members_) co_return false;
        if (members_->store_lost) co_return true;
        auto log = members_;
        asio::steady_timer timer(co_await asio::this_coro::executor, within);
        auto which = co_await (log->until_store_lost() || timer.async_wait(detail::as_tuple_awaitable<Store>));
        co_return which.index() == 0;
    }

    /// Whether the lease connection ended (the store is gone or unreachable), and why.
    [[nodiscard]] std::optional<std::string> store_lost() const {
        if (!members_) return std::nullopt;
        return members_->store_lost;
    }

    // ---- rounds ------------------------------------------------------------------------------

    /// Joins the next round with `me` and returns once it completes. rendezvous_error after
    /// join_timeout or on conflicting --node-rank; rendezvous_closed when the job ended while
    /// this node waited as a standby; store_lost_error when the store is lost.
    asio::awaitable<rendezvous_round> next_round(node_info me) {
        const auto started = std::chrono::steady_clock::now();
        if (me.previous_rank == std::nullopt && group_rank_ >= 0) me.previous_rank = group_rank_;
        if (round_ < 0 || rediscover_) {
            if (round_ < 0 && options_.torchrun_guard) co_await guard();
            // A node joining a running job starts at its last completed round (0 for a new job),
            // arrives late there and is admitted from it.
            round_ = static_cast<int>(co_await store_->add(job_key("round"), 0)) - 1;
            rediscover_ = false;
        }
        for (;;) {
            ++round_;
            const int r = round_;
            phase_ = phase::forming;
            finished_ = false;
            standing_.reset();
            const auto arrival = co_await store_->add(key(r, "count"), 1);
            const auto step = detail::rendezvous::on_arrival(arrival, rules());
            if (step == detail::rendezvous::arrival_step::late) {
                co_await late(r, me);
                continue;
            }
            me.hosts_store = options_.hosts_store;
            co_await store_->set(key(r, fmt::format("info/{}", arrival)), detail::rendezvous::encode(me));
            if (step == detail::rendezvous::arrival_step::complete) {
                co_await complete(*store_, r, static_cast<int>(arrival));
            } else if (step == detail::rendezvous::arrival_step::seal) {
                co_await seal(*store_, r);
            } else if (step == detail::rendezvous::arrival_step::try_seal) {
                co_await complete_if_all_live(*store_, r);
            }
            auto assigned = co_await await_assignment(r, arrival, started);
            if (!assigned) continue;  // the round lost a node while forming: the next one
            auto round = *assigned;
            round.number = r;
            restarts_ = round.restart_count;
            group_rank_ = round.group_rank;
            size_ = round.group_world_size;
            running_epoch_ = round.epoch;
            host_in_round_ = round.host_in_round;
            successors_ = round.successors;
            quorum_ = 0;
            majority_of_ = 0;
            target_ = 0;
            phase_ = phase::running;
            // Losses this node saw after the completer's epoch but before it ran: a member may
            // be among them.
            if (members_) {
                const auto seen = members_->lost;  // the monitor may append meanwhile
                for (const auto& [epoch, name] : seen) {
                    if (epoch > running_epoch_ && name != id_) co_await on_member_loss(*store_, r, name);
                }
            }
            co_return round;
        }
    }

    /// Completes when the current round is aborted (by store push; no polling); cancel it when
    /// the round ends otherwise. store_lost_error when the store is lost. A value in the abort key
    /// that is no valid notice is reported and ignored: the wait goes on at the next slot
    /// (`abort/1`, ...), where a real abort is then written (abort()).
    asio::awaitable<abort_notice> wait_for_abort() {
        const int r = round_;
        for (int slot = 0; slot < max_slots; ++slot) {
            const auto k = slot_key(r, "abort", slot);
            if (co_await round_collected(*watcher_, r)) co_return missed_abort(r);
            co_await wait_interruptible(*watcher_, k, std::nullopt);
            if (co_await round_collected(*watcher_, r)) co_return missed_abort(r);
            const auto value = co_await watcher_->get(k);
            if (auto notice = valid_abort(k, value)) {
                admission_ = notice->admission;
                standing_ = *notice;
                co_return std::move(*notice);
            }
        }
        throw rendezvous_error(too_many_invalid(r, "abort"));
    }

    /// Aborts the current round with `notice`; true when this node was the first.
    asio::awaitable<bool> abort(abort_notice notice) {
        auto [standing, won] = co_await abort_round(*store_, round_, std::move(notice));
        admission_ = standing.admission;
        standing_ = std::move(standing);
        co_return won;
    }

    /// Publishes what the job does after the aborted round (the winner of abort() calls it), and
    /// returns the decision that stands: this one, or the regroup of a node that took the
    /// decision over because this one was taken for lost meanwhile (await_decision()).
    asio::awaitable<job_decision> decide(job_decision decision) {
        bool counted = false;
        if (decision.restart) {
            // The job's count, repaired first if a broken client wrote something else there (an
            // ADD of a value that is no number would end this connection).
            const auto count = co_await job_restarts(*store_);
            if (!count) co_await store_->set(job_key("restarts"), std::to_string(restarts_));
            // The round's token says whether this restart was counted (give_back()): a node
            // that took the decision over first has set it, and then nothing is counted.
            if (co_await store_->compare_set(key(round_, "counted"), std::string{}, "added") == "added") {
                (void)co_await store_->add(job_key("restarts"), 1);
                counted = true;
            }
        }
        const auto value = detail::rendezvous::encode(decision);
        for (int slot = 0;; ++slot) {
            if (slot == max_slots) throw rendezvous_error(too_many_invalid(round_, "decision"));
            const auto k = slot_key(round_, "decision", slot);
            const auto got = co_await store_->compare_set(k, std::string{}, value);
            if (got == value) break;
            if (auto taken = co_await standing_regroup(k, got)) {
                // Taken over while this node decided: the restart it counted is given back
                // (once: the node that took over may have given it back already).
                if (counted) co_await give_back(*store_);
                co_return std::move(*taken);
            }
        }
        if (decision.restart) ++restarts_;
        co_return decision;
    }

    /// The decision for the aborted round (awaited by push). A value that is no valid decision,
    /// or a restart the job's `restarts` count does not back (the decider adds 1 to it before it
    /// publishes; with max_restarts, past the budget), is reported and ignored: the wait goes on
    /// at the next slot. With liveness the wait lasts only while the decider (the failure's
    /// reporter) holds its lease: once it is gone, this node takes the decision over, a regroup
    /// (job_decision::regroup) that every node reads alike.
    asio::awaitable<job_decision> await_decision() {
        const int r = round_;
        for (int slot = 0; slot < max_slots; ++slot) {
            const auto k = slot_key(r, "decision", slot);
            if (co_await round_collected(*store_, r)) co_return missed_decision(r);
            co_await await_decider(k);
            if (co_await round_collected(*store_, r)) co_return missed_decision(r);
            const auto value = co_await store_->get(k);
            auto decision = checked(k, value, "the decision goes on at the next slot",
                                    [](std::string_view v) { return detail::rendezvous::decode_decision(v); });
            if (!decision) continue;
            if (decision->regroup && members_ && standing_ && !co_await decider_gone(standing_->node)) {
                ignored(k, value, "a regroup, but the node that reported the failure still holds its lease",
                        "the decision goes on at the next slot");
                continue;
            }
            if (decision->restart && !decision->regroup) {
                const auto count = co_await job_restarts(*store_);
                const bool backed = count && *count > restarts_ &&
                                    (!options_.max_restarts || *count <= *options_.max_restarts);
                if (!backed) {
                    ignored(k, value,
                            fmt::format("a restart, but the job's restart count is {} (this node counted {}{})",
                                        count ? std::to_string(*count) : std::string("not a number"), restarts_,
                                        options_.max_restarts
                                            ? fmt::format("; --max-restarts={}", *options_.max_restarts)
                                            : std::string()),
                            "the decision goes on at the next slot");
                    continue;
                }
                ++restarts_;
            }
            co_return std::move(*decision);
        }
        throw rendezvous_error(too_many_invalid(r, "decision"));
    }

    /// This node's workers all succeeded: marks it done and waits (push) until every node of
    /// the round is, the round is aborted, or `timeout` passes (then names the nodes missing).
    /// The last node to finish closes the job (standbys then exit). A zero `timeout` marks the
    /// node done and does not wait.
    asio::awaitable<barrier_result> finish(std::chrono::milliseconds timeout) {
        using namespace asio::experimental::awaitable_operators;
        const int r = round_;
        finished_ = true;
        co_await store_->set(key(r, fmt::format("done/{}", group_rank_)), "1");
        const auto done = co_await store_->add(key(r, "done_count"), 1);
        if (done >= size_) {
            abort_notice closed;
            closed.group_rank = group_rank_;
            closed.reason = "every node's workers succeeded";
            closed.what = abort_notice::kind::closed;
            if (co_await abort(closed)) co_await store_->set(key(r, "all_done"), "1");
        }
        barrier_result result;
        if (timeout <= std::chrono::milliseconds::zero()) co_return result;  // exit_barrier_timeout=0: no wait
        auto which = co_await (wait_all_done(timeout) || wait_for_abort());
        if (which.index() == 1) {
            auto notice = std::get<1>(std::move(which));
            if (notice.what == abort_notice::kind::closed) co_return result;
            finished_ = false;  // the node follows the round's abort: it is not done
            result.how = barrier_result::kind::aborted;
            result.abort = std::move(notice);
            co_return result;
        }
        if (std::get<0>(which)) co_return result;
        // Timed out: only now, name who is missing (O(N) checks, on this error path only).
        result.how = barrier_result::kind::timed_out;
        std::vector<std::string> hosts;
        try {
            hosts = detail::rendezvous::decode_hosts(co_await store_->get(key(r, "hosts")));
        } catch (const std::exception&) {
        }
        for (int g = 0; g < size_; ++g) {
            std::vector<std::string> keys{key(r, fmt::format("done/{}", g))};
            if (co_await store_->check(std::move(keys))) continue;
            result.missing.push_back(g);
            result.missing_hosts.push_back(static_cast<std::size_t>(g) < hosts.size()
                                               ? hosts[static_cast<std::size_t>(g)]
                                               : std::string("?"));
        }
        co_return result;
    }

    /// This node leaves the job for good. The store's host waits (up to close_timeout) until
    /// every other node's lease is gone, so nobody loses the store while reading the job's last
    /// keys (without liveness it cannot tell, and returns at once). A host whose workers
    /// succeeded first stays, without a deadline, for as long as another node is live and the
    /// round has no abort (closed, failed or re-forming): taking the store away would fail a
    /// node still working. Each of those nodes ends the wait by leaving, or by losing its lease.
    asio::awaitable<void> leave() {
        using namespace asio::experimental::awaitable_operators;
        phase_ = phase::leaving;
        if (round_ < 0 || !options_.hosts_store || !members_ || members_->store_lost) co_return;
        if (finished_) {
            // The round's abort key ends the stay: the closed notice (every node finished), or
            // a failure or membership change, after which the others re-form without this node
            // (its live lease must not hold their rounds back) and the close below applies.
            const auto round_abort = key(round_, "abort");
            bool said = false;
            while (!members_->store_lost) {
                const auto seen = members_->lost.size();
                const auto others = co_await live_nodes(*store_) - 1;
                if (others <= 0) co_return;
                // (Not a braced list: g++ 12 cannot keep an initializer_list in a coroutine frame.)
                if (co_await store_->check(std::vector<std::string>(1, round_abort))) break;
                if (!said) {
                    say(staying_line(others));
                    said = true;
                }
                if (members_->lost.size() != seen) continue;  // a loss while reading: count again
                // Woken by a loss or the abort key; re-read at each close_timeout all the same,
                // so no wake-up missed between the reads and the wait can hold the host.
                auto which = co_await (members_->next() || wait_for(*store_, round_abort, options_.close_timeout));
                if (which.index() == 1 && std::get<1>(which)) break;
            }
        }
        const auto deadline = std::chrono::steady_clock::now() + options_.close_timeout;
        asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
        for (;;) {
            if (co_await live_nodes(*store_) <= 1) co_return;
            auto which = co_await (members_->next() || timer.async_wait(detail::as_tuple_awaitable<Store>));
            if (which.index() == 1) co_return;  // someone vanished without a trace: stop anyway
        }
    }

    /// leave()'s line when the finished host stays for `others` nodes still working.
    [[nodiscard]] static std::string staying_line(std::int64_t others) {
        const bool one = others == 1;
        return fmt::format("this node's workers succeeded, and it hosts the rendezvous store, which {} other node{} of "
                           "the job still use{}: it stays until they finish or leave",
                           others, one ? "" : "s", one ? "s" : "");
    }

    /// The store key of `name` in the current round.
    [[nodiscard]] std::string key(std::string_view name) const { return key(round_, name); }
    /// The store key of `name` in round `r`.
    [[nodiscard]] std::string key(int r, std::string_view name) const {
        return fmt::format("elastic.rendezvous.{}/{}/{}", options_.run_id, r, name);
    }
    /// The store key of `name` for the whole job.
    [[nodiscard]] std::string job_key(std::string_view name) const { return job_key(options_.run_id, name); }
    /// The store key of `name` for the job `run_id`.
    [[nodiscard]] static std::string job_key(std::string_view run_id, std::string_view name) {
        return fmt::format("elastic.rendezvous.{}/{}", run_id, name);
    }

private:
    enum class phase { idle, forming, running, leaving };

    // The nodes a round needs: MIN, or after the store moved a majority of the last round.
    [[nodiscard]] int needed() const noexcept { return std::max(options_.min(), quorum_); }

    // What decides the next round's completion besides its arrivals (the planner's input).
    [[nodiscard]] detail::rendezvous::round_rules rules() const noexcept {
        return {options_.nnodes, options_.elastic(), needed(), target_};
    }

    void say(std::string_view line) const {
        if (options_.log) options_.log(line);
    }

    // ---- values read from the store (docs/rendezvous.md, "What the agents trust") --------------

    // How many slots (`abort`, `abort/1`, ...) a round's abort or decision may take before the
    // job gives up: each invalid value costs a writer one slot.
    static constexpr int max_slots = 64;

    [[nodiscard]] std::string slot_key(int r, std::string_view name, int slot) const {
        return slot == 0 ? key(r, name) : key(r, fmt::format("{}/{}", name, slot));
    }

    std::string too_many_invalid(int r, std::string_view name) const {
        return fmt::format("round {} of run '{}': {} invalid values in a row at its '{}' key: a client that is no "
                           "agent of this job keeps writing into the rendezvous store; give the job a store of its "
                           "own",
                           r, options_.run_id, max_slots, name);
    }

    // Reports the value at `k` that is not valid (`why`) and says what the job does instead
    // (`then`); once per key and value.
    void ignored(std::string_view k, std::string_view value, std::string_view why, std::string_view then) {
        if (!warned_.insert(fmt::format("{}\n{}", k, value)).second) return;
        const auto line = fmt::format("ignored an invalid value in the rendezvous store: key '{}' holds '{}' ({}); {}",
                                      k, detail::rendezvous::shown(value), why, then);
        if (options_.warn) options_.warn(line);
        else say(line);
    }

    // `decode(value)`, or nothing (reported) when the value is not valid.
    template <class Decode>
    auto checked(std::string_view k, std::string_view value, std::string_view then, Decode decode)
        -> std::optional<decltype(decode(value))> {
        try {
            return decode(value);
        } catch (const detail::rendezvous::invalid_value& e) {
            ignored(k, value, e.what(), then);
        }
        return std::nullopt;
    }

    // The value at `k` decoded, or nothing when the key is absent or its value is not valid
    // (reported, `then` saying what this node does instead).
    template <class Decode>
    auto read_checked(Store& s, std::string k, std::string_view then, Decode decode)
        -> asio::awaitable<std::optional<decltype(decode(std::string_view{}))>> {
        std::vector<std::string> probe{k};
        if (!co_await s.check(std::move(probe))) co_return std::nullopt;
        const auto value = co_await s.get(k);
        co_return checked(k, value, then, std::move(decode));
    }

    // With liveness every agent holds a lease, and its notices name it (the decider's liveness
    // bounds the wait for a decision): a notice that names none is no agent's.
    std::optional<abort_notice> valid_abort(std::string_view k, std::string_view value) {
        const int size = phase_ == phase::running && size_ > 0 ? size_ : options_.nnodes;
        return checked(k, value, "it does not abort the round (an abort goes to the next slot)",
                       [&](std::string_view v) {
                           auto notice = detail::rendezvous::decode_abort(v, size);
                           if (members_ && notice.node.empty())
                               throw detail::rendezvous::invalid_value("it names no lease (every agent holds one)");
                           return notice;
                       });
    }

    // Waits until the decision key `k` holds a value. With liveness, only while the node that
    // has to write it (the standing failure's reporter) lives: once it is gone — its lease lost,
    // or one it never held — this node writes a regroup there first-come (compare-and-set), so
    // every node reads the same decision whoever took it over.
    asio::awaitable<void> await_decider(const std::string& k) {
        using namespace asio::experimental::awaitable_operators;
        if (!members_ || !standing_ || standing_->what != abort_notice::kind::failure) {
            co_await wait_interruptible(*store_, k, std::nullopt);
            co_return;
        }
        const auto decider = standing_->node;
        for (;;) {
            auto log = members_;
            const auto seen = log->lost.size();  // taken before the check: a later loss ends the wait
            if (auto gone = co_await decider_gone(decider)) {
                job_decision regroup;
                regroup.restart = true;
                regroup.exit_code = 0;
                regroup.reason = std::move(*gone);
                regroup.regroup = true;
                const auto value = detail::rendezvous::encode(regroup);
                // The regroup stands: a restart the decider counted before it was lost is given back.
                if (co_await unless_lost(*store_, store_->compare_set(k, std::string{}, value)) == value)
                    co_await unless_lost(*store_, give_back(*store_));
                co_return;
            }
            auto which = co_await (unless_lost(*store_, wait_long(*store_, k)) || loss_after(log, seen, decider));
            if (which.index() == 0) co_return;
            // The wait was cancelled mid-request: the connection's next request reconnects.
            if constexpr (requires { store_->close(); }) store_->close();
        }
    }

    // The regroup `value` at decision key `k` when it stands: another node took this node's
    // decision over because this node's lease is gone (anything else there is reported).
    asio::awaitable<std::optional<job_decision>> standing_regroup(const std::string& k, const std::string& value) {
        auto theirs = checked(k, value, "the decision goes to the next slot",
                              [](std::string_view v) { return detail::rendezvous::decode_decision(v); });
        if (!theirs) co_return std::nullopt;
        if (theirs->regroup && (!members_ || !co_await holds_lease(*store_, id_))) co_return theirs;
        ignored(k, value,
                theirs->regroup ? "a regroup, but this node, which decides, still holds its lease"
                                : "only the node whose abort won decides, and this node is that one",
                "the decision goes to the next slot");
        co_return std::nullopt;
    }

    // A regroup stands in the current round: the restart its decider counted, if any, is given
    // back, once. The round's `counted` token reads "added" once the decider counted it; the
    // first node to turn it into "given:<its lease>" (or to write that first, so that the
    // decider counts nothing) is the one that subtracts 1, if it was added.
    asio::awaitable<void> give_back(Store& s) {
        const auto k = key(round_, "counted");
        const auto mine = "given:" + id_;
        if (co_await s.compare_set(k, std::string{}, mine) != "added") co_return;
        if (co_await s.compare_set(k, "added", mine) == mine) (void)co_await s.add(job_key("restarts"), -1);
    }

    // Whether the lease `name` of this job is held now (the store's record). A server's own name
    // is no lease: "__epoch" always exists, and would pass for a lease that is held.
    asio::awaitable<bool> holds_lease(Store& s, const std::string& name) {
        if (name.empty() || name.rfind("__", 0) == 0) co_return false;
        std::vector<std::string> lease{lease_key(lease_group(), name)};
        co_return co_await s.check(std::move(lease));
    }

    // Why the decider `decider` (a lease name) can no longer decide, or nothing while it can.
    asio::awaitable<std::optional<std::string>> decider_gone(const std::string& decider) {
        const auto who = detail::rendezvous::describe_node_id(decider);
        if (decider == id_) {
            co_return fmt::format("the failure notice names this node ({}) as its reporter, but this node reported "
                                  "no failure; it takes the decision over and the nodes re-form",
                                  who);
        }
        if (co_await unless_lost(*store_, holds_lease(*store_, decider))) co_return std::nullopt;
        co_return fmt::format("the reporting node, {}, was lost before it decided; the others took the decision over "
                              "and re-form without it",
                              who);
    }

    // Completes once `log` records a loss after its first `seen` that names `decider` or nobody
    // (a record the store erased), or the lease connection ends.
    static asio::awaitable<void> loss_after(std::shared_ptr<detail::rendezvous::membership_log> log, std::size_t seen,
                                            std::string decider) {
        for (;;) {
            if (log->store_lost) co_return;
            for (auto i = seen; i < log->lost.size(); ++i) {
                const auto& name = log->lost[i].second;
                if (name.empty() || name == decider) co_return;
            }
            seen = log->lost.size();
            co_await log->next();
        }
    }

    // Writes `mine` as round r's abort unless a valid abort is there first; returns the abort
    // that stands and whether it is this node's. An invalid value found in a slot is reported
    // and skipped: the abort goes to the next slot, where the watchers that saw it wait.
    asio::awaitable<std::pair<abort_notice, bool>> abort_round(Store& s, int r, abort_notice mine) {
        if (mine.node.empty()) mine.node = id_;
        const auto value = detail::rendezvous::encode(mine);
        for (int slot = 0; slot < max_slots; ++slot) {
            const auto k = slot_key(r, "abort", slot);
            const auto got = co_await s.compare_set(k, std::string{}, value);
            if (got == value) co_return std::pair{std::move(mine), true};
            if (auto theirs = valid_abort(k, got)) co_return std::pair{std::move(*theirs), false};
        }
        throw rendezvous_error(too_many_invalid(r, "abort"));
    }

    // Whether round r has a valid abort.
    asio::awaitable<bool> aborted(Store& s, int r) {
        for (int slot = 0; slot < max_slots; ++slot) {
            const auto k = slot_key(r, "abort", slot);
            std::vector<std::string> keys{k};
            if (!co_await s.check(std::move(keys))) co_return false;
            if (valid_abort(k, co_await s.get(k))) co_return true;
        }
        co_return true;  // abort_round and wait_for_abort then say why the round cannot go on
    }

    // The job's restart count, or nothing (reported) when the key holds no count. Read, not
    // ADDed: an ADD of a value that is no number would end this connection.
    asio::awaitable<std::optional<int>> job_restarts(Store& s) {
        const auto k = job_key("restarts");
        std::vector<std::string> keys{k};
        if (!co_await s.check(std::move(keys))) co_return 0;
        const auto value = co_await s.get(k);
        co_return checked(k, value, "the job keeps the restart count it knows", [](std::string_view v) {
            return static_cast<int>(detail::rendezvous::decode_count(v, 0, std::numeric_limits<int>::max()));
        });
    }

    // The lease group's loss count (the server's `__epoch`), or `known` (reported) when the key
    // holds no count.
    asio::awaitable<std::int64_t> read_epoch(Store& s, std::int64_t known) {
        const auto k = lease_epoch_key(lease_group());
        const auto value = co_await s.get(k);
        co_return checked(k, value, "the job keeps the loss count it knows", [](std::string_view v) {
            return detail::rendezvous::decode_count(v, 0, std::numeric_limits<std::int64_t>::max());
        }).value_or(known);
    }

    // How many loss records after `known` the store erased before this node read them (0 when
    // the next one is there or not yet written). The server keeps only the newest records of
    // the group (store_server_options::lease_lost_records_kept) and erases the oldest first, so
    // the missing ones are the first of known+1..__epoch: a binary search finds where the kept
    // ones start. Waiting for an erased record would wait for ever and miss every later loss.
    asio::awaitable<std::int64_t> erased_losses(Store& s, std::int64_t known) {
        const auto current = co_await read_epoch(s, known);
        if (current <= known) co_return 0;
        auto exists = [&](std::int64_t n) -> asio::awaitable<bool> {
            std::vector<std::string> keys{lease_lost_key(lease_group(), n)};
            co_return co_await s.check(std::move(keys));
        };
        if (co_await exists(known + 1)) co_return 0;
        std::int64_t missing = known + 1;  // erased
        std::int64_t kept = current + 1;   // there, or past the last loss
        while (kept - missing > 1) {
            const auto mid = missing + (kept - missing) / 2;
            if (co_await exists(mid)) kept = mid;
            else missing = mid;
        }
        const auto count = kept - 1 - known;
        const auto line = fmt::format(
            "missed {} lease losses of run '{}' ({} to {}): the store erased their records before this node "
            "read them (it keeps only the newest); they are counted, and no member is taken for lost by them",
            count, options_.run_id, lease_lost_key(lease_group(), known + 1), lease_lost_key(lease_group(), kept - 1));
        if (options_.warn) options_.warn(line);
        else say(line);
        co_return count;
    }

    asio::awaitable<void> guard() {
        const auto k = detail::rendezvous::torchrun_key(options_.run_id);
        const auto mine = detail::rendezvous::guard_value(options_.run_id);
        const auto got = co_await store_->compare_set(k, std::string{}, mine);
        if (got != mine) throw rendezvous_error(torchrun_state_message());
    }

    [[nodiscard]] std::string torchrun_state_message() const {
        return fmt::format(
            "the store already holds torchrun's rendezvous state for run '{}' (key '{}'): a torchrun (Python) "
            "agent uses this --rdzv-id, and its state is a Python pickle elasticrun cannot share; run every node "
            "with elasticrun, or give this job another --rdzv-id",
            options_.run_id, detail::rendezvous::torchrun_key(options_.run_id));
    }

    // Runs `op`, a request or wait on `s`; with liveness, a lost store ends it with store_lost_error
    // (and a cancelled request leaves `s` closed: its next request reconnects). Without the
    // race, a request on a store whose host died would retry its connection until the client's
    // connect_timeout while the job has already moved on.
    template <class T>
    asio::awaitable<T> unless_lost(Store& s, asio::awaitable<T> op) {
        using namespace asio::experimental::awaitable_operators;
        if (!members_) co_return co_await std::move(op);
        if (members_->store_lost) throw store_lost_error(*members_->store_lost);
        auto log = members_;
        auto which = co_await (std::move(op) || log->until_store_lost());
        if (which.index() == 1) {
            if constexpr (requires { s.close(); }) s.close();
            throw store_lost_error(std::get<1>(std::move(which)));
        }
        if constexpr (!std::is_void_v<T>) co_return std::get<0>(std::move(which));
    }

    // Waits for `k` on `s` (unless_lost); false on timeout.
    asio::awaitable<bool> wait_interruptible(Store& s, std::string k,
                                             std::optional<std::chrono::milliseconds> timeout) {
        if (timeout) co_return co_await unless_lost(s, wait_for(s, std::move(k), *timeout));
        co_await unless_lost(s, wait_long(s, std::move(k)));
        co_return true;
    }

    // A node arrived after round r was complete (or sealed): it aborts a round running with
    // fewer than MAX nodes so that it may join the next, or waits as a standby for a full
    // one; either way it goes on with the round after r, or ends with the job.
    asio::awaitable<void> late(int r, node_info me) {
        if (!co_await wait_interruptible(*store_, key(r, "size"), options_.join_timeout)) {
            throw rendezvous_error(fmt::format(
                "round {} of run '{}' already has its {} nodes, and stays incomplete for the join timeout ({} s): "
                "another job uses the same --rdzv-id, or --nnodes differs between nodes",
                r, options_.run_id, options_.nnodes,
                std::chrono::duration_cast<std::chrono::seconds>(options_.join_timeout).count()));
        }
        const auto size_key = key(r, "size");
        const auto size_text = co_await store_->get(size_key);
        const int size = checked(size_key, size_text,
                                 "this node takes the round for one that lost a node while forming",
                                 [&](std::string_view v) {
                                     return static_cast<int>(detail::rendezvous::decode_count(v, 0, options_.nnodes));
                                 })
                             .value_or(0);
        if (size > 0) {
            // A standby that outlives the store's host moves with the members: it needs the
            // round's successors and the majority rule (move_to) as they do.
            const auto moves_key = key(r, "successors");
            const auto moves_text = co_await store_->get(moves_key);
            size_ = size;
            if (auto moves = checked(moves_key, moves_text, "this node knows no successor of the store's host",
                                     [](std::string_view v) {
                                         return detail::rendezvous::decode_round_successors(v);
                                     })) {
                host_in_round_ = moves->first;
                successors_ = std::move(moves->second);
            } else {
                host_in_round_ = true;
                successors_.clear();
            }
        }
        if (size > 0 && members_ && !co_await aborted(*store_, r)) co_await abort_if_member_lost(*store_, r);
        if (!co_await aborted(*store_, r)) {
            if (size < options_.nnodes) {
                abort_notice waiting;
                waiting.host = me.host;
                waiting.what = abort_notice::kind::membership;
                waiting.admission = true;
                waiting.reason = fmt::format("node {} (pid {}) is waiting to join (scale-up from {} nodes; at most {})",
                                             me.host, me.pid, size, options_.nnodes);
                (void)co_await abort_round(*store_, r, std::move(waiting));
            } else if (!options_.elastic()) {
                throw rendezvous_error(fmt::format(
                    "round {} of run '{}' already has its {} nodes (this node arrived after it formed): another job "
                    "uses the same --rdzv-id, or --nnodes differs between nodes",
                    r, options_.run_id, options_.nnodes));
            } else {
                say(fmt::format("round {} of run '{}' is full ({} nodes, --nnodes={}:{}): this node waits as a "
                                "standby until a member leaves or the job ends",
                                r, options_.run_id, size, options_.min(), options_.nnodes));
            }
        }
        phase_ = phase::idle;
        const auto notice = co_await wait_for_abort();  // round r is the current round
        if (notice.what == abort_notice::kind::closed) {
            throw rendezvous_closed(fmt::format("the job ended while this node waited as a standby ({})",
                                                notice.reason));
        }
        if (notice.what == abort_notice::kind::failure) {
            const auto decision = co_await await_decision();
            if (!decision.restart) {
                throw rendezvous_closed(
                    fmt::format("the job ended while this node waited as a standby (it stopped after a failure: {})",
                                notice.reason));
            }
        }
    }

    // Waits for this node's assignment in round r: the last-call timer (arrivals from MIN on,
    // elastic membership) seals the round when it fires; the join timeout ends the wait.
    asio::awaitable<std::optional<rendezvous_round>> await_assignment(int r, std::int64_t arrival,
                                                                      std::chrono::steady_clock::time_point started) {
        using clock = std::chrono::steady_clock;
        const auto mine = key(r, fmt::format("assign/{}", arrival));
        const auto join_deadline = started + options_.join_timeout;
        std::optional<clock::time_point> last_call;
        if (detail::rendezvous::has_last_call(arrival, rules())) {
            last_call = clock::now() + options_.last_call_timeout;
        }
        for (;;) {
            const auto now = clock::now();
            auto until = join_deadline;
            if (last_call && *last_call < until) until = *last_call;
            const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(until - now),
                                       std::chrono::milliseconds(1));
            if (co_await wait_interruptible(*watcher_, mine, left)) break;
            if (last_call && clock::now() >= *last_call) {
                last_call.reset();
                if (!members_) {
                    co_await seal(*store_, r);
                } else {
                    // The last call is over; the round still waits for nodes that live and
                    // have not joined yet (stopping their workers, say), or their loss.
                    co_await store_->set(key(r, "last_call_over"), "1");
                    co_await complete_if_all_live(*store_, r);
                }
                continue;
            }
            if (clock::now() < join_deadline) continue;
            auto joined = co_await store_->add(key(r, "count"), 0);
            if (joined >= detail::rendezvous::seal_increment) joined -= detail::rendezvous::seal_increment;
            const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(options_.join_timeout).count();
            if (quorum_ > 0 && majority_of_ > 0) {
                throw rendezvous_error(fmt::format(
                    "rendezvous of run '{}' round {}: {} of the {} nodes needed (a majority of the {} nodes of the "
                    "last round: a member went silent since, cut off by the network, stopped, or on a machine that "
                    "died, which the store cannot tell apart, and a part cut off from the others never goes on "
                    "alone; --nnodes={}:{}) joined within the join timeout ({} s)",
                    options_.run_id, r, joined, needed(), majority_of_, options_.min(), options_.nnodes, seconds));
            }
            if (quorum_ > 0) {
                throw rendezvous_error(fmt::format(
                    "rendezvous of run '{}' round {} (after the rendezvous store was lost and moved): {} of the {} "
                    "nodes needed (a majority of the {} nodes of the last round, so that a part cut off from the "
                    "others never goes on alone; --nnodes={}:{}) joined within the join timeout ({} s)",
                    options_.run_id, r, joined, needed(), std::max(size_, 1), options_.min(), options_.nnodes,
                    seconds));
            }
            if (options_.elastic()) {
                throw rendezvous_error(fmt::format(
                    "rendezvous of run '{}' round {}: {} of the {} nodes needed (--nnodes={}:{}) joined within the "
                    "join timeout ({} s); start more nodes, or raise --rdzv-conf join_timeout",
                    options_.run_id, r, joined, options_.min(), options_.min(), options_.nnodes, seconds));
            }
            throw rendezvous_error(fmt::format(
                "rendezvous of run '{}' round {}: {} of {} nodes joined within the join timeout ({} s); start the "
                "others, or raise --rdzv-conf join_timeout",
                options_.run_id, r, joined, options_.nnodes, seconds));
        }
        const auto value = co_await store_->get(mine);
        try {
            auto assigned = detail::rendezvous::decode_assignment(value, options_.nnodes);
            if (!assigned) heed_majority(r, mine, value);
            co_return assigned;
        } catch (const detail::rendezvous::invalid_value& e) {
            // Only the completer writes it, once: nothing valid can follow. A clear end instead.
            ignored(mine, value, e.what(), "this node has no assignment in this round");
            throw rendezvous_error(fmt::format(
                "rendezvous of run '{}' round {}: this node's assignment ('{}') is not valid ({}): a client that is "
                "no agent of this job writes into the rendezvous store; give the job a store of its own",
                options_.run_id, r, mine, e.what()));
        }
    }

    // Elastic rounds: complete once every live node joined (at least the nodes needed) — at
    // once in a quick round, after the last call in the others (the job's first round, one
    // admitting nodes), so nodes still starting get in, and nodes still stopping their workers
    // are waited for (else they would arrive late and restart the others again).
    asio::awaitable<void> complete_if_all_live(Store& s, int r) {
        if (!members_) co_return;
        const auto count = co_await s.add(key(r, "count"), 0);
        if (!detail::rendezvous::may_seal_when_all_live(count, rules())) co_return;
        if (count < co_await live_nodes(s)) co_return;
        if (!detail::rendezvous::quick_round(r, admission_, target_)) {
            std::vector<std::string> over{key(r, "last_call_over")};
            if (!co_await s.check(std::move(over))) co_return;
        }
        co_await seal(s, r);
    }

    // The nodes in the job now: every registration, less every lost lease (a leaving node's
    // lease ends as a loss too).
    asio::awaitable<std::int64_t> live_nodes(Store& s) {
        const auto registered = co_await s.add(job_key("registered"), 0);
        const auto lost = co_await read_epoch(s, members_ ? members_->epoch : 0);
        co_return registered - lost;
    }

    // Seals round r (no arrival after this joins it); the one node whose seal came first
    // completes it with the nodes that had arrived.
    asio::awaitable<void> seal(Store& s, int r) {
        const auto sealed = co_await s.add(key(r, "count"), detail::rendezvous::seal_increment);
        if (const auto joined = detail::rendezvous::sealed_arrivals(sealed, options_.nnodes))
            co_await complete(s, r, *joined);
    }

    // Reads the k nodes' infos (one multi_get), leaves out nodes whose lease is gone (one check),
    // assigns ranks, writes every assignment (one multi_set).
    asio::awaitable<void> complete(Store& s, int r, int k) {
        // With liveness the completer claims the round first: a node that found it lost has
        // voided the round (void_orphaned), and then this one writes nothing and retries.
        if (members_ && co_await s.compare_set(key(r, "completer"), std::string{}, id_) != id_) co_return;
        std::vector<std::string> keys;
        keys.reserve(static_cast<std::size_t>(k));
        for (int i = 1; i <= k; ++i) keys.push_back(key(r, fmt::format("info/{}", i)));
        std::vector<std::string> values;
        if constexpr (multi_key_store<Store>) {
            values = co_await s.multi_get(keys);
        } else {
            for (auto& key_i : keys) values.push_back(co_await s.get(key_i));
        }
        // An arrival whose info is not valid (a client that is no agent: bad JSON, a value out
        // of range, or, with liveness, no lease name) is reported and left out of the round.
        std::vector<node_info> arrived;
        std::vector<bool> valid;
        arrived.reserve(values.size());
        for (std::size_t i = 0; i < values.size(); ++i) {
            auto node = checked(keys[i], values[i], "this arrival is left out of the round", [&](std::string_view v) {
                auto n = detail::rendezvous::decode_node(v);
                if (members_ && n.id.empty())
                    throw detail::rendezvous::invalid_value("it names no lease (every agent holds one)");
                return n;
            });
            valid.push_back(node.has_value());
            arrived.push_back(node ? std::move(*node) : node_info{});
        }
        const std::optional<int> counted = co_await job_restarts(s);
        const int restarts = counted.value_or(restarts_);

        // Liveness: a node whose lease is gone (lost, or left) is left out of the round. The
        // lease keys are the store's own record. This node's log of losses is not enough: it
        // starts at this node's registration, so a node that was dropped and rejoined has not
        // seen the loss of its former self, whose info may still be among the arrivals. The
        // epoch is read first: a loss after it reaches every member as a later epoch (and
        // aborts the round when the lost node is in it).
        std::int64_t epoch = 0;
        std::int64_t silent = -1;  // the silent losses so far: read before the leases, like the epoch
        std::vector<int> in;       // arrival indexes (0-based) of the round's members
        for (int i = 0; i < k; ++i)
            if (valid[static_cast<std::size_t>(i)]) in.push_back(i);
        if (members_) {
            epoch = co_await read_epoch(s, members_->epoch);
            silent = co_await silent_losses(s);
            std::vector<std::string> leases;
            for (const int i : in) leases.push_back(lease_key(lease_group(), arrived[static_cast<std::size_t>(i)].id));
            if (!leases.empty() && !co_await s.check(std::move(leases))) {
                // One at a time only when some lease is gone (a rare round).
                const auto was = std::exchange(in, {});
                for (const int i : was) {
                    if (co_await holds_lease(s, arrived[static_cast<std::size_t>(i)].id)) in.push_back(i);
                }
            }
        }
        std::vector<std::string> out_keys;
        std::vector<std::string> out_values;
        std::vector<std::string> members;  // the round's lease names (member/<id> keys)
        int size = 0;
        const auto tell_all = [&](const std::string& value) {
            for (int i = 1; i <= k; ++i) {
                out_keys.push_back(key(r, fmt::format("assign/{}", i)));
                out_values.push_back(value);
            }
        };
        // After a member went silent the round needs a majority of the last one (no majority:
        // everyone is told so with the retry, and waits for one from then on).
        const int majority_of = static_cast<int>(in.size()) >= needed()
                                    ? co_await silent_majority(s, static_cast<int>(in.size()), silent)
                                    : 0;
        if (static_cast<int>(in.size()) < needed() || majority_of > 0) {
            // A node was lost while the round formed and too few are left: everyone goes on to
            // the next round (where the join timeout may end the wait); a late node finds
            // size 0 and moves on too.
            tell_all(detail::rendezvous::encode_retry(majority_of));
            out_keys.push_back(key(r, "size"));
            out_values.push_back("0");
        } else {
            std::vector<node_info> nodes;
            for (const int i : in) nodes.push_back(arrived[static_cast<std::size_t>(i)]);
            const int n = static_cast<int>(nodes.size());
            auto planned = detail::rendezvous::plan_round(nodes, !options_.elastic());
            if (const auto* message = std::get_if<std::string>(&planned)) {
                tell_all(detail::rendezvous::encode_round_error(*message));
            } else {
                const auto& plan = std::get<detail::rendezvous::round_plan>(planned);
                const auto& master = nodes[plan.master];
                tell_all(detail::rendezvous::encode_round_error(
                    "this node was lost while the round formed (its agent's connection to the rendezvous store "
                    "ended)"));
                rendezvous_round assignment;
                assignment.world_size = plan.world_size;
                assignment.group_world_size = n;
                assignment.epoch = epoch;
                assignment.master_addr = master.store_addr;
                assignment.master_port = master.store_port;
                assignment.restart_count = restarts;
                assignment.host_in_round = plan.host_in;
                assignment.successors = plan.successors;
                for (int j = 0; j < n; ++j) {
                    const int g = plan.group_rank[static_cast<std::size_t>(j)];
                    const int arrival = in[static_cast<std::size_t>(j)] + 1;
                    assignment.group_rank = g;
                    assignment.rank_base = plan.rank_base[static_cast<std::size_t>(g)];
                    assignment.role_rank_base = plan.role_rank_base[static_cast<std::size_t>(g)];
                    assignment.role_world_size = plan.role_world_size[static_cast<std::size_t>(g)];
                    // Group rank 0 hosts the workers' store: it accepts the members' addresses
                    // only (O(N) bytes in that one assignment).
                    if (g == 0) assignment.peers = plan.peers;
                    out_values[static_cast<std::size_t>(arrival - 1)] = detail::rendezvous::encode(assignment);
                    assignment.peers.clear();
                    if (!nodes[static_cast<std::size_t>(j)].id.empty()) {
                        out_keys.push_back(key(r, "member/" + nodes[static_cast<std::size_t>(j)].id));
                        out_values.push_back(std::to_string(g));
                    }
                }
                // For the standbys (they get no assignment): where the store may move.
                out_keys.push_back(key(r, "successors"));
                out_values.push_back(detail::rendezvous::encode_round_successors(plan.host_in, plan.successors));
                out_keys.push_back(key(r, "hosts"));
                out_values.push_back(detail::rendezvous::encode_hosts(plan.hosts));
                out_keys.push_back(key(r, "size"));
                out_values.push_back(std::to_string(n));
                out_keys.push_back(job_key("round"));
                out_values.push_back(std::to_string(r));
                // The last formed round's members and silent-loss count, for the split-brain
                // rule (silent_majority): a job key, so no collection of old rounds removes it.
                std::vector<std::string> ids;
                for (const auto& node : nodes) {
                    if (!node.id.empty()) ids.push_back(node.id);
                }
                out_keys.push_back(job_key("last_round"));
                out_values.push_back(detail::rendezvous::encode(detail::rendezvous::round_manifest{k, n, std::move(ids),
                                                                                                   silent}));
                for (const auto& node : nodes) {
                    if (!node.id.empty()) members.push_back(node.id);
                }
                size = n;
            }
        }
        if (members_) {
            // Still this round's completer? A node taken for lost meanwhile (its lease gone:
            // stopped past its keep-alive) may have seen the round voided, and writes nothing.
            if (!co_await holds_lease(s, id_) || co_await s.get(key(r, "completer")) != id_) co_return;
        }
        // What collect() deletes once no node can need this round any more.
        out_keys.push_back(key(r, "manifest"));
        out_values.push_back(detail::rendezvous::encode(detail::rendezvous::round_manifest{k, size, members}));
        if constexpr (multi_key_store<Store>) {
            co_await s.multi_set(std::move(out_keys), std::move(out_values));
        } else {
            for (std::size_t i = 0; i < out_keys.size(); ++i) co_await s.set(out_keys[i], out_values[i]);
        }
        co_await collect(s, r);
    }

    // ---- key lifetime (docs/rendezvous.md, "Key lifetime") ------------------------------------

    // Rounds whose keys stay in the store: the one just completed and the two before it. A node
    // reads round q's keys only until it arrives at round q+1 (its abort, its decision, a
    // standby's size and successors); round q+3 completes only after rounds q+1 and q+2 were
    // aborted, so every node that is still in the job has left round q long before.
    static constexpr int kept_rounds = 3;

    // Whether round r's keys were deleted (the job's `collected` is past it): a node that reads
    // them now (a member slow to stop its workers after the round was aborted) would wait for
    // ever on a key that is gone. Asked before each wait on the round's keys and before each
    // read after one. A value that is no count is reported and taken for "not collected".
    asio::awaitable<bool> round_collected(Store& s, int r) { co_return co_await unless_lost(s, read_collected(s, r)); }

    asio::awaitable<bool> read_collected(Store& s, int r) {
        const auto first_kept = co_await read_checked(
            s, job_key("collected"), "this node takes its round for one not deleted yet",
            [](std::string_view v) { return detail::rendezvous::decode_count(v, 0, std::numeric_limits<int>::max()); });
        co_return first_kept&&* first_kept > r;
    }

    // Round r was aborted and deleted while this node was away from it: the job went on
    // without it. It rejoins the job where it is now, as a node that missed the round.
    abort_notice missed_abort(int r) {
        rediscover_ = true;
        abort_notice notice;
        notice.what = abort_notice::kind::membership;
        notice.reason = fmt::format("round {} of run '{}' ended and was deleted while this node was away from it; "
                                    "this node rejoins the job at its current round",
                                    r, options_.run_id);
        say(notice.reason);
        return notice;
    }

    // The decision after round r is gone with the round: later rounds completed, so it was a
    // restart (a stop ends every node and no round completes after it).
    job_decision missed_decision(int r) {
        rediscover_ = true;
        job_decision decision;
        decision.restart = true;
        decision.exit_code = 0;
        decision.reason = fmt::format("the decision after round {} of run '{}' was deleted with the round while this "
                                      "node was away from it (later rounds completed, so the job restarted); this node "
                                      "rejoins the job at its current round",
                                      r, options_.run_id);
        say(decision.reason);
        return decision;
    }

    // The completer of round r deletes the keys of every round up to r - kept_rounds that is
    // not deleted yet (the job key `collected` names the first of those).
    asio::awaitable<void> collect(Store& s, int r) {
        const int upto = r - kept_rounds;
        if (upto < 0) co_return;
        const auto mark = job_key("collected");
        int from = 0;
        std::vector<std::string> mark_key{mark};
        if (co_await s.check(std::move(mark_key))) {
            const auto value = co_await s.get(mark);
            from = checked(mark, value, "only the oldest round kept is deleted", [&](std::string_view v) {
                       return static_cast<int>(detail::rendezvous::decode_count(v, 0, upto + 1));
                   }).value_or(upto);
        }
        // Bounded work: a round is deleted by the next completer at the latest, so only a gap
        // (a round that never completed, a moved store) leaves more than one behind.
        from = std::max(from, upto - 8);
        for (int q = from; q <= upto; ++q) co_await collect_round(s, q);
        co_await s.set(mark, std::to_string(upto + 1));
    }

    // Deletes round q's keys: the fixed names, each arrival's and member's, every abort and
    // decision slot.
    asio::awaitable<void> collect_round(Store& s, int q) {
        std::vector<std::string> names{"count",      "successors", "hosts",     "size",   "last_call_over",
                                       "done_count", "all_done",   "completer", "counted"};
        const auto manifest = co_await read_checked(s, key(q, "manifest"), "only the round's fixed keys are deleted",
                                                    [&](std::string_view v) {
                                                        return detail::rendezvous::decode_manifest(v, options_.nnodes);
                                                    });
        if (manifest) {
            for (int i = 1; i <= manifest->k; ++i) {
                names.push_back(fmt::format("info/{}", i));
                names.push_back(fmt::format("assign/{}", i));
            }
            for (int g = 0; g < manifest->n; ++g) names.push_back(fmt::format("done/{}", g));
            for (const auto& id : manifest->ids) names.push_back("member/" + id);
        }
        names.emplace_back("manifest");
        for (const auto& name : names) (void)co_await s.delete_key(key(q, name));
        for (const char* name : {"abort", "decision"}) {
            for (int slot = 0; slot < max_slots; ++slot) {
                if (!co_await s.delete_key(slot_key(q, name, slot))) break;
            }
        }
    }

    // The monitor saw lease `name` lost (the epoch-th loss of the job).
    asio::awaitable<void> on_loss(Store& s, std::int64_t epoch, std::string name) {
        if (name == id_) co_return;
        if (phase_ == phase::running && epoch > running_epoch_ && !name.empty()) {
            co_await on_member_loss(s, round_, name);
        } else if (phase_ == phase::forming) {
            if (options_.elastic()) co_await complete_if_all_live(s, round_);
            co_await void_orphaned(s, round_);
        }
    }

    // A full round (MAX arrivals, or sealed) whose completer was lost before it completed would
    // wait for the join timeout with every live node in it ("2 of the 1 nodes needed"). Each
    // loss while a round forms checks for one: when the round has no size yet and its completer
    // holds no lease (or has not claimed it), the first node to claim it voids the round — every
    // arrival is told to retry — and the live nodes form the next one. A completer that was only
    // slow finds the claim taken and retries with them.
    asio::awaitable<void> void_orphaned(Store& s, int r) {
        const auto count = co_await s.add(key(r, "count"), 0);
        if (count < detail::rendezvous::seal_increment && count < options_.nnodes)
            co_return;  // not full: arrivals or the last call complete it
        // Arrivals (late ones and repeated seals included); a retry where nobody waits is harmless.
        const int k = static_cast<int>(std::min<std::int64_t>(count % detail::rendezvous::seal_increment,
                                                              options_.nnodes));
        if (std::vector<std::string> size{key(r, "size")}; co_await s.check(std::move(size))) co_return;
        const auto claim = key(r, "completer");
        std::string holder;
        if (std::vector<std::string> claimed{claim}; co_await s.check(std::move(claimed))) {
            holder = co_await s.get(claim);
            if (holder.rfind(void_mark, 0) == 0) co_return;
            if (co_await holds_lease(s, holder)) co_return;  // it lives: it completes the round
        }
        const auto mine = std::string(void_mark) + id_;
        if (co_await s.compare_set(claim, holder, mine) != mine) co_return;  // another node was first
        say(fmt::format("round {} of run '{}' was full, but its completer ({}) was lost before it completed the "
                        "round; the round is void and the live nodes form the next one",
                        r, options_.run_id,
                        holder.empty() ? std::string("its last arrival")
                                       : detail::rendezvous::describe_node_id(holder)));
        // Never over an assignment: one there is the completer's, written with the size.
        const auto retry = detail::rendezvous::encode_retry();
        for (int i = 1; i <= k; ++i) (void)co_await s.compare_set(key(r, fmt::format("assign/{}", i)), "", retry);
        (void)co_await s.compare_set(key(r, "size"), "", "0");
        // So that collect() deletes its keys like a completed round's.
        (void)co_await s.compare_set(key(r, "manifest"), "",
                                     detail::rendezvous::encode(detail::rendezvous::round_manifest{k, 0, {}}));
    }

    // Round r runs, and this node arrived after it formed. Its members are the store's record
    // (the round's manifest): one whose lease is gone and that had not finished is lost, and
    // the round is aborted for it (on_member_loss). The members abort on their own when they
    // see the loss; this covers the nodes that cannot see it — each one dropped with its lease
    // (every member, when the store's host was stopped past the keep-alive), which rejoins
    // under a new lease name and would otherwise wait beside a round nobody runs.
    asio::awaitable<void> abort_if_member_lost(Store& s, int r) {
        const auto manifest = co_await read_checked(s, key(r, "manifest"),
                                                    "this node takes the round's members for live",
                                                    [&](std::string_view v) {
                                                        return detail::rendezvous::decode_manifest(v, options_.nnodes);
                                                    });
        if (!manifest) co_return;
        std::vector<std::string> leases;
        for (const auto& id : manifest->ids) leases.push_back(lease_key(lease_group(), id));
        if (leases.empty() || co_await s.check(std::move(leases))) co_return;  // every lease held
        for (const auto& id : manifest->ids) {
            if (co_await holds_lease(s, id)) continue;
            co_await on_member_loss(s, r, id, false);
            if (co_await aborted(s, r)) co_return;
        }
    }

    // The lease group's silent losses so far (the server's `__silent`), or -1 when the store
    // keeps no such count or it holds no count (reported).
    asio::awaitable<std::int64_t> silent_losses(Store& s) {
        const auto silent = co_await read_checked(
            s, lease_silent_key(lease_group()), "the round is formed as if no lease had gone silent",
            [](std::string_view v) {
                return detail::rendezvous::decode_count(v, 0, std::numeric_limits<std::int64_t>::max());
            });
        co_return silent.value_or(-1);
    }

    // The split-brain rule. A member lost by closing its connection (its agent killed) is gone;
    // one that went silent may be alive on the far side of a network cut, where the others move
    // the store and form a round of their own with a majority of the last round. So a round
    // formed after a silent loss (`silent`, the count now, above the one the last formed round
    // recorded in the job's `last_round`) also needs a majority of the last round, on the
    // store's side too. Returns the last round's size when `joined` is no majority of it after
    // such a loss, else 0. A store that keeps no count (-1) imposes nothing, and neither does a
    // last round that recorded none (reported).
    asio::awaitable<int> silent_majority(Store& s, int joined, std::int64_t silent) {
        if (!options_.elastic() || silent <= 0) co_return 0;
        // A round formed by an agent that kept no count (an older elasticrun) turns the rule off, said once.
        const auto last = co_await read_checked(
            s, job_key("last_round"), "the round is formed as if no lease had gone silent", [&](std::string_view v) {
                auto m = detail::rendezvous::decode_manifest(v, options_.nnodes);
                if (m.n > 0 && m.silent < 0) {
                    throw detail::rendezvous::invalid_value(
                        "it records no silent-loss count (an agent of an older version formed that round)");
                }
                return m;
            });
        if (!last || last->n <= 0) co_return 0;  // no round formed yet
        if (silent <= last->silent || 2 * joined > last->n) co_return 0;
        co_return last->n;
    }

    // Round r's retry `value` at `k`: when it names the last round's size because too few
    // joined after a silent loss, this node needs that majority in the rounds that follow.
    void heed_majority(int r, std::string_view k, std::string_view value) {
        const auto majority_of = checked(k, value, "the next round needs the nodes it needed", [&](std::string_view v) {
                                     return detail::rendezvous::decode_retry_majority(v, options_.nnodes);
                                 }).value_or(0);
        if (majority_of <= 0 || majority_of / 2 + 1 <= quorum_) return;
        quorum_ = majority_of / 2 + 1;
        majority_of_ = majority_of;
        say(fmt::format("round {} of run '{}': too few nodes joined for a majority of the last round's {} after a "
                        "member went silent (cut off by the network, stopped, or on a machine that died: the store "
                        "cannot tell which); this part of the job may be cut off from the rest, so the next rounds "
                        "need {} nodes, up to the join timeout",
                        r, options_.run_id, majority_of, quorum_));
    }

    // The claim of a voided round (void_orphaned) starts with this; a completer's is its lease name.
    static constexpr std::string_view void_mark = "void:";

    // Aborts round r when lease `name` was one of its members and had not finished. A member
    // whose workers all succeeded (it marked done/<g> before its exit barrier) is finished: its
    // leaving, when its barrier times out or its agent ends, is no loss, and the others run to
    // their own end.
    asio::awaitable<void> on_member_loss(Store& s, int r, std::string name, bool member_here = true) {
        const auto member_key = key(r, "member/" + name);
        std::vector<std::string> member{member_key};
        if (!co_await s.check(std::move(member))) co_return;
        const auto value = co_await s.get(member_key);
        const auto g = checked(member_key, value, "the node is taken for lost", [&](std::string_view v) {
            return detail::rendezvous::decode_count(v, 0, std::max(size_, 1) - 1);
        });
        if (g) {
            std::vector<std::string> done{key(r, fmt::format("done/{}", *g))};
            if (co_await s.check(std::move(done))) {
                say(fmt::format("node {} (group_rank {}) left after its workers succeeded{}",
                                detail::rendezvous::describe_node_id(name), *g,
                                member_here ? "; this node's workers go on" : ""));
                co_return;
            }
        }
        abort_notice lost;
        lost.what = abort_notice::kind::membership;
        lost.reason = fmt::format("node {} was lost (its agent's connection to the rendezvous store ended or went "
                                  "silent)",
                                  detail::rendezvous::describe_node_id(name));
        (void)co_await abort_round(s, r, std::move(lost));
    }

    static asio::awaitable<bool> wait_for(Store& s, std::string k, std::chrono::milliseconds timeout) {
        bool timed_out = false;
        try {
            std::vector<std::string> keys{k};
            co_await s.wait(std::move(keys), timeout);
        } catch (const store_timeout&) {
            timed_out = true;
        }
        co_return !timed_out;
    }

    asio::awaitable<bool> wait_all_done(std::chrono::milliseconds timeout) {
        co_return co_await wait_for(*store_, key(round_, "all_done"), timeout);
    }

    // A wait with no deadline of its own: renewed hourly (the only traffic of an idle job).
    static asio::awaitable<void> wait_long(Store& s, std::string k) {
        for (;;) {
            const bool ready = co_await wait_for(s, k, std::chrono::hours(1));
            if (ready) co_return;
        }
    }

    Store* store_;
    Store* watcher_;
    Store* lease_ = nullptr;
    store_rendezvous_options options_;
    std::shared_ptr<detail::rendezvous::membership_log> members_;
    std::string id_;
    std::set<std::string> warned_;  ///< key and value of every invalid value reported
    phase phase_ = phase::idle;
    int round_ = -1;
    bool finished_ = false;  ///< this node's workers succeeded in round_ (finish() was called)
    int restarts_ = 0;
    int group_rank_ = -1;
    int size_ = 0;
    std::int64_t running_epoch_ = 0;
    bool admission_ = false;                   ///< the last round ended to admit a node
    std::optional<abort_notice> standing_;     ///< the current round's abort, once seen
    bool rediscover_ = false;                  ///< this node was dropped and rejoined: read the job's round again
    bool host_in_round_ = false;               ///< the store's host was a member of the last round
    std::vector<store_successor> successors_;  ///< the last round's successors
    int quorum_ = 0;  ///< after the store moved or a member went silent: the majority the next round needs (0: none)
    int majority_of_ = 0;  ///< > 0: quorum_ comes from a retry after a silent loss (not a store move), of this size
    int target_ = 0;       ///< after the store moved: the round completes at once at this many (0: MAX)
};

}  // namespace elastic::inline v0
// ---- end elastic/rendezvous/store_rendezvous.hpp ----
// ---- begin elastic/rendezvous/tcp_rendezvous.hpp ----
// tcp_rendezvous: the static and c10d backends — who hosts the rendezvous store (torchrun's
// is_host rule, bind-or-join), the clients that reach it, and the store_rendezvous over them.

// ---- begin elastic/usage_error.hpp ----
// elastic::usage_error (bad input from a user: exit status 2) and the environment map that the
// layers which read variables take instead of the process environment.


#include <functional>
#include <map>
#include <string>
#include <string_view>

extern "C" char** environ;  // POSIX: declared by <unistd.h> only with _GNU_SOURCE; declare it ourselves.

namespace elastic::inline v0 {

/// Bad input to a launcher: an unknown option, a malformed or out-of-range value, a program that
/// cannot run. The message is one line naming the option (or variable), the value and the rule;
/// a launcher prints it and exits with exit_code() without starting any worker.
class usage_error : public error {
public:
    /// `message` is kept on one line: control characters (a newline in a value read from the
    /// environment, say) are written as escapes such as `\n` and `\x1b`.
    explicit usage_error(std::string_view message) : error(one_line(message)) {}

    /// The exit status for this error: 2, as argparse (and so torchrun) uses for usage errors.
    [[nodiscard]] static constexpr int exit_code() noexcept { return 2; }

private:
    static std::string one_line(std::string_view message) {
        static constexpr char hex[] = "0123456789abcdef";
        std::string out;
        out.reserve(message.size());
        for (const char c : message) {
            const auto byte = static_cast<unsigned char>(c);
            if (c == '\n') {
                out += "\\n";
            } else if (c == '\t') {
                out += "\\t";
            } else if (c == '\r') {
                out += "\\r";
            } else if (byte < 0x20 || byte == 0x7f) {
                out += "\\x";
                out += hex[byte >> 4];
                out += hex[byte & 0xf];
            } else {
                out += c;
            }
        }
        return out;
    }
};

/// A set of environment variables, name to value. The launch layer (and the rendezvous, for its
/// secret) reads its variables (PET_*,
/// PYTHON_EXEC, PATH, CUDA_VISIBLE_DEVICES, ...) from one of these rather than from the process
/// environment, so a custom launcher or a test controls exactly what is seen.
using environment = std::map<std::string, std::string, std::less<>>;

/// The process environment (`environ`) as an environment map. The first definition of a name
/// wins, as getenv(3) does.
[[nodiscard]] inline environment current_environment() {
    environment env;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
        const std::string_view text{*entry};
        const auto equals = text.find('=');
        if (equals == std::string_view::npos || equals == 0) {
            continue;
        }
        env.emplace(std::string{text.substr(0, equals)}, std::string{text.substr(equals + 1)});
    }
    return env;
}

namespace detail {

/// The value of `name` in `env`, or nullptr.
[[nodiscard]] inline const std::string* find_variable(const environment& env, std::string_view name) {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : &it->second;
}

}  // namespace detail
}  // namespace elastic::inline v0
// ---- end elastic/usage_error.hpp ----

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/error.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace elastic::inline v0 {

namespace detail::rendezvous {

ELASTIC_DECL bool is_loopback(std::string_view host);

ELASTIC_DECL bool is_ip_literal(std::string_view host);

/// torchrun's is_host heuristic, widened to every address of every local
/// interface (torchrun misses secondary NICs): `host` is localhost, a loopback address, this
/// host's name or canonical name, or an address one of its interfaces holds.
inline bool interface_holds(const asio::ip::address& wanted);

/// The address in a socket address (getifaddrs, getaddrinfo), or none for another family.
ELASTIC_DECL std::optional<asio::ip::address> address_of(const sockaddr* sa);

ELASTIC_DECL bool is_this_host(std::string_view host);

/// Whether one of this host's interfaces holds `wanted`.
ELASTIC_DECL bool interface_holds(const asio::ip::address& wanted);

/// The literal addresses of this host's interfaces that another node's traffic may come from:
/// no loopback, no link-local IPv6 (it needs a zone to mean anything), each once, at most
/// max_addrs. Published in the node's arrival info (node_info::addrs).
ELASTIC_DECL std::vector<std::string> interface_addresses();

/// "localhost" may resolve to ::1 for one process and 127.0.0.1 for another: use the literal.
ELASTIC_DECL std::string literal_for(std::string_view host);

/// The address a server named `host` binds on this node: an IP literal as given (a loopback
/// name: 127.0.0.1); a name: the first address it resolves to, in the resolver's order
/// (getaddrinfo, RFC 6724 as /etc/gai.conf tunes it), that this node owns — a loopback address
/// or one an interface holds; IPv6 link-local addresses are passed over (they need a scope).
/// Empty when the name resolves to no address of this node.
ELASTIC_DECL std::string owned_address(std::string_view host);

/// Every address `host` names (an IP literal: itself; a name: what getaddrinfo gives), IPv4
/// addresses mapped into IPv6 given as IPv4. Empty when it resolves to nothing.
ELASTIC_DECL std::vector<asio::ip::address> resolve_all(std::string_view host);

/// Which peers the workers' store of a round accepts: loopback (this node's workers), and the
/// addresses of the round's members (filled once the round is known; empty before).
struct peer_list {
    std::vector<asio::ip::address> allowed;

    /// Adds `a` (an IPv4 address mapped into IPv6 as IPv4), once.
    void allow(asio::ip::address a) {
        if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
        if (std::find(allowed.begin(), allowed.end(), a) == allowed.end()) allowed.push_back(a);
    }

    [[nodiscard]] bool accepts(asio::ip::address a) const {
        if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
        if (a.is_loopback()) return true;
        return std::find(allowed.begin(), allowed.end(), a) != allowed.end();
    }
};

/// Where a server for `host` listens: owned_address(host), else every interface ("0.0.0.0"),
/// which only a name that resolves to no address of this node comes to.
ELASTIC_DECL std::string bind_address_for(std::string_view host);

}  // namespace detail::rendezvous

/// The environment variable that hands an agent the job's secret itself (for schedulers that
/// inject secrets as variables); `--rdzv-conf secret_file=PATH` names a file instead.
inline constexpr std::string_view rendezvous_secret_variable = "ELASTIC_RDZV_SECRET";

/// Fills `conf.secret` (unless a custom launcher set it) from `secret_file` (its
/// contents, trailing line breaks stripped) or else ELASTIC_RDZV_SECRET, and removes that
/// variable from `env` either way, so workers (which inherit `env`) never see the secret.
/// usage_error for an unreadable file or an empty secret; `warn` hears about a file that its
/// group or others may read.
ELASTIC_DECL void load_rendezvous_secret(rendezvous_settings& conf, environment& env,
                                         const std::function<void(std::string_view)>& warn);

/// Whether the agent runs the multi-node rendezvous (tcp_rendezvous) rather than the
/// single-node path: more than one node, or a c10d store another agent hosts.
[[nodiscard]] ELASTIC_DECL bool uses_node_rendezvous(const rendezvous_parameters& p);

/// Where this node's workers' store listens and what the other nodes are told (MASTER_ADDR):
/// --local-addr when given; 127.0.0.1 when the rendezvous endpoint is a loopback address
/// (every node is on this machine); otherwise this host's fully qualified name.
struct advertised_address {
    std::string bind_host;
    std::string addr;
};

[[nodiscard]] ELASTIC_DECL advertised_address advertise(const rendezvous_parameters& p);

/// The static and c10d backends over TCP. `start()` hosts the rendezvous store or connects to
/// it; then `rendezvous()` is the store_rendezvous every round goes through.
///
/// static: node rank 0 (--node-rank, default 0) hosts at --master-addr:--master-port; the
/// others connect (retrying until the `timeout` key, 900 s). c10d: the agent whose endpoint is
/// this host (is_host rule, or --rdzv-conf is_host) hosts at the endpoint (port 29400 by
/// default); if binding fails under the heuristic (another agent here hosts already), it
/// connects instead, as torchrun does, and while nothing accepts connections there it binds
/// again until the join timeout (a port held by a program that does not listen).
template <class Defer = void>
class basic_tcp_rendezvous {
public:
    using log_function = std::function<void(std::string_view)>;

    basic_tcp_rendezvous(asio::any_io_executor executor, rendezvous_parameters parameters, log_function log = {})
        : executor_(std::move(executor)), params_(std::move(parameters)), log_(std::move(log)) {}

    basic_tcp_rendezvous(const basic_tcp_rendezvous&) = delete;
    basic_tcp_rendezvous& operator=(const basic_tcp_rendezvous&) = delete;

    /// Hosts or connects. rendezvous_error when the store can be neither hosted nor reached.
    asio::awaitable<void> start() {
        const auto endpoint = params_.endpoint;
        const auto host = detail::rendezvous::literal_for(endpoint.host);
        const std::uint16_t port = endpoint.port.value_or(0);
        const bool is_static = params_.backend == rendezvous_backend::static_;
        const auto join_timeout = is_static ? params_.settings.timeout : params_.settings.join_timeout;

        bool want_host = false;
        bool explicit_host = false;
        if (is_static) {
            want_host = params_.node_rank.value_or(0) == 0;
            explicit_host = true;
        } else if (params_.settings.is_host) {
            want_host = *params_.settings.is_host;
            explicit_host = true;
        } else {
            want_host = detail::rendezvous::is_this_host(endpoint.host);
        }
        std::string connect_host = host;
        const auto deadline = std::chrono::steady_clock::now() + join_timeout;
        if (want_host) {
            // A name: the address it resolves to on this node, not every interface.
            const auto bind_host = detail::rendezvous::bind_address_for(host);
            // Reach it where it listens (the name may resolve to another address first).
            const auto listening = bind_host == "0.0.0.0" ? std::string("127.0.0.1") : bind_host;
            const auto refused = try_host(bind_host, port);
            if (!refused) {
                connect_host = listening;
            } else if (explicit_host) {
                throw rendezvous_error(fmt::format(
                    "cannot host the rendezvous store at {}: {}{}", to_string(endpoint), refused->why,
                    is_static ? " (is another job on this port, or do two nodes have --node-rank=0?)"
                              : " (--rdzv-conf is_host=true forbids joining another agent's store instead)"));
            } else if (!refused->port_taken) {
                if (log_) {
                    log_(fmt::format("cannot host the rendezvous store at {} ({}); joining the agent that does",
                                     to_string(endpoint), refused->why));
                }
            } else if (co_await host_or_join(bind_host, probe_address(host, listening), port, deadline, refused->why)) {
                connect_host = listening;
            }
        }
        current_host_ = connect_host;
        current_port_ = server_ ? server_->port() : port;
        const auto options = client_options(current_host_, current_port_, join_timeout);
        client_ = std::make_unique<tcp_store_client>(executor_, options);
        watcher_ = std::make_unique<tcp_store_client>(executor_, options);
        lease_ = std::make_unique<tcp_store_client>(executor_, options);
        try {
            co_await client_->connect();
        } catch (const store_auth_error& e) {
            throw rendezvous_error(secret_refused(to_string(endpoint), e));
        } catch (const store_error& e) {
            throw rendezvous_error(fmt::format("cannot reach the rendezvous store at {} within {} s: {}",
                                               to_string(endpoint),
                                               std::chrono::duration_cast<std::chrono::seconds>(join_timeout).count(),
                                               e.what()));
        }
        store_rendezvous_options o;
        o.run_id = params_.run_id;
        o.nnodes = params_.nnodes.max;
        o.min_nodes = params_.nnodes.min;
        o.join_timeout = join_timeout;
        o.last_call_timeout = params_.settings.last_call_timeout;
        o.close_timeout = params_.settings.close_timeout;
        o.hosts_store = server_ != nullptr;
        o.log = log_;
        rdzv_.emplace(*client_, *watcher_, std::move(o));
        co_await agree_keep_alive(join_timeout);
        // c10d, elastic membership: an idle store server of this node's own, where the job's
        // rendezvous moves should the store's host be lost (docs/rendezvous.md). Made after the
        // keep-alive is agreed: it drops silent leases by the job's rule, not this node's.
        if (!is_static && params_.nnodes.min < params_.nnodes.max && !server_) {
            backup_ = std::make_unique<tcp_store_server>(executor_, server_options(advertise(params_).bind_host, 0));
            backup_->start();
        }
        if (!params_.settings.secret && log_) {
            log_(fmt::format("the rendezvous store at {} (port {}{}) accepts any client: whoever reaches it can read "
                             "and steer this job; give every agent the job's secret (--rdzv-conf "
                             "secret_file=PATH, or {}; docs/rendezvous.md, \"Security\")",
                             to_string(endpoint), current_port_,
                             backup_ ? fmt::format(", and this node's idle store on port {}", backup_->port())
                                     : std::string(),
                             rendezvous_secret_variable));
        }
    }

    /// Holds this node's lease (its liveness in the job) on a connection of its own and counts
    /// it as registered; `me` describes the node (its id is made here). After start().
    asio::awaitable<void> start_liveness(node_info me) {
        me.id = node_id_ = make_node_id(me.host, me.pid);
        try {
            co_await rdzv_->start_liveness(*lease_, me);
        } catch (const store_error& e) {
            throw rendezvous_error(fmt::format("cannot hold this node's lease on the rendezvous store: {}", e.what()));
        } catch (const rendezvous_error& e) {  // a store that is no elastic store
            throw rendezvous_error(fmt::format("the rendezvous store at {}: {}",
                                               to_string(host_port{current_host_, current_port_}), e.what()));
        }
    }

    /// How long silence lasts before a node or the store counts as lost:
    /// keep_alive_interval x keep_alive_max_attempt.
    [[nodiscard]] std::chrono::milliseconds keep_alive_deadline() const {
        return params_.settings.keep_alive_interval * params_.settings.keep_alive_max_attempt;
    }

    /// The port of this node's idle store server (0: none), where the job may move.
    [[nodiscard]] std::uint16_t backup_port() const noexcept { return backup_ ? backup_->port() : std::uint16_t{0}; }

    /// The rendezvous store was lost: moves the job to the first of `successors` that answers
    /// (this node's own idle server when it is that one), holds this node's lease there, and
    /// returns where it went. rendezvous_error when none answers.
    asio::awaitable<std::string> relocate(std::vector<store_successor> successors, node_info me) {
        if (successors.empty()) {
            throw rendezvous_error("the job's last round named no member that could host the rendezvous store");
        }
        // A successor answers within the time the store's own loss took to notice (keep alive).
        const auto patience = keep_alive_deadline();
        std::string tried;
        for (const auto& next : successors) {
            const bool mine = next.id == node_id_ && backup_;
            auto options = client_options(detail::rendezvous::literal_for(next.addr), next.port, patience);
            auto client = std::make_unique<tcp_store_client>(executor_, options);
            try {
                co_await client->connect();
            } catch (const store_error& e) {
                tried += fmt::format("{}{}:{} ({})", tried.empty() ? "" : ", ", next.addr, next.port, e.what());
                continue;
            }
            adopt(std::move(client), options);
            if (mine) server_ = std::move(backup_);
            rdzv_->move_to(*client_, *watcher_, mine);
            me.id = node_id_;
            try {
                co_await rdzv_->start_liveness(*lease_, me);
            } catch (const store_auth_error& e) {
                throw rendezvous_error(secret_refused(fmt::format("{}:{}", next.addr, next.port), e));
            } catch (const store_error& e) {
                throw rendezvous_error(
                    fmt::format("cannot hold this node's lease on the moved rendezvous store at {}:{}: {}", next.addr,
                                next.port, e.what()));
            } catch (const rendezvous_error& e) {  // no elastic store there (the port was taken): the next one
                tried += fmt::format("{}{}:{} ({})", tried.empty() ? "" : ", ", next.addr, next.port, e.what());
                continue;
            }
            co_return fmt::format("{}:{}{}", next.addr, next.port, mine ? " (this node)" : "");
        }
        throw rendezvous_error(fmt::format("none of the store's successors answered: {}", tried));
    }

    /// This node's lease connection ended, but the store may live on and have dropped this node
    /// (it heard no heartbeat in time: a stalled or overloaded agent). If the store answers a
    /// new connection, this node reconnects, holds a new lease and returns true (it rejoins
    /// the job at its next round); false when the store does not answer (it is lost).
    /// rendezvous_error when the store answers but refuses this node's secret: the store lives,
    /// and moving the job elsewhere would not make this node's secret right.
    asio::awaitable<bool> rejoin_store(node_info me) {
        const auto endpoint = fmt::format("{}:{}", current_host_, current_port_);
        auto options = client_options(current_host_, current_port_, keep_alive_deadline());
        auto client = std::make_unique<tcp_store_client>(executor_, options);
        try {
            co_await client->connect();
        } catch (const store_auth_error& e) {
            throw rendezvous_error(secret_refused(endpoint, e));
        } catch (const store_error&) {
            co_return false;
        }
        adopt(std::move(client), options);
        rdzv_->reconnected(*client_, *watcher_);
        // A new name: the old one is on the job's list of lost nodes, which rounds leave out.
        me.id = node_id_ = make_node_id(me.host, me.pid);
        try {
            co_await rdzv_->start_liveness(*lease_, me);
        } catch (const store_auth_error& e) {
            throw rendezvous_error(secret_refused(endpoint, e));
        } catch (const store_error& e) {
            throw rendezvous_error(
                fmt::format("cannot hold this node's lease again on the rendezvous store at {}:{}: {}", current_host_,
                            current_port_, e.what()));
        } catch (const rendezvous_error&) {
            co_return false;  // what answers there now is no elastic store: the job's store is lost
        }
        co_return true;
    }

    // ---- agent_rendezvous: what the agent's loop calls ----

    /// start(), then start_liveness(me).
    asio::awaitable<void> join(node_info me) {
        co_await start();
        co_await start_liveness(std::move(me));
    }

    asio::awaitable<void> keep_membership() { co_await rdzv_->keep_membership(); }

    /// Joins the next round as `me`, with this node's lease name and idle store's port.
    asio::awaitable<rendezvous_round> next_round(node_info me) {
        me.id = node_id_;
        me.backup_port = backup_port();
        co_return co_await rdzv_->next_round(std::move(me));
    }

    /// The round's abort. Cancelled (the workers ended first), its connection is left
    /// mid-request: it is dropped, and the next use reconnects.
    asio::awaitable<abort_notice> wait_for_abort() {
        struct drop_unless_answered {
            basic_tcp_rendezvous* self;
            bool answered = false;
            ~drop_unless_answered() {
                if (!answered) self->reset_watcher();
            }
        } guard{this};
        auto notice = co_await rdzv_->wait_for_abort();
        guard.answered = true;
        co_return notice;
    }

    asio::awaitable<bool> abort(abort_notice notice) { co_return co_await rdzv_->abort(std::move(notice)); }
    asio::awaitable<job_decision> decide(job_decision decision) {
        co_return co_await rdzv_->decide(std::move(decision));
    }
    asio::awaitable<job_decision> await_decision() { co_return co_await rdzv_->await_decision(); }
    asio::awaitable<barrier_result> finish(std::chrono::milliseconds timeout) {
        co_return co_await rdzv_->finish(timeout);
    }
    asio::awaitable<void> leave() { co_await rdzv_->leave(); }
    [[nodiscard]] int restart_count() const noexcept { return rdzv_ ? rdzv_->restart_count() : 0; }

    /// The rendezvous store was lost (`reason`; this node's workers are stopped already). Only the
    /// end of the lease connection is the store's loss: an error on one request alone throws
    /// rendezvous_error(reason). Over c10d, a store that still answers dropped this node (no
    /// heartbeat in time), which rejoins it, whatever --nnodes says: the others re-form and
    /// wait for it. With elastic membership, a store that does not answer moves to the first
    /// successor that does, and the next round needs a majority of the last. Returns one line
    /// saying which; rendezvous_error when the job cannot go on.
    asio::awaitable<std::string> recover(std::string reason, node_info me) {
        const bool is_static = params_.backend == rendezvous_backend::static_;
        const bool elastic_membership = !is_static && params_.nnodes.min < params_.nnodes.max;
        if (is_static || !rdzv_) throw rendezvous_error(std::move(reason));
        if (!co_await rdzv_->confirm_store_lost(keep_alive_deadline())) throw rendezvous_error(std::move(reason));
        // Only a store that does not answer moves (so an overloaded node never splits the job).
        if (co_await rejoin_store(me)) {
            // Either side may have ended it: the store heard no heartbeat from this agent (stopped
            // or starved of CPU), or this agent heard none from the store (its host was stopped).
            co_return fmt::format("this node's lease connection to the rendezvous store at {} ended (the store heard "
                                  "no heartbeat from this agent within keep_alive_interval x keep_alive_max_attempt, "
                                  "or this agent none from the store: one of them was stopped or starved of CPU), "
                                  "and the store answers again: reconnected, rejoining the job",
                                  store_endpoint());
        }
        if (!elastic_membership) throw rendezvous_error(std::move(reason));
        const int before = rdzv_->last_round_size();
        std::string where;
        try {
            where = co_await relocate(rdzv_->successors(), std::move(me));
        } catch (const std::exception& e) {
            throw rendezvous_error(fmt::format("{}; the job cannot move it: {}", reason, e.what()));
        }
        co_return fmt::format("{}; the job's rendezvous moves to {}, the first member's idle store that answered; the "
                              "next round needs {} of the last round's {} nodes (a majority)",
                              reason, where, before / 2 + 1, before);
    }

    /// Where this node reaches the rendezvous store now ("host:port").
    [[nodiscard]] std::string store_endpoint() const { return fmt::format("{}:{}", current_host_, current_port_); }

    /// This node's lease name ("host:pid:tag"), after start_liveness().
    [[nodiscard]] const std::string& node_id() const noexcept { return node_id_; }

    /// The rounds (after start()).
    store_rendezvous<tcp_store_client>& rendezvous() { return *rdzv_; }
    /// Whether this agent hosts the rendezvous store.
    [[nodiscard]] bool hosts_store() const noexcept { return server_ != nullptr; }
    /// The port of the hosted store (0 when a client).
    [[nodiscard]] std::uint16_t hosted_port() const { return server_ ? server_->port() : std::uint16_t{0}; }
    /// Drops the watcher's connection; the next use reconnects.
    void reset_watcher() noexcept {
        if (watcher_) watcher_->close();
    }

    /// Stops serving (after leave()).
    void stop() noexcept {
        if (lease_) lease_->close();
        if (watcher_) watcher_->close();
        if (client_) client_->close();
        for (auto& c : retired_) {
            if (c) c->close();
        }
        if (server_) server_->stop();
        if (backup_) backup_->stop();
    }

private:
    asio::any_io_executor executor_;
    rendezvous_parameters params_;
    log_function log_;
    std::unique_ptr<tcp_store_server> server_;
    std::unique_ptr<tcp_store_client> client_;
    std::unique_ptr<tcp_store_client> watcher_;
    std::unique_ptr<tcp_store_client> lease_;                 ///< holds this node's lease; observes losses
    std::unique_ptr<tcp_store_server> backup_;                ///< idle until the job's store moves here
    std::vector<std::unique_ptr<tcp_store_client>> retired_;  ///< a lost store's clients (pending waits end first)

    // Replaces this node's connections with `client` (connected) and two more like it; the old
    // ones are closed but kept until the end (a coroutine may still be unwinding from them).
    void adopt(std::unique_ptr<tcp_store_client> client, const store_client_options& options) {
        for (auto* old : {&client_, &watcher_, &lease_}) {
            if (*old) (*old)->close();
            retired_.push_back(std::move(*old));
        }
        client_ = std::move(client);
        watcher_ = std::make_unique<tcp_store_client>(executor_, options);
        lease_ = std::make_unique<tcp_store_client>(executor_, options);
        current_host_ = options.host;
        current_port_ = options.port;
    }

    // The store's host drops a lease by its own keep-alive, whatever the holder was told: the
    // host publishes its keep_alive_interval and keep_alive_max_attempt, and an agent that was
    // given other values says so and heartbeats by the host's (one mismatched agent would
    // otherwise be dropped and rejoin over and over, or be noticed late when it dies).
    asio::awaitable<void> agree_keep_alive(std::chrono::milliseconds patience) {
        if (server_) co_return;  // written into the server before it started
        const auto k = keep_alive_key();
        auto& mine = params_.settings;
        const auto text = keep_alive_text();
        std::vector<std::string> keys{k};
        if (!co_await client_->check(std::move(keys))) co_return;  // not an elastic agent's store
        const std::string theirs = co_await client_->get(k);
        long long interval_ms = 0;
        int attempts = 0;
        if (std::sscanf(theirs.c_str(), "%lld %d", &interval_ms, &attempts) != 2 || interval_ms <= 0 || attempts <= 0) {
            throw rendezvous_error(fmt::format("the rendezvous store's key '{}' holds '{}', not "
                                               "'<keep_alive_interval ms> <keep_alive_max_attempt>': another program "
                                               "uses --rdzv-id '{}' on this store",
                                               k, theirs, params_.run_id));
        }
        if (text == theirs) co_return;
        if (log_) {
            log_(fmt::format("keep-alive: this node was given keep_alive_interval={} s, keep_alive_max_attempt={}, "
                             "but the rendezvous store's host uses {} s x {} (it drops silent nodes by its own "
                             "values): this node heartbeats by the host's",
                             seconds(mine.keep_alive_interval), mine.keep_alive_max_attempt,
                             seconds(std::chrono::milliseconds(interval_ms)), attempts));
        }
        mine.keep_alive_interval = std::chrono::milliseconds(interval_ms);
        mine.keep_alive_max_attempt = attempts;
        // Only the lease connection heartbeats; it is not connected yet.
        lease_ = std::make_unique<tcp_store_client>(executor_, client_options(current_host_, current_port_, patience));
    }

    [[nodiscard]] std::string keep_alive_key() const {
        return store_rendezvous<tcp_store_client>::job_key(params_.run_id, "keep_alive");
    }
    [[nodiscard]] std::string keep_alive_text() const {
        return fmt::format("{} {}", params_.settings.keep_alive_interval.count(),
                           params_.settings.keep_alive_max_attempt);
    }

    // Why this agent could not host the store: the server's message, and whether the port is
    // taken (then normally another agent here hosts; see host_or_join).
    struct host_refusal {
        std::string why;
        bool port_taken = false;
    };

    // Hosts the store at bind_host:port (nullopt), or says why not.
    std::optional<host_refusal> try_host(const std::string& bind_host, std::uint16_t port) {
        try {
            server_ = std::make_unique<tcp_store_server>(executor_, server_options(bind_host, port));
            // The job's keep-alive is in the store before anyone can connect (an agent that
            // read it a moment too early would heartbeat by its own values: agree_keep_alive).
            server_->engine().set(store_client_options{}.key_prefix + keep_alive_key(), keep_alive_text());
            server_->start();
            return std::nullopt;
        } catch (const store_listen_error& e) {
            server_.reset();
            // Asio's own system category: compare with its code, not std::errc.
            return host_refusal{e.what(), e.code() == asio::error::address_in_use};
        } catch (const store_error& e) {
            server_.reset();
            return host_refusal{e.what(), false};
        }
    }

    // The address a joining agent dials, to probe whether anything accepts there: the endpoint's
    // host when it is an address, else where this agent would have listened.
    static std::string probe_address(const std::string& host, const std::string& listening) {
        std::error_code ec;
        (void)asio::ip::make_address(host, ec);
        return ec ? listening : host;
    }

    // The endpoint is this host's but its port is taken: normally another agent here hosts the
    // store, and this one joins it. A port held by something that does not listen (a client's
    // connection that drew it as its local port) would leave every agent here dialling nothing
    // until join_timeout: so while nothing accepts a connection at `probe`, this one binds
    // again, every 100 ms, until one of the two works. True when it hosts. Whatever accepts is
    // joined and judged by the client (a foreign program, a store that does not answer: their
    // errors).
    asio::awaitable<bool> host_or_join(const std::string& bind_host, const std::string& probe, std::uint16_t port,
                                       std::chrono::steady_clock::time_point deadline, std::string refused) {
        const auto endpoint = to_string(params_.endpoint);
        for (bool told = false;;) {
            if (co_await accepts(probe, port)) {
                if (log_) {
                    log_(fmt::format("the rendezvous store at {} is hosted by another agent on this host ({}); "
                                     "joining it",
                                     endpoint, refused));
                }
                co_return false;
            }
            if (auto again = try_host(bind_host, port); !again) {
                if (log_) log_(fmt::format("the rendezvous store at {}: this agent hosts it after all", endpoint));
                co_return true;
            } else if (!again->port_taken) {
                throw rendezvous_error(fmt::format("cannot host the rendezvous store at {}: {}", endpoint, again->why));
            } else {
                refused = std::move(again->why);
            }
            if (std::chrono::steady_clock::now() >= deadline) {
                throw rendezvous_error(fmt::format(
                    "cannot host the rendezvous store at {} ({}), and nothing accepts connections there within the "
                    "join timeout: a program on this host holds port {} without listening on it (`ss -tanp 'sport = "
                    ":{}'` names it); stop it or choose another --rdzv-endpoint port",
                    endpoint, refused, port, port));
            }
            if (log_ && !told) {
                told = true;
                log_(fmt::format("cannot host the rendezvous store at {} ({}), and nothing accepts connections "
                                 "there: this agent binds it again every 100 ms until it hosts or another agent "
                                 "does, for at most the join timeout",
                                 endpoint, refused));
            }
            asio::steady_timer pause(executor_, std::chrono::milliseconds(100));
            co_await pause.async_wait(detail::as_tuple_awaitable<Defer>);
        }
    }

    // Whether something accepts a TCP connection at address:port (this host's: refused at once
    // when nothing listens; a full backlog that answers nothing within 1 s counts as a
    // listener). A connection to itself (its local port drawn equal to `port`: TCP's
    // simultaneous open) is nothing accepting.
    asio::awaitable<bool> accepts(const std::string& address, std::uint16_t port) {
        using namespace asio::experimental::awaitable_operators;
        std::error_code ec;
        const auto ip = asio::ip::make_address(address, ec);
        if (ec) co_return true;  // not a literal: the client resolves and judges it
        asio::ip::tcp::socket socket(executor_);
        asio::steady_timer limit(executor_, std::chrono::seconds(1));
        auto which = co_await (socket.async_connect({ip, port}, detail::as_tuple_awaitable<Defer>) ||
                               limit.async_wait(detail::as_tuple_awaitable<Defer>));
        if (which.index() == 1) co_return true;
        const auto [connect_error] = std::get<0>(which);
        if (connect_error) co_return false;
        std::error_code local_error;
        std::error_code remote_error;
        const auto local = socket.local_endpoint(local_error);
        const auto remote = socket.remote_endpoint(remote_error);
        co_return local_error || remote_error || local != remote;
    }

    // An agent whose secret the store refuses cannot take part: say which endpoint and option.
    static std::string secret_refused(const std::string& endpoint, const store_auth_error& e) {
        return fmt::format("the rendezvous store at {} and this node do not share the job's secret: {}; give every "
                           "agent the same secret (--rdzv-conf secret_file=PATH, or {})",
                           endpoint, e.what(), rendezvous_secret_variable);
    }

    static std::string seconds(std::chrono::milliseconds d) {
        return fmt::format("{:g}", static_cast<double>(d.count()) / 1000.0);
    }

    store_server_options server_options(std::string bind_host, std::uint16_t port) {
        store_server_options options;
        options.host = std::move(bind_host);
        options.port = port;
        options.log = [this](std::string_view line) {
            // A lost lease is the agents' business: each says what it does about it.
            if (line.find("lease '") != std::string_view::npos) return;
            if (log_) log_(fmt::format("rendezvous store: {}", line));
        };
        // Liveness: every agent's lease heartbeats at keep_alive_interval; the store counts an
        // agent lost after keep_alive_max_attempt silent intervals (or at once when its
        // connection closes).
        options.lease_heartbeat_interval = params_.settings.keep_alive_interval;
        options.lease_missed_heartbeats = static_cast<unsigned>(params_.settings.keep_alive_max_attempt);
        // Every connection, the agents' own included, authenticates when the job has a secret.
        options.secret = params_.settings.secret;
        return options;
    }

    store_client_options client_options(std::string host, std::uint16_t port,
                                        std::chrono::milliseconds connect_timeout) const {
        store_client_options options;
        options.host = std::move(host);
        options.port = port;
        // detect: a torchrun 1.13 agent's store (legacy dialect) is reached too, so the torchrun
        // guard can name it instead of failing on the handshake.
        options.dialect = client_dialect::detect;
        options.timeout = params_.settings.read_timeout;
        options.connect_timeout = connect_timeout;
        options.lease_heartbeat_interval = params_.settings.keep_alive_interval;
        options.lease_missed_heartbeats = static_cast<unsigned>(params_.settings.keep_alive_max_attempt);
        options.secret = params_.settings.secret;
        return options;
    }
    std::optional<store_rendezvous<tcp_store_client>> rdzv_;
    std::string node_id_;
    std::string current_host_;  ///< where the rendezvous store is reached now
    std::uint16_t current_port_ = 0;

    static std::string make_node_id(const std::string& host, long pid) {
        std::random_device entropy;
        return fmt::format("{}:{}:{:04x}", host.empty() ? std::string("node") : host, pid, entropy() & 0xffffu);
    }
};
using tcp_rendezvous = basic_tcp_rendezvous<>;

static_assert(agent_rendezvous<tcp_rendezvous>);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::rendezvous {

ELASTIC_DECL bool is_loopback(std::string_view host) {
    if (host == "localhost" || host == "localhost.localdomain" || host == "ip6-localhost") return true;
    std::error_code ec;
    const auto address = asio::ip::make_address(std::string(host), ec);
    return !ec && address.is_loopback();
}

ELASTIC_DECL bool is_ip_literal(std::string_view host) {
    std::error_code ec;
    (void)asio::ip::make_address(std::string(host), ec);
    return !ec;
}

ELASTIC_DECL std::optional<asio::ip::address> address_of(const sockaddr* sa) {
    if (sa == nullptr) return std::nullopt;
    if (sa->sa_family == AF_INET) {
        const auto* v4 = reinterpret_cast<const sockaddr_in*>(sa);
        return asio::ip::address(asio::ip::address_v4(ntohl(v4->sin_addr.s_addr)));
    }
    if (sa->sa_family == AF_INET6) {
        const auto* v6 = reinterpret_cast<const sockaddr_in6*>(sa);
        asio::ip::address_v6::bytes_type bytes;
        std::copy(std::begin(v6->sin6_addr.s6_addr), std::end(v6->sin6_addr.s6_addr), bytes.begin());
        return asio::ip::address(asio::ip::address_v6(bytes));
    }
    return std::nullopt;
}

ELASTIC_DECL bool is_this_host(std::string_view host) {
    if (is_loopback(host)) return true;
    if (host == host_name()) return true;
    if (host == host_fqdn()) return true;
    std::error_code ec;
    const auto wanted = asio::ip::make_address(std::string(host), ec);
    if (ec) return false;
    return interface_holds(wanted);
}

ELASTIC_DECL bool interface_holds(const asio::ip::address& wanted) {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return false;
    bool found = false;
    for (auto* i = list; i != nullptr && !found; i = i->ifa_next) found = address_of(i->ifa_addr) == wanted;
    ::freeifaddrs(list);
    return found;
}

ELASTIC_DECL std::vector<std::string> interface_addresses() {
    std::vector<std::string> out;
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return out;
    for (auto* i = list; i != nullptr && out.size() < max_addrs; i = i->ifa_next) {
        if (i->ifa_addr == nullptr) continue;
        const auto found = address_of(i->ifa_addr);
        if (!found || (found->is_v6() && found->to_v6().is_link_local())) continue;
        const auto& a = *found;
        if (a.is_loopback() || a.is_unspecified()) continue;
        auto text = a.to_string();
        if (std::find(out.begin(), out.end(), text) == out.end()) out.push_back(std::move(text));
    }
    ::freeifaddrs(list);
    return out;
}

ELASTIC_DECL std::string literal_for(std::string_view host) {
    if (is_loopback(host) && !is_ip_literal(host)) return "127.0.0.1";
    return std::string(host);
}

ELASTIC_DECL std::string owned_address(std::string_view host) {
    const auto literal = literal_for(host);
    if (is_ip_literal(literal)) return literal;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    if (::getaddrinfo(literal.c_str(), nullptr, &hints, &list) != 0) return {};
    std::string chosen;
    for (auto* i = list; i != nullptr && chosen.empty(); i = i->ai_next) {
        const auto found = address_of(i->ai_addr);
        if (!found || (found->is_v6() && found->to_v6().is_link_local())) continue;
        if (found->is_loopback() || interface_holds(*found)) chosen = found->to_string();
    }
    ::freeaddrinfo(list);
    return chosen;
}

ELASTIC_DECL std::vector<asio::ip::address> resolve_all(std::string_view host) {
    std::vector<asio::ip::address> out;
    std::error_code ec;
    auto literal = asio::ip::make_address(std::string(host), ec);
    if (!ec) {
        out.push_back(literal);
    } else {
        addrinfo hints{};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* list = nullptr;
        if (::getaddrinfo(std::string(host).c_str(), nullptr, &hints, &list) != 0) return out;
        for (auto* i = list; i != nullptr; i = i->ai_next)
            if (const auto a = address_of(i->ai_addr)) out.push_back(*a);
        ::freeaddrinfo(list);
    }
    for (auto& a : out) {
        if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
    }
    return out;
}

ELASTIC_DECL std::string bind_address_for(std::string_view host) {
    auto owned = owned_address(host);
    return owned.empty() ? std::string("0.0.0.0") : owned;
}

}  // namespace detail::rendezvous
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL void load_rendezvous_secret(rendezvous_settings& conf, environment& env,
                                         const std::function<void(std::string_view)>& warn) {
    std::optional<std::string> from_env;
    if (const auto it = env.find(rendezvous_secret_variable); it != env.end()) {
        from_env = it->second;
        env.erase(it);
    }
    if (conf.secret) return;
    if (conf.secret_file) {
        const auto& path = *conf.secret_file;
        std::ifstream in(path, std::ios::binary);
        if (!in)
            throw usage_error{fmt::format("--rdzv-conf secret_file={}: cannot read it ({}); give a "
                                          "file holding the job's secret",
                                          path, std::error_code(errno, std::generic_category()).message())};
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
        if (text.empty())
            throw usage_error{fmt::format("--rdzv-conf secret_file={}: the file is empty; write the job's "
                                          "secret into it (head -c 32 /dev/urandom | base64 > {})",
                                          path, path)};
        struct stat st {};
        if (warn && ::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
            warn(fmt::format("--rdzv-conf secret_file={}: the file is readable by its group or others "
                             "(mode {:04o}); chmod 600 it",
                             path, static_cast<unsigned>(st.st_mode & 07777)));
        conf.secret = std::move(text);
        return;
    }
    if (from_env) {
        if (from_env->empty())
            throw usage_error{
                fmt::format("{} is set but empty; give it the job's secret, or unset it", rendezvous_secret_variable)};
        conf.secret = std::move(*from_env);
    }
}

[[nodiscard]] ELASTIC_DECL bool uses_node_rendezvous(const rendezvous_parameters& p) {
    if (p.nnodes.max > 1) return true;
    if (p.backend != rendezvous_backend::c10d) return false;
    if (p.settings.is_host) return !*p.settings.is_host;
    return !detail::rendezvous::is_this_host(p.endpoint.host);
}

[[nodiscard]] ELASTIC_DECL advertised_address advertise(const rendezvous_parameters& p) {
    if (p.local_addr) {
        const auto lit = detail::rendezvous::literal_for(*p.local_addr);
        return {detail::rendezvous::bind_address_for(lit), lit};
    }
    if (detail::rendezvous::is_loopback(p.endpoint.host)) return {"127.0.0.1", "127.0.0.1"};
    const auto fqdn = host_fqdn();
    return {detail::rendezvous::bind_address_for(fqdn), fqdn};
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/rendezvous/tcp_rendezvous.hpp ----
// ---- end elastic/rendezvous.hpp ----
// ---- begin elastic/policy.hpp ----
// The restart-policy layer: the restart_policy concept, group_failure / restart_decision,
// max_restarts(n), the built-in policies and combinators, and make_default_policy(settings).

// ---- begin elastic/policy/concepts.hpp ----
// The restart_policy concept: a coroutine awaited with a worker group's failure that answers
// restart (after whatever delay it awaits itself) or stop, with a reason in words.


#include <asio/awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// What a policy answers.
struct restart_decision {
    enum class action { restart, stop };

    action what = action::stop;
    /// Why, in words, for the agent's log ("restart 1 of 3 (--max-restarts=3)").
    std::string reason;

    [[nodiscard]] bool restart() const noexcept { return what == action::restart; }

    static restart_decision restart_because(std::string why) { return {action::restart, std::move(why)}; }
    static restart_decision stop_because(std::string why) { return {action::stop, std::move(why)}; }
};

/// A worker group's failure, as a restart policy sees it.
///
/// `workers` holds every worker that did not succeed, in report form (report/failure.hpp):
/// those that failed on their own (`failure_state::failed`: exit code or signal, error file,
/// stderr tail, when the agent saw the exit) and those the agent then stopped
/// (`failure_state::stopped_by_agent`). The helpers below answer the usual questions.
struct group_failure {
    /// The failed and the stopped workers of the group (not those that had exited 0).
    std::vector<worker_failure> workers;
    /// Restarts of the group so far in this job (0 at the first failure). The count workers see
    /// as TORCHELASTIC_RESTART_COUNT during the attempt that failed.
    int restarts = 0;
    /// When the failed attempt's workers had all been started.
    std::chrono::steady_clock::time_point started{};
    /// When the agent saw the first failure (the end of the healthy period).
    std::chrono::steady_clock::time_point failed{};
    /// Set by the agent for the policy's call: a policy that has decided to restart and is about
    /// to wait before it answers (a backoff) calls it first, with its reason and the wait, so
    /// the log says "restarting ... in 1.8 s" as the wait starts rather than after it. The
    /// built-in chain and models call it; a policy of your own may. Empty: nobody listens.
    std::function<void(const restart_decision&, std::chrono::steady_clock::duration)> before_delay;

    /// How long the group ran healthy before the first failure.
    [[nodiscard]] std::chrono::steady_clock::duration healthy_for() const noexcept { return failed - started; }

    /// The workers that failed on their own (never those the agent stopped).
    [[nodiscard]] std::vector<const worker_failure*> failures() const {
        std::vector<const worker_failure*> out;
        for (const auto& w : workers) {
            if (w.state == failure_state::failed) out.push_back(&w);
        }
        return out;
    }

    /// The root cause: the first failure by time (report's root_cause rule); null when no
    /// worker failed on its own.
    [[nodiscard]] const worker_failure* root_cause() const noexcept {
        const auto i = elastic::root_cause(std::span<const worker_failure>(workers));
        return i ? &workers[*i] : nullptr;
    }

    /// The local ranks and global ranks that failed on their own, in rank order.
    [[nodiscard]] std::vector<int> failed_local_ranks() const {
        std::vector<int> out;
        for (const auto* w : failures()) out.push_back(w->local_rank);
        std::sort(out.begin(), out.end());
        return out;
    }
    [[nodiscard]] std::vector<int> failed_global_ranks() const {
        std::vector<int> out;
        for (const auto* w : failures()) out.push_back(w->global_rank);
        std::sort(out.begin(), out.end());
        return out;
    }
};

/*
 * restart_policy: what a model must provide and what it promises.
 *
 *   asio::awaitable<restart_decision> operator()(const group_failure& failure);
 *
 * - The agent awaits it once per failed attempt, after the group has been stopped, on the
 *   agent's io_context (one thread: a policy needs no locks). The failure lives until the
 *   awaitable completes.
 * - A policy may await anything before answering (a backoff timer, a store, an operator): the
 *   agent races the await against the signals it handles, so a policy must be cancellable at
 *   its suspension points (Asio's timers and sockets are).
 * - It may keep state across calls (a budget spent, a window of failures); the agent holds
 *   one object for the whole job and calls it through a non-const reference.
 * - Combinators (`a | b`: the first to say stop wins, delays add up) take models by value and
 *   are models themselves; that is why the call is the only requirement.
 */
template <class P>
concept restart_policy = std::move_constructible<P> && requires(P& p, const group_failure& f) {
    { p(f) } -> std::same_as<asio::awaitable<restart_decision>>;
};

}  // namespace elastic::inline v0
// ---- end elastic/policy/concepts.hpp ----
// ---- begin elastic/policy/max_restarts.hpp ----
// max_restarts(n): the default restart policy, torchrun's --max-restarts budget.

// ---- begin elastic/policy/spec.hpp ----
// The settings of the built-in restart policies as values: durations in words, backoff_spec,
// window_spec, exit_code_set and crash_guard_spec, with the parsers of their command-line forms
// (--restart-backoff, --restart-window, --restart-on-exit, --restart-crash-guard), and
// restart_settings, all of them together (what make_default_policy takes).

// ---- begin elastic/detail/text.hpp ----
// Small text helpers for the parsers of every layer: trim, lower, split, a whole integer,
// `name=value` as error messages show it, and a duration in seconds.


#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace elastic::inline v0 {

namespace detail {

[[nodiscard]] inline std::string_view trim(std::string_view text) noexcept {
    const auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
    while (!text.empty() && is_space(text.front())) {
        text.remove_prefix(1);
    }
    while (!text.empty() && is_space(text.back())) {
        text.remove_suffix(1);
    }
    return text;
}

[[nodiscard]] inline std::string lower(std::string_view text) {
    std::string out{text};
    std::transform(out.begin(), out.end(), out.begin(),
                   [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
    return out;
}

/// `name=value` as error messages show it; a value that is empty or has spaces is quoted.
[[nodiscard]] inline std::string show(std::string_view name, std::string_view value) {
    const bool quote = value.empty() || value.find_first_of(" \t\n'") != std::string_view::npos;
    return quote ? fmt::format("{}='{}'", name, value) : fmt::format("{}={}", name, value);
}

/// Splits on `sep`; "" gives one empty piece.
[[nodiscard]] inline std::vector<std::string_view> split(std::string_view text, char sep) {
    std::vector<std::string_view> pieces;
    for (;;) {
        const auto at = text.find(sep);
        pieces.push_back(text.substr(0, at));
        if (at == std::string_view::npos) {
            return pieces;
        }
        text.remove_prefix(at + 1);
    }
}

/// A duration as a number of seconds, as the options take it: `30`, `0.5`.
[[nodiscard]] inline std::string seconds_text(std::chrono::milliseconds d) {
    return d.count() % 1000 == 0 ? fmt::format("{}", d.count() / 1000)
                                 : fmt::format("{}", static_cast<double>(d.count()) / 1000.0);
}

/// A whole decimal integer (surrounding spaces allowed, as Python's int()), or nothing.
[[nodiscard]] inline std::optional<long long> to_integer(std::string_view text) noexcept {
    text = trim(text);
    if (!text.empty() && text.front() == '+') {
        text.remove_prefix(1);
    }
    long long value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) {
        return std::nullopt;
    }
    return value;
}

}  // namespace detail

}  // namespace elastic::inline v0
// ---- end elastic/detail/text.hpp ----

#include <fmt/format.h>

#include <bitset>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace elastic::inline v0 {

namespace detail::policy {

/// "1.5" from 1500 (thousandths), trailing zeros dropped.
[[nodiscard]] ELASTIC_DECL std::string thousandths(long long value);

[[nodiscard]] ELASTIC_DECL std::string duration_text(std::chrono::nanoseconds d, bool spaced);

}  // namespace detail::policy

/// A duration as the restart flags write it, without a space: "500ms", "1.5s", "2min", "1h".
/// parse_duration() reads it back exactly (to the millisecond).
[[nodiscard]] ELASTIC_DECL std::string duration_flag_text(std::chrono::nanoseconds d);

/// A duration as reasons write it: "500 ms", "1.5 s", "2 min", "1 h" (to the millisecond).
[[nodiscard]] ELASTIC_DECL std::string duration_words(std::chrono::nanoseconds d);

/// A duration: a number (decimals allowed) and a unit, ms, s, m or min, h; a bare number is
/// seconds, as torchrun's options count. At most 1e9 seconds; held to the millisecond. `name`
/// names the option or variable in the usage_error.
[[nodiscard]] ELASTIC_DECL std::chrono::milliseconds parse_duration(std::string_view text, std::string_view name,
                                                                    bool allow_zero = false);

/// How a built-in policy cites itself in its reasons: as the C++ call that made it (the
/// default: "max_restarts(3)", for a launcher whose policy is set in its code), or as the
/// command-line option (the policy elasticrun builds from its options: "--max-restarts=3"). So
/// a log line never names an option nobody passed.
enum class policy_naming { code, command_line };

/// The naming a built-in policy carries (its base class).
class named_policy {
public:
    [[nodiscard]] policy_naming naming() const noexcept { return naming_; }
    /// Cite the command-line option instead of the C++ call (make_default_policy does).
    void name_by(policy_naming naming) noexcept { naming_ = naming; }

protected:
    [[nodiscard]] std::string cite(std::string code, std::string flag) const {
        return naming_ == policy_naming::code ? std::move(code) : std::move(flag);
    }

private:
    policy_naming naming_ = policy_naming::code;
};

/// --restart-backoff=INITIAL:CAP[:RESET]: wait INITIAL before the first restart, doubling for
/// each failure in a row up to CAP; a group that ran healthy for RESET starts over at INITIAL.
struct backoff_spec {
    std::chrono::milliseconds initial{1000};
    std::chrono::milliseconds cap{60000};
    /// Kubernetes' CrashLoopBackOff forgets its backoff after 10 minutes of healthy running.
    std::chrono::milliseconds reset_after{std::chrono::minutes(10)};
    /// Each delay grows by this factor (> 1 ... or exactly 1 for a constant delay).
    double factor = 2.0;
    /// Each delay is shortened by up to this fraction, at random (0 <= jitter < 1), so that the
    /// nodes of a job do not all come back at the same instant.
    double jitter = 0.1;

    /// The command-line form, as reasons cite it: "--restart-backoff=1s:1min" (":RESET" when
    /// not the default).
    [[nodiscard]] std::string flag() const {
        std::string out = fmt::format("--restart-backoff={}:{}", duration_flag_text(initial), duration_flag_text(cap));
        if (reset_after != backoff_spec{}.reset_after) out += ":" + duration_flag_text(reset_after);
        return out;
    }
    /// The C++ form: "backoff(1s, 1min)", or the spec when it is not the defaults but for the
    /// two durations ("backoff(backoff_spec{1s, 1min, 30min, 1.5, 0.1})").
    [[nodiscard]] std::string code() const {
        const backoff_spec plain{initial, cap};
        if (*this == plain) return fmt::format("backoff({}, {})", duration_flag_text(initial), duration_flag_text(cap));
        return fmt::format("backoff(backoff_spec{{{}, {}, {}, {}, {}}})", duration_flag_text(initial),
                           duration_flag_text(cap), duration_flag_text(reset_after), factor, jitter);
    }
    friend bool operator==(const backoff_spec&, const backoff_spec&) = default;
};

/// Parses INITIAL:CAP[:RESET] (durations as parse_duration reads them; INITIAL <= CAP).
[[nodiscard]] ELASTIC_DECL backoff_spec parse_backoff_spec(std::string_view text, std::string_view name);

/// --restart-window=N/PERIOD: at most N restarts within any PERIOD (a sliding window).
struct window_spec {
    int restarts = 1;
    std::chrono::milliseconds period{std::chrono::hours(1)};

    [[nodiscard]] std::string flag() const {
        return fmt::format("--restart-window={}/{}", restarts, duration_flag_text(period));
    }
    [[nodiscard]] std::string code() const {
        return fmt::format("restart_window({}, {})", restarts, duration_flag_text(period));
    }
    friend bool operator==(const window_spec&, const window_spec&) = default;
};

/// Parses N/PERIOD (N >= 1).
[[nodiscard]] ELASTIC_DECL window_spec parse_window_spec(std::string_view text, std::string_view name);

/// A class of worker endings: exit codes, and deaths by signal. `signals` (any signal) and a
/// named signal also match the exit code 128+N a shell reports for a child killed by signal N,
/// since workers are often started by a wrapper script.
struct exit_code_set {
    std::bitset<256> codes;   ///< exit codes 0..255
    bool any_signal = false;  ///< every death by signal
    std::bitset<65> signals;  ///< signals 1..64 by number

    [[nodiscard]] bool contains(const exit_status& status) const noexcept {
        if (status.signaled())
            return any_signal ||
                   (status.value >= 1 && status.value <= 64 && signals.test(static_cast<std::size_t>(status.value)));
        if (status.value < 0 || status.value > 255) return false;
        if (codes.test(static_cast<std::size_t>(status.value))) return true;
        const int n = status.value - 128;
        return n >= 1 && n <= 64 && (any_signal || signals.test(static_cast<std::size_t>(n)));
    }

    /// The canonical text: codes and ranges ascending, then "signals" or the signal names
    /// ("1,3-5,signals"); parse_exit_code_set() reads it back.
    [[nodiscard]] std::string to_string() const {
        std::string out;
        const auto add = [&](const std::string& item) { out += (out.empty() ? "" : ",") + item; };
        for (std::size_t c = 0; c < 256; ++c) {
            if (!codes.test(c)) continue;
            std::size_t last = c;
            while (last + 1 < 256 && codes.test(last + 1)) ++last;
            add(last == c ? fmt::format("{}", c) : fmt::format("{}-{}", c, last));
            c = last;
        }
        if (any_signal) {
            add("signals");
        } else {
            for (int s = 1; s <= 64; ++s) {
                if (signals.test(static_cast<std::size_t>(s))) add(signal_name(s));
            }
        }
        return out;
    }
    friend bool operator==(const exit_code_set&, const exit_code_set&) = default;
};

/// Parses a comma-separated set: exit codes (`3`), ranges (`3-5`), `signals` (any death by a
/// signal, or exit code 129-192) and signal names (`SIGKILL`, case-insensitive; also 128+9=137).
[[nodiscard]] ELASTIC_DECL exit_code_set parse_exit_code_set(std::string_view text, std::string_view name);

/// --restart-crash-guard=T[:N]: a group that fails within T of its start is not restarted (with
/// N, only the N-th such start in a row stops the job).
struct crash_guard_spec {
    std::chrono::milliseconds within{10000};
    int in_a_row = 1;

    [[nodiscard]] std::string flag() const {
        return in_a_row == 1 ? fmt::format("--restart-crash-guard={}", duration_flag_text(within))
                             : fmt::format("--restart-crash-guard={}:{}", duration_flag_text(within), in_a_row);
    }
    [[nodiscard]] std::string code() const {
        return in_a_row == 1 ? fmt::format("crash_loop_guard({})", duration_flag_text(within))
                             : fmt::format("crash_loop_guard({}, {})", duration_flag_text(within), in_a_row);
    }
    friend bool operator==(const crash_guard_spec&, const crash_guard_spec&) = default;
};

/// Parses T or T:N (N >= 1).
[[nodiscard]] ELASTIC_DECL crash_guard_spec parse_crash_guard_spec(std::string_view text, std::string_view name);

/// The restart settings of a job, as `--max-restarts` and the `--restart-*` options give them:
/// what make_default_policy builds the default policy from (launch_config::restarts()).
struct restart_settings {
    int max_restarts = 0;                         ///< --max-restarts
    std::optional<backoff_spec> backoff;          ///< --restart-backoff
    std::optional<window_spec> window;            ///< --restart-window
    std::optional<exit_code_set> on_exit;         ///< --restart-on-exit
    std::optional<crash_guard_spec> crash_guard;  ///< --restart-crash-guard
    friend bool operator==(const restart_settings&, const restart_settings&) = default;
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::policy {

[[nodiscard]] ELASTIC_DECL std::string thousandths(long long value) {
    std::string out = fmt::format("{}.{:03}", value / 1000, value % 1000);
    while (out.back() == '0') out.pop_back();
    if (out.back() == '.') out.pop_back();
    return out;
}

[[nodiscard]] ELASTIC_DECL std::string duration_text(std::chrono::nanoseconds d, bool spaced) {
    using namespace std::chrono;
    const char* space = spaced ? " " : "";
    const auto ms = duration_cast<milliseconds>(d).count();
    if (ms < 0) return "-" + duration_text(-d, spaced);
    if (ms == 0 && d.count() != 0)
        return fmt::format("{}{}ms", thousandths(duration_cast<microseconds>(d).count()), space);
    if (ms != 0 && ms % 3'600'000 == 0) return fmt::format("{}{}h", ms / 3'600'000, space);
    if (ms != 0 && ms % 60'000 == 0) return fmt::format("{}{}min", ms / 60'000, space);
    if (ms < 1000 && ms != 0) return fmt::format("{}{}ms", ms, space);
    return fmt::format("{}{}s", thousandths(ms), space);
}

}  // namespace detail::policy
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL std::string duration_flag_text(std::chrono::nanoseconds d) {
    return detail::policy::duration_text(d, false);
}

[[nodiscard]] ELASTIC_DECL std::string duration_words(std::chrono::nanoseconds d) {
    return detail::policy::duration_text(d, true);
}

[[nodiscard]] ELASTIC_DECL std::chrono::milliseconds parse_duration(std::string_view text, std::string_view name,
                                                                    bool allow_zero) {
    const auto word = detail::trim(text);
    std::size_t unit_at = 0;
    while (unit_at < word.size() &&
           (std::isdigit(static_cast<unsigned char>(word[unit_at])) != 0 || word[unit_at] == '.')) {
        ++unit_at;
    }
    const auto number = word.substr(0, unit_at);
    const auto unit = detail::lower(detail::trim(word.substr(unit_at)));
    double value = -1;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value,
                                           std::chars_format::fixed);
    double scale = 0;
    if (unit.empty() || unit == "s") scale = 1;
    else if (unit == "ms") scale = 0.001;
    else if (unit == "m" || unit == "min") scale = 60;
    else if (unit == "h") scale = 3600;
    const double seconds = value * scale;
    // Above 0 is judged after rounding to the millisecond: "0.1ms" would be a zero delay.
    const bool ok = !number.empty() && ec == std::errc{} && end == number.data() + number.size() && scale > 0 &&
                    std::isfinite(seconds) && seconds <= 1e9 && seconds >= 0 &&
                    (allow_zero || std::llround(seconds * 1000.0) > 0);
    if (!ok) {
        throw usage_error{fmt::format("{}: want a duration {}such as 500ms, 1.5s, 10min or 1h (a bare number "
                                      "counts seconds)",
                                      detail::show(name, text), allow_zero ? "" : "above 0 ")};
    }
    return std::chrono::milliseconds{std::llround(seconds * 1000.0)};
}

[[nodiscard]] ELASTIC_DECL backoff_spec parse_backoff_spec(std::string_view text, std::string_view name) {
    const auto parts = detail::split(text, ':');
    if (parts.size() < 2 || parts.size() > 3) {
        throw usage_error{fmt::format("{}: want INITIAL:CAP or INITIAL:CAP:RESET, such as 1s:1min or 1s:1min:10min",
                                      detail::show(name, text))};
    }
    backoff_spec spec;
    spec.initial = parse_duration(parts[0], name);
    spec.cap = parse_duration(parts[1], name);
    if (parts.size() == 3) spec.reset_after = parse_duration(parts[2], name, true);
    if (spec.cap < spec.initial) {
        throw usage_error{fmt::format("{}: the cap ({}) is below the initial delay ({})", detail::show(name, text),
                                      duration_flag_text(spec.cap), duration_flag_text(spec.initial))};
    }
    return spec;
}

[[nodiscard]] ELASTIC_DECL window_spec parse_window_spec(std::string_view text, std::string_view name) {
    const auto parts = detail::split(text, '/');
    if (parts.size() != 2) {
        throw usage_error{
            fmt::format("{}: want N/PERIOD, such as 5/1h (at most 5 restarts in any hour)", detail::show(name, text))};
    }
    const auto n = detail::to_integer(detail::trim(parts[0]));
    if (!n || *n < 1 || *n > 1'000'000) {
        throw usage_error{fmt::format("{}: the number of restarts before '/' must be an integer from 1 to 1000000",
                                      detail::show(name, text))};
    }
    return window_spec{static_cast<int>(*n), parse_duration(parts[1], name)};
}

[[nodiscard]] ELASTIC_DECL exit_code_set parse_exit_code_set(std::string_view text, std::string_view name) {
    exit_code_set set;
    for (const auto raw : detail::split(text, ',')) {
        const auto item = detail::trim(raw);
        const auto word = detail::lower(item);
        if (word == "signals" || word == "signal") {
            set.any_signal = true;
            continue;
        }
        if (word.rfind("sig", 0) == 0) {
            const int found = signal_number(word);
            if (found == 0 || found > 64) {
                throw usage_error{fmt::format("{}: '{}' is not a signal name (such as SIGKILL or SIGSEGV)",
                                              detail::show(name, text), item)};
            }
            set.signals.set(static_cast<std::size_t>(found));
            continue;
        }
        const auto dash = item.find('-', 1);
        const auto first = detail::to_integer(detail::trim(item.substr(0, dash)));
        const auto last = dash == std::string_view::npos ? first
                                                         : detail::to_integer(detail::trim(item.substr(dash + 1)));
        if (!first || !last || *first < 1 || *last > 255 || *first > *last) {
            throw usage_error{fmt::format("{}: '{}' is not an exit code 1-255, a range such as 3-5, 'signals' or "
                                          "a signal name",
                                          detail::show(name, text), item)};
        }
        for (auto c = *first; c <= *last; ++c) set.codes.set(static_cast<std::size_t>(c));
    }
    return set;
}

[[nodiscard]] ELASTIC_DECL crash_guard_spec parse_crash_guard_spec(std::string_view text, std::string_view name) {
    const auto parts = detail::split(text, ':');
    if (parts.size() > 2) {
        throw usage_error{fmt::format("{}: want T or T:N, such as 30s or 30s:3", detail::show(name, text))};
    }
    crash_guard_spec spec;
    spec.within = parse_duration(parts[0], name);
    if (parts.size() == 2) {
        const auto n = detail::to_integer(detail::trim(parts[1]));
        if (!n || *n < 1 || *n > 1'000'000) {
            throw usage_error{
                fmt::format("{}: N after ':' must be an integer from 1 to 1000000", detail::show(name, text))};
        }
        spec.in_a_row = static_cast<int>(*n);
    }
    return spec;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/policy/spec.hpp ----

#include <asio/awaitable.hpp>
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace elastic::inline v0 {

/// torchrun's restart budget: restart the group at once while fewer than `n` restarts have
/// been made in the job, then stop. `--max-restarts` builds it (default 0: never restart).
///
/// It counts with `group_failure::restarts` (the job's count, which the agent keeps) rather
/// than a counter of its own, so a copy of the policy, or one built again after a membership
/// change, answers the same.
class max_restarts : public named_policy {
public:
    /// `n` >= 0 restarts allowed in the job.
    explicit max_restarts(int n) : budget_(n) {
        if (n < 0) {
            throw std::invalid_argument(fmt::format("max_restarts({}): the budget must be 0 or more", n));
        }
    }

    /// The budget.
    [[nodiscard]] int budget() const noexcept { return budget_; }

    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<restart_decision> operator()(const group_failure& failure) const {
        const auto named = cite(fmt::format("max_restarts({})", budget_), fmt::format("--max-restarts={}", budget_));
        if (failure.restarts < budget_) {
            co_return restart_decision::restart_because(fmt::format("restart {} of {} ({})", failure.restarts + 1,
                                                                    budget_, named));
        }
        co_return restart_decision::stop_because(
            budget_ == 0 ? fmt::format("no restarts allowed ({})", named)
                         : fmt::format("the restart budget is spent: {} of {} restarts made ({})", failure.restarts,
                                       budget_, named));
    }

private:
    int budget_;
};

static_assert(restart_policy<max_restarts>);

}  // namespace elastic::inline v0
// ---- end elastic/policy/max_restarts.hpp ----
// ---- begin elastic/policy/clock.hpp ----
// Time for restart policies: the policy_clock concept, steady_policy_clock (steady_clock and an
// asio::steady_timer) and manual_policy_clock (time that moves only when a test advances it).


#include <asio/awaitable.hpp>
#include <asio/error.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/system_error.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <memory>
#include <vector>

namespace elastic::inline v0 {

/*
 * policy_clock: where a restart policy reads the time and how it waits.
 *
 *   std::chrono::steady_clock::time_point now() const;
 *   asio::awaitable<void> sleep(std::chrono::steady_clock::duration) const;
 *
 * - now() is on the steady clock's scale, the scale of group_failure::started / failed.
 * - sleep() completes after the duration (at once for zero or less) on the awaiting coroutine's
 *   executor, and is cancellable like an Asio timer: a cancelled sleep throws
 *   asio::system_error(operation_aborted), so an agent racing the policy against a signal is
 *   never held up by a backoff.
 * - Copies share one time: a policy holds its clock by value.
 */
template <class C>
concept policy_clock = std::copy_constructible<C> && requires(const C& c, std::chrono::steady_clock::duration d) {
    { c.now() } -> std::same_as<std::chrono::steady_clock::time_point>;
    { c.sleep(d) } -> std::same_as<asio::awaitable<void>>;
};

/// The production clock: std::chrono::steady_clock, and an asio::steady_timer to wait.
struct steady_policy_clock {
    [[nodiscard]] std::chrono::steady_clock::time_point now() const noexcept {
        return std::chrono::steady_clock::now();
    }

    /// Static in substance: the timer lives in the coroutine frame, not in the clock.
    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<void> sleep(std::chrono::steady_clock::duration d) const {
        if (d <= std::chrono::steady_clock::duration::zero()) co_return;
        asio::steady_timer timer(co_await asio::this_coro::executor, d);
        co_await timer.async_wait(detail::use_awaitable<Defer>);
    }
};

static_assert(policy_clock<steady_policy_clock>);

/// A clock for tests: now() stands still until advance(); a sleep completes when advance() has
/// moved the time to or past its deadline. Nothing sleeps for real. Copies share the time.
///
/// A pending sleep is an asio::steady_timer set to expire never; advance() cancels the timers
/// whose deadline has come, marking them woken, so the coroutine resumes on its own executor
/// through the ordinary completion path (and a real cancellation, unmarked, still throws).
class manual_policy_clock {
public:
    using time_point = std::chrono::steady_clock::time_point;
    using duration = std::chrono::steady_clock::duration;

    /// Time starts at `start`: by default one day past the steady clock's epoch, so that
    /// `now() - window` never goes below the epoch.
    explicit manual_policy_clock(time_point start = time_point{} + std::chrono::hours(24))
        : state_(std::make_shared<state>()) {
        state_->now = start;
    }

    [[nodiscard]] time_point now() const noexcept { return state_->now; }

    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<void> sleep(duration d) const {
        const auto shared = state_;  // the clock object may go before the sleep ends
        shared->requested.push_back(d);
        if (d <= duration::zero()) co_return;
        asio::steady_timer timer(co_await asio::this_coro::executor, time_point::max());
        sleeper me{shared->now + d, &timer, false};
        shared->sleepers.push_back(&me);
        struct unlist {
            state* s;
            sleeper* me;
            ~unlist() { std::erase(s->sleepers, me); }
        } guard{shared.get(), &me};
        asio::error_code ignored;  // woken or cancelled: `woken` tells which
        co_await timer.async_wait(asio::redirect_error(detail::use_awaitable<Defer>, ignored));
        if (!me.woken) throw asio::system_error(asio::error::operation_aborted);
    }

    /// Moves the time forward by `d` and wakes every sleep whose deadline has come (they resume
    /// when their io_context next runs handlers).
    void advance(duration d) {
        state_->now += d;
        for (auto* s : state_->sleepers) {
            if (!s->woken && s->deadline <= state_->now) {
                s->woken = true;
                s->timer->cancel();
            }
        }
    }

    /// Sleeps begun and not finished.
    [[nodiscard]] std::size_t sleeping() const noexcept { return state_->sleepers.size(); }

    /// The deadline of the earliest pending sleep, or time_point::max() when none.
    [[nodiscard]] time_point next_deadline() const noexcept {
        time_point next = time_point::max();
        for (const auto* s : state_->sleepers) next = std::min(next, s->deadline);
        return next;
    }

    /// Every duration sleep() was called with, in order (zero ones included).
    [[nodiscard]] const std::vector<duration>& sleeps() const noexcept { return state_->requested; }

private:
    struct sleeper {
        time_point deadline;
        asio::steady_timer* timer;
        bool woken;
    };
    struct state {
        time_point now{};
        std::vector<sleeper*> sleepers;
        std::vector<duration> requested;
    };
    std::shared_ptr<state> state_;
};

static_assert(policy_clock<manual_policy_clock>);

}  // namespace elastic::inline v0
// ---- end elastic/policy/clock.hpp ----
// ---- begin elastic/policy/combinators.hpp ----
// Composing restart policies: `a | b` (policy_chain), the planned_restart_policy protocol of the
// built-in models (decide, then wait, then count), optional_policy and any_restart_policy.


#include <asio/awaitable.hpp>

#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace elastic::inline v0 {

/// What a planned policy would answer, before anything is awaited or counted.
struct restart_plan {
    restart_decision decision;
    /// Awaited (through the policy's wait()) before the restart; zero for none.
    std::chrono::steady_clock::duration delay{};
};

/*
 * planned_restart_policy: a restart_policy split in three steps, so that a chain can ask every
 * part before any of them waits or counts.
 *
 *   restart_plan plan(const group_failure&);          // decide; no waiting, no state change
 *   asio::awaitable<void> wait(steady_clock::duration);  // the delay, on the policy's clock
 *   void commit(const group_failure&);                 // the restart is happening: count it
 *
 * Calling the policy alone is plan(), then on restart wait(delay) and commit(): every built-in
 * model (backoff, restart_window, exit_code_policy, crash_loop_guard) is one.
 */
// clang-format off
template <class P>
concept planned_restart_policy =
    restart_policy<P> && requires(P& p, const group_failure& f, std::chrono::steady_clock::duration d) {
        { p.plan(f) } -> std::same_as<restart_plan>;
        { p.wait(d) } -> std::same_as<asio::awaitable<void>>;
        p.commit(f);
    };
// clang-format on

namespace detail::policy {

/// A planned policy called alone: plan, wait, count. A cancelled wait counts nothing.
template <class P>
asio::awaitable<restart_decision> run_planned(P& policy, const group_failure& failure) {
    auto plan = policy.plan(failure);
    if (plan.decision.restart()) {
        if (plan.delay > std::chrono::steady_clock::duration::zero()) {
            if (failure.before_delay) failure.before_delay(plan.decision, plan.delay);
            co_await policy.wait(plan.delay);
        }
        policy.commit(failure);
    }
    co_return std::move(plan.decision);
}

}  // namespace detail::policy

/// `a | b | c`: every part is consulted in order; the first to answer stop decides (its reason,
/// and nothing after it is asked); when all answer restart the delays add up and the reasons are
/// joined with "; ". Planned parts (the built-in models) only plan while the chain asks: their
/// delays are awaited after the last part has said restart (announced first, once, through
/// group_failure::before_delay), then every planned part counts the restart. So a later stop
/// never costs an earlier backoff, and a budget counts only restarts that happen. Any other part
/// is awaited in its turn (it may wait for whatever it likes).
template <class... Parts>
class policy_chain {
    static_assert(sizeof...(Parts) > 0, "a policy_chain needs a part");

public:
    explicit policy_chain(Parts... parts) : parts_(std::move(parts)...) {}
    explicit policy_chain(std::tuple<Parts...> parts) : parts_(std::move(parts)) {}

    asio::awaitable<restart_decision> operator()(const group_failure& failure) {
        progress p;
        auto stop = co_await consult<0>(failure, p);
        if (stop) co_return std::move(*stop);
        auto decision = restart_decision::restart_because(std::move(p.reason));
        std::chrono::steady_clock::duration total{};
        for (const auto d : p.delays) total += d;
        if (total > total.zero() && failure.before_delay) failure.before_delay(decision, total);
        co_await wait_all<0>(p);
        commit_all<0>(failure);
        co_return decision;
    }

    /// The parts, for inspection (a test's, or a launcher's log).
    [[nodiscard]] std::tuple<Parts...>& parts() noexcept { return parts_; }
    [[nodiscard]] const std::tuple<Parts...>& parts() const noexcept { return parts_; }
    [[nodiscard]] std::tuple<Parts...> release() && { return std::move(parts_); }

private:
    struct progress {
        std::array<std::chrono::steady_clock::duration, sizeof...(Parts)> delays{};
        std::string reason;

        void add(const std::string& why) {
            if (why.empty()) return;
            if (!reason.empty()) reason += "; ";
            reason += why;
        }
    };

    template <std::size_t I>
    asio::awaitable<std::optional<restart_decision>> consult(const group_failure& failure, progress& p) {
        if constexpr (I == sizeof...(Parts)) {
            co_return std::nullopt;
        } else {
            auto& part = std::get<I>(parts_);
            if constexpr (planned_restart_policy<std::tuple_element_t<I, std::tuple<Parts...>>>) {
                auto plan = part.plan(failure);
                if (!plan.decision.restart()) co_return std::move(plan.decision);
                p.delays[I] = plan.delay;
                p.add(plan.decision.reason);
            } else {
                // The chain announces the restart, once, with every part's reason: a part is
                // not to announce one of its own (a chain inside an any_restart_policy would).
                // Named: g++ 12 destroys a prvalue argument of a co_awaited call twice.
                const group_failure quiet = unannounced(failure);
                auto decision = co_await part(quiet);
                if (!decision.restart()) co_return std::move(decision);
                p.add(decision.reason);
            }
            co_return co_await consult<I + 1>(failure, p);
        }
    }

    /// `failure` without its before_delay, for a part that is not planned.
    static group_failure unannounced(const group_failure& failure) {
        group_failure copy = failure;
        copy.before_delay = nullptr;
        return copy;
    }

    template <std::size_t I>
    asio::awaitable<void> wait_all(const progress& p) {
        if constexpr (I < sizeof...(Parts)) {
            if constexpr (planned_restart_policy<std::tuple_element_t<I, std::tuple<Parts...>>>) {
                if (p.delays[I] > std::chrono::steady_clock::duration::zero()) {
                    co_await std::get<I>(parts_).wait(p.delays[I]);
                }
            }
            co_await wait_all<I + 1>(p);
        }
        co_return;
    }

    template <std::size_t I>
    void commit_all(const group_failure& failure) {
        if constexpr (I < sizeof...(Parts)) {
            if constexpr (planned_restart_policy<std::tuple_element_t<I, std::tuple<Parts...>>>) {
                std::get<I>(parts_).commit(failure);
            }
            commit_all<I + 1>(failure);
        }
    }

    std::tuple<Parts...> parts_;
};

namespace detail::policy {

template <class T>
struct is_chain : std::false_type {};
template <class... Ps>
struct is_chain<policy_chain<Ps...>> : std::true_type {};

template <class P>
auto parts_of(P&& p) {
    using D = std::remove_cvref_t<P>;
    if constexpr (is_chain<D>::value) {
        if constexpr (std::is_lvalue_reference_v<P>) {
            return p.parts();
        } else {
            return std::move(p).release();
        }
    } else {
        return std::tuple<D>(std::forward<P>(p));
    }
}

template <class... Ps>
policy_chain<Ps...> chain_of_tuple(std::tuple<Ps...>&& parts) {
    return policy_chain<Ps...>(std::move(parts));
}

}  // namespace detail::policy

/// A chain of the given policies, flattened (a chain given as a part contributes its parts).
// clang-format off
template <class... Ps>
    requires(sizeof...(Ps) > 0 && (restart_policy<std::remove_cvref_t<Ps>> && ...))
auto chain(Ps&&... policies) {
    // clang-format on
    return detail::policy::chain_of_tuple(std::tuple_cat(detail::policy::parts_of(std::forward<Ps>(policies))...));
}

/// `a | b`: chain(a, b) (see policy_chain). Found by argument-dependent lookup when either side
/// is an elastic type; for two policies of your own write `elastic::chain(a, b)` or
/// `using elastic::operator|;`.
// clang-format off
template <class A, class B>
    requires restart_policy<std::remove_cvref_t<A>> && restart_policy<std::remove_cvref_t<B>>
auto operator|(A&& a, B&& b) {
    return chain(std::forward<A>(a), std::forward<B>(b));
}
// clang-format on

/// A planned policy that may be absent (a flag not given): absent, it answers restart with no
/// reason, no delay and nothing to count.
// clang-format off
template <class P>
    requires planned_restart_policy<P>
class optional_policy {
    // clang-format on
public:
    optional_policy() = default;
    explicit optional_policy(std::optional<P> policy) : policy_(std::move(policy)) {}

    [[nodiscard]] bool has_value() const noexcept { return policy_.has_value(); }
    [[nodiscard]] P* get() noexcept { return policy_ ? &*policy_ : nullptr; }

    restart_plan plan(const group_failure& failure) {
        if (!policy_) return {restart_decision::restart_because({}), {}};
        return policy_->plan(failure);
    }
    asio::awaitable<void> wait(std::chrono::steady_clock::duration d) {
        if (policy_) co_await policy_->wait(d);
    }
    void commit(const group_failure& failure) {
        if (policy_) policy_->commit(failure);
    }
    asio::awaitable<restart_decision> operator()(const group_failure& failure) {
        return detail::policy::run_planned(*this, failure);
    }

private:
    std::optional<P> policy_;
};

/// Any restart policy behind one type (one allocation), for a policy chosen at run time.
/// Calls forward to the held policy, whose awaitable it returns as is.
class any_restart_policy {
public:
    // clang-format off
    template <class P>
        // The same_as test first: it short-cuts the check of restart_policy<any_restart_policy>,
        // which would ask for this very constructor again (clang recurses).
        requires(!std::same_as<std::remove_cvref_t<P>, any_restart_policy>) && restart_policy<std::remove_cvref_t<P>>
    any_restart_policy(P&& policy)  // NOLINT(google-explicit-constructor): a policy is one
        : impl_(std::make_unique<model<std::remove_cvref_t<P>>>(std::forward<P>(policy))) {}
    // clang-format on

    asio::awaitable<restart_decision> operator()(const group_failure& failure) { return impl_->call(failure); }

private:
    struct base {
        virtual ~base() = default;
        virtual asio::awaitable<restart_decision> call(const group_failure& failure) = 0;
    };
    template <class P>
    struct model final : base {
        explicit model(P p) : policy(std::move(p)) {}
        asio::awaitable<restart_decision> call(const group_failure& failure) override { return policy(failure); }
        P policy;
    };
    std::unique_ptr<base> impl_;
};

static_assert(restart_policy<any_restart_policy>);

}  // namespace elastic::inline v0
// ---- end elastic/policy/combinators.hpp ----
// ---- begin elastic/policy/backoff.hpp ----
// backoff: wait before each restart, exponentially longer for failures in a row, capped, with
// jitter, and starting over after a healthy period (--restart-backoff=INITIAL:CAP[:RESET]).


#include <asio/awaitable.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace elastic::inline v0 {

/// A source of numbers uniform in [0, 1) for jitter; tests pass a fixed one.
using uniform_source = std::function<double()>;

/// A uniform_source over std::mt19937_64 seeded from std::random_device.
[[nodiscard]] ELASTIC_DECL uniform_source random_uniform_source();

/// Exponential backoff. Before the k-th restart in a row (k = 0, 1, ...) it waits
///     min(cap, initial * factor^k) * (1 - jitter * u),   u uniform in [0, 1),
/// so jitter only shortens a delay and the cap holds. A failure after the group ran healthy for
/// `reset_after` or longer starts over at k = 0. It always answers restart: pair it with a
/// budget (`max_restarts(5) | backoff(1s, 1min)`).
template <policy_clock Clock = steady_policy_clock>
class basic_backoff : public named_policy {
public:
    explicit basic_backoff(backoff_spec spec, Clock clock = Clock{}, uniform_source uniform = random_uniform_source())
        : spec_(spec), clock_(std::move(clock)), uniform_(std::move(uniform)) {
        if (spec_.initial <= spec_.initial.zero() || spec_.cap < spec_.initial) {
            throw std::invalid_argument(fmt::format("backoff({}, {}): want 0 < initial <= cap",
                                                    duration_flag_text(spec_.initial), duration_flag_text(spec_.cap)));
        }
        if (!(spec_.factor >= 1.0) || !std::isfinite(spec_.factor) || !(spec_.jitter >= 0.0 && spec_.jitter < 1.0) ||
            spec_.reset_after < spec_.reset_after.zero()) {
            throw std::invalid_argument(
                fmt::format("backoff: want factor >= 1 (got {}), 0 <= jitter < 1 (got {}), reset_after >= 0",
                            spec_.factor, spec_.jitter));
        }
        if (!uniform_) uniform_ = random_uniform_source();
    }
    /// backoff(1s, 1min): the default factor 2, jitter 10 % and reset after 10 min.
    basic_backoff(std::chrono::milliseconds initial, std::chrono::milliseconds cap, Clock clock = Clock{})
        : basic_backoff(backoff_spec{initial, cap}, std::move(clock)) {}

    [[nodiscard]] const backoff_spec& spec() const noexcept { return spec_; }
    /// Restarts counted in the current run of failures (0 after a reset).
    [[nodiscard]] int in_a_row() const noexcept { return in_a_row_; }

    restart_plan plan(const group_failure& failure) {
        const bool reset = failure.healthy_for() >= spec_.reset_after;
        const int k = reset ? 0 : in_a_row_;
        const double initial_s = std::chrono::duration<double>(spec_.initial).count();
        const double cap_s = std::chrono::duration<double>(spec_.cap).count();
        // pow can overflow to inf for large k: min() with the cap handles it.
        const double base = std::min(cap_s, initial_s * std::pow(spec_.factor, k));
        const double u = std::clamp(uniform_(), 0.0, 1.0);
        const double seconds = base * (1.0 - spec_.jitter * u);
        const auto delay = std::chrono::round<std::chrono::milliseconds>(std::chrono::duration<double>(seconds));
        pending_ = k + 1;
        std::string why = fmt::format("after {} backoff (failure {} in a row", duration_words(delay), k + 1);
        if (reset && in_a_row_ > 0) why += fmt::format(", after {} healthy", duration_words(failure.healthy_for()));
        why += fmt::format("; {})", named());
        return {restart_decision::restart_because(std::move(why)), delay};
    }
    asio::awaitable<void> wait(std::chrono::steady_clock::duration d) { return clock_.sleep(d); }
    void commit(const group_failure&) { in_a_row_ = pending_; }

    asio::awaitable<restart_decision> operator()(const group_failure& failure) {
        return detail::policy::run_planned(*this, failure);
    }

private:
    /// How reasons cite this policy (named_policy).
    [[nodiscard]] std::string named() const { return this->cite(spec_.code(), spec_.flag()); }

    backoff_spec spec_;
    Clock clock_;
    uniform_source uniform_;
    int in_a_row_ = 0;
    int pending_ = 0;
};

/// The production backoff (steady clock, random jitter).
using backoff = basic_backoff<>;

static_assert(planned_restart_policy<backoff>);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL uniform_source random_uniform_source() {
    return [engine = std::mt19937_64{std::random_device{}()}]() mutable {
        return std::uniform_real_distribution<double>(0.0, 1.0)(engine);
    };
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/policy/backoff.hpp ----
// ---- begin elastic/policy/window.hpp ----
// restart_window: at most N restarts within any period, a sliding window
// (--restart-window=N/PERIOD).


#include <asio/awaitable.hpp>
#include <fmt/format.h>

#include <chrono>
#include <deque>
#include <stdexcept>
#include <utility>

namespace elastic::inline v0 {

/// A budget per time window: restart while fewer than N restarts were made in the last PERIOD
/// (as the clock counts, restarts being timed when they happen, after any backoff); stop once N
/// were. Unlike max_restarts, a job that fails rarely runs for ever.
template <policy_clock Clock = steady_policy_clock>
class basic_restart_window : public named_policy {
public:
    explicit basic_restart_window(window_spec spec, Clock clock = Clock{}) : spec_(spec), clock_(std::move(clock)) {
        if (spec_.restarts < 1 || spec_.period <= spec_.period.zero()) {
            throw std::invalid_argument(
                fmt::format("restart_window({}, {}): want at least 1 restart and a period above 0", spec_.restarts,
                            duration_flag_text(spec_.period)));
        }
    }
    /// restart_window(5, 1h).
    basic_restart_window(int restarts, std::chrono::milliseconds period, Clock clock = Clock{})
        : basic_restart_window(window_spec{restarts, period}, std::move(clock)) {}

    [[nodiscard]] const window_spec& spec() const noexcept { return spec_; }
    /// Restarts made within the last period, as of now.
    [[nodiscard]] int recent() {
        forget_old();
        return static_cast<int>(times_.size());
    }

    restart_plan plan(const group_failure&) {
        const int made = recent();
        if (made >= spec_.restarts) {
            const auto since = clock_.now() - times_.front();
            return {restart_decision::stop_because(fmt::format(
                        "the restart window is spent: {} restart{} within the last {}, the first {} ago ({})", made,
                        made == 1 ? "" : "s", duration_words(spec_.period), duration_words(since), named())),
                    {}};
        }
        return {restart_decision::restart_because(fmt::format("restart {} of {} within {} ({})", made + 1,
                                                              spec_.restarts, duration_words(spec_.period), named())),
                {}};
    }
    asio::awaitable<void> wait(std::chrono::steady_clock::duration d) { return clock_.sleep(d); }
    void commit(const group_failure&) { times_.push_back(clock_.now()); }

    asio::awaitable<restart_decision> operator()(const group_failure& failure) {
        return detail::policy::run_planned(*this, failure);
    }

private:
    /// How reasons cite this policy (named_policy).
    [[nodiscard]] std::string named() const { return this->cite(spec_.code(), spec_.flag()); }

    void forget_old() {
        const auto now = clock_.now();
        while (!times_.empty() && now - times_.front() >= spec_.period) times_.pop_front();
    }

    window_spec spec_;
    Clock clock_;
    std::deque<std::chrono::steady_clock::time_point> times_;
};

/// The production window (steady clock).
using restart_window = basic_restart_window<>;

static_assert(planned_restart_policy<restart_window>);

}  // namespace elastic::inline v0
// ---- end elastic/policy/window.hpp ----
// ---- begin elastic/policy/exit_codes.hpp ----
// Exit-code classes: restart only when the root cause ended in a retryable way (a named set of
// exit codes, signals), stop at once on anything else (--restart-on-exit=SET) — or the reverse.


#include <asio/awaitable.hpp>
#include <fmt/format.h>

#include <chrono>
#include <string>

namespace elastic::inline v0 {

/// Judges the root cause (the first worker to fail, by time: the others usually fail because of
/// it) against a set of endings. `restart_on_exit(set)`: restart only when it is in the set;
/// `stop_on_exit(set)`: stop when it is. With no worker failed on its own, it restarts.
class exit_code_policy : public named_policy {
public:
    enum class mode { restart_listed, stop_listed };

    exit_code_policy(exit_code_set set, mode m) : set_(std::move(set)), mode_(m) {}

    [[nodiscard]] const exit_code_set& set() const noexcept { return set_; }
    [[nodiscard]] mode which() const noexcept { return mode_; }
    /// The C++ form (`restart_on_exit("1,3-5,signals")`).
    [[nodiscard]] std::string code() const {
        return fmt::format("{}(\"{}\")", mode_ == mode::restart_listed ? "restart_on_exit" : "stop_on_exit",
                           set_.to_string());
    }
    /// The command-line form ("--restart-on-exit=1,3-5,signals"); stop_on_exit has no option
    /// and shows its C++ form.
    [[nodiscard]] std::string flag() const {
        return mode_ == mode::restart_listed ? fmt::format("--restart-on-exit={}", set_.to_string()) : code();
    }

    restart_plan plan(const group_failure& failure) {
        const auto* root = failure.root_cause();
        if (root == nullptr) return {restart_decision::restart_because("no worker failed on its own"), {}};
        const auto& status = root->status;
        const std::string ending = fmt::format("local_rank {} {}", root->local_rank, status.describe());
        const bool listed = set_.contains(status);
        if (mode_ == mode::restart_listed) {
            if (listed)
                return {restart_decision::restart_because(fmt::format("{}: retryable ({})", ending, named())), {}};
            return {restart_decision::stop_because(fmt::format("{}: not retryable, stopping at once ({})", ending,
                                                               named())),
                    {}};
        }
        if (listed)
            return {restart_decision::stop_because(fmt::format("{}: fatal, stopping at once ({})", ending, named())),
                    {}};
        return {restart_decision::restart_because(fmt::format("{}: not fatal ({})", ending, named())), {}};
    }
    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<void> wait(std::chrono::steady_clock::duration) {
        co_return;
    }
    void commit(const group_failure&) {}

    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<restart_decision> operator()(const group_failure& failure) {
        return detail::policy::run_planned(*this, failure);
    }

private:
    /// How reasons cite this policy (named_policy).
    [[nodiscard]] std::string named() const { return cite(code(), flag()); }

    exit_code_set set_;
    mode mode_;
};

static_assert(planned_restart_policy<exit_code_policy>);

/// Restart only when the root cause's ending is in `set`; stop at once otherwise.
[[nodiscard]] ELASTIC_DECL exit_code_policy restart_on_exit(exit_code_set set);
/// restart_on_exit(parse_exit_code_set(text)): `restart_on_exit("75,signals")`.
[[nodiscard]] ELASTIC_DECL exit_code_policy restart_on_exit(std::string_view text);
/// Stop at once when the root cause's ending is in `set`; otherwise restart.
[[nodiscard]] ELASTIC_DECL exit_code_policy stop_on_exit(exit_code_set set);
[[nodiscard]] ELASTIC_DECL exit_code_policy stop_on_exit(std::string_view text);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL exit_code_policy restart_on_exit(exit_code_set set) {
    return {std::move(set), exit_code_policy::mode::restart_listed};
}

[[nodiscard]] ELASTIC_DECL exit_code_policy restart_on_exit(std::string_view text) {
    return restart_on_exit(parse_exit_code_set(text, "restart_on_exit"));
}

[[nodiscard]] ELASTIC_DECL exit_code_policy stop_on_exit(exit_code_set set) {
    return {std::move(set), exit_code_policy::mode::stop_listed};
}

[[nodiscard]] ELASTIC_DECL exit_code_policy stop_on_exit(std::string_view text) {
    return stop_on_exit(parse_exit_code_set(text, "stop_on_exit"));
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/policy/exit_codes.hpp ----
// ---- begin elastic/policy/crash_loop.hpp ----
// crash_loop_guard: a group that fails within T of its start is not restarted — a start-up crash
// loop is a bug or a bad configuration, not bad luck (--restart-crash-guard=T[:N]).


#include <asio/awaitable.hpp>
#include <fmt/format.h>

#include <chrono>
#include <stdexcept>
#include <string>

namespace elastic::inline v0 {

/// Stops the job when the group failed within `within` of its start (group_failure::healthy_for,
/// every attempt's own start), or, with `in_a_row` = N > 1, when the N-th attempt in a row did.
/// A group that ran longer restarts and clears the count.
class crash_loop_guard : public named_policy {
public:
    explicit crash_loop_guard(crash_guard_spec spec) : spec_(spec) {
        if (spec_.within <= spec_.within.zero() || spec_.in_a_row < 1) {
            throw std::invalid_argument(fmt::format("crash_loop_guard({}, {}): want a time above 0 and N >= 1",
                                                    duration_flag_text(spec_.within), spec_.in_a_row));
        }
    }
    /// crash_loop_guard(30s) or crash_loop_guard(30s, 3).
    explicit crash_loop_guard(std::chrono::milliseconds within, int in_a_row = 1)
        : crash_loop_guard(crash_guard_spec{within, in_a_row}) {}

    [[nodiscard]] const crash_guard_spec& spec() const noexcept { return spec_; }

    restart_plan plan(const group_failure& failure) {
        const auto ran = failure.healthy_for();
        const bool early = ran < spec_.within;
        pending_ = early ? early_ + 1 : 0;
        if (!early) {
            return {restart_decision::restart_because(fmt::format("ran {}, past the crash-loop guard of {}",
                                                                  duration_words(ran), duration_words(spec_.within))),
                    {}};
        }
        if (pending_ >= spec_.in_a_row) {
            return {restart_decision::stop_because(
                        spec_.in_a_row == 1
                            ? fmt::format("the group failed {} after its start, within the crash-loop guard of {}: "
                                          "not retried ({})",
                                          duration_words(ran), duration_words(spec_.within), named())
                            : fmt::format("the group failed {} after its start: {} starts in a row failed within "
                                          "the crash-loop guard of {}: not retried ({})",
                                          duration_words(ran), pending_, duration_words(spec_.within), named())),
                    {}};
        }
        return {restart_decision::restart_because(fmt::format("failed {} after its start: {} of {} allowed in a row "
                                                              "within {} ({})",
                                                              duration_words(ran), pending_, spec_.in_a_row - 1,
                                                              duration_words(spec_.within), named())),
                {}};
    }
    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<void> wait(std::chrono::steady_clock::duration) {
        co_return;
    }
    void commit(const group_failure&) { early_ = pending_; }

    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<restart_decision> operator()(const group_failure& failure) {
        return detail::policy::run_planned(*this, failure);
    }

private:
    /// How reasons cite this policy (named_policy).
    [[nodiscard]] std::string named() const { return cite(spec_.code(), spec_.flag()); }

    crash_guard_spec spec_;
    int early_ = 0;
    int pending_ = 0;
};

static_assert(planned_restart_policy<crash_loop_guard>);

}  // namespace elastic::inline v0
// ---- end elastic/policy/crash_loop.hpp ----
// ---- begin elastic/policy/default_policy.hpp ----
// make_default_policy(settings): the restart policy elasticrun runs under, built from
// --max-restarts and the --restart-* options (restart_settings; launch_config::restarts()).


#include <optional>
#include <utility>

namespace elastic::inline v0 {

/// The default policy, in this order (the first to say stop wins; docs/policies.md):
///
///     restart_on_exit(--restart-on-exit) | crash_loop_guard(--restart-crash-guard)
///       | max_restarts(--max-restarts) | restart_window(--restart-window) | backoff(--restart-backoff)
///
/// each part present only when its option is given, except max_restarts: always there, unless
/// --restart-window is given with --max-restarts left at 0, where the window is the budget (a
/// window with no restart allowed at all would mean nothing). With none of the --restart-*
/// options it answers exactly as max_restarts(--max-restarts). `clock` and `uniform` are for
/// tests (the window's and the backoff's time, the jitter).
template <policy_clock Clock = steady_policy_clock>
[[nodiscard]] any_restart_policy make_default_policy(const restart_settings& settings, Clock clock = Clock{},
                                                     uniform_source uniform = random_uniform_source()) {
    // Built from the command line: every part's reasons cite its option.
    const auto by_option = [](auto policy) {
        policy.name_by(policy_naming::command_line);
        return policy;
    };
    optional_policy<exit_code_policy> exits;
    if (settings.on_exit) exits = optional_policy<exit_code_policy>(by_option(restart_on_exit(*settings.on_exit)));
    optional_policy<crash_loop_guard> guard;
    if (settings.crash_guard) {
        guard = optional_policy<crash_loop_guard>(by_option(crash_loop_guard(*settings.crash_guard)));
    }
    optional_policy<basic_backoff<Clock>> delay;
    if (settings.backoff) {
        delay = optional_policy<basic_backoff<Clock>>(by_option(basic_backoff<Clock>(*settings.backoff, clock,
                                                                                     std::move(uniform))));
    }
    const auto budget = by_option(max_restarts(settings.max_restarts));
    if (settings.window) {
        auto window = by_option(basic_restart_window<Clock>(*settings.window, clock));
        if (settings.max_restarts == 0) {
            return chain(std::move(exits), std::move(guard), std::move(window), std::move(delay));
        }
        return chain(std::move(exits), std::move(guard), budget, std::move(window), std::move(delay));
    }
    return chain(std::move(exits), std::move(guard), budget, std::move(delay));
}

}  // namespace elastic::inline v0
// ---- end elastic/policy/default_policy.hpp ----
// ---- end elastic/policy.hpp ----
// ---- begin elastic/agent.hpp ----
// The agent layer: one node's agent (local_agent), the worker environment contract, the
// workers' output (log tree, relays, prefixes), and the agent's log.

// ---- begin elastic/agent/agent_log.hpp ----
// agent_log: the agent's own messages, one format with a level and a time (torchrun's newest
// layout), filtered by LOGLEVEL.

// ---- begin elastic/agent/output.hpp ----
// The agent's copies of a worker's streams: read from a pipe as chunks arrive, fed to the report's
// stderr_tail, written byte for byte to a log file, and to the console one whole line at a time,
// each line after the rank's prefix when asked.


#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <poll.h>
#include <unistd.h>

namespace elastic::inline v0 {

namespace detail::agent {

/// What write_all could not write: the bytes left and the errno that stopped it (0 and 0: all
/// of it written).
struct write_shortfall {
    std::size_t unwritten = 0;
    int error = 0;
};

/// Writes all of `text` to `fd`, retrying short writes and EINTR, and waiting (poll) when the
/// descriptor is non-blocking and full, so nothing is lost; stops at any other error and says
/// what was left (a closed terminal must not stop the supervision of the workers, and a full
/// disk is the caller's to report).
inline write_shortfall write_all(int fd, std::string_view text) noexcept {
    while (!text.empty()) {
        const ssize_t n = ::write(fd, text.data(), text.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                pollfd p{fd, POLLOUT, 0};
                if (::poll(&p, 1, -1) < 0 && errno != EINTR) return {text.size(), errno};
                continue;
            }
            return {text.size(), errno};
        }
        text.remove_prefix(static_cast<std::size_t>(n));
    }
    return {};
}

}  // namespace detail::agent

/// The writes to one log file: what could not be written, and why (docs/logs.md, "When a log
/// file cannot be written"). The relay goes on writing after a failure (space may come back) and
/// counts each byte it could not write.
struct log_file_writes {
    std::string name;              ///< for messages: "local_rank 1's stdout log file /path"
    std::uint64_t lost_bytes = 0;  ///< bytes of the stream that are not in the file
    int first_error = 0;           ///< errno of the first failed write; 0: none failed
    std::function<void(const log_file_writes&)> first_failure;  ///< called once, at the first

    void lost(const detail::agent::write_shortfall& w) {
        if (w.unwritten == 0) return;
        lost_bytes += w.unwritten;
        if (first_error != 0) return;
        first_error = w.error != 0 ? w.error : EIO;
        if (first_failure) first_failure(*this);
    }
};

/// Line-buffered copy of one stream to a shared descriptor (the agent's stdout or stderr;
/// docs/logs.md, "The console"). Every complete line — ended by `\n`, `\r\n`, or a lone `\r`
/// (a progress bar redrawing itself) — is written after `prefix` (may be empty), and all the
/// complete lines of a chunk go out in one write(2). A partial line waits for its end; a line
/// longer than `max_line_bytes` is cut into pieces of that size, each ended with `\n`; at the
/// end of the stream a partial last line is written, ended with `\n`. The agent is the only writer
/// of every copied stream, so lines of different workers never interleave inside a line.
class line_relay {
public:
    /// 64 KiB: any line a person reads fits whole; a megabyte without a newline is cut.
    static constexpr std::size_t default_max_line_bytes = 64 * 1024;

    explicit line_relay(int out_fd, std::string prefix = {}, std::size_t max_line_bytes = default_max_line_bytes)
        : out_fd_(out_fd), prefix_(std::move(prefix)), max_line_bytes_(max_line_bytes == 0 ? 1 : max_line_bytes) {}

    /// Copy only the lines (or pieces of a cut line) that contain one of `filters`; none: every
    /// line (the default).
    void only_lines_with(std::vector<std::string> filters) { filters_ = std::move(filters); }
    /// Tell `writes` of every byte the descriptor did not take (a log file's; the console's are
    /// not counted). Must outlive the relay.
    void report_to(log_file_writes* writes) noexcept { writes_ = writes; }

    /// The next chunk of the stream.
    void feed(std::string_view chunk) {
        pending_.append(chunk);
        std::size_t start = 0;
        for (;;) {
            const auto at = pending_.find_first_of("\n\r", start);
            if (at == std::string::npos) break;
            std::size_t end = at + 1;
            if (pending_[at] == '\r') {
                if (end == pending_.size()) break;  // "\r\n" split across chunks: wait for the next byte
                if (pending_[end] == '\n') ++end;
            }
            add(std::string_view(pending_).substr(start, end - start), {});
            start = end;
        }
        while (pending_.size() - start >= max_line_bytes_) {
            add(std::string_view(pending_).substr(start, max_line_bytes_), "\n");
            start += max_line_bytes_;
        }
        pending_.erase(0, start);
        write_out();
    }

    /// Writes what is left (the stream ended mid-line), ended with `\n`.
    void flush() {
        if (pending_.empty()) return;
        add(pending_, "\n");
        pending_.clear();
        write_out();
    }

    [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }

private:
    /// One line (with its end, or `end` after it) into the pending write, if it passes the filters.
    void add(std::string_view line, std::string_view end) {
        if (!filters_.empty() && std::none_of(filters_.begin(), filters_.end(), [&](const std::string& f) {
                return line.find(f) != std::string_view::npos;
            })) {
            return;
        }
        out_ += prefix_;
        out_ += line;
        out_ += end;
    }

    void write_out() {
        if (out_.empty()) return;
        const auto shortfall = detail::agent::write_all(out_fd_, out_);
        if (writes_ != nullptr) writes_->lost(shortfall);
        out_.clear();
    }

    int out_fd_;
    std::string prefix_;
    std::size_t max_line_bytes_;
    std::vector<std::string> filters_;
    log_file_writes* writes_ = nullptr;
    std::string pending_;
    std::string out_;
};

/// Where the bytes of one worker stream are copied (any subset).
struct stream_copies {
    stderr_tail* tail = nullptr;             ///< fed every byte: the failure report's tail (stderr only)
    int file_fd = -1;                        ///< every byte as written: the stream's log file
    log_file_writes* file_writes = nullptr;  ///< told of every byte the file did not take
    int console_fd = -1;                     ///< whole lines after `prefix`: the agent's stdout or stderr
    std::string prefix;                      ///< the rank's console prefix; empty for a raw copy
    detail::task_latch* progress = nullptr;  ///< told of every chunk (detail::task_latch::progressed)
    /// The lines that contain one of `filters`, after `filtered_prefix`: the attempt's
    /// filtered_stdout.log or filtered_stderr.log, shared by the ranks (-1: no copy).
    int filtered_fd = -1;
    std::vector<std::string> filters;
    std::string filtered_prefix;
    log_file_writes* filtered_writes = nullptr;  ///< told of every byte that file did not take
};

/// Reads `pipe` until end of file (or until it is closed or the read is cancelled) and copies
/// every chunk as `copies` says. Always has a read pending, so a worker never blocks on a full
/// pipe while the agent is idle; writes to the file and the console are plain blocking writes,
/// so a slow console slows the worker (its pipe fills) and nothing is dropped.
template <class Defer = void>
asio::awaitable<void> relay_stream(asio::posix::stream_descriptor& pipe, stream_copies copies) {
    std::unique_ptr<line_relay> console;
    if (copies.console_fd >= 0) console = std::make_unique<line_relay>(copies.console_fd, std::move(copies.prefix));
    std::unique_ptr<line_relay> filtered;
    if (copies.filtered_fd >= 0 && !copies.filters.empty()) {
        filtered = std::make_unique<line_relay>(copies.filtered_fd, std::move(copies.filtered_prefix));
        filtered->only_lines_with(std::move(copies.filters));
        filtered->report_to(copies.filtered_writes);
    }
    // 64 KiB: a full pipe's worth in one read.
    auto buffer = std::make_unique<char[]>(65536);
    for (;;) {
        const auto [ec, n] = co_await pipe.async_read_some(asio::buffer(buffer.get(), 65536),
                                                           detail::as_tuple_awaitable<Defer>);
        if (n > 0) {
            const std::string_view chunk(buffer.get(), n);
            if (copies.tail != nullptr) copies.tail->feed(chunk);
            if (copies.file_fd >= 0) {
                const auto shortfall = detail::agent::write_all(copies.file_fd, chunk);
                if (copies.file_writes != nullptr) copies.file_writes->lost(shortfall);
            }
            if (console) console->feed(chunk);
            if (filtered) filtered->feed(chunk);
            if (copies.progress != nullptr) copies.progress->progressed();
        }
        if (ec) break;
    }
    if (console) console->flush();
    if (filtered) filtered->flush();
}

/// The stderr relay of before the log tree: `tail` fed, whole lines copied raw to `out_fd` (-1:
/// no copy).
template <class Defer = void>
asio::awaitable<void> relay_stream(asio::posix::stream_descriptor& pipe, stderr_tail& tail, int out_fd) {
    stream_copies copies;
    copies.tail = &tail;
    copies.console_fd = out_fd;
    co_await relay_stream(pipe, std::move(copies));
}

}  // namespace elastic::inline v0
// ---- end elastic/agent/output.hpp ----
// ---- begin elastic/agent/spec.hpp ----
// What the agent takes: worker_spec (the workers of one node: program, count, role, how they
// are stopped, where their output goes) and agent_options (the agent's own log level and event
// log). The launch layer makes both from the command line (launch_config::workers(),
// launch_config::agent()); a custom launcher may fill them itself.

// ---- begin elastic/agent/program.hpp ----
// What each worker runs: the program (executable, Python script or module), its resolution on
// PATH as execvp does, the command line, and torchrun's `${local_rank}` substitution.


#include <fmt/format.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

namespace elastic::inline v0 {

/// How the program is run.
enum class program_kind {
    automatic,      ///< a `.py` file runs as a Python script, anything else as an executable
    executable,     ///< run directly (`--no-python`): `program args...`
    python_script,  ///< `$PYTHON_EXEC -u script args...` (also `--run-path`)
    python_module,  ///< `$PYTHON_EXEC -u -m module args...` (`-m` / `--module`)
};

/// The program each worker runs, as a custom launcher fills it in.
struct worker_program {
    program_kind kind = program_kind::automatic;
    std::string target;              ///< executable (path or name on PATH), script path, or module name
    std::vector<std::string> args;   ///< passed untouched, except `${local_rank}` (see substitute_local_rank)
    std::string python = "python3";  ///< interpreter for scripts and modules (`PYTHON_EXEC`; path or name on PATH)
};

/// A program resolved to something execv can run.
struct worker_command {
    program_kind kind = program_kind::executable;  ///< never automatic
    std::string path;                              ///< the file to execv: the executable or the interpreter, as found
    std::vector<std::string> argv;                 ///< argv[0] as the user wrote it, then the arguments

    /// argv for one worker: `${local_rank}` substituted in every argument after argv[0].
    [[nodiscard]] std::vector<std::string> argv_for(int local_rank) const;
};

/// torchrun's `${local_rank}` macro in one argument, with the semantics of Python's
/// `string.Template(arg).safe_substitute(local_rank=N)` that torchrun uses: `${local_rank}` and
/// `$local_rank` (not followed by an identifier character) become N, `$$` becomes `$`, anything
/// else (other names, `${LOCAL_RANK}`, a lone `$`) is left as it is.
[[nodiscard]] ELASTIC_DECL std::string substitute_local_rank(std::string_view arg, int local_rank);

/// Finds an executable as execvp(3) would: a name with a `/` is taken as it is; otherwise each
/// directory of `PATH` from `env` is tried in order (an empty entry is the current directory; no
/// `PATH` means glibc's default `/bin:/usr/bin`). `role` names the thing in errors ("program",
/// "PYTHON_EXEC"). Throws usage_error if it is missing, a directory, or not executable.
[[nodiscard]] ELASTIC_DECL std::string find_executable(std::string_view name, const environment& env,
                                                       std::string_view role);

/// The kind a program runs as: `automatic` becomes python_script for a `.py` target, else executable.
[[nodiscard]] ELASTIC_DECL program_kind effective_kind(const worker_program& program);

namespace detail::agent {

[[nodiscard]] ELASTIC_DECL bool valid_module_name(std::string_view name);

}  // namespace detail::agent

/// Resolves a program to the command the workers run, checking on the way that it can run: the
/// executable (or the interpreter) exists and is executable, a script exists and is readable, a
/// module name is a dotted Python name. Throws usage_error naming what is wrong.
[[nodiscard]] ELASTIC_DECL worker_command resolve_program(const worker_program& program, const environment& env);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL std::string substitute_local_rank(std::string_view arg, int local_rank) {
    const auto id_start = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_'; };
    const auto id_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; };
    const auto value = fmt::format("{}", local_rank);
    std::string out;
    out.reserve(arg.size());
    std::size_t i = 0;
    while (i < arg.size()) {
        if (arg[i] != '$' || i + 1 == arg.size()) {
            out += arg[i++];
            continue;
        }
        const char next = arg[i + 1];
        if (next == '$') {
            out += '$';
            i += 2;
        } else if (id_start(next)) {
            auto end = i + 1;
            while (end < arg.size() && id_char(arg[end])) {
                ++end;
            }
            const auto name = arg.substr(i + 1, end - i - 1);
            out += name == "local_rank" ? std::string_view{value} : arg.substr(i, end - i);
            i = end;
        } else if (next == '{' && i + 2 < arg.size() && id_start(arg[i + 2])) {
            auto end = i + 2;
            while (end < arg.size() && id_char(arg[end])) {
                ++end;
            }
            if (end < arg.size() && arg[end] == '}') {
                const auto name = arg.substr(i + 2, end - i - 2);
                out += name == "local_rank" ? std::string_view{value} : arg.substr(i, end + 1 - i);
                i = end + 1;
            } else {
                out += '$';
                ++i;
            }
        } else {
            out += '$';
            ++i;
        }
    }
    return out;
}

ELASTIC_DECL std::vector<std::string> worker_command::argv_for(int local_rank) const {
    std::vector<std::string> out;
    out.reserve(argv.size());
    for (std::size_t i = 0; i < argv.size(); ++i) {
        out.push_back(i == 0 ? argv[i] : substitute_local_rank(argv[i], local_rank));
    }
    return out;
}

[[nodiscard]] ELASTIC_DECL std::string find_executable(std::string_view name, const environment& env,
                                                       std::string_view role) {
    if (name.empty()) {
        throw usage_error{fmt::format("{}: the name is empty", role)};
    }
    const auto describe = [&](detail::file_check check, std::string_view path) {
        switch (check) {
            case detail::file_check::missing: return fmt::format("{} {} does not exist", role, path);
            case detail::file_check::directory: return fmt::format("{} {} is a directory, not a program", role, path);
            default:
                return fmt::format("{} {} is not executable (chmod +x it, or run a script through its interpreter)",
                                   role, path);
        }
    };
    if (name.find('/') != std::string_view::npos) {
        const std::string path{name};
        const auto check = detail::check_file(path, X_OK);
        if (check != detail::file_check::ok) {
            throw usage_error{describe(check, path)};
        }
        return path;
    }
    const auto* path_variable = detail::find_variable(env, "PATH");
    const std::string search = path_variable != nullptr ? *path_variable : std::string(detail::default_search_path);
    auto [found, first_not_executable] = detail::search_path(name, search);
    if (!found.empty()) return found;
    if (!first_not_executable.empty()) {
        throw usage_error{describe(detail::file_check::not_executable, first_not_executable)};
    }
    throw usage_error{fmt::format("{} {} not found on PATH ({})", role, name, search)};
}

[[nodiscard]] ELASTIC_DECL program_kind effective_kind(const worker_program& program) {
    if (program.kind != program_kind::automatic) {
        return program.kind;
    }
    const std::string_view target = program.target;
    return target.size() > 3 && target.substr(target.size() - 3) == ".py" ? program_kind::python_script
                                                                          : program_kind::executable;
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::agent {

[[nodiscard]] ELASTIC_DECL bool valid_module_name(std::string_view name) {
    for (const auto part : detail::split(name, '.')) {
        if (part.empty() || std::isdigit(static_cast<unsigned char>(part.front())) != 0 ||
            !std::all_of(part.begin(), part.end(),
                         [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; })) {
            return false;
        }
    }
    return true;
}

}  // namespace detail::agent
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL worker_command resolve_program(const worker_program& program, const environment& env) {
    worker_command command;
    command.kind = effective_kind(program);
    if (program.target.empty()) {
        throw usage_error{"no program to run (usage: elasticrun [options] program [args...])"};
    }
    switch (command.kind) {
        case program_kind::automatic:
        case program_kind::executable:
            command.kind = program_kind::executable;
            command.path = find_executable(program.target, env, "program");
            command.argv.push_back(program.target);
            break;
        case program_kind::python_script: {
            const auto check = detail::check_file(program.target, R_OK);
            if (check == detail::file_check::missing) {
                throw usage_error{fmt::format("script {} does not exist", program.target)};
            }
            if (check == detail::file_check::directory) {
                throw usage_error{fmt::format("script {} is a directory, not a script", program.target)};
            }
            if (check != detail::file_check::ok) {
                throw usage_error{fmt::format("script {} is not readable", program.target)};
            }
            command.path = find_executable(program.python, env, "PYTHON_EXEC");
            command.argv = {program.python, "-u", program.target};
            break;
        }
        case program_kind::python_module:
            if (!detail::agent::valid_module_name(program.target)) {
                throw usage_error{
                    fmt::format("-m {}: not a Python module name (want dotted identifiers such as pkg.train)",
                                program.target)};
            }
            command.path = find_executable(program.python, env, "PYTHON_EXEC");
            command.argv = {program.python, "-u", "-m", program.target};
            break;
    }
    command.argv.insert(command.argv.end(), program.args.begin(), program.args.end());
    return command;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/agent/program.hpp ----

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

    /// True when log_dir is /dev/null: no stdout/stderr/error files are written.
    [[nodiscard]] bool logs_disabled() const { return log_dir && *log_dir == "/dev/null"; }
};

/// The agent's own settings.
struct agent_options {
    log_level agent_log_level = log_level::warning;  ///< what the agent logs (LOGLEVEL)
    event_destination event_log_handler;             ///< where its events go (--event-log-handler)
};

}  // namespace elastic::inline v0
// ---- end elastic/agent/spec.hpp ----

#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <string>
#include <string_view>
#include <utility>

#include <unistd.h>

namespace elastic::inline v0 {

/// What the agent writes for people, and how much (LOGLEVEL, torchrun's levels; WARNING by
/// default, so a healthy run prints nothing of the agent's own). Every line of a message is
/// written in torchrun's newest layout (PyTorch's log formatter), the launcher's name standing
/// where torchrun names its source file:
///
///     W1122 12:45:07.123456 4242 elasticrun] [default] worker group failed (...); restarting
///
/// level letter (D, I, W, E, C), month and day, local time with microseconds, the agent's pid.
/// A multi-line message gets the prefix on every line. The whole message is one write(2).
class agent_log {
public:
    agent_log(std::string name, log_level level, int fd = 2)
        : name_(std::move(name)), level_(level), fd_(fd), pid_(static_cast<long>(::getpid())) {}

    [[nodiscard]] bool enabled(log_level level) const noexcept { return level >= level_; }
    [[nodiscard]] log_level level() const noexcept { return level_; }

    void operator()(log_level level, std::string_view text) const {
        if (!enabled(level)) return;
        const auto now = std::chrono::system_clock::now();
        const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
        std::tm local{};
        ::localtime_r(&seconds, &local);
        const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
                            1000000;
        detail::agent::write_all(fd_, format(level, local, static_cast<int>(micros), pid_, name_, text));
    }
    void debug(std::string_view text) const { (*this)(log_level::debug, text); }
    void info(std::string_view text) const { (*this)(log_level::info, text); }
    void warning(std::string_view text) const { (*this)(log_level::warning, text); }
    void error(std::string_view text) const { (*this)(log_level::error, text); }
    void critical(std::string_view text) const { (*this)(log_level::critical, text); }
    /// Text shown whatever the level and without the prefix (the failure summary, as torchrun
    /// prints its exception).
    void always(std::string_view text) const { detail::agent::write_all(fd_, fmt::format("{}\n", text)); }

    [[nodiscard]] const std::string& name() const noexcept { return name_; }

    /// The text written for one message: every line (newlines leading and trailing `text` are dropped)
    /// as `<L><mmdd> <hh:mm:ss>.<micros> <pid> <name>] <line>\n`.
    [[nodiscard]] static std::string format(log_level level, const std::tm& local, int micros, long pid,
                                            std::string_view name, std::string_view text) {
        static constexpr char letters[] = {'D', 'I', 'W', 'E', 'C'};
        const auto prefix = fmt::format("{}{:02}{:02} {:02}:{:02}:{:02}.{:06} {} {}] ",
                                        letters[static_cast<int>(level)], local.tm_mon + 1, local.tm_mday,
                                        local.tm_hour, local.tm_min, local.tm_sec, micros, pid, name);
        while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
        while (!text.empty() && text.front() == '\n') text.remove_prefix(1);
        std::string out;
        for (;;) {
            const auto nl = text.find('\n');
            out += prefix;
            out += text.substr(0, nl);
            out += '\n';
            if (nl == std::string_view::npos) break;
            text.remove_prefix(nl + 1);
        }
        return out;
    }

private:
    std::string name_;
    log_level level_;
    int fd_;
    long pid_;
};

}  // namespace elastic::inline v0
// ---- end elastic/agent/agent_log.hpp ----
// ---- begin elastic/agent/local_agent.hpp ----
// local_agent: one node's agent — hosts the workers' store, runs the worker group with
// torchrun's environment contract, supervises it by events, stops it on a failure or a signal,
// asks the restart policy, and ends with torchrun's failure summary and the root cause's code.

// ---- begin elastic/agent/log_tree.hpp ----
// log_tree: torchrun's per-rank log tree (<log_dir>/<run_id>_XXXXXX/attempt_<n>/<local_rank>/), the
// route of each worker stream (file, console with or without prefix, nowhere), and the prefix template.


#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

namespace elastic::inline v0 {

/// A directory or file of the log tree could not be made (exit 1, nothing lost: no worker of the
/// attempt was started).
class log_error : public error {
public:
    using error::error;
};

/// How a worker stream reaches the agent's console.
enum class console_copy {
    none,      ///< not at all (redirected only, or a local rank outside --local-ranks-filter)
    raw,       ///< as the worker wrote it (no prefix): torchrun's behaviour without -r/-t
    prefixed,  ///< whole lines, each after the rank's prefix (`[default0]:`): -t/--tee
};

/// Where one standard stream of one worker goes (docs/logs.md, "Where each stream goes").
struct stream_route {
    bool file = false;                         ///< into attempt_<n>/<local_rank>/{stdout,stderr}.log
    console_copy console = console_copy::raw;  ///< the agent's stdout (for stdout) or stderr (for stderr)
    friend bool operator==(const stream_route&, const stream_route&) = default;
};

/// The routes of a worker's stdout and stderr.
struct worker_routes {
    stream_route out;
    stream_route err;
    friend bool operator==(const worker_routes&, const worker_routes&) = default;
};

/// torchrun's rules (DefaultLogsSpecs.reify, newest): tee implies redirect; a redirected stream
/// goes to its file; a tee'd one to its file and, prefixed, to the console; a stream of a local
/// rank outside `--local-ranks-filter` reaches the console in no case (files are unaffected). With
/// `--log-dir /dev/null` no stream has a file: a redirected-only stream then goes nowhere (torchrun
/// sends it to the console unprefixed instead), a tee'd one to the console only.
[[nodiscard]] ELASTIC_DECL worker_routes route_streams(const worker_spec& config, int local_rank);

/// Whether any stream of any local rank has a file (-r/-t name one; the tree is not /dev/null).
[[nodiscard]] ELASTIC_DECL bool writes_log_files(const worker_spec& config);

/// The console prefix of one worker: `TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE` (default
/// `[${role_name}${local_rank}]:`) with Python's `string.Template.safe_substitute` rules, as
/// torchrun applies it: `${name}` and `$name` for role_name, local_rank, rank; `$$` is one `$`;
/// anything else stays as written.
[[nodiscard]] ELASTIC_DECL std::string format_log_prefix(std::string_view templ, std::string_view role_name,
                                                         int local_rank, int rank);

namespace detail::agent {

/// Where the temporary log tree goes: $TMPDIR, $TEMP or $TMP (the first set), else /tmp.
ELASTIC_DECL std::string temp_base(const environment& env);

ELASTIC_DECL std::filesystem::path make_temp_dir(const std::filesystem::path& parent, std::string_view prefix);

}  // namespace detail::agent

/// One agent's log tree, torchrun's layout:
///
///     <base>/<run_id>_XXXXXX/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}
///
/// `<base>` is `--log-dir` (made if missing, never removed) or, without it, a new
/// `<TMPDIR>/torchelastic_XXXXXX`. The run directory is made once per agent, at the first
/// attempt. An attempt directory is never wiped: should `attempt_<n>` exist already (an attempt
/// number seen twice), the attempt gets `attempt_<n>.1`, `.2`, ... instead. With `--log-dir
/// /dev/null` the tree is disabled: nothing is ever created.
class log_tree {
public:
    /// `log_dir`: `--log-dir` (nullopt: a temporary base under `temp_parent`).
    log_tree(std::optional<std::filesystem::path> log_dir, std::string run_id, std::filesystem::path temp_parent)
        : log_dir_(std::move(log_dir)), run_id_(std::move(run_id)), temp_parent_(std::move(temp_parent)) {}

    [[nodiscard]] bool disabled() const noexcept { return log_dir_ && *log_dir_ == "/dev/null"; }
    /// Whether the base is a temporary directory this tree made (no --log-dir).
    [[nodiscard]] bool temporary() const noexcept { return !log_dir_; }
    /// The run directory (`<base>/<run_id>_XXXXXX`); empty before the first attempt or when disabled.
    [[nodiscard]] const std::filesystem::path& run_dir() const noexcept { return run_dir_; }
    /// The base directory; empty before the first attempt or when disabled.
    [[nodiscard]] const std::filesystem::path& base() const noexcept { return base_; }

    /// Makes `attempt_<attempt>/` with one directory per local rank and returns its path (empty
    /// when disabled). `attempt` is the restart count the workers see (TORCHELASTIC_RESTART_COUNT).
    /// Throws log_error.
    ELASTIC_DECL std::filesystem::path make_attempt(int attempt, int local_world_size);

    /// Removes the temporary base with everything in it (nothing when --log-dir was given).
    ELASTIC_DECL void remove_temporary() noexcept;

private:
    std::optional<std::filesystem::path> log_dir_;
    std::string run_id_;
    std::filesystem::path temp_parent_;
    std::filesystem::path base_;
    std::filesystem::path run_dir_;
};

/// Opens (creates, truncates) one log file of the tree for the agent's writes. Throws log_error.
[[nodiscard]] ELASTIC_DECL detail::process::owned_fd open_log_file(const std::filesystem::path& path);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL worker_routes route_streams(const worker_spec& config, int local_rank) {
    const auto bits = [](std_streams s) { return static_cast<unsigned>(s); };
    const unsigned tee = bits(config.tee.for_rank(local_rank));
    const unsigned redirected = bits(config.redirects.for_rank(local_rank)) | tee;
    const bool shown = config.local_ranks_filter.empty() || config.local_ranks_filter.count(local_rank) != 0;
    const auto route = [&](std_streams which) {
        const unsigned bit = bits(which);
        stream_route r;
        r.file = (redirected & bit) != 0 && !config.logs_disabled();
        if (!shown) {
            r.console = console_copy::none;
        } else if ((tee & bit) != 0) {
            r.console = console_copy::prefixed;
        } else if ((redirected & bit) != 0) {
            r.console = console_copy::none;
        } else {
            r.console = console_copy::raw;
        }
        return r;
    };
    return {route(std_streams::out), route(std_streams::err)};
}

[[nodiscard]] ELASTIC_DECL bool writes_log_files(const worker_spec& config) {
    for (int i = 0; i < config.nproc_per_node; ++i) {
        const auto r = route_streams(config, i);
        if (r.out.file || r.err.file) return true;
    }
    return false;
}

[[nodiscard]] ELASTIC_DECL std::string format_log_prefix(std::string_view templ, std::string_view role_name,
                                                         int local_rank, int rank) {
    const auto value = [&](std::string_view name) -> std::optional<std::string> {
        if (name == "role_name") return std::string(role_name);
        if (name == "local_rank") return fmt::format("{}", local_rank);
        if (name == "rank") return fmt::format("{}", rank);
        return std::nullopt;
    };
    // Python's identifier pattern for templates: [_a-z][_a-z0-9]* without regard to case.
    const auto starts_id = [](char c) { return c == '_' || std::isalpha(static_cast<unsigned char>(c)) != 0; };
    const auto in_id = [](char c) { return c == '_' || std::isalnum(static_cast<unsigned char>(c)) != 0; };
    std::string out;
    std::size_t i = 0;
    while (i < templ.size()) {
        const char c = templ[i];
        if (c != '$' || i + 1 >= templ.size()) {
            out += c;
            ++i;
            continue;
        }
        if (templ[i + 1] == '$') {
            out += '$';
            i += 2;
            continue;
        }
        if (templ[i + 1] == '{') {
            const auto close = templ.find('}', i + 2);
            const auto name = close == std::string_view::npos ? std::string_view{} : templ.substr(i + 2, close - i - 2);
            const bool identifier = !name.empty() && starts_id(name.front()) &&
                                    std::all_of(name.begin(), name.end(), in_id);
            if (identifier) {
                if (const auto v = value(name)) {
                    out += *v;
                    i = close + 1;
                    continue;
                }
            }
            out += c;
            ++i;
            continue;
        }
        if (starts_id(templ[i + 1])) {
            std::size_t end = i + 2;
            while (end < templ.size() && in_id(templ[end])) ++end;
            if (const auto v = value(templ.substr(i + 1, end - i - 1))) {
                out += *v;
                i = end;
                continue;
            }
        }
        out += c;
        ++i;
    }
    return out;
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::agent {

ELASTIC_DECL std::string temp_base(const environment& env) {
    for (const char* name : {"TMPDIR", "TEMP", "TMP"}) {
        if (const auto it = env.find(name); it != env.end() && !it->second.empty()) return it->second;
    }
    return "/tmp";
}

ELASTIC_DECL std::filesystem::path make_temp_dir(const std::filesystem::path& parent, std::string_view prefix) {
    std::string pattern = (parent / fmt::format("{}XXXXXX", prefix)).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
        throw log_error(fmt::format("cannot create a directory like {}: {} (set {} to a writable directory)", pattern,
                                    std::generic_category().message(errno),
                                    prefix == "torchelastic_" ? "TMPDIR" : "--log-dir"));
    }
    return pattern;
}

}  // namespace detail::agent
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL detail::process::owned_fd open_log_file(const std::filesystem::path& path) {
    detail::process::owned_fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0666));
    if (!fd) {
        throw log_error(fmt::format("cannot open {}: {}", path.string(), std::generic_category().message(errno)));
    }
    return fd;
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL std::filesystem::path log_tree::make_attempt(int attempt, int local_world_size) {
    if (disabled()) return {};
    if (run_dir_.empty()) {
        if (log_dir_) {
            std::error_code ec;
            std::filesystem::create_directories(*log_dir_, ec);
            if (ec || !std::filesystem::is_directory(*log_dir_)) {
                throw log_error(fmt::format("--log-dir={}: cannot create the directory: {}", log_dir_->string(),
                                            ec ? ec.message() : std::string("not a directory")));
            }
            base_ = *log_dir_;
        } else {
            base_ = detail::agent::make_temp_dir(temp_parent_, "torchelastic_");
        }
        run_dir_ = detail::agent::make_temp_dir(base_, run_id_ + "_");
    }
    const auto name = fmt::format("attempt_{}", attempt);
    std::filesystem::path dir = run_dir_ / name;
    // mkdir(2) is the test and the claim at once: an existing directory is never reused.
    for (int k = 1; ::mkdir(dir.c_str(), 0777) != 0; ++k) {
        if (errno != EEXIST) {
            throw log_error(fmt::format("cannot create {}: {}", dir.string(), std::generic_category().message(errno)));
        }
        dir = run_dir_ / fmt::format("{}.{}", name, k);
    }
    for (int i = 0; i < local_world_size; ++i) {
        const auto rank_dir = dir / fmt::format("{}", i);
        if (::mkdir(rank_dir.c_str(), 0777) != 0) {
            throw log_error(fmt::format("cannot create {}: {}", rank_dir.string(),
                                        std::generic_category().message(errno)));
        }
    }
    return dir;
}

ELASTIC_DECL void log_tree::remove_temporary() noexcept {
    if (!temporary() || base_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(base_, ignored);
    base_.clear();
    run_dir_.clear();
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/agent/log_tree.hpp ----
// ---- begin elastic/agent/agent_events.hpp ----
// agent_events: the agent's event log (--event-log-handler) — one event per agent step (round,
// worker started, worker exited, policy decision, restart, final worker status, shutdown) —
// and how an exception that ends the agent maps to elasticrun's exit code.

// ---- begin elastic/agent/worker_environment.hpp ----
// The environment the agent gives each worker: torchrun's worker contract, name for
// name and meaning for meaning, on top of the agent's own environment.


#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace elastic::inline v0 {

/// Where one worker stands in the job: its ranks and the sizes around it.
struct worker_assignment {
    int local_rank = 0;        ///< LOCAL_RANK (0 for every worker with --virtual-local-rank)
    int global_rank = 0;       ///< RANK
    int role_rank = 0;         ///< ROLE_RANK: rank among the job's workers of the same --role
    int local_world_size = 1;  ///< LOCAL_WORLD_SIZE (--nproc-per-node)
    int world_size = 1;        ///< WORLD_SIZE
    int role_world_size = 1;   ///< ROLE_WORLD_SIZE
    int group_rank = 0;        ///< GROUP_RANK: this agent's rank in the rendezvous round
    int group_world_size = 1;  ///< GROUP_WORLD_SIZE: agents in the round
};

/// What the workers are told of the job and of this attempt of the group.
struct attempt_settings {
    int restart_count = 0;          ///< TORCHELASTIC_RESTART_COUNT
    std::string master_addr;        ///< MASTER_ADDR: the host of the store the agent hosts
    std::uint16_t master_port = 0;  ///< MASTER_PORT: its port
    std::string error_file;         ///< TORCHELASTIC_ERROR_FILE of this worker ("" with --log-dir=/dev/null)
    std::string run_id = "none";    ///< TORCHELASTIC_RUN_ID: the job's id (--rdzv-id)
};

/// The ranks of local worker `local_rank` on a node that is `group_rank` of `group_world_size`
/// nodes with `nproc_per_node` workers each (homogeneous, as torchrun supports).
[[nodiscard]] ELASTIC_DECL worker_assignment assign_worker(int local_rank, int nproc_per_node, int group_rank = 0,
                                                           int group_world_size = 1);

/// torchrun's `--signals-to-handle` text, as it exports TORCHELASTIC_SIGNALS_TO_HANDLE.
[[nodiscard]] ELASTIC_DECL std::string signals_text(const std::vector<int>& signals);

/// Whether the agent sets OMP_NUM_THREADS=1 for its workers: torchrun does when the variable is
/// not set and more than one worker runs on the node (each would otherwise start one OpenMP
/// thread per core), and says so with omp_warning().
[[nodiscard]] ELASTIC_DECL bool sets_omp_num_threads(const worker_spec& config, const environment& agent_env);

/// torchrun's warning when it sets OMP_NUM_THREADS (run.py), word for word.
[[nodiscard]] ELASTIC_DECL std::string omp_warning();

/// The environment of one worker: the agent's environment (`agent_env`, inherited whole, as
/// torchrun's `os.environ.copy()`), then the contract:
///
/// LOCAL_RANK, RANK, GROUP_RANK, ROLE_RANK, ROLE_NAME, LOCAL_WORLD_SIZE, WORLD_SIZE,
/// GROUP_WORLD_SIZE, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT,
/// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE=True (the
/// workers' store is the one the agent hosts: clients only), TORCHELASTIC_ERROR_FILE,
/// TORCH_NCCL_ASYNC_ERROR_HANDLING and NCCL_ASYNC_ERROR_HANDLING (the inherited value, else 1;
/// PyTorch 1.13 reads the second name, newer ones the first), TORCHELASTIC_SIGNALS_TO_HANDLE,
/// OMP_NUM_THREADS=1 under sets_omp_num_threads(), and with --virtual-local-rank LOCAL_RANK=0
/// and CUDA_VISIBLE_DEVICES narrowed to the worker's own device.
[[nodiscard]] ELASTIC_DECL environment worker_environment(const worker_spec& config, const environment& agent_env,
                                                          const worker_assignment& a, const attempt_settings& attempt);

/// An environment as execve's "NAME=value" entries.
[[nodiscard]] ELASTIC_DECL std::vector<std::string> environment_entries(const environment& env);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL worker_assignment assign_worker(int local_rank, int nproc_per_node, int group_rank,
                                                           int group_world_size) {
    worker_assignment a;
    a.local_rank = local_rank;
    a.local_world_size = nproc_per_node;
    a.group_rank = group_rank;
    a.group_world_size = group_world_size;
    a.global_rank = group_rank * nproc_per_node + local_rank;
    a.role_rank = a.global_rank;
    a.world_size = group_world_size * nproc_per_node;
    a.role_world_size = a.world_size;
    return a;
}

[[nodiscard]] ELASTIC_DECL std::string signals_text(const std::vector<int>& signals) {
    std::string out;
    for (const int s : signals) {
        out += (out.empty() ? "" : ",") + signal_to_string(s);
    }
    return out;
}

[[nodiscard]] ELASTIC_DECL bool sets_omp_num_threads(const worker_spec& config, const environment& agent_env) {
    return config.nproc_per_node > 1 && agent_env.find("OMP_NUM_THREADS") == agent_env.end();
}

[[nodiscard]] ELASTIC_DECL std::string omp_warning() {
    return "\n*****************************************\n"
           "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to "
           "avoid your system being overloaded, please further tune the variable for optimal "
           "performance in your application as needed. \n"
           "*****************************************";
}

[[nodiscard]] ELASTIC_DECL environment worker_environment(const worker_spec& config, const environment& agent_env,
                                                          const worker_assignment& a, const attempt_settings& attempt) {
    environment env = agent_env;
    const auto set = [&](std::string name, std::string value) {
        env.insert_or_assign(std::move(name), std::move(value));
    };
    const auto number = [](long long v) { return fmt::format("{}", v); };
    set("LOCAL_RANK", number(config.virtual_local_rank ? 0 : a.local_rank));
    set("RANK", number(a.global_rank));
    set("GROUP_RANK", number(a.group_rank));
    set("ROLE_RANK", number(a.role_rank));
    set("ROLE_NAME", config.role);
    set("LOCAL_WORLD_SIZE", number(a.local_world_size));
    set("WORLD_SIZE", number(a.world_size));
    set("GROUP_WORLD_SIZE", number(a.group_world_size));
    set("ROLE_WORLD_SIZE", number(a.role_world_size));
    set("MASTER_ADDR", attempt.master_addr);
    set("MASTER_PORT", number(attempt.master_port));
    set("TORCHELASTIC_RESTART_COUNT", number(attempt.restart_count));
    set("TORCHELASTIC_MAX_RESTARTS", number(config.max_restarts));
    set("TORCHELASTIC_RUN_ID", attempt.run_id);
    set("TORCHELASTIC_USE_AGENT_STORE", "True");
    set("TORCHELASTIC_ERROR_FILE", attempt.error_file);
    for (const char* name : {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"}) {
        if (const auto it = agent_env.find(name); it == agent_env.end()) {
            set(name, "1");
        }
    }
    set("TORCHELASTIC_SIGNALS_TO_HANDLE", signals_text(config.signals_to_handle));
    if (sets_omp_num_threads(config, agent_env)) {
        set("OMP_NUM_THREADS", "1");
    }
    if (config.virtual_local_rank) {
        // torchrun (PR #166680): the worker sees one device, its own; an inherited list is
        // indexed by the local rank.
        std::string device = number(a.local_rank);
        if (const auto it = agent_env.find("CUDA_VISIBLE_DEVICES"); it != agent_env.end() && !it->second.empty()) {
            std::vector<std::string> ids;
            std::string_view rest = it->second;
            for (;;) {
                const auto comma = rest.find(',');
                ids.emplace_back(rest.substr(0, comma));
                if (comma == std::string_view::npos) break;
                rest.remove_prefix(comma + 1);
            }
            if (static_cast<std::size_t>(a.local_rank) < ids.size())
                device = ids[static_cast<std::size_t>(a.local_rank)];
        }
        set("CUDA_VISIBLE_DEVICES", device);
    }
    return env;
}

[[nodiscard]] ELASTIC_DECL std::vector<std::string> environment_entries(const environment& env) {
    std::vector<std::string> out;
    out.reserve(env.size());
    for (const auto& [name, value] : env) {
        out.push_back(name + "=" + value);
    }
    return out;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/agent/worker_environment.hpp ----

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

#include <cxxabi.h>

namespace elastic::inline v0 {

namespace detail::agent {

/// What ends the agent when an exception escapes it: elasticrun's exit code, the error's type
/// as an error file names it, and its message.
struct agent_exception {
    int exit_code = exit_codes::internal;
    std::string type;
    std::string what;
};

ELASTIC_DECL std::string readable_type_name(const std::type_info& type);

/// usage_error: 2; rendezvous_error: exit_codes::rendezvous; anything else (agent_error, a
/// store or process error, std::bad_alloc, a non-std exception): exit_codes::internal.
ELASTIC_DECL agent_exception classify_exception(const std::exception_ptr& failure);

}  // namespace detail::agent

/// The agent's events, in the order they happen (docs/failure-report.md, "The event log"):
///
///   elastic.rendezvous.done       AGENT   each attempt's round (run id, restart count, ranks)
///   elastic.worker.started        WORKER  each worker (local and global rank, pid)
///   elastic.worker.exited         WORKER  each worker, in the order the agent observed the
///                                         exits, stamped with that observation
///   elastic.policy.decision       AGENT   after a failed attempt: restart or stop, and why
///   elastic.agent.restart         AGENT   the group is started again (the new restart count)
///   torchelastic.worker.status.*  WORKER  torch's per-worker status when the group ends for good
///                                         (FAILED/TERMINATED, or SUCCEEDED)
///   elastic.agent.shutdown        AGENT   the exit code and the reason
///
/// Every elastic.* event carries run_id, role and hostname (host_name(): no DNS lookup), plus
/// the sink's stamps. Metadata values are scalars (torch's EventMetadataValue); lists are
/// comma-separated text. With the null handler nothing is built.
class agent_events {
public:
    /// The null log.
    agent_events() = default;

    /// Opens `destination` for the job `rendezvous.run_id` of `workers`. Throws usage_error
    /// (nothing has started yet) when the file cannot be opened.
    agent_events(const worker_spec& workers, const rendezvous_parameters& rendezvous,
                 const event_destination& destination)
        : run_id_(rendezvous.run_id),
          role_(workers.role),
          entry_point_(workers.program.target),
          rdzv_backend_(to_string(rendezvous.backend)) {
        try {
            sink_ = event_sink(destination);
        } catch (const report_error& e) {
            throw usage_error{fmt::format("--event-log-handler={}: {}", destination.to_string(), e.what())};
        }
        if (sink_.enabled()) hostname_ = host_name();
    }

    [[nodiscard]] bool enabled() const noexcept { return sink_.enabled(); }
    [[nodiscard]] event_sink& sink() noexcept { return sink_; }

    /// The attempt's round is settled: this node's rank among `group_world_size` nodes and the
    /// store its workers use. Also forgets the previous attempt's workers.
    ELASTIC_DECL void rendezvous_done(int restarts, const worker_assignment& node, std::string_view master_addr,
                                      std::uint16_t master_port) noexcept;

    /// A worker runs.
    ELASTIC_DECL void worker_started(int restarts, const worker_assignment& a, long pid) noexcept;

    /// The agent begins stopping the attempt's group (after a failure, or on a signal): exits
    /// observed from now on are the agent's doing. The first call of an attempt counts.
    void stopping_group() noexcept {
        if (stop_began_ == std::chrono::steady_clock::time_point::max()) stop_began_ = std::chrono::steady_clock::now();
    }

    /// Every observed exit of the attempt's workers, oldest first, each stamped with the moment
    /// the agent observed it. An exit observed before stopping_group() is the worker's own:
    /// SUCCEEDED or FAILED; a later one is TERMINATED (the agent ended it), as the failure
    /// summary counts them.
    ELASTIC_DECL void workers_exited(int restarts, std::span<const child_process> workers) noexcept;

    /// The restart policy answered after a failed attempt.
    ELASTIC_DECL void decision(const group_failure& failure, const restart_decision& decided) noexcept;

    /// The agent received `signal` while the policy was deciding: no decision.
    ELASTIC_DECL void decision_interrupted(int restarts, int signal) noexcept;

    /// The agent received `signal` and stops the group; the shutdown event says so.
    ELASTIC_DECL void received_signal(int signal) noexcept;

    /// The group starts again; `restarts` is the new restart count.
    ELASTIC_DECL void restart(int restarts) noexcept;

    /// torch's torchelastic.worker.status.<STATE> event for each failed or stopped worker when
    /// the group fails for good, stamped now (torch records them at the end of the run; its
    /// total_run_time counts whole seconds since the agent started).
    ELASTIC_DECL void final_status(const group_failure& failure) noexcept;

    /// torch's torchelastic.worker.status.SUCCEEDED event for each worker of the attempt when
    /// the group succeeded (torch 1.13 records one per worker, in local rank order, at the end
    /// of a successful run), stamped now. `host`: the node's fully qualified name, as the
    /// failure reports carry it (empty: the host name).
    ELASTIC_DECL void final_success(int restarts, std::string_view host) noexcept;

    /// The agent ends with `exit_code`.
    ELASTIC_DECL void shutdown(int exit_code) noexcept;

    /// The agent ends because `failure` escaped it (a rendezvous or internal error).
    ELASTIC_DECL void shutdown(const std::exception_ptr& failure) noexcept;

private:
    struct started_worker {
        long pid = 0;
        int local_rank = -1;
        int global_rank = -1;
    };

    // What every worker status event of this node says about the run.
    ELASTIC_DECL worker_event_context status_context(int restarts, std::string hostname) const;

    started_worker find_started(long pid) const {
        for (const auto& s : started_) {
            if (s.pid == pid) return s;
        }
        return {pid, -1, -1};
    }

    static ELASTIC_DECL std::string join(const std::vector<int>& values);

    ELASTIC_DECL event_metadata common() const;

    template <class Fill>
    void record_agent(std::string name, Fill fill) noexcept {
        record(std::move(name), event_source::agent, std::chrono::steady_clock::now(), std::chrono::system_clock::now(),
               fill);
    }

    template <class Fill>
    void record_worker(std::string name, std::chrono::steady_clock::time_point steady,
                       std::chrono::system_clock::time_point wall, Fill fill) noexcept {
        record(std::move(name), event_source::worker, steady, wall, fill);
    }

    template <class Fill>
    void record(std::string name, event_source source, std::chrono::steady_clock::time_point steady,
                std::chrono::system_clock::time_point wall, Fill& fill) noexcept {
        try {
            event e;
            e.name = std::move(name);
            e.source = source;
            e.metadata = common();
            fill(e.metadata);
            sink_.record(std::move(e), steady, wall);
        } catch (...) {
        }
    }

    event_sink sink_;
    std::string run_id_;
    std::string role_;
    std::string entry_point_;
    std::string rdzv_backend_;
    std::string hostname_;
    std::string pending_reason_ = "the agent stopped";
    std::vector<started_worker> started_;
    worker_assignment node_;
    std::chrono::steady_clock::time_point stop_began_ = std::chrono::steady_clock::time_point::max();
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::agent {

ELASTIC_DECL std::string readable_type_name(const std::type_info& type) {
    int status = 0;
    char* readable = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
    std::string name = readable != nullptr ? readable : type.name();
    std::free(readable);
    // The versioned inline namespace is an implementation detail: elastic::agent_error.
    for (auto at = name.find("::v0::"); at != std::string::npos; at = name.find("::v0::")) {
        name.erase(at, 4);
    }
    return name;
}

ELASTIC_DECL agent_exception classify_exception(const std::exception_ptr& failure) {
    agent_exception out;
    try {
        std::rethrow_exception(failure);
    } catch (const usage_error& e) {
        out = {exit_codes::usage, "elastic::usage_error", e.what()};
    } catch (const rendezvous_error& e) {
        out = {exit_codes::rendezvous, readable_type_name(typeid(e)), e.what()};
    } catch (const std::exception& e) {
        out = {exit_codes::internal, readable_type_name(typeid(e)), e.what()};
    } catch (...) {
        out = {exit_codes::internal, "<unknown exception>",
               "an exception that is not a std::exception carries no message"};
    }
    return out;
}

}  // namespace detail::agent
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL void agent_events::rendezvous_done(int restarts, const worker_assignment& node,
                                                std::string_view master_addr, std::uint16_t master_port) noexcept {
    started_.clear();
    stop_began_ = std::chrono::steady_clock::time_point::max();
    node_ = node;
    if (!enabled()) return;
    record_agent("elastic.rendezvous.done", [&](event_metadata& m) {
        m["restart_count"] = restarts;
        m["group_rank"] = node.group_rank;
        m["group_world_size"] = node.group_world_size;
        m["local_world_size"] = node.local_world_size;
        m["world_size"] = node.world_size;
        m["rdzv_backend"] = rdzv_backend_;
        m["master_addr"] = std::string(master_addr);
        m["master_port"] = master_port;
    });
}

ELASTIC_DECL void agent_events::worker_started(int restarts, const worker_assignment& a, long pid) noexcept {
    try {
        started_.push_back({pid, a.local_rank, a.global_rank});
    } catch (...) {
        return;
    }
    if (!enabled()) return;
    record_worker("elastic.worker.started", std::chrono::steady_clock::now(), std::chrono::system_clock::now(),
                  [&](event_metadata& m) {
                      m["restart_count"] = restarts;
                      m["local_rank"] = a.local_rank;
                      m["global_rank"] = a.global_rank;
                      m["pid"] = pid;
                  });
}

ELASTIC_DECL void agent_events::workers_exited(int restarts, std::span<const child_process> workers) noexcept {
    if (!enabled()) return;
    const auto stop_began = stop_began_;
    try {
        std::vector<const child_process*> ended;
        for (const auto& w : workers) {
            if (w.status()) ended.push_back(&w);
        }
        std::stable_sort(ended.begin(), ended.end(), [](const child_process* a, const child_process* b) {
            return a->status()->steady_time < b->status()->steady_time;
        });
        for (const auto* w : ended) {
            const auto& observed = *w->status();
            const auto& s = observed.status;
            const auto who = find_started(static_cast<long>(w->pid()));
            const char* state = observed.steady_time >= stop_began ? "TERMINATED"
                                : s.success()                      ? "SUCCEEDED"
                                                                   : "FAILED";
            record_worker("elastic.worker.exited", observed.steady_time, observed.system_time, [&](event_metadata& m) {
                m["restart_count"] = restarts;
                m["local_rank"] = who.local_rank;
                m["global_rank"] = who.global_rank;
                m["pid"] = static_cast<long>(w->pid());
                m["state"] = state;
                m["exitcode"] = s.returncode();
                m["exit_status"] = s.shell_code();
                m["signal"] = s.signaled() ? event_value(signal_name(s.signal())) : event_value(nullptr);
                m["core_dumped"] = s.core_dumped;
            });
        }
    } catch (...) {
    }
}

ELASTIC_DECL void agent_events::decision(const group_failure& failure, const restart_decision& decided) noexcept {
    try {
        const auto* root = failure.root_cause();
        pending_reason_ = fmt::format("the worker group failed ({}); the policy stopped: {}",
                                      root != nullptr ? failure_headline(*root) : "no worker failed on its own",
                                      decided.reason);
        if (!enabled()) return;
        record_agent("elastic.policy.decision", [&](event_metadata& m) {
            m["restart_count"] = failure.restarts;
            m["action"] = decided.restart() ? "restart" : "stop";
            m["reason"] = decided.reason;
            m["failed_global_ranks"] = join(failure.failed_global_ranks());
            m["healthy_for_ms"] = static_cast<std::int64_t>(
                std::chrono::duration_cast<std::chrono::milliseconds>(failure.healthy_for()).count());
            if (root != nullptr) {
                m["root_cause_global_rank"] = root->global_rank;
                m["root_cause_local_rank"] = root->local_rank;
                m["root_cause_pid"] = root->pid;
                m["root_cause_exitcode"] = root->status.returncode();
                m["root_cause"] = failure_headline(*root);
            } else {
                m["root_cause"] = nullptr;
            }
        });
    } catch (...) {
    }
}

ELASTIC_DECL void agent_events::decision_interrupted(int restarts, int signal) noexcept {
    received_signal(signal);
    if (!enabled()) return;
    record_agent("elastic.policy.decision", [&](event_metadata& m) {
        m["restart_count"] = restarts;
        m["action"] = "interrupted";
        m["reason"] = fmt::format("received {} while deciding", signal_name(signal));
    });
}

ELASTIC_DECL void agent_events::received_signal(int signal) noexcept {
    stopping_group();
    try {
        pending_reason_ = fmt::format("received {}", signal_name(signal));
    } catch (...) {
    }
}

ELASTIC_DECL void agent_events::restart(int restarts) noexcept {
    if (!enabled()) return;
    record_agent("elastic.agent.restart", [&](event_metadata& m) { m["restart_count"] = restarts; });
}

ELASTIC_DECL void agent_events::final_status(const group_failure& failure) noexcept {
    if (!enabled()) return;
    try {
        const auto ctx = status_context(failure.restarts,
                                        failure.workers.empty() ? hostname_ : failure.workers.front().host);
        for (const auto& f : failure.workers) sink_.record(worker_status_event(f, ctx));
    } catch (...) {
    }
}

ELASTIC_DECL void agent_events::final_success(int restarts, std::string_view host) noexcept {
    if (!enabled()) return;
    try {
        const auto ctx = status_context(restarts, host.empty() ? hostname_ : std::string(host));
        auto workers = started_;
        std::stable_sort(workers.begin(), workers.end(),
                         [](const started_worker& a, const started_worker& b) { return a.local_rank < b.local_rank; });
        const auto now = std::chrono::system_clock::now();
        for (const auto& w : workers) {
            sink_.record(worker_succeeded_event({w.pid, w.local_rank, w.global_rank, role_}, ctx, now));
        }
    } catch (...) {
    }
}

ELASTIC_DECL void agent_events::shutdown(int exit_code) noexcept {
    if (!enabled()) return;
    std::string reason;
    try {
        reason = exit_code == 0 ? std::string("every worker succeeded") : pending_reason_;
    } catch (...) {
    }
    record_agent("elastic.agent.shutdown", [&](event_metadata& m) {
        m["exit_code"] = exit_code;
        m["reason"] = reason;
    });
}

ELASTIC_DECL void agent_events::shutdown(const std::exception_ptr& failure) noexcept {
    if (!enabled()) return;
    try {
        const auto e = detail::agent::classify_exception(failure);
        record_agent("elastic.agent.shutdown", [&](event_metadata& m) {
            m["exit_code"] = e.exit_code;
            m["reason"] = e.exit_code == exit_codes::rendezvous ? "rendezvous error"
                          : e.exit_code == exit_codes::usage    ? "usage error"
                                                                : "internal error";
            m["error_type"] = e.type;
            m["message"] = e.what;
        });
    } catch (...) {
    }
}

ELASTIC_DECL worker_event_context agent_events::status_context(int restarts, std::string hostname) const {
    worker_event_context ctx;
    ctx.run_id = run_id_;
    ctx.entry_point = entry_point_;
    ctx.rdzv_backend = rdzv_backend_;
    ctx.agent_restarts = restarts;
    ctx.total_run_time =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - sink_.origin()).count();
    ctx.hostname = std::move(hostname);
    ctx.group_rank = node_.group_rank;
    ctx.group_world_size = node_.group_world_size;
    ctx.role_world_size = node_.role_world_size;
    ctx.role_rank_offset = node_.role_rank - node_.global_rank;
    return ctx;
}

ELASTIC_DECL std::string agent_events::join(const std::vector<int>& values) {
    std::string out;
    for (const int v : values) out += fmt::format("{}{}", out.empty() ? "" : ",", v);
    return out;
}

ELASTIC_DECL event_metadata agent_events::common() const {
    event_metadata m;
    m["run_id"] = run_id_;
    m["role"] = role_;
    m["hostname"] = hostname_;
    return m;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/agent/agent_events.hpp ----
// ---- begin elastic/agent/plan.hpp ----
// What the agent settles before anything starts: the checks of its worker_spec and
// rendezvous_parameters (a usage_error naming what is wrong or not implemented yet), and where
// the workers' store goes (store_plan).


#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace elastic::inline v0::detail::agent {

/// How the agent hosts the workers' store: where it binds and what MASTER_ADDR says.
struct store_plan {
    std::string bind_host;
    std::uint16_t port = 0;  ///< 0: a port the kernel chooses, anew for each attempt
    std::string master_addr;
};

ELASTIC_DECL store_plan plan_store(const rendezvous_parameters& c);

ELASTIC_DECL std::string nnodes_text(const node_range& n);

/// Refuses, before anything starts, what this agent does not implement yet (a later issue
/// does): a usage_error (exit 2) saying so. Never parse-and-ignore.
ELASTIC_DECL void check_supported(const rendezvous_parameters& c);

/// A worker_spec filled in C++ (the command line's are validated already): a count of workers
/// and a grace the agent can use, else a usage_error naming the field.
ELASTIC_DECL void check_spec(const worker_spec& w);

}  // namespace elastic::inline v0::detail::agent

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::agent {

ELASTIC_DECL store_plan plan_store(const rendezvous_parameters& c) {
    const auto& endpoint = c.endpoint;
    store_plan plan;
    if (uses_node_rendezvous(c)) {
        // Several nodes: each hosts a fresh workers' store per attempt on a port the kernel picks
        // and advertises it; the round names group rank 0's as MASTER_ADDR:MASTER_PORT
        // (docs/rendezvous.md). The rendezvous endpoint's port is the rendezvous store's.
        const auto where = advertise(c);
        plan.bind_host = where.bind_host;
        plan.master_addr = where.addr;
        return plan;
    }
    // Static: only a port given explicitly (--master-port or --rdzv-endpoint) is bound; torchrun's
    // default 29500 would make two jobs on one host collide, and one node needs no agreed port.
    // c10d: the endpoint's port (0 under --standalone).
    plan.port = c.port_given ? endpoint.port.value_or(0) : 0;
    if (rendezvous::is_loopback(endpoint.host)) {
        // "localhost" may resolve to ::1 for one process and 127.0.0.1 for another: bind and
        // advertise the literal.
        plan.bind_host = rendezvous::is_ip_literal(endpoint.host) ? endpoint.host : std::string("127.0.0.1");
        plan.master_addr = plan.bind_host;
    } else {
        // A name or address of this host: listen where it resolves to on this node (a name
        // resolving to none of this node's addresses: every interface, as TCPStore does).
        plan.bind_host = rendezvous::bind_address_for(endpoint.host);
        plan.master_addr = endpoint.host;
    }
    if (c.local_addr) plan.master_addr = *c.local_addr;
    return plan;
}

ELASTIC_DECL std::string nnodes_text(const node_range& n) {
    return n.min == n.max ? fmt::format("{}", n.min) : fmt::format("{}:{}", n.min, n.max);
}

ELASTIC_DECL void check_supported(const rendezvous_parameters& c) {
    const auto refuse = [](std::string_view what, std::string_view why) {
        throw usage_error{fmt::format("{}: not implemented yet ({})", what, why)};
    };
    if (c.nnodes.min != c.nnodes.max && c.backend == rendezvous_backend::static_) {
        throw usage_error{fmt::format("--nnodes={} with --rdzv-backend=static: the static rendezvous has fixed "
                                      "membership; use --rdzv-backend=c10d for MIN < MAX, or --nnodes={}",
                                      nnodes_text(c.nnodes), c.nnodes.max)};
    }
    if (c.backend == rendezvous_backend::c10d && c.settings.is_host && !*c.settings.is_host &&
        c.endpoint.port.value_or(0) == 0) {
        throw usage_error{fmt::format("--rdzv-endpoint={} with --rdzv-conf is_host=false: port 0 names no store to "
                                      "join; give the port the hosting agent listens on",
                                      to_string(c.endpoint))};
    }
    if (c.run_id.empty()) {
        throw usage_error{"--rdzv-id: must not be empty (it names the job in the rendezvous store)"};
    }
    if (fmt::format("/{}/", c.run_id).find("/__lease__/") != std::string::npos) {
        // The store keeps leases under <group>/__lease__/: an id with such a segment would put
        // the job's own keys where the store reads lease names.
        throw usage_error{fmt::format("--rdzv-id={}: a path segment '__lease__' is reserved for the rendezvous "
                                      "store's leases; choose an id without one",
                                      c.run_id)};
    }
    if (c.backend == rendezvous_backend::etcd_v3) {
        refuse("--rdzv-backend=etcd-v3", "the etcd rendezvous comes later; use c10d or static");
    }
}

ELASTIC_DECL void check_spec(const worker_spec& w) {
    if (w.nproc_per_node < 1) {
        throw usage_error{fmt::format("worker_spec.nproc_per_node={}: must be 1 or more", w.nproc_per_node)};
    }
    if (w.shutdown_timeout < std::chrono::milliseconds::zero()) {
        throw usage_error{
            fmt::format("worker_spec.shutdown_timeout={} ms: must be 0 or more", w.shutdown_timeout.count())};
    }
}

}  // namespace elastic::inline v0::detail::agent

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/agent/plan.hpp ----
// ---- begin elastic/agent/worker_output.hpp ----
// worker_output: one worker's standard output and error for one attempt — its routes, its log
// files, its pipes, and the relays that copy them to the tail, the files and the console.


#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// An attempt's filtered_stdout.log and filtered_stderr.log (--duplicate-*-filters), shared by
/// its workers: the descriptors (-1: none) and the record of their lost writes.
struct filtered_logs {
    int out_fd = -1;
    int err_fd = -1;
    log_file_writes* out_writes = nullptr;
    log_file_writes* err_writes = nullptr;
};

/// One worker's output in one attempt (docs/logs.md). prepare() before the spawn decides, per
/// stream, what the child gets: stderr is always a pipe (the failure report's tail needs every
/// byte, whatever -r/-t say); stdout is the agent's own stdout when it goes to the console
/// unprefixed and to no file (the worker sees the terminal, as under torchrun), /dev/null when it
/// goes nowhere, and a pipe otherwise: every byte of a log file is written by the agent, which
/// so sees every write that fails. start() after the spawn runs one relay per pipe.
template <class Defer = void>
class basic_worker_output {
public:
    /// `index`: the worker's local rank (its slot, also under --virtual-local-rank); `rank_dir`:
    /// `attempt_<n>/<index>/`, empty when the tree is disabled. Opens the files; sets `how.out`
    /// and `how.err`. Throws log_error. `filtered`: the attempt's filtered logs, which get this
    /// worker's lines that match config's duplicate filters when it tees that stream; they must
    /// outlive the relays.
    void prepare(const worker_spec& config, int index, int global_rank, const std::filesystem::path& rank_dir,
                 spawn_options& how, const filtered_logs& filtered = {}) {
        routes_ = route_streams(config, index);
        prefix_ = format_log_prefix(config.log_line_prefix_template, config.role, index, global_rank);
        const auto tees = [&](std_streams which) {
            return (static_cast<unsigned>(config.tee.for_rank(index)) & static_cast<unsigned>(which)) != 0;
        };
        filtered_ = filtered;
        out_filters_ = filtered.out_fd >= 0 && tees(std_streams::out) ? config.duplicate_stdout_filters
                                                                      : std::vector<std::string>{};
        err_filters_ = filtered.err_fd >= 0 && tees(std_streams::err) ? config.duplicate_stderr_filters
                                                                      : std::vector<std::string>{};
        if (out_filters_.empty()) filtered_.out_fd = -1;
        if (err_filters_.empty()) filtered_.err_fd = -1;
        const auto open = [&](const char* stream, detail::process::owned_fd& fd, log_file_writes& writes) {
            const auto path = rank_dir / fmt::format("{}.log", stream);
            fd = open_log_file(path);
            writes.name = fmt::format("local_rank {}'s {} log file {}", index, stream, path.string());
        };
        if (routes_.out.file && !rank_dir.empty()) open("stdout", out_file_, out_writes_);
        if (routes_.err.file && !rank_dir.empty()) open("stderr", err_file_, err_writes_);
        if (routes_.out.console == console_copy::raw && !out_file_ && filtered_.out_fd < 0) {
            how.out = stdio::inherit();
        } else if (routes_.out.console == console_copy::none && !out_file_ && filtered_.out_fd < 0) {
            how.out = stdio::null();
        } else {
            how.out = stdio::pipe();
        }
        how.err = stdio::pipe();
    }

    /// Takes the pipes from `child` and starts their relays on `executor`, each counted by
    /// `relays` and holding `keep_alive` (which must own this object, `tail` and `relays`). The
    /// first failed write to a log file is a warning on `log` (a copy: the relays may outlive
    /// the agent's own).
    void start(child_process& child, const asio::any_io_executor& executor, detail::task_latch& relays,
               const std::shared_ptr<void>& keep_alive, stderr_tail& tail, const agent_log& log) {
        for (auto* writes : {&out_writes_, &err_writes_}) {
            writes->first_failure = [log](const log_file_writes& w) {
                log.warning(fmt::format("cannot write {}: {}; what the worker writes to it from now on is lost "
                                        "until writes succeed again (the console copy and the failure report are "
                                        "not affected); free space on that file system, or move --log-dir",
                                        w.name, std::strerror(w.first_error)));
            };
        }
        out_pipe_ = child.take_stdout();
        err_pipe_ = child.take_stderr();
        const auto console_fd = [](const stream_route& r, int fd) { return r.console == console_copy::none ? -1 : fd; };
        const auto prefix = [this](const stream_route& r) {
            return r.console == console_copy::prefixed ? prefix_ : std::string();
        };
        if (out_pipe_) {
            run(executor, relays, keep_alive, *out_pipe_,
                stream_copies{nullptr, out_file_.get(), &out_writes_, console_fd(routes_.out, 1), prefix(routes_.out),
                              &relays, filtered_.out_fd, out_filters_, prefix_, filtered_.out_writes});
        }
        if (err_pipe_) {
            run(executor, relays, keep_alive, *err_pipe_,
                stream_copies{&tail, err_file_.get(), &err_writes_, console_fd(routes_.err, 2), prefix(routes_.err),
                              &relays, filtered_.err_fd, err_filters_, prefix_, filtered_.err_writes});
        }
    }

    /// Closes the pipes (a relay pending on one ends): for pipes a descendant of the worker holds
    /// open after the worker's group ended.
    void close() noexcept {
        std::error_code ignored;
        if (out_pipe_) out_pipe_->close(ignored);
        if (err_pipe_) err_pipe_->close(ignored);
    }

    [[nodiscard]] const worker_routes& routes() const noexcept { return routes_; }
    /// The writes to the stdout and stderr log files (lost_bytes 0: complete, or no file).
    [[nodiscard]] const log_file_writes& stdout_writes() const noexcept { return out_writes_; }
    [[nodiscard]] const log_file_writes& stderr_writes() const noexcept { return err_writes_; }
    [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }

private:
    static void run(const asio::any_io_executor& executor, detail::task_latch& relays,
                    const std::shared_ptr<void>& keep_alive, asio::posix::stream_descriptor& pipe,
                    stream_copies copies) {
        relays.add();
        asio::co_spawn(
            executor,
            [keep_alive, &pipe, copies = std::move(copies)]() mutable -> asio::awaitable<void> {
                co_await relay_stream(pipe, std::move(copies));
            },
            [keep_alive, &relays](std::exception_ptr) { relays.done(); });
    }

    worker_routes routes_;
    std::string prefix_;
    filtered_logs filtered_;
    std::vector<std::string> out_filters_;
    std::vector<std::string> err_filters_;
    detail::process::owned_fd out_file_;
    detail::process::owned_fd err_file_;
    log_file_writes out_writes_;
    log_file_writes err_writes_;
    std::optional<asio::posix::stream_descriptor> out_pipe_;
    std::optional<asio::posix::stream_descriptor> err_pipe_;
};
using worker_output = basic_worker_output<>;

}  // namespace elastic::inline v0
// ---- end elastic/agent/worker_output.hpp ----
// ---- begin elastic/agent/worker_group.hpp ----
// worker_group: one attempt's workers on one node — started together with torchrun's
// environment and their output routed, watched for the first failure, stopped (a signal, then
// SIGKILL after the grace), their output drained, and their failure collected for the policy.


#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// The agent could not do its own work (a directory, a port, a worker that cannot be started
/// after validation). elasticrun exits with exit_codes::internal (251) and the message.
class agent_error : public error {
public:
    using error::error;
};

/// What the workers of one attempt are told, and where their files go.
struct group_attempt {
    /// What every worker is told; start() sets each one's error_file under `dir`.
    attempt_settings told;
    /// attempt_<n>/ of the log tree (each worker's files under <local_rank>/); empty: no files.
    std::filesystem::path dir;
    /// The ranks of each local worker, one per worker (assign_worker() on one node).
    std::vector<worker_assignment> ranks;
};

namespace detail::agent {

/// One worker of the attempt.
struct worker_slot {
    worker_assignment assignment;
    std::string error_file;
    stderr_tail tail;
    worker_output output;  ///< its stdout and stderr: routes, log files, pipes, relays
};

/// What the attempt's stream relays share with the group; they may outlive it.
struct attempt_state {
    attempt_state(const asio::any_io_executor& executor, std::size_t workers) : slots(workers), relays(executor) {}
    std::vector<worker_slot> slots;
    detail::task_latch relays;
    /// The attempt's filtered_stdout.log and filtered_stderr.log (--duplicate-*-filters), which
    /// every rank's relays write: held here, with the relays.
    detail::process::owned_fd filtered_out;
    detail::process::owned_fd filtered_err;
    log_file_writes filtered_out_writes;
    log_file_writes filtered_err_writes;
};

}  // namespace detail::agent

/// One attempt's workers. start() them, await watch() (the first failure, or all succeeded),
/// stop() them when the attempt must end early, then close() (the event log's exits, the output
/// drained) before the next attempt; failure() is what the restart policy is given. Dropping the
/// group kills whatever still runs (SIGKILL to each worker's process group), so no path — an
/// exception included — leaves a worker behind. Use from the executor's thread.
template <class Defer = void>
class basic_worker_group {
public:
    /// `spec`, `command`, `events` and `log` must outlive the group.
    basic_worker_group(asio::any_io_executor executor, const worker_spec& spec, const worker_command& command,
                       agent_events& events, const agent_log& log)
        : executor_(std::move(executor)),
          spec_(&spec),
          command_(&command),
          events_(&events),
          log_(&log),
          state_(std::make_shared<detail::agent::attempt_state>(executor_, attempt_size(spec))) {}

    basic_worker_group(const basic_worker_group&) = delete;
    basic_worker_group& operator=(const basic_worker_group&) = delete;

    /// Starts every worker of `attempt` with `env` (the agent's environment) under torchrun's
    /// contract. A worker that cannot be started stops the ones started and throws: usage_error
    /// when its program cannot run (not executable, neither a binary nor a #! script, a missing
    /// #! interpreter), agent_error otherwise.
    asio::awaitable<void> start(const group_attempt& attempt, const environment& env) {
        restarts_ = attempt.told.restart_count;
        auto& slots = state_->slots;
        workers_.reserve(slots.size());
        std::optional<std::string> spawn_failure;
        bool program_fault = false;
        if (!attempt.dir.empty()) {
            // Opened whenever filters are given, as torchrun does: an empty file says that no
            // line matched (or that no rank tees the stream; the launcher warns of that).
            const auto open = [&](const char* name, detail::process::owned_fd& fd, log_file_writes& writes) {
                const auto path = attempt.dir / name;
                fd = open_log_file(path);
                writes.name = fmt::format("the filtered log file {}", path.string());
                writes.first_failure = [log = *log_](const log_file_writes& w) {
                    log.warning(fmt::format("cannot write {}: {}; matching lines are lost from it until writes "
                                            "succeed again (the workers' own log files and the console are not "
                                            "affected); free space on that file system, or move --log-dir",
                                            w.name, std::strerror(w.first_error)));
                };
            };
            if (!spec_->duplicate_stdout_filters.empty()) {
                open("filtered_stdout.log", state_->filtered_out, state_->filtered_out_writes);
            }
            if (!spec_->duplicate_stderr_filters.empty()) {
                open("filtered_stderr.log", state_->filtered_err, state_->filtered_err_writes);
            }
        }
        const filtered_logs filtered{state_->filtered_out.get(), state_->filtered_err.get(),
                                     &state_->filtered_out_writes, &state_->filtered_err_writes};
        for (std::size_t i = 0; i < slots.size(); ++i) {
            const int local_rank = static_cast<int>(i);
            auto& slot = slots[i];
            slot.assignment = i < attempt.ranks.size() ? attempt.ranks[i]
                                                       : assign_worker(local_rank, spec_->nproc_per_node);
            const auto rank_dir = attempt.dir.empty() ? attempt.dir : attempt.dir / fmt::format("{}", i);
            slot.error_file = rank_dir.empty() ? std::string() : (rank_dir / "error.json").string();
            auto told = attempt.told;
            told.error_file = slot.error_file;
            spawn_options how;
            how.program = command_->path;
            auto argv = command_->argv_for(local_rank);
            how.args.assign(argv.begin() + 1, argv.end());
            how.env = environment_entries(worker_environment(*spec_, env, slot.assignment, told));
            try {
                slot.output.prepare(*spec_, local_rank, slot.assignment.global_rank, rank_dir, how, filtered);
                workers_.push_back(elastic::spawn(executor_, how));
                events_->worker_started(restarts_, slot.assignment, static_cast<long>(workers_.back().pid()));
            } catch (const spawn_error& e) {
                spawn_failure = fmt::format("cannot start local_rank {}: {}", i, e.what());
                program_fault = e.program_fault();
                break;
            } catch (const std::exception& e) {
                spawn_failure = fmt::format("cannot start local_rank {}: {}", i, e.what());
                break;
            }
            slot.output.start(workers_.back(), executor_, state_->relays, state_, slot.tail, *log_);
        }
        started_ = std::chrono::steady_clock::now();
        if (const auto why = detail::process::cgroups::instance().reason_once(); !why.empty()) {
            log_->info(fmt::format("workers get no cgroup of their own, only their process groups contain them: {}; "
                                   "a daemon a worker starts can outlive it",
                                   why));
        }
        if (spawn_failure) {
            co_await stop(SIGTERM);
            co_await close();
            // A program that cannot run is the command line's to fix: a usage error (exit 2).
            if (program_fault) throw usage_error(*spawn_failure);
            throw agent_error(*spawn_failure);
        }
    }

    /// The index of the first worker that fails, or size() once every worker exited 0.
    asio::awaitable<std::size_t> watch() {
        for (;;) {
            const std::size_t i = co_await wait_any(std::span<child_process>(workers_));
            if (i >= workers_.size()) co_return workers_.size();
            if (!workers_[i].status()->status.success()) co_return i;
        }
    }

    /// Stops every worker: `sig` to each process group, SIGKILL after spec.shutdown_timeout.
    /// Processes that outlive SIGKILL are logged. The first call also notes which workers had
    /// ended on their own before it (failure() reports the others as stopped by the agent).
    asio::awaitable<stop_result> stop(int sig) {
        if (exited_before_.empty()) {
            exited_before_.resize(workers_.size());
            for (std::size_t i = 0; i < workers_.size(); ++i) exited_before_[i] = workers_[i].check_exit();
        }
        auto result = co_await elastic::stop(std::span<child_process>(workers_),
                                             {sig, spec_->shutdown_timeout, std::chrono::seconds(10)});
        if (!result.unkillable.empty()) {
            std::string pids;
            for (const auto pid : result.unkillable) pids += fmt::format("{}{}", pids.empty() ? "" : " ", pid);
            log_->error(fmt::format("processes still present after SIGKILL (uninterruptible sleep?): {}", pids));
        }
        co_return result;
    }

    /// After the workers ended (or were stopped): records their exits in the event log and
    /// awaits the end of their relayed output. A descendant that left its worker's process
    /// group may hold a pipe open forever: after the workers are gone, the pipes get 2 s without
    /// any byte arriving to reach end of file, then they are closed. Output still flowing is read
    /// on (what the pipes held when the workers ended takes milliseconds), for at most 30 s.
    asio::awaitable<void> close() {
        using namespace asio::experimental::awaitable_operators;
        events_->workers_exited(restarts_, workers_);
        auto& relays = state_->relays;
        asio::steady_timer bound(executor_);
        for (int round = 0; relays.count() != 0; ++round) {
            const auto seen = relays.progress();
            bound.expires_after(std::chrono::seconds(2));
            auto which = co_await (relays.wait() || bound.async_wait(detail::as_tuple_awaitable<Defer>));
            if (which.index() == 0 || (relays.progress() != seen && round < 15)) continue;
            log_->warning(fmt::format("a worker's output pipe stayed open after its process group ended (a descendant "
                                      "that left the group?); {}; closing it",
                                      relays.progress() != seen ? "still written to after 30 s"
                                                                : "nothing written for 2 s"));
            for (auto& slot : state_->slots) slot.output.close();
            co_await relays.wait();
        }
        for (const auto& line : incomplete_logs())
            log_->error(fmt::format("{} is incomplete: {}", line.first, line.second));
    }

    /// After close(): each log file of the attempt that misses bytes of its stream, with how
    /// many and why ({"local_rank 1's stdout log file PATH", "9437184 bytes not written (No
    /// space left on device)"}); the filtered files last.
    [[nodiscard]] std::vector<std::pair<std::string, std::string>> incomplete_logs() const {
        std::vector<std::pair<std::string, std::string>> out;
        const auto add = [&out](const log_file_writes& w) {
            if (w.lost_bytes == 0) return;
            out.emplace_back(w.name,
                             fmt::format("{} bytes not written ({})", w.lost_bytes, std::strerror(w.first_error)));
        };
        for (const auto& slot : state_->slots) {
            add(slot.output.stdout_writes());
            add(slot.output.stderr_writes());
        }
        add(state_->filtered_out_writes);
        add(state_->filtered_err_writes);
        return out;
    }

    /// The group's failure for the restart policy, after stop(): every worker that did not
    /// exit 0 on its own — `first` (watch()'s answer) and the others that failed before the
    /// stop as failed, the rest as stopped by the agent — with its error file and stderr tail.
    [[nodiscard]] group_failure failure(std::size_t first, const std::string& host) const {
        group_failure failure;
        failure.restarts = restarts_;
        failure.started = started_;
        failure.failed = first < workers_.size() && workers_[first].status() ? workers_[first].status()->steady_time
                                                                             : started_;
        for (std::size_t i = 0; i < workers_.size(); ++i) {
            const auto& status = workers_[i].status();
            const bool before = i < exited_before_.size() && exited_before_[i];
            if (!status || (before && status->status.success())) continue;
            const auto& slot = state_->slots[i];
            worker_failure f;
            f.local_rank = slot.assignment.local_rank;
            f.global_rank = slot.assignment.global_rank;
            f.role = spec_->role;
            f.pid = static_cast<long>(workers_[i].pid());
            f.host = host;
            f.status = status->status;
            f.observed_steady = status->steady_time;
            f.observed_system = status->system_time;
            f.error_file = read_error_file(slot.error_file);
            f.stderr_tail = slot.tail.snapshot();
            // Failed: exited unsuccessfully before the agent sent the stop signal. Anything
            // that ended after it was ended by the agent, whatever its exit code.
            f.state = (before && !status->status.success()) ? failure_state::failed : failure_state::stopped_by_agent;
            failure.workers.push_back(std::move(f));
        }
        return failure;
    }

    /// The workers, in local-rank order (fewer than spec.nproc_per_node only while starting).
    [[nodiscard]] std::span<child_process> workers() noexcept { return workers_; }
    [[nodiscard]] std::size_t size() const noexcept { return workers_.size(); }
    /// The ranks of local worker `i`.
    [[nodiscard]] const worker_assignment& assignment(std::size_t i) const { return state_->slots.at(i).assignment; }
    /// When every worker had been started.
    [[nodiscard]] std::chrono::steady_clock::time_point started() const noexcept { return started_; }

private:
    static std::size_t attempt_size(const worker_spec& spec) {
        return spec.nproc_per_node > 0 ? static_cast<std::size_t>(spec.nproc_per_node) : 0;
    }

    asio::any_io_executor executor_;
    const worker_spec* spec_;
    const worker_command* command_;
    agent_events* events_;
    const agent_log* log_;
    // Shared with the stream relays, which may outlive the group if its owner unwinds.
    std::shared_ptr<detail::agent::attempt_state> state_;
    std::vector<child_process> workers_;  // after state_: destroyed (killed) first
    std::vector<bool> exited_before_;
    std::chrono::steady_clock::time_point started_{};
    int restarts_ = 0;
};
using worker_group = basic_worker_group<>;

}  // namespace elastic::inline v0
// ---- end elastic/agent/worker_group.hpp ----

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

#include <unistd.h>

namespace elastic::inline v0 {

namespace detail::agent {

/// How an attempt ended.
struct attempt_outcome {
    enum class kind { succeeded, failed, signaled, aborted };  ///< aborted: by another node
    kind how = kind::succeeded;
    int signal = 0;         ///< for signaled
    group_failure failure;  ///< for failed
};

/// The rendezvous store was lost while the workers ran (instead of an abort notice): the agent
/// stops the workers, then moves the store or ends with a rendezvous_error saying `reason`.
struct store_lost {
    std::string reason;
};

/// The signals the agent handles, raced with its other waits (`||`) without losing one. A
/// signal_set wait that completes with a signal in the same turn as the other side of a race
/// is dropped by the race with its result; here the signal is kept when it arrives and only
/// take() consumes it, so the next wait completes with it at once.
template <class Defer = void>
class signal_inbox {
public:
    explicit signal_inbox(const asio::any_io_executor& executor) : set_(executor) {}

    void add(int sig) { set_.add(sig); }

    /// The next signal (one received before and not taken: at once). It stays received until
    /// take().
    asio::awaitable<int> next() {
        if (!received_) received_ = co_await set_.async_wait(detail::use_awaitable<Defer>);
        co_return *received_;
    }

    /// The received signal, consumed: call it once next() won its race.
    int take() noexcept { return std::exchange(received_, std::nullopt).value_or(0); }

private:
    asio::signal_set set_;
    std::optional<int> received_;
};

/// A loop over the job `Job` (local_agent::run_loop; the agent_loop concept is both models).
template <class Loop, class Job>
concept loop_over = requires(Loop& loop, Job& job) {
    { loop(job) } -> std::same_as<asio::awaitable<int>>;
};

}  // namespace detail::agent

/// One node's agent, in a job of one node or many: for each attempt it hosts a fresh store for
/// the workers on a port of its own (so no key of an earlier attempt is ever visible), joins the
/// round, starts `--nproc-per-node` workers with torchrun's environment, and awaits — as events,
/// with no polling — the first failure, the end of all workers, the round's abort, or a signal.
/// A failure stops the group (its signal, then SIGKILL after `--shutdown-timeout`) and the node
/// that reported it first decides with its restart policy. A signal is forwarded to the group,
/// the grace is awaited, and run() returns 128 + N.
///
/// Use it from one thread (the io_context's); run() once.
template <class Defer = void>
class basic_local_agent {
public:
    /// `workers`: what runs on this node; `rendezvous`: how this node meets the others (one
    /// node: nnodes 1, and the endpoint's port is the workers' store's when given); `options`:
    /// the agent's log level and event log; `env`: the agent's environment, which every worker
    /// inherits. Throws usage_error for what is not implemented yet and for a program that
    /// cannot run. launch_config gives all three: `local_agent(ex, c.workers(), c.rendezvous(),
    /// c.agent(), env)`.
    basic_local_agent(asio::any_io_executor executor, worker_spec workers, rendezvous_parameters rendezvous,
                      const agent_options& options, environment env, std::string name = "elasticrun")
        : executor_(std::move(executor)),
          spec_(std::move(workers)),
          params_(std::move(rendezvous)),
          env_(std::move(env)),
          log_(std::move(name), options.agent_log_level) {
        detail::agent::check_spec(spec_);
        detail::agent::check_supported(params_);
        // Before anything reads env_: the workers inherit it, and must not inherit the secret.
        load_rendezvous_secret(params_.settings, env_, [this](std::string_view line) { log_.warning(line); });
        command_ = resolve_program(spec_.program, env_);
        store_ = detail::agent::plan_store(params_);
        several_ = uses_node_rendezvous(params_);
        // Opens --event-log-handler=file:PATH (usage_error if it cannot).
        events_ = agent_events(spec_, params_, options.event_log_handler);
    }

    /// What one attempt came to; each kind names the job<R> step that concludes it.
    struct step {
        enum class kind {
            succeeded,  ///< this node's workers all succeeded: finish()
            failed,     ///< a worker here failed first, and this node decides for the job: decide()
            follows,    ///< another node reported a failure first: follow() its decision
            signaled,   ///< this agent received `signal` (its workers are stopped): interrupted()
            again,      ///< the membership changed, or the rendezvous store was recovered: attempt() again
        };
        kind how = kind::again;
        int signal = 0;                ///< signaled
        group_failure failure;         ///< failed; follows, when a worker of this node failed too
        bool own_failure = false;      ///< `failure` holds this node's failed group
        std::uint64_t attempt_id = 0;  ///< set by job::attempt(); the conclusions check it

        /// The kind in one word ("succeeded", "failed", "follows", "signaled", "again").
        [[nodiscard]] static std::string_view name(kind k) noexcept {
            constexpr std::string_view names[] = {"succeeded", "failed", "follows", "signaled", "again"};
            return names[static_cast<int>(k)];
        }
    };

    /// One node's part in a running job, over the rendezvous `R`: the steps a loop is made of.
    /// Each awaits the agent's signals too (a signal ends the step early, as the step says).
    /// `R` is an agent_rendezvous (run_loop's constraint; clang 14 crashes on a constrained
    /// member template named in another member's requires-clause).
    template <class R>
    class job {
    public:
        /// Joins the next round, starts the workers, supervises them to the first failure, the
        /// end of every worker, the round's abort or a signal, and stops and closes the group.
        /// A failure here is reported to every node (failed: this node's report came first).
        /// The step must be concluded (unless it is `again`) before the next attempt().
        asio::awaitable<step> attempt() {
            if (open_) {
                throw agent_error(fmt::format("job::attempt() while attempt {}'s step is not concluded: finish, "
                                              "decide, follow or interrupted comes first (the agent's loop is wrong)",
                                              attempts_));
            }
            auto s = co_await agent_.attempt_step(rdzv_, signals_);
            s.attempt_id = ++attempts_;
            open_ = s.how != step::kind::again;
            open_how_ = s.how;
            co_return s;
        }

        /// succeeded: the exit barrier. The job's exit code (0, or 128 + N for a signal
        /// meanwhile), or — when the round was aborted after all — what follow() returns.
        asio::awaitable<std::optional<int>> finish(step& s) {
            conclude(s, "finish");
            co_return co_await agent_.finish_step(rdzv_, signals_, s);
        }

        /// failed: asks `policy` (raced with the signals) and publishes its answer as the job's.
        /// The exit code when the job stops (the root cause's; 128 + N for a signal meanwhile),
        /// nullopt when it restarts.
        template <restart_policy P>
        asio::awaitable<std::optional<int>> decide(step& s, P& policy) {
            conclude(s, "decide");
            co_return co_await agent_.decide_step(rdzv_, signals_, s, policy);
        }

        /// follows: the deciding node's answer, as decide() returns it.
        asio::awaitable<std::optional<int>> follow(step& s) {
            conclude(s, "follow");
            co_return co_await agent_.follow_step(rdzv_, signals_, s);
        }

        /// signaled: tells the other nodes (the job stops, or re-forms without this node under
        /// elastic membership) and returns 128 + N.
        asio::awaitable<int> interrupted(const step& s) {
            conclude(s, "interrupted");
            co_return co_await agent_.interrupted_step(rdzv_, s);
        }

        /// Job-wide restarts so far (the workers' TORCHELASTIC_RESTART_COUNT).
        [[nodiscard]] int restart_count() const { return rdzv_.restart_count(); }
        [[nodiscard]] basic_local_agent& agent() noexcept { return agent_; }
        [[nodiscard]] R& rendezvous() noexcept { return rdzv_; }

    private:
        friend class basic_local_agent;
        job(basic_local_agent& agent, R& rdzv, detail::agent::signal_inbox<Defer>& signals)
            : agent_(agent), rdzv_(rdzv), signals_(signals) {}

        // Each attempt is concluded once, by the step its kind names (checked by the agent).
        void conclude(const step& s, std::string_view call) {
            if (!open_ || s.attempt_id != attempts_) {
                throw agent_error(fmt::format("job::{}() on a step that is not the open one (attempt {} of {}{}): "
                                              "each attempt is concluded once (the agent's loop is wrong)",
                                              call, s.attempt_id, attempts_, open_ ? "" : ", none open"));
            }
            open_ = false;
        }

        basic_local_agent& agent_;
        R& rdzv_;
        detail::agent::signal_inbox<Defer>& signals_;
        std::uint64_t attempts_ = 0;                        ///< attempt() calls so far
        bool open_ = false;                                 ///< the last attempt's step awaits its conclusion
        typename step::kind open_how_ = step::kind::again;  ///< that step's kind
    };

    /// Runs the job to its end and returns elasticrun's exit code: 0 when every worker
    /// succeeded; the root cause's code (128 + N for signal N) when the policy stops after a
    /// failure; 128 + N when the agent received signal N. Throws agent_error when the agent
    /// itself cannot go on (workers are stopped first). The loop is policy_loop(job, policy)
    /// over a single_node_rendezvous for one node, a tcp_rendezvous (static or c10d) for several.
    template <restart_policy Policy>
    asio::awaitable<int> run(Policy& policy) {
        auto loop = [&policy]<agent_rendezvous R>(job<R>& j) { return policy_loop(j, policy); };
        co_return co_await run_loop(loop);
    }

    /// The same with a loop of the caller's (an agent_loop): `loop(job)` is awaited once, with
    /// the job joined, and returns the exit code; it goes through the job with job<R>'s steps
    /// (see policy_loop, the loop run() uses, and examples/custom_agent.cpp). It is called with
    /// both rendezvous models, so its call is a template whose return type is written out,
    /// `asio::awaitable<int>` (not deduced). `loop` must outlive the awaitable. A loop that
    /// returns with an attempt's step not concluded gets agent_error.
    // clang-format off
    template <class Loop>
        requires detail::agent::loop_over<Loop, job<single_node_rendezvous>> &&
                 detail::agent::loop_over<Loop, job<tcp_rendezvous>>
    asio::awaitable<int> run_loop(Loop& loop) {
        // clang-format on
        if (several_) {
            tcp_rendezvous rdzv(executor_, params_, [this](std::string_view line) { log_.warning(line); });
            co_return co_await run_loop(loop, rdzv);
        }
        single_node_rendezvous rdzv;
        co_return co_await run_loop(loop, rdzv);
    }

    /// The same over a rendezvous of the caller's. The constructor's rendezvous_parameters still
    /// decide what the agent does as one node or several (the log lines, the workers' store's
    /// address and allow-list, the node's name), so they must describe the same job: one node
    /// for single_node_rendezvous, several (uses_node_rendezvous) for any other model. It joins
    /// `rdzv`, keeps its membership for as long as `loop` runs, and stops it before returning.
    // clang-format off
    template <class Loop, agent_rendezvous R>
        requires detail::agent::loop_over<Loop, job<R>>
    asio::awaitable<int> run_loop(Loop& loop, R& rdzv) {
        // clang-format on
        using namespace asio::experimental::awaitable_operators;
        // Installed first: a signal during start-up or a restart is handled like any other.
        detail::agent::signal_inbox<Defer> signals(executor_);
        prepare_agent_signals();
        // The stores this agent hosts hold a descriptor per client; workers get the old limit
        // back when they are spawned.
        detail::process::raise_open_files_limit();
        for (const int s : spec_.signals_to_handle) signals.add(s);
        if (sets_omp_num_threads(spec_, env_)) log_.warning(omp_warning());

        // Hosts or reaches the job's store, then holds this node's liveness there.
        const auto me = this_node();
        auto joined = co_await (detail::settle(rdzv.join(me)) || signals.next());
        if (joined.index() == 1) {
            rdzv.stop();
            co_return 128 + signals.take();
        }
        try {
            (void)std::get<0>(joined).take();
        } catch (...) {
            rdzv.stop();
            throw;
        }
        // The loop, beside the observer of the job's membership (lost nodes), which runs for as
        // long as this node is in the job.
        job<R> j(*this, rdzv, signals);
        auto both = co_await (detail::settle(loop(j)) || rdzv.keep_membership());
        rdzv.stop();
        round_store_.reset();
        report_incomplete_logs();  // however the loop ended
        if (both.index() == 1) throw agent_error("the membership observer ended on its own");
        auto& rounds = std::get<0>(both);
        if (const auto lost = store_loss(rounds.error)) throw rendezvous_error(*lost);
        try {
            const int code = rounds.take();
            if (j.open_) {
                throw agent_error(fmt::format("the agent's loop returned {} with attempt {}'s step ({}) not "
                                              "concluded: finish, decide, follow or interrupted comes first "
                                              "(the agent's loop is wrong)",
                                              code, j.attempts_, step::name(j.open_how_)));
            }
            co_return code;
        } catch (const rendezvous_closed& e) {
            log_.warning(fmt::format("[{}] {}; exiting 0", spec_.role, e.what()));
            co_return 0;
        }
    }

    /// The loop run(policy) runs: attempts until the job succeeds, stops or this agent is
    /// signalled; a failure here that reached the others first is decided by `policy`.
    template <agent_rendezvous R, restart_policy P>
    static asio::awaitable<int> policy_loop(job<R>& j, P& policy) {
        for (;;) {
            auto s = co_await j.attempt();
            std::optional<int> code;
            switch (s.how) {
                case step::kind::again: continue;
                case step::kind::signaled: co_return co_await j.interrupted(s);
                case step::kind::succeeded: code = co_await j.finish(s); break;
                case step::kind::failed: code = co_await j.decide(s, policy); break;
                case step::kind::follows: code = co_await j.follow(s); break;
            }
            if (code) co_return *code;
        }
    }

    /// Where the workers' store of the current (or last) attempt listens: MASTER_ADDR, MASTER_PORT.
    [[nodiscard]] const std::string& master_addr() const noexcept { return store_.master_addr; }
    [[nodiscard]] std::uint16_t master_port() const noexcept { return master_port_; }
    /// The event log (--event-log-handler); elastic::run records the shutdown through it.
    [[nodiscard]] agent_events& events() noexcept { return events_; }
    /// The agent's log (LOGLEVEL); elastic::run prints the launch configuration through it.
    [[nodiscard]] const agent_log& log() const noexcept { return log_; }

private:
    using attempt_outcome = detail::agent::attempt_outcome;
    using kind = attempt_outcome::kind;

    /// job<R>::attempt().
    template <agent_rendezvous R>
    asio::awaitable<step> attempt_step(R& rdzv, detail::agent::signal_inbox<Defer>& signals) {
        abort_won_ = false;
        last_abort_.reset();
        store_lost_.reset();
        step s;
        auto attempt = co_await detail::settle(run_attempt(rdzv, signals));
        if (const auto why = store_loss(attempt.error)) {
            co_await recover(rdzv, *why);
            co_return s;
        }
        auto outcome = attempt.take();
        if (outcome.how == kind::aborted && store_lost_) {
            co_await recover(rdzv, store_lost_->reason);
            co_return s;
        }
        if (outcome.how == kind::aborted && membership_changed()) {
            log_membership_restart(rdzv.restart_count());
            co_return s;
        }
        if (outcome.how == kind::signaled) {
            s.how = step::kind::signaled;
            s.signal = outcome.signal;
            co_return s;
        }
        if (outcome.how == kind::succeeded) {
            s.how = step::kind::succeeded;
            co_return s;
        }
        if (outcome.how == kind::failed) {
            for (const auto* f : outcome.failure.failures()) log_.error(failure_log_line(*f, spec_.program.target));
            s.failure = std::move(outcome.failure);
            s.own_failure = true;
        }
        if (membership_changed()) {
            // A membership change ended the round first: no decision, nothing counted.
            log_membership_restart(rdzv.restart_count());
            co_return s;
        }
        s.how = outcome.how == kind::failed && abort_won_ ? step::kind::failed : step::kind::follows;
        co_return s;
    }

    /// job<R>::finish(): the exit barrier.
    template <agent_rendezvous R>
    asio::awaitable<std::optional<int>> finish_step(R& rdzv, detail::agent::signal_inbox<Defer>& signals, step& s) {
        using namespace asio::experimental::awaitable_operators;
        expect(s, step::kind::succeeded, "finish");
        auto barrier = co_await (detail::settle(rdzv.finish(exit_barrier_timeout())) || signals.next());
        if (barrier.index() == 1) {
            const int sig = signals.take();
            co_await abort_for_signal(rdzv, sig);
            co_return 128 + sig;
        }
        if (const auto why = store_loss(std::get<0>(barrier).error)) {
            co_await recover(rdzv, *why);
            co_return std::nullopt;
        }
        auto result = std::get<0>(barrier).take();
        if (result.how != barrier_result::kind::aborted) {
            if (result.how == barrier_result::kind::timed_out) log_barrier_timeout(result);
            round_store_.reset();  // every node is done: no worker needs group rank 0's store
            events_.final_success(rdzv.restart_count(), host_);
            // The store's host may stay for nodes still working, for as long as they are: a
            // signal ends that.
            auto left = co_await (detail::settle(rdzv.leave()) || signals.next());
            remove_run_dir();
            if (left.index() == 1) {
                const int sig = signals.take();
                log_.warning(fmt::format("[{}] this node's workers succeeded; {} received while leaving the job (the "
                                         "rendezvous store hosted here may still serve other nodes): stopping",
                                         spec_.role, signal_to_string(sig)));
                co_return 128 + sig;
            }
            std::get<0>(left).take();
            co_return 0;
        }
        last_abort_ = result.abort;
        if (membership_changed()) {
            log_membership_restart(rdzv.restart_count());
            co_return std::nullopt;
        }
        log_.warning(fmt::format("[{}] this node's workers succeeded, but the job's round was aborted: {}", spec_.role,
                                 describe_abort()));
        co_return co_await await_decision(rdzv, signals, s);
    }

    /// job<R>::decide().
    template <agent_rendezvous R, restart_policy P>
    asio::awaitable<std::optional<int>> decide_step(R& rdzv, detail::agent::signal_inbox<Defer>& signals, step& s,
                                                    P& policy) {
        using namespace asio::experimental::awaitable_operators;
        expect(s, step::kind::failed, "decide");
        s.failure.restarts = rdzv.restart_count();
        // A policy about to wait before its restart (a backoff) says so first: the restart line
        // is logged as the wait starts, "restarting ... in 1.8 s", and not again after it.
        std::optional<std::string> announced;  // the reason announced
        s.failure.before_delay = [&](const restart_decision& d, std::chrono::steady_clock::duration delay) {
            announced = d.reason;
            // Several nodes: the restart this decision makes is the job's next one.
            log_.warning(fmt::format("[{}] {}; {}: {}", spec_.role, failed_what(s), d.reason,
                                     restarting(rdzv.restart_count() + 1, delay)));
        };
        auto decided = co_await (detail::settle(policy(s.failure)) || signals.next());
        s.failure.before_delay = nullptr;
        if (decided.index() == 1) {
            const int sig = signals.take();
            events_.decision_interrupted(rdzv.restart_count(), sig);
            log_.warning(fmt::format("received {} while deciding on a restart; the workers are stopped already; "
                                     "exiting with {}",
                                     signal_to_string(sig), 128 + sig));
            // Named: g++ 12 destroys a prvalue argument of a co_awaited call twice.
            const job_decision stop_now{false, 128 + sig,
                                        fmt::format("the deciding node received {}", signal_to_string(sig))};
            (void)co_await rdzv.decide(stop_now);  // this node exits on the signal whatever stands
            co_return 128 + sig;
        }
        const auto d = std::get<0>(decided).take();
        const auto* root = s.failure.root_cause();
        const job_decision decision{d.restart(), root ? launcher_exit_code(*root) : 1, d.reason};
        // What stands: this decision, or another node's regroup when this one was taken for lost.
        const auto standing = co_await rdzv.decide(decision);
        if (!standing.regroup) events_.decision(s.failure, d);
        // Announced already, unless what stands says something else (another node's decision, or
        // a policy that announced a restart and then answered otherwise).
        const bool said = announced && standing.restart && !standing.regroup && *announced == standing.reason;
        co_return co_await conclude(rdzv, s, standing, said);
    }

    /// job<R>::follow().
    template <agent_rendezvous R>
    asio::awaitable<std::optional<int>> follow_step(R& rdzv, detail::agent::signal_inbox<Defer>& signals, step& s) {
        expect(s, step::kind::follows, "follow");
        co_return co_await await_decision(rdzv, signals, s);
    }

    /// job<R>::interrupted().
    template <agent_rendezvous R>
    asio::awaitable<int> interrupted_step(R& rdzv, const step& s) {
        expect(s, step::kind::signaled, "interrupted");
        co_await abort_for_signal(rdzv, s.signal);
        co_return 128 + s.signal;
    }

    /// Another node decides the aborted round: its decision, awaited with the signals.
    template <agent_rendezvous R>
    asio::awaitable<std::optional<int>> await_decision(R& rdzv, detail::agent::signal_inbox<Defer>& signals, step& s) {
        using namespace asio::experimental::awaitable_operators;
        auto followed = co_await (detail::settle(rdzv.await_decision()) || signals.next());
        if (followed.index() == 1) co_return 128 + signals.take();
        if (const auto why = store_loss(std::get<0>(followed).error)) {
            co_await recover(rdzv, *why);
            co_return std::nullopt;
        }
        const auto decision = std::get<0>(followed).take();
        co_return co_await conclude(rdzv, s, decision);
    }

    /// The job's decision for the aborted round, acted on: a restart (nullopt), or a stop with
    /// this node's failure report (when its workers failed) and the job's exit code.
    /// `announced`: the restart line was logged already, as the policy's wait began.
    template <agent_rendezvous R>
    asio::awaitable<std::optional<int>> conclude(R& rdzv, const step& s, const job_decision& decision,
                                                 bool announced = false) {
        const auto what = failed_what(s);
        if (decision.regroup) {
            log_.warning(fmt::format("[{}] {}; {}: restarting every node's worker group (a membership restart: "
                                     "TORCHELASTIC_RESTART_COUNT stays {}, --max-restarts is not spent)",
                                     spec_.role, what, decision.reason, rdzv.restart_count()));
            co_return std::nullopt;
        }
        if (decision.restart) {
            if (announced) {
                events_.restart(rdzv.restart_count());
                co_return std::nullopt;
            }
            log_.warning(fmt::format("[{}] {}; {}: {}", spec_.role, what, decision.reason,
                                     restarting(rdzv.restart_count())));
            events_.restart(rdzv.restart_count());
            co_return std::nullopt;
        }
        log_.warning(fmt::format("[{}] {}; {}: {}", spec_.role, what, decision.reason,
                                 several_ ? "stopping the job" : "stopping"));
        if (s.own_failure) (void)finish_failed(s.failure);
        co_await rdzv.leave();
        co_return decision.exit_code;
    }

    /// The restart line's action: "restarting the worker group", or on several nodes "restarting
    /// every node's worker group (job-wide restart N)"; with `delay`, "... in 1.8 s" before N.
    std::string restarting(int job_restart, std::optional<std::chrono::steady_clock::duration> delay = {}) const {
        std::string out = several_ ? "restarting every node's worker group" : "restarting the worker group";
        if (delay) out += " in " + duration_words(*delay);
        if (several_) out += fmt::format(" (job-wide restart {})", job_restart);
        return out;
    }

    /// A job<R> step called on a step of another kind: the caller's loop is wrong.
    static void expect(const step& s, typename step::kind want, std::string_view call) {
        if (s.how == want) return;
        throw agent_error(fmt::format("job::{}() is for a step that {}, and this one {}: the agent's loop is wrong",
                                      call, step::name(want), step::name(s.how)));
    }

    /// What ended the round, for the restart or stop line: one node names its first failure;
    /// several name the node that reported (or this node's workers).
    std::string failed_what(const step& s) const {
        if (!several_) return fmt::format("worker group failed ({})", headline(s.failure));
        return last_abort_ ? describe_abort() : std::string("this node's workers failed");
    }

    std::string headline(const group_failure& failure) const {
        const auto* root = failure.root_cause();
        if (root == nullptr) return "no worker failed on its own";
        return fmt::format("local_rank {} {}", root->local_rank, root->status.describe());
    }

    /// A Python worker that failed on a missing module most often ran under another Python than
    /// the one the user installed it for: says which interpreter ran and how to choose one.
    std::optional<std::string> python_module_hint(const group_failure& failure) const {
        if (command_.kind != program_kind::python_script && command_.kind != program_kind::python_module) {
            return std::nullopt;
        }
        static constexpr std::string_view marker = "ModuleNotFoundError: No module named ";
        for (const auto& w : failure.workers) {
            for (const auto& line : w.stderr_tail.lines) {
                const auto at = line.find(marker);
                if (at == std::string::npos) continue;
                const auto python_exec = env_.find("PYTHON_EXEC");
                const bool chosen = python_exec != env_.end() && !python_exec->second.empty();
                return fmt::format("the workers ran with {} ({}) and it has no module {}: set PYTHON_EXEC to the "
                                   "Python that has it (such as /usr/bin/python3 for Debian's packages)",
                                   command_.path,
                                   chosen ? "PYTHON_EXEC" : "PYTHON_EXEC unset: the first python3 on PATH",
                                   line.substr(at + marker.size()));
            }
        }
        return std::nullopt;
    }

    int finish_failed(const group_failure& failure) {
        events_.final_status(failure);
        log_.always(format_summary(spec_.program.target, failure.workers));
        if (const auto hint = python_module_hint(failure)) log_.warning(*hint);
        if (const auto* root = failure.root_cause()) {
            if (const auto it = env_.find("TORCHELASTIC_ERROR_FILE"); it != env_.end() && !it->second.empty()) {
                try {
                    write_agent_error_file(it->second, *root);
                } catch (const std::exception& e) {
                    log_.error(e.what());
                }
            }
            return launcher_exit_code(*root);
        }
        return 1;
    }

    /// At the end of the agent's loop, however it ended (after the failure summary): the log
    /// files that miss bytes (docs/logs.md, "When a log file cannot be written").
    void report_incomplete_logs() const {
        if (incomplete_logs_.empty()) return;
        std::string lines;
        for (const auto& line : incomplete_logs_) lines += "\n  " + line;
        log_.error(fmt::format("{} of this node's log files {} incomplete (writes to them failed; the exit code is "
                               "the workers' all the same):{}",
                               incomplete_logs_.size(), incomplete_logs_.size() == 1 ? "is" : "are", lines));
    }

    void log_barrier_timeout(const barrier_result& result) {
        std::string missing;
        for (std::size_t i = 0; i < result.missing.size(); ++i) {
            missing += fmt::format("{}group_rank {} ({})", i ? ", " : "", result.missing[i], result.missing_hosts[i]);
        }
        log_.error(fmt::format("exit barrier: this node's workers succeeded, but {} did not finish within {} s "
                               "(--rdzv-conf exit_barrier_timeout); exiting anyway",
                               missing, detail::seconds_text(exit_barrier_timeout())));
    }

    /// After a success: the temporary tree goes (torchrun leaks it) unless it holds logs the
    /// user asked for with -r/-t; a --log-dir tree always stays.
    void remove_run_dir() noexcept {
        if (logs_ && !writes_log_files(spec_)) logs_->remove_temporary();
    }

    /// The attempt's directory of the log tree (docs/logs.md), torchrun's layout
    /// <log_dir or tmp>/<run_id>_XXXXXX/attempt_<n>/<local_rank>/; an earlier attempt's
    /// directory is never wiped. Empty with --log-dir=/dev/null. `attempt`: the restart count the
    /// workers see.
    std::filesystem::path attempt_dir(int attempt) {
        if (!logs_) logs_.emplace(spec_.log_dir, params_.run_id, detail::agent::temp_base(env_));
        const bool first = logs_->run_dir().empty();
        auto dir = logs_->make_attempt(attempt, spec_.nproc_per_node);
        if (first && !logs_->run_dir().empty())
            log_.info(fmt::format("log directory set to: {}", logs_->run_dir().string()));
        return dir;
    }

    /// One attempt: a fresh workers' store, the round joined with it, the group started and
    /// supervised until the first failure, the end of every worker, the round's abort or a
    /// signal, then the group stopped and closed.
    template <agent_rendezvous R>
    asio::awaitable<attempt_outcome> run_attempt(R& rdzv, detail::agent::signal_inbox<Defer>& signals) {
        using namespace asio::experimental::awaitable_operators;
        const int n = spec_.nproc_per_node;

        // A fresh store for this attempt: a dead worker's last requests, still in flight on its
        // old connection, can never land in the new attempt's key space (PyTorch 1.13 keys by
        // restart count, newer PyTorch and native workers do not key by attempt at all).
        store_server_options options;
        options.host = store_.bind_host;
        options.port = store_.port;
        options.log = [this](std::string_view line) { log_.warning(fmt::format("store: {}", line)); };
        if (several_ && !params_.settings.workers_store_any_peer) {
            // PyTorch workers cannot authenticate: the store accepts this node's loopback and,
            // once the round is known, its members' addresses (join_round fills the list).
            auto peers = std::make_shared<detail::rendezvous::peer_list>();
            workers_peers_ = peers;
            options.accept_peer = [peers](const asio::ip::address& a) { return peers->accepts(a); };
        }
        // A fixed port: the previous round's workers' store (group rank 0) goes first, as it
        // holds the port. Else it goes after the new one is bound, so the new one never gets
        // the old port back (a late worker of the old round would reach the new store).
        if (store_.port != 0) round_store_.reset();
        std::unique_ptr<tcp_store_server> server;
        try {
            server = std::make_unique<tcp_store_server>(executor_, std::move(options));
            server->start();
        } catch (const store_error& e) {
            throw agent_error(fmt::format("cannot host the workers' store: {}", e.what()));
        }
        master_port_ = server->port();
        round_store_.reset();
        if (const auto sig = co_await join_round(rdzv, *server, signals)) {
            server->stop();
            attempt_outcome interrupted;
            interrupted.how = kind::signaled;
            interrupted.signal = *sig;
            co_return interrupted;
        }
        const int restarts = round_->restart_count;
        events_.rendezvous_done(restarts, node_worker(0, n), store_.master_addr, master_port_);
        auto& server_ref = *server;
        // Group rank 0's store serves every node's workers until the round ends (all nodes done,
        // or an abort), not only while this node's own workers run.
        if (round_->group_rank == 0) round_store_ = std::move(server);

        group_attempt attempt;
        attempt.told = attempt_settings{restarts, store_.master_addr, master_port_, {}, params_.run_id};
        attempt.dir = attempt_dir(restarts);
        for (int i = 0; i < n; ++i) attempt.ranks.push_back(node_worker(i, n));
        worker_group group(executor_, spec_, command_, events_, log_);
        // A worker that cannot be started: the group has stopped the others already.
        try {
            co_await group.start(attempt, env_);
        } catch (...) {
            server_ref.stop();
            throw;
        }

        // The first failure, the end of every worker, another node's abort, or a signal.
        attempt_outcome outcome;
        std::optional<std::size_t> first_failure;
        log_.info(fmt::format("[{}] started {} workers (attempt {}; store at {}:{})", spec_.role, n, restarts,
                              store_.master_addr, master_port_));
        if (host_.empty()) host_ = host_fqdn();  // once, while the workers run (it may ask DNS)
        // Settled: `||` waits for one side to succeed, so a supervision error must not wait for a
        // signal; it is rethrown here (the group, dropped, kills what still runs).
        auto first = co_await (detail::settle(watch_job(rdzv, group)) || signals.next());
        if (first.index() == 1) {
            outcome.how = kind::signaled;
            outcome.signal = signals.take();
        } else if (const auto i = std::get<0>(first).take(); i == aborted_by_job) {
            outcome.how = kind::aborted;
        } else if (i < group.size()) {
            outcome.how = kind::failed;
            first_failure = i;
        }

        switch (outcome.how) {
            case kind::succeeded: break;
            case kind::signaled: co_await stop_on_signal(group, outcome.signal); break;
            case kind::aborted:  // another node's failure
                (void)co_await group.stop(SIGTERM);
                break;
            case kind::failed: {
                // Abort the round for every node, then stop the others (the signal the agent would
                // send, SIGTERM), racing the signals the agent handles — one arriving now is
                // forwarded and wins.
                co_await report_failure(rdzv, group.workers()[*first_failure], group.assignment(*first_failure));
                events_.stopping_group();
                auto stopped = co_await (group.stop(SIGTERM) || signals.next());
                if (stopped.index() == 1) {
                    outcome.how = kind::signaled;
                    outcome.signal = signals.take();
                    co_await stop_on_signal(group, outcome.signal);
                } else {
                    outcome.failure = group.failure(*first_failure, host_);
                }
                break;
            }
        }
        co_await group.close();
        for (const auto& [file, why] : group.incomplete_logs()) incomplete_logs_.push_back(file + ": " + why);
        // After a success, group rank 0's store keeps serving the other nodes' workers.
        if (outcome.how != kind::succeeded) server_ref.stop();
        co_return outcome;
    }

    asio::awaitable<void> stop_on_signal(worker_group& group, int sig) {
        events_.received_signal(sig);
        log_.warning(fmt::format("received {}: forwarding it to the worker group (grace {} s, then SIGKILL)",
                                 signal_to_string(sig), detail::seconds_text(spec_.shutdown_timeout)));
        (void)co_await group.stop(sig);
        log_.warning(fmt::format("worker group stopped; exiting with {}", 128 + sig));
    }

    // ---- the rendezvous (docs/rendezvous.md; include/elastic/rendezvous/) ----

    /// watch_job()'s answer when another node aborted the round.
    static constexpr std::size_t aborted_by_job = static_cast<std::size_t>(-1);

    /// This node as the job sees it before a round: its name (several nodes only: one node
    /// needs none, and getfqdn() may ask DNS before the first worker starts), workers and pid.
    node_info this_node() {
        node_info me;
        if (several_) me.host = node_host();
        me.nproc = spec_.nproc_per_node;
        me.role = spec_.role;
        me.pid = static_cast<long>(::getpid());
        return me;
    }

    /// This node's name for the others: --local-addr, else the host name (getfqdn() may ask
    /// DNS: not when every node is on this machine, a loopback endpoint).
    const std::string& node_host() {
        if (host_.empty()) {
            if (params_.local_addr) {
                host_ = *params_.local_addr;
            } else if (detail::rendezvous::is_loopback(params_.endpoint.host)) {
                host_ = host_name();
            } else {
                host_ = host_fqdn();
            }
        }
        return host_;
    }

    /// --rdzv-conf exit_barrier_timeout, else 300 s (torchrun's fixed value).
    [[nodiscard]] std::chrono::milliseconds exit_barrier_timeout() const {
        return params_.settings.exit_barrier_timeout.value_or(std::chrono::seconds(300));
    }

    /// The message of `error` when the rendezvous store is lost: a store_lost_error (the lease
    /// connection ended), or another store_error (a request to the store failed), which the agent
    /// treats alike; nullopt for any other error.
    static std::optional<std::string> store_loss(const std::exception_ptr& error) {
        if (!error) return std::nullopt;
        try {
            std::rethrow_exception(error);
        } catch (const store_lost_error& e) {
            return std::string(e.what());
        } catch (const store_error& e) {
            return fmt::format("lost the rendezvous store: {}", e.what());
        } catch (...) {
        }
        return std::nullopt;
    }

    /// The rendezvous store was lost (`why`, workers stopped already): the rendezvous rejoins
    /// it or moves the job, and this node goes on at the next round; rendezvous_error when the
    /// job cannot go on.
    template <agent_rendezvous R>
    asio::awaitable<void> recover(R& rdzv, std::string why) {
        const auto me = this_node();
        const auto done = co_await rdzv.recover(std::move(why), me);
        log_.warning(fmt::format("[{}] {}", spec_.role, done));
    }

    [[nodiscard]] bool membership_changed() const {
        return last_abort_ && last_abort_->what == abort_notice::kind::membership;
    }

    void log_membership_restart(int restarts) {
        log_.warning(fmt::format("[{}] membership changed: {}; restarting every node's worker group (a membership "
                                 "restart: TORCHELASTIC_RESTART_COUNT stays {}, --max-restarts is not spent)",
                                 spec_.role, last_abort_ ? last_abort_->reason : std::string("?"), restarts));
    }

    std::string describe_abort() const {
        if (!last_abort_) return "the round was aborted";
        return fmt::format("group_rank {} ({}) reported: {}", last_abort_->group_rank, last_abort_->host,
                           last_abort_->reason);
    }

    /// Lets the round's members connect to this node's workers' store: each peer an address
    /// literal (what every member publishes), else a name (a member that published no
    /// addresses), resolved without blocking the agent's event loop. A name that resolves to
    /// nothing is logged; the workers of that member may then be refused.
    asio::awaitable<void> allow_peers(detail::rendezvous::peer_list& list, const std::vector<std::string>& peers) {
        std::error_code ec;
        for (const auto& peer : peers) {
            const auto literal = asio::ip::make_address(peer, ec);
            if (!ec) list.allow(literal);
        }
        for (const auto& peer : peers) {
            (void)asio::ip::make_address(peer, ec);
            if (!ec) continue;
            asio::ip::tcp::resolver resolver(executor_);
            auto [error, found] = co_await resolver.async_resolve(peer, "", detail::as_tuple_awaitable<Defer>);
            if (error) {
                log_.warning(fmt::format("[{}] cannot resolve member '{}' for the workers' store's allow-list ({}); "
                                         "its workers may be refused (--rdzv-conf workers_store_peers=any admits "
                                         "every peer)",
                                         spec_.role, peer, error.message()));
                continue;
            }
            for (const auto& entry : found) list.allow(entry.endpoint().address());
        }
    }

    /// Joins this attempt's round with the fresh workers' store `server`; sets the workers'
    /// MASTER_ADDR/PORT and this node's ranks. Returns a signal received meanwhile.
    template <agent_rendezvous R>
    asio::awaitable<std::optional<int>> join_round(R& rdzv, tcp_store_server& server,
                                                   detail::agent::signal_inbox<Defer>& signals) {
        using namespace asio::experimental::awaitable_operators;
        node_info me = this_node();
        if (!advertised_addr_) advertised_addr_ = store_.master_addr;
        me.store_addr = *advertised_addr_;
        me.store_port = server.port();
        me.node_rank = params_.node_rank;
        if (round_) me.previous_rank = round_->group_rank;
        if (several_) me.addrs = detail::rendezvous::interface_addresses();
        auto joined = co_await (detail::settle(rdzv.next_round(std::move(me))) || signals.next());
        if (joined.index() == 1) co_return signals.take();
        round_ = std::get<0>(joined).take();
        // This node's ranks must lie inside the round's worlds: an assignment that says
        // otherwise was not written by an agent of this job (elastic::env() would refuse the
        // workers' RANK or ROLE_RANK).
        const int role_base = round_->role_base();
        const int role_size = round_->role_size();
        if (static_cast<long long>(round_->rank_base) + spec_.nproc_per_node > round_->world_size ||
            static_cast<long long>(role_base) + spec_.nproc_per_node > role_size || role_size > round_->world_size) {
            throw rendezvous_error(fmt::format(
                "rendezvous round {}: the assignment gives this node's {} workers ranks {}.. of {} and role ranks "
                "{}.. of {}, beyond the round: a client that is no agent of this job writes into the rendezvous "
                "store; give the job a store of its own",
                round_->number, spec_.nproc_per_node, round_->rank_base, round_->world_size, role_base, role_size));
        }
        store_.master_addr = round_->master_addr;
        master_port_ = round_->master_port;
        // Only group rank 0's store serves the workers; the others' close at once.
        if (round_->group_rank != 0) server.stop();
        if (round_->group_rank == 0 && workers_peers_) co_await allow_peers(*workers_peers_, round_->peers);
        if (several_) {
            log_.info(fmt::format("[{}] rendezvous round {} complete: group_rank {} of {}, ranks {}..{} of {}",
                                  spec_.role, round_->number, round_->group_rank, round_->group_world_size,
                                  round_->rank_base, round_->rank_base + spec_.nproc_per_node - 1, round_->world_size));
        }
        co_return std::nullopt;
    }

    /// Local worker `i` of `n`: its ranks in the current round.
    [[nodiscard]] worker_assignment node_worker(int i, int n) const {
        auto a = assign_worker(i, n);
        if (!round_) return a;
        a.group_rank = round_->group_rank;
        a.group_world_size = round_->group_world_size;
        a.global_rank = round_->rank_base + i;
        a.role_rank = round_->role_base() + i;
        a.world_size = round_->world_size;
        a.role_world_size = round_->role_size();
        return a;
    }

    /// The first failing local worker, all succeeding, or aborted_by_job (the round's abort, or
    /// the loss of the rendezvous store).
    template <agent_rendezvous R>
    asio::awaitable<std::size_t> watch_job(R& rdzv, worker_group& group) {
        using namespace asio::experimental::awaitable_operators;
        auto first = co_await (detail::settle(group.watch()) || watch_abort(rdzv));
        if (first.index() == 0) co_return std::get<0>(first).take();
        auto ended = std::get<1>(std::move(first));
        if (auto* notice = std::get_if<abort_notice>(&ended)) {
            last_abort_ = std::move(*notice);
        } else {
            store_lost_ = std::get<detail::agent::store_lost>(std::move(ended));
        }
        co_return aborted_by_job;
    }

    /// The round's abort, or the loss of the rendezvous store (a store_lost_error, or a failed
    /// request to it): run_rounds then moves the store or throws rendezvous_error once the
    /// workers are stopped.
    template <agent_rendezvous R>
    asio::awaitable<std::variant<abort_notice, detail::agent::store_lost>> watch_abort(R& rdzv) {
        std::string why;
        try {
            co_return co_await rdzv.wait_for_abort();
        } catch (const store_lost_error& e) {
            why = e.reason();
        } catch (const store_error& e) {
            why = e.what();
        }
        co_return detail::agent::store_lost{fmt::format("lost the rendezvous store while the workers ran: {}", why)};
    }

    /// A local worker failed: abort the round for every node (first reporter wins).
    template <agent_rendezvous R>
    asio::awaitable<void> report_failure(R& rdzv, const child_process& worker, const worker_assignment& a) {
        const auto& status = worker.status()->status;
        abort_notice notice;
        notice.group_rank = round_ ? round_->group_rank : -1;
        notice.host = host_;
        notice.reason = fmt::format("local_rank {} (rank {}) {}", a.local_rank, a.global_rank, status.describe());
        abort_won_ = co_await rdzv.abort(notice);
        // Lost: another node reported first (its notice is there already); this one follows.
        if (abort_won_) {
            last_abort_ = notice;
        } else {
            last_abort_ = co_await rdzv.wait_for_abort();
        }
    }

    /// This agent received `sig` (its workers are stopped already). Elastic membership
    /// (MIN < MAX): it leaves the job; the others are told at once (a membership abort of the
    /// round) and re-form without it. Fixed membership: the job cannot go on without it, so
    /// the round is aborted with decision stop and every node exits 128+N.
    template <agent_rendezvous R>
    asio::awaitable<void> abort_for_signal(R& rdzv, int sig) {
        if (!round_) co_return;
        try {
            if (params_.nnodes.min < params_.nnodes.max) {
                abort_notice notice{round_->group_rank, host_,
                                    fmt::format("node {} (pid {}) left: its agent received {}", host_,
                                                static_cast<long>(::getpid()), signal_to_string(sig))};
                notice.what = abort_notice::kind::membership;
                (void)co_await rdzv.abort(notice);
                co_return;
            }
            abort_notice notice{round_->group_rank, host_, fmt::format("its agent received {}", signal_to_string(sig))};
            if (co_await rdzv.abort(notice)) {
                const job_decision stop_now{false, 128 + sig,
                                            fmt::format("group_rank {} ({}) received {}", round_->group_rank, host_,
                                                        signal_to_string(sig))};
                (void)co_await rdzv.decide(stop_now);
            }
        } catch (const store_error&) {
            // The store is gone already: nobody is left to tell.
        }
    }

    bool several_ = false;                                          ///< a job of several nodes (uses_node_rendezvous)
    std::unique_ptr<tcp_store_server> round_store_;                 ///< group rank 0: the round's workers' store
    std::shared_ptr<detail::rendezvous::peer_list> workers_peers_;  ///< who the attempt's workers' store accepts
    std::optional<rendezvous_round> round_;                         ///< the current round
    std::optional<std::string> advertised_addr_;                    ///< what this node's info says of its store
    std::optional<detail::agent::store_lost> store_lost_;           ///< the store was lost while the workers ran
    std::optional<abort_notice> last_abort_;                        ///< why the current round was aborted
    bool abort_won_ = false;                                        ///< this node's abort() was the first
    std::vector<std::string> incomplete_logs_;                      ///< log files that miss bytes, and why

    asio::any_io_executor executor_;
    worker_spec spec_;
    rendezvous_parameters params_;
    environment env_;
    agent_log log_;
    worker_command command_;
    detail::agent::store_plan store_;
    std::uint16_t master_port_ = 0;
    std::string host_;
    agent_events events_;           ///< --event-log-handler
    std::optional<log_tree> logs_;  ///< made at the first attempt
};
using local_agent = basic_local_agent<>;

/*
 * agent_loop: a loop of the caller's over a running job (local_agent::run_loop).
 *   asio::awaitable<int> operator()(local_agent::job<R>& job);
 * for both rendezvous models the agent may choose (a template call whose return type is written
 * out, e.g. `template <class Job> asio::awaitable<int> operator()(Job& job)`): it is
 * awaited once, with the job joined, and returns the agent's exit code.
 */
template <class L>
concept agent_loop = std::move_constructible<L> &&
    detail::agent::loop_over<L, local_agent::job<single_node_rendezvous>> &&
    detail::agent::loop_over<L, local_agent::job<tcp_rendezvous>>;

}  // namespace elastic::inline v0
// ---- end elastic/agent/local_agent.hpp ----
// ---- end elastic/agent.hpp ----

// The launcher: torchrun's command line (CLI11), the launch configuration and elastic::run. A
// file that only works (env(), record, dist) or runs an agent loop of its own may define
// ELASTIC_NO_LAUNCHER before including this header: it then needs no CLI11 and does not parse it.
// (The one file that defines ELASTIC_IMPL_SOURCE must not.)
#ifndef ELASTIC_NO_LAUNCHER
// ---- begin elastic/launch.hpp ----
// The launch layer — launch configuration: torchrun's command line and PET_* variables.

// ---- begin elastic/launch/cli.hpp ----
// torchrun's command line for elastic: every option in dashed and underscored spelling, PET_*
// variables as defaults, --help, and parse_launch_config() that turns them into a launch_config.

// ---- begin elastic/launch/config.hpp ----
// elastic::launch_config: everything an agent needs to launch and supervise one node's workers,
// as a plain struct (filled by the command line or by a custom launcher) with validate().

// ---- begin elastic/launch/values.hpp ----
// The typed values of torchrun's options (node ranges, endpoints, stream selections, rendezvous
// settings, signal lists, durations) and the parsers of their text forms.


#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace elastic::inline v0 {

using namespace std::chrono_literals;

namespace detail::launch {
using detail::lower;
using detail::show;
using detail::split;
using detail::to_integer;
using detail::trim;
}  // namespace detail::launch

/// An integer in [min, max]; `name` and `text` appear in the error.
[[nodiscard]] ELASTIC_DECL int parse_integer(std::string_view text, std::string_view name, int min, int max = INT_MAX);

/// A duration in seconds, decimals allowed (`0.5`), at least 0 (or above 0 unless `allow_zero`),
/// held to the millisecond.
[[nodiscard]] ELASTIC_DECL std::chrono::milliseconds parse_seconds(std::string_view text, std::string_view name,
                                                                   bool allow_zero);

/// A boolean word as torchrun's rendezvous parameters read it: 1/true/t/yes/y or 0/false/f/no/n,
/// in any case.
[[nodiscard]] ELASTIC_DECL bool parse_boolean(std::string_view text, std::string_view name);

/// A PET_* flag variable, read as torchrun does (`bool(int(value))`): an integer, non-zero is on.
[[nodiscard]] ELASTIC_DECL bool parse_flag_variable(std::string_view text, std::string_view name);

/// `--nnodes`: `N` or `MIN:MAX` with 0 < MIN <= MAX.
[[nodiscard]] ELASTIC_DECL node_range parse_node_range(std::string_view text, std::string_view name);

namespace detail::launch {

/// Host names, IPv4 addresses and (unbracketed) IPv6 addresses: torchrun's `[\w.:-]+`, plus `%` for
/// an IPv6 zone.
[[nodiscard]] ELASTIC_DECL bool valid_host(std::string_view host) noexcept;

}  // namespace detail::launch

/// A host name or address (`--master-addr`, `--local-addr`): letters, digits, `_ . : - %`.
[[nodiscard]] ELASTIC_DECL std::string parse_host(std::string_view text, std::string_view name);

/// `host`, `host:port`, `[ipv6]` or `[ipv6]:port` with a port from 0 to 65535. An IPv6 address
/// must be in brackets: torchrun would split `::1` into host `:` and port 1, we refuse it.
[[nodiscard]] ELASTIC_DECL host_port parse_host_port(std::string_view text, std::string_view name);

/// `--rdzv-backend`. torchrun's etcd backends (`etcd`, `etcd-v2`) use etcd's v2 API, which etcd 3.6
/// removed; elastic speaks the v3 API as `etcd-v3`, and says so instead of failing later.
[[nodiscard]] ELASTIC_DECL rendezvous_backend parse_rendezvous_backend(std::string_view text, std::string_view name);

namespace detail::launch {

/// What one `--rdzv-conf` key is, and which backends read it.
struct rdzv_key {
    std::string_view key;
    bool static_;
    bool c10d;
    bool etcd_v3;
};
inline constexpr std::array<rdzv_key, 14> rdzv_keys{{
    {"join_timeout", false, true, true},
    {"last_call_timeout", false, true, true},
    {"close_timeout", false, true, true},
    {"read_timeout", false, true, true},
    {"timeout", true, false, false},
    {"is_host", false, true, false},
    {"store_type", false, true, false},
    {"use_libuv", false, true, false},
    {"protocol", false, false, true},
    {"exit_barrier_timeout", true, true, true},
    {"keep_alive_interval", false, true, false},
    {"keep_alive_max_attempt", false, true, false},
    {"secret_file", true, true, false},
    {"workers_store_peers", false, true, false},
}};

[[nodiscard]] ELASTIC_DECL bool reads_key(const rdzv_key& k, rendezvous_backend backend) noexcept;

[[nodiscard]] ELASTIC_DECL std::string keys_of(rendezvous_backend backend);

}  // namespace detail::launch

/// `--rdzv-conf k1=v1,k2=v2` for `backend`, over torchrun's defaults. An empty key or value and
/// a key given twice are errors; the value is everything after the first `=`; quotes a shell
/// left around the whole text or a value are removed. A key the backend does not read is an
/// error when `warnings` is null; otherwise, as torchrun does, it is ignored, and a line saying
/// so is appended to `warnings` (as is one for removed quotes).
[[nodiscard]] ELASTIC_DECL rendezvous_settings parse_rendezvous_settings(std::string_view text, std::string_view name,
                                                                         rendezvous_backend backend,
                                                                         std::vector<std::string>* warnings = nullptr);

/// `--redirects` / `--tee`: `0`..`3` for every local rank, or `lr:v,lr:v` per local rank
/// (torchrun's regex allows one-digit local ranks only; any non-negative rank is accepted here).
[[nodiscard]] ELASTIC_DECL stream_selection parse_stream_selection(std::string_view text, std::string_view name);

/// `--local-ranks-filter`: comma-separated local ranks; empty means every rank.
[[nodiscard]] ELASTIC_DECL std::set<int> parse_local_ranks(std::string_view text, std::string_view name);

/// `--duplicate-stdout-filters` / `--duplicate-stderr-filters`: comma-separated substrings, `,,`
/// standing for a comma inside one (`a,,b,c` is `a,b` and `c`); empty items are dropped. A
/// filter is matched as written: spaces count. Nothing to refuse: every text is a filter list.
[[nodiscard]] ELASTIC_DECL std::vector<std::string> parse_duplicate_filters(std::string_view text);

/// `--signals-to-handle`: comma-separated signal names (`SIGTERM,SIGUSR1`; the `SIG` prefix and the
/// case are optional). Duplicates are dropped; order is kept.
[[nodiscard]] ELASTIC_DECL std::vector<int> parse_signals(std::string_view text, std::string_view name);

/// `LOGLEVEL`: DEBUG, INFO, WARNING (or WARN), ERROR, CRITICAL (or FATAL), in any case.
[[nodiscard]] ELASTIC_DECL log_level parse_log_level(std::string_view text, std::string_view name);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL int parse_integer(std::string_view text, std::string_view name, int min, int max) {
    const auto value = detail::launch::to_integer(text);
    if (!value || *value < min || *value > max) {
        const auto rule = max == INT_MAX ? fmt::format("an integer >= {}", min)
                                         : fmt::format("an integer from {} to {}", min, max);
        throw usage_error{fmt::format("{}: must be {}", detail::launch::show(name, text), rule)};
    }
    return static_cast<int>(*value);
}

[[nodiscard]] ELASTIC_DECL std::chrono::milliseconds parse_seconds(std::string_view text, std::string_view name,
                                                                   bool allow_zero) {
    const auto trimmed = detail::launch::trim(text);
    double seconds = -1;
    const auto [end, ec] = std::from_chars(trimmed.data(), trimmed.data() + trimmed.size(), seconds,
                                           std::chars_format::fixed);
    const bool ok = !trimmed.empty() && ec == std::errc{} && end == trimmed.data() + trimmed.size() &&
                    std::isfinite(seconds) && seconds <= 1e9 && (allow_zero ? seconds >= 0 : seconds > 0);
    if (!ok) {
        throw usage_error{fmt::format("{}: must be a number of seconds {} (at most 1e9)",
                                      detail::launch::show(name, text), allow_zero ? ">= 0" : "> 0")};
    }
    return std::chrono::milliseconds{std::llround(seconds * 1000.0)};
}

[[nodiscard]] ELASTIC_DECL bool parse_boolean(std::string_view text, std::string_view name) {
    const auto word = detail::launch::lower(detail::launch::trim(text));
    if (word == "1" || word == "true" || word == "t" || word == "yes" || word == "y") {
        return true;
    }
    if (word == "0" || word == "false" || word == "f" || word == "no" || word == "n") {
        return false;
    }
    throw usage_error{
        fmt::format("{}: must be a boolean (1/true/yes or 0/false/no)", detail::launch::show(name, text))};
}

[[nodiscard]] ELASTIC_DECL bool parse_flag_variable(std::string_view text, std::string_view name) {
    const auto value = detail::launch::to_integer(text);
    if (!value) {
        throw usage_error{
            fmt::format("{}: must be an integer (1 turns the flag on, 0 off)", detail::launch::show(name, text))};
    }
    return *value != 0;
}

[[nodiscard]] ELASTIC_DECL node_range parse_node_range(std::string_view text, std::string_view name) {
    const auto fail = [&](std::string_view why) {
        return usage_error{
            fmt::format("{}: {} (want N or MIN:MAX with 0 < MIN <= MAX)", detail::launch::show(name, text), why)};
    };
    const auto pieces = detail::launch::split(text, ':');
    if (pieces.size() > 2) {
        throw fail("too many ':'");
    }
    const auto min = detail::launch::to_integer(pieces.front());
    const auto max = pieces.size() == 2 ? detail::launch::to_integer(pieces.back()) : min;
    if (!min || !max) {
        throw fail("not an integer");
    }
    if (*min <= 0 || *max <= 0) {
        throw fail("node counts must be positive");
    }
    if (*min > *max) {
        throw fail(fmt::format("the minimum {} exceeds the maximum {}", *min, *max));
    }
    if (*max > INT_MAX) {
        throw fail("too large");
    }
    return node_range{static_cast<int>(*min), static_cast<int>(*max)};
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::launch {

[[nodiscard]] ELASTIC_DECL bool valid_host(std::string_view host) noexcept {
    return !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' || c == ':' || c == '-' ||
               c == '%';
    });
}

}  // namespace detail::launch
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL std::string parse_host(std::string_view text, std::string_view name) {
    const auto host = detail::launch::trim(text);
    if (!detail::launch::valid_host(host)) {
        throw usage_error{
            fmt::format("{}: must be a host name, an IPv4 or an IPv6 address", detail::launch::show(name, text))};
    }
    return std::string{host};
}

[[nodiscard]] ELASTIC_DECL host_port parse_host_port(std::string_view text, std::string_view name) {
    const auto fail = [&](std::string_view why) {
        return usage_error{fmt::format("{}: {} (want host[:port], an IPv6 address as [addr]:port)",
                                       detail::launch::show(name, text), why)};
    };
    const auto endpoint = detail::launch::trim(text);
    if (endpoint.empty()) {
        throw fail("empty");
    }
    host_port result;
    std::string_view port_text;
    bool has_port = false;
    if (endpoint.front() == '[') {
        const auto close = endpoint.find(']');
        if (close == std::string_view::npos) {
            throw fail("no ']' after the IPv6 address");
        }
        result.host = std::string{endpoint.substr(1, close - 1)};
        const auto rest = endpoint.substr(close + 1);
        if (!rest.empty()) {
            if (rest.front() != ':') {
                throw fail("unexpected text after ']'");
            }
            port_text = rest.substr(1);
            has_port = true;
        }
        if (result.host.find(':') == std::string::npos || !detail::launch::valid_host(result.host)) {
            throw fail("the bracketed part is not an IPv6 address");
        }
    } else {
        const auto colon = endpoint.find(':');
        if (colon != std::string_view::npos && endpoint.find(':', colon + 1) != std::string_view::npos) {
            throw fail("an IPv6 address must be written in brackets");
        }
        result.host = std::string{endpoint.substr(0, colon)};
        if (colon != std::string_view::npos) {
            port_text = endpoint.substr(colon + 1);
            has_port = true;
        }
        if (!detail::launch::valid_host(result.host)) {
            throw fail("bad host name");
        }
    }
    if (has_port) {
        const auto port = detail::launch::to_integer(port_text);
        if (!port || *port < 0 || *port > 65535 || detail::launch::trim(port_text) != port_text) {
            throw fail("the port must be an integer from 0 to 65535");
        }
        result.port = static_cast<std::uint16_t>(*port);
    }
    return result;
}

[[nodiscard]] ELASTIC_DECL rendezvous_backend parse_rendezvous_backend(std::string_view text, std::string_view name) {
    const auto word = detail::launch::trim(text);
    if (word == "static") {
        return rendezvous_backend::static_;
    }
    if (word == "c10d") {
        return rendezvous_backend::c10d;
    }
    if (word == "etcd-v3") {
        return rendezvous_backend::etcd_v3;
    }
    if (word == "etcd" || word == "etcd-v2") {
        throw usage_error{
            fmt::format("{}: torchrun's etcd backends use etcd's v2 API (removed in etcd 3.6), which elastic does not "
                        "speak; use --rdzv-backend=etcd-v3 (etcd's v3 API) or --rdzv-backend=c10d",
                        detail::launch::show(name, text))};
    }
    throw usage_error{
        fmt::format("{}: unknown rendezvous backend (known: static, c10d, etcd-v3)", detail::launch::show(name, text))};
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::launch {

[[nodiscard]] ELASTIC_DECL bool reads_key(const rdzv_key& k, rendezvous_backend backend) noexcept {
    switch (backend) {
        case rendezvous_backend::static_: return k.static_;
        case rendezvous_backend::c10d: return k.c10d;
        case rendezvous_backend::etcd_v3: return k.etcd_v3;
    }
    return false;
}

[[nodiscard]] ELASTIC_DECL std::string keys_of(rendezvous_backend backend) {
    std::string out;
    for (const auto& k : rdzv_keys) {
        if (reads_key(k, backend)) {
            out += out.empty() ? "" : ", ";
            out += k.key;
        }
    }
    return out;
}

}  // namespace detail::launch
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL rendezvous_settings parse_rendezvous_settings(std::string_view text, std::string_view name,
                                                                         rendezvous_backend backend,
                                                                         std::vector<std::string>* warnings) {
    rendezvous_settings settings;
    const auto whole = detail::launch::show(name, text);
    // A script that quotes the value twice ("'join_timeout=5,...'") passes the quotes on.
    bool unquoted = false;
    const auto unquote = [&](std::string_view t) {
        t = detail::launch::trim(t);
        if (t.size() >= 2 && (t.front() == '\'' || t.front() == '"') && t.back() == t.front()) {
            unquoted = true;
            return detail::launch::trim(t.substr(1, t.size() - 2));
        }
        return t;
    };
    text = unquote(text);
    if (text.empty()) {
        return settings;
    }
    std::set<std::string, std::less<>> seen;
    std::vector<std::string> ignored;
    for (const auto item : detail::launch::split(text, ',')) {
        const auto equals = item.find('=');
        const auto key = detail::launch::trim(item.substr(0, equals));
        const auto value = equals == std::string_view::npos ? std::string_view{} : unquote(item.substr(equals + 1));
        if (key.empty() || equals == std::string_view::npos || value.empty()) {
            throw usage_error{fmt::format("{}: '{}' is not key=value (want k1=v1,k2=v2 with non-empty keys and values)",
                                          whole, item)};
        }
        if (!seen.emplace(key).second) {
            throw usage_error{fmt::format("{}: key '{}' given twice", whole, key)};
        }
        const auto what = fmt::format("{} key {}", name, key);
        if (key == "rank") {
            throw usage_error{fmt::format("{}: the node's rank is set with --node-rank, not with rank=", whole)};
        }
        if (key == "ca_cert" || key == "ssl_cert" || key == "ssl_cert_key" || key == "cacert" || key == "cert" ||
            key == "key") {
            throw usage_error{
                fmt::format("{}: TLS to the rendezvous server is not implemented yet ('{}')", whole, key)};
        }
        const auto known = std::find_if(detail::launch::rdzv_keys.begin(), detail::launch::rdzv_keys.end(),
                                        [&](const detail::launch::rdzv_key& k) { return k.key == key; });
        if (known == detail::launch::rdzv_keys.end() || !detail::launch::reads_key(*known, backend)) {
            if (warnings == nullptr) {
                throw usage_error{fmt::format("{}: the {} backend does not read '{}' (it reads: {})", whole,
                                              to_string(backend), key, detail::launch::keys_of(backend))};
            }
            ignored.emplace_back(key);
            continue;
        }
        if (key == "join_timeout") {
            settings.join_timeout = parse_seconds(value, what, false);
        } else if (key == "last_call_timeout") {
            settings.last_call_timeout = parse_seconds(value, what, true);  // 0: close the round at MIN
        } else if (key == "close_timeout") {
            settings.close_timeout = parse_seconds(value, what, false);
        } else if (key == "read_timeout") {
            settings.read_timeout = parse_seconds(value, what, false);
        } else if (key == "timeout") {
            settings.timeout = parse_seconds(value, what, false);
        } else if (key == "exit_barrier_timeout") {
            settings.exit_barrier_timeout = parse_seconds(value, what, true);  // 0: do not wait
        } else if (key == "keep_alive_interval") {
            settings.keep_alive_interval = parse_seconds(value, what, false);
        } else if (key == "keep_alive_max_attempt") {
            settings.keep_alive_max_attempt = parse_integer(value, what, 1, 1000);
        } else if (key == "is_host") {
            settings.is_host = parse_boolean(value, what);
        } else if (key == "workers_store_peers") {
            const auto peers = detail::launch::lower(value);
            if (peers != "members" && peers != "any") {
                throw usage_error{fmt::format("{}: workers_store_peers must be members (the round's nodes' "
                                              "addresses only) or any (every peer, for NAT between the nodes)",
                                              whole)};
            }
            settings.workers_store_any_peer = peers == "any";
        } else if (key == "secret_file") {
            settings.secret_file = std::string(value);
        } else if (key == "store_type") {
            const auto type = detail::launch::lower(value);
            if (type == "file") {
                throw usage_error{fmt::format("{}: store_type=file (a FileStore) is not implemented; elastic's c10d "
                                              "backend uses a TCP store (store_type=tcp)",
                                              whole)};
            }
            if (type != "tcp") {
                throw usage_error{fmt::format("{}: store_type must be tcp", whole)};
            }
        } else if (key == "use_libuv") {
            // Accepted for compatibility: it picks the Python TCPStore server's event loop; elastic's
            // store server is its own, so the value is checked and has nothing to change.
            (void)parse_boolean(value, what);
        } else if (key == "protocol") {
            const auto protocol = detail::launch::lower(value);
            if (protocol == "https") {
                throw usage_error{fmt::format("{}: protocol=https (TLS to etcd) is not implemented yet", whole)};
            }
            if (protocol != "http") {
                throw usage_error{fmt::format("{}: protocol must be http", whole)};
            }
        }
    }
    if (warnings != nullptr && unquoted) {
        warnings->push_back(fmt::format("{}: the quotes around its value were removed (a script quoted it twice); "
                                        "read as {}",
                                        name, text));
    }
    if (warnings != nullptr && !ignored.empty()) {
        warnings->push_back(fmt::format("{}: the {} backend does not read {} '{}'; ignored, as torchrun does (it "
                                        "reads: {})",
                                        name, to_string(backend), ignored.size() == 1 ? "the key" : "the keys",
                                        fmt::join(ignored, "', '"), detail::launch::keys_of(backend)));
    }
    return settings;
}

[[nodiscard]] ELASTIC_DECL stream_selection parse_stream_selection(std::string_view text, std::string_view name) {
    const auto fail = [&]() {
        return usage_error{fmt::format("{}: want 0 (none), 1 (stdout), 2 (stderr), 3 (both), or per local rank "
                                       "LOCAL_RANK:N,... such as 0:3,1:2",
                                       detail::launch::show(name, text))};
    };
    const auto streams_of = [&](std::string_view digit) {
        const auto value = detail::launch::to_integer(digit);
        if (!value || *value < 0 || *value > 3 || detail::launch::trim(digit) != digit) {
            throw fail();
        }
        return static_cast<std_streams>(*value);
    };
    stream_selection selection;
    const auto trimmed = detail::launch::trim(text);
    if (trimmed.find(':') == std::string_view::npos) {
        selection.every_rank = streams_of(trimmed);
        return selection;
    }
    for (const auto item : detail::launch::split(trimmed, ',')) {
        const auto colon = item.find(':');
        if (colon == std::string_view::npos) {
            throw fail();
        }
        const auto rank = detail::launch::to_integer(item.substr(0, colon));
        if (!rank || *rank < 0 || *rank > INT_MAX ||
            detail::launch::trim(item.substr(0, colon)) != item.substr(0, colon)) {
            throw fail();
        }
        if (!selection.per_rank.emplace(static_cast<int>(*rank), streams_of(item.substr(colon + 1))).second) {
            throw usage_error{fmt::format("{}: local rank {} given twice", detail::launch::show(name, text), *rank)};
        }
    }
    return selection;
}

[[nodiscard]] ELASTIC_DECL std::set<int> parse_local_ranks(std::string_view text, std::string_view name) {
    std::set<int> ranks;
    if (detail::launch::trim(text).empty()) {
        return ranks;
    }
    for (const auto item : detail::launch::split(text, ',')) {
        const auto rank = detail::launch::to_integer(item);
        if (!rank || *rank < 0 || *rank > INT_MAX) {
            throw usage_error{fmt::format("{}: want comma-separated local ranks such as 0,2 ('{}' is not one)",
                                          detail::launch::show(name, text), item)};
        }
        ranks.insert(static_cast<int>(*rank));
    }
    return ranks;
}

[[nodiscard]] ELASTIC_DECL std::vector<std::string> parse_duplicate_filters(std::string_view text) {
    std::vector<std::string> filters;
    std::string item;
    for (std::size_t i = 0; i <= text.size(); ++i) {
        if (i < text.size() && text[i] != ',') {
            item += text[i];
        } else if (i + 1 < text.size() && text[i + 1] == ',') {
            item += ',';  // ",," is a comma inside the item
            ++i;
        } else {
            if (!item.empty()) filters.push_back(std::move(item));
            item.clear();
        }
    }
    return filters;
}

[[nodiscard]] ELASTIC_DECL std::vector<int> parse_signals(std::string_view text, std::string_view name) {
    std::vector<int> numbers;
    for (const auto item : detail::launch::split(text, ',')) {
        auto word = detail::launch::lower(detail::launch::trim(item));
        if (word.rfind("sig", 0) != 0) {
            word = "sig" + word;
        }
        const int number = signal_number(word);
        const auto known = std::find(forwardable_signal_numbers.begin(), forwardable_signal_numbers.end(), number);
        if (number == 0 || known == forwardable_signal_numbers.end()) {
            const bool untrappable = word == "sigkill" || word == "sigstop" || word == "sigchld" || word == "sigsegv" ||
                                     word == "sigbus" || word == "sigfpe" || word == "sigill" || word == "sigabrt" ||
                                     word == "sigtrap" || word == "sigsys" || word == "sigpipe";
            throw usage_error{
                fmt::format("{}: '{}' {} (want names such as SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2)",
                            detail::launch::show(name, text), detail::launch::trim(item),
                            untrappable ? "cannot be trapped and forwarded by the agent" : "is not a signal name")};
        }
        if (std::find(numbers.begin(), numbers.end(), number) == numbers.end()) {
            numbers.push_back(number);
        }
    }
    return numbers;
}

[[nodiscard]] ELASTIC_DECL log_level parse_log_level(std::string_view text, std::string_view name) {
    const auto word = detail::launch::lower(detail::launch::trim(text));
    if (word == "debug") return log_level::debug;
    if (word == "info") return log_level::info;
    if (word == "warning" || word == "warn") return log_level::warning;
    if (word == "error") return log_level::error;
    if (word == "critical" || word == "fatal") return log_level::critical;
    throw usage_error{
        fmt::format("{}: must be DEBUG, INFO, WARNING, ERROR or CRITICAL", detail::launch::show(name, text))};
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/launch/values.hpp ----

#include <fmt/format.h>

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
#include <random>
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
        return restart_settings{max_restarts, restart_backoff, restart_window, restart_on_exit, restart_crash_guard};
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
    std::random_device device;
    std::uint64_t high = (static_cast<std::uint64_t>(device()) << 32) | device();
    std::uint64_t low = (static_cast<std::uint64_t>(device()) << 32) | device();
    high = (high & ~std::uint64_t{0xF000}) | 0x4000;                         // version 4
    low = (low & ~(std::uint64_t{0xC} << 60)) | (std::uint64_t{0x8} << 60);  // variant 10
    return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", high >> 32, (high >> 16) & 0xFFFF, high & 0xFFFF,
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
        return fmt::format("{}", static_cast<int>(selection.every_rank));
    }
    std::string out;
    for (const auto& [rank, streams] : selection.per_rank) {
        out += fmt::format("{}{}:{}", out.empty() ? "" : ",", rank, static_cast<int>(streams));
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
        case rendezvous_backend::static_: rdzv_conf = fmt::format("timeout={}", seconds_text(conf.timeout)); break;
        case rendezvous_backend::c10d:
        case rendezvous_backend::etcd_v3:
            rdzv_conf = fmt::format("join_timeout={}, last_call_timeout={}, close_timeout={}, read_timeout={}",
                                    seconds_text(conf.join_timeout), seconds_text(conf.last_call_timeout),
                                    seconds_text(conf.close_timeout), seconds_text(conf.read_timeout));
            if (conf.is_host) {
                rdzv_conf += fmt::format(", is_host={}", *conf.is_host);
            }
            break;
    }
    std::string signals;
    for (const int number : config.signals_to_handle) {
        signals += (signals.empty() ? "" : ",") + signal_to_string(number);
    }
    std::string filter;
    for (const int rank : config.local_ranks_filter) {
        filter += fmt::format("{}{}", filter.empty() ? "" : ",", rank);
    }
    std::string out = "Starting elastic agent with launch configs:\n";
    const auto line = [&](std::string_view name, std::string_view value) {
        out += fmt::format("  {:<20} : {}\n", name, value);
    };
    line("entrypoint", command);
    line("min_nodes", fmt::format("{}", config.nnodes.min));
    line("max_nodes", fmt::format("{}", config.nnodes.max));
    line("nproc_per_node", fmt::format("{}", config.nproc_per_node));
    line("run_id", config.rdzv_id);
    line("rdzv_backend", to_string(config.rdzv_backend));
    line("rdzv_endpoint", to_string(config.rendezvous_endpoint()));
    line("rdzv_configs", rdzv_conf);
    line("node_rank", config.node_rank ? fmt::format("{}", *config.node_rank) : "(from the rendezvous)");
    line("local_addr", config.local_addr.value_or("(this host's name)"));
    line("role", config.role);
    line("max_restarts", fmt::format("{}", config.max_restarts));
    // The restart policy's other settings appear only when given (docs/policies.md).
    if (config.restart_backoff) line("restart_backoff", config.restart_backoff->flag().substr(18));
    if (config.restart_window) line("restart_window", config.restart_window->flag().substr(17));
    if (config.restart_on_exit) line("restart_on_exit", config.restart_on_exit->to_string());
    if (config.restart_crash_guard) line("restart_crash_guard", config.restart_crash_guard->flag().substr(22));
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
                fmt::format("{}: unknown placeholder '{}' (known: ${{role_name}}, ${{local_rank}}, ${{rank}})",
                            show("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", text), name)};
        }
        i = end - 1;
    }
}

ELASTIC_DECL void check_ranks_exist(const std::set<int>& ranks, int nproc, std::string_view option,
                                    std::string_view nproc_option) {
    for (const int rank : ranks) {
        if (rank < 0 || rank >= nproc) {
            throw usage_error{fmt::format("{} names local rank {}, but this node runs local ranks 0 to {} "
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
            throw usage_error{fmt::format("{}: local rank {} has streams value {} (want 0 to 3)", option, rank,
                                          static_cast<int>(streams))};
        }
    }
    if (static_cast<int>(selection.every_rank) > 3) {
        throw usage_error{
            fmt::format("{}: streams value {} (want 0 to 3)", option, static_cast<int>(selection.every_rank))};
    }
    check_ranks_exist(ranks, nproc, option, nproc_option);
}

ELASTIC_DECL void validate(const launch_config& c, const environment& env, const option_labels& label) {
    const auto nnodes_text = [&] {
        return c.nnodes.min == c.nnodes.max ? fmt::format("{}", c.nnodes.min)
                                            : fmt::format("{}:{}", c.nnodes.min, c.nnodes.max);
    };
    if (c.nproc_per_node < 1 || c.nproc_per_node > 1'000'000) {
        throw usage_error{fmt::format("{}={}: must be a positive integer", label("nproc_per_node"), c.nproc_per_node)};
    }
    if (c.nnodes.min < 1 || c.nnodes.min > c.nnodes.max) {
        throw usage_error{fmt::format("{}={}:{}: want 0 < MIN <= MAX", label("nnodes"), c.nnodes.min, c.nnodes.max)};
    }
    if (c.world_size(c.nnodes.max) > INT_MAX) {
        throw usage_error{fmt::format("{}={} with {}={}: the world size exceeds {}", label("nnodes"), nnodes_text(),
                                      label("nproc_per_node"), c.nproc_per_node, INT_MAX)};
    }
    if (c.role.empty()) {
        throw usage_error{fmt::format("{}: must not be empty", label("role"))};
    }
    // The rendezvous carries the role to the other nodes in at most 255 bytes.
    if (c.role.size() > 255) {
        throw usage_error{fmt::format("{}: {} bytes, at most 255", label("role"), c.role.size())};
    }
    if (c.rdzv_id.empty()) {
        throw usage_error{
            fmt::format("{}: must not be empty (it names the job in the rendezvous store)", label("rdzv_id"))};
    }
    const bool is_static = c.rdzv_backend == rendezvous_backend::static_;
    if (is_static && c.nnodes.min != c.nnodes.max) {
        throw usage_error{fmt::format("{}={}: the static rendezvous has a fixed membership; an elastic range needs "
                                      "--rdzv-backend=c10d or etcd-v3",
                                      label("nnodes"), nnodes_text())};
    }
    if (c.node_rank && (*c.node_rank < 0 || *c.node_rank >= c.nnodes.max)) {
        throw usage_error{fmt::format("{}={}: must be from 0 to {} (below the {} maximum {})", label("node_rank"),
                                      *c.node_rank, c.nnodes.max - 1, label("nnodes"), c.nnodes.max)};
    }
    if (!is_static && (c.master_addr || c.master_port)) {
        throw usage_error{fmt::format("--master-addr/--master-port: only the static rendezvous reads them; the {} "
                                      "backend rendezvouses at --rdzv-endpoint",
                                      to_string(c.rdzv_backend))};
    }
    if (is_static && c.rdzv_endpoint && (c.master_addr || c.master_port)) {
        throw usage_error{"--master-addr/--master-port and --rdzv-endpoint both name the static rendezvous's store; "
                          "give one of them"};
    }
    if (c.master_addr && !valid_host(*c.master_addr)) {
        throw usage_error{fmt::format("{}: must be a host name, an IPv4 or an IPv6 address",
                                      show(label("master_addr"), *c.master_addr))};
    }
    if (c.local_addr && !valid_host(*c.local_addr)) {
        throw usage_error{fmt::format("{}: must be a host name, an IPv4 or an IPv6 address",
                                      show(label("local_addr"), *c.local_addr))};
    }
    if (c.rdzv_endpoint) {
        const auto text = to_string(*c.rdzv_endpoint);
        if (!valid_host(c.rdzv_endpoint->host)) {
            throw usage_error{fmt::format("{}: bad host name", show(label("rdzv_endpoint"), text))};
        }
        if (is_static && !c.rdzv_endpoint->port) {
            throw usage_error{
                fmt::format("{}: the static rendezvous needs a port (host:port)", show(label("rdzv_endpoint"), text))};
        }
    }
    const auto endpoint = c.rendezvous_endpoint();
    if (endpoint.port == 0 && c.nnodes.max > 1) {
        throw usage_error{fmt::format("rendezvous endpoint {}: port 0 picks a free port that other nodes cannot know; "
                                      "it needs {}=1",
                                      to_string(endpoint), label("nnodes"))};
    }
    const auto non_negative = [](std::chrono::milliseconds d, const std::string& what, bool allow_zero) {
        if (d.count() < 0 || (!allow_zero && d.count() == 0)) {
            throw usage_error{fmt::format("{}={}ms: must be {} 0 seconds", what, d.count(), allow_zero ? ">=" : ">")};
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
        throw usage_error{fmt::format("{}={}: must be an integer >= 0", label("max_restarts"), c.max_restarts)};
    }
    non_negative(c.shutdown_timeout, label("shutdown_timeout"), true);
    if (const auto& b = c.restart_backoff;
        b && (b->initial.count() <= 0 || b->cap < b->initial || b->reset_after.count() < 0 || !(b->factor >= 1.0) ||
              !std::isfinite(b->factor) || !(b->jitter >= 0.0 && b->jitter < 1.0))) {
        throw usage_error{
            fmt::format("{}: want 0 < initial <= cap, reset >= 0, factor >= 1 and 0 <= jitter < 1", b->flag())};
    }
    if (const auto& w = c.restart_window; w && (w->restarts < 1 || w->period.count() <= 0)) {
        throw usage_error{fmt::format("{}: want at least 1 restart and a period above 0", w->flag())};
    }
    if (const auto& g = c.restart_crash_guard; g && (g->within.count() <= 0 || g->in_a_row < 1)) {
        throw usage_error{fmt::format("{}: want a time above 0 and N >= 1", g->flag())};
    }
    non_negative(c.monitor_interval, label("monitor_interval"), true);
    non_negative(c.exit_barrier_timeout, "exit_barrier_timeout", true);
    if (c.signals_to_handle.empty()) {
        throw usage_error{fmt::format("{}: must name at least one signal", label("signals_to_handle"))};
    }
    for (const int number : c.signals_to_handle) {
        if (std::find(forwardable_signal_numbers.begin(), forwardable_signal_numbers.end(), number) ==
            forwardable_signal_numbers.end()) {
            throw usage_error{
                fmt::format("{}: signal {} cannot be trapped and forwarded", label("signals_to_handle"), number)};
        }
    }
    if (c.log_dir) {
        if (c.log_dir->empty()) {
            throw usage_error{fmt::format("{}: must not be empty", label("log_dir"))};
        }
        struct stat st {};
        if (!c.logs_disabled() && ::stat(c.log_dir->c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
            throw usage_error{
                fmt::format("{}: exists and is not a directory", show(label("log_dir"), c.log_dir->string()))};
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
// ---- end elastic/launch/config.hpp ----
// ---- begin elastic/launch/nproc.hpp ----
// `--nproc-per-node`: a count, or `cpu` / `gpu` / `auto` resolved from this machine.


#include <fmt/format.h>

#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

namespace elastic::inline v0 {

/// The CPUs this process may run on (its affinity mask, so `taskset` and cgroup cpusets count;
/// torchrun's os.cpu_count() counts the whole machine), at least 1.
[[nodiscard]] ELASTIC_DECL int count_cpus() noexcept;

/// How the GPUs were counted, for messages.
struct gpu_count {
    int count = 0;
    std::string source;  ///< e.g. "CUDA_VISIBLE_DEVICES=0,1" or "nvidia-smi -L"
};

namespace detail::launch {

/// CUDA's reading of CUDA_VISIBLE_DEVICES: entries are device indices or GPU-/MIG- UUIDs, and the
/// first invalid entry hides it and every later one (so "-1" or "" hides all devices).
[[nodiscard]] ELASTIC_DECL int count_visible_devices(std::string_view value);

/// Runs `nvidia-smi -L` (found on env's PATH) and counts its "GPU n: ..." lines; nothing when it
/// is missing or fails. posix_spawn, not fork: safe in a threaded agent.
[[nodiscard]] ELASTIC_DECL std::optional<int> run_nvidia_smi(const environment& env);

}  // namespace detail::launch

/// The GPUs visible to workers: CUDA_VISIBLE_DEVICES when it is set (the devices it lists, as CUDA
/// reads it), else the lines of `nvidia-smi -L`; 0 when neither finds any.
[[nodiscard]] ELASTIC_DECL gpu_count count_gpus(const environment& env);

/// `--nproc-per-node`: a positive integer, `cpu` (count_cpus()), `gpu` (count_gpus(); an error
/// when there are none), or `auto` (the GPUs if there are any, else the CPUs).
[[nodiscard]] ELASTIC_DECL int resolve_nproc_per_node(std::string_view text, std::string_view name,
                                                      const environment& env);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL int count_cpus() noexcept {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) == 0) {
        const int count = CPU_COUNT(&set);
        if (count > 0) {
            return count;
        }
    }
    const auto hardware = std::thread::hardware_concurrency();
    return hardware > 0 ? static_cast<int>(hardware) : 1;
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::launch {

[[nodiscard]] ELASTIC_DECL int count_visible_devices(std::string_view value) {
    int count = 0;
    if (trim(value).empty()) {
        return 0;
    }
    for (const auto item : split(value, ',')) {
        const auto entry = trim(item);
        const auto index = to_integer(entry);
        const bool uuid = entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0;
        if (!uuid && (!index || *index < 0)) {
            break;
        }
        ++count;
    }
    return count;
}

[[nodiscard]] ELASTIC_DECL std::optional<int> run_nvidia_smi(const environment& env) {
    std::string path;
    try {
        path = elastic::find_executable("nvidia-smi", env, "nvidia-smi");
    } catch (const usage_error&) {
        return std::nullopt;
    }
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
        return std::nullopt;
    }
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    ::posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    ::posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    std::string arg0 = "nvidia-smi";
    std::string arg1 = "-L";
    char* argv[] = {arg0.data(), arg1.data(), nullptr};
    pid_t pid = -1;
    const int spawned = ::posix_spawn(&pid, path.c_str(), &actions, nullptr, argv, environ);
    ::posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    std::string output;
    if (spawned == 0) {
        char buffer[4096];
        for (;;) {
            const auto n = ::read(fds[0], buffer, sizeof buffer);
            if (n > 0) {
                output.append(buffer, static_cast<std::size_t>(n));
            } else if (n == 0 || errno != EINTR) {
                break;
            }
        }
    }
    ::close(fds[0]);
    if (spawned != 0) {
        return std::nullopt;
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        return std::nullopt;
    }
    int count = 0;
    for (const auto line : split(output, '\n')) {
        if (line.rfind("GPU ", 0) == 0) {
            ++count;
        }
    }
    return count;
}

}  // namespace detail::launch
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL gpu_count count_gpus(const environment& env) {
    if (const auto* visible = detail::find_variable(env, "CUDA_VISIBLE_DEVICES")) {
        return {detail::launch::count_visible_devices(*visible),
                detail::launch::show("CUDA_VISIBLE_DEVICES", *visible)};
    }
    const auto listed = detail::launch::run_nvidia_smi(env);
    return {listed.value_or(0), listed ? "nvidia-smi -L" : "nvidia-smi -L (not found or failed)"};
}

[[nodiscard]] ELASTIC_DECL int resolve_nproc_per_node(std::string_view text, std::string_view name,
                                                      const environment& env) {
    const auto word = detail::launch::trim(text);
    if (word == "cpu") {
        return count_cpus();
    }
    if (word == "gpu" || word == "auto") {
        const auto gpus = count_gpus(env);
        if (gpus.count > 0) {
            return gpus.count;
        }
        if (word == "auto") {
            return count_cpus();
        }
        throw usage_error{fmt::format("{}: no GPU found ({} shows none); use a number, cpu or auto",
                                      detail::launch::show(name, text), gpus.source)};
    }
    const auto count = detail::launch::to_integer(word);
    if (!count || *count < 1 || *count > 1'000'000) {
        throw usage_error{
            fmt::format("{}: must be a positive integer, cpu, gpu or auto", detail::launch::show(name, text))};
    }
    return static_cast<int>(*count);
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
// ---- end elastic/launch/nproc.hpp ----

// CLI11 only where the parser is compiled: with ELASTIC_SEPARATE_COMPILATION, in
// elastic/impl/src.hpp's file alone (docs/building.md).
#if ELASTIC_DETAIL_BODIES
#include <CLI/CLI.hpp>
#endif
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
inline constexpr std::array<option_spec, 35> option_specs{{
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
    {"--rdzv-endpoint,--rdzv_endpoint", "rdzv_endpoint", false, true, "HOST[:PORT]", "", option_state::implemented,
     2,
     "Where the rendezvous is: host[:port], an IPv6 address as [addr]:port. Default port 29400 for c10d, 2379 "
     "for etcd-v3; static: defaults to --master-addr:--master-port and needs a port."},
    {"--rdzv-id,--rdzv_id", "rdzv_id", false, true, "ID", "none", option_state::implemented, 2,
     "Job id shared by every node of the job; it namespaces the rendezvous."},
    {"--rdzv-conf,--rdzv_conf", "rdzv_conf", false, true, "K=V,...", "", option_state::implemented, 2,
     "Rendezvous settings. c10d: join_timeout (600), last_call_timeout (30), close_timeout (30), read_timeout "
     "(60), keep_alive_interval (1) in seconds, keep_alive_max_attempt (5), is_host (true/false), store_type "
     "(tcp), use_libuv (accepted, no effect), workers_store_peers (members: group rank 0's workers' store "
     "accepts the round's nodes' addresses only; any: every peer, for NAT between the nodes). etcd-v3: the "
     "four timeouts and protocol (http). static: timeout (900). Every backend: exit_barrier_timeout (300), "
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
     "and ranges (1,75-78), signals (any signal, or exit code 128+N) and signal names (SIGKILL)."},
    {"--restart-crash-guard,--restart_crash_guard", "restart_crash_guard", false, true, "T[:N]", "none",
     option_state::implemented, 4,
     "A group that fails within T of its start is not restarted (a start-up crash loop); with :N, only the "
     "N-th such start in a row stops the job. Example: 30s."},
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
    std::string out = fmt::format("usage: {} [options] program [args...]\n\n", program_name);
    detail::launch::wrap(out,
                         "Start and supervise this node's workers, as torchrun does: the same options (dashed or "
                         "underscored spellings), the same PET_* variables (the command line wins), the same worker "
                         "environment.",
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
        out += fmt::format("\n{}:\n", detail::launch::option_groups[static_cast<std::size_t>(group)]);
        for (const auto& spec : detail::launch::option_specs) {
            if (spec.group != group) {
                continue;
            }
            out += "  " + detail::launch::spellings(spec);
            if (!spec.flag) {
                out += fmt::format(" {}", spec.metavar);
            }
            out += '\n';
            std::string help{spec.help};
            std::string facts;
            if (!spec.fallback.empty()) {
                facts = fmt::format("default: {}", spec.fallback);
            }
            if (spec.has_env) {
                facts += fmt::format("{}env: {}", facts.empty() ? "" : "; ", detail::launch::env_name(spec));
            }
            if (!facts.empty()) {
                help += fmt::format(" [{}]", facts);
            }
            detail::launch::wrap(out, help, 6, width);
        }
    }
    out += "\nOther:\n  -h, --help\n";
    detail::launch::wrap(out, "Show this help and exit.", 6, width);
    out += "  --version\n";
    detail::launch::wrap(out, "Show elastic's version and exit.", 6, width);
    out += "\nEnvironment variables also read:\n";
    constexpr std::array<std::pair<std::string_view, std::string_view>, 6> variables{{
        {"PYTHON_EXEC", "Interpreter for .py scripts and -m modules (default python3, found on PATH)."},
        {"PATH", "Where a program named without a '/' is found, as execvp does."},
        {"CUDA_VISIBLE_DEVICES", "The GPUs --nproc-per-node=gpu|auto counts (else nvidia-smi -L)."},
        {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "Default of --shutdown-timeout."},
        {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
         "Prefix of tee'd lines, with ${role_name}, ${local_rank}, ${rank} (default [${role_name}${local_rank}]:)."},
        {"LOGLEVEL", "The agent's log level: DEBUG, INFO, WARNING (default), ERROR or CRITICAL."},
    }};
    for (const auto& [name, text] : variables) {
        out += fmt::format("  {}\n", name);
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
        return fmt::format("{}{} is a flag and takes no value", name.size() == 1 ? "-" : "--", name);
    }
    if (e.get_name() == "ArgumentMismatch" && message.find("required") != std::string::npos) {
        return fmt::format("{} needs a value", message.substr(0, message.find(':')));
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
            throw usage_error{fmt::format("ambiguous option: {} could match {}", name, fmt::join(names, ", "))};
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
    app.set_version_flag("--version", fmt::format("{} (elastic) {}", program_name, version_string));
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
        throw usage_error{fmt::format("unrecognized option {} (see --help; the program and its arguments come after "
                                      "the options)",
                                      rest.front())};
    }
    if (rest.empty()) {
        throw usage_error{fmt::format("no program to run (usage: {} [options] program [args...])", program_name)};
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
        throw usage_error{fmt::format("{}: {}", detail::launch::show(value->name, value->text), spec.help)};
    }
    if (const auto specs = raw("logs_specs"); specs && detail::launch::trim(specs->text) != "default") {
        throw usage_error{fmt::format("{}: not implemented; elastic has only default, torchrun's own log layout, "
                                      "and loads no Python LogsSpecs plugin",
                                      detail::launch::show(specs->name, specs->text))};
    }
    if (const auto method = raw("start_method")) {
        const auto word = detail::launch::trim(method->text);
        if (word != "spawn" && word != "fork" && word != "forkserver") {
            throw usage_error{
                fmt::format("{}: must be spawn, fork or forkserver", detail::launch::show(method->name, method->text))};
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
            throw usage_error{fmt::format("{}: must not be empty", detail::launch::show(v->name, v->text))};
        }
    }
    config.virtual_local_rank = flag("virtual_local_rank");

    // ---- nodes and rendezvous ----
    const bool standalone = flag("standalone");
    if (standalone) {
        for (const auto dest : {"rdzv_endpoint", "rdzv_id", "master_addr", "master_port"}) {
            if (on_command_line(dest)) {
                throw usage_error{fmt::format("{} conflicts with --standalone, which runs the rendezvous on "
                                              "localhost:0 under a random id",
                                              detail::launch::long_name(option_specs[index_of(dest)]))};
            }
        }
        if (const auto v = raw("rdzv_backend"); v && !v->from_env && detail::launch::trim(v->text) != "c10d") {
            throw usage_error{fmt::format("{} conflicts with --standalone, which uses the c10d backend",
                                          detail::launch::show(v->name, v->text))};
        }
        if (const auto v = raw("nnodes"); v && !v->from_env && parse_node_range(v->text, v->name) != node_range{1, 1}) {
            throw usage_error{fmt::format("{} conflicts with --standalone, which runs a single node",
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
            config.rdzv_endpoint = parse_host_port(v->text, v->name);
        }
        if (const auto v = raw("rdzv_id")) {
            config.rdzv_id = v->text;
            if (detail::launch::trim(config.rdzv_id).empty()) {
                throw usage_error{fmt::format("{}: must not be empty", detail::launch::show(v->name, v->text))};
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
    if (const auto v = raw("shutdown_timeout")) {
        config.shutdown_timeout = parse_seconds(v->text, v->name, true);
    } else if (const auto* t = detail::find_variable(env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
               t != nullptr && !t->empty()) {
        config.shutdown_timeout = parse_seconds(*t, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", true);
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
            throw usage_error{fmt::format("{}: must not be empty", detail::launch::show(v->name, v->text))};
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
                fmt::format("{}: must be {}", detail::launch::show(v->name, v->text), event_destination::accepted)};
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
            config.warnings.push_back(fmt::format(
                "--duplicate-{}-filters: no local rank tees its {} (-t), so filtered_{}.log stays empty; tee it "
                "(-t {})",
                name, name, name,
                other_teed                   ? 3
                : stream == std_streams::out ? 1
                                             : 2));
        } else if (config.logs_disabled()) {
            config.warnings.push_back(fmt::format(
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
// ---- end elastic/launch/cli.hpp ----
// ---- begin elastic/launch/default_policy.hpp ----
// make_default_policy(config): the default policy (policy/default_policy.hpp) from a parsed
// command line.


#include <utility>

namespace elastic::inline v0 {

/// make_default_policy(config.restarts(), clock, uniform): the policy elasticrun runs under.
template <policy_clock Clock = steady_policy_clock>
[[nodiscard]] any_restart_policy make_default_policy(const launch_config& config, Clock clock = Clock{},
                                                     uniform_source uniform = random_uniform_source()) {
    return make_default_policy(config.restarts(), std::move(clock), std::move(uniform));
}

}  // namespace elastic::inline v0
// ---- end elastic/launch/default_policy.hpp ----
// ---- begin elastic/launch/run.hpp ----
// elastic::run: a whole launcher in one call — the command line (or a launch_config), the agent
// on an io_context, a restart policy of the caller's choosing, and the exit code.

// The agent itself only where run() is compiled: with ELASTIC_SEPARATE_COMPILATION, in
// elastic/impl/src.hpp's file alone, so a custom launcher's main() parses none of it.
#if ELASTIC_DETAIL_BODIES

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <fmt/format.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace elastic::inline v0 {

#if ELASTIC_DETAIL_BODIES

namespace detail::launch {

inline std::string launcher_name(int argc, const char* const* argv) {
    std::string_view name = argc > 0 && argv[0] != nullptr && argv[0][0] != '\0' ? argv[0] : "elasticrun";
    if (const auto slash = name.rfind('/'); slash != std::string_view::npos && slash + 1 < name.size()) {
        name.remove_prefix(slash + 1);
    }
    return std::string(name);
}

/// Writes the agent's own failure into $TORCHELASTIC_ERROR_FILE (when set), as torchrun's
/// @record on main does for an exception, with errorCode = the exit code; a failure to write
/// is one more line on stderr.
inline void record_agent_exception(std::string_view name, const agent::agent_exception& e) {
    const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (path == nullptr || *path == '\0') return;
    try {
        write_file_atomically(path, agent_exception_document(e.type, e.what, e.exit_code)
                                        .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    } catch (const std::exception& failure) {
        std::fputs(fmt::format("{}: error: {}\n", name, failure.what()).c_str(), stderr);
    }
}

/// Runs `body` and turns the launcher's errors into a message on stderr and an exit code
/// (docs/exit-codes.md): usage_error 2 (nothing was started, or a worker program that cannot run stopped its attempt); rendezvous_error
/// exit_codes::rendezvous; anything else exit_codes::internal. The last two are also written
/// into the agent's own error file ($TORCHELASTIC_ERROR_FILE) with their errorCode; a usage
/// error is not (torchrun's @record does not see argparse's SystemExit either).
template <class Body>
int guarded(std::string_view name, Body&& body) {
    try {
        return body();
    } catch (...) {
        const auto e = agent::classify_exception(std::current_exception());
        std::fputs(fmt::format("{}: error: {}\n", name, e.what).c_str(), stderr);
        if (e.exit_code != exit_codes::usage) record_agent_exception(name, e);
        return e.exit_code;
    }
}

/// run()'s body: the agent on an io_context of its own (this thread) under `how`, a restart
/// policy (the agent's own loop) or an agent_loop.
template <class How>
int run_agent(const launch_config& config, How how, const environment& env, std::string name) {
    asio::io_context context(1);
    local_agent agent(context.get_executor(), config.workers(), config.rendezvous(), config.agent(), env,
                      std::move(name));
    if (agent.log().enabled(log_level::info)) {
        auto banner = describe(config);
        while (!banner.empty() && banner.back() == '\n') banner.pop_back();
        agent.log().info(banner);
    }
    for (const auto& line : config.warnings) agent.log().warning(line);
    std::optional<int> code;
    std::exception_ptr failure;
    auto job = [&] {
        if constexpr (restart_policy<How>) {
            return agent.run(how);
        } else {
            return agent.run_loop(how);
        }
    };
    asio::co_spawn(context, job(), [&](std::exception_ptr e, int c) {
        failure = e;
        code = c;
        context.stop();
    });
    context.run();
    if (failure) {
        agent.events().shutdown(failure);
        std::rethrow_exception(failure);
    }
    agent.events().shutdown(code.value_or(exit_codes::internal));
    return code.value_or(exit_codes::internal);
}

/// Who decides restarts: the built-in policy made from --max-restarts and the --restart-*
/// options, or a policy or loop set in the launcher's code, which reads none of them.
enum class restarts_by { options, code };

/// With the restart policy set in code, the restart options are accepted and not read: a
/// warning says so, rather than a budget the user believes in and nothing enforces.
inline void warn_unread_restart_options(launch_config& config) {
    std::vector<std::string> given;
    if (config.max_restarts != 0) given.push_back(fmt::format("--max-restarts={}", config.max_restarts));
    if (config.restart_backoff) given.push_back(config.restart_backoff->flag());
    if (config.restart_window) given.push_back(config.restart_window->flag());
    if (config.restart_on_exit) given.push_back("--restart-on-exit=" + config.restart_on_exit->to_string());
    if (config.restart_crash_guard) given.push_back(config.restart_crash_guard->flag());
    if (given.empty()) return;
    config.warnings.push_back(fmt::format("{}: not read: this launcher's restart policy is set in its code and decides "
                                          "restarts itself (docs/policies.md)",
                                          fmt::join(given, ", ")));
}

/// run(argc, argv, ...)'s body: parses, prints --help / --version, runs the agent under
/// make_policy(config) (a policy or an agent_loop) and turns errors into an exit code.
template <class MakePolicy>
int run_command_line(int argc, const char* const* argv, restarts_by who, MakePolicy&& make_policy) {
    const auto name = launcher_name(argc, argv);
    return guarded(name, [&] {
        const auto env = current_environment();
        auto parsed = parse_launch_config(argc, argv, env);
        if (const auto* help = std::get_if<help_request>(&parsed)) {
            std::fputs(help->text.c_str(), stdout);
            return 0;
        }
        auto& config = std::get<launch_config>(parsed);
        if (who == restarts_by::code) warn_unread_restart_options(config);
        return run_agent(config, make_policy(config), env, name);
    });
}

}  // namespace detail::launch

/// torchrun's command line under a loop of the caller's (docs/agent.md, "Your own loop"):
/// `loop(job)` is awaited with the job joined and returns the exit code; it is made of the
/// steps of local_agent::job (attempt, finish, decide, follow, interrupted), which keep the
/// rendezvous, the log tree, error files and the event log. Errors become exit codes as in
/// run(argc, argv, policy). A loop is a template, so the agent is compiled in the caller's
/// file: this overload is not there under ELASTIC_SEPARATE_COMPILATION.
template <agent_loop Loop>
int run(int argc, const char* const* argv, Loop loop) {
    return detail::launch::run_command_line(argc, argv, detail::launch::restarts_by::code,
                                            [&](const launch_config&) { return std::move(loop); });
}

#endif  // definitions

#if defined(ELASTIC_SEPARATE_COMPILATION)
namespace detail::launch {
// Compiled once, in elastic/impl/src.hpp's file: the agent under a type-erased policy.
int run_any_policy(const launch_config& config, any_restart_policy policy, const environment& env, std::string name);
int run_command_line_any_policy(int argc, const char* const* argv, any_restart_policy policy);
}  // namespace detail::launch
#endif

/// Runs one node's job as configured, under `policy`, on an io_context of its own (this
/// thread), and returns the exit code (see local_agent::run). `env` is the environment the
/// workers inherit and the agent reads (PATH, PYTHON_EXEC, TORCHELASTIC_ERROR_FILE, ...).
/// Throws usage_error when the configuration asks for something not implemented yet. With
/// ELASTIC_SEPARATE_COMPILATION the policy is held as an any_restart_policy and the agent is
/// the one compiled in elastic/impl/src.hpp's file.
template <restart_policy Policy>
int run(const launch_config& config, Policy policy, const environment& env = current_environment(),
        std::string name = "elasticrun") {
#if defined(ELASTIC_SEPARATE_COMPILATION)
    return detail::launch::run_any_policy(config, any_restart_policy(std::move(policy)), env, std::move(name));
#else
    return detail::launch::run_agent(config, std::move(policy), env, std::move(name));
#endif
}

/// torchrun's command line (docs/cli.md) under the caller's restart policy: parses, prints
/// --help / --version, runs the agent, and returns the exit code — 2 with a one-line message
/// for bad input (nothing started), exit_codes::rendezvous (250) when the rendezvous fails,
/// exit_codes::internal (251) when the agent itself fails (docs/exit-codes.md). A custom
/// launcher is:
///
///     int main(int argc, char** argv) { return elastic::run(argc, argv, my_policy{}); }
template <restart_policy Policy>
int run(int argc, const char* const* argv, Policy policy) {
#if defined(ELASTIC_SEPARATE_COMPILATION)
    return detail::launch::run_command_line_any_policy(argc, argv, any_restart_policy(std::move(policy)));
#else
    return detail::launch::run_command_line(argc, argv, detail::launch::restarts_by::code,
                                            [&](const launch_config&) { return std::move(policy); });
#endif
}

#if defined(ELASTIC_SEPARATE_COMPILATION) && !defined(ELASTIC_IMPL_SOURCE)
/// A loop of the caller's needs the agent compiled in the caller's file: say so, instead of
/// "constraints not satisfied" against the policy overload.
template <class Loop>
requires(!restart_policy<Loop>) int run(int, const char* const*, Loop) {
    static_assert(sizeof(Loop) == 0,
                  "elastic::run(argc, argv, loop): a custom agent loop compiles the agent in this file; build it "
                  "without ELASTIC_SEPARATE_COMPILATION (docs/agent.md, \"Your own loop\")");
    return 0;
}
#endif

#if defined(ELASTIC_SEPARATE_COMPILATION)
/// torchrun's command line with the default policy, make_default_policy(config): built from
/// --max-restarts and the --restart-* options (docs/policies.md).
int run(int argc, const char* const* argv);
#else
/// torchrun's command line with the default policy, make_default_policy(config): built from
/// --max-restarts and the --restart-* options (docs/policies.md). A template only so that a
/// file which includes this header but never calls it does not compile the whole agent.
template <int = 0>
int run(int argc, const char* const* argv) {
    return detail::launch::run_command_line(argc, argv, detail::launch::restarts_by::options,
                                            [](const launch_config& config) { return make_default_policy(config); });
}
#endif

}  // namespace elastic::inline v0
// ---- end elastic/launch/run.hpp ----
// ---- end elastic/launch.hpp ----
// ---- begin elastic/run.hpp ----
// elastic::run(argc, argv[, policy]): the launcher in one call (see elastic/launch/run.hpp).

// ---- end elastic/run.hpp ----
#endif

// The definitions ELASTIC_SEPARATE_COMPILATION compiles in one file (nothing when header-only).
// ---- begin elastic/impl/src.hpp ----
// The definitions that ELASTIC_SEPARATE_COMPILATION leaves out of the headers: elastic::run's
// agent, the command-line parser and elastic::dist::group's members (with the store client). In
// a program built with ELASTIC_SEPARATE_COMPILATION, exactly one file compiles them:
//
//     #define ELASTIC_IMPL_SOURCE
//     #include <elastic/impl/src.hpp>   // or "elastic.hpp", the single header, which has it
//
// (the elastic::compiled CMake target is that file). Without ELASTIC_SEPARATE_COMPILATION this
// header adds nothing: every definition is already inline in the headers.

#ifndef ELASTIC_NO_LAUNCHER
#endif

#include <string>
#include <utility>

#if defined(ELASTIC_IMPL_SOURCE) && !defined(ELASTIC_DETAIL_IMPL_SOURCE_SEEN)
#error "ELASTIC_IMPL_SOURCE must be defined before the first elastic header of the file"
#endif
#if defined(ELASTIC_IMPL_SOURCE) && defined(ELASTIC_NO_LAUNCHER)
#error "the file that defines ELASTIC_IMPL_SOURCE compiles the launcher: it must not define ELASTIC_NO_LAUNCHER"
#endif

#if defined(ELASTIC_SEPARATE_COMPILATION) && defined(ELASTIC_IMPL_SOURCE)

namespace elastic::inline v0 {

namespace detail::launch {

int run_any_policy(const launch_config& config, any_restart_policy policy, const environment& env, std::string name) {
    return run_agent(config, std::move(policy), env, std::move(name));
}

int run_command_line_any_policy(int argc, const char* const* argv, any_restart_policy policy) {
    return run_command_line(argc, argv, restarts_by::code, [&](const launch_config&) { return std::move(policy); });
}

}  // namespace detail::launch

int run(int argc, const char* const* argv) {
    return detail::launch::run_command_line(argc, argv, detail::launch::restarts_by::options,
                                            [](const launch_config& config) { return make_default_policy(config); });
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_SEPARATE_COMPILATION && ELASTIC_IMPL_SOURCE
// ---- end elastic/impl/src.hpp ----
// ---- end elastic.hpp ----
