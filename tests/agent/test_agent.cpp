// test-tags: concurrent
// The agent end to end: the real elasticrun (agent-elasticrun) starting agent-worker processes
// whose behaviour AGENT_WORKER_DO chooses; and the agent in-process under a custom policy.
#include "agent_support.hpp"
#include "process_support.hpp"

#include "elastic/agent.hpp"
#include "elastic/env.hpp"
#include "elastic/launch/cli.hpp"
#include "elastic/run.hpp"
#include "elastic/policy.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "idle_cpu.hpp"

#include <asio/co_spawn.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <unistd.h>
#include <sys/socket.h>

namespace test_agent {

using agent_support::launched;
using agent_support::temp_dir;
namespace fs = std::filesystem;

using agent_support::count_files;
using agent_support::with_worker;
using agent_support::worker_env;

TEST_CASE("agent: every worker gets torchrun's contract, key by key (inventory 2.1)") {
    temp_dir dir;
    auto env = worker_env(dir, "*:env");
    env["SOME_USER_VARIABLE"] = "kept";
    env["NCCL_ASYNC_ERROR_HANDLING"] = "0";  // an inherited value wins over the default 1
    const int n = 3;
    auto r = agent_support::run(with_worker({"--standalone", "--nproc-per-node=3", "--max-restarts=2",
                                             "--role=trainer"}),
                                env);
    INFO(r.err);
    REQUIRE(r.code == 0);
    std::set<std::string> ports;
    std::set<std::string> run_ids;
    for (int rank = 0; rank < n; ++rank) {
        const auto e = agent_support::read_env_file(dir.path() / fmt::format("env.0.{}", rank));
        REQUIRE(!e.empty());
        const std::map<std::string, std::string> expected{
            {"LOCAL_RANK", std::to_string(rank)},
            {"RANK", std::to_string(rank)},
            {"GROUP_RANK", "0"},
            {"ROLE_RANK", std::to_string(rank)},
            {"ROLE_NAME", "trainer"},
            {"LOCAL_WORLD_SIZE", "3"},
            {"WORLD_SIZE", "3"},
            {"GROUP_WORLD_SIZE", "1"},
            {"ROLE_WORLD_SIZE", "3"},
            {"MASTER_ADDR", "127.0.0.1"},
            {"TORCHELASTIC_RESTART_COUNT", "0"},
            {"TORCHELASTIC_MAX_RESTARTS", "2"},
            {"TORCHELASTIC_USE_AGENT_STORE", "True"},
            {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
            {"NCCL_ASYNC_ERROR_HANDLING", "0"},
            {"TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
            {"OMP_NUM_THREADS", "1"},
            {"SOME_USER_VARIABLE", "kept"},
        };
        for (const auto& entry : expected) {  // no structured binding: clang 14 cannot capture one
            INFO("rank " << rank << ": " << entry.first);
            REQUIRE(e.count(entry.first) == 1);
            CHECK(e.at(entry.first) == entry.second);
        }
        // MASTER_PORT: the store the agent hosts, on a kernel-chosen port.
        REQUIRE(e.count("MASTER_PORT") == 1);
        CHECK(std::stoi(e.at("MASTER_PORT")) > 0);
        ports.insert(e.at("MASTER_PORT"));
        // --standalone: a random UUID4 run id.
        run_ids.insert(e.at("TORCHELASTIC_RUN_ID"));
        CHECK(std::regex_match(e.at("TORCHELASTIC_RUN_ID"),
                               std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")));
        // The error file: torchrun's layout, <tmp>/torchelastic_*/<run_id>_*/attempt_0/<local_rank>/error.json.
        const auto& error_file = e.at("TORCHELASTIC_ERROR_FILE");
        CHECK(std::regex_match(error_file, std::regex(".*/torchelastic_[^/]+/" + e.at("TORCHELASTIC_RUN_ID") +
                                                      "_[^/]+/attempt_0/" + std::to_string(rank) + "/error\\.json")));
        // What elastic::env() makes of it.
        const auto parsed = elastic::worker_env::from(e);
        CHECK(parsed.rank == rank);
        CHECK(parsed.world_size == 3);
        CHECK(parsed.local_rank == rank);
        CHECK(parsed.local_world_size == 3);
        CHECK(parsed.node_rank == 0);
        CHECK(parsed.node_count == 1);
        CHECK(parsed.role_name == "trainer");
        CHECK(parsed.use_agent_store);
        CHECK(parsed.max_restarts == 2);
        CHECK(parsed.restart_count == 0);
        CHECK(parsed.master_addr == "127.0.0.1");
    }
    CHECK(ports.size() == 1);
    CHECK(run_ids.size() == 1);
    // torchrun's OMP_NUM_THREADS warning, once.
    CHECK(r.err.find("Setting OMP_NUM_THREADS environment variable for each process to be 1") != std::string::npos);
}

TEST_CASE("agent: OMP_NUM_THREADS is kept when set, and not set for a single worker") {
    temp_dir dir;
    auto env = worker_env(dir, "*:env");
    env["OMP_NUM_THREADS"] = "7";
    auto r = agent_support::run(with_worker({"--nproc-per-node=2"}), env);
    REQUIRE(r.code == 0);
    CHECK(agent_support::read_env_file(dir.path() / "env.0.1").at("OMP_NUM_THREADS") == "7");
    CHECK(r.err.find("OMP_NUM_THREADS") == std::string::npos);
    env.erase("OMP_NUM_THREADS");
    r = agent_support::run(with_worker({"--nproc-per-node=1"}), env);
    REQUIRE(r.code == 0);
    CHECK(agent_support::read_env_file(dir.path() / "env.0.0").count("OMP_NUM_THREADS") == 0);
}

TEST_CASE("agent: arguments pass through untouched, ${local_rank} replaced per worker") {
    temp_dir dir;
    auto r = agent_support::run(with_worker({"--nproc-per-node=2"}, {"--lr=${local_rank}", "$local_rank", "--help",
                                                                     "--", "$$x", "${LOCAL_RANK}"}),
                                worker_env(dir, "*:argv"));
    REQUIRE(r.code == 0);
    for (int rank = 0; rank < 2; ++rank) {
        const auto argv = agent_support::read_lines_of(dir.path() / fmt::format("argv.0.{}", rank));
        const std::vector<std::string> expected{
            agent_support::worker(), fmt::format("--lr={}", rank), std::to_string(rank), "--help", "--", "$x",
            "${LOCAL_RANK}"};
        CHECK(argv == expected);
    }
}

TEST_CASE("agent: a failure stops the group and restarts it, workers see the count and a clean store") {
    temp_dir dir;
    // Attempt 0: rank 1 fails; attempt 1: rank 0 is killed by a signal; attempt 2: all succeed.
    // Every worker of every attempt first checks that no key of an earlier attempt is visible
    // in the hosted store, then writes one; the failing worker waits for the others' keys.
    auto r = agent_support::run(
        with_worker({"--nproc-per-node=3", "--max-restarts=2"}),
        worker_env(dir, "a0r1:env+store+waitfor0+waitfor2+exit3;a1r0:env+store+waitfor1+waitfor2+sig9;"
                        "a0:env+store+hang;"
                        "a1:env+store+hang;*:env+store"));
    INFO(r.err);
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK(r.out.find("STALE") == std::string::npos);
    for (int attempt = 0; attempt < 3; ++attempt) {
        std::set<std::string> ports;
        for (int rank = 0; rank < 3; ++rank) {
            const auto e = agent_support::read_env_file(dir.path() / fmt::format("env.{}.{}", attempt, rank));
            REQUIRE(e.count("TORCHELASTIC_RESTART_COUNT") == 1);
            CHECK(e.at("TORCHELASTIC_RESTART_COUNT") == std::to_string(attempt));
            CHECK(e.at("TORCHELASTIC_ERROR_FILE").find(fmt::format("/attempt_{}/{}/", attempt, rank)) !=
                  std::string::npos);
            ports.insert(e.at("MASTER_PORT"));
        }
        CHECK(ports.size() == 1);
    }
    CHECK(count_files(dir.path(), "env.3.") == 0);
    CHECK(launched::count_lines(r.out, "store ok") == 9);
    CHECK(r.err.find("failed (exitcode: 3) local_rank: 1") != std::string::npos);
    CHECK(r.err.find("failed (exitcode: -9) local_rank: 0") != std::string::npos);
    CHECK(r.err.find("restart 1 of 2 (--max-restarts=2)") != std::string::npos);
    CHECK(r.err.find("restart 2 of 2 (--max-restarts=2)") != std::string::npos);
}

TEST_CASE("agent: the budget spent, elasticrun ends with the root cause's code and torchrun's summary") {
    temp_dir dir;
    SUBCASE("an exit code") {
        auto r = agent_support::run(with_worker({"--nproc-per-node=2", "--max-restarts=1"}),
                                    worker_env(dir, "r1:env+stderr+waitfor0+exit7;*:env+store+hang"));
        CHECK(r.code == 7);
        CHECK(count_files(dir.path(), "env.0.") == 2);
        CHECK(count_files(dir.path(), "env.1.") == 2);
        CHECK(count_files(dir.path(), "env.2.") == 0);
        CHECK(r.err.find("the restart budget is spent: 1 of 1 restarts made (--max-restarts=1)") != std::string::npos);
        const auto summary = r.err.substr(r.err.find("\n=====") + 1);
        CHECK(summary.find(agent_support::worker() + " FAILED") != std::string::npos);
        CHECK(summary.find("Root Cause (first observed failure):") != std::string::npos);
        CHECK(summary.find("  rank      : 1 (local_rank: 1)") != std::string::npos);
        CHECK(summary.find("  exitcode  : 7 (pid: ") != std::string::npos);
        // The stderr tail of the native worker, including its unterminated last line.
        CHECK(summary.find("stderr (3 lines):") != std::string::npos);
        CHECK(summary.find("    last words of rank 1") != std::string::npos);
        CHECK(summary.find("Stopped by the agent (not failures):") != std::string::npos);
        CHECK(summary.find("  rank 0 (local_rank: 0): exitcode -15") != std::string::npos);
        // The worker's stderr was relayed whole lines at a time.
        CHECK(r.err.find("line 1 from rank 1\nline 2 from rank 1\n") != std::string::npos);
    }
    SUBCASE("a signal: 128 + N") {
        auto r = agent_support::run(with_worker({"--nproc-per-node=2"}), worker_env(dir, "r0:sig6;*:hang"));
        CHECK(r.code == 128 + SIGABRT);
        CHECK(r.err.find("Signal 6 (SIGABRT) received by PID") != std::string::npos);
    }
    SUBCASE("the agent's own error file gets the root cause") {
        auto env = worker_env(dir, "*:exit4");
        env["TORCHELASTIC_ERROR_FILE"] = (dir.path() / "agent-error.json").string();
        auto r = agent_support::run(with_worker({"--nproc-per-node=1"}), env);
        CHECK(r.code == 4);
        const auto text = agent_support::read_lines_of(dir.path() / "agent-error.json");
        REQUIRE(!text.empty());
        const auto json = nlohmann::json::parse(fmt::format("{}", fmt::join(text, "\n")));
        CHECK(json["message"]["errorCode"] == 4);
    }
}

TEST_CASE("agent: a signal to the agent is forwarded to every worker and elasticrun exits 128+N") {
    struct signal_case {
        int sig;
        std::vector<std::string> options;
    };
    const std::vector<signal_case> cases{
        {SIGTERM, {}},
        {SIGINT, {}},
        {SIGHUP, {}},
        {SIGQUIT, {}},
        {SIGUSR1, {"--signals-to-handle=SIGTERM,SIGUSR1"}},
        {SIGUSR2, {"--signals_to_handle=USR2"}},
    };
    for (const auto& c : cases) {
        CAPTURE(c.sig);
        temp_dir dir;
        auto options = c.options;
        options.push_back("--nproc-per-node=3");
        launched agent(with_worker(options), worker_env(dir, "*:trap"));
        REQUIRE(agent.read_lines("ready ", 3));
        agent.signal(c.sig);
        const int code = agent.wait();
        CHECK(code == 128 + c.sig);
        for (int rank = 0; rank < 3; ++rank) {
            CHECK(agent.out().find(fmt::format("got {} {}\n", rank, c.sig)) != std::string::npos);
        }
    }
}

TEST_CASE("agent: a daemon a worker started ends when the worker ends, and when the agent is SIGKILLed") {
    // process-worker daemon: fork, setsid, fork — the daemon leaves the worker's process group
    // and session, and says "grandchild <pid>". Only the worker's cgroup reaches it.
    if (const std::string why = process_support::cgroup_unavailable(); !why.empty()) {
        MESSAGE("skipped: no cgroup for workers: " << why);
        return;
    }
    const auto daemons = [](const std::string& out) {
        std::vector<pid_t> pids;
        std::istringstream in(out);
        for (std::string line; std::getline(in, line);) {
            if (line.rfind("grandchild ", 0) == 0) pids.push_back(static_cast<pid_t>(std::stoi(line.substr(11))));
        }
        return pids;
    };
    const auto env = agent_support::clean_environment();
    SUBCASE("the workers exit 0") {
        launched agent({"--nproc-per-node=2", process_support::worker_program(), "daemon", "exit"}, env);
        CHECK(agent.wait() == 0);
        INFO(agent.err());
        const auto pids = daemons(agent.out());
        REQUIRE(pids.size() == 2);
        CHECK(process_support::await_deaths(pids, std::chrono::seconds(60)).empty());
    }
    SUBCASE("the agent is SIGKILLed") {
        launched agent({"--nproc-per-node=2", process_support::worker_program(), "daemon"}, env);
        REQUIRE(agent.read_lines("ready", 2));
        const auto pids = daemons(agent.out());
        REQUIRE(pids.size() == 2);
        for (pid_t pid : pids) CHECK(process_support::alive(pid));
        agent.signal(SIGKILL);
        CHECK(agent.wait() == 128 + SIGKILL);
        CHECK(process_support::await_deaths(pids, std::chrono::seconds(60)).empty());
    }
}

TEST_CASE("agent: a worker that ignores the signal is killed after --shutdown-timeout") {
    temp_dir dir;
    auto env = worker_env(dir, "r0:ignore;*:hang");
    SUBCASE("from the option") {
        launched agent(with_worker({"--nproc-per-node=2", "--shutdown-timeout=0.2"}), env);
        REQUIRE(agent.read_lines("ready ", 2));
        agent.signal(SIGTERM);
        CHECK(agent.wait() == 128 + SIGTERM);
    }
    SUBCASE("from TORCH_ELASTIC_SHUTDOWN_TIMEOUT") {
        env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "0.2";
        launched agent(with_worker({"--nproc-per-node=2"}), env);
        REQUIRE(agent.read_lines("ready ", 2));
        agent.signal(SIGINT);
        CHECK(agent.wait() == 128 + SIGINT);
    }
}

TEST_CASE("agent: with healthy workers running, the agent uses no CPU, and two jobs on one host never collide") {
    temp_dir dir;
    temp_dir runtime;  // where the agent writes its status file, watched from before it starts
    fs::permissions(runtime.path(), fs::perms::owner_all, fs::perm_options::replace);
    const auto status_dir = runtime.path() / "elastic";
    fs::create_directory(status_dir);
    fs::permissions(status_dir, fs::perms::owner_all, fs::perm_options::replace);
    const int writes = ::inotify_init1(IN_CLOEXEC);
    REQUIRE(writes >= 0);
    REQUIRE(::inotify_add_watch(writes, status_dir.c_str(), IN_MOVED_TO) >= 0);
    auto env = worker_env(dir, "*:env+hang");
    env["XDG_RUNTIME_DIR"] = runtime.str();
    launched first(with_worker({"--standalone", "--nproc-per-node=4"}), env);
    REQUIRE(first.read_lines("ready ", 4));
    const auto first_port = agent_support::read_env_file(dir.path() / "env.0.0").at("MASTER_PORT");
    // The window starts once the agent wrote its status as running: nothing changes after that,
    // and an unchanged status is written again only 10 s later.
    const auto file = status_dir / fmt::format("{}.json", first.pid());
    bool running = false;
    for (int write = 0; write < 20 && !running; ++write) {
        std::ifstream in(file);
        std::stringstream text;
        text << in.rdbuf();
        const auto shown = elastic::parse_status_json(text.str());
        running = shown && shown->state == "running";
        if (running) break;
        pollfd p{writes, POLLIN, 0};
        REQUIRE(::poll(&p, 1, 30000) == 1);
        char events[4096];
        REQUIRE(::read(writes, events, sizeof events) > 0);
    }
    REQUIRE(running);
    // Writes seen so far (the file may have said running before any event was read).
    for (pollfd p{writes, POLLIN, 0}; ::poll(&p, 1, 0) == 1;) {
        char events[4096];
        REQUIRE(::read(writes, events, sizeof events) > 0);
    }
    const auto before = idle_cpu::cpu_time(first.pid());
    std::this_thread::sleep_for(std::chrono::seconds(2));  // the measurement window itself
    const auto after = idle_cpu::cpu_time(first.pid());
    pollfd rewritten{writes, POLLIN, 0};
    CHECK(::poll(&rewritten, 1, 0) == 0);  // an unchanged status is not written again in the window
    ::close(writes);
    REQUIRE(before.count() >= 0);
    INFO("the agent's CPU in the 2 s window: ", idle_cpu::ms(after - before), " ms");
    CHECK(after - before <= idle_cpu::budget);

    temp_dir dir2;
    auto env2 = worker_env(dir2, "*:env+hang");
    launched second(with_worker({"--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--nnodes=1",
                                 "--nproc-per-node=2"}),
                    env2);
    REQUIRE(second.read_lines("ready ", 2));
    const auto second_port = agent_support::read_env_file(dir2.path() / "env.0.0").at("MASTER_PORT");
    CHECK(first_port != second_port);
    first.signal(SIGTERM);
    second.signal(SIGTERM);
    CHECK(first.wait() == 128 + SIGTERM);
    CHECK(second.wait() == 128 + SIGTERM);
}

TEST_CASE("agent: the agent takes the hard open-files limit for its stores, workers get the user's") {
    rlimit limit{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &limit) == 0);
    if (limit.rlim_max <= 512) {
        MESSAGE("the hard open-files limit is ", limit.rlim_max, ": nothing to raise");
        return;
    }
    // The worker prints its own soft limit and the agent's (its parent's) soft and hard ones.
    const std::string worker_script = "echo worker-soft $(ulimit -Sn); grep 'Max open files' /proc/$PPID/limits";
    auto r = agent_support::run({"/bin/sh", "-c", "ulimit -Sn 512 && exec \"$0\" \"$@\"", agent_support::elasticrun(),
                                 "--standalone", "--nproc-per-node=1", "--no-python", "/bin/sh", "-c", worker_script},
                                agent_support::clean_environment());
    INFO("stdout: ", r.out, "\nstderr: ", r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("worker-soft 512\n") != std::string::npos);
    const std::regex agent_line(R"(Max open files +([0-9]+) +([0-9]+))");
    std::smatch m;
    REQUIRE(std::regex_search(r.out, m, agent_line));
    CHECK(m[1].str() == std::to_string(limit.rlim_max));
    CHECK(m[2].str() == std::to_string(limit.rlim_max));
}

// A policy that is itself a coroutine awaiting something (here a timer that never fires): the
// agent must still handle a signal that arrives while it is awaited.
struct waiting_policy {
    int* calls;
    asio::awaitable<elastic::restart_decision> operator()(const elastic::group_failure& failure) {
        ++*calls;
        CHECK(failure.failed_local_ranks() == std::vector<int>{1});
        CHECK(failure.restarts == 0);
        ::kill(::getpid(), SIGTERM);  // the signal arrives while the policy waits
        asio::steady_timer forever(co_await asio::this_coro::executor, std::chrono::hours(24));
        co_await forever.async_wait(asio::use_awaitable);
        co_return elastic::restart_decision::restart_because("never reached");
    }
};
static_assert(elastic::restart_policy<waiting_policy>);

TEST_CASE("agent: a signal that arrives as the other side of a race wins is kept for the next wait") {
    // The agent races every wait with its signals (`||`); a signal_set wait that completed in
    // the same turn as the winner lost its signal with it, and an agent told to stop at that
    // moment (another node's abort arriving with the SIGTERM) never stopped.
    asio::io_context io;
    elastic::detail::agent::signal_inbox<> signals(io.get_executor());
    signals.add(SIGUSR2);
    std::vector<int> seen;
    bool done = false;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            for (int round = 0; round < 50; ++round) {
                ::raise(SIGUSR2);
                // A timer due now: it completes in the same turn as the signal's wait, or first.
                asio::steady_timer now(io, std::chrono::steady_clock::now());
                auto first = co_await (now.async_wait(asio::use_awaitable) || signals.next());
                if (first.index() == 1) {
                    seen.push_back(signals.take());
                    continue;
                }
                // The timer won: the signal is still there, and the next wait has it at once.
                asio::steady_timer guard(io, std::chrono::minutes(1));  // turns a loss into a failure only
                auto second = co_await (signals.next() || guard.async_wait(asio::use_awaitable));
                REQUIRE(second.index() == 0);
                seen.push_back(signals.take());
            }
            done = true;
        },
        [](std::exception_ptr e) {
            if (e) std::rethrow_exception(e);
        });
    io.run();
    CHECK(done);
    CHECK(seen.size() == 50);
    CHECK(std::all_of(seen.begin(), seen.end(), [](int sig) { return sig == SIGUSR2; }));
}

TEST_CASE("agent: a signal while the policy decides ends the agent with 128+N (in-process, custom policy)") {
    temp_dir dir;
    const auto env_map = worker_env(dir, "r1:exit5;*:hang");
    elastic::environment env(env_map.begin(), env_map.end());
    elastic::launch_config config;
    config.nproc_per_node = 2;
    config.program.target = agent_support::worker();
    config.signals_to_handle = {SIGTERM};
    int calls = 0;
    const int code = elastic::run(config, waiting_policy{&calls}, env, "agent-test");
    CHECK(calls == 1);
    CHECK(code == 128 + SIGTERM);
}

TEST_CASE("agent: elastic::run takes any restart_policy (in-process): a policy that stops at once") {
    struct stop_now {
        asio::awaitable<elastic::restart_decision> operator()(const elastic::group_failure& f) const {
            co_return elastic::restart_decision::stop_because(fmt::format("{} failed", f.failures().size()));
        }
    };
    temp_dir dir;
    // Rank 0 fails once rank 1 has written its environment and its store key.
    const auto env_map = worker_env(dir, "r0:waitfor1+exit9;*:env+store+hang");
    elastic::environment env(env_map.begin(), env_map.end());
    elastic::launch_config config;
    config.nproc_per_node = 2;
    config.max_restarts = 5;  // the policy given wins; the workers still see the option
    config.program.target = agent_support::worker();
    CHECK(elastic::run(config, stop_now{}, env, "agent-test") == 9);
    CHECK(count_files(dir.path(), "env.0.1") == 1);
    CHECK(count_files(dir.path(), "env.1.") == 0);  // no restart
    CHECK(agent_support::read_env_file(dir.path() / "env.0.1").at("TORCHELASTIC_MAX_RESTARTS") == "5");
}

TEST_CASE("agent: a worker_spec filled in C++ with no workers or a negative grace is refused, nothing started") {
    asio::io_context io;
    elastic::worker_spec workers;
    workers.program.target = agent_support::worker();
    const auto refused = [&](const elastic::worker_spec& w) {
        try {
            elastic::local_agent agent(io.get_executor(), w, elastic::rendezvous_parameters{}, elastic::agent_options{},
                                       elastic::current_environment(), "agent-test");
        } catch (const elastic::usage_error& e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    workers.nproc_per_node = 0;
    CHECK(refused(workers).find("worker_spec.nproc_per_node=0: must be 1 or more") != std::string::npos);
    workers.nproc_per_node = 1;
    workers.shutdown_timeout = std::chrono::milliseconds(-1);
    CHECK(refused(workers).find("worker_spec.shutdown_timeout=-1 ms") != std::string::npos);
    workers.shutdown_timeout = std::chrono::milliseconds(0);
    CHECK(refused(workers) == "accepted");
}

TEST_CASE("agent: rendezvous_parameters with an empty run id, or one with a '__lease__' segment, are refused") {
    asio::io_context io;
    elastic::worker_spec workers;
    workers.program.target = agent_support::worker();
    const auto refused = [&](const std::string& run_id) {
        elastic::rendezvous_parameters rendezvous;
        rendezvous.run_id = run_id;
        try {
            elastic::local_agent agent(io.get_executor(), workers, rendezvous, elastic::agent_options{},
                                       elastic::current_environment(), "agent-test");
        } catch (const elastic::usage_error& e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    CHECK(refused("").find("--rdzv-id: must not be empty") != std::string::npos);
    for (const std::string id : {"__lease__", "a/__lease__", "__lease__/b", "a/__lease__/b"}) {
        CAPTURE(id);
        CHECK(refused(id).find("a path segment '__lease__' is reserved") != std::string::npos);
    }
    for (const std::string id : {"job42", "a__lease__", "__lease__x/b", "a/x__lease__/b"}) {
        CAPTURE(id);
        CHECK(refused(id) == "accepted");
    }
}

TEST_CASE("agent: a local_agent from a worker_spec and rendezvous_parameters, without the command line") {
    temp_dir dir;
    // Attempt 0: rank 1 writes its environment and fails with 4 (rank 0 may be stopped before it
    // writes its own, so rank 1's is the one read); attempt 1: both succeed.
    const auto env_map = worker_env(dir, "a0r1:env+exit4;*:env");
    elastic::worker_spec workers;
    workers.program.target = agent_support::worker();
    workers.nproc_per_node = 2;
    workers.role = "spec";
    workers.max_restarts = 1;
    workers.log_dir = dir.path() / "logs";
    elastic::rendezvous_parameters rendezvous;  // one node, static, a port the kernel picks
    rendezvous.run_id = "from-spec";
    asio::io_context io;
    elastic::local_agent agent(io.get_executor(), workers, rendezvous, elastic::agent_options{},
                               elastic::environment(env_map.begin(), env_map.end()), "agent-test");
    auto policy = elastic::max_restarts(1);
    std::optional<int> code;
    std::exception_ptr failure;
    asio::co_spawn(io, agent.run(policy), [&](std::exception_ptr e, int c) {
        failure = e;
        code = c;
    });
    io.run();
    REQUIRE_FALSE(failure);
    CHECK(code == 0);
    for (int attempt = 0; attempt < 2; ++attempt) {
        const auto e = agent_support::read_env_file(dir.path() / fmt::format("env.{}.1", attempt));
        REQUIRE(!e.empty());
        CHECK(e.at("ROLE_NAME") == "spec");
        CHECK(e.at("TORCHELASTIC_RUN_ID") == "from-spec");
        CHECK(e.at("TORCHELASTIC_MAX_RESTARTS") == "1");
        CHECK(e.at("TORCHELASTIC_RESTART_COUNT") == std::to_string(attempt));
        CHECK(e.at("TORCHELASTIC_ERROR_FILE").rfind((dir.path() / "logs").string(), 0) == 0);
        CHECK(e.at("MASTER_PORT") != "29500");
    }
    CHECK(count_files(dir.path(), "env.2.") == 0);
}

}  // namespace test_agent

namespace test_agent {

// PyTorch 1.13 (Debian's /usr/bin/python3) workers: init_process_group("gloo") from elasticrun's
// environment, as clients of the store the agent hosts (legacy dialect), keyed under
// /worker/attempt_<TORCHELASTIC_RESTART_COUNT>/.
TEST_CASE("agent: a PyTorch DDP job (gloo, CPU) under elasticrun, correct after one restart") {
    for (const auto& job : std::vector<std::pair<int, int>>{{2, 0}, {4, 3}}) {
        const int n = job.first;
        const int fail_rank = job.second;
        CAPTURE(n);
        temp_dir dir;
        auto env = worker_env(dir, "");
        env["PYTHON_EXEC"] = ELASTIC_TORCH_PYTHON;
        env["DDP_FAIL_RANK"] = std::to_string(fail_rank);
        auto r = agent_support::run({"--standalone", fmt::format("--nproc-per-node={}", n), "--max-restarts=1",
                                     ELASTIC_TEST_SOURCE_DIR "/tests/agent/ddp_worker.py"},
                                    env);
        INFO(r.out);
        INFO(r.err);
        CHECK(r.code == 0);
        CHECK(r.err.find(fmt::format("rank {} fails on purpose in attempt 0", fail_rank)) != std::string::npos);
        CHECK(r.err.find("restart 1 of 1 (--max-restarts=1)") != std::string::npos);
        const auto sum = n * (n + 1) / 2;
        for (int rank = 0; rank < n; ++rank) {
            CHECK(r.out.find(fmt::format("ddp rank={} world={} attempt=1 sum={} expected={} same=True\n", rank, n, sum,
                                         sum)) != std::string::npos);
        }
        CHECK(launched::count_lines(r.out, "ddp ") == n);
    }
}

}  // namespace test_agent

namespace test_agent {

// examples/trainer.cpp: elastic::env() and elastic::dist (broadcast, all_reduce, all_gather,
// barrier) over the store the agent hosts; a failure in attempt 0 leaves elastic::record's
// error file, and the restarted group agrees again.
TEST_CASE("agent: a native trainer using elastic::env() and elastic::dist, before and after a restart") {
    temp_dir dir;
    auto env = worker_env(dir, "");
    const std::string trainer = ELASTIC_TEST_PROGRAM_DIR "/agent-trainer";
    SUBCASE("four ranks agree") {
        auto r = agent_support::run({"--standalone", "--nproc-per-node=4", trainer, "--steps=3"}, env);
        INFO(r.err);
        CHECK(r.code == 0);
        CHECK(launched::count_lines(r.out, "trainer rank ") == 8);  // a start and a done line each
        CHECK(launched::count_lines(r.out, "step ") == 3);
        CHECK(r.out.find("agreed by 4 ranks") != std::string::npos);
    }
    SUBCASE("rank 2 throws at step 2 of attempt 0; the summary shows its error file; attempt 1 succeeds") {
        env["TRAINER_FAIL"] = "2:2";
        auto r = agent_support::run({"--nproc-per-node=3", "--max-restarts=1", trainer, "--steps=3"}, env);
        INFO(r.err);
        CHECK(r.code == 0);
        CHECK(r.err.find("failed (exitcode: ") != std::string::npos);
        CHECK(r.out.find("attempt 1") != std::string::npos);
        CHECK(launched::count_lines(r.out, "trainer rank ") == 3 + 3 + 3);  // 3 starts, 3 starts, 3 done
        env["TRAINER_FAIL"] = "2:2";
        r = agent_support::run({"--nproc-per-node=3", trainer, "--steps=3"}, env);
        CHECK(r.code == 1);
        CHECK(r.err.find("rank 2 fails at step 2 (TRAINER_FAIL)") != std::string::npos);
        CHECK(r.err.find("error_file: /") != std::string::npos);  // elastic::record's file, read by the agent
    }
}

}  // namespace test_agent
