// store_rendezvous: the fixed-membership rendezvous over any `store` model (docs/rendezvous.md):
// per-node keys, O(1) store operations per node per round, waiting by store notification.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/rendezvous/concepts.hpp"
#include "elastic/rendezvous/error.hpp"
#include "elastic/store/concepts.hpp"
#include "elastic/store/errors.hpp"
#include "elastic/store/lease.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

namespace elastic::inline v0 {

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

    [[nodiscard]] int min() const noexcept { return min_nodes > 0 ? min_nodes : nnodes; }
    [[nodiscard]] bool elastic() const noexcept { return min() < nnodes; }
};

namespace detail::rdzv {

/// The group rank of each node (by arrival order) or a message naming the conflict.
/// `--node-rank` first; the rest keep their previous order (stable), newcomers by arrival.
/// `strict` (fixed membership): a --node-rank outside the round or given twice is an error;
/// otherwise (elastic membership, where the round's size varies) it is a preference, honoured
/// when it fits the round and nobody before took it.
inline std::variant<std::vector<int>, std::string> assign_group_ranks(const std::vector<node_info>& nodes,
                                                                     bool strict = true) {
    const int n = static_cast<int>(nodes.size());
    std::vector<int> rank(nodes.size(), -1);
    std::vector<int> owner(nodes.size(), -1);
    for (int i = 0; i < n; ++i) {
        const auto& given = nodes[static_cast<std::size_t>(i)].node_rank;
        if (!given) continue;
        if (!strict && (*given < 0 || *given >= n || owner[static_cast<std::size_t>(*given)] >= 0)) continue;
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
    if (!i.id.empty()) j["id"] = i.id;
    if (i.backup_port != 0) j["backup"] = i.backup_port;
    if (i.hosts_store) j["hosts_store"] = true;
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
    if (j.contains("id")) i.id = j["id"].get<std::string>();
    i.backup_port = j.value("backup", std::uint16_t{0});
    i.hosts_store = j.value("hosts_store", false);
    return i;
}

/// The successors a completer named: [{"id", "addr", "port"}, ...].
inline std::vector<store_successor> decode_successors(const nlohmann::json& list) {
    std::vector<store_successor> out;
    for (const auto& x : list) {
        out.push_back({x.at("id").get<std::string>(), x.at("addr").get<std::string>(),
                       x.at("port").get<std::uint16_t>()});
    }
    return out;
}

/// A node's assignment as the completer wrote it; rendezvous_error when the round failed;
/// nothing when the round lost a node while forming and everyone rejoins the next one.
inline std::optional<rendezvous_round> decode_assignment(const std::string& text) {
    const auto j = nlohmann::json::parse(text);
    if (j.contains("error")) throw rendezvous_error(j["error"].get<std::string>());
    if (j.contains("retry")) return std::nullopt;
    rendezvous_round r;
    r.group_world_size = j.at("size").get<int>();
    r.epoch = j.at("epoch").get<std::int64_t>();
    r.host_in_round = j.value("host_in", false);
    if (j.contains("successors")) r.successors = decode_successors(j["successors"]);
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
    const char* what = a.what == abort_notice::kind::membership ? "membership"
                       : a.what == abort_notice::kind::closed   ? "closed"
                                                                : "failure";
    nlohmann::json j{{"group_rank", a.group_rank}, {"host", a.host}, {"reason", a.reason}, {"kind", what}};
    if (a.admission) j["admission"] = true;
    return j.dump();
}

inline abort_notice decode_abort(const std::string& text) {
    const auto j = nlohmann::json::parse(text);
    abort_notice a{j.at("group_rank").get<int>(), j.at("host").get<std::string>(), j.at("reason").get<std::string>()};
    const auto what = j.value("kind", std::string("failure"));
    a.what = what == "membership" ? abort_notice::kind::membership
             : what == "closed"   ? abort_notice::kind::closed
                                  : abort_notice::kind::failure;
    a.admission = j.value("admission", false);
    return a;
}

/// A lease name as a person reads it: "host (pid N)" from "host:pid:tag".
inline std::string describe_node_id(std::string_view id) {
    const auto last = id.rfind(':');
    if (last == std::string_view::npos || last == 0) return std::string(id);
    const auto mid = id.rfind(':', last - 1);
    if (mid == std::string_view::npos) return std::string(id);
    return fmt::format("{} (pid {})", id.substr(0, mid), id.substr(mid + 1, last - mid - 1));
}

/// Added to a round's arrival counter to seal it: an arrival that reads at least this is late.
inline constexpr std::int64_t seal_increment = std::int64_t{1} << 32;

/// What the node's lease connection learnt of the job's membership (docs/rendezvous.md,
/// "Elastic membership"), shared by the monitor and whoever waits for a change.
struct membership_log {
    explicit membership_log(const asio::any_io_executor& executor)
        : wake(executor, std::chrono::steady_clock::time_point::max()) {}
    std::vector<std::pair<std::int64_t, std::string>> lost;  ///< (epoch, lease name), in order
    std::int64_t epoch = 0;                  ///< the last loss seen (the group's __epoch)
    std::optional<std::string> store_lost;   ///< why the lease connection ended
    asio::steady_timer wake;                 ///< cancelled at each change: wakes every waiter

    void changed() { wake.cancel(); }
    /// Completes at the next change; throws operation_aborted once cancelled (so no loop
    /// over it can spin on a cancelled wait).
    asio::awaitable<void> next() {
        (void)co_await wake.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        const auto state = co_await asio::this_coro::cancellation_state;
        if (state.cancelled() != asio::cancellation_type::none) {
            throw std::system_error(asio::error::operation_aborted, "membership wait cancelled");
        }
    }
    /// Completes when the store is lost, with why.
    asio::awaitable<std::string> until_store_lost() {
        while (!store_lost) co_await next();
        co_return *store_lost;
    }
};

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
    asio::awaitable<void> start_liveness(Store& lease, node_info me)
        requires requires(Store& s, std::string k, std::string v) {
            { s.hold_lease(k, v) } -> std::same_as<asio::awaitable<void>>;
        }
    {
        auto log = std::make_shared<detail::rdzv::membership_log>(co_await asio::this_coro::executor);
        co_await lease.hold_lease(lease_key(lease_group(), me.id), detail::rdzv::encode(me));
        (void)co_await lease.add(job_key("registered"), 1);
        log->epoch = std::stoll(co_await lease.get(lease_epoch_key(lease_group())));
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
        const int before = std::max(size_, 1);
        quorum_ = before / 2 + 1;
        target_ = std::max(1, before - (host_in_round_ ? 1 : 0));
        if (target_ < quorum_) target_ = quorum_;
        phase_ = phase::idle;
    }

    /// This node reconnected to the same store (which had dropped it): new connections; then
    /// call start_liveness() with a new lease connection. It rejoins at the next round.
    void reconnected(Store& store, Store& watcher) {
        store_ = &store;
        watcher_ = &watcher;
        phase_ = phase::idle;
        rediscover_ = true;  // the others went on without this node: find the job's round again
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
                    co_await wait_long(*lease, k);
                    auto name = co_await lease->get(k);
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
        auto which = co_await (log->until_store_lost() ||
                               timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
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
    /// this node waited as a standby; store_error when the store is lost.
    asio::awaitable<rendezvous_round> next_round(node_info me) {
        const auto started = std::chrono::steady_clock::now();
        if (me.previous_rank == std::nullopt && group_rank_ >= 0) me.previous_rank = group_rank_;
        if (round_ < 0 || rediscover_) {
            if (round_ < 0 && options_.torchrun_guard) co_await guard();
            // A node joining a running job starts at its last completed round (0 for a new job),
            // arrives late there and is admitted from it.
            round_ = static_cast<int>(co_await store_->add(job_key("round"), 0)) - 1;
            rediscover_ = false;
        }
        for (;;) {
            ++round_;
            const int r = round_;
            phase_ = phase::forming;
            const auto arrival = co_await store_->add(key(r, "count"), 1);
            if (arrival > options_.nnodes) {
                co_await late(r, me);
                continue;
            }
            me.hosts_store = options_.hosts_store;
            co_await store_->set(key(r, fmt::format("info/{}", arrival)), detail::rdzv::encode(me));
            if (arrival == options_.nnodes) {
                co_await complete(*store_, r, static_cast<int>(arrival));
            } else if (target_ > 0 && arrival == target_) {
                co_await seal(*store_, r);
            } else if (options_.elastic() && arrival >= needed()) {
                co_await complete_if_all_live(*store_, r);
            }
            auto assigned = co_await await_assignment(r, arrival, started);
            if (!assigned) continue;  // the round lost a node while forming: the next one
            auto round = *assigned;
            round.number = r;
            restarts_ = round.restart_count;
            group_rank_ = round.group_rank;
            size_ = round.group_world_size;
            running_epoch_ = round.epoch;
            host_in_round_ = round.host_in_round;
            successors_ = round.successors;
            quorum_ = 0;
            target_ = 0;
            phase_ = phase::running;
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
    /// the round ends otherwise. store_error when the store is lost.
    asio::awaitable<abort_notice> wait_for_abort() {
        const auto k = key(round_, "abort");
        co_await wait_interruptible(*watcher_, k, std::nullopt);
        auto notice = detail::rdzv::decode_abort(co_await watcher_->get(k));
        admission_ = notice.admission;
        co_return notice;
    }

    /// Aborts the current round with `notice`; true when this node was the first.
    asio::awaitable<bool> abort(abort_notice notice) {
        const auto value = detail::rdzv::encode(notice);
        const auto got = co_await store_->compare_set(key(round_, "abort"), std::string{}, value);
        admission_ = detail::rdzv::decode_abort(got).admission;
        co_return got == value;
    }

    /// Publishes what the job does after the aborted round (the winner of abort() calls it).
    asio::awaitable<void> decide(job_decision decision) {
        if (decision.restart) (void)co_await store_->add(job_key("restarts"), 1);
        co_await store_->set(key(round_, "decision"), detail::rdzv::encode(decision));
        if (decision.restart) ++restarts_;
    }

    /// The decision for the aborted round (awaited by push).
    asio::awaitable<job_decision> await_decision() {
        const auto k = key(round_, "decision");
        co_await wait_interruptible(*store_, k, std::nullopt);
        auto decision = detail::rdzv::decode_decision(co_await store_->get(k));
        if (decision.restart) ++restarts_;
        co_return decision;
    }

    /// This node's workers all succeeded: marks it done and waits (push) until every node of
    /// the round is, the round is aborted, or `timeout` passes (then names the nodes missing).
    /// The last node to finish closes the job (standbys then exit).
    asio::awaitable<barrier_result> finish(std::chrono::milliseconds timeout) {
        using namespace asio::experimental::awaitable_operators;
        const int r = round_;
        co_await store_->set(key(r, fmt::format("done/{}", group_rank_)), "1");
        const auto done = co_await store_->add(key(r, "done_count"), 1);
        if (done >= size_) {
            abort_notice closed;
            closed.group_rank = group_rank_;
            closed.reason = "every node's workers succeeded";
            closed.what = abort_notice::kind::closed;
            if (co_await abort(closed)) co_await store_->set(key(r, "all_done"), "1");
        }
        auto which = co_await (wait_all_done(timeout) || wait_for_abort());
        barrier_result result;
        if (which.index() == 1) {
            auto notice = std::get<1>(std::move(which));
            if (notice.what == abort_notice::kind::closed) co_return result;
            result.how = barrier_result::kind::aborted;
            result.abort = std::move(notice);
            co_return result;
        }
        if (std::get<0>(which)) co_return result;
        // Timed out: only now, name who is missing (O(N) checks, on this error path only).
        result.how = barrier_result::kind::timed_out;
        std::vector<std::string> hosts;
        try {
            hosts = detail::rdzv::decode_hosts(co_await store_->get(key(r, "hosts")));
        } catch (const std::exception&) {
        }
        for (int g = 0; g < size_; ++g) {
            std::vector<std::string> keys{key(r, fmt::format("done/{}", g))};
            if (co_await store_->check(std::move(keys))) continue;
            result.missing.push_back(g);
            result.missing_hosts.push_back(static_cast<std::size_t>(g) < hosts.size() ? hosts[static_cast<std::size_t>(g)]
                                                                                     : std::string("?"));
        }
        co_return result;
    }

    /// This node leaves the job for good. The store's host waits (up to close_timeout) until
    /// every other node's lease is gone, so nobody loses the store while reading the job's last
    /// keys (without liveness it cannot tell, and returns at once).
    asio::awaitable<void> leave() {
        using namespace asio::experimental::awaitable_operators;
        phase_ = phase::leaving;
        if (round_ < 0 || !options_.hosts_store || !members_ || members_->store_lost) co_return;
        const auto deadline = std::chrono::steady_clock::now() + options_.close_timeout;
        asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
        for (;;) {
            if (co_await live_nodes(*store_) <= 1) co_return;
            auto which = co_await (members_->next() ||
                                   timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
            if (which.index() == 1) co_return;  // someone vanished without a trace: stop anyway
        }
    }

    /// The store key of `name` in the current round.
    [[nodiscard]] std::string key(std::string_view name) const { return key(round_, name); }
    /// The store key of `name` in round `r`.
    [[nodiscard]] std::string key(int r, std::string_view name) const {
        return fmt::format("elastic.rendezvous.{}/{}/{}", options_.run_id, r, name);
    }
    /// The store key of `name` for the whole job.
    [[nodiscard]] std::string job_key(std::string_view name) const { return job_key(options_.run_id, name); }
    /// The store key of `name` for the job `run_id`.
    [[nodiscard]] static std::string job_key(std::string_view run_id, std::string_view name) {
        return fmt::format("elastic.rendezvous.{}/{}", run_id, name);
    }

private:
    enum class phase { idle, forming, running, leaving };

    // Whether round r completes as soon as every live node joined: not the job's first round
    // (nodes are still starting), nor one that admits new nodes (others may be starting with
    // them: torchrun's last call lets a batch of new nodes in with one restart).
    [[nodiscard]] bool quick_round(int r) const noexcept { return r > 0 && !admission_ && target_ == 0; }

    // The nodes a round needs: MIN, or after the store moved a majority of the last round.
    [[nodiscard]] int needed() const noexcept { return std::max(options_.min(), quorum_); }

    void say(std::string_view line) const {
        if (options_.log) options_.log(line);
    }

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

    // Waits for `k` on `s`; with liveness, a lost store ends the wait with store_error (and a
    // cancelled wait leaves `s` closed: its next request reconnects). False on timeout.
    asio::awaitable<bool> wait_interruptible(Store& s, std::string k,
                                             std::optional<std::chrono::milliseconds> timeout) {
        using namespace asio::experimental::awaitable_operators;
        if (!members_) {
            if (!timeout) {
                co_await wait_long(s, k);
                co_return true;
            }
            co_return co_await wait_for(s, k, *timeout);
        }
        if (members_->store_lost) throw store_error(lost_message(*members_->store_lost));
        auto log = members_;
        std::variant<bool, std::string> which;
        if (timeout) {
            which = co_await (wait_for(s, k, *timeout) || log->until_store_lost());
        } else {
            auto w = co_await (wait_long(s, k) || log->until_store_lost());
            if (w.index() == 0) which = true;
            else which = std::get<1>(std::move(w));
        }
        if (which.index() == 1) {
            if constexpr (requires { s.close(); }) s.close();
            throw store_error(lost_message(std::get<1>(which)));
        }
        co_return std::get<0>(which);
    }

    static std::string lost_message(const std::string& why) {
        return fmt::format("lost the rendezvous store: {}", why);
    }

    // A node arrived after round r was complete (or sealed): it aborts a round running with
    // fewer than MAX nodes so that it may join the next, or waits as a standby for a full
    // one; either way it goes on with the round after r, or ends with the job.
    asio::awaitable<void> late(int r, node_info me) {
        if (!co_await wait_interruptible(*store_, key(r, "size"), options_.join_timeout)) {
            throw rendezvous_error(fmt::format(
                "round {} of run '{}' already has its {} nodes, and stays incomplete for the join timeout ({} s): "
                "another job uses the same --rdzv-id, or --nnodes differs between nodes",
                r, options_.run_id, options_.nnodes,
                std::chrono::duration_cast<std::chrono::seconds>(options_.join_timeout).count()));
        }
        const int size = static_cast<int>(std::stoll(co_await store_->get(key(r, "size"))));
        if (size > 0) {
            // A standby that outlives the store's host moves with the members: it needs the
            // round's successors and the majority rule (move_to) as they do.
            const nlohmann::json moves = nlohmann::json::parse(co_await store_->get(key(r, "successors")));
            size_ = size;
            host_in_round_ = moves.at("host_in").get<bool>();
            successors_ = detail::rdzv::decode_successors(moves.at("successors"));
        }
        std::vector<std::string> abort_key{key(r, "abort")};
        if (!co_await store_->check(std::move(abort_key))) {
            if (size < options_.nnodes) {
                abort_notice waiting;
                waiting.host = me.host;
                waiting.what = abort_notice::kind::membership;
                waiting.admission = true;
                waiting.reason = fmt::format("node {} (pid {}) is waiting to join (scale-up from {} nodes; at most {})",
                                             me.host, me.pid, size, options_.nnodes);
                (void)co_await store_->compare_set(key(r, "abort"), std::string{}, detail::rdzv::encode(waiting));
            } else if (!options_.elastic()) {
                throw rendezvous_error(fmt::format(
                    "round {} of run '{}' already has its {} nodes (this node arrived after it formed): another job "
                    "uses the same --rdzv-id, or --nnodes differs between nodes",
                    r, options_.run_id, options_.nnodes));
            } else {
                say(fmt::format("round {} of run '{}' is full ({} nodes, --nnodes={}:{}): this node waits as a "
                                "standby until a member leaves or the job ends",
                                r, options_.run_id, size, options_.min(), options_.nnodes));
            }
        }
        phase_ = phase::idle;
        const auto notice = co_await wait_for_abort();  // round r is the current round
        if (notice.what == abort_notice::kind::closed) {
            throw rendezvous_closed(fmt::format("the job ended while this node waited as a standby ({})", notice.reason));
        }
        if (notice.what == abort_notice::kind::failure) {
            const auto decision = co_await await_decision();
            if (!decision.restart) {
                throw rendezvous_closed(fmt::format(
                    "the job ended while this node waited as a standby (it stopped after a failure: {})",
                    notice.reason));
            }
        }
    }

    // Waits for this node's assignment in round r: the last-call timer (arrivals from MIN on,
    // elastic membership) seals the round when it fires; the join timeout ends the wait.
    asio::awaitable<std::optional<rendezvous_round>> await_assignment(int r, std::int64_t arrival,
                                                                      std::chrono::steady_clock::time_point started) {
        using clock = std::chrono::steady_clock;
        const auto mine = key(r, fmt::format("assign/{}", arrival));
        const auto join_deadline = started + options_.join_timeout;
        std::optional<clock::time_point> last_call;
        if ((options_.elastic() || target_ > 0) && arrival >= needed()) {
            last_call = clock::now() + options_.last_call_timeout;
        }
        for (;;) {
            const auto now = clock::now();
            auto until = join_deadline;
            if (last_call && *last_call < until) until = *last_call;
            const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(until - now),
                                       std::chrono::milliseconds(1));
            if (co_await wait_interruptible(*watcher_, mine, left)) break;
            if (last_call && clock::now() >= *last_call) {
                last_call.reset();
                if (!members_) {
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
            if (joined >= detail::rdzv::seal_increment) joined -= detail::rdzv::seal_increment;
            const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(options_.join_timeout).count();
            if (quorum_ > 0) {
                throw rendezvous_error(fmt::format(
                    "rendezvous of run '{}' round {} (after the rendezvous store was lost and moved): {} of the {} "
                    "nodes needed (a majority of the {} nodes of the last round, so that a part cut off from the "
                    "others never goes on alone; --nnodes={}:{}) joined within the join timeout ({} s)",
                    options_.run_id, r, joined, needed(), std::max(size_, 1), options_.min(), options_.nnodes,
                    seconds));
            }
            if (options_.elastic()) {
                throw rendezvous_error(fmt::format(
                    "rendezvous of run '{}' round {}: {} of the {} nodes needed (--nnodes={}:{}) joined within the "
                    "join timeout ({} s); start more nodes, or raise --rdzv-conf join_timeout",
                    options_.run_id, r, joined, options_.min(), options_.min(), options_.nnodes, seconds));
            }
            throw rendezvous_error(fmt::format(
                "rendezvous of run '{}' round {}: {} of {} nodes joined within the join timeout ({} s); start the "
                "others, or raise --rdzv-conf join_timeout",
                options_.run_id, r, joined, options_.nnodes, seconds));
        }
        co_return detail::rdzv::decode_assignment(co_await store_->get(mine));
    }

    // Elastic rounds: complete once every live node joined (at least the nodes needed) — at
    // once in a quick round, after the last call in the others (the job's first round, one
    // admitting nodes), so nodes still starting get in, and nodes still stopping their workers
    // are waited for (else they would arrive late and restart the others again).
    asio::awaitable<void> complete_if_all_live(Store& s, int r) {
        if (!members_) co_return;
        const auto count = co_await s.add(key(r, "count"), 0);
        if (count >= detail::rdzv::seal_increment || count >= options_.nnodes || count < needed()) co_return;
        if (count < co_await live_nodes(s)) co_return;
        if (!quick_round(r)) {
            std::vector<std::string> over{key(r, "last_call_over")};
            if (!co_await s.check(std::move(over))) co_return;
        }
        co_await seal(s, r);
    }

    // The nodes in the job now: every registration, less every lost lease (a leaving node's
    // lease ends as a loss too).
    asio::awaitable<std::int64_t> live_nodes(Store& s) {
        const auto registered = co_await s.add(job_key("registered"), 0);
        const auto lost = std::stoll(co_await s.get(lease_epoch_key(lease_group())));
        co_return registered - lost;
    }

    // Seals round r (no arrival after this joins it); the one node whose seal came first
    // completes it with the nodes that had arrived.
    asio::awaitable<void> seal(Store& s, int r) {
        const auto sealed = co_await s.add(key(r, "count"), detail::rdzv::seal_increment);
        if (sealed < detail::rdzv::seal_increment || sealed >= 2 * detail::rdzv::seal_increment) co_return;
        const auto joined = sealed - detail::rdzv::seal_increment;
        if (joined >= options_.nnodes || joined < 1) co_return;  // the MAX-th arrival completes it
        co_await complete(s, r, static_cast<int>(joined));
    }

    // Reads the k nodes' infos (one multi_get), leaves out nodes whose lease is gone (one check),
    // assigns ranks, writes every assignment (one multi_set).
    asio::awaitable<void> complete(Store& s, int r, int k) {
        std::vector<std::string> keys;
        keys.reserve(static_cast<std::size_t>(k));
        for (int i = 1; i <= k; ++i) keys.push_back(key(r, fmt::format("info/{}", i)));
        std::vector<std::string> values;
        if constexpr (multi_key_store<Store>) {
            values = co_await s.multi_get(keys);
        } else {
            for (auto& key_i : keys) values.push_back(co_await s.get(key_i));
        }
        std::vector<node_info> arrived;
        arrived.reserve(values.size());
        for (const auto& v : values) arrived.push_back(detail::rdzv::decode_node(v));
        const auto restarts = static_cast<int>(co_await s.add(job_key("restarts"), 0));

        // Liveness: a node whose lease is gone (lost, or left) is left out of the round. The
        // lease keys are the store's own record. This node's log of losses is not enough: it
        // starts at this node's registration, so a node that was dropped and rejoined has not
        // seen the loss of its former self, whose info may still be among the arrivals. The
        // epoch is read first: a loss after it reaches every member as a later epoch (and
        // aborts the round when the lost node is in it).
        std::int64_t epoch = 0;
        std::vector<int> in;  // arrival indexes (0-based) of the round's members
        for (int i = 0; i < k; ++i) in.push_back(i);
        if (members_) {
            epoch = std::stoll(co_await s.get(lease_epoch_key(lease_group())));
            std::vector<std::string> leases;
            for (const auto& node : arrived) {
                if (!node.id.empty()) leases.push_back(lease_key(lease_group(), node.id));
            }
            if (!leases.empty() && !co_await s.check(std::move(leases))) {
                // One at a time only when some lease is gone (a rare round).
                in.clear();
                for (int i = 0; i < k; ++i) {
                    const auto& id = arrived[static_cast<std::size_t>(i)].id;
                    std::vector<std::string> lease{lease_key(lease_group(), id)};
                    if (id.empty() || co_await s.check(std::move(lease))) in.push_back(i);
                }
            }
        }
        std::vector<std::string> out_keys;
        std::vector<std::string> out_values;
        const auto tell_all = [&](const std::string& value) {
            for (int i = 1; i <= k; ++i) {
                out_keys.push_back(key(r, fmt::format("assign/{}", i)));
                out_values.push_back(value);
            }
        };
        if (static_cast<int>(in.size()) < needed()) {
            // A node was lost while the round formed and too few are left: everyone goes on to
            // the next round (where the join timeout may end the wait); a late node finds
            // size 0 and moves on too.
            tell_all(nlohmann::json{{"retry", true}}.dump());
            out_keys.push_back(key(r, "size"));
            out_values.push_back("0");
        } else {
            std::vector<node_info> nodes;
            for (const int i : in) nodes.push_back(arrived[static_cast<std::size_t>(i)]);
            const int n = static_cast<int>(nodes.size());
            auto assigned = detail::rdzv::assign_group_ranks(nodes, !options_.elastic());
            if (const auto* message = std::get_if<std::string>(&assigned)) {
                tell_all(nlohmann::json{{"error", *message}}.dump());
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
                // Where the store moves if its host is lost: the first members by group rank
                // that have an idle server and do not host it now (docs/rendezvous.md).
                nlohmann::json successors = nlohmann::json::array();
                bool host_in = false;
                for (int g = 0; g < n; ++g) {
                    const auto& node = nodes[static_cast<std::size_t>(by_rank[static_cast<std::size_t>(g)])];
                    if (node.hosts_store) host_in = true;
                    if (node.hosts_store || node.backup_port == 0 || successors.size() >= 3) continue;
                    successors.push_back({{"id", node.id}, {"addr", node.store_addr}, {"port", node.backup_port}});
                }
                tell_all(nlohmann::json{{"error", "this node was lost while the round formed (its agent's connection "
                                                  "to the rendezvous store ended)"}}
                             .dump());
                for (int j = 0; j < n; ++j) {
                    const int g = rank[static_cast<std::size_t>(j)];
                    const int arrival = in[static_cast<std::size_t>(j)] + 1;
                    out_values[static_cast<std::size_t>(arrival - 1)] =
                        nlohmann::json{{"group_rank", g},
                                       {"rank_base", base[static_cast<std::size_t>(g)]},
                                       {"world_size", base[static_cast<std::size_t>(n)]},
                                       {"size", n},
                                       {"epoch", epoch},
                                       {"master_addr", master.store_addr},
                                       {"master_port", master.store_port},
                                       {"restarts", restarts},
                                       {"host_in", host_in},
                                       {"successors", successors}}
                            .dump();
                    if (!nodes[static_cast<std::size_t>(j)].id.empty()) {
                        out_keys.push_back(key(r, "member/" + nodes[static_cast<std::size_t>(j)].id));
                        out_values.push_back(std::to_string(g));
                    }
                }
                // For the standbys (they get no assignment): where the store may move.
                out_keys.push_back(key(r, "successors"));
                out_values.push_back(nlohmann::json{{"host_in", host_in}, {"successors", successors}}.dump());
                out_keys.push_back(key(r, "hosts"));
                out_values.push_back(nlohmann::json(hosts).dump());
                out_keys.push_back(key(r, "size"));
                out_values.push_back(std::to_string(n));
                out_keys.push_back(job_key("round"));
                out_values.push_back(std::to_string(r));
            }
        }
        if constexpr (multi_key_store<Store>) {
            co_await s.multi_set(std::move(out_keys), std::move(out_values));
        } else {
            for (std::size_t i = 0; i < out_keys.size(); ++i) co_await s.set(out_keys[i], out_values[i]);
        }
    }

    // The monitor saw lease `name` lost (the epoch-th loss of the job).
    asio::awaitable<void> on_loss(Store& s, std::int64_t epoch, std::string name) {
        if (name == id_) co_return;
        if (phase_ == phase::running && epoch > running_epoch_) {
            co_await on_member_loss(s, round_, name);
        } else if (phase_ == phase::forming && options_.elastic()) {
            co_await complete_if_all_live(s, round_);
        }
    }

    // Aborts round r when lease `name` was one of its members.
    asio::awaitable<void> on_member_loss(Store& s, int r, std::string name) {
        std::vector<std::string> member{key(r, "member/" + name)};
        if (!co_await s.check(std::move(member))) co_return;
        abort_notice lost;
        lost.what = abort_notice::kind::membership;
        lost.reason = fmt::format("node {} was lost (its agent's connection to the rendezvous store ended or went "
                                  "silent)",
                                  detail::rdzv::describe_node_id(name));
        (void)co_await s.compare_set(key(r, "abort"), std::string{}, detail::rdzv::encode(lost));
    }

    static asio::awaitable<bool> wait_for(Store& s, std::string k, std::chrono::milliseconds timeout) {
        bool timed_out = false;
        try {
            std::vector<std::string> keys{k};
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
    std::shared_ptr<detail::rdzv::membership_log> members_;
    std::string id_;
    phase phase_ = phase::idle;
    int round_ = -1;
    int restarts_ = 0;
    int group_rank_ = -1;
    int size_ = 0;
    std::int64_t running_epoch_ = 0;
    bool admission_ = false;  ///< the last round ended to admit a node
    bool rediscover_ = false; ///< this node was dropped and rejoined: read the job's round again
    bool host_in_round_ = false;                 ///< the store's host was a member of the last round
    std::vector<store_successor> successors_;    ///< the last round's successors
    int quorum_ = 0;  ///< after the store moved: the majority the next round needs (0: none)
    int target_ = 0;  ///< after the store moved: the round completes at once at this many (0: MAX)
};

}  // namespace elastic::inline v0
