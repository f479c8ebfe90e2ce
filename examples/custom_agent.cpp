// custom_agent: a complete launcher (torchrun's command line, one node or many) whose loop over
// the job is its own, made of the agent's steps. Its rule: a worker that exits with 75
// (EX_TEMPFAIL) asks for another attempt, at most 3 times; any other failure stops the job. It
// writes one line per attempt where a scheduler could read progress. The steps keep everything
// else: the rendezvous, the log tree, error files, the event log and the failure summary.
//
//     custom-agent --nproc-per-node=4 ./train --epochs=10
#include "elastic/run.hpp"

#include <asio/awaitable.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <optional>

asio::awaitable<elastic::restart_decision> retry_on_75(const elastic::group_failure& failure) {
    const auto* root = failure.root_cause();
    if (root != nullptr && root->status.returncode() == 75 && failure.restarts < 3) {
        co_return elastic::restart_decision::restart_because(fmt::format("retry {} of 3 asked for",
                                                                         failure.restarts + 1));
    }
    co_return elastic::restart_decision::stop_because("no retry asked for, or 3 done");
}

/// The loop: any type whose call, given the job, is a coroutine returning the exit code.
struct retrying_loop {
    template <class Job>
    asio::awaitable<int> operator()(Job& job) const {
        using kind = elastic::local_agent::step::kind;
        auto policy = retry_on_75;
        for (;;) {
            auto step = co_await job.attempt();
            fmt::print(stderr, "custom-agent: attempt {} on port {}: {}\n", job.restart_count(),
                       job.agent().master_port(), step.name(step.how));
            std::optional<int> code;
            if (step.how == kind::signaled) co_return co_await job.interrupted(step);
            if (step.how == kind::succeeded) code = co_await job.finish(step);
            if (step.how == kind::failed) code = co_await job.decide(step, policy);
            if (step.how == kind::follows) code = co_await job.follow(step);
            if (code) {
                fmt::print(stderr, "custom-agent: the job ends with {}\n", *code);
                co_return *code;
            }
        }
    }
};

int main(int argc, char** argv) { return elastic::run(argc, argv, retrying_loop{}); }
