// SPDX-License-Identifier: MIT
// store_rendezvous: the fixed-membership rendezvous over any `store` model (docs/rendezvous.md):
// per-node keys, O(1) store operations per node per round, waiting by store notification.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/rendezvous/codec.hpp"
#include "elastic/rendezvous/concepts.hpp"
#include "elastic/rendezvous/error.hpp"
#include "elastic/rendezvous/membership.hpp"
#include "elastic/rendezvous/planner.hpp"
#include "elastic/store/concepts.hpp"
#include "elastic/store/errors.hpp"
#include "elastic/store/lease.hpp"

#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include "elastic/detail/format.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace elastic::inline v0 {

namespace detail::rendezvous {

/// The error of a request that failed while this node's lease at `store_name` held on for
/// `within` (store_rendezvous::confirm_store_lost said no): the error was that request's alone.
inline std::string request_failed_alone(const std::string& reason, std::chrono::milliseconds within,
                                        std::string_view store_name) {
    return detail::format("{} (this node's lease at {} did not end within {} ms: {} still holds this node, the failure "
                          "was that request's alone)",
                          reason, store_name, within.count(), store_name);
}

}  // namespace detail::rendezvous

/// How a store_rendezvous behaves.
struct store_rendezvous_options {
    std::string run_id = "none";  ///< --rdzv-id: namespaces every key
    int nnodes = 1;               ///< MAX: a round completes at once when this many nodes joined
    int min_nodes = 0;            ///< MIN (0: nnodes, fixed membership)
    /// A round must complete within this (--rdzv-conf join_timeout; static: timeout).
    std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
    /// MIN < MAX: how long the job's first round waits for more nodes once MIN joined; later
    /// rounds complete as soon as every live node joined, and wait at most this for a straggler.
    std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
    /// The store's host waits this long for the others to leave before it stops serving.
    std::chrono::milliseconds close_timeout{std::chrono::seconds(30)};
    /// Whether this node hosts the store: leave() then waits for every other node to leave.
    bool hosts_store = false;
    /// Check (and claim) torchrun's key for the run id, so a Python agent and ours never mix.
    bool torchrun_guard = true;
    /// Where the rendezvous reports what a user should see (standby, membership); may be empty.
    std::function<void(std::string_view)> log;
    /// Where it reports a store value it ignored (not valid: a broken or hostile client wrote
    /// it); `log` when empty. The agent logs these as warnings.
    std::function<void(std::string_view)> warn;
    /// The job's restart budget when every node's policy is --max-restarts (a restart decision
    /// past it is ignored); none: any count the job's `restarts` key backs is accepted.
    std::optional<int> max_restarts;
    /// How a node's loss came about, as the membership restart's reason says it.
    std::string loss_cause = "its agent's connection to the rendezvous store ended or went silent";
    /// Whether the store may be cut off from part of the job, which then moves it and goes on
    /// (an agent-hosted store): an elastic job then forms rounds under the split-brain rule,
    /// and each member records that it learned of its round (`acked/<group rank>`). A store
    /// that is itself a quorum (etcd) turns it off.
    bool split_guard = true;
    /// After the store moved, while no round has formed where it went and the round this node
    /// waits in lacks the majority it needs: whether the store where this node's last round
    /// formed answers again (then why, in a few words), which the node goes back to. Called at
    /// each progress line of the wait; it must not block (it reports the last look, and may
    /// start the next). Empty: a node waits at the moved store until its join timeout.
    std::function<std::optional<std::string>()> origin_answers;

    [[nodiscard]] int min() const noexcept { return min_nodes > 0 ? min_nodes : nnodes; }
    [[nodiscard]] bool elastic() const noexcept { return min() < nnodes; }
};

/// The rendezvous over any `store` (docs/rendezvous.md has the algorithm). Per round and node:
/// one `add` (arrival index), one `set` (its info), one `wait` and one `get` (its assignment);
/// the node that completes the round also does one `multi_get` of every info and one
/// `multi_set` of every assignment. Nothing polls: waits are store pushes.
///
/// Fixed membership (MIN = MAX): a round completes when MAX nodes joined. Elastic membership
/// (MIN < MAX): the job's first round completes at MAX, or last_call_timeout after MIN joined;
/// a later round as soon as every live node joined (at least MIN). A node arriving at a round
/// that runs with fewer than MAX nodes aborts it (the members restart to admit it); one arriving
/// at a full round waits as a standby until a member goes or the job ends.
///
/// Liveness (start_liveness, on a connection of its own that holds this node's lease): a lost
/// member aborts the running round at once, and a lost node no longer counts as live for a
/// forming one. `store` serves requests in turn; `watcher` carries the long waits (a TCP client
/// serves one request at a time; a memory_store may be passed twice). All must outlive this
/// object. Use it on the stores' thread.
template <store Store>
class store_rendezvous {
public:
    store_rendezvous(Store& store, Store& watcher, store_rendezvous_options options)
        : store_(&store), watcher_(&watcher), options_(std::move(options)) {}

    [[nodiscard]] const store_rendezvous_options& options() const noexcept { return options_; }
    /// The current round (-1 before the first).
    [[nodiscard]] int round_number() const noexcept { return round_; }
    /// Job-wide restarts so far (agreed through the store).
    [[nodiscard]] int restart_count() const noexcept { return restarts_; }

    // ---- liveness ---------------------------------------------------------------------------

    /// The lease group of this job's nodes.
    [[nodiscard]] std::string lease_group() const { return job_key("nodes"); }

    /// Holds this node's lease (name `me.id`) on `lease`, a connection used for nothing else,
    /// and counts the node as registered. Call once, before the first round; then run
    /// keep_membership() for as long as the node is in the job.
    // clang-format off
    asio::awaitable<void> start_liveness(Store& lease, node_info me)
        requires requires(Store& s, std::string k, std::string v) {
            { s.hold_lease(k, v) } -> std::same_as<asio::awaitable<void>>;
        }
    {
        // clang-format on
        auto log = std::make_shared<detail::rendezvous::membership_log>(co_await asio::this_coro::executor);
        co_await lease.hold_lease(lease_key(lease_group(), me.id), detail::rendezvous::encode(me));
        // A store that keeps leases counts their losses from the first lease it binds: no
        // counter now means a store that does not (PyTorch's TCPStore), where every wait for a
        // loss would wait for ever. Said at once, before anything else is written there.
        if (std::vector<std::string> epoch{lease_epoch_key(lease_group())}; !co_await lease.check(std::move(epoch))) {
            std::vector<std::string> torchrun{detail::rendezvous::torchrun_key(options_.run_id)};
            if (options_.torchrun_guard && co_await lease.check(std::move(torchrun)))
                throw rendezvous_error(torchrun_state_message());
            throw rendezvous_error(
                "it keeps no leases, so it is no elastic store: a PyTorch TCPStore (one a torchrun agent "
                "hosts, or one a finished job's workers left on this port) or another program listens there; point "
                "--rdzv-endpoint at the port an elasticrun agent hosts its store on, or free this one");
        }
        if (std::exchange(moved_, false) && known_round_ >= 0) co_await record_moved_from(lease);
        (void)co_await lease.add(job_key("registered"), 1);
        log->epoch = co_await read_epoch(lease, 0);
        lease_ = &lease;
        id_ = me.id;
        auto previous = std::exchange(members_, std::move(log));
        if (previous) previous->changed();  // a moved store: the observer follows
    }

    /// The rendezvous store was lost and the job moves to `store` and `watcher` (connections
    /// to a successor's idle server): the next round continues the numbering, needs a majority
    /// of the last round's members (a minority cut off from the store never goes on alone),
    /// and completes at once when every other member of the last round joined, else
    /// last_call_timeout after the majority. Then call start_liveness() with a new connection.
    void move_to(Store& store, Store& watcher, bool hosts_it) {
        store_ = &store;
        watcher_ = &watcher;
        options_.hosts_store = hosts_it;
        const auto moved = detail::rendezvous::after_store_moved(size_, host_in_round_);
        quorum_ = moved.quorum;
        majority_of_ = std::max(size_, 1);
        prior_of_ = 0;
        target_ = moved.target;
        phase_ = phase::idle;
        moved_ = true;
        after_move_ = true;
        moved_arrival_ = -1;
        told_majority_ = false;
        carried_start_.reset();
        // No member of the last round this node knows (a standby that follows): its arrival
        // must not take a member's place in the movers' first round (split_rule).
        await_movers_ = member_round_ < 0 || member_round_ != known_round_;
    }

    /// This node reconnected to the same store (which had dropped it): new connections; then
    /// call start_liveness() with a new lease connection. It rejoins at the next round.
    void reconnected(Store& store, Store& watcher) {
        store_ = &store;
        watcher_ = &watcher;
        phase_ = phase::idle;
        rediscover_ = true;  // the others went on without this node: find the job's round again
    }

    /// Whether next_round() ended (store_lost_error) because this node left the moved store for
    /// the store where its last round formed (options().origin_answers), its arrival withdrawn;
    /// true once per such end.
    [[nodiscard]] bool take_left_for_origin() noexcept { return std::exchange(left_for_origin_, false); }

    /// The last formed round this node knows of, as a member or a standby (-1: none).
    [[nodiscard]] int known_round() const noexcept { return known_round_; }

    /// This node went back from a moved store, where no round formed, to the store where its
    /// last round formed (`store`, `watcher`: new connections there; `hosts_it`: this node's
    /// own server is that store): it rejoins the job there
    /// as a node that store dropped does, under the rules of that store's rounds, none of the
    /// move's. Then call start_liveness() with a new lease connection.
    void went_back(Store& store, Store& watcher, bool hosts_it) {
        reconnected(store, watcher);
        options_.hosts_store = hosts_it;
        carried_start_.reset();
        drop_round_rules();
        moved_ = false;
        after_move_ = false;
        moved_arrival_ = -1;
        await_movers_ = false;
        told_majority_ = false;
    }

    /// The last round's successors (where the store may move), after next_round().
    [[nodiscard]] const std::vector<store_successor>& successors() const noexcept { return successors_; }
    /// The size of the last round this node took part in or waited beside as a standby.
    [[nodiscard]] int last_round_size() const noexcept { return size_; }
    /// Whether this node hosts the rendezvous store.
    [[nodiscard]] bool hosts_store() const noexcept { return options_.hosts_store; }

    /// Observes the job's lease losses for ever (cancel it to stop): a lost member of the
    /// running round aborts the round; a loss during a forming round may complete it. When the
    /// lease connection ends, the store counts as lost (until_store_lost()); it never throws.
    asio::awaitable<void> keep_membership() {
        if (!members_) co_return;
        for (;;) {
            auto log = members_;
            auto* lease = lease_;
            try {
                for (;;) {
                    const auto k = lease_lost_key(lease_group(), log->epoch + 1);
                    if (const auto missed = co_await erased_losses(*lease, log->epoch); missed > 0) {
                        // Counted, named by nobody: the same as a record that names no lease.
                        log->epoch += missed;
                        log->lost.emplace_back(log->epoch, std::string{});
                        log->changed();
                        if (log == members_) co_await on_loss(*lease, log->epoch, std::string{});
                        continue;
                    }
                    co_await wait_long(*lease, k);
                    auto name = co_await lease->get(k);
                    if (name.empty() || name.size() > detail::rendezvous::max_id) {
                        // Not a lease name the server wrote: the loss is counted, nobody is named.
                        ignored(k, name, "not a lease name", "no member is taken for lost by it");
                        name.clear();
                    }
                    ++log->epoch;
                    log->lost.emplace_back(log->epoch, name);
                    log->changed();
                    if (log == members_) co_await on_loss(*lease, log->epoch, name);
                }
            } catch (const std::system_error& e) {
                if (e.code() == asio::error::operation_aborted) throw;
                log->store_lost = e.what();
            } catch (const std::exception& e) {
                log->store_lost = e.what();
            }
            log->changed();
            // Lost: wait until the job moves to another store (start_liveness), or for ever.
            while (members_ == log) co_await log->next();
        }
    }

    /// Whether this node's lease connection ends within `within` (true at once when it has):
    /// the store's own verdict on an error seen on another connection.
    asio::awaitable<bool> confirm_store_lost(std::chrono::milliseconds within) {
        using namespace asio::experimental::awaitable_operators;
        if (!members_) co_return false;
        if (members_->store_lost) co_return true;
        auto log = members_;
        asio::steady_timer timer(co_await asio::this_coro::executor, within);
        auto which = co_await (log->until_store_lost() || timer.async_wait(detail::as_tuple_awaitable<Store>));
        co_return which.index() == 0;
    }

    /// Whether the lease connection ended (the store is gone or unreachable), and why.
    [[nodiscard]] std::optional<std::string> store_lost() const {
        if (!members_) return std::nullopt;
        return members_->store_lost;
    }

    // ---- rounds ------------------------------------------------------------------------------

    /// Joins the next round with `me` and returns once it completes. rendezvous_error after
    /// join_timeout or on conflicting --node-rank; rendezvous_closed when the job ended while
    /// this node waited as a standby; store_lost_error when the store is lost.
    asio::awaitable<rendezvous_round> next_round(node_info me) {
        auto started = std::exchange(carried_start_, std::nullopt).value_or(std::chrono::steady_clock::now());
        if (me.previous_rank == std::nullopt && group_rank_ >= 0) me.previous_rank = group_rank_;
        if (!me.member_of && member_round_ >= 0 && me.previous_rank == group_rank_) me.member_of = member_round_;
        if (after_move_ && before_ && before_rank_ >= 0 && me.member_of == member_round_) {
            // The movers' first round counts the round before the last too, unless every
            // member acknowledged the last one (split_rule): this node was a member of it.
            me.earlier_of = before_->round;
            me.earlier_rank = before_rank_;
        }
        if (await_movers_) {
            // Followed the store as no member of the last round: the members that moved it form
            // their first round there without this node, which then arrives late at it (the
            // job's round, read below) and is admitted. Kept until then: a wait the store's
            // loss ends is taken up again at the next store.
            if (!co_await wait_interruptible(*watcher_, job_key("last_round"), options_.join_timeout)) {
                throw majority_error(round_ + 1);
            }
            await_movers_ = false;
            rediscover_ = true;
            started = std::chrono::steady_clock::now();
        }
        if (round_ < 0 || rediscover_) {
            if (round_ < 0 && options_.torchrun_guard) co_await guard();
            // A node joining a running job starts at its last completed round (0 for a new job),
            // arrives late there and is admitted from it.
            const int completed = static_cast<int>(co_await store_->add(job_key("round"), 0)) - 1;
            if (!after_move_ || completed >= 0) {
                round_ = completed;
            } else if (moved_arrival_ >= 0) {
                // No round formed or was refused yet at the store the job moved to (the movers
                // number on from the rounds they knew, never from 0): a node that store dropped
                // arrives again at the round it arrived at there, where the others await it.
                round_ = moved_arrival_ - 1;
            }  // else it had not arrived there yet: it arrives where it was going to
            rediscover_ = false;
        }
        for (;;) {
            ++round_;
            const int r = round_;
            phase_ = phase::forming;
            finished_ = false;
            standing_.reset();
            const auto arrival = co_await store_->add(key(r, "count"), 1);
            if (after_move_) moved_arrival_ = r;
            const auto step = detail::rendezvous::on_arrival(arrival, rules());
            if (step == detail::rendezvous::arrival_step::late) {
                // A standby's wait beside a formed round is no join: the join timeout starts again.
                if (co_await late(r, me)) started = std::chrono::steady_clock::now();
                continue;
            }
            me.hosts_store = options_.hosts_store;
            co_await store_->set(key(r, detail::format("info/{}", arrival)), detail::rendezvous::encode(me));
            if (step == detail::rendezvous::arrival_step::complete) {
                co_await complete(*store_, r, static_cast<int>(arrival));
            } else if (step == detail::rendezvous::arrival_step::seal) {
                co_await seal(*store_, r);
            } else if (step == detail::rendezvous::arrival_step::try_seal) {
                co_await complete_if_all_live(*store_, r);
            }
            auto assigned = co_await await_assignment(r, arrival, started);
            if (const auto past = std::exchange(passed_by_, std::nullopt); !assigned && past) {
                // Nodes arrived at a later round of the store the job moved to while this node
                // waited in its own (round_past): it goes there too, as a mover no longer (no
                // seat and no majority rule of its own: the completer's rule counts it by the
                // rounds it was a member of).
                say(detail::format(
                    "round {} of run '{}': nodes arrived at round {} of the store the job moved to (they "
                    "came there with a newer view of the job's rounds than this node's); this node goes "
                    "on from there",
                    r, options_.run_id, *past));
                drop_round_rules();
                round_ = *past - 1;
                continue;
            }
            if (!assigned && std::exchange(left_out_, false)) {
                // The round formed without this node (its info came after the completer's
                // grace): it arrives late there, as a newcomer does, and goes on from there.
                say(detail::format("round {} of run '{}' formed without this node (its node info reached the store "
                                   "after the completer stopped waiting for it); it joins as a late node",
                                   r, options_.run_id));
                if (co_await late(r, me)) started = std::chrono::steady_clock::now();
                continue;
            }
            if (!assigned && std::exchange(paced_, false)) {
                // No majority of the last round's members arrived, and as many arrivals may
                // come again at once (newcomers, standbys): the next round waits a grace first,
                // and none starts past the join timeout.
                if (std::chrono::steady_clock::now() - started >= options_.join_timeout) throw majority_error(r);
                // A node that was no member of the last round (a standby) waits twice as long, so
                // the members that count toward the majority take the seats first.
                const bool member = member_round_ >= 0 && member_round_ == known_round_;
                co_await unless_lost(*watcher_, pause(member ? arrival_grace() : 2 * arrival_grace()));
            }
            if (!assigned) continue;  // the round lost a node while forming: the next one
            auto round = *assigned;
            round.number = r;
            restarts_ = round.restart_count;
            const int was_member_of = member_round_;
            const int was_rank = group_rank_;
            before_ = std::exchange(assigned_before_, std::nullopt);
            before_rank_ = before_ && was_member_of == before_->round ? was_rank : -1;
            after_move_ = false;
            group_rank_ = round.group_rank;
            size_ = round.group_world_size;
            member_round_ = r;
            known_round_ = r;
            known_size_ = round.group_world_size;
            told_majority_ = false;
            running_epoch_ = round.epoch;
            host_in_round_ = round.host_in_round;
            successors_ = round.successors;
            drop_round_rules();
            phase_ = phase::running;
            // The split-brain rule counts a member that never learned of this round as one that
            // may still go by the round before it (split_rule): this node has learned. The last
            // member to say so marks the round as acknowledged by all.
            if (guards_split()) {
                co_await store_->set(job_key(detail::format("acked/{}", group_rank_)), std::to_string(r));
                if (co_await store_->add(key(r, "acks"), 1) == size_) co_await mark_acknowledged(r);
            }
            // Losses this node saw after the completer's epoch but before it ran: a member may
            // be among them.
            if (members_) {
                const auto seen = members_->lost;  // the monitor may append meanwhile
                for (const auto& [epoch, name] : seen) {
                    if (epoch > running_epoch_ && name != id_) co_await on_member_loss(*store_, r, name);
                }
            }
            co_return round;
        }
    }

    /// Completes when the current round is aborted (by store push; no polling); cancel it when
    /// the round ends otherwise. store_lost_error when the store is lost. A value in the abort key
    /// that is no valid notice is reported and ignored: the wait goes on at the next slot
    /// (`abort/1`, ...), where a real abort is then written (abort()).
    asio::awaitable<abort_notice> wait_for_abort() {
        // Every read of the watcher, not only the long wait, ends with the store's loss: a cut
        // between a key's check and its read would otherwise hold the read for its timeout (the
        // watcher holds no lease, so no heartbeat bounds its silence).
        co_return co_await unless_lost(*watcher_, abort_slots());
    }

    // wait_for_abort() without the store's loss: the round's abort slots, in turn.
    asio::awaitable<abort_notice> abort_slots() {
        const int r = round_;
        for (int slot = 0; slot < max_slots; ++slot) {
            const auto k = slot_key(r, "abort", slot);
            if (co_await round_collected(*watcher_, r)) co_return missed_abort(r);
            co_await wait_interruptible(*watcher_, k, std::nullopt);
            if (co_await round_collected(*watcher_, r)) co_return missed_abort(r);
            const auto value = co_await watcher_->get(k);
            if (value == all_acknowledged) {
                // Taken once the round's count agrees: a mark any client could have written
                // would otherwise relax the split rule.
                co_await learn_acknowledged(*watcher_, r);
                continue;
            }
            if (auto notice = valid_abort(r, k, value)) {
                admission_ = notice->admission;
                standing_ = *notice;
                co_await learn_acknowledged(*watcher_, r);
                co_return std::move(*notice);
            }
        }
        throw rendezvous_error(too_many_invalid(r, "abort"));
    }

    /// Aborts the current round with `notice`; true when this node was the first. A node that
    /// is no member of the current round (it forms the next one, or arrived at a moved store)
    /// aborts it for a failure with no group rank (its own is another round's), and not at all
    /// for a membership change (a leave): it has no place there to give up, its lease's end
    /// tells the others, and an abort in a round still forming would restart its members for
    /// nothing once it formed.
    asio::awaitable<bool> abort(abort_notice notice) {
        if (member_round_ != round_) {
            if (notice.what == abort_notice::kind::membership) co_return false;
            notice.group_rank = -1;
        }
        auto [standing, won] = co_await abort_round(*store_, round_, std::move(notice));
        co_await learn_acknowledged(*store_, round_);
        admission_ = standing.admission;
        standing_ = std::move(standing);
        co_return won;
    }

    /// Publishes what the job does after the aborted round (the winner of abort() calls it), and
    /// returns the decision that stands: this one, or the regroup of a node that took the
    /// decision over because this one was taken for lost meanwhile (await_decision()).
    asio::awaitable<job_decision> decide(job_decision decision) {
        bool counted = false;
        if (decision.restart) {
            // The job's count, repaired first if a broken client wrote something else there (an
            // ADD of a value that is no number would end this connection).
            const auto count = co_await job_restarts(*store_);
            if (!count) co_await store_->set(job_key("restarts"), std::to_string(restarts_));
            // The round's token says whether this restart was counted (give_back()): a node
            // that took the decision over first has set it, and then nothing is counted.
            if (co_await store_->compare_set(key(round_, "counted"), std::string{}, "added") == "added") {
                (void)co_await store_->add(job_key("restarts"), 1);
                counted = true;
            }
        }
        const auto value = detail::rendezvous::encode(decision);
        for (int slot = 0;; ++slot) {
            if (slot == max_slots) throw rendezvous_error(too_many_invalid(round_, "decision"));
            const auto k = slot_key(round_, "decision", slot);
            const auto got = co_await store_->compare_set(k, std::string{}, value);
            if (got == value) break;
            if (auto taken = co_await standing_regroup(k, got)) {
                // Taken over while this node decided: the restart it counted is given back
                // (once: the node that took over may have given it back already).
                if (counted) co_await give_back(*store_);
                co_return std::move(*taken);
            }
        }
        if (decision.restart) ++restarts_;
        co_return decision;
    }

    /// The decision for the aborted round (awaited by push). A value that is no valid decision,
    /// or a restart the job's `restarts` count does not back (the decider adds 1 to it before it
    /// publishes; with max_restarts, past the budget), is reported and ignored: the wait goes on
    /// at the next slot. With liveness the wait lasts only while the decider (the failure's
    /// reporter) holds its lease: once it is gone, this node takes the decision over, a regroup
    /// (job_decision::regroup) that every node reads alike.
    asio::awaitable<job_decision> await_decision() {
        const int r = round_;
        for (int slot = 0; slot < max_slots; ++slot) {
            const auto k = slot_key(r, "decision", slot);
            if (co_await round_collected(*store_, r)) co_return missed_decision(r);
            co_await await_decider(k);
            if (co_await round_collected(*store_, r)) co_return missed_decision(r);
            const auto value = co_await store_->get(k);
            auto decision = checked(k, value, "the decision goes on at the next slot",
                                    [](std::string_view v) { return detail::rendezvous::decode_decision(v); });
            if (!decision) continue;
            if (decision->regroup && members_ && standing_ && !co_await decider_gone(standing_->node)) {
                ignored(k, value, "a regroup, but the node that reported the failure still holds its lease",
                        "the decision goes on at the next slot");
                continue;
            }
            if (decision->restart && !decision->regroup) {
                const auto count = co_await job_restarts(*store_);
                const bool backed = count && *count > restarts_ &&
                                    (!options_.max_restarts || *count <= *options_.max_restarts);
                if (!backed) {
                    ignored(k, value,
                            detail::format("a restart, but the job's restart count is {} (this node counted {}{})",
                                           count ? std::to_string(*count) : std::string("not a number"), restarts_,
                                           options_.max_restarts
                                               ? detail::format("; --max-restarts={}", *options_.max_restarts)
                                               : std::string()),
                            "the decision goes on at the next slot");
                    continue;
                }
                ++restarts_;
            }
            co_return std::move(*decision);
        }
        throw rendezvous_error(too_many_invalid(r, "decision"));
    }

    /// This node's workers all succeeded: marks it done and waits (push) until every node of
    /// the round is, the round is aborted, or `timeout` passes (then names the nodes missing).
    /// The last node to finish closes the job (standbys then exit). A zero `timeout` marks the
    /// node done and does not wait.
    asio::awaitable<barrier_result> finish(std::chrono::milliseconds timeout) {
        using namespace asio::experimental::awaitable_operators;
        const int r = round_;
        finished_ = true;
        co_await store_->set(key(r, detail::format("done/{}", group_rank_)), "1");
        const auto done = co_await store_->add(key(r, "done_count"), 1);
        if (done >= size_) {
            abort_notice closed;
            closed.group_rank = group_rank_;
            closed.reason = "every node's workers succeeded";
            closed.what = abort_notice::kind::closed;
            if (co_await abort(closed)) co_await store_->set(key(r, "all_done"), "1");
        }
        barrier_result result;
        if (timeout <= std::chrono::milliseconds::zero()) co_return result;  // exit_barrier_timeout=0: no wait
        auto which = co_await (wait_all_done(timeout) || wait_for_abort());
        if (which.index() == 1) {
            auto notice = std::get<1>(std::move(which));
            if (notice.what == abort_notice::kind::closed) co_return result;
            finished_ = false;  // the node follows the round's abort: it is not done
            result.how = barrier_result::kind::aborted;
            result.abort = std::move(notice);
            co_return result;
        }
        if (std::get<0>(which)) co_return result;
        // Timed out: only now, name who is missing (O(N) checks, on this error path only).
        result.how = barrier_result::kind::timed_out;
        std::vector<std::string> hosts;
        try {
            hosts = detail::rendezvous::decode_hosts(co_await store_->get(key(r, "hosts")));
        } catch (const std::exception&) {
        }
        for (int g = 0; g < size_; ++g) {
            std::vector<std::string> keys{key(r, detail::format("done/{}", g))};
            if (co_await store_->check(std::move(keys))) continue;
            result.missing.push_back(g);
            result.missing_hosts.push_back(static_cast<std::size_t>(g) < hosts.size()
                                               ? hosts[static_cast<std::size_t>(g)]
                                               : std::string("?"));
        }
        co_return result;
    }

    /// This node leaves the job for good. The store's host waits (up to close_timeout) until
    /// every other node's lease is gone, so nobody loses the store while reading the job's last
    /// keys (without liveness it cannot tell, and returns at once). A host whose workers
    /// succeeded first stays, without a deadline, for as long as another node is live and the
    /// round has no abort (closed, failed or re-forming): taking the store away would fail a
    /// node still working. Each of those nodes ends the wait by leaving, or by losing its lease.
    asio::awaitable<void> leave() {
        using namespace asio::experimental::awaitable_operators;
        phase_ = phase::leaving;
        if (round_ < 0 || !options_.hosts_store || !members_ || members_->store_lost) co_return;
        if (finished_) {
            // The round's abort key ends the stay: the closed notice (every node finished), or
            // a failure or membership change, after which the others re-form without this node
            // (its live lease must not hold their rounds back) and the close below applies.
            int slot = 0;
            auto round_abort = slot_key(round_, "abort", slot);
            // For the split-brain rule (split_rule): this member, away from the next rounds with
            // a live lease, is no part cut off (it hosts the store) and never trains again.
            if (options_.elastic())
                co_await store_->set(job_key("staying"), detail::format("{} {}", round_, group_rank_));
            bool said = false;
            while (!members_->store_lost) {
                const auto seen = members_->lost.size();
                const auto others = co_await live_nodes(*store_) - 1;
                if (others <= 0) co_return;
                // (Not a braced list: g++ 12 cannot keep an initializer_list in a coroutine frame.)
                if (co_await store_->check(std::vector<std::string>(1, round_abort))) {
                    // The acknowledgement mark (mark_acknowledged) and a value no agent wrote
                    // (reported) are no abort: the abort comes in a later slot.
                    const auto value = co_await store_->get(round_abort);
                    if (value != all_acknowledged && valid_abort(round_, round_abort, value)) break;
                    if (++slot == max_slots) {
                        say(too_many_invalid(round_, "abort") + "; this node stops staying for the others");
                        break;
                    }
                    round_abort = slot_key(round_, "abort", slot);
                    continue;
                }
                if (!said) {
                    say(staying_line(others));
                    said = true;
                }
                if (members_->lost.size() != seen) continue;  // a loss while reading: count again
                // Woken by a loss or the abort key; re-read at each close_timeout all the same,
                // so no wake-up missed between the reads and the wait can hold the host.
                // The key's value is read at the top (the acknowledgement mark is no abort).
                auto which = co_await (members_->next() || wait_for(*store_, round_abort, options_.close_timeout));
                (void)which;
            }
        }
        const auto deadline = std::chrono::steady_clock::now() + options_.close_timeout;
        asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
        for (;;) {
            if (co_await live_nodes(*store_) <= 1) co_return;
            auto which = co_await (members_->next() || timer.async_wait(detail::as_tuple_awaitable<Store>));
            if (which.index() == 1) co_return;  // someone vanished without a trace: stop anyway
        }
    }

    /// leave()'s line when the finished host stays for `others` nodes still working.
    [[nodiscard]] static std::string staying_line(std::int64_t others) {
        const bool one = others == 1;
        return detail::format(
            "this node's workers succeeded, and it hosts the rendezvous store, which {} other node{} of "
            "the job still use{}: it stays until they finish or leave",
            others, one ? "" : "s", one ? "s" : "");
    }

    /// The store key of `name` in the current round.
    [[nodiscard]] std::string key(std::string_view name) const { return key(round_, name); }
    /// The store key of `name` in round `r`.
    [[nodiscard]] std::string key(int r, std::string_view name) const {
        return detail::format("elastic.rendezvous.{}/{}/{}", options_.run_id, r, name);
    }
    /// The store key of `name` for the whole job.
    [[nodiscard]] std::string job_key(std::string_view name) const { return job_key(options_.run_id, name); }
    /// The store key of `name` for the job `run_id`.
    [[nodiscard]] static std::string job_key(std::string_view run_id, std::string_view name) {
        return detail::format("elastic.rendezvous.{}/{}", run_id, name);
    }

private:
    enum class phase { idle, forming, running, leaving };

    // The nodes a round needs: MIN, or after the store moved a majority of the last round.
    [[nodiscard]] int needed() const noexcept { return std::max(options_.min(), quorum_); }

    // Whether rounds form under the split-brain rule (split_rule) and members acknowledge them.
    [[nodiscard]] bool guards_split() const noexcept {
        return options_.split_guard && options_.elastic() && members_ != nullptr;
    }

    // What decides the next round's completion besides its arrivals (the planner's input).
    [[nodiscard]] detail::rendezvous::round_rules rules() const noexcept {
        return {options_.nnodes, options_.elastic(), needed(), target_};
    }

    void say(std::string_view line) const {
        if (options_.log) options_.log(line);
    }

    // ---- values read from the store (docs/rendezvous.md, "What the agents trust") --------------

    // How many slots (`abort`, `abort/1`, ...) a round's abort or decision may take before the
    // job gives up: each invalid value costs a writer one slot.
    static constexpr int max_slots = 64;

    // What the last member to acknowledge a round writes in its first free abort slot (past any
    // value no agent wrote), which no abort then takes (it goes to the next): the members watch
    // those slots while the round runs, so they learn it with no wait of their own. A member
    // that saw it knows that nobody goes by the round before any more (split_rule, the movers'
    // first round).
    static constexpr std::string_view all_acknowledged = "acknowledged by all";

    // A mark seen, or an abort that took the first free slot before the mark: whether every
    // member acknowledged the round (its count), so that a forged mark relaxes nothing and the
    // mark's absence costs nothing until the next round forms.
    asio::awaitable<void> learn_acknowledged(Store& s, int r) {
        // Only of a round this node is a member of (size_ is that round's size then).
        if (!guards_split() || r != member_round_ || marked_round_ >= r || size_ <= 0) co_return;
        const auto count = co_await read_checked(
            s, key(r, "acks"), "the round counts as not acknowledged by all", [](std::string_view v) {
                return detail::rendezvous::decode_count(v, 0, std::numeric_limits<std::int64_t>::max());
            });
        if (count && *count >= size_) marked_round_ = r;
    }

    asio::awaitable<void> mark_acknowledged(int r) {
        const std::string mark{all_acknowledged};
        for (int slot = 0; slot < max_slots; ++slot) {
            const auto k = slot_key(r, "abort", slot);
            const auto got = co_await store_->compare_set(k, std::string{}, mark);
            if (got == mark) {
                marked_round_ = std::max(marked_round_, r);
                co_return;
            }
            if (valid_abort(r, k, got)) co_return;  // aborted first: learn_acknowledged() tells
        }
    }

    [[nodiscard]] std::string slot_key(int r, std::string_view name, int slot) const {
        return slot == 0 ? key(r, name) : key(r, detail::format("{}/{}", name, slot));
    }

    std::string too_many_invalid(int r, std::string_view name) const {
        return detail::format("round {} of run '{}': {} invalid values in a row at its '{}' key: a client that is no "
                              "agent of this job keeps writing into the rendezvous store; give the job a store of its "
                              "own",
                              r, options_.run_id, max_slots, name);
    }

    // Reports the value at `k` that is not valid (`why`) and says what the job does instead
    // (`then`); once per key and value.
    void ignored(std::string_view k, std::string_view value, std::string_view why, std::string_view then) {
        if (!warned_.insert(detail::format("{}\n{}", k, value)).second) return;
        const auto line = detail::format(
            "ignored an invalid value in the rendezvous store: key '{}' holds '{}' ({}); {}", k,
            detail::rendezvous::shown(value), why, then);
        if (options_.warn) options_.warn(line);
        else say(line);
    }

    // `decode(value)`, or nothing (reported) when the value is not valid.
    template <class Decode>
    auto checked(std::string_view k, std::string_view value, std::string_view then, Decode decode)
        -> std::optional<decltype(decode(value))> {
        try {
            return decode(value);
        } catch (const detail::rendezvous::invalid_value& e) {
            ignored(k, value, e.what(), then);
        }
        return std::nullopt;
    }

    // The value at `k` decoded, or nothing when the key is absent or its value is not valid
    // (reported, `then` saying what this node does instead).
    template <class Decode>
    auto read_checked(Store& s, std::string k, std::string_view then, Decode decode)
        -> asio::awaitable<std::optional<decltype(decode(std::string_view{}))>> {
        std::vector<std::string> probe{k};
        if (!co_await s.check(std::move(probe))) co_return std::nullopt;
        const auto value = co_await s.get(k);
        co_return checked(k, value, then, std::move(decode));
    }

    // With liveness every agent holds a lease, and its notices name it (the decider's liveness
    // bounds the wait for a decision): a notice that names none is no agent's. A group rank
    // must lie in round r: within its size when this node is a member (whatever it does now:
    // runs, leaves, stays), else within MAX.
    std::optional<abort_notice> valid_abort(int r, std::string_view k, std::string_view value) {
        const int size = r == member_round_ && size_ > 0 ? size_ : options_.nnodes;
        return checked(k, value, "it does not abort the round (an abort goes to the next slot)",
                       [&](std::string_view v) {
                           auto notice = detail::rendezvous::decode_abort(v, size);
                           if (members_ && notice.node.empty())
                               throw detail::rendezvous::invalid_value("it names no lease (every agent holds one)");
                           return notice;
                       });
    }

    // Waits until the decision key `k` holds a value. With liveness, only while the node that
    // has to write it (the standing failure's reporter) lives: once it is gone — its lease lost,
    // or one it never held — this node writes a regroup there first-come (compare-and-set), so
    // every node reads the same decision whoever took it over.
    asio::awaitable<void> await_decider(const std::string& k) {
        using namespace asio::experimental::awaitable_operators;
        if (!members_ || !standing_ || standing_->what != abort_notice::kind::failure) {
            co_await wait_interruptible(*store_, k, std::nullopt);
            co_return;
        }
        const auto decider = standing_->node;
        for (;;) {
            auto log = members_;
            const auto seen = log->lost.size();  // taken before the check: a later loss ends the wait
            if (auto gone = co_await decider_gone(decider)) {
                job_decision regroup;
                regroup.restart = true;
                regroup.exit_code = 0;
                regroup.reason = std::move(*gone);
                regroup.regroup = true;
                const auto value = detail::rendezvous::encode(regroup);
                // The regroup stands: a restart the decider counted before it was lost is given back.
                if (co_await unless_lost(*store_, store_->compare_set(k, std::string{}, value)) == value)
                    co_await unless_lost(*store_, give_back(*store_));
                co_return;
            }
            auto which = co_await (unless_lost(*store_, wait_long(*store_, k)) || loss_after(log, seen, decider));
            if (which.index() == 0) co_return;
            // The wait was cancelled mid-request: the connection's next request reconnects.
            if constexpr (requires { store_->close(); }) store_->close();
        }
    }

    // The regroup `value` at decision key `k` when it stands: another node took this node's
    // decision over because this node's lease is gone (anything else there is reported).
    asio::awaitable<std::optional<job_decision>> standing_regroup(const std::string& k, const std::string& value) {
        auto theirs = checked(k, value, "the decision goes to the next slot",
                              [](std::string_view v) { return detail::rendezvous::decode_decision(v); });
        if (!theirs) co_return std::nullopt;
        if (theirs->regroup && (!members_ || !co_await holds_lease(*store_, id_))) co_return theirs;
        ignored(k, value,
                theirs->regroup ? "a regroup, but this node, which decides, still holds its lease"
                                : "only the node whose abort won decides, and this node is that one",
                "the decision goes to the next slot");
        co_return std::nullopt;
    }

    // A regroup stands in the current round: the restart its decider counted, if any, is given
    // back, once. The round's `counted` token reads "added" once the decider counted it; the
    // first node to turn it into "given:<its lease>" (or to write that first, so that the
    // decider counts nothing) is the one that subtracts 1, if it was added.
    asio::awaitable<void> give_back(Store& s) {
        const auto k = key(round_, "counted");
        const auto mine = "given:" + id_;
        if (co_await s.compare_set(k, std::string{}, mine) != "added") co_return;
        if (co_await s.compare_set(k, "added", mine) == mine) (void)co_await s.add(job_key("restarts"), -1);
    }

    // Whether the lease `name` of this job is held now (the store's record). A server's own name
    // is no lease: "__epoch" always exists, and would pass for a lease that is held.
    asio::awaitable<bool> holds_lease(Store& s, const std::string& name) {
        if (name.empty() || name.rfind("__", 0) == 0) co_return false;
        std::vector<std::string> lease{lease_key(lease_group(), name)};
        co_return co_await s.check(std::move(lease));
    }

    // Why the decider `decider` (a lease name) can no longer decide, or nothing while it can.
    asio::awaitable<std::optional<std::string>> decider_gone(const std::string& decider) {
        const auto who = detail::rendezvous::describe_node_id(decider);
        if (decider == id_) {
            co_return detail::format("the failure notice names this node ({}) as its reporter, but this node reported "
                                     "no failure; it takes the decision over and the nodes re-form",
                                     who);
        }
        if (co_await unless_lost(*store_, holds_lease(*store_, decider))) co_return std::nullopt;
        co_return detail::format(
            "the reporting node, {}, was lost before it decided; the others took the decision over "
            "and re-form without it",
            who);
    }

    // Completes once `log` records a loss after its first `seen` that names `decider` or nobody
    // (a record the store erased), or the lease connection ends.
    static asio::awaitable<void> loss_after(std::shared_ptr<detail::rendezvous::membership_log> log, std::size_t seen,
                                            std::string decider) {
        for (;;) {
            if (log->store_lost) co_return;
            for (auto i = seen; i < log->lost.size(); ++i) {
                const auto& name = log->lost[i].second;
                if (name.empty() || name == decider) co_return;
            }
            seen = log->lost.size();
            co_await log->next();
        }
    }

    // Writes `mine` as round r's abort unless a valid abort is there first; returns the abort
    // that stands and whether it is this node's. An invalid value found in a slot is reported
    // and skipped: the abort goes to the next slot, where the watchers that saw it wait.
    asio::awaitable<std::pair<abort_notice, bool>> abort_round(Store& s, int r, abort_notice mine) {
        if (mine.node.empty()) mine.node = id_;
        const auto value = detail::rendezvous::encode(mine);
        for (int slot = 0; slot < max_slots; ++slot) {
            const auto k = slot_key(r, "abort", slot);
            const auto got = co_await s.compare_set(k, std::string{}, value);
            if (got == value) co_return std::pair{std::move(mine), true};
            if (got == all_acknowledged) continue;
            if (auto theirs = valid_abort(r, k, got)) co_return std::pair{std::move(*theirs), false};
        }
        throw rendezvous_error(too_many_invalid(r, "abort"));
    }

    // Whether round r has a valid abort.
    asio::awaitable<bool> aborted(Store& s, int r) {
        for (int slot = 0; slot < max_slots; ++slot) {
            const auto k = slot_key(r, "abort", slot);
            std::vector<std::string> keys{k};
            if (!co_await s.check(std::move(keys))) co_return false;
            const auto value = co_await s.get(k);
            if (value == all_acknowledged) continue;
            if (valid_abort(r, k, value)) co_return true;
        }
        co_return true;  // abort_round and wait_for_abort then say why the round cannot go on
    }

    // The job's restart count, or nothing (reported) when the key holds no count. Read, not
    // ADDed: an ADD of a value that is no number would end this connection.
    asio::awaitable<std::optional<int>> job_restarts(Store& s) {
        const auto k = job_key("restarts");
        std::vector<std::string> keys{k};
        if (!co_await s.check(std::move(keys))) co_return 0;
        const auto value = co_await s.get(k);
        co_return checked(k, value, "the job keeps the restart count it knows", [](std::string_view v) {
            return static_cast<int>(detail::rendezvous::decode_count(v, 0, std::numeric_limits<int>::max()));
        });
    }

    // The lease group's loss count (the server's `__epoch`), or `known` (reported) when the key
    // holds no count.
    asio::awaitable<std::int64_t> read_epoch(Store& s, std::int64_t known) {
        const auto k = lease_epoch_key(lease_group());
        const auto value = co_await s.get(k);
        co_return checked(k, value, "the job keeps the loss count it knows", [](std::string_view v) {
            return detail::rendezvous::decode_count(v, 0, std::numeric_limits<std::int64_t>::max());
        }).value_or(known);
    }

    // How many loss records after `known` the store erased before this node read them (0 when
    // the next one is there or not yet written). The server keeps only the newest records of
    // the group (store_server_options::lease_lost_records_kept) and erases the oldest first, so
    // the missing ones are the first of known+1..__epoch: a binary search finds where the kept
    // ones start. Waiting for an erased record would wait for ever and miss every later loss.
    asio::awaitable<std::int64_t> erased_losses(Store& s, std::int64_t known) {
        const auto current = co_await read_epoch(s, known);
        if (current <= known) co_return 0;
        auto exists = [&](std::int64_t n) -> asio::awaitable<bool> {
            std::vector<std::string> keys{lease_lost_key(lease_group(), n)};
            co_return co_await s.check(std::move(keys));
        };
        if (co_await exists(known + 1)) co_return 0;
        std::int64_t missing = known + 1;  // erased
        std::int64_t kept = current + 1;   // there, or past the last loss
        while (kept - missing > 1) {
            const auto mid = missing + (kept - missing) / 2;
            if (co_await exists(mid)) kept = mid;
            else missing = mid;
        }
        const auto count = kept - 1 - known;
        const auto line = detail::format(
            "missed {} lease losses of run '{}' ({} to {}): the store erased their records before this node "
            "read them (it keeps only the newest); they are counted, and no member is taken for lost by them",
            count, options_.run_id, lease_lost_key(lease_group(), known + 1), lease_lost_key(lease_group(), kept - 1));
        if (options_.warn) options_.warn(line);
        else say(line);
        co_return count;
    }

    asio::awaitable<void> guard() {
        const auto k = detail::rendezvous::torchrun_key(options_.run_id);
        const auto mine = detail::rendezvous::guard_value(options_.run_id);
        const auto got = co_await store_->compare_set(k, std::string{}, mine);
        if (got != mine) throw rendezvous_error(torchrun_state_message());
    }

    [[nodiscard]] std::string torchrun_state_message() const {
        return detail::format(
            "the store already holds torchrun's rendezvous state for run '{}' (key '{}'): a torchrun (Python) "
            "agent uses this --rdzv-id, and its state is a Python pickle elasticrun cannot share; run every node "
            "with elasticrun, or give this job another --rdzv-id",
            options_.run_id, detail::rendezvous::torchrun_key(options_.run_id));
    }

    // Runs `op`, a request or wait on `s`; with liveness, a lost store ends it with store_lost_error
    // (and a cancelled request leaves `s` closed: its next request reconnects). Without the
    // race, a request on a store whose host died would retry its connection until the client's
    // connect_timeout while the job has already moved on.
    template <class T>
    asio::awaitable<T> unless_lost(Store& s, asio::awaitable<T> op) {
        using namespace asio::experimental::awaitable_operators;
        if (!members_) co_return co_await std::move(op);
        if (members_->store_lost) throw store_lost_error(*members_->store_lost);
        auto log = members_;
        auto which = co_await (std::move(op) || log->until_store_lost());
        if (which.index() == 1) {
            if constexpr (requires { s.close(); }) s.close();
            throw store_lost_error(std::get<1>(std::move(which)));
        }
        if constexpr (!std::is_void_v<T>) co_return std::get<0>(std::move(which));
    }

    // Waits for `k` on `s` (unless_lost); false on timeout.
    asio::awaitable<bool> wait_interruptible(Store& s, std::string k,
                                             std::optional<std::chrono::milliseconds> timeout) {
        if (timeout) co_return co_await unless_lost(s, wait_for(s, std::move(k), *timeout));
        co_await unless_lost(s, wait_long(s, std::move(k)));
        co_return true;
    }

    // A node arrived after round r was complete (or sealed): it aborts a round running with
    // fewer than MAX nodes so that it may join the next, or waits as a standby for a full
    // one; either way it goes on with the round after r, or ends with the job. Returns
    // whether round r had formed (a refused round has no members to wait beside).
    asio::awaitable<bool> late(int r, node_info me) {
        if (!co_await wait_interruptible(*store_, key(r, "size"), options_.join_timeout)) {
            throw rendezvous_error(detail::format(
                "round {} of run '{}' already has its {} nodes, and stays incomplete for the join timeout ({} s): "
                "another job uses the same --rdzv-id, or --nnodes differs between nodes",
                r, options_.run_id, options_.nnodes,
                std::chrono::duration_cast<std::chrono::seconds>(options_.join_timeout).count()));
        }
        const auto size_key = key(r, "size");
        const auto size_text = co_await store_->get(size_key);
        const int size = checked(size_key, size_text,
                                 "this node takes the round for one that lost a node while forming",
                                 [&](std::string_view v) {
                                     return static_cast<int>(detail::rendezvous::decode_count(v, 0, options_.nnodes));
                                 })
                             .value_or(0);
        if (size > 0) {
            known_round_ = r;
            known_size_ = size;
            // A standby that outlives the store's host moves with the members: it needs the
            // round's successors and the majority rule (move_to) as they do.
            const auto moves_key = key(r, "successors");
            const auto moves_text = co_await store_->get(moves_key);
            size_ = size;
            if (auto moves = checked(moves_key, moves_text, "this node knows no successor of the store's host",
                                     [](std::string_view v) {
                                         return detail::rendezvous::decode_round_successors(v);
                                     })) {
                host_in_round_ = moves->first;
                successors_ = std::move(moves->second);
            } else {
                host_in_round_ = true;
                successors_.clear();
            }
        }
        if (size > 0 && members_ && !co_await aborted(*store_, r)) co_await abort_if_member_lost(*store_, r);
        if (!co_await aborted(*store_, r)) {
            if (size < options_.nnodes) {
                abort_notice waiting;
                waiting.host = me.host;
                waiting.what = abort_notice::kind::membership;
                waiting.admission = true;
                waiting.reason = detail::format(
                    "node {} (pid {}) is waiting to join (scale-up from {} nodes; at most {})", me.host, me.pid, size,
                    options_.nnodes);
                (void)co_await abort_round(*store_, r, std::move(waiting));
            } else if (!options_.elastic()) {
                throw rendezvous_error(detail::format(
                    "round {} of run '{}' already has its {} nodes (this node arrived after it formed): another job "
                    "uses the same --rdzv-id, or --nnodes differs between nodes",
                    r, options_.run_id, options_.nnodes));
            } else {
                say(detail::format("round {} of run '{}' is full ({} nodes, --nnodes={}:{}): this node waits as a "
                                   "standby until a member leaves or the job ends",
                                   r, options_.run_id, size, options_.min(), options_.nnodes));
            }
        }
        phase_ = phase::idle;
        const auto notice = co_await wait_for_abort();  // round r is the current round
        if (notice.what == abort_notice::kind::closed) {
            throw rendezvous_closed(detail::format("the job ended while this node waited as a standby ({})",
                                                   notice.reason));
        }
        if (notice.what == abort_notice::kind::failure) {
            const auto decision = co_await await_decision();
            if (!decision.restart) {
                throw rendezvous_closed(
                    detail::format("the job ended while this node waited as a standby (it stopped after a failure: {})",
                                   notice.reason));
            }
        }
        co_return size > 0;
    }

    // Waits for this node's assignment in round r: the last-call timer (arrivals from MIN on,
    // elastic membership) seals the round when it fires; the join timeout ends the wait.
    asio::awaitable<std::optional<rendezvous_round>> await_assignment(int r, std::int64_t arrival,
                                                                      std::chrono::steady_clock::time_point started) {
        using clock = std::chrono::steady_clock;
        const auto mine = key(r, detail::format("assign/{}", arrival));
        const auto join_deadline = started + options_.join_timeout;
        std::optional<clock::time_point> last_call;
        if (detail::rendezvous::has_last_call(arrival, rules())) {
            last_call = clock::now() + options_.last_call_timeout;
        }
        // A node that waits for others is never silent until its join timeout: a line says how
        // far the round got, 5 s in, then every 5 s for the first minute and every 30 s after.
        auto next_progress = std::max(started, clock::now()) + std::chrono::seconds(5);
        for (;;) {
            const auto now = clock::now();
            auto until = std::min(join_deadline, next_progress);
            if (last_call && *last_call < until) until = *last_call;
            const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(until - now),
                                       std::chrono::milliseconds(1));
            if (co_await wait_interruptible(*watcher_, mine, left)) break;
            if (const auto t = clock::now(); t >= next_progress && t < join_deadline) {
                if (after_move_) {
                    try {
                        passed_by_ = co_await unless_lost(*store_, moved_on(r, arrival));
                    } catch (const store_timeout&) {
                        // looked again at the next line
                    }
                    if (passed_by_) co_return std::nullopt;
                    try {
                        if (co_await unless_lost(*store_, leaves_for_origin(r, arrival, started))) {
                            throw store_lost_error(detail::format(
                                "round {} of run '{}' waited at the store the job moved to without the nodes it "
                                "needs, and the store where this node's last round formed answers again",
                                r, options_.run_id));
                        }
                    } catch (const store_timeout&) {
                        // looked again at the next line
                    }
                }
                co_await say_progress(r, join_deadline, last_call);
                next_progress = clock::now() + (t - started < std::chrono::minutes(1) ? std::chrono::seconds(5)
                                                                                      : std::chrono::seconds(30));
            }
            if (last_call && clock::now() >= *last_call) {
                last_call.reset();
                if (!members_ || target_ > 0) {
                    // After the store moved, the movers stopped their workers before they came:
                    // the last call after a majority of them seals the round (a standby that
                    // followed registers, and waits for this round before it arrives).
                    co_await seal(*store_, r);
                } else {
                    // The last call is over; the round still waits for nodes that live and
                    // have not joined yet (stopping their workers, say), or their loss.
                    co_await store_->set(key(r, "last_call_over"), "1");
                    co_await complete_if_all_live(*store_, r);
                }
                continue;
            }
            if (clock::now() < join_deadline) continue;
            auto joined = co_await store_->add(key(r, "count"), 0);
            if (joined >= detail::rendezvous::seal_increment) joined -= detail::rendezvous::seal_increment;
            const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(options_.join_timeout).count();
            if (prior_of_ > 0 || (quorum_ > 0 && joined < needed())) throw majority_error(r);
            if (joined >= needed()) {
                // Enough arrivals, and still no round: say what it waited for (not "N of the N
                // nodes needed joined").
                std::string why =
                    "arrivals were left out before it formed (their leases ended, or they wrote no node info)";
                if (members_) {
                    const auto live = co_await live_nodes(*store_);
                    if (live > joined) {
                        why = detail::format("it waits for every live node of the job, and {} of the {} registered and "
                                             "live never arrived (an agent still stopping its workers, or stopped "
                                             "within its keep-alive)",
                                             live - joined, live);
                    }
                }
                throw rendezvous_error(detail::format(
                    "rendezvous of run '{}' round {}: {} nodes arrived ({} needed, --nnodes={}:{}), yet the round did "
                    "not form within the join timeout ({} s): {}; restart the job, or raise --rdzv-conf join_timeout",
                    options_.run_id, r, joined, needed(), options_.min(), options_.nnodes, seconds, why));
            }
            if (options_.elastic()) {
                throw rendezvous_error(detail::format(
                    "rendezvous of run '{}' round {}: {} of the {} nodes needed (--nnodes={}:{}) joined within the "
                    "join timeout ({} s); start more nodes, or raise --rdzv-conf join_timeout",
                    options_.run_id, r, joined, options_.min(), options_.min(), options_.nnodes, seconds));
            }
            throw rendezvous_error(detail::format(
                "rendezvous of run '{}' round {}: {} of {} nodes joined within the join timeout ({} s); start the "
                "others, or raise --rdzv-conf join_timeout",
                options_.run_id, r, joined, options_.nnodes, seconds));
        }
        const auto value = co_await store_->get(mine);
        try {
            auto assigned = detail::rendezvous::decode_assignment(value, options_.nnodes);
            if (!assigned) {
                heed_majority(r, mine, value);
                left_out_ = detail::rendezvous::is_left_out(value);
            }
            assigned_before_.reset();
            if (assigned && guards_split()) {
                auto before = checked(mine, value, "the round is taken for one with no round before it",
                                      [&](std::string_view v) {
                                          return detail::rendezvous::decode_assignment_before(v, r, options_.nnodes);
                                      });
                if (before) assigned_before_ = *before;
            }
            co_return assigned;
        } catch (const detail::rendezvous::invalid_value& e) {
            // Only the completer writes it, once: nothing valid can follow. A clear end instead.
            ignored(mine, value, e.what(), "this node has no assignment in this round");
            throw rendezvous_error(detail::format(
                "rendezvous of run '{}' round {}: this node's assignment ('{}') is not valid ({}): a client that is "
                "no agent of this job writes into the rendezvous store; give the job a store of its own",
                options_.run_id, r, mine, e.what()));
        }
    }

    // The majority and seal rules a move or a refusal set for the next rounds: none once a round
    // formed with this node, or once it goes on in others' rounds as a mover no longer.
    void drop_round_rules() noexcept {
        quorum_ = 0;
        majority_of_ = 0;
        prior_of_ = 0;
        target_ = 0;
    }

    // After the store moved, each mover numbers the rounds there on from its own. A node that
    // came with an older view (it lost the store's host before the others, and the last rounds
    // formed without it; or it had not seen the last round aborted) arrives at a round none of
    // them joins, while they await its live lease, or its vote for the round it knows, in theirs.
    // So a node that waits at a moved store looks for arrivals past its round r (moved_on): the
    // round it goes to, once its arrival in r is withdrawn.
    asio::awaitable<std::optional<int>> moved_on(int r, std::int64_t arrival) {
        auto past = co_await round_past(r);
        if (!past) co_return std::nullopt;
        if (!co_await withdraw(r, arrival)) co_return std::nullopt;
        co_return past;
    }

    // A move that went nowhere: the store was lost to this node, yet where its last round
    // formed answers again (the network between them was cut for longer than a reconnect),
    // while here, at a successor's store, no round formed and round r lacks the nodes it
    // needs. The node withdraws its arrival and goes back (take_left_for_origin()); its
    // arrival stays when the round took it already (withdraw), or the round has the nodes it
    // needs, or any round formed here (the job lives on here: this node stays with it).
    asio::awaitable<bool> leaves_for_origin(int r, std::int64_t arrival,
                                            std::chrono::steady_clock::time_point started) {
        if (!options_.origin_answers) co_return false;
        // The nodes here that could make the move's majority: live leases (a node on its way
        // holds one before it arrives; an arrival taken back counts no more), against the
        // majority of the last round (not this node's rule of the moment: a node that went on
        // to others' round keeps none of its own).
        const auto majority = std::max(needed(), detail::rendezvous::after_store_moved(size_, host_in_round_).quorum);
        if (co_await live_nodes(*store_) >= majority) co_return false;
        // The last formed round's record (a refused round writes none).
        if (std::vector<std::string> formed{job_key("last_round")}; co_await store_->check(std::move(formed))) {
            co_return false;
        }
        if (!options_.origin_answers()) co_return false;
        if (!co_await withdraw(r, arrival)) co_return false;
        left_for_origin_ = true;
        carried_start_ = started;  // should the way back fail, the wait here goes on, not afresh
        co_return true;
    }

    // The round past r that nodes arrived at in this store: the newest one formed or refused
    // (this node arrives late there), else the newest one forming.
    asio::awaitable<std::optional<int>> round_past(int r) {
        // No job has this many rounds: a larger number is no agent's.
        constexpr std::int64_t most = std::int64_t{1} << 24;
        if (r < 0 || r >= most) co_return std::nullopt;
        if (const auto formed = co_await store_->add(job_key("round"), 0); formed > r && formed < most) {
            if (co_await arrivals_at(formed)) co_return static_cast<int>(formed);
        }
        // The next rounds, and the movers' first: one past the newest round a mover knew, or
        // two (a round was forming when the store was lost).
        std::vector<std::int64_t> firsts{std::int64_t{r} + 1, std::int64_t{r} + 2};
        const auto moved = co_await read_checked(*store_, job_key("moved_from"),
                                                 "this node looks for no round of the movers", [&](std::string_view v) {
                                                     return detail::rendezvous::decode_moved_from(v, options_.nnodes);
                                                 });
        if (moved && moved->round >= 0 && moved->round < most) {
            firsts.push_back(std::int64_t{moved->round} + 1);
            firsts.push_back(std::int64_t{moved->round} + 2);
        }
        std::int64_t q = -1;
        for (const auto first : firsts) {
            if (first <= r || first <= q) continue;
            if (co_await arrivals_at(first)) q = first;
        }
        if (q < 0) co_return std::nullopt;
        // Rounds follow one another: the newest with arrivals, in a few checks.
        std::int64_t step = 1;
        while (q + step < most) {
            if (!co_await arrivals_at(q + step)) break;
            q += step;
            step *= 2;
        }
        for (auto hi = std::min(q + step, most); hi - q > 1;) {
            const auto mid = q + (hi - q) / 2;
            if (co_await arrivals_at(mid)) {
                q = mid;
            } else {
                hi = mid;
            }
        }
        co_return static_cast<int>(q);
    }

    asio::awaitable<bool> arrivals_at(std::int64_t q) {
        std::vector<std::string> k{key(static_cast<int>(q), "count")};
        co_return co_await store_->check(std::move(k));
    }

    // Takes this node's arrival in round r back (its info) before it goes to another round:
    // false when r is sealed or full, before or just after (its completer may have read the
    // info: this node stays for its assignment, or for word that r formed without it). Once the
    // info is gone, a completer that seals r later leaves the arrival out as one that wrote none.
    asio::awaitable<bool> withdraw(int r, std::int64_t arrival) {
        const auto closed = [&](std::int64_t count) {
            return count >= detail::rendezvous::seal_increment || count >= options_.nnodes;
        };
        if (closed(co_await store_->add(key(r, "count"), 0))) co_return false;
        (void)co_await store_->delete_key(key(r, detail::format("info/{}", arrival)));
        co_return !closed(co_await store_->add(key(r, "count"), 0));
    }

    // The line await_assignment says while it waits: how many joined, of how many, for how long
    // still, and in an elastic job which live nodes the round still waits for. Best effort: a
    // store too busy to answer within the read timeout costs the line, not the wait (a lost
    // store ends it, as it ends the wait).
    asio::awaitable<void> say_progress(int r, std::chrono::steady_clock::time_point deadline,
                                       std::optional<std::chrono::steady_clock::time_point> last_call) {
        if (!options_.log) co_return;
        std::string line;
        try {
            line = co_await unless_lost(*store_, progress_line(r, deadline, last_call));
        } catch (const store_timeout&) {
            // the next line, then
        }
        if (!line.empty()) say(line);
    }

    asio::awaitable<std::string> progress_line(int r, std::chrono::steady_clock::time_point deadline,
                                               std::optional<std::chrono::steady_clock::time_point> last_call) {
        auto joined = co_await store_->add(key(r, "count"), 0);
        if (joined >= detail::rendezvous::seal_increment) joined -= detail::rendezvous::seal_increment;
        const auto until = [](std::chrono::steady_clock::time_point t) {
            const auto left = std::max<std::int64_t>(
                0, std::chrono::ceil<std::chrono::seconds>(t - std::chrono::steady_clock::now()).count());
            return left >= 60 ? detail::format("{}m{:02}s", left / 60, left % 60) : detail::format("{}s", left);
        };
        const auto within = until(deadline);
        const auto nnodes = options_.elastic() ? detail::format("--nnodes={}:{}", options_.min(), options_.nnodes)
                                               : detail::format("--nnodes={}", options_.nnodes);
        if (joined < needed()) {
            co_return detail::format(
                "round {} of run '{}': {} of the {} nodes needed ({}) joined; waiting up to {} (the "
                "join timeout) for the rest",
                r, options_.run_id, joined, needed(), nnodes, within);
        }
        if (last_call) {
            co_return detail::format(
                "round {} of run '{}': {} nodes joined ({}); the round forms at its last call, in {}", r,
                options_.run_id, joined, nnodes, until(*last_call));
        }
        // After a move the last call seals the round whoever lives; otherwise it waits for every
        // live node of the job.
        const auto live = members_ && target_ == 0 ? co_await live_nodes(*store_) : joined;
        if (live > joined) {
            const auto others = live - joined;
            co_return detail::format("round {} of run '{}': {} nodes joined ({}); waiting up to {} (the join timeout) "
                                     "for the {} other live node{} of the job (stopping {} workers?), or {} loss",
                                     r, options_.run_id, joined, nnodes, within, others, others == 1 ? "" : "s",
                                     others == 1 ? "its" : "their", others == 1 ? "its" : "their");
        }
        co_return detail::format("round {} of run '{}': {} nodes joined ({}); waiting up to {} (the join timeout) for "
                                 "the round to form",
                                 r, options_.run_id, joined, nnodes, within);
    }

    // Elastic rounds: complete once every live node joined (at least the nodes needed) — at
    // once in a quick round, after the last call in the others (the job's first round, one
    // admitting nodes), so nodes still starting get in, and nodes still stopping their workers
    // are waited for (else they would arrive late and restart the others again).
    asio::awaitable<void> complete_if_all_live(Store& s, int r) {
        if (!members_) co_return;
        const auto count = co_await s.add(key(r, "count"), 0);
        if (!detail::rendezvous::may_seal_when_all_live(count, rules())) co_return;
        if (count < co_await live_nodes(s)) co_return;
        if (!detail::rendezvous::quick_round(r, admission_, target_)) {
            std::vector<std::string> over{key(r, "last_call_over")};
            if (!co_await s.check(std::move(over))) co_return;
        }
        co_await seal(s, r);
    }

    // The nodes in the job now: every registration, less every lost lease (a leaving node's
    // lease ends as a loss too).
    asio::awaitable<std::int64_t> live_nodes(Store& s) {
        const auto registered = co_await s.add(job_key("registered"), 0);
        const auto lost = co_await read_epoch(s, members_ ? members_->epoch : 0);
        co_return registered - lost;
    }

    // The infos of round r's arrivals (`keys`, in arrival order). An arrival counts itself (its
    // ADD) before it writes its info (its SET): a client that counts itself and never writes (no
    // agent, or an agent lost between the two) would hold the completer's read, and the round,
    // for good. One wait for them all, up to a grace (the last call, within 1..10 s); past it
    // each missing info is reported and read as a hole (`holes`: true, value empty), which the
    // round leaves out.
    asio::awaitable<std::vector<std::string>> arrival_infos(Store& s, int r, const std::vector<std::string>& keys,
                                                            std::vector<bool>& holes) {
        const auto grace = arrival_grace();
        holes.assign(keys.size(), false);
        std::vector<std::string> present = keys;
        if (!co_await wait_keys(s, keys, grace)) {
            present.clear();
            for (std::size_t i = 0; i < keys.size(); ++i) {
                std::vector<std::string> one{keys[i]};
                if (co_await s.check(std::move(one))) {
                    present.push_back(keys[i]);
                    continue;
                }
                holes[i] = true;
                say(detail::format("round {} of run '{}': arrival {} counted itself but wrote no node info within {} "
                                   "ms (a client that is no agent of this job, or an agent lost between the two); the "
                                   "round goes on without it",
                                   r, options_.run_id, i + 1, grace.count()));
            }
        }
        std::vector<std::string> got;
        if constexpr (multi_key_store<Store>) {
            if (!present.empty()) got = co_await s.multi_get(present);
        } else {
            for (const auto& k : present) got.push_back(co_await s.get(k));
        }
        std::vector<std::string> values(keys.size());
        for (std::size_t i = 0, j = 0; i < keys.size(); ++i) {
            if (!holes[i]) values[i] = std::move(got.at(j++));
        }
        co_return values;
    }

    // Seals round r (no arrival after this joins it); the one node whose seal came first
    // completes it with the nodes that had arrived.
    asio::awaitable<void> seal(Store& s, int r) {
        const auto sealed = co_await s.add(key(r, "count"), detail::rendezvous::seal_increment);
        if (const auto joined = detail::rendezvous::sealed_arrivals(sealed, options_.nnodes))
            co_await complete(s, r, *joined);
    }

    // Reads the k nodes' infos (one multi_get), leaves out nodes whose lease is gone (one check),
    // assigns ranks, writes every assignment (one multi_set).
    asio::awaitable<void> complete(Store& s, int r, int k) {
        // With liveness the completer claims the round first: a node that found it lost has
        // voided the round (void_orphaned), and then this one writes nothing and retries.
        if (members_ && co_await s.compare_set(key(r, "completer"), std::string{}, id_) != id_) co_return;
        std::vector<std::string> keys;
        keys.reserve(static_cast<std::size_t>(k));
        for (int i = 1; i <= k; ++i) keys.push_back(key(r, detail::format("info/{}", i)));
        std::vector<bool> holes;
        const auto values = co_await arrival_infos(s, r, keys, holes);
        // An arrival whose info is not valid (a client that is no agent: bad JSON, a value out
        // of range, or, with liveness, no lease name) is reported and left out of the round,
        // as is one that wrote no info in time (a hole, reported by arrival_infos).
        std::vector<node_info> arrived;
        std::vector<bool> valid;
        arrived.reserve(values.size());
        for (std::size_t i = 0; i < values.size(); ++i) {
            if (holes[i]) {
                valid.push_back(false);
                arrived.emplace_back();
                continue;
            }
            auto node = checked(keys[i], values[i], "this arrival is left out of the round", [&](std::string_view v) {
                auto n = detail::rendezvous::decode_node(v);
                if (members_ && n.id.empty())
                    throw detail::rendezvous::invalid_value("it names no lease (every agent holds one)");
                return n;
            });
            valid.push_back(node.has_value());
            arrived.push_back(node ? std::move(*node) : node_info{});
        }
        const std::optional<int> counted = co_await job_restarts(s);
        const int restarts = counted.value_or(restarts_);

        // Liveness: a node whose lease is gone (lost, or left) is left out of the round. The
        // lease keys are the store's own record. This node's log of losses is not enough: it
        // starts at this node's registration, so a node that was dropped and rejoined has not
        // seen the loss of its former self, whose info may still be among the arrivals. The
        // epoch is read first: a loss after it reaches every member as a later epoch (and
        // aborts the round when the lost node is in it).
        std::int64_t epoch = 0;
        std::int64_t silent = -1;  // the silent losses so far: read before the leases, like the epoch
        std::vector<int> in;       // arrival indexes (0-based) of the round's members
        for (int i = 0; i < k; ++i)
            if (valid[static_cast<std::size_t>(i)]) in.push_back(i);
        if (members_) {
            epoch = co_await read_epoch(s, members_->epoch);
            silent = co_await silent_losses(s);
            std::vector<std::string> leases;
            for (const int i : in) leases.push_back(lease_key(lease_group(), arrived[static_cast<std::size_t>(i)].id));
            if (!leases.empty() && !co_await s.check(std::move(leases))) {
                // One at a time only when some lease is gone (a rare round).
                const auto was = std::exchange(in, {});
                for (const int i : was) {
                    if (co_await holds_lease(s, arrived[static_cast<std::size_t>(i)].id)) in.push_back(i);
                }
            }
        }
        std::vector<std::string> out_keys;
        std::vector<std::string> out_values;
        std::vector<std::string> members;  // the round's lease names (member/<id> keys)
        int size = 0;
        const auto tell_all = [&](const std::string& value) {
            for (int i = 1; i <= k; ++i) {
                out_keys.push_back(key(r, detail::format("assign/{}", i)));
                out_values.push_back(value);
            }
        };
        // After a member went silent, or while one stays away with a live lease, the round needs
        // a majority of the last one (no majority: everyone is told so with the retry, and waits
        // for one from then on).
        split_verdict verdict;
        if (static_cast<int>(in.size()) >= needed()) verdict = co_await split_rule(s, arrived, in, silent);
        if (static_cast<int>(in.size()) < needed() || verdict.majority_of > 0) {
            // A node was lost while the round formed and too few are left: everyone goes on to
            // the next round (where the join timeout may end the wait); a late node finds
            // size 0 and moves on too.
            tell_all(detail::rendezvous::encode_retry(verdict.majority_of, verdict.prior_of));
            out_keys.push_back(key(r, "size"));
            out_values.push_back("0");
            // Where a new node starts (it finds size 0 and moves on): never a round collected
            // while rounds were refused one after another.
            out_keys.push_back(job_key("round"));
            out_values.push_back(std::to_string(r));
        } else {
            std::vector<node_info> nodes;
            for (const int i : in) nodes.push_back(arrived[static_cast<std::size_t>(i)]);
            const int n = static_cast<int>(nodes.size());
            auto planned = detail::rendezvous::plan_round(nodes, !options_.elastic());
            if (const auto* message = std::get_if<std::string>(&planned)) {
                tell_all(detail::rendezvous::encode_round_error(*message));
            } else {
                const auto& plan = std::get<detail::rendezvous::round_plan>(planned);
                const auto& master = nodes[plan.master];
                tell_all(detail::rendezvous::encode_round_error(
                    "this node was lost while the round formed (its agent's connection to the rendezvous store "
                    "ended)"));
                // A hole's writer, should it be an agent after all (one slower than the grace),
                // arrives late at this round: a round that formed without it (left_out_).
                for (int i = 0; i < k; ++i) {
                    if (holes[static_cast<std::size_t>(i)]) {
                        out_values[static_cast<std::size_t>(i)] = detail::rendezvous::encode_left_out();
                    }
                }
                // The round before this one, for the movers' rule should the store move before
                // every member acknowledged this one (split_rule).
                std::optional<detail::rendezvous::earlier_round> earlier;
                if (guards_split() && verdict.before)
                    earlier = detail::rendezvous::earlier_round{verdict.before->round, verdict.before->size};
                rendezvous_round assignment;
                assignment.world_size = plan.world_size;
                assignment.group_world_size = n;
                assignment.epoch = epoch;
                assignment.master_addr = master.store_addr;
                assignment.master_port = master.store_port;
                assignment.restart_count = restarts;
                assignment.host_in_round = plan.host_in;
                assignment.successors = plan.successors;
                for (int j = 0; j < n; ++j) {
                    const int g = plan.group_rank[static_cast<std::size_t>(j)];
                    const int arrival = in[static_cast<std::size_t>(j)] + 1;
                    assignment.group_rank = g;
                    assignment.rank_base = plan.rank_base[static_cast<std::size_t>(g)];
                    assignment.role_rank_base = plan.role_rank_base[static_cast<std::size_t>(g)];
                    assignment.role_world_size = plan.role_world_size[static_cast<std::size_t>(g)];
                    // Group rank 0 hosts the workers' store: it accepts the members' addresses
                    // only (O(N) bytes in that one assignment).
                    if (g == 0) assignment.peers = plan.peers;
                    out_values[static_cast<std::size_t>(arrival - 1)] = detail::rendezvous::encode(assignment, earlier);
                    assignment.peers.clear();
                    if (!nodes[static_cast<std::size_t>(j)].id.empty()) {
                        out_keys.push_back(key(r, "member/" + nodes[static_cast<std::size_t>(j)].id));
                        out_values.push_back(std::to_string(g));
                    }
                }
                // For the standbys (they get no assignment): where the store may move.
                out_keys.push_back(key(r, "successors"));
                out_values.push_back(detail::rendezvous::encode_round_successors(plan.host_in, plan.successors));
                out_keys.push_back(key(r, "hosts"));
                out_values.push_back(detail::rendezvous::encode_hosts(plan.hosts));
                out_keys.push_back(key(r, "size"));
                out_values.push_back(std::to_string(n));
                out_keys.push_back(job_key("round"));
                out_values.push_back(std::to_string(r));
                // The last formed round's members and silent-loss count, for the split-brain
                // rule (split_rule): a job key, so no collection of old rounds removes it.
                std::vector<std::string> ids;
                for (const auto& node : nodes) {
                    if (!node.id.empty()) ids.push_back(node.id);
                }
                detail::rendezvous::round_manifest last{k, n, std::move(ids), silent, r};
                if (verdict.before) {
                    // The round before this one, for the next round's rule: this round's members
                    // that were its members (a member that never learns of this round goes by it).
                    last.prior = std::move(verdict.before);
                    std::set<int> seen;  // each rank there once (two arrivals may claim one)
                    for (int j = 0; j < n; ++j) {
                        const auto& node = nodes[static_cast<std::size_t>(j)];
                        if (node.member_of == last.prior->round && node.previous_rank &&
                            *node.previous_rank < last.prior->size && seen.insert(*node.previous_rank).second) {
                            last.prior->from.emplace_back(plan.group_rank[static_cast<std::size_t>(j)],
                                                          *node.previous_rank);
                        }
                    }
                }
                if (guards_split()) {
                    last.by_rank.resize(static_cast<std::size_t>(n));
                    for (int j = 0; j < n; ++j) {
                        last.by_rank[static_cast<std::size_t>(plan.group_rank[static_cast<std::size_t>(j)])] =
                            nodes[static_cast<std::size_t>(j)].id;
                    }
                }
                out_keys.push_back(job_key("last_round"));
                out_values.push_back(detail::rendezvous::encode(last));
                for (const auto& node : nodes) {
                    if (!node.id.empty()) members.push_back(node.id);
                }
                size = n;
            }
        }
        if (members_) {
            // Still this round's completer? A node taken for lost meanwhile (its lease gone:
            // stopped past its keep-alive) may have seen the round voided, and writes nothing.
            if (!co_await holds_lease(s, id_) || co_await s.get(key(r, "completer")) != id_) co_return;
        }
        // What collect() deletes once no node can need this round any more.
        out_keys.push_back(key(r, "manifest"));
        out_values.push_back(detail::rendezvous::encode(detail::rendezvous::round_manifest{k, size, members}));
        if constexpr (multi_key_store<Store>) {
            co_await s.multi_set(std::move(out_keys), std::move(out_values));
        } else {
            for (std::size_t i = 0; i < out_keys.size(); ++i) co_await s.set(out_keys[i], out_values[i]);
        }
        co_await collect(s, r);
    }

    // ---- key lifetime (docs/rendezvous.md, "Key lifetime") ------------------------------------

    // Rounds whose keys stay in the store: the one just completed and the two before it. A node
    // reads round q's keys only until it arrives at round q+1 (its abort, its decision, a
    // standby's size and successors); round q+3 completes only after rounds q+1 and q+2 were
    // aborted, so every node that is still in the job has left round q long before.
    static constexpr int kept_rounds = 3;

    // Whether round r's keys were deleted (the job's `collected` is past it): a node that reads
    // them now (a member slow to stop its workers after the round was aborted) would wait for
    // ever on a key that is gone. Asked before each wait on the round's keys and before each
    // read after one. A value that is no count is reported and taken for "not collected".
    asio::awaitable<bool> round_collected(Store& s, int r) { co_return co_await unless_lost(s, read_collected(s, r)); }

    asio::awaitable<bool> read_collected(Store& s, int r) {
        const auto first_kept = co_await read_checked(
            s, job_key("collected"), "this node takes its round for one not deleted yet",
            [](std::string_view v) { return detail::rendezvous::decode_count(v, 0, std::numeric_limits<int>::max()); });
        co_return first_kept&&* first_kept > r;
    }

    // Round r was aborted and deleted while this node was away from it: the job went on
    // without it. It rejoins the job where it is now, as a node that missed the round.
    abort_notice missed_abort(int r) {
        rediscover_ = true;
        abort_notice notice;
        notice.what = abort_notice::kind::membership;
        notice.reason = detail::format("round {} of run '{}' ended and was deleted while this node was away from it; "
                                       "this node rejoins the job at its current round",
                                       r, options_.run_id);
        say(notice.reason);
        return notice;
    }

    // The decision after round r is gone with the round: later rounds completed, so it was a
    // restart (a stop ends every node and no round completes after it).
    job_decision missed_decision(int r) {
        rediscover_ = true;
        job_decision decision;
        decision.restart = true;
        decision.exit_code = 0;
        decision.reason = detail::format(
            "the decision after round {} of run '{}' was deleted with the round while this "
            "node was away from it (later rounds completed, so the job restarted); this node "
            "rejoins the job at its current round",
            r, options_.run_id);
        say(decision.reason);
        return decision;
    }

    // The completer of round r deletes the keys of every round up to r - kept_rounds that is
    // not deleted yet (the job key `collected` names the first of those).
    asio::awaitable<void> collect(Store& s, int r) {
        const int upto = r - kept_rounds;
        if (upto < 0) co_return;
        const auto mark = job_key("collected");
        int from = 0;
        std::vector<std::string> mark_key{mark};
        if (co_await s.check(std::move(mark_key))) {
            const auto value = co_await s.get(mark);
            from = checked(mark, value, "only the oldest round kept is deleted", [&](std::string_view v) {
                       return static_cast<int>(detail::rendezvous::decode_count(v, 0, upto + 1));
                   }).value_or(upto);
        }
        // Bounded work: a round is deleted by the next completer at the latest, so only a gap
        // (a round that never completed, a moved store) leaves more than one behind.
        from = std::max(from, upto - 8);
        for (int q = from; q <= upto; ++q) co_await collect_round(s, q);
        co_await s.set(mark, std::to_string(upto + 1));
    }

    // Deletes round q's keys: the fixed names, each arrival's and member's, every abort and
    // decision slot.
    asio::awaitable<void> collect_round(Store& s, int q) {
        std::vector<std::string> names{"count",      "successors", "hosts",     "size",    "last_call_over",
                                       "done_count", "all_done",   "completer", "counted", "acks"};
        const auto manifest = co_await read_checked(s, key(q, "manifest"), "only the round's fixed keys are deleted",
                                                    [&](std::string_view v) {
                                                        return detail::rendezvous::decode_manifest(v, options_.nnodes);
                                                    });
        if (manifest) {
            for (int i = 1; i <= manifest->k; ++i) {
                names.push_back(detail::format("info/{}", i));
                names.push_back(detail::format("assign/{}", i));
            }
            for (int g = 0; g < manifest->n; ++g) names.push_back(detail::format("done/{}", g));
            for (const auto& id : manifest->ids) names.push_back("member/" + id);
        }
        names.emplace_back("manifest");
        for (const auto& name : names) (void)co_await s.delete_key(key(q, name));
        for (const char* name : {"abort", "decision"}) {
            for (int slot = 0; slot < max_slots; ++slot) {
                if (!co_await s.delete_key(slot_key(q, name, slot))) break;
            }
        }
    }

    // The monitor saw lease `name` lost (the epoch-th loss of the job).
    asio::awaitable<void> on_loss(Store& s, std::int64_t epoch, std::string name) {
        if (name == id_) co_return;
        if (phase_ == phase::running && epoch > running_epoch_ && !name.empty()) {
            co_await on_member_loss(s, round_, name);
        } else if (phase_ == phase::forming) {
            if (options_.elastic()) co_await complete_if_all_live(s, round_);
            co_await void_orphaned(s, round_);
        }
    }

    // A full round (MAX arrivals, or sealed) whose completer was lost before it completed would
    // wait for the join timeout with every live node in it ("2 of the 1 nodes needed"). Each
    // loss while a round forms checks for one: when the round has no size yet and its completer
    // holds no lease (or has not claimed it), the first node to claim it voids the round — every
    // arrival is told to retry — and the live nodes form the next one. A completer that was only
    // slow finds the claim taken and retries with them.
    asio::awaitable<void> void_orphaned(Store& s, int r) {
        const auto count = co_await s.add(key(r, "count"), 0);
        if (count < detail::rendezvous::seal_increment && count < options_.nnodes)
            co_return;  // not full: arrivals or the last call complete it
        // Arrivals (late ones and repeated seals included); a retry where nobody waits is harmless.
        const int k = static_cast<int>(std::min<std::int64_t>(count % detail::rendezvous::seal_increment,
                                                              options_.nnodes));
        if (std::vector<std::string> size{key(r, "size")}; co_await s.check(std::move(size))) co_return;
        const auto claim = key(r, "completer");
        std::string holder;
        if (std::vector<std::string> claimed{claim}; co_await s.check(std::move(claimed))) {
            holder = co_await s.get(claim);
            if (holder.rfind(void_mark, 0) == 0) co_return;
            if (co_await holds_lease(s, holder)) co_return;  // it lives: it completes the round
        }
        const auto mine = std::string(void_mark) + id_;
        if (co_await s.compare_set(claim, holder, mine) != mine) co_return;  // another node was first
        say(detail::format("round {} of run '{}' was full, but its completer ({}) was lost before it completed the "
                           "round; the round is void and the live nodes form the next one",
                           r, options_.run_id,
                           holder.empty() ? std::string("its last arrival")
                                          : detail::rendezvous::describe_node_id(holder)));
        // Never over an assignment: one there is the completer's, written with the size.
        const auto retry = detail::rendezvous::encode_retry();
        for (int i = 1; i <= k; ++i) (void)co_await s.compare_set(key(r, detail::format("assign/{}", i)), "", retry);
        (void)co_await s.compare_set(key(r, "size"), "", "0");
        // So that collect() deletes its keys like a completed round's.
        (void)co_await s.compare_set(key(r, "manifest"), "",
                                     detail::rendezvous::encode(detail::rendezvous::round_manifest{k, 0, {}}));
    }

    // Round r runs, and this node arrived after it formed. Its members are the store's record
    // (the round's manifest): one whose lease is gone and that had not finished is lost, and
    // the round is aborted for it (on_member_loss). The members abort on their own when they
    // see the loss; this covers the nodes that cannot see it — each one dropped with its lease
    // (every member, when the store's host was stopped past the keep-alive), which rejoins
    // under a new lease name and would otherwise wait beside a round nobody runs.
    asio::awaitable<void> abort_if_member_lost(Store& s, int r) {
        const auto manifest = co_await read_checked(s, key(r, "manifest"),
                                                    "this node takes the round's members for live",
                                                    [&](std::string_view v) {
                                                        return detail::rendezvous::decode_manifest(v, options_.nnodes);
                                                    });
        if (!manifest) co_return;
        std::vector<std::string> leases;
        for (const auto& id : manifest->ids) leases.push_back(lease_key(lease_group(), id));
        if (leases.empty() || co_await s.check(std::move(leases))) co_return;  // every lease held
        for (const auto& id : manifest->ids) {
            if (co_await holds_lease(s, id)) continue;
            co_await on_member_loss(s, r, id, false);
            if (co_await aborted(s, r)) co_return;
        }
    }

    // The lease group's silent losses so far (the server's `__silent`), or -1 when the store
    // keeps no such count or it holds no count (reported).
    asio::awaitable<std::int64_t> silent_losses(Store& s) {
        const auto silent = co_await read_checked(
            s, lease_silent_key(lease_group()), "the round is formed as if no lease had gone silent",
            [](std::string_view v) {
                return detail::rendezvous::decode_count(v, 0, std::numeric_limits<std::int64_t>::max());
            });
        co_return silent.value_or(-1);
    }

    // What the split-brain rule says of a round about to form.
    struct split_verdict {
        int majority_of = 0;  ///< the size of the round whose majority it lacks (0: none lacking)
        int prior_of = 0;     ///< refused for the round before the last one: its size
        /// The last round, for this one's `last_round` record (prior_round::from is filled in
        /// by the completer, which knows the new ranks).
        std::optional<detail::rendezvous::round_manifest::prior_round> before;
    };

    // The split-brain rule. A member lost by closing its connection (its agent killed) is gone;
    // one that went silent may be alive on the far side of a network cut, where the others move
    // the store and form a round of their own with a majority of the last round they know. So
    // a round needs a majority of the members of the round before it, counted among the
    // arrivals that say they were members of it (`member_of`, each group rank once), never
    // newcomers or standbys, when:
    // - a lease went silent since the last round formed (`silent`, the count now, above the
    //   one the job's `last_round` recorded), on the store's side;
    // - a member of the last round stays away while its lease lives (it may be cut off, its
    //   lease not run out yet, while standbys fill the round to MAX);
    // - it is the first round in a store the job moved to (`moved_from`, the highest round its
    //   movers knew: record_moved_from).
    // And a member of the last round that never learned that it formed (no `acked/<rank>` for
    // it: cut off between its arrival and its assignment) goes by the round before, whose
    // majority it may make elsewhere with others that stayed away: then the round also needs
    // that too few of the round before are away to make one. A store that keeps no silent count
    // (-1) imposes the rule on nothing, and neither does a last round that recorded none
    // (reported); a last round that recorded no number (an older agent formed it) has its
    // majority counted among all arrivals.
    asio::awaitable<split_verdict> split_rule(Store& s, const std::vector<node_info>& arrived,
                                              const std::vector<int>& in, std::int64_t silent) {
        split_verdict verdict;
        if (!options_.elastic() || !options_.split_guard) co_return verdict;
        const auto last_key = job_key("last_round");
        std::vector<std::string> formed{last_key};
        const bool any_formed = co_await s.check(std::move(formed));
        // A round formed by an agent that kept no count (an older elasticrun) turns the rule off, said once.
        std::optional<detail::rendezvous::round_manifest> last;
        if (any_formed) {
            const auto value = co_await s.get(last_key);
            last = checked(last_key, value, "the round is formed as if no lease had gone silent",
                           [&](std::string_view v) {
                               auto m = detail::rendezvous::decode_manifest(v, options_.nnodes);
                               if (m.n > 0 && m.silent < 0) {
                                   throw detail::rendezvous::invalid_value(
                                       "it records no silent-loss count (an agent of an older version formed that "
                                       "round)");
                               }
                               return m;
                           });
        }
        // The group ranks in round q (of `size` nodes) of the arrivals that were its members.
        const auto ranks_in = [&](int q, int size) {
            std::set<int> ranks;
            for (const int i : in) {
                const auto& node = arrived[static_cast<std::size_t>(i)];
                if (node.member_of == q && node.previous_rank && *node.previous_rank < size)
                    ranks.insert(*node.previous_rank);
            }
            return ranks;
        };
        // The round before the one forming, as the next one's rule needs it: its members absent
        // here that may be alive (when the rule counted them: otherwise they were lost for good).
        const auto before = [&](int q, int size, const std::set<int>& present, bool counted) {
            detail::rendezvous::round_manifest::prior_round p;
            p.round = q;
            p.size = size;
            for (int g = 0; counted && g < size; ++g) {
                if (!present.contains(g)) p.absent.push_back(g);
            }
            return p;
        };
        if (any_formed && !last) co_return verdict;  // an invalid record (reported): the rule is off
        if (!last || last->n <= 0) {
            // No round formed in this store yet: one the job moved to counts the movers' round.
            const auto moved = co_await read_checked(
                s, job_key("moved_from"), "the round is formed without the movers' majority rule",
                [&](std::string_view v) { return detail::rendezvous::decode_moved_from(v, options_.nnodes); });
            if (!moved) co_return verdict;
            const auto present = ranks_in(moved->round, moved->size);
            verdict.before = before(moved->round, moved->size, present, true);
            if (2 * static_cast<int>(present.size()) <= moved->size) {
                verdict.majority_of = moved->size;
            } else if (moved->before) {
                // A mover never saw every member acknowledge the movers' round: a member that had
                // not learned of it goes by the round before, and may move the store elsewhere
                // with that round's majority. The movers then need that majority too: its
                // members here as such, or as members of the movers' round that said so.
                const auto& earlier = *moved->before;
                auto there = ranks_in(earlier.round, earlier.size);
                for (const int i : in) {
                    const auto& node = arrived[static_cast<std::size_t>(i)];
                    if (node.earlier_of == earlier.round && node.earlier_rank && *node.earlier_rank < earlier.size)
                        there.insert(*node.earlier_rank);
                }
                if (2 * static_cast<int>(there.size()) <= earlier.size) {
                    verdict.majority_of = moved->size;
                    verdict.prior_of = earlier.size;
                }
            }
            co_return verdict;
        }
        if (silent < 0) co_return verdict;  // a store that keeps no silent count cannot be cut off
        const int n = last->n;
        if (last->round < 0) {  // an older agent's record: the rule after a silent loss only
            if (silent > last->silent && 2 * static_cast<int>(in.size()) <= n) verdict.majority_of = n;
            co_return verdict;
        }
        const auto present = ranks_in(last->round, n);
        bool counted = silent > last->silent;
        if (!counted && static_cast<int>(last->by_rank.size()) == n) {
            // A member away while its lease lives: it may be on the far side of a cut. Not the
            // store's host that finished and stays for the others (leave(): `staying`): it is
            // on the store's side, and never trains again.
            const auto staying = co_await read_checked(
                s, job_key("staying"), "no member is taken for the store's host staying after it finished",
                [&](std::string_view v) { return detail::rendezvous::decode_staying(v, options_.nnodes); });
            for (int g = 0; g < n && !counted; ++g) {
                if (present.contains(g) || (staying && staying->first == last->round && staying->second == g)) continue;
                counted = co_await holds_lease(s, last->by_rank[static_cast<std::size_t>(g)]);
            }
        }
        verdict.before = before(last->round, n, present, counted);
        if (!counted) co_return verdict;
        if (2 * static_cast<int>(present.size()) <= n) {
            verdict.majority_of = n;
            co_return verdict;
        }
        if (!last->prior) co_return verdict;
        // Members of the round before that may still go by it: those absent from the last round
        // that may be alive, and the last round's members from it that are away now and never
        // acknowledged the last round, unless they arrived here as its members.
        const auto& prior = *last->prior;
        const auto here = ranks_in(prior.round, prior.size);
        int away = 0;
        for (const int g : prior.absent) away += here.contains(g) ? 0 : 1;
        const auto learned = std::to_string(last->round);
        for (const auto& [g, was] : prior.from) {
            if (present.contains(g) || here.contains(was)) continue;
            // A missing or older acknowledgement: the member may never have learned.
            const auto k = job_key(detail::format("acked/{}", g));
            std::vector<std::string> probe{k};
            if (!co_await s.check(std::move(probe)) || co_await s.get(k) != learned) ++away;
        }
        if (2 * away > prior.size) {
            verdict.majority_of = n;
            verdict.prior_of = prior.size;
        }
        co_return verdict;
    }

    // Round r's retry `value` at `k`: when it names the last round's size because too few
    // joined after a silent loss, this node needs that majority in the rounds that follow.
    void heed_majority(int r, std::string_view k, std::string_view value) {
        const auto majority_of = checked(k, value, "the next round needs the nodes it needed", [&](std::string_view v) {
                                     return detail::rendezvous::decode_retry_majority(v, options_.nnodes);
                                 }).value_or(0);
        if (majority_of <= 0) return;
        const auto prior_of = checked(k, value, "the round counts as refused for want of the last round's majority",
                                      [&](std::string_view v) {
                                          return detail::rendezvous::decode_retry_prior(v, options_.nnodes);
                                      })
                                  .value_or(0);
        paced_ = true;
        quorum_ = std::max(quorum_, majority_of / 2 + 1);
        majority_of_ = std::max(majority_of_, majority_of);
        // After a move the movers seal a round at once at `target_` arrivals, or at the last call
        // after `needed()`. Refused for want of the round before's majority, they wait for that
        // many arrivals first: else each round would seal before the member they lack arrives
        // (one that came with an older view, say), and be refused again.
        if (target_ > 0 && prior_of > 0) {
            quorum_ = std::max(quorum_, std::min(prior_of / 2 + 1, options_.nnodes));
            target_ = std::max(target_, quorum_);
        }
        // The latest refusal's reason stands (said again when it changes).
        if (std::exchange(prior_of_, prior_of) != prior_of) told_majority_ = false;
        if (std::exchange(told_majority_, true)) return;
        if (prior_of > 0) {
            say(detail::format(
                "round {} of run '{}': too many of the {} members of the round before the last one are "
                "away and never acknowledged that the last one formed (cut off between joining it and "
                "learning of it: the store cannot tell whether they are stopped, dead, or going on "
                "elsewhere by the round they know). This part of the job may be cut off from the rest, so "
                "it waits for them, up to the join timeout",
                r, options_.run_id, prior_of));
            return;
        }
        say(detail::format(
            "round {} of run '{}': too few of the last round's {} members joined for a majority after a "
            "member went silent or stayed away with a live lease (cut off by the network, stopped, on a "
            "machine that died, or still stopping its workers: the store cannot tell which) or the store "
            "moved; newcomers and standbys do not count toward it. This part of the job may be cut off "
            "from the rest, so the next rounds need {} nodes, {} of them its members, up to the join "
            "timeout",
            r, options_.run_id, majority_of_, quorum_, quorum_));
    }

    // Records in the store the job moved to where it came from: the last round this node knows
    // (a mover's, or the full round a standby waited beside) and its size. The highest round
    // wins: a node that had not read the newest round's assignment when the store was lost
    // knows an older one (a few compare_sets at most, once per move).
    asio::awaitable<void> record_moved_from(Store& lease) {
        const auto k = job_key("moved_from");
        detail::rendezvous::moved_from record{known_round_, known_size_};
        // A member that never saw every member acknowledge its round: some may go by the round
        // before it, so the movers need that round's majority too.
        if (guards_split() && member_round_ == known_round_ && marked_round_ != known_round_) record.before = before_;
        const auto mine = detail::rendezvous::encode(record);
        // compare_set answers with the value it found when it does not write: one request
        // when this node is first, one more per record it replaces.
        std::string expected;
        for (int attempt = 0; attempt < 8; ++attempt) {
            auto found = co_await lease.compare_set(k, expected, mine);
            if (found == mine) co_return;
            const auto theirs = checked(k, found, "this node records its own", [&](std::string_view v) {
                return detail::rendezvous::decode_moved_from(v, options_.nnodes);
            });
            // The newest round wins; of one round, the record that asks for more (a member's
            // that names the round before wins over a standby's or one that saw the mark).
            if (theirs &&
                (theirs->round > known_round_ || (theirs->round == known_round_ && (theirs->before || !record.before))))
                co_return;
            expected = std::move(found);
        }
    }

    // Completes after `d` (a timer: never a store operation).
    static asio::awaitable<void> pause(std::chrono::milliseconds d) {
        asio::steady_timer timer(co_await asio::this_coro::executor, d);
        co_await timer.async_wait(detail::as_tuple_awaitable<Store>);
    }

    // The end of a wait for a majority of the last round's members (quorum_, majority_of_).
    [[nodiscard]] rendezvous_error majority_error(int r) const {
        const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(options_.join_timeout).count();
        if (prior_of_ > 0) {
            return rendezvous_error(detail::format(
                "rendezvous of run '{}' round {}: too many of the {} members of the round before the last one stayed "
                "away without acknowledging the last round within the join timeout ({} s): they may be going on "
                "elsewhere by the round they know (cut off by the network between joining the last round and learning "
                "of it), and a part cut off from the others never goes on alone (--nnodes={}:{}); restart the job once "
                "its nodes reach each other",
                options_.run_id, r, prior_of_, seconds, options_.min(), options_.nnodes));
        }
        return rendezvous_error(detail::format(
            "rendezvous of run '{}' round {}: no majority of the last round's {} members ({} of them; newcomers and "
            "standbys do not count) joined within the join timeout ({} s): a member went silent or stayed away with "
            "a live lease since (cut off by the network, stopped, or on a machine that died, which the store cannot "
            "tell apart) or the store moved, and a part cut off from the others never goes on alone (--nnodes={}:{}); "
            "restart the job once its nodes reach each other",
            options_.run_id, r, std::max(majority_of_, 1), quorum_, seconds, options_.min(), options_.nnodes));
    }

    // How long a completer waits for an arrival's info, and a node between rounds that found no
    // majority: the last call, within 1..10 s.
    [[nodiscard]] std::chrono::milliseconds arrival_grace() const {
        using std::chrono::milliseconds;
        return std::clamp(std::chrono::duration_cast<milliseconds>(options_.last_call_timeout), milliseconds(1000),
                          milliseconds(10000));
    }

    // The claim of a voided round (void_orphaned) starts with this; a completer's is its lease name.
    static constexpr std::string_view void_mark = "void:";

    // Aborts round r when lease `name` was one of its members and had not finished. A member
    // whose workers all succeeded (it marked done/<g> before its exit barrier) is finished: its
    // leaving, when its barrier times out or its agent ends, is no loss, and the others run to
    // their own end.
    asio::awaitable<void> on_member_loss(Store& s, int r, std::string name, bool member_here = true) {
        const auto member_key = key(r, "member/" + name);
        std::vector<std::string> member{member_key};
        if (!co_await s.check(std::move(member))) co_return;
        const auto value = co_await s.get(member_key);
        const auto g = checked(member_key, value, "the node is taken for lost", [&](std::string_view v) {
            return detail::rendezvous::decode_count(v, 0, std::max(size_, 1) - 1);
        });
        if (g) {
            std::vector<std::string> done{key(r, detail::format("done/{}", *g))};
            if (co_await s.check(std::move(done))) {
                say(detail::format("node {} (group_rank {}) left after its workers succeeded{}",
                                   detail::rendezvous::describe_node_id(name), *g,
                                   member_here ? "; this node's workers go on" : ""));
                co_return;
            }
        }
        abort_notice lost;
        lost.what = abort_notice::kind::membership;
        lost.reason = detail::format("node {} was lost ({})", detail::rendezvous::describe_node_id(name),
                                     options_.loss_cause);
        (void)co_await abort_round(s, r, std::move(lost));
    }

    static asio::awaitable<bool> wait_for(Store& s, std::string k, std::chrono::milliseconds timeout) {
        std::vector<std::string> keys{std::move(k)};
        co_return co_await wait_keys(s, std::move(keys), timeout);
    }

    // Whether every key of `keys` exists within `timeout`.
    static asio::awaitable<bool> wait_keys(Store& s, std::vector<std::string> keys, std::chrono::milliseconds timeout) {
        bool timed_out = false;
        try {
            co_await s.wait(std::move(keys), timeout);
        } catch (const store_timeout&) {
            timed_out = true;
        }
        co_return !timed_out;
    }

    asio::awaitable<bool> wait_all_done(std::chrono::milliseconds timeout) {
        co_return co_await wait_for(*store_, key(round_, "all_done"), timeout);
    }

    // A wait with no deadline of its own: renewed hourly (the only traffic of an idle job).
    static asio::awaitable<void> wait_long(Store& s, std::string k) {
        for (;;) {
            const bool ready = co_await wait_for(s, k, std::chrono::hours(1));
            if (ready) co_return;
        }
    }

    Store* store_;
    Store* watcher_;
    Store* lease_ = nullptr;
    store_rendezvous_options options_;
    std::shared_ptr<detail::rendezvous::membership_log> members_;
    std::string id_;
    std::set<std::string> warned_;  ///< key and value of every invalid value reported
    phase phase_ = phase::idle;
    int round_ = -1;
    bool finished_ = false;  ///< this node's workers succeeded in round_ (finish() was called)
    int restarts_ = 0;
    int group_rank_ = -1;
    int size_ = 0;
    std::int64_t running_epoch_ = 0;
    bool admission_ = false;                   ///< the last round ended to admit a node
    std::optional<abort_notice> standing_;     ///< the current round's abort, once seen
    bool rediscover_ = false;                  ///< this node was dropped and rejoined: read the job's round again
    bool left_out_ = false;                    ///< the last round formed without this node (a hole: info too late)
    std::optional<int> passed_by_;             ///< a later round at the moved store had arrivals while this node waited
    int moved_arrival_ = -1;                   ///< the last round this node arrived at since the store moved
    bool host_in_round_ = false;               ///< the store's host was a member of the last round
    std::vector<store_successor> successors_;  ///< the last round's successors
    int quorum_ = 0;  ///< after the store moved or a member went silent: the majority the next round needs (0: none)
    int majority_of_ = 0;    ///< the last round's size whose majority quorum_ is (a move, or a retry that named it)
    int prior_of_ = 0;       ///< a retry named the round before the last (its unacknowledged members): its size
    int target_ = 0;         ///< after the store moved: the round completes at once at this many (0: MAX)
    int member_round_ = -1;  ///< the last round this node was a member of (-1: none yet)
    int known_round_ = -1;   ///< the last formed round this node knows of (as a member or a standby)
    int known_size_ = 0;     ///< its size
    bool moved_ = false;     ///< move_to() was called: start_liveness() records where the job came from
    bool paced_ = false;     ///< the last round was retried for want of a majority of members
    bool told_majority_ = false;  ///< the majority this node waits for was said (once per wait)
    bool await_movers_ = false;   ///< moved as no member: the next round waits for the movers' first
    int marked_round_ = -1;       ///< the last round this node saw every member acknowledge (mark_acknowledged)
    /// The round formed before member_round_ (its assignment named it), while the split-brain
    /// rule keeps one; and this node's group rank there (-1: it was no member of it).
    std::optional<detail::rendezvous::earlier_round> before_{};
    int before_rank_ = -1;
    std::optional<detail::rendezvous::earlier_round> assigned_before_{};  ///< await_assignment's, for next_round
    bool after_move_ = false;       ///< no round formed since the store moved: arrivals tell their earlier rank
    bool left_for_origin_ = false;  ///< next_round() ended to go back where the last round formed
    /// When the wait that left for the origin began: the next wait's start, should it go on here.
    std::optional<std::chrono::steady_clock::time_point> carried_start_;
};

}  // namespace elastic::inline v0
