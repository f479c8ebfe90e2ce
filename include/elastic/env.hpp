// SPDX-License-Identifier: MIT
// elastic::env(): the worker's typed, validated view of the environment contract (torchrun's
// variables, composer's NODE_RANK, Slurm and Open MPI fallbacks), read once.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/error.hpp"

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
