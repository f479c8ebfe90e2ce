// custom_policy: a complete launcher (torchrun's command line) whose restart policy is a
// coroutine of its own — it awaits a timer, then a check of the user's — composed with the
// built-in policies. See docs/policies.md.
//
//     custom-policy --nproc-per-node=4 ./train --epochs=10
//
// Restarts the group after a failure only when the first worker to fail exited with code 1 or
// was killed by a signal, at most 3 times, after letting the node settle for half a second and
// only while no hold file exists ($CUSTOM_POLICY_HOLD_FILE, for an operator who wants the job
// to stop rather than retry), and with a backoff of 1 s, 2 s, 4 s ... between attempts.
#include "elastic/policy.hpp"
#include "elastic/run.hpp"

#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

/// The user's policy: any type whose call is a coroutine answering restart or stop.
struct settle_then_check {
    std::chrono::milliseconds settle;

    asio::awaitable<elastic::restart_decision> operator()(const elastic::group_failure& failure) const {
        // A timer of our own. The agent races the policy against the signals it handles, so a
        // SIGTERM during this wait ends the agent at once (the timer is cancelled).
        asio::steady_timer timer(co_await asio::this_coro::executor, settle);
        co_await timer.async_wait(asio::use_awaitable);

        // A check of our own: anything awaitable would do (a store key, a health probe, ...).
        const char* hold = std::getenv("CUSTOM_POLICY_HOLD_FILE");
        if (hold != nullptr && *hold != '\0' && std::filesystem::exists(hold)) {
            co_return elastic::restart_decision::stop_because(fmt::format(
                "the hold file {} exists: not restarting after {} failure(s)", hold, failure.failures().size()));
        }
        co_return elastic::restart_decision::restart_because(fmt::format("settled {} ms, no hold file",
                                                                         settle.count()));
    }
};

static_assert(elastic::restart_policy<settle_then_check>);

int main(int argc, char** argv) {
    using namespace std::chrono_literals;
    // The first part to answer stop decides; the built-in parts' delays (the backoff) come
    // after every part has said restart, so a stop never waits for a backoff.
    return elastic::run(argc, argv,
                        elastic::restart_on_exit("1,signals") | settle_then_check{500ms} | elastic::max_restarts(3) |
                            elastic::backoff(1s, 1min));
}
