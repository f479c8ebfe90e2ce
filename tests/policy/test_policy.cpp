// The restart_policy concept and its first model, max_restarts(n).
#include "elastic/policy.hpp"

#include <doctest/doctest.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>

namespace test_policy {

template <class P>
elastic::restart_decision decide(P& policy, const elastic::group_failure& failure) {
    asio::io_context context;
    std::optional<elastic::restart_decision> decision;
    asio::co_spawn(context, policy(failure), [&](std::exception_ptr e, elastic::restart_decision d) {
        REQUIRE(!e);
        decision = std::move(d);
    });
    context.run();
    REQUIRE(decision);
    return *decision;
}

elastic::worker_failure worker(int local_rank, elastic::failure_state state, int code,
                               std::chrono::steady_clock::time_point when) {
    elastic::worker_failure f;
    f.local_rank = local_rank;
    f.global_rank = local_rank + 8;
    f.pid = 1000 + local_rank;
    f.status = elastic::exit_status::from_exit_code(code);
    f.observed_steady = when;
    f.observed_system = std::chrono::system_clock::now();
    f.state = state;
    return f;
}

TEST_CASE("policy: max_restarts(n) restarts n times, then stops, with the reason in words") {
    elastic::max_restarts policy(2);
    CHECK(policy.budget() == 2);
    elastic::group_failure failure;
    failure.restarts = 0;
    auto d = decide(policy, failure);
    CHECK(d.restart());
    CHECK(d.reason == "restart 1 of 2 (max_restarts(2))");
    failure.restarts = 1;
    d = decide(policy, failure);
    CHECK(d.restart());
    CHECK(d.reason == "restart 2 of 2 (max_restarts(2))");
    failure.restarts = 2;
    d = decide(policy, failure);
    CHECK(!d.restart());
    CHECK(d.reason == "the restart budget is spent: 2 of 2 restarts made (max_restarts(2))");
}

TEST_CASE("policy: max_restarts(0), torchrun's default, never restarts, and a negative budget is refused") {
    elastic::max_restarts policy(0);
    const auto d = decide(policy, elastic::group_failure{});
    CHECK(!d.restart());
    CHECK(d.reason == "no restarts allowed (max_restarts(0))");
    CHECK_THROWS_AS(elastic::max_restarts(-1), std::invalid_argument);
}

TEST_CASE("policy: a built-in policy cites its C++ call, or the option when built from the command line") {
    elastic::max_restarts policy(2);
    CHECK(policy.naming() == elastic::policy_naming::code);
    elastic::group_failure failure;
    CHECK(decide(policy, failure).reason == "restart 1 of 2 (max_restarts(2))");
    policy.name_by(elastic::policy_naming::command_line);
    CHECK(decide(policy, failure).reason == "restart 1 of 2 (--max-restarts=2)");
}

TEST_CASE("policy: group_failure answers which ranks failed, the root cause and the healthy time") {
    const auto t0 = std::chrono::steady_clock::now();
    elastic::group_failure failure;
    failure.started = t0;
    failure.failed = t0 + std::chrono::seconds(42);
    failure.workers.push_back(worker(2, elastic::failure_state::failed, 3, t0 + std::chrono::seconds(43)));
    failure.workers.push_back(worker(0, elastic::failure_state::stopped_by_agent, 0, t0 + std::chrono::seconds(44)));
    failure.workers.push_back(worker(1, elastic::failure_state::failed, 4, t0 + std::chrono::seconds(42)));
    CHECK(failure.healthy_for() == std::chrono::seconds(42));
    CHECK(failure.failures().size() == 2);
    CHECK(failure.failed_local_ranks() == std::vector<int>{1, 2});
    CHECK(failure.failed_global_ranks() == std::vector<int>{9, 10});
    REQUIRE(failure.root_cause() != nullptr);
    CHECK(failure.root_cause()->local_rank == 1);
    CHECK(elastic::group_failure{}.root_cause() == nullptr);
}

// A model written by a user: backoff by awaiting a timer, then restart; state across calls.
struct backoff_then_stop {
    int calls = 0;
    asio::awaitable<elastic::restart_decision> operator()(const elastic::group_failure& f) {
        ++calls;
        asio::steady_timer delay(co_await asio::this_coro::executor, std::chrono::milliseconds(1));
        co_await delay.async_wait(asio::use_awaitable);
        if (f.failed_local_ranks() == std::vector<int>{0}) {
            co_return elastic::restart_decision::stop_because("local rank 0 is fatal");
        }
        co_return elastic::restart_decision::restart_because("after a backoff");
    }
};

static_assert(elastic::restart_policy<elastic::max_restarts>);
static_assert(elastic::restart_policy<backoff_then_stop>);
static_assert(!elastic::restart_policy<int>);

TEST_CASE("policy: a user's model awaits a timer and keeps state") {
    backoff_then_stop policy;
    elastic::group_failure failure;
    failure.workers.push_back(worker(1, elastic::failure_state::failed, 1, std::chrono::steady_clock::now()));
    CHECK(decide(policy, failure).restart());
    failure.workers.front().local_rank = 0;
    const auto d = decide(policy, failure);
    CHECK(!d.restart());
    CHECK(d.reason == "local rank 0 is fatal");
    CHECK(policy.calls == 2);
}

}  // namespace test_policy
