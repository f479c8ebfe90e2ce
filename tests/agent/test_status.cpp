// Seeing a running job: the status as JSON, table and Prometheus text; the agent's small HTTP
// endpoint against hostile clients; then a real 2-agent job read by `elasticrun status`, its
// /metrics parsed by Python's prometheus_client, and the torch health check port.
#include "agent_support.hpp"

#include "elastic/agent/http_endpoint.hpp"
#include "elastic/agent/status.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <cerrno>
#include <netinet/in.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <unistd.h>

namespace test_status {

using agent_support::launched;
using agent_support::temp_dir;
using agent_support::with_worker;
using agent_support::worker_env;
namespace fs = std::filesystem;

elastic::agent_status sample() {
    elastic::agent_status s;
    s.run_id = "job \"7\"\nx";
    s.node = "vm:42";
    s.host = "vm";
    s.pid = 42;
    s.state = "running";
    s.round = 3;
    s.group_rank = 1;
    s.group_world_size = 2;
    s.world_size = 4;
    s.restarts = 1;
    s.max_restarts = 3;
    s.store = "127.0.0.1:29500";
    s.rounds_total = 4;
    s.restarts_total = 1;
    s.hangs_total = 1;
    s.timer_expiries_total = 2;
    s.store_requests_total = 99;
    s.started_ms = 1000;
    s.updated_ms = 61000;
    elastic::rank_status a;
    a.local_rank = 0;
    a.global_rank = 2;
    a.pid = 100;
    a.state = "running";
    a.heartbeat_age = 1.5;
    a.section = "allreduce";
    a.progress = 12;
    elastic::rank_status b;
    b.local_rank = 1;
    b.global_rank = 3;
    b.pid = 101;
    b.state = "failed";
    b.ended = "exited with code 3";
    s.ranks = {a, b};
    return s;
}

TEST_CASE("status: the JSON reads back whole, anything else is refused") {
    const auto s = sample();
    const auto back = elastic::parse_status_json(elastic::status_json(s));
    REQUIRE(back);
    CHECK(back->run_id == s.run_id);
    CHECK(back->round == 3);
    CHECK(back->store_requests_total == 99);
    REQUIRE(back->ranks.size() == 2);
    CHECK(back->ranks[0].section == "allreduce");
    CHECK(back->ranks[0].heartbeat_age == doctest::Approx(1.5));
    CHECK(back->ranks[0].progress == 12u);
    CHECK(!back->ranks[1].heartbeat_age);
    CHECK(!back->ranks[1].progress);
    CHECK(back->ranks[1].ended == "exited with code 3");
    CHECK(!elastic::parse_status_json("{\"version\": 1}"));
    CHECK(!elastic::parse_status_json("{\"version\": 2}"));
    CHECK(!elastic::parse_status_json(elastic::status_json(s).substr(0, 40)));  // torn
    CHECK(!elastic::parse_status_json(""));
}

TEST_CASE("status: the table names the job, the round and each worker") {
    const auto text = elastic::status_table({sample()}, 63500);
    CHECK(text.find("node vm:42 (pid 42, host vm)  running  round 3: node 1 of 2, world 4  restarts 1/3  (as of 2.5s "
                    "ago)") != std::string::npos);
    CHECK(text.find("allreduce") != std::string::npos);
    CHECK(text.find("1.5s ago") != std::string::npos);
    CHECK(text.find("failed (exited with code 3)") != std::string::npos);
}

TEST_CASE("status: Prometheus text escapes label values and gives every family a type") {
    const auto text = elastic::prometheus_text(sample());
    CHECK(text.find("run_id=\"job \\\"7\\\"\\nx\"") != std::string::npos);
    CHECK(text.find("# TYPE elastic_agent_restarts_total counter\n") != std::string::npos);
    CHECK(text.find("elastic_store_requests_total{") != std::string::npos);
    CHECK(text.find("elastic_worker_heartbeat_age_seconds{run_id=\"job \\\"7\\\"\\nx\",node=\"vm:42\",role=\"default\","
                    "local_rank=\"0\",rank=\"2\"} 1.5\n") != std::string::npos);
    // Rank 1 has no heartbeat age: no sample, not a made-up one.
    CHECK(text.find("elastic_worker_heartbeat_age_seconds{run_id=\"job \\\"7\\\"\\nx\",node=\"vm:42\",role=\"default\","
                    "local_rank=\"1\"") == std::string::npos);
    // Every line is a comment or `name{labels} value`.
    std::size_t samples = 0;
    for (std::size_t at = 0; at < text.size();) {
        const auto end = text.find('\n', at);
        REQUIRE(end != std::string::npos);
        const auto line = text.substr(at, end - at);
        at = end + 1;
        if (line.rfind("# ", 0) == 0) continue;
        ++samples;
        const auto brace = line.find('{');
        const auto close = line.rfind("} ");
        REQUIRE(brace != std::string::npos);
        REQUIRE(close != std::string::npos);
        CHECK(line.substr(0, brace).find_first_not_of("abcdefghijklmnopqrstuvwxyz_") == std::string::npos);
        CHECK(!line.substr(close + 2).empty());
    }
    CHECK(samples >= 14);
}

TEST_CASE("status: request lines are read, anything else answered with the right refusal") {
    using elastic::detail::agent::parse_http_request_line;
    auto r = parse_http_request_line("GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(r.method == "GET");
    CHECK(r.path == "/metrics");
    CHECK(!r.refusal);
    CHECK(parse_http_request_line("HEAD / HTTP/1.0\r\n\r\n").method == "HEAD");
    REQUIRE(parse_http_request_line("POST / HTTP/1.1\r\n\r\n").refusal);
    CHECK(parse_http_request_line("POST / HTTP/1.1\r\n\r\n").refusal->status == 405);
    REQUIRE(parse_http_request_line("\x16\x03\x01 garbage\r\n\r\n").refusal);
    CHECK(parse_http_request_line("\x16\x03\x01 garbage\r\n\r\n").refusal->status == 400);
    const auto answer = elastic::detail::agent::http_answer({405, "text/plain", "no\n"}, false);
    CHECK(answer.rfind("HTTP/1.1 405 Method Not Allowed\r\n", 0) == 0);
    CHECK(answer.find("Allow: GET, HEAD\r\n") != std::string::npos);
    CHECK(answer.find("Content-Length: 3\r\n") != std::string::npos);
    CHECK(elastic::detail::agent::http_answer({200, "text/plain", "body"}, true).find("body") == std::string::npos);
}

int connect_to(std::uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    return fd;
}

/// Sends `request` on a new connection and reads to the end.
std::string http_exchange(std::uint16_t port, const std::string& request) {
    const int fd = connect_to(port);
    if (!request.empty()) (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);  // may find it closed
    std::string out;
    char buf[4096];
    for (;;) {
        const auto n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        out.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return out;
}

TEST_CASE("status: the endpoint answers GETs, refuses the rest, and a stalled or flooding client holds nothing") {
    asio::io_context io;
    int calls = 0;
    elastic::http_endpoint endpoint(io.get_executor(), "127.0.0.1", 0, [&](std::string_view path) {
        ++calls;
        return elastic::http_response{200, "text/plain", fmt::format("you asked {}\n", path)};
    });
    const auto port = endpoint.port();
    asio::co_spawn(io, endpoint.serve(), asio::detached);
    std::thread runner([&] { io.run(); });
    // 16 connections that send nothing fill every place; a real request still gets its answer:
    // the oldest silent connection makes room.
    const auto read_to_end = [](int fd) {
        timeval limit{30, 0};  // a broken deadline fails the test, never hangs it
        REQUIRE(::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit) == 0);
        std::string got;
        char buf[256];
        for (;;) {
            const auto n = ::recv(fd, buf, sizeof buf, 0);
            if (n < 0 && errno == EAGAIN) FAIL("the endpoint kept a silent connection open past its deadline");
            if (n <= 0) break;
            got.append(buf, static_cast<std::size_t>(n));
        }
        return got;
    };
    std::vector<int> idle;
    for (std::size_t i = 0; i < elastic::http_endpoint::max_connections; ++i) idle.push_back(connect_to(port));
    const auto ok = http_exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(ok.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
    CHECK(ok.find("\r\n\r\nyou asked /metrics\n") != std::string::npos);
    CHECK(read_to_end(idle.front()).empty());  // the one evicted: closed, unanswered
    // Another is closed by the deadline (5 s without a whole request head), never answered.
    CHECK(read_to_end(idle.back()).empty());
    for (const int fd : idle) ::close(fd);
    CHECK(http_exchange(port, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0) == 0);
    CHECK(http_exchange(port, "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0) == 0);
    CHECK(http_exchange(port, "GET /" + std::string(10000, 'a') + " HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 431", 0) == 0);
    const auto head = http_exchange(port, "HEAD /x HTTP/1.1\r\n\r\n");
    CHECK(head.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
    CHECK(head.find("you asked") == std::string::npos);
    CHECK(calls == 2);  // the GET and the HEAD: refusals never reach the handler
    io.stop();
    runner.join();
}

/// Waits for the next file to be renamed into `dir` (a status file written), at most `limit`.
bool next_status_write(int inotify_fd, std::chrono::milliseconds limit) {
    pollfd p{inotify_fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(limit.count())) <= 0) return false;
    char buf[4096];
    return ::read(inotify_fd, buf, sizeof buf) > 0;
}

TEST_CASE("status: a running 2-agent job, as `elasticrun status`, /metrics and the health check port show it") {
    temp_dir dir;
    temp_dir runtime;
    fs::permissions(runtime.path(), fs::perms::owner_all, fs::perm_options::replace);
    const auto store_port = agent_support::free_port();
    const auto metrics_port = agent_support::free_port();
    const auto health_port = agent_support::free_port();
    auto env = worker_env(dir, "*:record+beat5+enterallreduce+hang");
    env["XDG_RUNTIME_DIR"] = runtime.str();
    const auto common = [&](std::vector<std::string> extra) {
        std::vector<std::string> args{"--rdzv-backend=c10d", fmt::format("--rdzv-endpoint=127.0.0.1:{}", store_port),
                                      "--rdzv-id=statusjob", "--nnodes=2",
                                      "--nproc-per-node=2",  "--watchdog=beat=1h"};
        args.insert(args.end(), extra.begin(), extra.end());
        return with_worker(args);
    };
    auto env_first = env;
    env_first["TORCHELASTIC_HEALTH_CHECK_PORT"] = std::to_string(health_port);
    // The first hosts the rendezvous store, so the one killed below is never its host.
    launched first(common({fmt::format("--metrics-port=127.0.0.1:{}", metrics_port), "--rdzv-conf=is_host=true"}),
                   env_first);
    launched second(common({"--rdzv-conf=is_host=false"}), env);
    REQUIRE(first.read_lines("ready ", 2));
    REQUIRE(second.read_lines("ready ", 2));

    // `elasticrun status --json` until both agents show every worker in its section (each agent
    // rewrites its file every second; the test waits for those writes, never for a time).
    const int watch = ::inotify_init1(IN_CLOEXEC);
    REQUIRE(watch >= 0);
    REQUIRE(::inotify_add_watch(watch, (runtime.path() / "elastic").c_str(), IN_MOVED_TO) >= 0);
    auto status_env = agent_support::clean_environment();
    status_env["XDG_RUNTIME_DIR"] = runtime.str();
    nlohmann::json agents;
    bool shown = false;
    for (int reading = 0; reading < 60 && !shown; ++reading) {
        auto r = agent_support::run({"status", "--json", "--rdzv-id=statusjob"}, status_env);
        REQUIRE(r.code == 0);
        agents = nlohmann::json::parse(r.out);
        shown = agents.size() == 2;
        for (const auto& a : agents) {
            for (const auto& rank : a["ranks"]) shown = shown && rank["section"] == "allreduce";
            shown = shown && a["ranks"].size() == 2 && a["state"] == "running";
        }
        if (!shown) REQUIRE(next_status_write(watch, std::chrono::seconds(30)));
    }
    ::close(watch);
    INFO(agents.dump(2));
    REQUIRE(shown);
    std::set<int> ranks;
    for (const auto& a : agents) {
        CHECK(a["run_id"] == "statusjob");
        CHECK(a["group_world_size"] == 2);
        CHECK(a["world_size"] == 4);
        CHECK(a["round"].get<int>() >= 0);
        for (const auto& rank : a["ranks"]) {
            ranks.insert(rank["rank"].get<int>());
            CHECK(rank["state"] == "running");
            CHECK(rank["progress"] == 4);
            CHECK(rank["heartbeat_age"].is_number());
        }
    }
    CHECK(ranks == std::set<int>{0, 1, 2, 3});
    // The table, and a run id nobody has.
    auto table = agent_support::run({"status"}, status_env);
    CHECK(table.code == 0);
    CHECK(table.out.find("run statusjob") != std::string::npos);
    CHECK(table.out.find("allreduce") != std::string::npos);
    auto none = agent_support::run({"status", "--rdzv-id=nobody"}, status_env);
    CHECK(none.code == 1);
    CHECK(none.err.find("no agent of run 'nobody'") != std::string::npos);
    CHECK(agent_support::run({"status", "--bogus"}, status_env).code == 2);

    // The whole job from its rendezvous store: each agent publishes there as its status changes.
    nlohmann::json remote;
    bool published = false;
    const int rewrites = ::inotify_init1(IN_CLOEXEC);
    REQUIRE(rewrites >= 0);
    REQUIRE(::inotify_add_watch(rewrites, (runtime.path() / "elastic").c_str(), IN_MOVED_TO) >= 0);
    for (int reading = 0; reading < 60 && !published; ++reading) {
        auto r = agent_support::run({"status", "--json", fmt::format("--rdzv-endpoint=127.0.0.1:{}", store_port),
                                     "--rdzv-id=statusjob"},
                                    agent_support::clean_environment());
        INFO(r.err);
        if (r.code == 0) {
            remote = nlohmann::json::parse(r.out);
            published = remote.size() == 2;
            for (const auto& a : remote) {
                for (const auto& rank : a["ranks"]) published = published && rank["section"] == "allreduce";
                published = published && a["ranks"].size() == 2 && a["state"] == "running";
            }
        } else {
            REQUIRE(r.code == 1);  // nothing published yet
        }
        if (!published) REQUIRE(next_status_write(rewrites, std::chrono::seconds(30)));
    }
    ::close(rewrites);
    INFO(remote.dump(2));
    REQUIRE(published);
    std::set<std::string> nodes;
    for (const auto& a : remote) {
        nodes.insert(a["node"].get<std::string>());
        CHECK(!a["lease"].get<std::string>().empty());
    }
    CHECK(nodes.size() == 2);
    auto nobody = agent_support::run({"status", fmt::format("--rdzv-endpoint=127.0.0.1:{}", store_port),
                                      "--rdzv-id=nobody"},
                                     agent_support::clean_environment());
    CHECK(nobody.code == 1);
    CHECK(nobody.err.find("no agent of run 'nobody' published its status in the rendezvous store at 127.0.0.1:") !=
          std::string::npos);
    CHECK(agent_support::run({"status", fmt::format("--rdzv-endpoint=127.0.0.1:{}", store_port)},
                             agent_support::clean_environment())
              .code == 2);

    // /metrics through Python's own Prometheus parser.
    const std::string parse =
        "import sys, urllib.request\n"
        "from prometheus_client.parser import text_string_to_metric_families as parse\n"
        "text = urllib.request.urlopen('http://127.0.0.1:' + sys.argv[1] + '/metrics').read().decode()\n"
        "for f in parse(text):\n"
        "    for s in f.samples:\n"
        "        print(f.type, s.name, s.labels.get('rank', '-'), s.value)\n"
        "print('health', urllib.request.urlopen('http://127.0.0.1:' + sys.argv[2] + '/anything').read().decode())\n";
    auto metrics = agent_support::run({"-c", parse, std::to_string(metrics_port), std::to_string(health_port)},
                                      agent_support::clean_environment(), ELASTIC_TORCH_PYTHON);
    INFO(metrics.err);
    REQUIRE(metrics.code == 0);
    CHECK(metrics.out.find("gauge elastic_agent_members - 2.0\n") != std::string::npos);
    CHECK(metrics.out.find("gauge elastic_agent_world_size - 4.0\n") != std::string::npos);
    CHECK(metrics.out.find("counter elastic_agent_rounds_total - 1.0\n") != std::string::npos);
    CHECK(metrics.out.find("counter elastic_agent_hangs_total - 0.0\n") != std::string::npos);
    CHECK(metrics.out.find("counter elastic_store_requests_total - ") != std::string::npos);
    CHECK(metrics.out.find("gauge elastic_worker_progress ") != std::string::npos);
    CHECK(metrics.out.find("gauge elastic_worker_heartbeat_age_seconds ") != std::string::npos);
    CHECK(metrics.out.find("health {\"status\": \"ok\", \"state\": \"running\"}") != std::string::npos);

    // An agent killed outright: the store still holds what it last said, shown as gone once
    // its lease is lost (the other agent's file, rewritten every second, paces the readings).
    second.signal(SIGKILL);
    CHECK(second.wait() == 128 + SIGKILL);
    const int paced = ::inotify_init1(IN_CLOEXEC);
    REQUIRE(paced >= 0);
    REQUIRE(::inotify_add_watch(paced, (runtime.path() / "elastic").c_str(), IN_MOVED_TO) >= 0);
    bool gone = false;
    for (int reading = 0; reading < 60 && !gone; ++reading) {
        auto r = agent_support::run({"status", "--json", fmt::format("--rdzv-endpoint=127.0.0.1:{}", store_port),
                                     "--rdzv-id=statusjob"},
                                    agent_support::clean_environment());
        REQUIRE(r.code == 0);
        for (const auto& a : nlohmann::json::parse(r.out)) gone = gone || a["state"] == "gone";
        if (!gone) REQUIRE(next_status_write(paced, std::chrono::seconds(30)));
    }
    ::close(paced);
    CHECK(gone);
    first.signal(SIGTERM);
    CHECK(first.wait() == 128 + SIGTERM);
    // Its status file went with it; the killed one's stays behind, skipped (its pid is gone).
    CHECK(!fs::exists(runtime.path() / "elastic" / fmt::format("{}.json", first.pid())));
    auto after = agent_support::run({"status", "--json", "--rdzv-id=statusjob"}, status_env);
    CHECK(after.code == 1);
    CHECK(after.out == "[]\n");
}

TEST_CASE("status: a --metrics-port that cannot be had, or a bad health check port, stops before any worker") {
    temp_dir dir;
    auto env = worker_env(dir, "*:env");
    auto r = agent_support::run(with_worker({"--metrics-port=nothost:x"}), env);
    CHECK(r.code == 2);
    CHECK(r.err.find("must be an address of this machine") == std::string::npos);
    r = agent_support::run(with_worker({"--metrics-port=localhost:9400"}), env);
    CHECK(r.code == 2);
    CHECK(r.err.find("HOST must be an address of this machine (such as 10.0.0.5), not a name") != std::string::npos);
    // torch's variable, which other launchers read too: a bad value costs the health check only.
    env["TORCHELASTIC_HEALTH_CHECK_PORT"] = "http";
    r = agent_support::run(with_worker({}), env);
    CHECK(r.code == 0);
    CHECK(r.err.find("TORCHELASTIC_HEALTH_CHECK_PORT=http: not a port from 0 to 65535; no health check is served") !=
          std::string::npos);
    env.erase("TORCHELASTIC_HEALTH_CHECK_PORT");
    fs::remove(dir.path() / "env.0.0");
    // A port already taken: the endpoint's own listening socket is the one in the way.
    asio::io_context io;
    elastic::http_endpoint taken(io.get_executor(), "127.0.0.1", 0,
                                 [](std::string_view) { return elastic::http_response{}; });
    r = agent_support::run(with_worker({fmt::format("--metrics-port=127.0.0.1:{}", taken.port())}), env);
    CHECK(r.code == 2);
    CHECK(r.err.find(fmt::format("--metrics-port: cannot listen on 127.0.0.1:{}", taken.port())) != std::string::npos);
    CHECK(!fs::exists(dir.path() / "env.0.0"));
    // The same port through TORCHELASTIC_HEALTH_CHECK_PORT: warned, and the job runs.
    env["TORCHELASTIC_HEALTH_CHECK_PORT"] = std::to_string(taken.port());
    r = agent_support::run(with_worker({}), env);
    CHECK(r.code == 0);
    CHECK(r.err.find("answers no health check") != std::string::npos);
}

TEST_CASE("status: the reader trusts only this user's own directory and files, and never a bad one") {
    temp_dir runtime;
    const auto dir = runtime.path() / "elastic";
    ::setenv("XDG_RUNTIME_DIR", runtime.str().c_str(), 1);
    struct restore {
        ~restore() { ::unsetenv("XDG_RUNTIME_DIR"); }
    } restore_env;
    // This process stands for a live agent: its pid names the files below.
    const auto me = static_cast<long>(::getpid());
    auto mine = sample();
    mine.pid = me;
    mine.start_ticks = elastic::detail::agent::process_start_ticks(me);
    REQUIRE(mine.start_ticks != 0);
    {
        elastic::detail::agent::status_file file(me);
        file.write(elastic::status_json(mine));
        std::vector<std::string> notes;
        auto read = elastic::read_statuses({dir}, &notes);
        REQUIRE(read.size() == 1);
        CHECK(read[0].run_id == mine.run_id);
        CHECK(notes.empty());
        // Files that are not status, or not of a live pid, or lie about their pid: skipped.
        std::ofstream(dir / "1.json") << elastic::status_json(mine);           // pid 1 is no agent of ours
        std::ofstream(dir / "4294967295.json") << elastic::status_json(mine);  // no pid at all
        std::ofstream(dir / "notes.txt") << "hello";
        CHECK(elastic::read_statuses({dir}).size() == 1);
        // A status of an agent that died, whose pid another process of ours has now: skipped.
        auto dead = mine;
        dead.start_ticks += 1;
        file.write(elastic::status_json(dead));
        CHECK(elastic::read_statuses({dir}).empty());
        // A wrong-typed version is refused, not thrown.
        CHECK(!elastic::parse_status_json("{\"version\": \"1\"}"));
        file.write("{\"version\": \"1\"}");
        CHECK(elastic::read_statuses({dir}).empty());
        // A link or a FIFO in place of the file is never followed nor waited on.
        fs::remove(dir / fmt::format("{}.json", me));
        REQUIRE(::mkfifo((dir / fmt::format("{}.json", me)).c_str(), 0600) == 0);
        CHECK(elastic::read_statuses({dir}).empty());
        fs::remove(dir / fmt::format("{}.json", me));
        fs::create_symlink("/dev/zero", dir / fmt::format("{}.json", me));
        CHECK(elastic::read_statuses({dir}).empty());
    }
    // A directory others may write is not read, and the note says why.
    fs::create_directories(dir);
    fs::permissions(dir, fs::perms::all, fs::perm_options::replace);
    std::vector<std::string> notes;
    CHECK(elastic::read_statuses({dir}, &notes).empty());
    REQUIRE(notes.size() == 1);
    CHECK(notes[0].find("is not a directory of this user's that only it may write") != std::string::npos);
    CHECK_THROWS_WITH_AS(elastic::detail::agent::status_file{me}, doctest::Contains("only it may write"),
                         std::runtime_error);
}

TEST_CASE("status: each write swaps in a whole file, however long the one before") {
    temp_dir runtime;
    const auto dir = runtime.path() / "elastic";
    ::setenv("XDG_RUNTIME_DIR", runtime.str().c_str(), 1);
    struct restore {
        ~restore() { ::unsetenv("XDG_RUNTIME_DIR"); }
    } restore_env;
    const auto me = static_cast<long>(::getpid());
    const auto read = [](const fs::path& path) {
        std::ifstream in(path);
        return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    };
    const auto file_path = dir / fmt::format("{}.json", me);
    const auto aside_path = dir / fmt::format("{}.json.tmp", me);
    {
        elastic::detail::agent::status_file file(me);
        file.write(std::string(3000, 'a'));  // the first: renamed in
        CHECK(read(file_path) == std::string(3000, 'a'));
        file.write("short");  // swapped: the long one is now the aside file
        CHECK(read(file_path) == "short");
        CHECK(read(aside_path) == std::string(3000, 'a'));
        file.write(std::string(10, 'c'));  // written over the long one in place, cut to its length
        CHECK(read(file_path) == std::string(10, 'c'));
        CHECK(read(aside_path) == "short");
        fs::remove(file_path);  // removed by someone: the next write has nothing to swap with
        file.write("again");
        CHECK(read(file_path) == "again");
    }
    CHECK(!fs::exists(file_path));  // both removed at close
    CHECK(!fs::exists(aside_path));
}

TEST_CASE("status: an agent's start removes dead agents' files, a bounded sample at a time") {
    temp_dir runtime;
    const auto dir = runtime.path() / "elastic";
    ::setenv("XDG_RUNTIME_DIR", runtime.str().c_str(), 1);
    struct restore {
        ~restore() { ::unsetenv("XDG_RUNTIME_DIR"); }
    } restore_env;
    const auto me = static_cast<long>(::getpid());
    const auto parent = static_cast<long>(::getppid());  // alive, and this user's
    const auto dead_name = [](int i) { return fmt::format("{}.json{}", 1073676288 + i, i == 0 ? ".tmp" : ""); };
    const auto count_dead = [&] {
        std::size_t n = 0;
        for (int i = 0; i < 40; ++i) n += fs::exists(dir / dead_name(i)) ? 1 : 0;
        return n;
    };
    REQUIRE(fs::create_directories(dir));
    fs::permissions(dir, fs::perms::owner_all);
    // 40 files of pids no process can have (above any pid_max), one of them a leftover ".tmp".
    for (int i = 0; i < 40; ++i) std::ofstream(dir / dead_name(i)) << "{}";
    std::ofstream(dir / fmt::format("{}.json", parent)) << "{}";
    const std::size_t sample = elastic::detail::agent::status_sweep_sample;
    REQUIRE(sample < 40);
    { elastic::detail::agent::status_file second(me); }
    // The 41 others were sampled, 32 of them checked: 31 or 32 of the dead removed, no more.
    const std::size_t left = count_dead();
    CHECK(left >= 40 - sample);
    CHECK(left <= 40 - sample + 1);
    { elastic::detail::agent::status_file third(me); }  // now every other file is in the sample
    CHECK(count_dead() == 0);
    CHECK(fs::exists(dir / fmt::format("{}.json", parent)));  // a live agent's file stays
    CHECK(!fs::exists(dir / fmt::format("{}.json", me)));     // each removed its own at close
}

}  // namespace test_status
