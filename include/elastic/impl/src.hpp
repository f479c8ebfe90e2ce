// SPDX-License-Identifier: MIT
// The definitions that ELASTIC_SEPARATE_COMPILATION leaves out of the headers: elastic::run's
// agent, the command-line parser and elastic::dist::group's members (with the store client). In
// a program built with ELASTIC_SEPARATE_COMPILATION, exactly one file compiles them:
//
//     #define ELASTIC_IMPL_SOURCE
//     #include <elastic/impl/src.hpp>   // or "elastic.hpp", the single header, which has it
//
// (the elastic::compiled CMake target is that file). Without ELASTIC_SEPARATE_COMPILATION this
// header adds nothing: every definition is already inline in the headers.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/dist.hpp"
#include "elastic/policy/combinators.hpp"
#ifndef ELASTIC_NO_LAUNCHER
#include "elastic/launch/cli.hpp"
#include "elastic/launch/default_policy.hpp"
#include "elastic/launch/run.hpp"
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
