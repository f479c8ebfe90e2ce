// SPDX-License-Identifier: MIT
// make_default_policy(settings): the restart policy elasticrun runs under, built from
// --max-restarts and the --restart-* options (restart_settings; launch_config::restarts()).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/policy/backoff.hpp"
#include "elastic/policy/clock.hpp"
#include "elastic/policy/combinators.hpp"
#include "elastic/policy/crash_loop.hpp"
#include "elastic/policy/no_progress.hpp"
#include "elastic/policy/exit_codes.hpp"
#include "elastic/policy/max_restarts.hpp"
#include "elastic/policy/spec.hpp"
#include "elastic/policy/window.hpp"

#include <optional>
#include <utility>

namespace elastic::inline v0 {

/// The default policy, in this order (the first to say stop wins; docs/policies.md):
///
///     restart_on_exit(--restart-on-exit) | crash_loop_guard(--restart-crash-guard)
///       | no_progress(--restart-no-progress) | max_restarts(--max-restarts)
///       | restart_window(--restart-window) | backoff(--restart-backoff)
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
    optional_policy<no_progress> stalls;
    if (settings.no_progress) stalls = optional_policy<no_progress>(by_option(no_progress(*settings.no_progress)));
    optional_policy<basic_backoff<Clock>> delay;
    if (settings.backoff) {
        delay = optional_policy<basic_backoff<Clock>>(by_option(basic_backoff<Clock>(*settings.backoff, clock,
                                                                                     std::move(uniform))));
    }
    const auto budget = by_option(max_restarts(settings.max_restarts));
    if (settings.window) {
        auto window = by_option(basic_restart_window<Clock>(*settings.window, clock));
        if (settings.max_restarts == 0) {
            return chain(std::move(exits), std::move(guard), std::move(stalls), std::move(window), std::move(delay));
        }
        return chain(std::move(exits), std::move(guard), std::move(stalls), budget, std::move(window),
                     std::move(delay));
    }
    return chain(std::move(exits), std::move(guard), std::move(stalls), budget, std::move(delay));
}

}  // namespace elastic::inline v0
