// SPDX-License-Identifier: MIT
// single_node_rendezvous: the rendezvous of a job that is one node — the trivial model of
// agent_rendezvous, so the agent runs one loop for one node and many.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/rendezvous/concepts.hpp"
#include "elastic/rendezvous/error.hpp"

#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <utility>

namespace elastic::inline v0 {

/// One node is the whole job: every round completes at once with this node as group rank 0 and
/// its own workers' store as MASTER_ADDR:MASTER_PORT; no other node can abort a round, so this
/// node's abort always wins and its decision is the job's; the exit barrier is already complete.
/// There is no shared store to lose. The restart count is the decisions to restart so far.
template <class Defer = void>
class basic_single_node_rendezvous {
public:
    asio::awaitable<void> join(node_info) { co_return; }

    /// Nothing to observe: waits until cancelled.
    asio::awaitable<void> keep_membership() { co_await forever(); }

    asio::awaitable<rendezvous_round> next_round(node_info me) {
        rendezvous_round round;
        round.number = rounds_++;
        round.restart_count = restarts_;
        round.group_rank = 0;
        round.group_world_size = 1;
        round.rank_base = 0;
        round.world_size = me.nproc;
        round.role_rank_base = 0;
        round.role_world_size = me.nproc;
        round.host_in_round = true;
        round.master_addr = std::move(me.store_addr);
        round.master_port = me.store_port;
        decision_.reset();
        co_return round;
    }

    /// No other node: waits until cancelled.
    asio::awaitable<abort_notice> wait_for_abort() {
        co_await forever();
        co_return abort_notice{};
    }

    asio::awaitable<bool> abort(abort_notice) { co_return true; }

    asio::awaitable<job_decision> decide(job_decision decision) {
        if (decision.restart) ++restarts_;
        decision_ = std::move(decision);
        co_return *decision_;
    }

    /// The decision this node made for the round. It is the only node: with none made there is
    /// nothing to await, and rendezvous_error says so.
    asio::awaitable<job_decision> await_decision() {
        if (!decision_) throw rendezvous_error("no decision to await: one node decides its own rounds");
        co_return *decision_;
    }

    asio::awaitable<barrier_result> finish(std::chrono::milliseconds) { co_return barrier_result{}; }
    asio::awaitable<void> leave() { co_return; }

    /// Unreachable in practice (there is no store to lose): the job cannot go on.
    asio::awaitable<std::string> recover(std::string reason, node_info) {
        throw rendezvous_error(std::move(reason));
        co_return std::string();
    }

    [[nodiscard]] int restart_count() const noexcept { return restarts_; }
    void stop() noexcept {}

private:
    static asio::awaitable<void> forever() {
        asio::steady_timer never(co_await asio::this_coro::executor, asio::steady_timer::time_point::max());
        co_await never.async_wait(detail::use_awaitable<Defer>);
    }

    int rounds_ = 0;
    int restarts_ = 0;
    std::optional<job_decision> decision_;
};
using single_node_rendezvous = basic_single_node_rendezvous<>;

static_assert(agent_rendezvous<single_node_rendezvous>);

}  // namespace elastic::inline v0
