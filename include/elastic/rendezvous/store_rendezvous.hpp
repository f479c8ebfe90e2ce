// store_rendezvous: the fixed-membership rendezvous over any `store` model (docs/rendezvous.md):
// per-node keys, O(1) store operations per node per round, waiting by store notification.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/rendezvous/concepts.hpp"
#include "elastic/rendezvous/error.hpp"
#include "elastic/store/concepts.hpp"
#include "elastic/store/errors.hpp"

#include <asio/awaitable.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace elastic::inline v0 {

/// How a store_rendezvous behaves.
struct store_rendezvous_options {
    std::string run_id = "none";  ///< --rdzv-id: namespaces every key
    int nnodes = 1;               ///< nodes in every round (fixed membership)
    /// A round must complete within this (--rdzv-conf join_timeout; static: timeout).
    std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
    /// The store's host waits this long for the others to leave before it stops serving.
    std::chrono::milliseconds close_timeout{std::chrono::seconds(30)};
    /// Whether this node hosts the store: leave() then waits for every other node to leave.
    bool hosts_store = false;
    /// Check (and claim) torchrun's key for the run id, so a Python agent and ours never mix.
    bool torchrun_guard = true;
};

namespace detail::rdzv {

/// The group rank of each node (by arrival order) or a message naming the conflict.
/// `--node-rank` first; the rest keep their previous order (stable), newcomers by arrival.
inline std::variant<std::vector<int>, std::string> assign_group_ranks(const std::vector<node_info>& nodes) {
    const int n = static_cast<int>(nodes.size());
    std::vector<int> rank(nodes.size(), -1);
    std::vector<int> owner(nodes.size(), -1);
    for (int i = 0; i < n; ++i) {
        const auto& given = nodes[static_cast<std::size_t>(i)].node_rank;
        if (!given) continue;
        if (*given < 0 || *given >= n) {
            return fmt::format("--node-rank={} of {} (pid {}) is outside 0..{} for --nnodes={}", *given,
                               nodes[static_cast<std::size_t>(i)].host, nodes[static_cast<std::size_t>(i)].pid, n - 1, n);
        }
        auto& o = owner[static_cast<std::size_t>(*given)];
        if (o >= 0) {
            const auto& a = nodes[static_cast<std::size_t>(o)];
            const auto& b = nodes[static_cast<std::size_t>(i)];
            return fmt::format("--node-rank={} given by two nodes, {} (pid {}) and {} (pid {}); each node needs its "
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

inline std::string encode(const node_info& i) {
    nlohmann::json j{{"host", i.host}, {"addr", i.store_addr}, {"port", i.store_port}, {"nproc", i.nproc},
                     {"pid", i.pid}};
    if (i.node_rank) j["node_rank"] = *i.node_rank;
    if (i.previous_rank) j["previous_rank"] = *i.previous_rank;
    return j.dump();
}

inline node_info decode_node(const std::string& text) {
    const auto j = nlohmann::json::parse(text);
    node_info i;
    i.host = j.at("host").get<std::string>();
    i.store_addr = j.at("addr").get<std::string>();
    i.store_port = j.at("port").get<std::uint16_t>();
    i.nproc = j.at("nproc").get<int>();
    i.pid = j.at("pid").get<long>();
    if (j.contains("node_rank")) i.node_rank = j["node_rank"].get<int>();
    if (j.contains("previous_rank")) i.previous_rank = j["previous_rank"].get<int>();
    return i;
}

/// A node's assignment as the completer wrote it; rendezvous_error when the round failed.
inline rendezvous_round decode_assignment(const std::string& text) {
    const auto j = nlohmann::json::parse(text);
    if (j.contains("error")) throw rendezvous_error(j["error"].get<std::string>());
    rendezvous_round r;
    r.restart_count = j.at("restarts").get<int>();
    r.group_rank = j.at("group_rank").get<int>();
    r.rank_base = j.at("rank_base").get<int>();
    r.world_size = j.at("world_size").get<int>();
    r.master_addr = j.at("master_addr").get<std::string>();
    r.master_port = j.at("master_port").get<std::uint16_t>();
    return r;
}

inline std::vector<std::string> decode_hosts(const std::string& text) {
    return nlohmann::json::parse(text).get<std::vector<std::string>>();
}

inline std::string encode(const abort_notice& a) {
    return nlohmann::json{{"group_rank", a.group_rank}, {"host", a.host}, {"reason", a.reason}}.dump();
}

inline abort_notice decode_abort(const std::string& text) {
    const auto j = nlohmann::json::parse(text);
    return {j.at("group_rank").get<int>(), j.at("host").get<std::string>(), j.at("reason").get<std::string>()};
}

inline std::string encode(const job_decision& d) {
    return nlohmann::json{{"restart", d.restart}, {"exit_code", d.exit_code}, {"reason", d.reason}}.dump();
}

inline job_decision decode_decision(const std::string& text) {
    const auto j = nlohmann::json::parse(text);
    return {j.at("restart").get<bool>(), j.at("exit_code").get<int>(), j.at("reason").get<std::string>()};
}

/// What a torchrun agent's C10dRendezvousBackend keeps its pickled state under (inventory §4.2).
inline std::string torchrun_key(const std::string& run_id) { return "torch.rendezvous." + run_id; }

/// What elastic writes at that key: not base64 of a pickle, so a torchrun agent joining the
/// same run stops with "the rendezvous state is corrupt" instead of mixing with us.
inline std::string guard_value(const std::string& run_id) {
    return fmt::format("elasticrun rendezvous of run '{}' (not a torchrun state)", run_id);
}

}  // namespace detail::rdzv

/// The fixed-membership rendezvous over any `store` (docs/rendezvous.md has the algorithm).
/// Per round and node: one `add` (arrival index), one `set` (its info), one `wait` and one
/// `get` (its assignment); the node whose add completes the round also does one `multi_get` of
/// every info and one `multi_set` of every assignment. Nothing polls: waits are store pushes.
///
/// `store` serves requests in turn; `watcher` carries the long wait for the round's abort key
/// (a TCP client serves one request at a time; a memory_store may be passed twice). Both must
/// outlive this object. Use it on the stores' thread.
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

    /// Joins the next round with `me` and returns once all nnodes nodes have joined (the moment
    /// the last one does). rendezvous_error after join_timeout, or on conflicting --node-rank.
    asio::awaitable<rendezvous_round> next_round(node_info me) {
        const auto started = std::chrono::steady_clock::now();
        ++round_;
        const int n = options_.nnodes;
        if (me.previous_rank == std::nullopt && group_rank_ >= 0) me.previous_rank = group_rank_;
        if (round_ == 0 && options_.torchrun_guard) co_await guard();
        const auto arrival = co_await store_->add(key("count"), 1);
        if (arrival > n) {
            throw rendezvous_error(fmt::format("round {} of run '{}' already has its {} nodes (this is arrival {}): "
                                               "another job uses the same --rdzv-id, or --nnodes differs between "
                                               "nodes",
                                               round_, options_.run_id, n, arrival));
        }
        co_await store_->set(key(fmt::format("info/{}", arrival)), detail::rdzv::encode(me));
        if (arrival == n) co_await complete();
        const auto mine = key(fmt::format("assign/{}", arrival));
        const auto left = options_.join_timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      std::chrono::steady_clock::now() - started);
        try {
            std::vector<std::string> keys{mine};
            co_await store_->wait(std::move(keys), std::max(left, std::chrono::milliseconds(1)));
        } catch (const store_timeout&) {
            joined_error_ = true;
        }
        if (joined_error_) {
            joined_error_ = false;
            const auto joined = co_await store_->add(key("count"), 0);
            throw rendezvous_error(fmt::format(
                "rendezvous of run '{}' round {}: {} of {} nodes joined within the join timeout ({} s); start the "
                "others, or raise --rdzv-conf join_timeout",
                options_.run_id, round_, joined, n,
                std::chrono::duration_cast<std::chrono::seconds>(options_.join_timeout).count()));
        }
        auto r = detail::rdzv::decode_assignment(co_await store_->get(mine));
        r.number = round_;
        r.group_world_size = n;
        restarts_ = r.restart_count;
        group_rank_ = r.group_rank;
        co_return r;
    }

    /// Completes when the current round is aborted (by store push; no polling); cancel it when
    /// the round ends otherwise. store_error when the store vanishes.
    asio::awaitable<abort_notice> wait_for_abort() {
        const auto k = key("abort");
        co_await wait_long(*watcher_, k);
        co_return detail::rdzv::decode_abort(co_await watcher_->get(k));
    }

    /// Aborts the current round with `notice`; true when this node was the first.
    asio::awaitable<bool> abort(abort_notice notice) {
        const auto value = detail::rdzv::encode(notice);
        const auto got = co_await store_->compare_set(key("abort"), std::string{}, value);
        co_return got == value;
    }

    /// Publishes what the job does after the aborted round (the winner of abort() calls it).
    asio::awaitable<void> decide(job_decision decision) {
        co_await store_->set(key("decision"), detail::rdzv::encode(decision));
        if (decision.restart) ++restarts_;
    }

    /// The decision for the aborted round (awaited by push).
    asio::awaitable<job_decision> await_decision() {
        const auto k = key("decision");
        co_await wait_long(*store_, k);
        auto decision = detail::rdzv::decode_decision(co_await store_->get(k));
        if (decision.restart) ++restarts_;
        co_return decision;
    }

    /// This node's workers all succeeded: marks it done and waits (push) until every node is,
    /// the round is aborted, or `timeout` passes (then names the nodes still missing).
    asio::awaitable<barrier_result> finish(std::chrono::milliseconds timeout) {
        using namespace asio::experimental::awaitable_operators;
        co_await store_->set(key(fmt::format("done/{}", group_rank_)), "1");
        const auto done = co_await store_->add(key("done_count"), 1);
        if (done >= options_.nnodes) co_await store_->set(key("all_done"), "1");
        auto which = co_await (wait_all_done(timeout) || wait_for_abort());
        barrier_result result;
        if (which.index() == 1) {
            result.how = barrier_result::kind::aborted;
            result.abort = std::get<1>(std::move(which));
            co_return result;
        }
        if (std::get<0>(which)) co_return result;
        // Timed out: only now, name who is missing (O(N) checks, on this error path only).
        result.how = barrier_result::kind::timed_out;
        std::vector<std::string> hosts;
        try {
            hosts = detail::rdzv::decode_hosts(co_await store_->get(key("hosts")));
        } catch (const std::exception&) {
        }
        for (int g = 0; g < options_.nnodes; ++g) {
            std::vector<std::string> keys{key(fmt::format("done/{}", g))};
            if (co_await store_->check(std::move(keys))) continue;
            result.missing.push_back(g);
            result.missing_hosts.push_back(static_cast<std::size_t>(g) < hosts.size() ? hosts[static_cast<std::size_t>(g)]
                                                                                     : std::string("?"));
        }
        co_return result;
    }

    /// This node leaves the job for good. The store's host waits (up to close_timeout) for every
    /// other node to leave too, so nobody loses the store while reading the job's last keys.
    asio::awaitable<void> leave() {
        if (round_ < 0) co_return;
        const auto left = co_await store_->add(key("left"), 1);
        if (left >= options_.nnodes) co_await store_->set(key("all_left"), "1");
        if (!options_.hosts_store) co_return;
        try {
            std::vector<std::string> keys{key("all_left")};
            co_await store_->wait(std::move(keys), options_.close_timeout);
        } catch (const store_timeout&) {
            // Someone vanished without leaving: nothing more to wait for.
        }
    }

    /// The store key of `name` in the current round.
    [[nodiscard]] std::string key(std::string_view name) const {
        return fmt::format("elastic.rendezvous.{}/{}/{}", options_.run_id, round_, name);
    }

private:
    asio::awaitable<void> guard() {
        const auto k = detail::rdzv::torchrun_key(options_.run_id);
        const auto mine = detail::rdzv::guard_value(options_.run_id);
        const auto got = co_await store_->compare_set(k, std::string{}, mine);
        if (got != mine) {
            throw rendezvous_error(fmt::format(
                "the store already holds torchrun's rendezvous state for run '{}' (key '{}'): a torchrun (Python) "
                "agent uses this --rdzv-id, and its state is a Python pickle elasticrun cannot share; run every node "
                "with elasticrun, or give this job another --rdzv-id",
                options_.run_id, k));
        }
    }

    // The last node to join: reads every info (one multi_get), assigns, writes every
    // assignment (one multi_set).
    asio::awaitable<void> complete() {
        const int n = options_.nnodes;
        std::vector<std::string> keys;
        keys.reserve(static_cast<std::size_t>(n));
        for (int i = 1; i <= n; ++i) keys.push_back(key(fmt::format("info/{}", i)));
        std::vector<std::string> values;
        if constexpr (multi_key_store<Store>) {
            values = co_await store_->multi_get(keys);
        } else {
            for (auto& k : keys) values.push_back(co_await store_->get(k));
        }
        std::vector<node_info> nodes;
        nodes.reserve(values.size());
        for (const auto& v : values) nodes.push_back(detail::rdzv::decode_node(v));

        std::vector<std::string> out_keys;
        std::vector<std::string> out_values;
        auto assigned = detail::rdzv::assign_group_ranks(nodes);
        if (const auto* message = std::get_if<std::string>(&assigned)) {
            const auto error = nlohmann::json{{"error", *message}}.dump();
            for (int i = 1; i <= n; ++i) {
                out_keys.push_back(key(fmt::format("assign/{}", i)));
                out_values.push_back(error);
            }
        } else {
            const auto& rank = std::get<0>(assigned);
            std::vector<int> by_rank(static_cast<std::size_t>(n));
            for (int i = 0; i < n; ++i) by_rank[static_cast<std::size_t>(rank[static_cast<std::size_t>(i)])] = i;
            std::vector<int> base(static_cast<std::size_t>(n) + 1, 0);
            std::vector<std::string> hosts;
            for (int g = 0; g < n; ++g) {
                const auto& node = nodes[static_cast<std::size_t>(by_rank[static_cast<std::size_t>(g)])];
                base[static_cast<std::size_t>(g) + 1] = base[static_cast<std::size_t>(g)] + node.nproc;
                hosts.push_back(node.host);
            }
            const auto& master = nodes[static_cast<std::size_t>(by_rank[0])];
            for (int i = 0; i < n; ++i) {
                const int g = rank[static_cast<std::size_t>(i)];
                out_keys.push_back(key(fmt::format("assign/{}", i + 1)));
                out_values.push_back(nlohmann::json{{"group_rank", g},
                                                    {"rank_base", base[static_cast<std::size_t>(g)]},
                                                    {"world_size", base[static_cast<std::size_t>(n)]},
                                                    {"master_addr", master.store_addr},
                                                    {"master_port", master.store_port},
                                                    {"restarts", restarts_}}
                                         .dump());
            }
            out_keys.push_back(key("hosts"));
            out_values.push_back(nlohmann::json(hosts).dump());
        }
        if constexpr (multi_key_store<Store>) {
            co_await store_->multi_set(std::move(out_keys), std::move(out_values));
        } else {
            for (std::size_t i = 0; i < out_keys.size(); ++i) co_await store_->set(out_keys[i], out_values[i]);
        }
    }

    asio::awaitable<bool> wait_all_done(std::chrono::milliseconds timeout) {
        bool timed_out = false;
        try {
            std::vector<std::string> keys{key("all_done")};
            co_await store_->wait(std::move(keys), timeout);
        } catch (const store_timeout&) {
            timed_out = true;
        }
        co_return !timed_out;
    }

    // A wait with no deadline of its own: renewed hourly (the only traffic of an idle job).
    static asio::awaitable<void> wait_long(Store& s, const std::string& k) {
        for (;;) {
            bool renewed = false;
            try {
                std::vector<std::string> keys{k};
                co_await s.wait(std::move(keys), std::chrono::hours(1));
            } catch (const store_timeout&) {
                renewed = true;
            }
            if (!renewed) co_return;
        }
    }

    Store* store_;
    Store* watcher_;
    store_rendezvous_options options_;
    int round_ = -1;
    int restarts_ = 0;
    int group_rank_ = -1;
    bool joined_error_ = false;
};

}  // namespace elastic::inline v0
