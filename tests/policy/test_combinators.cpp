// Tests of the built-in restart policies and their composition, driven through a manual clock:
// backoff, restart_window, exit-code classes, crash_loop_guard, `a | b`, make_default_policy and
// the parsers of their settings. Nothing sleeps: a delay completes when the test advances time.
#include "elastic/launch/config.hpp"
#include "elastic/usage_error.hpp"
#include "elastic/policy/backoff.hpp"
#include "elastic/policy/clock.hpp"
#include "elastic/policy/combinators.hpp"
#include "elastic/policy/crash_loop.hpp"
#include "elastic/policy/exit_codes.hpp"
#include "elastic/launch/default_policy.hpp"
#include "elastic/policy/max_restarts.hpp"
#include "elastic/policy/spec.hpp"
#include "elastic/policy/window.hpp"

#include <doctest/doctest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/system_error.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace test_combinators {

using namespace std::chrono_literals;
using elastic::group_failure;
using elastic::manual_policy_clock;
using elastic::restart_decision;
using duration = std::chrono::steady_clock::duration;

/// Runs every handler that is ready, without blocking (a pending manual sleep is not ready).
void settle(asio::io_context& context) {
    context.restart();
    while (context.poll() > 0) {
    }
}

/// A policy call in flight.
struct call {
    bool done = false;
    std::exception_ptr error;
    std::optional<restart_decision> decision;
    asio::cancellation_signal cancel;
};

/// Starts `policy(failure)` and runs it as far as it goes without time passing.
template <class P>
std::shared_ptr<call> start(asio::io_context& context, P& policy, const group_failure& failure) {
    auto c = std::make_shared<call>();
    asio::co_spawn(context, policy(failure),
                   asio::bind_cancellation_slot(c->cancel.slot(), [c](std::exception_ptr e, restart_decision d) {
                       c->done = true;
                       c->error = e;
                       if (!e) c->decision = std::move(d);
                   }));
    settle(context);
    return c;
}

/// Starts the call, and requires it to answer without any time passing.
template <class P>
restart_decision decide_now(P& policy, const group_failure& failure) {
    asio::io_context context;
    auto c = start(context, policy, failure);
    REQUIRE(c->done);
    REQUIRE(!c->error);
    return *c->decision;
}

/// Starts the call and advances the clock by exactly the time it waits; returns the decision
/// and that time. Checks that the answer does not come a millisecond earlier.
template <class P>
std::pair<restart_decision, duration> decide_advancing(P& policy, const group_failure& failure,
                                                       manual_policy_clock& clock) {
    asio::io_context context;
    const auto begin = clock.now();
    auto c = start(context, policy, failure);
    while (!c->done) {
        REQUIRE(clock.sleeping() > 0);
        const auto step = clock.next_deadline() - clock.now();
        if (step > 1ms) {
            clock.advance(step - 1ms);
            settle(context);
            REQUIRE(!c->done);
            clock.advance(1ms);
        } else {
            clock.advance(step);
        }
        settle(context);
    }
    REQUIRE(!c->error);
    return {*c->decision, clock.now() - begin};
}

/// A failure of one worker (local rank 0, global rank 8) with `status`, after the group ran
/// `healthy` on `clock`'s time, with `restarts` made so far.
group_failure failure_of(const manual_policy_clock& clock, elastic::exit_status status, duration healthy = 1h,
                         int restarts = 0) {
    group_failure f;
    f.restarts = restarts;
    f.failed = clock.now();
    f.started = clock.now() - healthy;
    elastic::worker_failure w;
    w.local_rank = 0;
    w.global_rank = 8;
    w.pid = 4242;
    w.status = status;
    w.observed_steady = f.failed;
    w.observed_system = std::chrono::system_clock::now();
    w.state = elastic::failure_state::failed;
    f.workers.push_back(w);
    return f;
}

group_failure exited(const manual_policy_clock& clock, int code, duration healthy = 1h, int restarts = 0) {
    return failure_of(clock, elastic::exit_status::from_exit_code(code), healthy, restarts);
}

/// Jitter that always takes the most off (u = 1 - epsilon is not needed: u = 0.5 reads easily).
elastic::uniform_source fixed(double u) {
    return [u] { return u; };
}

elastic::backoff_spec no_jitter(std::chrono::milliseconds initial, std::chrono::milliseconds cap) {
    elastic::backoff_spec spec{initial, cap};
    spec.jitter = 0;
    return spec;
}

TEST_CASE("policy: the manual clock wakes a sleep only when advanced to its deadline, cancellation throws") {
    manual_policy_clock clock;
    asio::io_context context;
    bool woke = false;
    asio::co_spawn(context, clock.sleep(5s), [&](std::exception_ptr e) {
        CHECK(!e);
        woke = true;
    });
    settle(context);
    CHECK(clock.sleeping() == 1);
    CHECK(clock.next_deadline() == clock.now() + 5s);
    clock.advance(4999ms);
    settle(context);
    CHECK(!woke);
    clock.advance(1ms);
    settle(context);
    CHECK(woke);
    CHECK(clock.sleeping() == 0);
    CHECK(clock.sleeps() == std::vector<duration>{5s});

    // A copy shares the time; a cancelled sleep ends with operation_aborted and leaves no sleeper.
    manual_policy_clock copy = clock;
    asio::cancellation_signal cancel;
    std::exception_ptr error;
    asio::co_spawn(context, copy.sleep(1h),
                   asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) { error = e; }));
    settle(context);
    CHECK(clock.sleeping() == 1);
    cancel.emit(asio::cancellation_type::terminal);
    settle(context);
    REQUIRE(error);
    try {
        std::rethrow_exception(error);
    } catch (const asio::system_error& e) {
        CHECK(e.code() == asio::error::operation_aborted);
    }
    CHECK(clock.sleeping() == 0);

    // The production clock: a zero sleep completes without a timer.
    elastic::steady_policy_clock steady;
    bool zero_done = false;
    asio::co_spawn(context, steady.sleep(duration::zero()), [&](std::exception_ptr e) {
        CHECK(!e);
        zero_done = true;
    });
    settle(context);
    CHECK(zero_done);
}

TEST_CASE("policy: backoff doubles its delay for failures in a row, up to the cap, and awaits it") {
    manual_policy_clock clock;
    elastic::basic_backoff<manual_policy_clock> policy(no_jitter(1s, 5s), clock);
    std::vector<duration> waited;
    for (int i = 0; i < 5; ++i) {
        const auto [decision, took] = decide_advancing(policy, exited(clock, 1, 2s, i), clock);
        CHECK(decision.restart());
        waited.push_back(took);
        CHECK(policy.in_a_row() == i + 1);
    }
    CHECK(waited == std::vector<duration>{1s, 2s, 4s, 5s, 5s});
    CHECK(clock.sleeps() == waited);
    const auto [d, took] = decide_advancing(policy, exited(clock, 1, 2s, 5), clock);
    CHECK(d.reason == "after 5 s backoff (failure 6 in a row; backoff(backoff_spec{1s, 5s, 10min, 2, 0}))");
    CHECK(took == 5s);
}

TEST_CASE("policy: backoff starts over after a healthy period, and jitter only shortens a delay") {
    manual_policy_clock clock;
    elastic::backoff_spec spec{1s, 1min};
    spec.reset_after = 10min;
    spec.jitter = 0.2;
    elastic::basic_backoff<manual_policy_clock> policy(spec, clock, fixed(0.5));
    // u = 0.5, jitter 0.2: every delay is 90 % of the exponential one.
    CHECK(decide_advancing(policy, exited(clock, 1, 1s), clock).second == 900ms);
    CHECK(decide_advancing(policy, exited(clock, 1, 1s), clock).second == 1800ms);
    const auto [third, took] = decide_advancing(policy, exited(clock, 1, 1s), clock);
    CHECK(took == 3600ms);
    CHECK(third.reason == "after 3.6 s backoff (failure 3 in a row; backoff(backoff_spec{1s, 1min, 10min, 2, 0.2}))");
    // Ten minutes healthy: back to the first delay, and the reason says why.
    const auto [reset, took_reset] = decide_advancing(policy, exited(clock, 1, 10min), clock);
    CHECK(took_reset == 900ms);
    CHECK(
        reset.reason ==
        "after 900 ms backoff (failure 1 in a row, after 10 min healthy; backoff(backoff_spec{1s, 1min, 10min, 2, 0.2}))");
    CHECK(policy.in_a_row() == 1);
    // u = 0: the full delay; the cap holds even with jitter.
    elastic::basic_backoff<manual_policy_clock> full(spec, clock, fixed(0.0));
    for (int i = 0; i < 8; ++i) (void)decide_advancing(full, exited(clock, 1, 1s), clock);
    CHECK(decide_advancing(full, exited(clock, 1, 1s), clock).second == 1min);
    // The default jitter source stays within [90 %, 100 %] of the delay.
    elastic::basic_backoff<manual_policy_clock> random(elastic::backoff_spec{10s, 10s}, clock);
    const auto took_random = decide_advancing(random, exited(clock, 1, 1s), clock).second;
    CHECK(took_random <= 10s);
    CHECK(took_random >= 9s);
}

TEST_CASE("policy: a cancelled backoff counts nothing") {
    manual_policy_clock clock;
    elastic::basic_backoff<manual_policy_clock> policy(no_jitter(1s, 1min), clock);
    asio::io_context context;
    const auto failure = exited(clock, 1, 1s);
    auto c = start(context, policy, failure);
    CHECK(!c->done);
    c->cancel.emit(asio::cancellation_type::terminal);
    settle(context);
    CHECK(c->done);
    CHECK(c->error);
    CHECK(policy.in_a_row() == 0);
    CHECK(clock.sleeping() == 0);
}

TEST_CASE("policy: restart_window allows N restarts within any period, then stops with its reason") {
    manual_policy_clock clock;
    elastic::basic_restart_window<manual_policy_clock> policy(2, 1h, clock);
    auto d = decide_now(policy, exited(clock, 1));
    CHECK(d.restart());
    CHECK(d.reason == "restart 1 of 2 within 1 h (restart_window(2, 1h))");
    clock.advance(20min);
    CHECK(decide_now(policy, exited(clock, 1)).restart());
    clock.advance(20min);
    d = decide_now(policy, exited(clock, 1));
    CHECK(!d.restart());
    CHECK(d.reason ==
          "the restart window is spent: 2 restarts within the last 1 h, the first 40 min ago (restart_window(2, 1h))");
    CHECK(policy.recent() == 2);
    // The window slides: an hour after the first restart, one is allowed again.
    clock.advance(20min);
    CHECK(policy.recent() == 1);
    d = decide_now(policy, exited(clock, 1));
    CHECK(d.restart());
    CHECK(d.reason == "restart 2 of 2 within 1 h (restart_window(2, 1h))");
    CHECK(!decide_now(policy, exited(clock, 1)).restart());
    CHECK_THROWS_AS(elastic::basic_restart_window<manual_policy_clock>(0, 1h, clock), std::invalid_argument);
}

TEST_CASE("policy: restart_on_exit restarts on its set (codes, ranges, signals, 128+N) and stops at once otherwise") {
    manual_policy_clock clock;
    auto policy = elastic::restart_on_exit("1,75-78,signals");
    auto d = decide_now(policy, exited(clock, 76));
    CHECK(d.restart());
    CHECK(d.reason == "local_rank 0 exited with code 76: retryable (restart_on_exit(\"1,75-78,signals\"))");
    d = decide_now(policy, exited(clock, 2));
    CHECK(!d.restart());
    CHECK(d.reason ==
          "local_rank 0 exited with code 2: not retryable, stopping at once (restart_on_exit(\"1,75-78,signals\"))");
    d = decide_now(policy, failure_of(clock, elastic::exit_status::from_signal(9)));
    CHECK(d.restart());
    CHECK(d.reason == "local_rank 0 killed by signal 9 (SIGKILL): retryable (restart_on_exit(\"1,75-78,signals\"))");
    CHECK(decide_now(policy, exited(clock, 137)).restart());  // a shell's report of SIGKILL
    CHECK(!decide_now(policy, exited(clock, 128)).restart());
    CHECK(!decide_now(policy, exited(clock, 200)).restart());

    // The root cause (first failure by time) decides, not a later consequence.
    auto two = exited(clock, 76);
    auto later = two.workers.front();
    later.local_rank = 1;
    later.status = elastic::exit_status::from_exit_code(2);
    later.observed_steady += 1s;
    two.workers.push_back(later);
    CHECK(decide_now(policy, two).restart());
    two.workers[1].observed_steady -= 2s;
    d = decide_now(policy, two);
    CHECK(!d.restart());
    CHECK(d.reason.rfind("local_rank 1 exited with code 2", 0) == 0);
    // No worker failed on its own: nothing to judge.
    CHECK(decide_now(policy, group_failure{}).restart());

    // Named signals; and stop_on_exit, the reverse class.
    auto named = elastic::restart_on_exit("SIGTERM,sigusr1");
    CHECK(decide_now(named, failure_of(clock, elastic::exit_status::from_signal(15))).restart());
    CHECK(decide_now(named, exited(clock, 128 + 10)).restart());
    CHECK(!decide_now(named, failure_of(clock, elastic::exit_status::from_signal(9))).restart());
    auto fatal = elastic::stop_on_exit("2,SIGSEGV");
    d = decide_now(fatal, failure_of(clock, elastic::exit_status::from_signal(11)));
    CHECK(!d.restart());
    CHECK(d.reason ==
          "local_rank 0 killed by signal 11 (SIGSEGV): fatal, stopping at once (stop_on_exit(\"2,SIGSEGV\"))");
    CHECK(decide_now(fatal, exited(clock, 1)).restart());

    // A hang is its own ending: `hang` matches it, not the signal that then stopped the worker.
    auto hung = failure_of(clock, elastic::exit_status::from_signal(15));
    hung.workers.front().hang = elastic::hang_report{"no heartbeat for 31 s (--watchdog beat=30s)", "", 12, 31s, ""};
    d = decide_now(named, hung);
    CHECK(!d.restart());
    CHECK(d.reason == "local_rank 0 hung: no heartbeat for 31 s (--watchdog beat=30s); progress 12: not retryable, "
                      "stopping at once (restart_on_exit(\"SIGUSR1,SIGTERM\"))");
    auto on_hang = elastic::restart_on_exit("hang");
    CHECK(decide_now(on_hang, hung).restart());
    CHECK(!decide_now(on_hang, failure_of(clock, elastic::exit_status::from_signal(15))).restart());
    auto stop_hang = elastic::stop_on_exit("hang");
    CHECK(!decide_now(stop_hang, hung).restart());
}

TEST_CASE("policy: no_progress stops at the N-th failure in a row that did not pass the best progress") {
    manual_policy_clock clock;
    auto policy = elastic::no_progress(2);
    const auto at = [&](std::optional<std::uint64_t> progress) {
        auto f = exited(clock, 1);
        f.progress = progress;
        return f;
    };
    auto d = decide_now(policy, at(std::nullopt));  // none reported: no progress
    CHECK(d.restart());
    CHECK(d.reason == "no progress reported (none reported before): 1 of 1 attempts in a row without progress "
                      "allowed (no_progress(2))");
    d = decide_now(policy, at(10));
    CHECK(d.restart());
    CHECK(d.reason == "progress 10, past nothing (no_progress(2))");
    CHECK(decide_now(policy, at(10)).restart());  // not past 10: one
    CHECK(decide_now(policy, at(11)).restart());  // past: the count starts over
    CHECK(decide_now(policy, at(3)).restart());   // one
    d = decide_now(policy, at(11));               // two
    CHECK(!d.restart());
    CHECK(d.reason == "progress 11 (the best so far is 11): 2 failed attempts in a row made no progress, stopping "
                      "(no_progress(2))");
    CHECK_THROWS_AS(elastic::no_progress(0), std::invalid_argument);
}

TEST_CASE("policy: crash_loop_guard stops a group that fails within T of its start") {
    manual_policy_clock clock;
    elastic::crash_loop_guard guard(30s);
    auto d = decide_now(guard, exited(clock, 1, 5s));
    CHECK(!d.restart());
    CHECK(d.reason == "the group failed 5 s after its start, within the crash-loop guard of 30 s: not retried "
                      "(crash_loop_guard(30s))");
    d = decide_now(guard, exited(clock, 1, 30s));
    CHECK(d.restart());
    CHECK(d.reason == "ran 30 s, past the crash-loop guard of 30 s");

    // Three in a row: two early failures restart, the third stops; a long run clears the count.
    elastic::crash_loop_guard three(30s, 3);
    CHECK(decide_now(three, exited(clock, 1, 1s)).restart());
    CHECK(decide_now(three, exited(clock, 1, 1s)).restart());
    CHECK(decide_now(three, exited(clock, 1, 1h)).restart());
    CHECK(decide_now(three, exited(clock, 1, 1s)).restart());
    d = decide_now(three, exited(clock, 1, 2s));
    CHECK(d.restart());
    CHECK(d.reason == "failed 2 s after its start: 2 of 2 allowed in a row within 30 s (crash_loop_guard(30s, 3))");
    d = decide_now(three, exited(clock, 1, 1500ms));
    CHECK(!d.restart());
    CHECK(d.reason ==
          "the group failed 1.5 s after its start: 3 starts in a row failed within the crash-loop guard of 30 s: "
          "not retried (crash_loop_guard(30s, 3))");
    CHECK_THROWS_AS(elastic::crash_loop_guard(0ms), std::invalid_argument);
}

/// A user's policy in a chain: it awaits the clock itself and counts its calls.
struct user_part {
    manual_policy_clock clock;
    int* calls;
    asio::awaitable<restart_decision> operator()(const group_failure&) {
        ++*calls;
        co_await clock.sleep(3s);
        co_return restart_decision::restart_because("the operator agreed");
    }
};

TEST_CASE("policy: a chain announces its restart and whole wait once, through before_delay, as the wait starts") {
    manual_policy_clock clock;
    using backoff_m = elastic::basic_backoff<manual_policy_clock>;
    auto policy = elastic::max_restarts(3) | backoff_m(no_jitter(1s, 1min), clock) |
                  elastic::basic_restart_window<manual_policy_clock>(5, 1h, clock) |
                  backoff_m(no_jitter(2s, 1min), clock);
    std::vector<std::pair<std::string, duration>> heard;
    std::size_t sleeps_when_heard = 0;
    auto failure = exited(clock, 1, 1s, 0);
    failure.before_delay = [&](const restart_decision& d, duration wait) {
        CHECK(d.restart());
        heard.emplace_back(d.reason, wait);
        sleeps_when_heard = clock.sleeps().size();
    };
    const auto sleeps_before = clock.sleeps().size();
    auto [d, took] = decide_advancing(policy, failure, clock);
    CHECK(d.restart());
    CHECK(took == 3s);
    REQUIRE(heard.size() == 1);
    CHECK(heard[0].first == d.reason);          // the reason it answers with
    CHECK(heard[0].second == 3s);               // both backoffs: 1 s + 2 s
    CHECK(sleeps_when_heard == sleeps_before);  // heard before any wait began

    // No wait, or a stop: nothing announced.
    heard.clear();
    auto budget_only = elastic::max_restarts(1) | elastic::restart_on_exit("1");
    failure.restarts = 0;
    CHECK(decide_now(budget_only, failure).restart());
    failure.restarts = 1;
    CHECK(!decide_now(budget_only, failure).restart());
    failure.restarts = 3;  // the chain's budget is spent: it stops before any backoff
    CHECK(!decide_now(policy, failure).restart());
    CHECK(heard.empty());

    // A planned model alone announces its own wait.
    backoff_m alone(no_jitter(4s, 1min), clock);
    failure.restarts = 0;
    std::tie(d, took) = decide_advancing(alone, failure, clock);
    REQUIRE(heard.size() == 1);
    CHECK(heard[0].second == 4s);
    CHECK(took == 4s);
}

TEST_CASE("policy: a | b asks in order, the first stop wins, reasons join, delays add up") {
    manual_policy_clock clock;
    using backoff_m = elastic::basic_backoff<manual_policy_clock>;
    auto policy = elastic::max_restarts(2) | backoff_m(no_jitter(1s, 1min), clock);
    static_assert(elastic::restart_policy<decltype(policy)>);
    auto [d, took] = decide_advancing(policy, exited(clock, 1, 1s, 0), clock);
    CHECK(d.restart());
    CHECK(
        d.reason ==
        "restart 1 of 2 (max_restarts(2)); after 1 s backoff (failure 1 in a row; backoff(backoff_spec{1s, 1min, 10min, 2, 0}))");
    CHECK(took == 1s);
    std::tie(d, took) = decide_advancing(policy, exited(clock, 1, 1s, 1), clock);
    CHECK(
        d.reason ==
        "restart 2 of 2 (max_restarts(2)); after 2 s backoff (failure 2 in a row; backoff(backoff_spec{1s, 1min, 10min, 2, 0}))");
    CHECK(took == 2s);
    const auto sleeps_before = clock.sleeps().size();
    d = decide_now(policy, exited(clock, 1, 1s, 2));
    CHECK(!d.restart());
    CHECK(d.reason == "the restart budget is spent: 2 of 2 restarts made (max_restarts(2))");
    CHECK(clock.sleeps().size() == sleeps_before);  // the budget stopped it before any backoff

    // A later stop costs no earlier backoff and counts nothing in it.
    auto late_stop = backoff_m(no_jitter(1s, 1min), clock) | elastic::max_restarts(0);
    d = decide_now(late_stop, exited(clock, 1));
    CHECK(!d.restart());
    CHECK(d.reason == "no restarts allowed (max_restarts(0))");
    CHECK(std::get<0>(late_stop.parts()).in_a_row() == 0);

    // Budgets count only restarts the whole chain makes.
    auto windowed = elastic::basic_restart_window<manual_policy_clock>(1, 1h, clock) | elastic::stop_on_exit("3");
    CHECK(!decide_now(windowed, exited(clock, 3)).restart());
    CHECK(std::get<0>(windowed.parts()).recent() == 0);
    CHECK(decide_now(windowed, exited(clock, 1)).restart());
    CHECK(std::get<0>(windowed.parts()).recent() == 1);

    // Two delays add up: both are awaited, one after the other, after every part said restart.
    auto twice = backoff_m(no_jitter(1s, 1min), clock) | backoff_m(no_jitter(2s, 1min), clock);
    std::tie(d, took) = decide_advancing(twice, exited(clock, 1), clock);
    CHECK(took == 3s);
    CHECK(d.reason.find("after 1 s backoff") == 0);
    CHECK(d.reason.find("; after 2 s backoff") != std::string::npos);
}

TEST_CASE("policy: chains flatten, take a user's coroutine in its turn, and erase to any_restart_policy") {
    manual_policy_clock clock;
    using backoff_m = elastic::basic_backoff<manual_policy_clock>;
    auto ab = elastic::max_restarts(5) | elastic::restart_on_exit("1");
    auto cd = elastic::crash_loop_guard(1s) | backoff_m(no_jitter(1s, 1min), clock);
    auto all = ab | cd;
    static_assert(std::is_same_v<decltype(all), elastic::policy_chain<elastic::max_restarts, elastic::exit_code_policy,
                                                                      elastic::crash_loop_guard, backoff_m>>);

    int calls = 0;
    auto with_user = elastic::restart_on_exit("1") | user_part{clock, &calls} | backoff_m(no_jitter(1s, 1min), clock);
    // The user's part waits 3 s in its turn, then the backoff's 1 s: 4 s in all.
    auto [d, took] = decide_advancing(with_user, exited(clock, 1, 1s), clock);
    CHECK(took == 4s);
    CHECK(calls == 1);
    CHECK(d.reason ==
          "local_rank 0 exited with code 1: retryable (restart_on_exit(\"1\")); the operator agreed; after 1 s backoff "
          "(failure 1 in a row; backoff(backoff_spec{1s, 1min, 10min, 2, 0}))");
    // A stop before the user's part: the user is not asked.
    CHECK(!decide_now(with_user, exited(clock, 2)).restart());
    CHECK(calls == 1);

    elastic::any_restart_policy erased = std::move(with_user);
    std::tie(d, took) = decide_advancing(erased, exited(clock, 1, 1s), clock);
    CHECK(d.restart());
    CHECK(took == 3s + 2s);
    CHECK(calls == 2);
    elastic::any_restart_policy plain = elastic::max_restarts(0);
    CHECK(!decide_now(plain, exited(clock, 1)).restart());
}

elastic::launch_config config_with(int max_restarts) {
    elastic::launch_config c;
    c.max_restarts = max_restarts;
    return c;
}

TEST_CASE("policy: make_default_policy is max_restarts alone without --restart-* options") {
    manual_policy_clock clock;
    auto policy = elastic::make_default_policy(config_with(1), clock, fixed(0));
    auto d = decide_now(policy, exited(clock, 1, 1s, 0));
    CHECK(d.restart());
    CHECK(d.reason == "restart 1 of 1 (--max-restarts=1)");
    d = decide_now(policy, exited(clock, 1, 1s, 1));
    CHECK(!d.restart());
    CHECK(d.reason == "the restart budget is spent: 1 of 1 restarts made (--max-restarts=1)");
    auto never = elastic::make_default_policy(config_with(0), clock);
    CHECK(decide_now(never, exited(clock, 1)).reason == "no restarts allowed (--max-restarts=0)");
}

TEST_CASE("policy: make_default_policy orders exit codes, crash guard, budget, window, backoff") {
    manual_policy_clock clock;
    auto config = config_with(10);
    config.restart_on_exit = elastic::parse_exit_code_set("1,signals", "--restart-on-exit");
    config.restart_crash_guard = elastic::crash_guard_spec{5s, 1};
    config.restart_window = elastic::window_spec{2, 1h};
    config.restart_backoff = elastic::backoff_spec{2s, 1min};
    auto policy = elastic::make_default_policy(config, clock, fixed(0));
    auto [d, took] = decide_advancing(policy, exited(clock, 1, 1min, 0), clock);
    CHECK(d.restart());
    CHECK(took == 2s);
    CHECK(d.reason ==
          "local_rank 0 exited with code 1: retryable (--restart-on-exit=1,signals); ran 1 min, past the crash-loop "
          "guard of 5 s; restart 1 of 10 (--max-restarts=10); restart 1 of 2 within 1 h (--restart-window=2/1h); "
          "after 2 s backoff (failure 1 in a row; --restart-backoff=2s:1min)");
    // An exit code outside the set stops at once, before the crash guard.
    d = decide_now(policy, exited(clock, 2, 1s, 1));
    CHECK(!d.restart());
    CHECK(d.reason.find("not retryable, stopping at once") != std::string::npos);
    // A crash at start-up stops before the budget is asked.
    d = decide_now(policy, exited(clock, 1, 1s, 1));
    CHECK(!d.restart());
    CHECK(d.reason.find("crash-loop guard") != std::string::npos);
    // The window: one more restart (4 s of backoff), then it is spent.
    std::tie(d, took) = decide_advancing(policy, exited(clock, 1, 1min, 1), clock);
    CHECK(d.restart());
    CHECK(took == 4s);
    d = decide_now(policy, exited(clock, 1, 1min, 2));
    CHECK(!d.restart());
    CHECK(d.reason.rfind("the restart window is spent: 2 restarts within the last 1 h", 0) == 0);

    // A window with --max-restarts left at 0 is the budget itself.
    auto window_only = config_with(0);
    window_only.restart_window = elastic::window_spec{1, 1h};
    auto w = elastic::make_default_policy(window_only, clock);
    d = decide_now(w, exited(clock, 1, 1s, 0));
    CHECK(d.restart());
    CHECK(d.reason == "restart 1 of 1 within 1 h (--restart-window=1/1h)");
    CHECK(!decide_now(w, exited(clock, 1, 1s, 1)).restart());
}

TEST_CASE("policy: durations and the --restart-* values parse, print back, and refuse bad input clearly") {
    using elastic::parse_duration;
    CHECK(parse_duration("1.5", "x") == 1500ms);
    CHECK(parse_duration("500ms", "x") == 500ms);
    CHECK(parse_duration("2m", "x") == 2min);
    CHECK(parse_duration(" 2 min ", "x") == 2min);
    CHECK(parse_duration("1h", "x") == 1h);
    CHECK(parse_duration("0", "x", true) == 0ms);
    for (const char* bad : {"", "0", "-1s", "1d", "s", "1e3", "1..2s", "nan", "0.1ms", "0.0001"}) {
        CHECK_THROWS_AS((void)parse_duration(bad, "--restart-backoff"), elastic::usage_error);
    }
    try {
        (void)parse_duration("10x", "--restart-backoff");
        FAIL("no error");
    } catch (const elastic::usage_error& e) {
        CHECK(std::string(e.what()) ==
              "--restart-backoff=10x: want a duration above 0 such as 500ms, 1.5s, 10min or 1h (a bare number counts "
              "seconds)");
    }
    CHECK(elastic::duration_flag_text(1500ms) == "1.5s");
    CHECK(elastic::duration_flag_text(90s) == "90s");
    CHECK(elastic::duration_words(250ms) == "250 ms");
    CHECK(elastic::duration_words(2h) == "2 h");
    CHECK(elastic::duration_words(std::chrono::microseconds(500)) == "0.5 ms");

    const auto b = elastic::parse_backoff_spec("1s:1min", "--restart-backoff");
    CHECK(b == elastic::backoff_spec{1s, 1min});
    CHECK(b.flag() == "--restart-backoff=1s:1min");
    const auto b3 = elastic::parse_backoff_spec("0.5:30:1h", "--restart-backoff");
    CHECK(b3.initial == 500ms);
    CHECK(b3.cap == 30s);
    CHECK(b3.reset_after == 1h);
    CHECK(b3.flag() == "--restart-backoff=500ms:30s:1h");
    CHECK(elastic::parse_backoff_spec(b3.flag().substr(18), "x") == b3);
    for (const char* bad : {"1s", "1s:1min:1h:1h", "2s:1s", "0:1s", "1s:x"}) {
        CHECK_THROWS_AS((void)elastic::parse_backoff_spec(bad, "--restart-backoff"), elastic::usage_error);
    }

    const auto w = elastic::parse_window_spec("5/1h", "--restart-window");
    CHECK(w == elastic::window_spec{5, 1h});
    CHECK(w.flag() == "--restart-window=5/1h");
    for (const char* bad : {"5", "0/1h", "x/1h", "5/0", "5/1h/2"}) {
        CHECK_THROWS_AS((void)elastic::parse_window_spec(bad, "--restart-window"), elastic::usage_error);
    }

    const auto set = elastic::parse_exit_code_set("78, 1, 75-77,SIGKILL", "--restart-on-exit");
    CHECK(set.to_string() == "1,75-78,SIGKILL");
    CHECK(elastic::parse_exit_code_set(set.to_string(), "x") == set);
    CHECK(elastic::parse_exit_code_set("signals,SIGKILL", "x").to_string() == "signals");
    CHECK(elastic::parse_exit_code_set("HANG,3", "x").to_string() == "3,hang");
    CHECK(elastic::parse_exit_code_set("hang", "x").hang);
    for (const char* bad : {"", "0", "256", "5-3", "SIGNOPE", "1,,2", "x"}) {
        CHECK_THROWS_AS((void)elastic::parse_exit_code_set(bad, "--restart-on-exit"), elastic::usage_error);
    }
    try {
        (void)elastic::parse_exit_code_set("1,SIGNOPE", "PET_RESTART_ON_EXIT");
        FAIL("no error");
    } catch (const elastic::usage_error& e) {
        CHECK(std::string(e.what()) ==
              "PET_RESTART_ON_EXIT=1,SIGNOPE: 'SIGNOPE' is not a signal name (such as SIGKILL or SIGSEGV)");
    }

    CHECK(elastic::parse_crash_guard_spec("30s", "x") == elastic::crash_guard_spec{30s, 1});
    CHECK(elastic::parse_crash_guard_spec("1min:3", "x") == elastic::crash_guard_spec{1min, 3});
    CHECK(elastic::crash_guard_spec{1min, 3}.flag() == "--restart-crash-guard=1min:3");
    for (const char* bad : {"", "0s", "30s:0", "30s:1:2", "30s:x"}) {
        CHECK_THROWS_AS((void)elastic::parse_crash_guard_spec(bad, "--restart-crash-guard"), elastic::usage_error);
    }
}

}  // namespace test_combinators
