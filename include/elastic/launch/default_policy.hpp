// SPDX-License-Identifier: MIT
// make_default_policy(config): the default policy (policy/default_policy.hpp) from a parsed
// command line.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/launch/config.hpp"
#include "elastic/policy/default_policy.hpp"
#include "elastic/detail/format.hpp"

#include <utility>

namespace elastic::inline v0 {

/// make_default_policy(config.restarts(), clock, uniform): the policy elasticrun runs under.
template <policy_clock Clock = steady_policy_clock>
[[nodiscard]] any_restart_policy make_default_policy(const launch_config& config, Clock clock = Clock{},
                                                     uniform_source uniform = random_uniform_source()) {
    if (config.restart_no_progress && !config.watchdog.enabled()) {
        throw usage_error{detail::format("--restart-no-progress={} needs --watchdog: the workers' progress "
                                         "(elastic::progress) is read from the watchdog's pages (docs/watchdog.md)",
                                         *config.restart_no_progress)};
    }
    return make_default_policy(config.restarts(), std::move(clock), std::move(uniform));
}

}  // namespace elastic::inline v0
