// SPDX-License-Identifier: MIT
// elastic::run: a whole launcher in one call — the command line (or a launch_config), the agent
// on an io_context, a restart policy of the caller's choosing, and the exit code.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/launch/config.hpp"
#include "elastic/launch/status_command.hpp"
#include "elastic/usage_error.hpp"
#include "elastic/policy/combinators.hpp"
#include "elastic/policy/concepts.hpp"
// The agent itself only where run() is compiled: with ELASTIC_SEPARATE_COMPILATION, in
// elastic/impl/src.hpp's file alone, so a custom launcher's main() parses none of it.
#if ELASTIC_DETAIL_BODIES
#include "elastic/agent/agent_events.hpp"
#include "elastic/agent/local_agent.hpp"
#include "elastic/rendezvous/etcd_rendezvous.hpp"
#include "elastic/launch/cli.hpp"
#include "elastic/agent/agent_log.hpp"
#include "elastic/launch/default_policy.hpp"
#include "elastic/report/agent_error_file.hpp"
#include "elastic/report/exit_codes.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include "elastic/detail/format.hpp"
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
        std::fputs(detail::format("{}: error: {}\n", name, failure.what()).c_str(), stderr);
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
        std::fputs(detail::format("{}: error: {}\n", name, e.what).c_str(), stderr);
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
    if (config.max_restarts != 0) given.push_back(detail::format("--max-restarts={}", config.max_restarts));
    if (config.restart_backoff) given.push_back(config.restart_backoff->flag());
    if (config.restart_window) given.push_back(config.restart_window->flag());
    if (config.restart_on_exit) given.push_back("--restart-on-exit=" + config.restart_on_exit->to_string());
    if (config.restart_crash_guard) given.push_back(config.restart_crash_guard->flag());
    if (config.restart_no_progress)
        given.push_back(detail::format("--restart-no-progress={}", *config.restart_no_progress));
    if (given.empty()) return;
    config.warnings.push_back(
        detail::format("{}: not read: this launcher's restart policy is set in its code and decides "
                       "restarts itself (docs/policies.md)",
                       fmt::join(given, ", ")));
}

/// run(argc, argv, ...)'s body: parses, prints --help / --version, runs the agent under
/// make_policy(config) (a policy or an agent_loop) and turns errors into an exit code.
template <class MakePolicy>
int run_command_line(int argc, const char* const* argv, restarts_by who, MakePolicy&& make_policy) {
    const auto name = launcher_name(argc, argv);
    return guarded(name, [&] {
        // `elasticrun status ...`: what the agents on this machine say (a program named status
        // runs as ./status).
        if (argc >= 2 && std::string_view(argv[1]) == "status") return status_command(argc - 1, argv + 1, name);
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
