// SPDX-License-Identifier: MIT
// The environment the agent gives each worker: torchrun's worker contract, name for
// name and meaning for meaning, on top of the agent's own environment.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/agent/spec.hpp"
#include "elastic/process/signal_name.hpp"
#include "elastic/usage_error.hpp"

#include "elastic/detail/format.hpp"

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
    const auto number = [](long long v) { return detail::format("{}", v); };
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
