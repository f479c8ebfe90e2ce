// SPDX-License-Identifier: MIT
// The round planner: what a round is, decided from its members alone (docs/rendezvous.md):
// group ranks, rank bases, the world size, the master, where the store may move and who may
// reach group rank 0's workers' store; and what an arrival or a seal of a round leads to.
// Pure functions of their arguments: no store, no coroutines. store_rendezvous runs them.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/rendezvous/codec.hpp"
#include "elastic/rendezvous/concepts.hpp"

#include "elastic/detail/format.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace elastic::inline v0 {

namespace detail::rendezvous {

/// The group rank of each node (by arrival order) or a message naming the conflict.
/// `--node-rank` first; the rest keep their previous order (stable), newcomers by arrival.
/// `strict` (fixed membership): a --node-rank outside the round or given twice is an error;
/// otherwise (elastic membership, where the round's size varies) it is a preference, honoured
/// when it fits the round and nobody before took it.
ELASTIC_DECL std::variant<std::vector<int>, std::string> assign_group_ranks(const std::vector<node_info>& nodes,
                                                                            bool strict = true);

/// Where the round's nodes connect to group rank 0's workers' store from: each node's published
/// interface addresses and its advertised address when that is a literal; for a node that
/// published none, its host and advertised address (names, resolved by group rank 0). Each
/// once, in order.
ELASTIC_DECL std::vector<std::string> peers_of(const std::vector<node_info>& nodes);

/// Added to a round's arrival counter to seal it: an arrival that reads at least this is late.
inline constexpr std::int64_t seal_increment = std::int64_t{1} << 32;

/// At most this many successors (idle servers of members) are named for the store.
inline constexpr std::size_t max_successors = 3;

/// A round decided from its members (in arrival order): what its completer writes.
struct round_plan {
    std::vector<int> group_rank;  ///< each member's group rank, in arrival order
    std::vector<int> rank_base;   ///< by group rank: the global rank of its local rank 0
    int world_size = 0;           ///< the round's workers (every member's nproc)
    /// By group rank: the ROLE_RANK of its local rank 0 (its role's workers on lower group
    /// ranks) and its role's workers in the round, as torchrun counts them.
    std::vector<int> role_rank_base;
    std::vector<int> role_world_size;
    std::size_t master = 0;          ///< the member (arrival order) of group rank 0: MASTER_ADDR/PORT
    std::vector<std::string> hosts;  ///< by group rank: each member's host, for messages
    bool host_in = false;            ///< the store's host is a member
    /// Where the store moves if its host is lost: the first members by group rank that have
    /// an idle server and do not host it now (docs/rendezvous.md).
    std::vector<store_successor> successors;
    std::vector<std::string> peers;  ///< peers_of(members), for group rank 0
};

/// The round `nodes` (its members, in arrival order) form, or a message naming why they form
/// none (assign_group_ranks: a --node-rank conflict under `strict`).
ELASTIC_DECL std::variant<round_plan, std::string> plan_round(const std::vector<node_info>& nodes, bool strict);

/// What decides a round's completion besides its arrivals.
struct round_rules {
    int nnodes = 1;        ///< MAX: the MAX-th arrival completes the round
    bool elastic = false;  ///< MIN < MAX
    int needed = 1;        ///< the nodes a round needs: MIN, or after the store moved a majority
    int target = 0;        ///< after the store moved: the arrival that seals the round (0: none)
};

/// What a node does once it arrived at a round as the `arrival`-th (the round's counter after
/// its add; a sealed round's counter holds seal_increment more).
enum class arrival_step {
    late,      ///< past MAX, or the round is sealed: the node is late for it
    complete,  ///< the MAX-th arrival: it completes the round with every arrival
    seal,      ///< the target arrival after the store moved: it seals the round
    try_seal,  ///< elastic, at least the nodes needed: it seals once every live node joined
    wait,      ///< it waits for its assignment
};

ELASTIC_DECL arrival_step on_arrival(std::int64_t arrival, const round_rules& rules);

/// Whether the `arrival`-th node's wait has a last call (after which it seals the round, or
/// marks the last call over for the live nodes still to come).
ELASTIC_DECL bool has_last_call(std::int64_t arrival, const round_rules& rules);

/// A seal's add returned `sealed`: the arrivals the sealer completes the round with, or nothing
/// when another seal came first or the MAX-th arrival completes the round.
ELASTIC_DECL std::optional<int> sealed_arrivals(std::int64_t sealed, int nnodes);

/// Whether a round whose counter reads `count` may be sealed once every live node joined: not
/// sealed, short of MAX (that arrival completes it), and with the nodes needed.
ELASTIC_DECL bool may_seal_when_all_live(std::int64_t count, const round_rules& rules);

/// Whether round r completes as soon as every live node joined: not the job's first round
/// (nodes are still starting), nor one that admits new nodes (others may be starting with
/// them: torchrun's last call lets a batch of new nodes in with one restart), nor the first
/// after the store moved.
ELASTIC_DECL bool quick_round(int r, bool admission, int target) noexcept;

/// The rules of the first round after the store moved, from the last round's size and whether
/// the store's lost host was among its members: a majority of them (`quorum`), and the arrival
/// that seals the round at once (every other member of the last round; at least the quorum).
struct moved_round {
    int quorum = 1;
    int target = 1;
};

ELASTIC_DECL moved_round after_store_moved(int last_size, bool host_in_round) noexcept;

}  // namespace detail::rendezvous

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::rendezvous {

ELASTIC_DECL std::variant<std::vector<int>, std::string> assign_group_ranks(const std::vector<node_info>& nodes,
                                                                            bool strict) {
    const int n = static_cast<int>(nodes.size());
    std::vector<int> rank(nodes.size(), -1);
    std::vector<int> owner(nodes.size(), -1);
    for (int i = 0; i < n; ++i) {
        const auto& given = nodes[static_cast<std::size_t>(i)].node_rank;
        if (!given) continue;
        if (!strict && (*given < 0 || *given >= n || owner[static_cast<std::size_t>(*given)] >= 0)) continue;
        if (*given < 0 || *given >= n) {
            return detail::format("--node-rank={} of {} (pid {}) is outside 0..{} for --nnodes={}", *given,
                                  nodes[static_cast<std::size_t>(i)].host, nodes[static_cast<std::size_t>(i)].pid,
                                  n - 1, n);
        }
        auto& o = owner[static_cast<std::size_t>(*given)];
        if (o >= 0) {
            const auto& a = nodes[static_cast<std::size_t>(o)];
            const auto& b = nodes[static_cast<std::size_t>(i)];
            return detail::format("--node-rank={} given by two nodes, {} (pid {}) and {} (pid {}); each node needs its "
                                  "own --node-rank",
                                  *given, a.host, a.pid, b.host, b.pid);
        }
        o = i;
        rank[static_cast<std::size_t>(i)] = *given;
    }
    std::vector<int> rest;
    for (int i = 0; i < n; ++i)
        if (rank[static_cast<std::size_t>(i)] < 0) rest.push_back(i);
    // Survivors first in their previous order, then newcomers in arrival order.
    std::stable_sort(rest.begin(), rest.end(), [&](int a, int b) {
        const auto& pa = nodes[static_cast<std::size_t>(a)].previous_rank;
        const auto& pb = nodes[static_cast<std::size_t>(b)].previous_rank;
        if (pa && pb) return *pa < *pb;
        return pa.has_value() && !pb.has_value();
    });
    std::size_t next = 0;
    for (int r = 0; r < n; ++r) {
        if (owner[static_cast<std::size_t>(r)] >= 0) continue;
        rank[static_cast<std::size_t>(rest[next++])] = r;
    }
    return rank;
}

ELASTIC_DECL std::vector<std::string> peers_of(const std::vector<node_info>& nodes) {
    std::vector<std::string> out;
    auto add = [&](const std::string& p) {
        if (!p.empty() && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    };
    for (const auto& node : nodes) {
        if (node.addrs.empty()) {
            add(node.host);
            add(node.store_addr);
            continue;
        }
        for (const auto& a : node.addrs) add(a);
        if (is_address_literal(node.store_addr)) add(node.store_addr);
    }
    return out;
}

ELASTIC_DECL std::variant<round_plan, std::string> plan_round(const std::vector<node_info>& nodes, bool strict) {
    if (nodes.empty()) return std::string("a round needs at least one node");
    auto assigned = assign_group_ranks(nodes, strict);
    if (auto* message = std::get_if<std::string>(&assigned)) return std::move(*message);
    round_plan plan;
    plan.group_rank = std::get<0>(std::move(assigned));
    const auto n = nodes.size();
    std::vector<std::size_t> by_rank(n);
    for (std::size_t i = 0; i < n; ++i) by_rank[static_cast<std::size_t>(plan.group_rank[i])] = i;
    plan.rank_base.reserve(n);
    for (std::size_t g = 0; g < n; ++g) {
        const auto& node = nodes[by_rank[g]];
        plan.rank_base.push_back(plan.world_size);
        plan.world_size += node.nproc;
        plan.hosts.push_back(node.host);
    }
    std::map<std::string, int, std::less<>> role_workers;
    plan.role_rank_base.reserve(n);
    for (std::size_t g = 0; g < n; ++g) {
        int& seen = role_workers[nodes[by_rank[g]].role];
        plan.role_rank_base.push_back(seen);
        seen += nodes[by_rank[g]].nproc;
    }
    plan.role_world_size.reserve(n);
    for (std::size_t g = 0; g < n; ++g) plan.role_world_size.push_back(role_workers[nodes[by_rank[g]].role]);
    plan.master = by_rank[0];
    // Members whose idle server listens at a --rdzv-endpoint list's entry first: a newcomer
    // looks for a moved store there.
    for (const bool listed : {true, false}) {
        for (std::size_t g = 0; g < n; ++g) {
            const auto& node = nodes[by_rank[g]];
            if (node.hosts_store) plan.host_in = true;
            if (node.hosts_store || node.backup_port == 0 || node.backup_listed != listed ||
                plan.successors.size() >= max_successors)
                continue;
            plan.successors.push_back({node.id, node.store_addr, node.backup_port});
        }
    }
    plan.peers = peers_of(nodes);
    return plan;
}

ELASTIC_DECL arrival_step on_arrival(std::int64_t arrival, const round_rules& rules) {
    if (arrival > rules.nnodes) return arrival_step::late;
    if (arrival == rules.nnodes) return arrival_step::complete;
    if (rules.target > 0 && arrival == rules.target) return arrival_step::seal;
    if (rules.elastic && arrival >= rules.needed) return arrival_step::try_seal;
    return arrival_step::wait;
}

ELASTIC_DECL bool has_last_call(std::int64_t arrival, const round_rules& rules) {
    return (rules.elastic || rules.target > 0) && arrival >= rules.needed;
}

ELASTIC_DECL std::optional<int> sealed_arrivals(std::int64_t sealed, int nnodes) {
    if (sealed < seal_increment || sealed >= 2 * seal_increment) return std::nullopt;
    const auto joined = sealed - seal_increment;
    if (joined >= nnodes || joined < 1) return std::nullopt;
    return static_cast<int>(joined);
}

ELASTIC_DECL bool may_seal_when_all_live(std::int64_t count, const round_rules& rules) {
    return count < seal_increment && count < rules.nnodes && count >= rules.needed;
}

ELASTIC_DECL bool quick_round(int r, bool admission, int target) noexcept { return r > 0 && !admission && target == 0; }

ELASTIC_DECL moved_round after_store_moved(int last_size, bool host_in_round) noexcept {
    const int before = std::max(last_size, 1);
    moved_round m;
    m.quorum = before / 2 + 1;
    m.target = std::max(1, before - (host_in_round ? 1 : 0));
    if (m.target < m.quorum) m.target = m.quorum;
    return m;
}

}  // namespace detail::rendezvous
}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
