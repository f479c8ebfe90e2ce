// SPDX-License-Identifier: MIT
// `--nproc-per-node`: a count, or `cpu` / `gpu` / `auto` resolved from this machine.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/agent/program.hpp"
#include "elastic/usage_error.hpp"
#include "elastic/launch/values.hpp"

#include "elastic/detail/format.hpp"

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
        throw usage_error{detail::format("{}: no GPU found ({} shows none); use a number, cpu or auto",
                                         detail::launch::show(name, text), gpus.source)};
    }
    const auto count = detail::launch::to_integer(word);
    if (!count || *count < 1 || *count > 1'000'000) {
        throw usage_error{
            detail::format("{}: must be a positive integer, cpu, gpu or auto", detail::launch::show(name, text))};
    }
    return static_cast<int>(*count);
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
