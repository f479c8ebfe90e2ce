// The restart policies through the real agent: the real elasticrun (agent-elasticrun, whose
// default policy make_default_policy builds from --max-restarts and the --restart-* options) and
// examples/custom_policy.cpp (policy-custom-launcher) supervising agent-worker processes that
// fail on purpose.
#include "agent_support.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace test_launch_policies {

using agent_support::launched;
using agent_support::temp_dir;

std::string policy_elasticrun() { return agent_support::elasticrun(); }
std::string custom_launcher() { return ELASTIC_TEST_PROGRAM_DIR "/policy-custom-launcher"; }

using agent_support::worker_env;

agent_support::result run(const std::string& launcher, std::vector<std::string> args,
                          const std::map<std::string, std::string>& env) {
    args.push_back(agent_support::worker());
    launched l(args, env, launcher);
    agent_support::result r;
    r.code = l.wait();
    r.out = l.out();
    r.err = l.err();
    return r;
}

/// The CLOCK_MONOTONIC start time of each attempt, from the workers' "running <attempt> <rank>
/// <ns>" lines (rank 0).
std::vector<std::int64_t> start_times(const std::string& out) {
    std::vector<std::int64_t> starts;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
        int attempt = -1;
        int rank = -1;
        long long ns = 0;
        if (std::sscanf(line.c_str(), "running %d %d %lld", &attempt, &rank, &ns) == 3 && rank == 0) {
            REQUIRE(attempt == static_cast<int>(starts.size()));
            starts.push_back(ns);
        }
    }
    return starts;
}

TEST_CASE("policy: elasticrun --restart-backoff restarts a failing worker after growing delays, in order") {
    temp_dir dir;
    // Attempts 0, 1 and 2 fail; attempt 3 succeeds.
    auto r = run(policy_elasticrun(), {"--nproc-per-node=1", "--max-restarts=3", "--restart-backoff=100ms:10s"},
                 worker_env(dir, "a3:running;*:running+exit1"));
    INFO(r.err);
    CHECK(r.code == 0);
    // The agent's log names each restart with its reason (budget, then backoff, failure 1, 2,
    // 3) and its wait, logged as the wait starts; the reasons cite the options given.
    const std::regex reason(
        R"(restart (\d) of 3 \(--max-restarts=3\); after (\d+) ms backoff \(failure (\d) in a row; --restart-backoff=100ms:10s\): restarting the worker group in (\d+) ms)");
    std::vector<int> delays_ms;
    int n = 0;
    for (auto it = std::sregex_iterator(r.err.begin(), r.err.end(), reason); it != std::sregex_iterator(); ++it) {
        ++n;
        CHECK((*it)[1].str() == std::to_string(n));
        CHECK((*it)[3].str() == std::to_string(n));
        CHECK((*it)[4].str() == (*it)[2].str());
        delays_ms.push_back(std::stoi((*it)[2].str()));
    }
    REQUIRE(delays_ms.size() == 3);
    // 100 ms doubled each time, shortened by at most 10 % of jitter: strictly growing.
    const int base[] = {100, 200, 400};
    for (std::size_t i = 0; i < 3; ++i) {
        CHECK(delays_ms[i] <= base[i]);
        CHECK(delays_ms[i] >= base[i] * 9 / 10);
    }
    CHECK(delays_ms[0] < delays_ms[1]);
    CHECK(delays_ms[1] < delays_ms[2]);
    // Each replacement started no sooner than its backoff allows (a lower bound, which only a
    // wrong implementation can miss: the delay lies between one start and the next).
    const auto starts = start_times(r.out);
    REQUIRE(starts.size() == 4);
    for (std::size_t i = 0; i < 3; ++i) {
        CHECK(starts[i + 1] - starts[i] >= std::int64_t{delays_ms[i]} * 1'000'000);
    }
}

TEST_CASE("policy: elasticrun --restart-window stops the job once the window is spent, with its reason") {
    temp_dir dir;
    auto r = run(policy_elasticrun(), {"--restart-window=2/1h"}, worker_env(dir, "*:running+exit1"));
    INFO(r.err);
    CHECK(r.code == 1);
    CHECK(start_times(r.out).size() == 3);
    CHECK(r.err.find("restart 1 of 2 within 1 h (--restart-window=2/1h): restarting") != std::string::npos);
    CHECK(r.err.find("restart 2 of 2 within 1 h (--restart-window=2/1h): restarting") != std::string::npos);
    CHECK(r.err.find("the restart window is spent: 2 restarts within the last 1 h, the first ") != std::string::npos);
    CHECK(r.err.find("(--restart-window=2/1h): stopping") != std::string::npos);
}

TEST_CASE("policy: elasticrun --restart-on-exit retries its codes and stops at once on any other") {
    temp_dir dir;
    auto r = run(policy_elasticrun(), {"--max-restarts=5", "--restart-on-exit=75,signals"},
                 worker_env(dir, "a0:running+exit75;a1:running+sig9;*:running+exit3"));
    INFO(r.err);
    CHECK(r.code == 3);
    CHECK(start_times(r.out).size() == 3);
    CHECK(r.err.find("local_rank 0 exited with code 75: retryable (--restart-on-exit=75,signals); restart 1 of 5") !=
          std::string::npos);
    CHECK(r.err.find("local_rank 0 killed by signal 9 (SIGKILL): retryable") != std::string::npos);
    CHECK(r.err.find("local_rank 0 exited with code 3: not retryable, stopping at once "
                     "(--restart-on-exit=75,signals): stopping") != std::string::npos);
}

TEST_CASE("policy: elasticrun --restart-crash-guard does not retry a crash at start-up") {
    temp_dir dir;
    auto env = worker_env(dir, "*:running+exit1");
    env["PET_RESTART_CRASH_GUARD"] = "1h";  // through its PET_ variable, as any option
    auto r = run(policy_elasticrun(), {"--max-restarts=5"}, env);
    INFO(r.err);
    CHECK(r.code == 1);
    CHECK(start_times(r.out).size() == 1);
    CHECK(r.err.find("within the crash-loop guard of 1 h: not retried (--restart-crash-guard=1h): stopping") !=
          std::string::npos);
}

TEST_CASE("policy: the custom-policy example restarts through its own coroutine, and stops on its check") {
    temp_dir dir;
    SUBCASE("it awaits its timer, then restarts with its reason after the backoff") {
        auto r = run(custom_launcher(), {"--nproc-per-node=2"},
                     worker_env(dir, "a0r1:running+exit1;a0:hang;*:running"));
        INFO(r.err);
        CHECK(r.code == 0);
        CHECK(agent_support::launched::count_lines(r.out, "running 0 1 ") == 1);
        CHECK(agent_support::launched::count_lines(r.out, "running 1 ") == 2);
        // Its built-in parts cite themselves as its code wrote them, not as options nobody gave;
        // the backoff's wait is announced as it starts, and the restart is not logged twice.
        CHECK(r.err.find("local_rank 1 exited with code 1: retryable (restart_on_exit(\"1,signals\")); settled 500 ms, "
                         "no hold file; restart 1 of 3 (max_restarts(3)); after ") != std::string::npos);
        CHECK(r.err.find("(failure 1 in a row; backoff(1s, 1min)): restarting the worker group in ") !=
              std::string::npos);
        CHECK(r.err.find("--") == std::string::npos);
        const auto once = r.err.find("restarting the worker group");
        CHECK(once != std::string::npos);
        CHECK(r.err.find("restarting the worker group", once + 1) == std::string::npos);
    }
    SUBCASE("the hold file stops it") {
        auto env = worker_env(dir, "*:running+exit1");
        const auto hold = (dir.path() / "hold").string();
        std::ofstream(hold) << "hold\n";
        env["CUSTOM_POLICY_HOLD_FILE"] = hold;
        auto r = run(custom_launcher(), {}, env);
        INFO(r.err);
        CHECK(r.code == 1);
        CHECK(start_times(r.out).size() == 1);
        CHECK(r.err.find(fmt::format("the hold file {} exists: not restarting after 1 failure(s): stopping", hold)) !=
              std::string::npos);
    }
    SUBCASE("an exit code outside its set stops before its timer") {
        auto r = run(custom_launcher(), {}, worker_env(dir, "*:running+exit2"));
        CHECK(r.code == 2);
        CHECK(r.err.find("exited with code 2: not retryable, stopping at once (restart_on_exit(\"1,signals\"))") !=
              std::string::npos);
        CHECK(r.err.find("settled") == std::string::npos);
    }
    SUBCASE("restart options on its command line are not read, and it says so") {
        auto r = run(custom_launcher(), {"--max-restarts=5", "--restart-backoff=1:2"},
                     worker_env(dir, "*:running+exit2"));
        CHECK(r.code == 2);
        CHECK(r.err.find("--max-restarts=5, --restart-backoff=1") != std::string::npos);
        CHECK(r.err.find(": not read: this launcher's restart policy is set in its code") != std::string::npos);
        CHECK(start_times(r.out).size() == 1);
    }
}

}  // namespace test_launch_policies
