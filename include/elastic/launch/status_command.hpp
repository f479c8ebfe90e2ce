// SPDX-License-Identifier: MIT
// `elasticrun status`: what the agents of this user on this machine say of their jobs, read
// from their status files (docs/status.md), as a table or as JSON.
#pragma once

#include "elastic/agent/status.hpp"
#include "elastic/detail/config.hpp"

#include <string>
#include <string_view>

namespace elastic::inline v0::detail::launch {

/// `elasticrun status [--rdzv-id=ID] [--json]`; argv[0] is "status". Returns the exit code: 0
/// when an agent was found, 1 when none runs (or none of run ID), 2 for bad arguments.
[[nodiscard]] ELASTIC_DECL int status_command(int argc, const char* const* argv, std::string_view launcher);

}  // namespace elastic::inline v0::detail::launch

#if ELASTIC_DETAIL_BODIES

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <vector>

namespace elastic::inline v0::detail::launch {

ELASTIC_DECL int status_command(int argc, const char* const* argv, std::string_view launcher) {
    bool json = false;
    std::optional<std::string> run_id;
    const auto usage = fmt::format(
        "usage: {} status [--rdzv-id=ID] [--json]\n\n"
        "Shows the elasticrun agents of this user on this machine: each one's job, round, state and restarts,\n"
        "and each worker's state, last heartbeat, progress and section (--watchdog).\n\n"
        "  --rdzv-id=ID  only the agents of this run id\n"
        "  --json        one JSON array of the agents' status objects (docs/status.md)\n",
        launcher);
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--json") {
            json = true;
        } else if (arg == "-h" || arg == "--help") {
            std::fputs(usage.c_str(), stdout);
            return 0;
        } else if (arg.rfind("--rdzv-id=", 0) == 0 || arg.rfind("--rdzv_id=", 0) == 0) {
            run_id = std::string(arg.substr(10));
        } else if ((arg == "--rdzv-id" || arg == "--rdzv_id") && i + 1 < argc) {
            run_id = argv[++i];
        } else if (arg.rfind("--rdzv-endpoint", 0) == 0 || arg.rfind("--rdzv_endpoint", 0) == 0) {
            std::fprintf(stderr,
                         "%.*s status: %.*s: only the agents of this machine can be asked (their status files); "
                         "run status on a node of the job, or scrape each agent's --metrics-port /status\n",
                         static_cast<int>(launcher.size()), launcher.data(), static_cast<int>(arg.size()), arg.data());
            return 2;
        } else {
            std::fprintf(stderr, "%.*s status: unknown argument '%.*s'\n%s", static_cast<int>(launcher.size()),
                         launcher.data(), static_cast<int>(arg.size()), arg.data(), usage.c_str());
            return 2;
        }
    }
    const auto dir = status_directory();
    auto agents = read_statuses(dir);
    if (run_id) std::erase_if(agents, [&](const agent_status& a) { return a.run_id != *run_id; });
    if (json) {
        auto array = nlohmann::json::array();
        for (const auto& a : agents) array.push_back(nlohmann::json::parse(status_json(a)));
        std::fputs((array.dump(2) + "\n").c_str(), stdout);
    } else if (!agents.empty()) {
        std::fputs(status_table(agents, detail::agent::unix_ms()).c_str(), stdout);
    }
    if (agents.empty()) {
        std::fprintf(stderr, "%.*s status: no agent%s of this user runs on this machine (status files in %s)\n",
                     static_cast<int>(launcher.size()), launcher.data(),
                     run_id ? fmt::format(" of run '{}'", *run_id).c_str() : "", dir.c_str());
        return 1;
    }
    return 0;
}

}  // namespace elastic::inline v0::detail::launch

#endif  // ELASTIC_DETAIL_BODIES
