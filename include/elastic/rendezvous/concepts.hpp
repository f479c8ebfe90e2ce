// SPDX-License-Identifier: MIT
// The rendezvous concept: how one node's agent joins a round of the job, learns its ranks and
// the workers' store, and hears of the job's events (a failure anywhere, the end of the job).
#pragma once

#include "elastic/detail/config.hpp"

#include <asio/awaitable.hpp>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace elastic::inline v0 {

/// What a node tells the others when it joins a round.
struct node_info {
    std::string host;                  ///< its name, for messages (getfqdn() or --local-addr)
    std::string store_addr;            ///< where its fresh workers' store for this round listens
    std::uint16_t store_port = 0;      ///< that store's port
    int nproc = 1;                     ///< its workers (--nproc-per-node)
    std::string role = "default";      ///< its workers' role (--role): ROLE_RANK counts within a role
    std::optional<int> node_rank;      ///< --node-rank: the group rank it must get
    std::optional<int> previous_rank;  ///< its group rank in the previous round (stable order)
    std::optional<int> member_of;      ///< the round it held previous_rank in (the majority rule counts members)
    /// In the first round after the store moved: its group rank in the round formed before
    /// member_of, and that round, when it was a member of it. Until every member acknowledged
    /// member_of, some may still go by that round, so the movers need its majority too.
    std::optional<int> earlier_rank;
    std::optional<int> earlier_of;
    long pid = 0;                   ///< the agent's process id, for messages
    std::string id;                 ///< its lease's name in the job (unique; empty: no liveness)
    std::uint16_t backup_port = 0;  ///< its idle store server at store_addr, should the job's move there
    bool backup_listed = false;     ///< that server listens at a --rdzv-endpoint list's entry
    bool hosts_store = false;       ///< it hosts the rendezvous store now
    /// The literal addresses of its interfaces (no loopback, no link-local IPv6): where its
    /// connections to group rank 0's workers' store may come from.
    std::vector<std::string> addrs;
};

/// Where the rendezvous store may move when its host is lost: an idle store server of a member.
struct store_successor {
    std::string id;          ///< the member's lease name
    std::string addr;        ///< its address
    std::uint16_t port = 0;  ///< its idle server's port
};

/// One completed round, as every node sees it (equal everywhere but group_rank and rank_base).
struct rendezvous_round {
    int number = 0;            ///< the round (0, 1, ...)
    int restart_count = 0;     ///< job-wide restarts before this round: TORCHELASTIC_RESTART_COUNT
    int group_rank = 0;        ///< this node's GROUP_RANK
    int group_world_size = 1;  ///< nodes in the round: GROUP_WORLD_SIZE
    int rank_base = 0;         ///< the global rank of this node's local rank 0
    int world_size = 1;        ///< workers in the round: WORLD_SIZE
    /// ROLE_RANK of this node's local rank 0: the workers of this node's role on the nodes of
    /// lower group rank (equal to rank_base when every node has the same role). -1: the
    /// rendezvous knows no roles, and the agent uses rank_base.
    int role_rank_base = -1;
    int role_world_size = -1;                 ///< workers of this node's role: ROLE_WORLD_SIZE; -1: world_size
    std::int64_t epoch = 0;                   ///< lease losses the round's completer had accounted for
    std::vector<store_successor> successors;  ///< where the store moves if its host is lost, in order
    bool host_in_round = false;               ///< the store's host is a member of this round
    std::string master_addr;                  ///< MASTER_ADDR: group rank 0's workers' store
    std::uint16_t master_port = 0;            ///< MASTER_PORT
    /// Group rank 0 only: every member's interface addresses (literals; a member that published
    /// none: its host and advertised address, names or literals), for its workers' store to
    /// accept connections from the round's nodes alone (empty on the other nodes).
    std::vector<std::string> peers;

    /// ROLE_RANK of local rank 0 and ROLE_WORLD_SIZE, the global ones when the rendezvous knows no
    /// roles (-1).
    [[nodiscard]] int role_base() const noexcept { return role_rank_base >= 0 ? role_rank_base : rank_base; }
    [[nodiscard]] int role_size() const noexcept { return role_world_size >= 0 ? role_world_size : world_size; }
};

/// Why a round ended early, or that the job ended: the first notice written wins (compare-and-set).
struct abort_notice {
    enum class kind {
        failure,     ///< a worker failed: the reporting node's policy decides (await_decision)
        membership,  ///< a node was lost, left or waits to join: every node rejoins the next round
        closed,      ///< the job ended: every node finished (standbys exit 0)
    };
    int group_rank = -1;  ///< the reporting node
    std::string host;     ///< its host
    std::string reason;   ///< one line: which local rank, which exit code or signal; which node
    kind what = kind::failure;
    bool admission = false;  ///< membership: a node waits to join (the next round then takes a last call)
    /// The reporting node's lease name (node_info::id), filled in by the rendezvous: a failure's
    /// reporter decides the round, and the others take the decision over when it is gone.
    std::string node{};
};

/// What the job does after an aborted round, decided by the node that aborted it.
struct job_decision {
    bool restart = false;  ///< true: every node rejoins the next round
    int exit_code = 1;     ///< when stopping: the code every node exits with (the root cause's)
    std::string reason;    ///< the policy's reason
    /// A restart taken over from a deciding node that was lost before it decided: the nodes
    /// re-form without it, as after any node loss (a membership restart, not counted).
    bool regroup = false;
};

/// How a node's exit barrier ended.
struct barrier_result {
    enum class kind { complete, aborted, timed_out };
    kind how = kind::complete;
    std::vector<int> missing;                ///< timed_out: the group ranks that did not finish
    std::vector<std::string> missing_hosts;  ///< timed_out: their hosts (same order)
    std::optional<abort_notice> abort;       ///< aborted: why
};

/*
 * rendezvous: one node's handle on the job's rounds. A model provides
 *   next_round(node_info)          -> awaitable<rendezvous_round>  join and await the round
 *   wait_for_abort()               -> awaitable<abort_notice>      the current round's abort
 *                                                                  (push; cancellable)
 *   abort(abort_notice)            -> awaitable<bool>   report a failure; true: this node won
 *   decide(job_decision)           -> awaitable<job_decision>  the winner publishes restart/
 *                                                       stop; returns the decision that stands
 *                                                       (another node's takeover, when this one
 *                                                       was taken for lost meanwhile)
 *   await_decision()               -> awaitable<job_decision>  the decision; taken over (a
 *                                                       regroup) when the decider is gone
 *   finish(timeout)                -> awaitable<barrier_result>  this node is done; exit barrier
 *   leave()                        -> awaitable<void>   this node is leaving the job for good
 * Waiting is by store notification, never by polling.
 */
template <class R>
concept rendezvous = requires(R& r, node_info info, abort_notice notice, job_decision decision,
                              std::chrono::milliseconds timeout) {
    { r.next_round(info) } -> std::same_as<asio::awaitable<rendezvous_round>>;
    { r.wait_for_abort() } -> std::same_as<asio::awaitable<abort_notice>>;
    { r.abort(notice) } -> std::same_as<asio::awaitable<bool>>;
    { r.decide(decision) } -> std::same_as<asio::awaitable<job_decision>>;
    { r.await_decision() } -> std::same_as<asio::awaitable<job_decision>>;
    { r.finish(timeout) } -> std::same_as<asio::awaitable<barrier_result>>;
    { r.leave() } -> std::same_as<asio::awaitable<void>>;
};

/*
 * agent_rendezvous: a rendezvous an agent runs a whole job over. Beside the rounds it provides
 *   join(node_info)                -> awaitable<void>   reach the job (host or connect to its
 *                                                       store) and hold this node's liveness
 *   keep_membership()              -> awaitable<void>   runs for as long as the node is in the
 *                                                       job (observes lost nodes); ends only by
 *                                                       cancellation or an error
 *   recover(reason, node_info)     -> awaitable<std::string>  the job's store was lost (`reason`):
 *                                                       rejoin it or move the job elsewhere and
 *                                                       say in one line what was done; throws
 *                                                       rendezvous_error when the job cannot go on
 *   restart_count()                -> int    job-wide restarts so far (TORCHELASTIC_RESTART_COUNT)
 *   stop()                         -> void   closes what it holds (after leave(); noexcept)
 * The agent's loop (local_agent) is written once over this concept: single_node_rendezvous is
 * the trivial model for one node, tcp_rendezvous the model for several.
 */
template <class R>
concept agent_rendezvous = rendezvous<R> && requires(R& r, const R& cr, node_info info, std::string reason) {
    { r.join(info) } -> std::same_as<asio::awaitable<void>>;
    { r.keep_membership() } -> std::same_as<asio::awaitable<void>>;
    { r.recover(reason, info) } -> std::same_as<asio::awaitable<std::string>>;
    { cr.restart_count() } -> std::convertible_to<int>;
    { r.stop() }
    noexcept;
};

}  // namespace elastic::inline v0
