// SPDX-License-Identifier: MIT
// Time for restart policies: the policy_clock concept, steady_policy_clock (steady_clock and an
// asio::steady_timer) and manual_policy_clock (time that moves only when a test advances it).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"

#include <asio/awaitable.hpp>
#include <asio/error.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/system_error.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <memory>
#include <vector>

namespace elastic::inline v0 {

/*
 * policy_clock: where a restart policy reads the time and how it waits.
 *
 *   std::chrono::steady_clock::time_point now() const;
 *   asio::awaitable<void> sleep(std::chrono::steady_clock::duration) const;
 *
 * - now() is on the steady clock's scale, the scale of group_failure::started / failed.
 * - sleep() completes after the duration (at once for zero or less) on the awaiting coroutine's
 *   executor, and is cancellable like an Asio timer: a cancelled sleep throws
 *   asio::system_error(operation_aborted), so an agent racing the policy against a signal is
 *   never held up by a backoff.
 * - Copies share one time: a policy holds its clock by value.
 */
template <class C>
concept policy_clock = std::copy_constructible<C> && requires(const C& c, std::chrono::steady_clock::duration d) {
    { c.now() } -> std::same_as<std::chrono::steady_clock::time_point>;
    { c.sleep(d) } -> std::same_as<asio::awaitable<void>>;
};

/// The production clock: std::chrono::steady_clock, and an asio::steady_timer to wait.
struct steady_policy_clock {
    [[nodiscard]] std::chrono::steady_clock::time_point now() const noexcept {
        return std::chrono::steady_clock::now();
    }

    /// Static in substance: the timer lives in the coroutine frame, not in the clock.
    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<void> sleep(std::chrono::steady_clock::duration d) const {
        if (d <= std::chrono::steady_clock::duration::zero()) co_return;
        asio::steady_timer timer(co_await asio::this_coro::executor, d);
        co_await timer.async_wait(detail::use_awaitable<Defer>);
    }
};

static_assert(policy_clock<steady_policy_clock>);

/// A clock for tests: now() stands still until advance(); a sleep completes when advance() has
/// moved the time to or past its deadline. Nothing sleeps for real. Copies share the time.
///
/// A pending sleep is an asio::steady_timer set to expire never; advance() cancels the timers
/// whose deadline has come, marking them woken, so the coroutine resumes on its own executor
/// through the ordinary completion path (and a real cancellation, unmarked, still throws).
class manual_policy_clock {
public:
    using time_point = std::chrono::steady_clock::time_point;
    using duration = std::chrono::steady_clock::duration;

    /// Time starts at `start`: by default one day past the steady clock's epoch, so that
    /// `now() - window` never goes below the epoch.
    explicit manual_policy_clock(time_point start = time_point{} + std::chrono::hours(24))
        : state_(std::make_shared<state>()) {
        state_->now = start;
    }

    [[nodiscard]] time_point now() const noexcept { return state_->now; }

    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<void> sleep(duration d) const {
        const auto shared = state_;  // the clock object may go before the sleep ends
        shared->requested.push_back(d);
        if (d <= duration::zero()) co_return;
        asio::steady_timer timer(co_await asio::this_coro::executor, time_point::max());
        sleeper me{shared->now + d, &timer, false};
        shared->sleepers.push_back(&me);
        struct unlist {
            state* s;
            sleeper* me;
            ~unlist() { std::erase(s->sleepers, me); }
        } guard{shared.get(), &me};
        asio::error_code ignored;  // woken or cancelled: `woken` tells which
        co_await timer.async_wait(asio::redirect_error(detail::use_awaitable<Defer>, ignored));
        if (!me.woken) throw asio::system_error(asio::error::operation_aborted);
    }

    /// Moves the time forward by `d` and wakes every sleep whose deadline has come (they resume
    /// when their io_context next runs handlers).
    void advance(duration d) {
        state_->now += d;
        for (auto* s : state_->sleepers) {
            if (!s->woken && s->deadline <= state_->now) {
                s->woken = true;
                s->timer->cancel();
            }
        }
    }

    /// Sleeps begun and not finished.
    [[nodiscard]] std::size_t sleeping() const noexcept { return state_->sleepers.size(); }

    /// The deadline of the earliest pending sleep, or time_point::max() when none.
    [[nodiscard]] time_point next_deadline() const noexcept {
        time_point next = time_point::max();
        for (const auto* s : state_->sleepers) next = std::min(next, s->deadline);
        return next;
    }

    /// Every duration sleep() was called with, in order (zero ones included).
    [[nodiscard]] const std::vector<duration>& sleeps() const noexcept { return state_->requested; }

private:
    struct sleeper {
        time_point deadline;
        asio::steady_timer* timer;
        bool woken;
    };
    struct state {
        time_point now{};
        std::vector<sleeper*> sleepers;
        std::vector<duration> requested;
    };
    std::shared_ptr<state> state_;
};

static_assert(policy_clock<manual_policy_clock>);

}  // namespace elastic::inline v0
