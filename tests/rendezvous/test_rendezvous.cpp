// The rendezvous core: rounds over the in-memory store and over the real TCP
// store, store operations per node (counted), aborts and job-wide restarts, the exit barrier,
// the torchrun guard.
#include <elastic/rendezvous/codec.hpp>
#include <elastic/rendezvous/concepts.hpp>
#include <elastic/rendezvous/store_rendezvous.hpp>
#include <elastic/rendezvous/tcp_rendezvous.hpp>
#include <elastic/store/client.hpp>
#include <elastic/store/memory_store.hpp>
#include <elastic/store/server.hpp>

#include <doctest/doctest.h>

#include "rendezvous_support.hpp"
#include "spawn_support.hpp"

#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <string>
#include <vector>

namespace test_rendezvous {

using namespace std::chrono_literals;
using elastic::node_info;
using elastic::rendezvous_round;

static_assert(elastic::rendezvous<elastic::store_rendezvous<elastic::memory_store>>);
static_assert(elastic::rendezvous<elastic::store_rendezvous<elastic::tcp_store_client>>);

/// A store that counts every operation it forwards (the O(1)-per-node check).
template <class S>
class counting_store {
public:
    explicit counting_store(S& inner) : inner_(&inner) {}
    std::chrono::milliseconds timeout() const { return inner_->timeout(); }
    void set_timeout(std::chrono::milliseconds t) { inner_->set_timeout(t); }
    asio::awaitable<void> set(std::string k, std::string v) {
        return count("set"), inner_->set(std::move(k), std::move(v));
    }
    asio::awaitable<std::string> get(std::string k) { return count("get"), inner_->get(std::move(k)); }
    asio::awaitable<std::int64_t> add(std::string k, std::int64_t d) {
        return count("add"), inner_->add(std::move(k), d);
    }
    asio::awaitable<std::string> compare_set(std::string k, std::string e, std::string d) {
        return count("compare_set"), inner_->compare_set(std::move(k), std::move(e), std::move(d));
    }
    asio::awaitable<void> wait(std::vector<std::string> k) { return count("wait"), inner_->wait(std::move(k)); }
    asio::awaitable<void> wait(std::vector<std::string> k, std::chrono::milliseconds t) {
        return count("wait"), inner_->wait(std::move(k), t);
    }
    asio::awaitable<bool> check(std::vector<std::string> k) { return count("check"), inner_->check(std::move(k)); }
    asio::awaitable<bool> delete_key(std::string k) { return count("delete"), inner_->delete_key(std::move(k)); }
    asio::awaitable<std::int64_t> num_keys() { return count("num_keys"), inner_->num_keys(); }
    asio::awaitable<std::vector<std::string>> multi_get(std::vector<std::string> k) {
        return count("multi_get"), inner_->multi_get(std::move(k));
    }
    asio::awaitable<void> multi_set(std::vector<std::string> k, std::vector<std::string> v) {
        return count("multi_set"), inner_->multi_set(std::move(k), std::move(v));
    }
    asio::awaitable<void> append(std::string k, std::string v) {
        return count("append"), inner_->append(std::move(k), std::move(v));
    }

    int total() const {
        int t = 0;
        for (const auto& [name, n] : ops_) t += n;
        return t;
    }
    std::map<std::string, int> ops_;

private:
    int count(const char* name) { return ++ops_[name]; }
    S* inner_;
};

static_assert(elastic::multi_key_store<counting_store<elastic::memory_store>>);

node_info info(int i, int nproc = 1) { return rendezvous_support::test_node(i, nproc); }

/// Runs `n` nodes (each its own counting view and rendezvous over one memory_store) through
/// one round on one io_context, in the order given; returns each node's round.
struct cluster {
    explicit cluster(int n, std::vector<std::optional<int>> node_ranks = {}) : views() {
        for (int i = 0; i < n; ++i) views.push_back(std::make_unique<counting_store<elastic::memory_store>>(memory));
        for (int i = 0; i < n; ++i) {
            elastic::store_rendezvous_options o;
            o.run_id = "job";
            o.nnodes = n;
            o.join_timeout = 60s;
            o.hosts_store = i == 0;
            o.last_call_timeout = 1s;  // (fixed membership: only the grace for a missing info)
            o.log = [this](std::string_view line) { logs.emplace_back(line); };
            nodes.push_back(std::make_unique<elastic::store_rendezvous<counting_store<elastic::memory_store>>>(
                *views[static_cast<std::size_t>(i)], *views[static_cast<std::size_t>(i)], o));
        }
        ranks = std::move(node_ranks);
        ranks.resize(static_cast<std::size_t>(n));
    }

    std::vector<rendezvous_round> round(std::vector<int> nprocs = {}) {
        const auto n = nodes.size();
        std::vector<rendezvous_round> out(n);
        std::exception_ptr failure;
        for (std::size_t i = 0; i < n; ++i) {
            auto me = info(static_cast<int>(i), nprocs.empty() ? 1 : nprocs[i]);
            me.node_rank = ranks[i];
            asio::co_spawn(
                ctx, [this, i, me, &out]() -> asio::awaitable<void> { out[i] = co_await nodes[i]->next_round(me); },
                [&failure](std::exception_ptr e) {
                    if (e && !failure) failure = e;
                });
        }
        ctx.run();
        ctx.restart();
        if (failure) std::rethrow_exception(failure);
        return out;
    }

    asio::io_context ctx;
    elastic::memory_store memory;
    std::vector<std::unique_ptr<counting_store<elastic::memory_store>>> views;
    std::vector<std::unique_ptr<elastic::store_rendezvous<counting_store<elastic::memory_store>>>> nodes;
    std::vector<std::optional<int>> ranks;
    std::vector<std::string> logs;  ///< every node's log lines
};

void check_consistent(const std::vector<rendezvous_round>& rounds, const std::vector<int>& nprocs) {
    const int n = static_cast<int>(rounds.size());
    int world = 0;
    for (const int p : nprocs) world += p;
    std::set<int> group_ranks;
    std::map<int, int> base_of;
    for (std::size_t i = 0; i < rounds.size(); ++i) {
        const auto& r = rounds[i];
        CHECK(r.group_world_size == n);
        CHECK(r.world_size == world);
        group_ranks.insert(r.group_rank);
        base_of[r.group_rank] = r.rank_base;
        CHECK(r.master_addr == rounds[0].master_addr);
        CHECK(r.master_port == rounds[0].master_port);
        CHECK(r.restart_count == rounds[0].restart_count);
    }
    CHECK(static_cast<int>(group_ranks.size()) == n);
    // Bases are the prefix sums of nproc in group-rank order.
    int expected = 0;
    for (int g = 0; g < n; ++g) {
        std::size_t who = 0;
        for (std::size_t i = 0; i < rounds.size(); ++i)
            if (rounds[i].group_rank == g) who = i;
        CHECK(base_of[g] == expected);
        expected += nprocs[who];
        if (g == 0) {
            CHECK(rounds[0].master_addr == info(static_cast<int>(who)).store_addr);
            CHECK(rounds[0].master_port == info(static_cast<int>(who)).store_port);
        }
    }
}

TEST_CASE("rendezvous: a round over the in-memory store gives distinct, consistent ranks") {
    for (const int n : {1, 2, 5}) {
        cluster c(n);
        std::vector<int> nprocs;
        for (int i = 0; i < n; ++i) nprocs.push_back(1 + i % 3);
        const auto rounds = c.round(nprocs);
        check_consistent(rounds, nprocs);
        for (const auto& r : rounds) CHECK(r.number == 0);
    }
    cluster c(3, {2, 0, 1});
    const auto rounds = c.round();
    CHECK(rounds[0].group_rank == 2);
    CHECK(rounds[1].group_rank == 0);
    CHECK(rounds[2].group_rank == 1);
    CHECK(rounds[0].master_addr == "10.0.0.1");
}

TEST_CASE("rendezvous: store operations per node do not grow with the number of nodes (8 vs 32)") {
    const auto profile = [](int n) {
        cluster c(n);
        (void)c.round();
        std::multiset<int> totals;
        std::map<std::string, int> most;
        for (const auto& v : c.views) totals.insert(v->total());
        for (const auto& v : c.views)
            for (const auto& [op, k] : v->ops_) most[op] = std::max(most[op], k);
        // A second round (a restart) costs the same as the first, minus the one-time guard.
        std::multiset<int> second;
        for (const auto& v : c.views) v->ops_.clear();
        (void)c.round();
        for (const auto& v : c.views) second.insert(v->total());
        return std::tuple{totals, most, second};
    };
    const auto p8 = profile(8);
    const auto p32 = profile(32);
    const auto& t8 = std::get<0>(p8);
    const auto& m8 = std::get<1>(p8);
    const auto& s8 = std::get<2>(p8);
    const auto& t32 = std::get<0>(p32);
    const auto& m32 = std::get<1>(p32);
    const auto& s32 = std::get<2>(p32);
    CHECK(m8 == m32);
    CHECK(*t8.rbegin() == *t32.rbegin());
    CHECK(*t8.begin() == *t32.begin());
    CHECK(t8.count(*t8.begin()) == 7);  // every node but the completer
    CHECK(t32.count(*t32.begin()) == 31);
    // compare_set (guard) + add + set + wait + get; the completer adds wait (for every info, a
    // bounded one), multi_get and multi_set.
    CHECK(*t8.begin() == 6);
    CHECK(*t8.rbegin() == 10);
    CHECK(*s8.begin() == 4);
    CHECK(*s32.rbegin() == 8);
    MESSAGE("ops per node at N=8: ", *t8.begin(), "..", *t8.rbegin(), ", at N=32: ", *t32.begin(), "..", *t32.rbegin());
}

TEST_CASE("rendezvous: an arrival that counts itself but writes no info is left out after a grace, and the nodes "
          "form the next round") {
    cluster c(3);
    // A client that is no agent takes arrival 1 of round 0 and never writes its info: the third
    // node is late there, and the completer would read the missing info for good.
    spawn_support::spawn_errors errors;
    asio::co_spawn(
        c.ctx, [&]() -> asio::awaitable<void> { (void)co_await c.memory.add("elastic.rendezvous.job/0/count", 1); },
        errors.handler());
    const auto rounds = c.round();
    errors.check();
    check_consistent(rounds, {1, 1, 1});
    for (const auto& r : rounds) CHECK(r.number == 1);
    const auto hole = std::count_if(c.logs.begin(), c.logs.end(), [](const std::string& line) {
        return line.find("round 0 of run 'job': arrival 1 counted itself but wrote no node info within 1000 ms") !=
               std::string::npos;
    });
    CHECK(hole == 1);  // by the completer, once
}

/// A store that holds back `set` of round 0's info keys until release().
template <class S>
class held_store : public counting_store<S> {
public:
    // Each hold ends after a minute at most: a regression fails the test's checks, never hangs it.
    held_store(S& inner, const asio::any_io_executor& ex)
        : counting_store<S>(inner), gate_(ex, std::chrono::minutes(1)), entered_(ex, std::chrono::minutes(1)) {}
    asio::awaitable<void> set(std::string k, std::string v) {
        if (!released_ && k.find("/0/info/") != std::string::npos) {
            held_ = true;
            entered_.cancel();
            co_await gate_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        }
        co_await counting_store<S>::set(std::move(k), std::move(v));
    }
    /// Completes once a set is held back (its ADD came first).
    asio::awaitable<void> await_held() {
        if (!held_) co_await entered_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    }
    void release() {
        released_ = true;
        gate_.cancel();
    }

private:
    asio::steady_timer gate_;
    asio::steady_timer entered_;
    bool held_ = false;
    bool released_ = false;
};

TEST_CASE("rendezvous: an agent whose info comes after the completer's grace is left out, and joins as a late node") {
    // 2:3: node 0's info is held until the completer (arrival 3 = MAX) reported it missing; the
    // round forms with nodes 1 and 2, and node 0, told it was left out, arrives late and is
    // admitted: every node ends in round 1 of 3.
    asio::io_context ctx;
    elastic::memory_store memory;
    held_store<elastic::memory_store> held(memory, ctx.get_executor());
    std::vector<std::unique_ptr<counting_store<elastic::memory_store>>> views;
    std::vector<std::unique_ptr<elastic::store_rendezvous<counting_store<elastic::memory_store>>>> rest;
    std::vector<std::string> logs;
    const auto options = [&](bool host) {
        elastic::store_rendezvous_options o;
        o.run_id = "job";
        o.nnodes = 3;
        o.min_nodes = 2;
        o.join_timeout = 60s;
        o.last_call_timeout = 1s;  // and so the grace for a missing info
        o.hosts_store = host;
        o.log = [&](std::string_view line) {
            logs.emplace_back(line);
            if (line.find("counted itself but wrote no node info") != std::string::npos) held.release();
        };
        return o;
    };
    elastic::store_rendezvous<held_store<elastic::memory_store>> late_node(held, held, options(true));
    for (int i = 1; i < 3; ++i) {
        views.push_back(std::make_unique<counting_store<elastic::memory_store>>(memory));
        rest.push_back(std::make_unique<elastic::store_rendezvous<counting_store<elastic::memory_store>>>(
            *views.back(), *views.back(), options(false)));
    }
    std::vector<rendezvous_round> first(2);
    std::vector<rendezvous_round> second(3);
    std::vector<elastic::abort_notice> notices(2);
    spawn_support::spawn_errors errors;
    asio::co_spawn(
        ctx, [&]() -> asio::awaitable<void> { second[0] = co_await late_node.next_round(info(0)); }, errors.handler());
    for (std::size_t i = 0; i < 2; ++i) {
        asio::co_spawn(
            ctx,
            [&, i]() -> asio::awaitable<void> {
                co_await held.await_held();  // node 0 is arrival 1, not the completer
                first[i] = co_await rest[i]->next_round(info(static_cast<int>(i) + 1));
                notices[i] = co_await rest[i]->wait_for_abort();  // node 0's admission
                second[i + 1] = co_await rest[i]->next_round(info(static_cast<int>(i) + 1));
            },
            errors.handler());
    }
    ctx.run();
    errors.check();
    for (const auto& r : first) {
        CHECK(r.number == 0);
        CHECK(r.group_world_size == 2);
    }
    for (const auto& n : notices) {
        CHECK(n.admission);
        CHECK(n.reason.find("is waiting to join") != std::string::npos);
    }
    for (const auto& r : second) {
        CHECK(r.number == 1);
        CHECK(r.group_world_size == 3);
    }
    const auto said = [&](const std::string& text) {
        return std::count_if(logs.begin(), logs.end(),
                             [&](const std::string& line) { return line.find(text) != std::string::npos; });
    };
    CHECK(said("round 0 of run 'job': arrival 1 counted itself but wrote no node info within 1000 ms") == 1);
    CHECK(said("round 0 of run 'job' formed without this node") == 1);
}

TEST_CASE("rendezvous: an abort reaches every node by push, the winner decides, the restart count is job-wide") {
    cluster c(3);
    auto first = c.round();
    std::vector<std::optional<elastic::abort_notice>> seen(3);
    std::vector<bool> won(3, false);
    std::vector<elastic::job_decision> decisions(3);
    spawn_support::spawn_errors errors;
    for (std::size_t i = 0; i < 3; ++i) {
        asio::co_spawn(
            c.ctx,
            [&, i]() -> asio::awaitable<void> {
                seen[i] = co_await c.nodes[i]->wait_for_abort();
                if (!won[i]) decisions[i] = co_await c.nodes[i]->await_decision();
            },
            errors.handler());
    }
    asio::co_spawn(
        c.ctx,
        [&]() -> asio::awaitable<void> {
            // (named, not braced temporaries: g++ 12 miscompiles those inside co_await)
            const elastic::abort_notice a1{first[1].group_rank, "node1", "local_rank 0 exited with 3"};
            const elastic::abort_notice a2{first[2].group_rank, "node2", "late"};
            const elastic::job_decision d{true, 3, "1/2 restarts left"};
            won[1] = co_await c.nodes[1]->abort(a1);
            won[2] = co_await c.nodes[2]->abort(a2);
            co_await c.nodes[1]->decide(d);
            decisions[1] = {true, 3, "1/2 restarts left"};
        },
        errors.handler());
    c.ctx.run();
    c.ctx.restart();
    errors.check();
    CHECK(won[1]);
    CHECK_FALSE(won[2]);
    for (std::size_t i = 0; i < 3; ++i) {
        REQUIRE(seen[i]);
        CHECK(seen[i]->host == "node1");
        CHECK(seen[i]->reason == "local_rank 0 exited with 3");
        CHECK(decisions[i].restart);
        CHECK(c.nodes[i]->restart_count() == 1);
    }
    const auto second = c.round();
    check_consistent(second, {1, 1, 1});
    for (std::size_t i = 0; i < 3; ++i) {
        CHECK(second[i].number == 1);
        CHECK(second[i].restart_count == 1);
        CHECK(second[i].group_rank == first[i].group_rank);  // stable
    }
}

TEST_CASE("rendezvous: a node that is no member of the round forming leaves it unaborted, and reports a failure "
          "there with no group rank") {
    // Round 0 formed; nodes 1 and 2 go on to round 1 and wait there for node 0. Node 2, a
    // member of round 0 only, then leaves (an agent's SIGTERM) and reports a failure. Its group
    // rank is round 0's: in a round of another size that is an invalid notice, which also takes
    // the round's first abort slot, where its members' acknowledgement mark goes.
    cluster c(3);
    const auto first = c.round();
    spawn_support::spawn_errors errors;
    std::vector<rendezvous_round> second(3);
    std::optional<bool> left;
    std::optional<bool> failed;
    bool slot_empty_after_leave = false;
    std::string slot_after_failure;
    for (const std::size_t i : {std::size_t{1}, std::size_t{2}}) {
        asio::co_spawn(
            c.ctx,
            [&, i]() -> asio::awaitable<void> {
                second[i] = co_await c.nodes[i]->next_round(info(static_cast<int>(i)));
            },
            errors.handler());
    }
    asio::co_spawn(
        c.ctx,
        [&]() -> asio::awaitable<void> {
            auto& store = *c.views[0];
            std::vector<std::string> arrived{"elastic.rendezvous.job/1/info/1", "elastic.rendezvous.job/1/info/2"};
            co_await store.wait(std::move(arrived));
            // (named, not braced temporaries: g++ 12 miscompiles those inside co_await)
            elastic::abort_notice leave{first[2].group_rank, "node2", "node2 left: its agent received SIGTERM"};
            leave.what = elastic::abort_notice::kind::membership;
            left = co_await c.nodes[2]->abort(leave);
            std::vector<std::string> slot{"elastic.rendezvous.job/1/abort"};
            slot_empty_after_leave = !co_await store.check(std::move(slot));
            const elastic::abort_notice failure{first[2].group_rank, "node2", "local_rank 0 exited with 1"};
            failed = co_await c.nodes[2]->abort(failure);
            const std::string slot_key = "elastic.rendezvous.job/1/abort";
            slot_after_failure = co_await store.get(slot_key);
            second[0] = co_await c.nodes[0]->next_round(info(0));
        },
        errors.handler());
    c.ctx.run();
    c.ctx.restart();
    errors.check();
    REQUIRE(left.has_value());
    CHECK_FALSE(*left);
    CHECK(slot_empty_after_leave);
    REQUIRE(failed.has_value());
    CHECK(*failed);
    CHECK(slot_after_failure.find("\"group_rank\":-1") != std::string::npos);
    CHECK(slot_after_failure.find("local_rank 0 exited with 1") != std::string::npos);
    for (const auto& r : second) CHECK(r.number == 1);
}

TEST_CASE("rendezvous: a decider that finds another node's regroup in its decision's place follows it and spends "
          "no restart") {
    cluster c(2);
    (void)c.round();
    std::optional<elastic::job_decision> standing;
    std::optional<elastic::job_decision> followed;
    spawn_support::spawn_errors errors;
    asio::co_spawn(
        c.ctx,
        [&]() -> asio::awaitable<void> {
            const elastic::abort_notice a{1, "node1", "local_rank 0 exited with 3"};
            REQUIRE(co_await c.nodes[1]->abort(a));
            // Node 0 took the decision over while node 1 was taken for lost.
            elastic::job_decision regroup{true, 0, "the reporting node was lost before it decided"};
            regroup.regroup = true;
            co_await c.memory.set(c.nodes[0]->key("decision"), elastic::detail::rendezvous::encode(regroup));
            const elastic::job_decision mine{true, 3, "1/2 restarts left"};
            standing = co_await c.nodes[1]->decide(mine);
            (void)co_await c.nodes[0]->wait_for_abort();
            followed = co_await c.nodes[0]->await_decision();
        },
        errors.handler());
    c.ctx.run();
    c.ctx.restart();
    errors.check();
    REQUIRE(standing);
    CHECK(standing->regroup);
    CHECK(standing->reason == "the reporting node was lost before it decided");
    REQUIRE(followed);
    CHECK(followed->regroup);
    for (const auto& node : c.nodes) CHECK(node->restart_count() == 0);
    const auto next = c.round();
    for (const auto& r : next) CHECK(r.restart_count == 0);  // the job's count was given back
}

TEST_CASE("rendezvous: the exit barrier completes when all finish, and names the missing node on timeout") {
    cluster c(3);
    (void)c.round();
    std::vector<elastic::barrier_result> results(3);
    spawn_support::spawn_errors errors;
    for (std::size_t i = 0; i < 3; ++i) {
        asio::co_spawn(
            c.ctx, [&, i]() -> asio::awaitable<void> { results[i] = co_await c.nodes[i]->finish(60s); },
            errors.handler());
    }
    c.ctx.run();
    c.ctx.restart();
    errors.check();
    for (const auto& r : results) CHECK(r.how == elastic::barrier_result::kind::complete);

    cluster d(3);
    const auto rounds = d.round();
    elastic::barrier_result late;
    for (std::size_t i = 0; i < 2; ++i) {
        asio::co_spawn(
            d.ctx, [&, i]() -> asio::awaitable<void> { late = co_await d.nodes[i]->finish(50ms); }, errors.handler());
    }
    d.ctx.run();
    errors.check();
    REQUIRE(late.how == elastic::barrier_result::kind::timed_out);
    REQUIRE(late.missing.size() == 1);
    CHECK(late.missing[0] == rounds[2].group_rank);
    CHECK(late.missing_hosts[0] == "node2");
}

TEST_CASE("rendezvous: a finished node sees a later abort and follows the restart") {
    cluster c(2);
    (void)c.round();
    elastic::barrier_result finished;
    spawn_support::spawn_errors errors;
    asio::co_spawn(
        c.ctx, [&]() -> asio::awaitable<void> { finished = co_await c.nodes[0]->finish(60s); }, errors.handler());
    asio::co_spawn(
        c.ctx,
        [&]() -> asio::awaitable<void> {
            const elastic::abort_notice a{1, "node1", "crash"};
            (void)co_await c.nodes[1]->abort(a);
        },
        errors.handler());
    c.ctx.run();
    errors.check();
    REQUIRE(finished.how == elastic::barrier_result::kind::aborted);
    CHECK(finished.abort->reason == "crash");
}

TEST_CASE("rendezvous: conflicting --node-rank and torchrun's state are clear errors") {
    cluster c(2, {0, 0});
    CHECK_THROWS_WITH_AS(c.round(), doctest::Contains("--node-rank=0 given by two nodes"), elastic::rendezvous_error);

    asio::io_context ctx;
    elastic::memory_store memory;
    memory.engine().set(std::string_view("torch.rendezvous.job"), std::string_view("Y2FuaW1hZGFt"));
    elastic::store_rendezvous_options o;
    o.run_id = "job";
    o.nnodes = 1;
    elastic::store_rendezvous<elastic::memory_store> r(memory, memory, o);
    std::string message;
    asio::co_spawn(ctx, r.next_round(info(0)), [&](std::exception_ptr e, rendezvous_round) {
        try {
            if (e) std::rethrow_exception(e);
        } catch (const elastic::rendezvous_error& err) {
            message = err.what();
        }
    });
    ctx.run();
    CHECK(message.find("torchrun's rendezvous state for run 'job'") != std::string::npos);

    // Our own marker is there afterwards for a Python agent to trip on.
    elastic::memory_store fresh;
    elastic::store_rendezvous<elastic::memory_store> s(fresh, fresh, o);
    asio::io_context ctx2;
    spawn_support::spawn_errors errors;
    asio::co_spawn(ctx2, s.next_round(info(0)), errors.handler());
    ctx2.run();
    errors.check();
    REQUIRE(fresh.engine().find("torch.rendezvous.job") != nullptr);
    CHECK(fresh.engine().find("torch.rendezvous.job")->find("elasticrun") != std::string::npos);
}

TEST_CASE("rendezvous: four nodes over the real TCP store (two clients each), a round and an abort") {
    asio::io_context ctx;
    elastic::store_server_options so;
    so.host = "127.0.0.1";
    elastic::tcp_store_server server(ctx.get_executor(), so);
    server.start();
    constexpr int n = 4;
    std::vector<std::unique_ptr<elastic::tcp_store_client>> clients;
    std::vector<std::unique_ptr<elastic::store_rendezvous<elastic::tcp_store_client>>> nodes;
    for (int i = 0; i < 2 * n; ++i) {
        elastic::store_client_options o;
        o.port = server.port();
        o.dialect = elastic::client_dialect::current;
        clients.push_back(std::make_unique<elastic::tcp_store_client>(ctx.get_executor(), o));
    }
    for (int i = 0; i < n; ++i) {
        elastic::store_rendezvous_options o;
        o.run_id = "tcp";
        o.nnodes = n;
        nodes.push_back(std::make_unique<elastic::store_rendezvous<elastic::tcp_store_client>>(
            *clients[static_cast<std::size_t>(2 * i)], *clients[static_cast<std::size_t>(2 * i + 1)], o));
    }
    std::vector<rendezvous_round> rounds(n);
    std::vector<std::string> reasons(n);
    int finished = 0;
    for (std::size_t i = 0; i < n; ++i) {
        asio::co_spawn(
            ctx,
            [&, i]() -> asio::awaitable<void> {
                rounds[i] = co_await nodes[i]->next_round(info(static_cast<int>(i)));
                if (i == 3) {
                    const elastic::abort_notice a{rounds[i].group_rank, "node3", "boom"};
                    (void)co_await nodes[i]->abort(a);
                }
                reasons[i] = (co_await nodes[i]->wait_for_abort()).reason;
            },
            [&](std::exception_ptr e) {
                if (e) std::rethrow_exception(e);
                if (++finished == n) server.stop();
            });
    }
    ctx.run();
    check_consistent(rounds, {1, 1, 1, 1});
    for (const auto& r : reasons) CHECK(r == "boom");
}

}  // namespace test_rendezvous
