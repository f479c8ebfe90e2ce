// SPDX-License-Identifier: MIT
// crash_loop_guard: a group that fails within T of its start is not restarted — a start-up crash
// loop is a bug or a bad configuration, not bad luck (--restart-crash-guard=T[:N]).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/policy/combinators.hpp"
#include "elastic/policy/concepts.hpp"
#include "elastic/policy/spec.hpp"

#include <asio/awaitable.hpp>
#include "elastic/detail/format.hpp"

#include <chrono>
#include <stdexcept>
#include <string>

namespace elastic::inline v0 {

/// Stops the job when the group failed within `within` of its start (group_failure::healthy_for,
/// every attempt's own start), or, with `in_a_row` = N > 1, when the N-th attempt in a row did.
/// A group that ran longer restarts and clears the count.
class crash_loop_guard : public named_policy {
public:
    explicit crash_loop_guard(crash_guard_spec spec) : spec_(spec) {
        if (spec_.within <= spec_.within.zero() || spec_.in_a_row < 1) {
            throw std::invalid_argument(detail::format("crash_loop_guard({}, {}): want a time above 0 and N >= 1",
                                                       duration_flag_text(spec_.within), spec_.in_a_row));
        }
    }
    /// crash_loop_guard(30s) or crash_loop_guard(30s, 3).
    explicit crash_loop_guard(std::chrono::milliseconds within, int in_a_row = 1)
        : crash_loop_guard(crash_guard_spec{within, in_a_row}) {}

    [[nodiscard]] const crash_guard_spec& spec() const noexcept { return spec_; }

    restart_plan plan(const group_failure& failure) {
        const auto ran = failure.healthy_for();
        const bool early = ran < spec_.within;
        pending_ = early ? early_ + 1 : 0;
        if (!early) {
            return {restart_decision::restart_because(detail::format("ran {}, past the crash-loop guard of {}",
                                                                     duration_words(ran),
                                                                     duration_words(spec_.within))),
                    {}};
        }
        if (pending_ >= spec_.in_a_row) {
            return {restart_decision::stop_because(
                        spec_.in_a_row == 1
                            ? detail::format("the group failed {} after its start, within the crash-loop guard of {}: "
                                             "not retried ({})",
                                             duration_words(ran), duration_words(spec_.within), named())
                            : detail::format("the group failed {} after its start: {} starts in a row failed within "
                                             "the crash-loop guard of {}: not retried ({})",
                                             duration_words(ran), pending_, duration_words(spec_.within), named())),
                    {}};
        }
        return {restart_decision::restart_because(detail::format("failed {} after its start: {} of {} allowed in a row "
                                                                 "within {} ({})",
                                                                 duration_words(ran), pending_, spec_.in_a_row - 1,
                                                                 duration_words(spec_.within), named())),
                {}};
    }
    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<void> wait(std::chrono::steady_clock::duration) {
        co_return;
    }
    void commit(const group_failure&) { early_ = pending_; }

    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<restart_decision> operator()(const group_failure& failure) {
        return detail::policy::run_planned(*this, failure);
    }

private:
    /// How reasons cite this policy (named_policy).
    [[nodiscard]] std::string named() const { return cite(spec_.code(), spec_.flag()); }

    crash_guard_spec spec_;
    int early_ = 0;
    int pending_ = 0;
};

static_assert(planned_restart_policy<crash_loop_guard>);

}  // namespace elastic::inline v0
