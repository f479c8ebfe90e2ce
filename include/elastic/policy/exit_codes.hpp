// SPDX-License-Identifier: MIT
// Exit-code classes: restart only when the root cause ended in a retryable way (a named set of
// exit codes, signals), stop at once on anything else (--restart-on-exit=SET) — or the reverse.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/policy/combinators.hpp"
#include "elastic/policy/concepts.hpp"
#include "elastic/policy/spec.hpp"
#include "elastic/process/exit.hpp"

#include <asio/awaitable.hpp>
#include "elastic/detail/format.hpp"

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
        return detail::format("{}(\"{}\")", mode_ == mode::restart_listed ? "restart_on_exit" : "stop_on_exit",
                              set_.to_string());
    }
    /// The command-line form ("--restart-on-exit=1,3-5,signals"); stop_on_exit has no option
    /// and shows its C++ form.
    [[nodiscard]] std::string flag() const {
        return mode_ == mode::restart_listed ? detail::format("--restart-on-exit={}", set_.to_string()) : code();
    }

    restart_plan plan(const group_failure& failure) {
        const auto* root = failure.root_cause();
        if (root == nullptr) return {restart_decision::restart_because("no worker failed on its own"), {}};
        const auto& status = root->status;
        // A hang is its own kind of ending: only `hang` matches it, not how the stop ended it.
        const std::string ending = detail::format("local_rank {} {}", root->local_rank,
                                                  root->hang ? root->hang->headline() : status.describe());
        const bool listed = root->hang ? set_.hang : set_.contains(status);
        if (mode_ == mode::restart_listed) {
            if (listed)
                return {restart_decision::restart_because(detail::format("{}: retryable ({})", ending, named())), {}};
            return {restart_decision::stop_because(detail::format("{}: not retryable, stopping at once ({})", ending,
                                                                  named())),
                    {}};
        }
        if (listed)
            return {restart_decision::stop_because(detail::format("{}: fatal, stopping at once ({})", ending, named())),
                    {}};
        return {restart_decision::restart_because(detail::format("{}: not fatal ({})", ending, named())), {}};
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
