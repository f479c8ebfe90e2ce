// The watchdog end to end: the real elasticrun finding native and Python workers hung before
// their first heartbeat, between heartbeats and inside a section, with the stacks of every
// thread in the error file and the summary; hostile workers; --restart-no-progress. (Not run
// under ThreadSanitizer: the stack dump's signals reach threads only at its interception
// points; tests/agent/test_watchdog_page.cpp holds the concurrent parts.)
#include "agent_support.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace test_watchdog {

using agent_support::temp_dir;
using agent_support::with_worker;
using agent_support::worker_env;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string slurp(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

TEST_CASE("watchdog: a healthy job runs to the end, its workers told where their pages are, nothing left") {
    temp_dir dir;
    auto r = agent_support::run(with_worker({"--nproc-per-node=2", "--watchdog=first=1h,beat=1h,section=1h"}),
                                worker_env(dir, "*:record+beat10+entersave+beat2+leave+env"));
    INFO(r.err);
    CHECK(r.code == 0);
    for (int rank = 0; rank < 2; ++rank) {
        const auto e = agent_support::read_env_file(dir.path() / fmt::format("env.0.{}", rank));
        REQUIRE(e.count("ELASTIC_WATCHDOG_FILE") == 1);
        CHECK(e.at("ELASTIC_WATCHDOG_SIGNAL") == std::to_string(SIGUSR2));
        CHECK(e.at("ELASTIC_WATCHDOG_STACKS").find(fmt::format("/{}.stacks", rank)) != std::string::npos);
        const auto pages = fs::path(e.at("ELASTIC_WATCHDOG_FILE")).parent_path();
        CHECK(e.at("PYTHONPATH").rfind((pages / "python").string(), 0) == 0);
        CHECK(!fs::exists(pages));  // removed with the attempt
    }
    CHECK(r.err.find("hung") == std::string::npos);
}

TEST_CASE("watchdog: a native worker hung in a section is found, its stacks kept, the group restarted") {
    temp_dir dir;
    const auto logs = dir.path() / "logs";
    auto r = agent_support::run(
        with_worker({"--nproc-per-node=2", "--max-restarts=1", "--log-dir=" + logs.string(),
                     "--watchdog=beat=1h,section:allreduce=300ms"}),
        worker_env(dir, "a0r1:record+thread+beat5+enterallreduce+stuck;a0:record+beat3+hang;*:exit0"));
    INFO(r.err);
    CHECK(r.code == 0);
    CHECK(r.err.find("local_rank 1 (rank 1, pid ") != std::string::npos);
    CHECK(r.err.find("hung: in section \"allreduce\" for ") != std::string::npos);
    CHECK(r.err.find("(--watchdog section:allreduce=300ms); progress 4; asking it for its stacks (SIGUSR2") !=
          std::string::npos);
    CHECK(r.err.find("restart 1 of 1 (--max-restarts=1)") != std::string::npos);
    // The error file the agent wrote for it: the hang, then every thread's stack.
    const auto run_dir = *fs::directory_iterator(logs);
    const auto text = slurp(run_dir.path() / "attempt_0" / "1" / "error.json");
    REQUIRE(!text.empty());
    const auto json = nlohmann::json::parse(text);
    const auto message = json["message"]["message"].get<std::string>();
    CHECK(message.rfind("hung: in section \"allreduce\"", 0) == 0);
    const auto stacks = json["message"]["extraInfo"]["py_callstack"].get<std::string>();
    CHECK(stacks.find("Stacks of process ") != std::string::npos);
    CHECK(stacks.find("agent_worker_stuck_in_collective") != std::string::npos);
    CHECK(stacks.find("agent_worker_helper_thread") != std::string::npos);
    // The other rank was only stopped: no error file of the agent's for it.
    CHECK(!fs::exists(run_dir.path() / "attempt_0" / "0" / "error.json"));
}

TEST_CASE("watchdog: a SIGUSR2 not from the agent reaches the program's own handler, the dump stays the agent's") {
    temp_dir dir;
    const auto logs = dir.path() / "logs";
    auto r = agent_support::run(with_worker({"--nproc-per-node=1", "--log-dir=" + logs.string(),
                                             "--watchdog=beat=300ms"}),
                                worker_env(dir, "*:ownusr2+record+beat2+selfusr2+stuck"));
    INFO(r.err);
    INFO(r.out);
    CHECK(r.code == 128 + SIGTERM);
    CHECK(r.out.find("own usr2 0") != std::string::npos);
    const auto run_dir = *fs::directory_iterator(logs);
    const auto json = nlohmann::json::parse(slurp(run_dir.path() / "attempt_0" / "0" / "error.json"));
    CHECK(json["message"]["extraInfo"]["py_callstack"].get<std::string>().find("agent_worker_stuck_in_collective()") !=
          std::string::npos);
}

TEST_CASE("watchdog: sections left out of order leave none shown, so the heartbeat limit applies") {
    temp_dir dir;
    auto r = agent_support::run(with_worker({"--nproc-per-node=1", "--watchdog=beat=300ms,section=1h"}),
                                worker_env(dir, "*:record+beat2+xsections+stuck"));
    INFO(r.err);
    CHECK(r.code == 128 + SIGTERM);
    CHECK(r.err.find("hung: no heartbeat for ") != std::string::npos);
    CHECK(r.err.find("in section") == std::string::npos);
}

TEST_CASE("watchdog: a dump of hundreds of threads, one that blocks the signal listed as such") {
    temp_dir dir;
    const auto logs = dir.path() / "logs";
    auto r = agent_support::run(with_worker({"--nproc-per-node=1", "--log-dir=" + logs.string(),
                                             "--watchdog=beat=300ms,dump=30s"}),
                                worker_env(dir, "*:record+threads200+blocker+beat2+stuck"));
    INFO(r.err);
    CHECK(r.code == 128 + SIGTERM);
    const auto run_dir = *fs::directory_iterator(logs);
    const auto json = nlohmann::json::parse(slurp(run_dir.path() / "attempt_0" / "0" / "error.json"));
    const auto stacks = json["message"]["extraInfo"]["py_callstack"].get<std::string>();
    std::size_t helpers = 0;
    for (auto at = stacks.find("agent_worker_helper_thread()"); at != std::string::npos;
         at = stacks.find("agent_worker_helper_thread()", at + 1)) {
        ++helpers;
    }
    CHECK(helpers == 200);  // every answering thread, across several directory reads
    CHECK(stacks.find(": blocks the signal, no stack") != std::string::npos);
    CHECK(stacks.find("agent_worker_stuck_in_collective()") != std::string::npos);
}

TEST_CASE("watchdog: a worker that truncates its page, or puts a FIFO for its stacks, cannot hurt the agent") {
    temp_dir dir;
    SUBCASE("a page cut to nothing") {
        // The agent's reads come back short and change nothing: no sign of life, so `first` or
        // `beat` fires, whichever applies when the agent first read the page.
        auto r = agent_support::run(with_worker({"--nproc-per-node=1", "--watchdog=first=1s,beat=300ms"}),
                                    worker_env(dir, "*:record+beat3+truncate+stuck"));
        INFO(r.err);
        CHECK(r.code == 128 + SIGTERM);
        CHECK(r.err.find("local_rank 0 (rank 0, pid ") != std::string::npos);
    }
    SUBCASE("a FIFO where the stacks go") {
        // The worker's own dump blocks opening it; the agent's read of it does not.
        auto r = agent_support::run(with_worker({"--nproc-per-node=1", "--watchdog=beat=300ms,dump=1s"}),
                                    worker_env(dir, "*:record+beat3+fifo+stuck"));
        INFO(r.err);
        CHECK(r.code == 128 + SIGTERM);
        CHECK(r.err.find("hung: no heartbeat for ") != std::string::npos);
        CHECK(r.err.find("wrote no complete stacks within 1 s") != std::string::npos);
        CHECK(r.err.find("(no stacks: the worker wrote none on the watchdog's signal)") != std::string::npos);
    }
}

TEST_CASE("watchdog: heartbeats that stop, or never come, end the job with the hang as root cause") {
    temp_dir dir;
    SUBCASE("between heartbeats") {
        auto r = agent_support::run(with_worker({"--nproc-per-node=2", "--watchdog=beat=300ms"}),
                                    worker_env(dir, "r0:record+beat7+stuck;*:hang"));
        INFO(r.err);
        CHECK(r.code == 128 + SIGTERM);  // how the hung worker ended: stopped with the group
        const auto summary = r.err.substr(r.err.find("\n=====") + 1);
        CHECK(summary.find("Root Cause (first observed failure):") != std::string::npos);
        CHECK(summary.find("  rank      : 0 (local_rank: 0)") != std::string::npos);
        CHECK(summary.find("hung: no heartbeat for ") != std::string::npos);
        CHECK(summary.find("(--watchdog beat=300ms); progress 6") != std::string::npos);
        CHECK(summary.find("agent_worker_stuck_in_collective") != std::string::npos);
    }
    SUBCASE("before the first") {
        // Long enough for the worker to start and attach under a sanitizer on a busy machine.
        auto r = agent_support::run(with_worker({"--nproc-per-node=1", "--watchdog=first=2s"}),
                                    worker_env(dir, "*:record+stuck"));
        INFO(r.err);
        CHECK(r.code == 128 + SIGTERM);
        CHECK(r.err.find("hung: no sign of life for ") != std::string::npos);
        CHECK(r.err.find("since it started (--watchdog first=2s)") != std::string::npos);
        CHECK(r.err.find("agent_worker_stuck_in_collective") != std::string::npos);
    }
    SUBCASE("a worker that never attached its page is not asked for stacks it cannot give") {
        // No `record`, no page use: SIGUSR2 would only kill it. It is stopped like the others.
        auto r = agent_support::run(with_worker({"--nproc-per-node=1", "--watchdog=first=300ms"}),
                                    worker_env(dir, "*:stuck"));
        INFO(r.err);
        CHECK(r.code == 128 + SIGTERM);
        CHECK(r.err.find("hung: no sign of life for ") != std::string::npos);
        CHECK(r.err.find("it never attached its watchdog page") != std::string::npos);
    }
}

TEST_CASE("watchdog: --restart-no-progress stops a job whose restarts no longer move it forward") {
    temp_dir dir;
    // Every attempt reaches progress 4 and fails: the first is progress, the next two are not.
    auto r = agent_support::run(with_worker({"--nproc-per-node=2", "--max-restarts=10", "--watchdog=beat=1h",
                                             "--restart-no-progress=2"}),
                                worker_env(dir, "*:env+beat5+exit1"));
    INFO(r.err);
    CHECK(r.code == 1);
    CHECK(r.err.find("restart 2 of 10") != std::string::npos);
    CHECK(r.err.find("restart 3 of 10") == std::string::npos);
    CHECK(agent_support::count_files(dir.path(), "env.3.") == 0);
    CHECK(r.err.find("progress 4, past nothing (--restart-no-progress=2)") != std::string::npos);
    CHECK(r.err.find("progress 4 (the best so far is 4): 1 of 1 attempts in a row without progress allowed") !=
          std::string::npos);
    CHECK(r.err.find("progress 4 (the best so far is 4): 2 failed attempts in a row made no progress, stopping "
                     "(--restart-no-progress=2)") != std::string::npos);

    // It reads progress from the watchdog's pages: without --watchdog it is refused.
    r = agent_support::run(with_worker({"--restart-no-progress=2"}), worker_env(dir, "*:exit0"));
    CHECK(r.code == 2);
    CHECK(r.err.find("--restart-no-progress=2 needs --watchdog") != std::string::npos);
}

TEST_CASE("watchdog: a Python worker's heartbeats, section and faulthandler stacks") {
    temp_dir dir;
    const auto script = dir.path() / "worker.py";
    std::ofstream(script) << "import threading, elastic_watchdog as wd\n"
                             "assert wd.watched()\n"
                             "def stuck_in_python():\n"
                             "    threading.Event().wait()\n"
                             "for step in range(5):\n"
                             "    wd.progress(step)\n"
                             "with wd.section('allreduce'):\n"
                             "    stuck_in_python()\n";
    const auto logs = dir.path() / "logs";
    auto env = agent_support::clean_environment();
    auto r = agent_support::run({"--nproc-per-node=1", "--log-dir=" + logs.string(),
                                 "--watchdog=beat=1h,section:allreduce=300ms", ELASTIC_TORCH_PYTHON, script.string()},
                                env);
    INFO(r.err);
    CHECK(r.code != 0);
    CHECK(r.err.find("hung: in section \"allreduce\" for ") != std::string::npos);
    CHECK(r.err.find("progress 4") != std::string::npos);
    const auto run_dir = *fs::directory_iterator(logs);
    const auto json = nlohmann::json::parse(slurp(run_dir.path() / "attempt_0" / "0" / "error.json"));
    const auto stacks = json["message"]["extraInfo"]["py_callstack"].get<std::string>();
    CHECK(stacks.find("in stuck_in_python") != std::string::npos);
}

}  // namespace test_watchdog
