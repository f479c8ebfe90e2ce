// SPDX-License-Identifier: MIT
// The restart_policy concept: a coroutine awaited with a worker group's failure that answers
// restart (after whatever delay it awaits itself) or stop, with a reason in words.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/report/failure.hpp"

#include <asio/awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <concepts>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// What a policy answers.
struct restart_decision {
    enum class action { restart, stop };

    action what = action::stop;
    /// Why, in words, for the agent's log ("restart 1 of 3 (--max-restarts=3)").
    std::string reason;

    [[nodiscard]] bool restart() const noexcept { return what == action::restart; }

    static restart_decision restart_because(std::string why) { return {action::restart, std::move(why)}; }
    static restart_decision stop_because(std::string why) { return {action::stop, std::move(why)}; }
};

/// A worker group's failure, as a restart policy sees it.
///
/// `workers` holds every worker that did not succeed, in report form (report/failure.hpp):
/// those that failed on their own (`failure_state::failed`: exit code or signal, error file,
/// stderr tail, when the agent saw the exit) and those the agent then stopped
/// (`failure_state::stopped_by_agent`). The helpers below answer the usual questions.
struct group_failure {
    /// The failed and the stopped workers of the group (not those that had exited 0).
    std::vector<worker_failure> workers;
    /// Restarts of the group so far in this job (0 at the first failure). The count workers see
    /// as TORCHELASTIC_RESTART_COUNT during the attempt that failed.
    int restarts = 0;
    /// When the failed attempt's workers had all been started.
    std::chrono::steady_clock::time_point started{};
    /// When the agent saw the first failure (the end of the healthy period).
    std::chrono::steady_clock::time_point failed{};
    /// The largest elastic::progress() value this node's workers reported during the attempt
    /// (read through --watchdog's pages); nullopt when none did, or without --watchdog.
    std::optional<std::uint64_t> progress;
    /// Set by the agent for the policy's call: a policy that has decided to restart and is about
    /// to wait before it answers (a backoff) calls it first, with its reason and the wait, so
    /// the log says "restarting ... in 1.8 s" as the wait starts rather than after it. The
    /// built-in chain and models call it; a policy of your own may. Empty: nobody listens.
    std::function<void(const restart_decision&, std::chrono::steady_clock::duration)> before_delay;

    /// How long the group ran healthy before the first failure.
    [[nodiscard]] std::chrono::steady_clock::duration healthy_for() const noexcept { return failed - started; }

    /// The workers that failed on their own (never those the agent stopped).
    [[nodiscard]] std::vector<const worker_failure*> failures() const {
        std::vector<const worker_failure*> out;
        for (const auto& w : workers) {
            if (w.state == failure_state::failed) out.push_back(&w);
        }
        return out;
    }

    /// The root cause: the first failure by time (report's root_cause rule); null when no
    /// worker failed on its own.
    [[nodiscard]] const worker_failure* root_cause() const noexcept {
        const auto i = elastic::root_cause(std::span<const worker_failure>(workers));
        return i ? &workers[*i] : nullptr;
    }

    /// The local ranks and global ranks that failed on their own, in rank order.
    [[nodiscard]] std::vector<int> failed_local_ranks() const {
        std::vector<int> out;
        for (const auto* w : failures()) out.push_back(w->local_rank);
        std::sort(out.begin(), out.end());
        return out;
    }
    [[nodiscard]] std::vector<int> failed_global_ranks() const {
        std::vector<int> out;
        for (const auto* w : failures()) out.push_back(w->global_rank);
        std::sort(out.begin(), out.end());
        return out;
    }
};

/*
 * restart_policy: what a model must provide and what it promises.
 *
 *   asio::awaitable<restart_decision> operator()(const group_failure& failure);
 *
 * - The agent awaits it once per failed attempt, after the group has been stopped, on the
 *   agent's io_context (one thread: a policy needs no locks). The failure lives until the
 *   awaitable completes.
 * - A policy may await anything before answering (a backoff timer, a store, an operator): the
 *   agent races the await against the signals it handles, so a policy must be cancellable at
 *   its suspension points (Asio's timers and sockets are).
 * - It may keep state across calls (a budget spent, a window of failures); the agent holds
 *   one object for the whole job and calls it through a non-const reference.
 * - Combinators (`a | b`: the first to say stop wins, delays add up) take models by value and
 *   are models themselves; that is why the call is the only requirement.
 */
template <class P>
concept restart_policy = std::move_constructible<P> && requires(P& p, const group_failure& f) {
    { p(f) } -> std::same_as<asio::awaitable<restart_decision>>;
};

}  // namespace elastic::inline v0
