// examples/custom_agent.cpp (agent-custom-agent), a launcher whose loop is its own, run like
// elasticrun: a failure, a restart, an error file, the log tree and event log, a 2-node round.
#include "agent_support.hpp"

#include "elastic/agent.hpp"
#include "elastic/policy.hpp"
#include "elastic/run.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace test_custom_agent {

using agent_support::launched;
using agent_support::temp_dir;

std::string custom_agent() { return ELASTIC_TEST_PROGRAM_DIR "/agent-custom-agent"; }

std::map<std::string, std::string> quiet_worker_env(const temp_dir& dir, const std::string& rules) {
    auto env = agent_support::worker_env(dir, rules);
    env["LOGLEVEL"] = "WARNING";
    return env;
}

agent_support::result run(std::vector<std::string> args, const std::map<std::string, std::string>& env) {
    args.push_back(agent_support::worker());
    launched l(args, env, custom_agent());
    agent_support::result r;
    r.code = l.wait();
    r.out = l.out();
    r.err = l.err();
    return r;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// The example's line for attempt `n`, "custom-agent: attempt N on port P: KIND", as {P, KIND}.
std::pair<int, std::string> attempt_line(const std::string& err, int n) {
    const auto head = fmt::format("custom-agent: attempt {} on port ", n);
    const auto at = err.find(head);
    if (at == std::string::npos) return {-1, ""};
    const auto line = err.substr(at + head.size(), err.find('\n', at) - at - head.size());
    const auto colon = line.find(": ");
    if (colon == std::string::npos) return {-1, ""};
    return {std::stoi(line.substr(0, colon)), line.substr(colon + 2)};
}

std::string read_file(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::ostringstream all;
    all << in.rdbuf();
    return all.str();
}

TEST_CASE("custom agent: a worker asking to retry (75) is restarted by the example's own loop, then the job succeeds") {
    temp_dir dir;
    const auto logs = dir.path() / "logs";
    const auto events = dir.path() / "events.jsonl";
    auto r = run({"--nproc-per-node=2", "--log-dir=" + logs.string(), "--redirects=3", "--rdzv-id=custom",
                  "--event-log-handler=file:" + events.string()},
                 quiet_worker_env(dir, "a0r1:running+exit75;a0:hang;*:running"));
    INFO(r.err);
    CHECK(r.code == 0);
    const auto first = attempt_line(r.err, 0);
    CHECK(first.first > 0);
    CHECK(first.second == "failed");
    CHECK(has(r.err, "worker group failed (local_rank 1 exited with code 75); retry 1 of 3 asked for: restarting "
                     "the worker group"));
    const auto second = attempt_line(r.err, 1);
    CHECK(second.first > 0);
    CHECK(second.second == "succeeded");
    CHECK(has(r.err, "custom-agent: the job ends with 0\n"));
    // The log tree, per attempt and local rank, as elasticrun writes it.
    std::vector<std::filesystem::path> runs;
    for (const auto& entry : std::filesystem::directory_iterator(logs)) runs.push_back(entry.path());
    REQUIRE(runs.size() == 1);
    CHECK(has(read_file(runs[0] / "attempt_0" / "1" / "stdout.log"), "running 0 1 "));
    CHECK(has(read_file(runs[0] / "attempt_1" / "0" / "stdout.log"), "running 1 0 "));
    // The event log: the policy's decision to restart, then the job's success.
    int restarts = 0;
    int successes = 0;
    std::istringstream lines(read_file(events));
    for (std::string line; std::getline(lines, line);) {
        const auto record = nlohmann::json::parse(line);
        const auto metadata = record.dump();
        if (has(metadata, "\"action\":\"restart\"")) ++restarts;
        if (has(metadata, "SUCCEEDED")) ++successes;
    }
    CHECK(restarts == 1);
    CHECK(successes >= 1);
}

TEST_CASE("custom agent: another failure stops the job with the root cause's code, the summary and the error file") {
    temp_dir dir;
    auto env = quiet_worker_env(dir, "r0:running+exit3;*:hang");
    const auto error_file = dir.path() / "agent_error.json";
    env["TORCHELASTIC_ERROR_FILE"] = error_file.string();
    auto r = run({"--nproc-per-node=2"}, env);
    INFO(r.err);
    CHECK(r.code == 3);
    CHECK(has(r.err, "worker group failed (local_rank 0 exited with code 3); no retry asked for, or 3 done: stopping"));
    CHECK(has(r.err, "Root Cause (first observed failure):"));
    CHECK(has(r.err, "custom-agent: the job ends with 3\n"));
    CHECK(attempt_line(r.err, 0).second == "failed");
    CHECK(attempt_line(r.err, 1).first == -1);  // no retry: 3 is not 75
    REQUIRE(std::filesystem::exists(error_file));
    const auto document = nlohmann::json::parse(read_file(error_file));
    CHECK(document["message"]["errorCode"] == 3);
}

TEST_CASE("custom agent: two nodes over c10d: a failure on one restarts both, and the second round gives every "
          "worker the job's ranks") {
    temp_dir dir;
    const int port = agent_support::free_port();
    std::vector<std::unique_ptr<launched>> nodes;
    for (int node = 0; node < 2; ++node) {
        auto env = quiet_worker_env(dir, "a0r1:exit75;a0:hang;*:env");
        env["RDZV_TEST_NODE"] = std::to_string(node);
        nodes.push_back(std::make_unique<launched>(
            std::vector<std::string>{"--rdzv-backend=c10d", fmt::format("--rdzv-endpoint=127.0.0.1:{}", port),
                                     "--rdzv-id=custom2", "--nnodes=2", "--nproc-per-node=1", agent_support::worker()},
            env, custom_agent()));
    }
    std::vector<int> codes;
    for (auto& n : nodes) codes.push_back(n->wait());
    int decided = 0;
    int followed = 0;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
        const auto& err = nodes[i]->err();
        INFO(err);
        CHECK(codes[i] == 0);
        CHECK(has(err, "restarting every node's worker group (job-wide restart 1)"));
        CHECK(has(err, "custom-agent: the job ends with 0\n"));
        decided += attempt_line(err, 0).second == "failed" ? 1 : 0;
        followed += attempt_line(err, 0).second == "follows" ? 1 : 0;
        CHECK(attempt_line(err, 1).second == "succeeded");
    }
    CHECK(decided == 1);
    CHECK(followed == 1);
    std::vector<std::string> nodes_seen;
    for (int rank = 0; rank < 2; ++rank) {
        CAPTURE(rank);
        const auto e = agent_support::read_env_file(dir.path() / fmt::format("env.1.{}", rank));
        REQUIRE(!e.empty());
        CHECK(e.at("RANK") == std::to_string(rank));
        CHECK(e.at("WORLD_SIZE") == "2");
        CHECK(e.at("GROUP_WORLD_SIZE") == "2");
        CHECK(e.at("TORCHELASTIC_RESTART_COUNT") == "1");
        nodes_seen.push_back(e.at("RDZV_TEST_NODE"));
    }
    CHECK(nodes_seen[0] != nodes_seen[1]);
}

/// What an in-process run's exception says: "none", the text of an `Error`, or "not a NAME: ..."
/// for any other exception.
template <class Error>
std::string error_text(std::exception_ptr e, std::string_view name) {
    if (!e) return "none";
    try {
        std::rethrow_exception(e);
    } catch (const Error& failure) {
        return failure.what();
    } catch (const std::exception& other) {
        return fmt::format("not {}: {}", name, other.what());
    }
}

/// A loop that breaks the steps' rules, one way per `mode`.
struct misusing_loop {
    int mode = 0;

    template <class Job>
    asio::awaitable<int> operator()(Job& job) const {
        auto step = co_await job.attempt();  // rank 0 exits 3: a failed step
        auto policy = elastic::max_restarts(0);
        if (mode == 0) (void)co_await job.finish(step);
        if (mode == 1) (void)co_await job.attempt();
        if (mode == 2) {
            const auto stopped = co_await job.decide(step, policy);
            CHECK(stopped == std::optional<int>(3));
            (void)co_await job.decide(step, policy);
        }
        if (mode == 3) {
            auto made_up = step;
            made_up.attempt_id = 7;
            (void)co_await job.decide(made_up, policy);
        }
        // mode 4: returns with the failed step not concluded
        co_return 0;
    }
};

/// What local_agent::run_loop accepts: a loop over either rendezvous model's job.
template <class L>
concept runnable_loop = requires(elastic::local_agent& agent, L& loop) {
    agent.run_loop(loop);
};
struct not_a_loop {
    int operator()(int) const { return 0; }
};
static_assert(runnable_loop<misusing_loop>);
static_assert(!runnable_loop<not_a_loop>);
static_assert(!runnable_loop<int>);

TEST_CASE("custom agent: a loop that breaks the steps' rules gets agent_error naming the rule (in-process)") {
    temp_dir dir;
    const auto env_map = quiet_worker_env(dir, "r0:exit3;*:hang");
    const elastic::environment env(env_map.begin(), env_map.end());
    elastic::worker_spec workers;
    workers.program.target = agent_support::worker();
    workers.nproc_per_node = 2;
    const std::vector<std::pair<int, std::string>> cases{
        {0, "job::finish() is for a step that succeeded, and this one failed"},
        {1, "job::attempt() while attempt 1's step is not concluded"},
        {2, "job::decide() on a step that is not the open one (attempt 1 of 1, none open)"},
        {3, "job::decide() on a step that is not the open one (attempt 7 of 1)"},
        {4, "the agent's loop returned 0 with attempt 1's step (failed) not concluded"},
    };
    for (const auto& each : cases) {
        const int mode = each.first;  // a structured binding cannot be captured by CAPTURE's lambda in clang 14
        const auto& expected = each.second;
        CAPTURE(mode);
        asio::io_context io;
        elastic::local_agent agent(io.get_executor(), workers, elastic::rendezvous_parameters{},
                                   elastic::agent_options{}, env, "agent-test");
        misusing_loop loop{mode};
        std::string error = "none";
        asio::co_spawn(io, agent.run_loop(loop), [&](std::exception_ptr e, int) {
            error = error_text<elastic::agent_error>(e, "an agent_error");
        });
        io.run();
        CHECK(has(error, expected));
    }
}

/// single_node_rendezvous whose rounds `forge` rewrites: an assignment no agent of the job wrote,
/// as a client that writes into the rendezvous store could make one.
struct forging_rendezvous : elastic::single_node_rendezvous {
    std::function<void(elastic::rendezvous_round&)> forge;

    asio::awaitable<elastic::rendezvous_round> next_round(elastic::node_info me) {
        auto round = co_await elastic::single_node_rendezvous::next_round(std::move(me));
        forge(round);
        co_return round;
    }
};
static_assert(elastic::agent_rendezvous<forging_rendezvous>);

/// One attempt, which must succeed, then the exit barrier.
struct attempt_once_loop {
    template <class Job>
    asio::awaitable<int> operator()(Job& job) const {
        auto step = co_await job.attempt();
        REQUIRE(std::string(step.name(step.how)) == "succeeded");
        const std::optional<int> code = co_await job.finish(step);
        co_return code.value_or(-1);
    }
};

TEST_CASE("custom agent: an assignment beyond the round's worlds is refused before a worker starts (in-process)") {
    elastic::worker_spec workers;
    workers.program.target = agent_support::worker();
    workers.nproc_per_node = 2;
    struct forgery {
        std::string what;
        std::function<void(elastic::rendezvous_round&)> forge;
        std::string expected;  // empty: the round is the agent's own, and the job succeeds
    };
    const std::vector<forgery> cases{
        {"none", [](elastic::rendezvous_round&) {}, ""},
        {"rank base", [](elastic::rendezvous_round& r) { r.rank_base = 1; }, "ranks 1.. of 2 and role ranks 0.. of 2"},
        {"world size", [](elastic::rendezvous_round& r) { r.world_size = 1; },
         "ranks 0.. of 1 and role ranks 0.. of 2"},
        {"role rank base", [](elastic::rendezvous_round& r) { r.role_rank_base = 1; },
         "ranks 0.. of 2 and role ranks 1.. of 2"},
        {"role world size", [](elastic::rendezvous_round& r) { r.role_world_size = 3; },
         "ranks 0.. of 2 and role ranks 0.. of 3"},
        {"no role fields", [](elastic::rendezvous_round& r) { r.role_rank_base = r.role_world_size = -1; }, ""},
    };
    for (const auto& each : cases) {
        CAPTURE(each.what);
        temp_dir dir;
        const auto env_map = quiet_worker_env(dir, "*:env");
        const elastic::environment env(env_map.begin(), env_map.end());
        asio::io_context io;
        elastic::local_agent agent(io.get_executor(), workers, elastic::rendezvous_parameters{},
                                   elastic::agent_options{}, env, "agent-test");
        forging_rendezvous rdzv;
        rdzv.forge = each.forge;
        attempt_once_loop loop;
        std::string error = "none";
        int code = -1;
        asio::co_spawn(io, agent.run_loop(loop, rdzv), [&](std::exception_ptr e, int c) {
            code = c;
            error = error_text<elastic::rendezvous_error>(e, "a rendezvous_error");
        });
        io.run();
        const bool started = std::filesystem::exists(dir.path() / "env.0.0");
        if (each.expected.empty()) {
            CHECK(error == "none");
            CHECK(code == 0);
            REQUIRE(started);
            for (int rank = 0; rank < 2; ++rank) {
                CAPTURE(rank);
                // Without the role fields (an older completer), the role is the whole world.
                const auto e = agent_support::read_env_file(dir.path() / fmt::format("env.0.{}", rank));
                CHECK(e.at("RANK") == std::to_string(rank));
                CHECK(e.at("ROLE_RANK") == std::to_string(rank));
                CHECK(e.at("ROLE_WORLD_SIZE") == "2");
            }
            continue;
        }
        CHECK(has(error, "rendezvous round 0: the assignment gives this node's 2 workers " + each.expected +
                             ", beyond the round: a client that is no agent of this job writes into the rendezvous "
                             "store; give the job a store of its own"));
        CHECK_FALSE(started);
    }
}

}  // namespace test_custom_agent
