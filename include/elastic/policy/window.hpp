// SPDX-License-Identifier: MIT
// restart_window: at most N restarts within any period, a sliding window
// (--restart-window=N/PERIOD).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/policy/clock.hpp"
#include "elastic/policy/combinators.hpp"
#include "elastic/policy/concepts.hpp"
#include "elastic/policy/spec.hpp"

#include <asio/awaitable.hpp>
#include "elastic/detail/format.hpp"

#include <chrono>
#include <deque>
#include <stdexcept>
#include <utility>

namespace elastic::inline v0 {

/// A budget per time window: restart while fewer than N restarts were made in the last PERIOD
/// (as the clock counts, restarts being timed when they happen, after any backoff); stop once N
/// were. Unlike max_restarts, a job that fails rarely runs for ever.
template <policy_clock Clock = steady_policy_clock>
class basic_restart_window : public named_policy {
public:
    explicit basic_restart_window(window_spec spec, Clock clock = Clock{}) : spec_(spec), clock_(std::move(clock)) {
        if (spec_.restarts < 1 || spec_.period <= spec_.period.zero()) {
            throw std::invalid_argument(
                detail::format("restart_window({}, {}): want at least 1 restart and a period above 0", spec_.restarts,
                               duration_flag_text(spec_.period)));
        }
    }
    /// restart_window(5, 1h).
    basic_restart_window(int restarts, std::chrono::milliseconds period, Clock clock = Clock{})
        : basic_restart_window(window_spec{restarts, period}, std::move(clock)) {}

    [[nodiscard]] const window_spec& spec() const noexcept { return spec_; }
    /// Restarts made within the last period, as of now.
    [[nodiscard]] int recent() {
        forget_old();
        return static_cast<int>(times_.size());
    }

    restart_plan plan(const group_failure&) {
        const int made = recent();
        if (made >= spec_.restarts) {
            const auto since = clock_.now() - times_.front();
            return {restart_decision::stop_because(detail::format(
                        "the restart window is spent: {} restart{} within the last {}, the first {} ago ({})", made,
                        made == 1 ? "" : "s", duration_words(spec_.period), duration_words(since), named())),
                    {}};
        }
        return {restart_decision::restart_because(detail::format("restart {} of {} within {} ({})", made + 1,
                                                                 spec_.restarts, duration_words(spec_.period),
                                                                 named())),
                {}};
    }
    asio::awaitable<void> wait(std::chrono::steady_clock::duration d) { return clock_.sleep(d); }
    void commit(const group_failure&) { times_.push_back(clock_.now()); }

    asio::awaitable<restart_decision> operator()(const group_failure& failure) {
        return detail::policy::run_planned(*this, failure);
    }

private:
    /// How reasons cite this policy (named_policy).
    [[nodiscard]] std::string named() const { return this->cite(spec_.code(), spec_.flag()); }

    void forget_old() {
        const auto now = clock_.now();
        while (!times_.empty() && now - times_.front() >= spec_.period) times_.pop_front();
    }

    window_spec spec_;
    Clock clock_;
    std::deque<std::chrono::steady_clock::time_point> times_;
};

/// The production window (steady clock).
using restart_window = basic_restart_window<>;

static_assert(planned_restart_policy<restart_window>);

}  // namespace elastic::inline v0
