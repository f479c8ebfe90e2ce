// test-tags: concurrent
// The watchdog: --watchdog parsed and checked; the agent's rule for "hung" on synthetic
// readings; a page whose bytes a worker scribbled on; and end to end, the real elasticrun
// finding native and Python workers hung before their first heartbeat, between heartbeats and
// inside a section, with their stacks in the error file and the summary.
#include "agent_support.hpp"

#include "elastic/agent/watchdog.hpp"
#include "elastic/detail/watchdog_slot.hpp"
#include "elastic/usage_error.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
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
namespace wd = elastic::detail::watchdog;

std::string slurp(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

TEST_CASE("watchdog: --watchdog's items parse, print back, and a bad item is named") {
    const auto w = elastic::parse_watchdog("first=5min, beat=30s,section=10min,section:save=1h,signal=usr1,dump=0",
                                           "--watchdog");
    CHECK(w.first == 5min);
    CHECK(w.beat == 30s);
    CHECK(w.section == 10min);
    REQUIRE(w.sections.count("save") == 1);
    CHECK(w.sections.at("save") == 1h);
    CHECK(w.signal == SIGUSR1);
    CHECK(w.dump == 0ms);
    CHECK(elastic::parse_watchdog(w.to_string(), "--watchdog") == w);
    CHECK(w.section_limit("save")->second == "section:save");
    CHECK(w.section_limit("other")->first == 10min);
    CHECK(w.shortest() == 0ms + 30s);

    const auto refused = [](const char* text) {
        try {
            (void)elastic::parse_watchdog(text, "--watchdog");
        } catch (const elastic::usage_error& e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    CHECK(refused("beat=30s,nap=1s").find("unknown key 'nap'") != std::string::npos);
    CHECK(refused("beat").find("'beat' has no '='") != std::string::npos);
    CHECK(refused("beat=soon").find("is not a duration") != std::string::npos);
    CHECK(refused("beat=0").find("is not a duration") != std::string::npos);
    CHECK(refused("signal=SIGKILL,beat=1s").find("a worker can catch") != std::string::npos);
    CHECK(refused("signal=SIGUSR2").find("sets no limit") != std::string::npos);
    CHECK(refused("beat=1s,,first=2s").find("is empty") != std::string::npos);
    CHECK(refused("").find("is empty") != std::string::npos);
    CHECK(refused("section:=1s").find("names no section") != std::string::npos);
}

TEST_CASE("watchdog: the rule for hung, on readings at chosen instants") {
    elastic::watchdog_settings w;
    w.first = 10s;
    w.beat = 2s;
    w.sections["save"] = 60s;
    const auto t0 = std::chrono::steady_clock::time_point{} + 1000s;
    elastic::detail::agent::rank_watch r;
    wd::page_snapshot s;

    // Silent since the start: only `first` applies.
    r.update(s, t0 + 5s);
    CHECK(!r.hung(w, t0, t0 + 9s));
    auto h = r.hung(w, t0, t0 + 11s);
    REQUIRE(h);
    CHECK(h->reason.find("no sign of life for 11 s since it started (--watchdog first=10s)") != std::string::npos);

    // A heartbeat: then `beat` applies from the reading that saw it.
    s.beats = 1;
    s.progress = 8;  // progress(7)
    r.update(s, t0 + 12s);
    CHECK(!r.hung(w, t0, t0 + 13s));
    h = r.hung(w, t0, t0 + 14500ms);
    REQUIRE(h);
    CHECK(h->reason == "no heartbeat for 2.5 s (--watchdog beat=2s)");
    CHECK(h->progress == 7u);
    CHECK(h->headline() == "hung: no heartbeat for 2.5 s (--watchdog beat=2s); progress 7");

    // Inside a section with a limit of its own: that limit replaces `beat`.
    s.section_seq = 2;
    s.section = "save";
    r.update(s, t0 + 15s);
    CHECK(!r.hung(w, t0, t0 + 70s));
    h = r.hung(w, t0, t0 + 76s);
    REQUIRE(h);
    CHECK(h->reason == "in section \"save\" for 61 s (--watchdog section:save=1min)");
    CHECK(h->section == "save");

    // A section without a limit: `beat` again.
    s.section_seq = 4;
    s.section = "data";
    r.update(s, t0 + 80s);
    CHECK(!r.hung(w, t0, t0 + 81s));
    CHECK(r.hung(w, t0, t0 + 83s));

    // A name being rewritten at every read keeps the previous name and its clock.
    wd::page_snapshot torn = s;
    torn.section_seq = 5;
    torn.torn = true;
    torn.section = "garbage";
    r.update(torn, t0 + 84s);
    CHECK(r.last.section == "data");
}

TEST_CASE("watchdog: mangled names in a worker's stacks are made readable, anything else kept") {
    using elastic::detail::agent::demangle_frames;
    CHECK(demangle_frames("  #1 0x1 in _Z32agent_worker_stuck_in_collectivev+0x9 (/bin/w+0xabe3)\n") ==
          "  #1 0x1 in agent_worker_stuck_in_collective()+0x9 (/bin/w+0xabe3)\n");
    CHECK(demangle_frames("  #0 0x2 in pause+0x32 (libc)\n  #1 0x3 in _Zbogus\n") ==
          "  #0 0x2 in pause+0x32 (libc)\n  #1 0x3 in _Zbogus\n");
    CHECK(demangle_frames("tail in _Z") == "tail in _Z");
}

TEST_CASE("watchdog: a page a worker scribbled on reads as a valid snapshot") {
    alignas(wd::page) unsigned char bytes[wd::page_size];
    std::memset(bytes, 0xff, sizeof bytes);
    auto& p = *reinterpret_cast<wd::page*>(bytes);
    auto s = wd::read_page(p);
    CHECK(s.torn);  // the sequence is odd forever: the reader gave up, bounded
    CHECK(s.section == std::string(wd::section_capacity, '?'));
    CHECK(s.progress == ~std::uint64_t{0});

    std::memset(bytes, 0, sizeof bytes);
    wd::write_section(p, "allreduce\n\x01");
    s = wd::read_page(p);
    CHECK(!s.torn);
    CHECK(s.section == "allreduce??");
    CHECK(s.section_seq == 2);
    wd::write_section(p, std::string(100, 'x'));
    CHECK(wd::read_page(p).section == std::string(wd::section_capacity, 'x'));
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

TEST_CASE("watchdog: heartbeats that stop, or never come, end the job with the hang as root cause") {
    temp_dir dir;
    SUBCASE("between heartbeats") {
        auto r = agent_support::run(with_worker({"--nproc-per-node=2", "--watchdog=beat=300ms"}),
                                    worker_env(dir, "r0:record+beat7+stuck;*:beat1+hang"));
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
        auto r = agent_support::run(with_worker({"--nproc-per-node=1", "--watchdog=first=300ms"}),
                                    worker_env(dir, "*:record+stuck"));
        INFO(r.err);
        CHECK(r.code == 128 + SIGTERM);
        CHECK(r.err.find("hung: no sign of life for ") != std::string::npos);
        CHECK(r.err.find("since it started (--watchdog first=300ms)") != std::string::npos);
        CHECK(r.err.find("agent_worker_stuck_in_collective") != std::string::npos);
    }
    SUBCASE("a worker without the stack dump still ends, with a word that no stacks came") {
        // No `record`, no page use: SIGUSR2's default action ends it at once.
        auto r = agent_support::run(with_worker({"--nproc-per-node=1", "--watchdog=first=300ms"}),
                                    worker_env(dir, "*:stuck"));
        INFO(r.err);
        CHECK(r.code == 128 + SIGUSR2);
        CHECK(r.err.find("hung: no sign of life for ") != std::string::npos);
    }
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
