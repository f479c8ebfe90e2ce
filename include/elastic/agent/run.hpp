// elastic::run: a whole launcher in one call — the command line (or a launch_config), the agent
// on an io_context, a restart policy of the caller's choosing, and the exit code.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/agent/local_agent.hpp"
#include "elastic/launch/cli.hpp"
#include "elastic/launch/config.hpp"
#include "elastic/launch/usage_error.hpp"
#include "elastic/policy/concepts.hpp"
#include "elastic/policy/from_config.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <fmt/format.h>

#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace elastic::inline v0 {

namespace detail::agent {

inline std::string launcher_name(int argc, const char* const* argv) {
    std::string_view name = argc > 0 && argv[0] != nullptr && argv[0][0] != '\0' ? argv[0] : "elasticrun";
    if (const auto slash = name.rfind('/'); slash != std::string_view::npos && slash + 1 < name.size()) {
        name.remove_prefix(slash + 1);
    }
    return std::string(name);
}

/// Runs `body` and turns the launcher's errors into a message on stderr and an exit code:
/// usage_error 2 (nothing was started), anything else 1.
template <class Body>
int guarded(std::string_view name, Body&& body) {
    try {
        return body();
    } catch (const usage_error& e) {
        std::fputs(fmt::format("{}: error: {}\n", name, e.what()).c_str(), stderr);
        return usage_error::exit_code();
    } catch (const std::exception& e) {
        std::fputs(fmt::format("{}: error: {}\n", name, e.what()).c_str(), stderr);
        return 1;
    }
}

}  // namespace detail::agent

/// Runs one node's job as configured, under `policy`, on an io_context of its own (this
/// thread), and returns the exit code (see local_agent::run). `env` is the environment the
/// workers inherit and the agent reads (PATH, PYTHON_EXEC, TORCHELASTIC_ERROR_FILE, ...).
/// Throws usage_error when the configuration asks for something not implemented yet.
template <restart_policy Policy>
int run(const launch_config& config, Policy policy, const environment& env = current_environment(),
        std::string name = "elasticrun") {
    asio::io_context context(1);
    local_agent agent(context.get_executor(), config, env, std::move(name));
    std::optional<int> code;
    std::exception_ptr failure;
    asio::co_spawn(context, agent.run(policy), [&](std::exception_ptr e, int c) {
        failure = e;
        code = c;
        context.stop();
    });
    context.run();
    if (failure) std::rethrow_exception(failure);
    return code.value_or(1);
}

/// torchrun's command line (docs/cli.md) under the caller's restart policy: parses, prints
/// --help / --version, runs the agent, and returns the exit code — 2 with a one-line message
/// for bad input (nothing started), 1 when the agent itself fails. A custom launcher is:
///
///     int main(int argc, char** argv) { return elastic::run(argc, argv, my_policy{}); }
template <restart_policy Policy>
int run(int argc, const char* const* argv, Policy policy) {
    const auto name = detail::agent::launcher_name(argc, argv);
    return detail::agent::guarded(name, [&] {
        const auto env = current_environment();
        auto parsed = parse_launch_config(argc, argv, env);
        if (const auto* help = std::get_if<help_request>(&parsed)) {
            std::fputs(help->text.c_str(), stdout);
            return 0;
        }
        return run(std::get<launch_config>(parsed), std::move(policy), env, name);
    });
}

/// torchrun's command line with the default policy, make_default_policy(config): built from
/// --max-restarts and the --restart-* options (docs/policies.md).
inline int run(int argc, const char* const* argv) {
    const auto name = detail::agent::launcher_name(argc, argv);
    return detail::agent::guarded(name, [&] {
        const auto env = current_environment();
        auto parsed = parse_launch_config(argc, argv, env);
        if (const auto* help = std::get_if<help_request>(&parsed)) {
            std::fputs(help->text.c_str(), stdout);
            return 0;
        }
        const auto& config = std::get<launch_config>(parsed);
        return run(config, make_default_policy(config), env, name);
    });
}

}  // namespace elastic::inline v0
