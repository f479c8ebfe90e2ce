// torch's file timer, served by the agent: the request parser, the line splitter and the timer
// table on their own; the server in one process over a real FIFO; then the real elasticrun with
// native workers writing requests as FileTimerClient does (and hostile ones that write junk or
// name another process), and a Python worker using torch's own FileTimerClient.
#include "agent_support.hpp"

#include "elastic/agent/file_timer.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace test_file_timer {

using agent_support::temp_dir;
using agent_support::with_worker;
using agent_support::worker_env;
using elastic::file_timer_request;
using elastic::detail::agent::fifo_lines;
using elastic::detail::agent::file_timer_table;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string slurp(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

file_timer_request parsed(std::string_view line) {
    auto r = elastic::parse_file_timer_request(line);
    if (const auto* why = std::get_if<std::string>(&r)) FAIL(*why);
    return std::get<file_timer_request>(r);
}

std::string refused(std::string_view line) {
    auto r = elastic::parse_file_timer_request(line);
    REQUIRE(std::holds_alternative<std::string>(r));
    return std::get<std::string>(r);
}

TEST_CASE("file timer: requests as FileTimerClient writes them are read, anything else refused with why") {
    const auto r = parsed(R"({"version": 1, "pid": 4242, "scope_id": "train.py#31", "expiration_time": 1700000000.25,)"
                          R"( "signal": 9})");
    CHECK(r.pid == 4242);
    CHECK(r.scope == "train.py#31");
    CHECK(r.expiration_time == doctest::Approx(1700000000.25));
    CHECK(r.signal == 9);
    CHECK(parsed(R"({"pid": 1, "scope_id": "", "expiration_time": -1, "signal": 0})").expiration_time < 0);
    CHECK(parsed(R"({"pid": 1, "scope_id": "x", "expiration_time": 5, "signal": -3})").signal == 0);
    CHECK(refused("not json").find("is not a JSON object: not json") != std::string::npos);
    CHECK(refused("[1,2]").find("is not a JSON object") != std::string::npos);
    CHECK(refused(R"({"pid": 1, "scope_id": "x", "signal": 9})").find("lacks one of") != std::string::npos);
    CHECK(refused(R"({"pid": "1", "scope_id": "x", "expiration_time": 5, "signal": 9})").find("no process id") !=
          std::string::npos);
    CHECK(refused(R"({"pid": 0, "scope_id": "x", "expiration_time": 5, "signal": 9})").find("no process id") !=
          std::string::npos);
    CHECK(refused(R"({"pid": 1, "scope_id": 7, "expiration_time": 5, "signal": 9})").find("not a string") !=
          std::string::npos);
    CHECK(refused(R"({"pid": 1, "scope_id": "x", "expiration_time": "soon", "signal": 9})")
              .find("not a number of seconds") != std::string::npos);
    CHECK(refused(R"({"pid": 1, "scope_id": "x", "expiration_time": 5, "signal": 4242})").find("not a signal number") !=
          std::string::npos);
    CHECK(refused("\x01\xff{").find("\\x01\\xff{") != std::string::npos);  // shown, never raw
}

TEST_CASE("file timer: lines are split across reads, an overlong one cut and skipped to its newline") {
    fifo_lines lines;
    auto out = lines.add("{\"a\"");
    CHECK(out.empty());
    out = lines.add(": 1}\n{\"b\": 2}\n\n{\"c\"");
    REQUIRE(out.size() == 2);
    CHECK(out[0].text == "{\"a\": 1}");
    CHECK(out[1].text == "{\"b\": 2}");
    CHECK(!out[1].overlong);
    out = lines.add(std::string(fifo_lines::max_line, 'x'));
    REQUIRE(out.size() == 1);  // "{\"c\"" and the x's passed the bound
    CHECK(out[0].overlong);
    CHECK(out[0].text.size() == fifo_lines::max_line);
    out = lines.add(std::string(3 * fifo_lines::max_line, 'y'));  // still skipping: nothing kept
    CHECK(out.empty());
    out = lines.add("tail\n{\"d\": 4}\n");
    REQUIRE(out.size() == 1);
    CHECK(out[0].text == "{\"d\": 4}");
}

TEST_CASE("file timer: the table keeps steady deadlines, releases, and expires as torch does") {
    file_timer_table table;
    const auto now = std::chrono::steady_clock::now();
    const auto wall = std::chrono::system_clock::now();
    const double w = std::chrono::duration<double>(wall.time_since_epoch()).count();
    const auto request = [](long pid, std::string scope, double at, int sig) {
        file_timer_request r;
        r.pid = pid;
        r.scope = std::move(scope);
        r.expiration_time = at;
        r.signal = sig;
        return r;
    };
    CHECK(!table.apply(request(10, "a", w + 2, 9), now, wall));
    CHECK(!table.apply(request(10, "b", w + 1, 15), now, wall));
    CHECK(!table.apply(request(10, "quiet", w + 0.5, 0), now, wall));
    CHECK(!table.apply(request(11, "c", w + 3, 0), now, wall));
    CHECK(!table.apply(request(12, "gone", w + 1, 9), now, wall));
    CHECK(!table.apply(request(12, "gone", -1, 0), now, wall));  // released
    CHECK(table.size() == 4);
    REQUIRE(table.next());
    CHECK(*table.next() - now == std::chrono::duration_cast<std::chrono::steady_clock::duration>(500ms));

    // At +0.6 s only "quiet" expired: no signal, so it alone goes, reported.
    auto out = table.expire(now + 600ms);
    REQUIRE(out.size() == 1);
    CHECK(out[0].scope == "quiet");
    CHECK(out[0].signal == 0);
    CHECK(out[0].after == 500ms);
    CHECK(table.size() == 3);
    // At +2.5 s, pid 10's "b" (SIGTERM, 1 s) and "a" (SIGKILL, 2 s) expired: the earliest with
    // a signal is sent, and every timer of pid 10 goes (its worker is reaped).
    out = table.expire(now + 2500ms);
    REQUIRE(out.size() == 1);
    CHECK(out[0].pid == 10);
    CHECK(out[0].scope == "b");
    CHECK(out[0].signal == SIGTERM);
    CHECK(table.size() == 1);
    // A deadline in the past fires at once; one a century away is capped, not overflowed.
    CHECK(!table.apply(request(13, "late", w - 100, 9), now, wall));
    CHECK(!table.apply(request(13, "far", w + 3e9, 9), now, wall));
    out = table.expire(now);
    REQUIRE(out.size() == 1);
    CHECK(out[0].scope == "late");
    CHECK(table.size() == 1);  // pid 13 reaped; pid 11's "c" stays
    table.retain([](long pid) { return pid != 11; });
    CHECK(table.size() == 0);
    CHECK(!table.next());
}

TEST_CASE("file timer: the table's bounds refuse a flood and say so") {
    file_timer_table table;
    const auto now = std::chrono::steady_clock::now();
    const auto wall = std::chrono::system_clock::now();
    file_timer_request r;
    r.expiration_time = 1e12;
    r.pid = 7;
    for (std::size_t i = 0; i < file_timer_table::max_per_pid; ++i) {
        r.scope = std::to_string(i);
        REQUIRE(!table.apply(r, now, wall));
    }
    r.scope = "one more";
    const auto why = table.apply(r, now, wall);
    REQUIRE(why);
    CHECK(why->find("that pid holds 1024 timers already") != std::string::npos);
    r.scope = "0";  // an existing scope is renewed, not refused
    CHECK(!table.apply(r, now, wall));
    for (long pid = 100; table.size() < file_timer_table::max_timers; ++pid) {
        r.pid = pid;
        for (int i = 0; i < 1000 && table.size() < file_timer_table::max_timers; ++i) {
            r.scope = std::to_string(i);
            REQUIRE(!table.apply(r, now, wall));
        }
    }
    r.pid = 99999;
    const auto full = table.apply(r, now, wall);
    REQUIRE(full);
    CHECK(full->find("16384 timers are kept already") != std::string::npos);
}

TEST_CASE("file timer: the FIFO is made private, a stale one replaced, anything else refused") {
    temp_dir dir;
    const auto path = dir.path() / "timer";
    {
        auto made = elastic::detail::agent::open_timer_fifo(path);
        struct stat st {};
        REQUIRE(::stat(path.c_str(), &st) == 0);
        CHECK(S_ISFIFO(st.st_mode));
        CHECK((st.st_mode & 0777) == 0600);
        // Someone else's FIFO put at the path meanwhile is left in place when this one closes.
        REQUIRE(::unlink(path.c_str()) == 0);
        REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
        ::close(made.reader);
        elastic::detail::agent::close_timer_fifo(made);
        CHECK(fs::exists(path));
        // That one, read by nobody, is stale: replaced, and removed at the end.
        auto second = elastic::detail::agent::open_timer_fifo(path);
        ::close(second.reader);
        elastic::detail::agent::close_timer_fifo(second);
        CHECK(!fs::exists(path));
    }
    {
        // A FIFO another agent reads now is refused, not taken.
        auto live = elastic::detail::agent::open_timer_fifo(path);
        CHECK_THROWS_WITH_AS((void)elastic::detail::agent::open_timer_fifo(path),
                             doctest::Contains("is the FIFO of another agent that serves it now"), std::system_error);
        ::close(live.reader);
        elastic::detail::agent::close_timer_fifo(live);
    }
    std::ofstream(path) << "precious";
    CHECK_THROWS_WITH_AS((void)elastic::detail::agent::open_timer_fifo(path),
                         doctest::Contains("exists and is not a FIFO of this user"), std::system_error);
    CHECK(slurp(path) == "precious");
    CHECK_THROWS_AS((void)elastic::detail::agent::open_timer_fifo(dir.path() / "no" / "dir"), std::system_error);
    // None given: a fresh name in the temporary directory, torchrun's.
    auto fresh = elastic::detail::agent::open_timer_fifo({});
    CHECK(fresh.path.filename().string().rfind("watchdog_timer_", 0) == 0);
    ::close(fresh.reader);
    elastic::detail::agent::close_timer_fifo(fresh);
    CHECK(!fs::exists(fresh.path));
}

bool write_line(const fs::path& fifo, const std::string& line) {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return false;
    const auto n = ::write(fd, line.data(), line.size());
    ::close(fd);
    return n == static_cast<ssize_t>(line.size());
}

TEST_CASE("file timer: the server reads what clients write, ignores strangers and junk, fires expiries") {
    temp_dir dir;
    const auto log_path = dir.path() / "log";
    const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    REQUIRE(log_fd >= 0);
    elastic::agent_log log("test", elastic::log_level::info, log_fd);
    asio::io_context io;
    elastic::file_timer_server server(io.get_executor(), dir.path() / "fifo");
    const long me = static_cast<long>(::getpid());
    const auto line = [](long pid, const char* scope, double in_seconds, int sig) {
        const double at = in_seconds < 0
                              ? -1
                              : std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                                        .count() +
                                    in_seconds;
        return fmt::format(R"({{"version": 1, "pid": {}, "scope_id": "{}", "expiration_time": {}, "signal": {}}})"
                           "\n",
                           pid, scope, at, sig);
    };
    // Written before the server reads: they wait in the FIFO.
    REQUIRE(write_line(server.path(), "garbage\n"));
    REQUIRE(write_line(server.path(), line(me + 1, "stranger", 0, SIGKILL)));
    REQUIRE(write_line(server.path(), line(me, "kept", 3600, SIGKILL)));
    REQUIRE(write_line(server.path(), line(me, "released", 3600, SIGKILL)));
    REQUIRE(write_line(server.path(), line(me, "released", -1, 0)));
    REQUIRE(write_line(server.path(), line(me, "a", 0, 0)));
    std::vector<elastic::file_timer_expiry> got;
    asio::steady_timer done(io, std::chrono::steady_clock::time_point::max());
    asio::steady_timer guard(io, std::chrono::seconds(60));  // a broken server fails the test, not hangs it
    bool guarded_out = false;
    guard.async_wait([&](const asio::error_code& ec) {
        if (!ec) {
            guarded_out = true;
            done.cancel();
        }
    });
    std::string ended = "not yet";
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            auto r = co_await (server.serve(
                                   [me](long pid) {
                                       return pid == me ? elastic::file_timer_sender::worker
                                                        : elastic::file_timer_sender::stranger;
                                   },
                                   [&](const elastic::file_timer_expiry& e) {
                                       got.push_back(e);
                                       if (e.scope == "z") done.cancel();
                                   },
                                   log) ||
                               done.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
            ended = r.index() == 0 ? std::get<0>(r) : std::string();
            guard.cancel();
        },
        asio::detached);
    // One written while it runs, from another thread: the last expiry the test waits for.
    std::thread writer([&] { CHECK(write_line(server.path(), line(me, "z", 0, 0))); });
    io.run();
    writer.join();
    CHECK(!guarded_out);
    CHECK(ended.empty());
    REQUIRE(got.size() == 2);
    CHECK(got[0].scope == "a");
    CHECK(got[1].scope == "z");
    CHECK(server.timers() == 1);  // "kept"
    ::close(log_fd);
    const auto text = slurp(log_path);
    CHECK(text.find("ignored a request that is not a JSON object: garbage") != std::string::npos);
    CHECK(text.find(fmt::format("ignored a request for pid {} (scope 'stranger'), which is none of this node's "
                                "workers",
                                me + 1)) != std::string::npos);
}

// A process of the test's own that a hostile worker names in its request.
struct victim {
    pid_t pid = -1;
    victim() {
        char sleep[] = "sleep";
        char forever[] = "600";
        char* argv[] = {sleep, forever, nullptr};
        REQUIRE(::posix_spawnp(&pid, "sleep", nullptr, nullptr, argv, environ) == 0);
    }
    ~victim() {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
    }
    [[nodiscard]] bool alive() const {
        int status = 0;
        return ::waitpid(pid, &status, WNOHANG) == 0;
    }
};

TEST_CASE("file timer: an expired scope gets its worker the signal it asked for, a hang that restarts on 'hang'") {
    temp_dir dir;
    const auto logs = dir.path() / "logs";
    victim bystander;
    // 'gone' (signal 0, due before 'train') is released: had the release been lost, it would
    // expire first and be reported.
    auto env = worker_env(dir, "a0r0:env+ftjunk+ftforeign+ftsetquiet_1_0+ftsetgone_100_0+ftrelgone+"
                               "ftsettrain_300_9+stuck;a0:hang;*:env");
    env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1";
    env["AGENT_WORKER_VICTIM"] = std::to_string(bystander.pid);
    auto r = agent_support::run(with_worker({"--nproc-per-node=2", "--max-restarts=1", "--restart-on-exit=hang",
                                             "--log-dir=" + logs.string()}),
                                env);
    INFO(r.err);
    CHECK(r.code == 0);
    CHECK(r.err.find("torch timer scope 'train' expired (") != std::string::npos);
    CHECK(r.err.find("torch timer scope 'quiet' expired (") != std::string::npos);
    CHECK(r.err.find("; sending SIGKILL, the signal the request named (FileTimerClient)") != std::string::npos);
    CHECK(r.err.find("; the request asked for no signal, so nothing is sent") != std::string::npos);
    CHECK(r.err.find("'gone'") == std::string::npos);
    CHECK(r.err.find("ignored a request that is not a JSON object: not json at all") != std::string::npos);
    CHECK(r.err.find("ignored a request longer than 4096 bytes") != std::string::npos);
    CHECK(r.err.find("ignored a request that has no process id in pid") != std::string::npos);
    CHECK(r.err.find("ignored a request that has a signal that is not a signal number") != std::string::npos);
    CHECK(r.err.find("ignored a request that is not a JSON object: \\x01\\xff{") != std::string::npos);
    CHECK(r.err.find(fmt::format("ignored a request for pid {} (scope 'foreign')", bystander.pid)) !=
          std::string::npos);
    CHECK(bystander.alive());
    CHECK(r.err.find("hung: torch timer scope 'train' expired (") != std::string::npos);
    CHECK(r.err.find("and the agent sent SIGKILL") != std::string::npos);
    CHECK(r.err.find("restart 1 of 1 (--max-restarts=1)") != std::string::npos);
    // The workers were told the FIFO; it is gone with the agent.
    const auto told = agent_support::read_env_file(dir.path() / "env.0.0");
    REQUIRE(told.count("TORCHELASTIC_TIMER_FILE") == 1);
    CHECK(agent_support::read_env_file(dir.path() / "env.1.1").at("TORCHELASTIC_TIMER_FILE") ==
          told.at("TORCHELASTIC_TIMER_FILE"));
    CHECK(!fs::exists(told.at("TORCHELASTIC_TIMER_FILE")));
    // The error file the agent wrote for the worker its timer ended.
    const auto run_dir = *fs::directory_iterator(logs);
    const auto json = nlohmann::json::parse(slurp(run_dir.path() / "attempt_0" / "0" / "error.json"));
    CHECK(json["message"]["message"].get<std::string>().rfind("hung: torch timer scope 'train'", 0) == 0);
}

TEST_CASE("file timer: TORCHELASTIC_TIMER_FILE names the FIFO, a file there is refused, not 1 is not served") {
    temp_dir dir;
    const auto path = dir.path() / "timer.fifo";
    SUBCASE("a stale FIFO at the path is replaced and removed at the end") {
        REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
        auto env = worker_env(dir, "*:env+ftsetx_100_9+stuck");
        env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1";
        env["TORCHELASTIC_TIMER_FILE"] = path.string();
        auto r = agent_support::run(with_worker({"--nproc-per-node=1"}), env);
        INFO(r.err);
        CHECK(r.code == 128 + SIGKILL);  // served: its scope expired
        CHECK(r.err.find("torch timer scope 'x' expired (") != std::string::npos);
        CHECK(agent_support::read_env_file(dir.path() / "env.0.0").at("TORCHELASTIC_TIMER_FILE") == path.string());
        CHECK(!fs::exists(path));
    }
    SUBCASE("a regular file there is refused before anything starts") {
        std::ofstream(path) << "keep me";
        auto env = worker_env(dir, "*:env");
        env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1";
        env["TORCHELASTIC_TIMER_FILE"] = path.string();
        auto r = agent_support::run(with_worker({"--nproc-per-node=1"}), env);
        CHECK(r.code != 0);
        CHECK(r.err.find("cannot serve torch's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1): ") != std::string::npos);
        CHECK(r.err.find("exists and is not a FIFO of this user") != std::string::npos);
        CHECK(slurp(path) == "keep me");
        CHECK(!fs::exists(dir.path() / "env.0.0"));
    }
    SUBCASE("a value other than 1 warns and serves nothing") {
        auto env = worker_env(dir, "*:env");
        env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "true";
        auto r = agent_support::run(with_worker({"--nproc-per-node=1"}), env);
        INFO(r.err);
        CHECK(r.code == 0);
        CHECK(r.err.find("TORCHELASTIC_ENABLE_FILE_TIMER=true is not 1") != std::string::npos);
        CHECK(agent_support::read_env_file(dir.path() / "env.0.0").count("TORCHELASTIC_TIMER_FILE") == 0);
    }
}

TEST_CASE("file timer: a forked child's scope ends the child alone, releases after an exit are no news") {
    temp_dir dir;
    auto env = worker_env(dir, "r0:ftchild+ftseta_60000_9+ftrela;*:ftsetb_60000_9+ftrelb");
    env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1";
    auto r = agent_support::run(with_worker({"--nproc-per-node=2"}), env);
    INFO(r.err);
    CHECK(r.code == 0);
    CHECK(r.out.find("child killed 0") != std::string::npos);
    CHECK(r.err.find("(in local_rank 0's process group, rank 0): torch timer scope 'loader' expired (") !=
          std::string::npos);
    // A release read after its worker's exit was seen is applied quietly.
    CHECK(r.err.find("ignored") == std::string::npos);
    CHECK(r.err.find("hung") == std::string::npos);
}

TEST_CASE("file timer: torch's own FileTimerClient, its scope expiring, kills the Python worker") {
    temp_dir dir;
    const auto script = dir.path() / "worker.py";
    std::ofstream(script) << "import os, time\n"
                             "import torch.distributed.elastic.timer as timer\n"
                             "timer.configure(timer.FileTimerClient(os.environ['TORCHELASTIC_TIMER_FILE']))\n"
                             "with timer.expires(after=0.2, scope='quick'):\n"
                             "    pass\n"
                             "with timer.expires(after=0.5, scope='allreduce'):\n"
                             "    time.sleep(600)\n";
    auto env = agent_support::clean_environment();
    env["TORCHELASTIC_ENABLE_FILE_TIMER"] = "1";
    auto r = agent_support::run({"--nproc-per-node=1", ELASTIC_TORCH_PYTHON, script.string()}, env);
    INFO(r.err);
    CHECK(r.code == 128 + SIGKILL);  // the root cause's signal (docs/exit-codes.md)
    CHECK(r.err.find("file timer stopped") == std::string::npos);
    CHECK(r.err.find("torch timer scope 'allreduce' expired (") != std::string::npos);
    CHECK(r.err.find("; sending SIGKILL, the signal the request named (FileTimerClient)") != std::string::npos);
    CHECK(r.err.find("'quick'") == std::string::npos);  // released, though due first
    CHECK(r.err.find("hung: torch timer scope 'allreduce'") != std::string::npos);
}

}  // namespace test_file_timer
