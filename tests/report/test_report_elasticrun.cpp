// The report layer through the real elasticrun: failure summaries of real runs (golden text,
// times, pids, hosts and paths normalised), the agent's own error file, elasticrun's exit codes,
// and the event log (--event-log-handler) read by nlohmann::json and by torch's Event.
#include "agent_support.hpp"
#include "test_files.hpp"

#include "elastic/agent/agent_events.hpp"
#include "elastic/launch/run.hpp"
#include "elastic/report/event_destination.hpp"
#include "elastic/report/event_sink.hpp"
#include "elastic/report/exit_codes.hpp"
#include "elastic/rendezvous/error.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace test_report_elasticrun {

using agent_support::temp_dir;
using json = nlohmann::json;

std::string program(const std::string& name) { return std::string(ELASTIC_TEST_PROGRAM_DIR "/") + name; }
std::string python_worker() { return ELASTIC_TEST_SOURCE_DIR "/tests/report/elasticrun/python_worker.py"; }
std::string golden_path(const std::string& name) {
    return std::string(ELASTIC_TEST_SOURCE_DIR "/tests/report/golden/") + name;
}

/// elasticrun's environment for a case: nothing a launcher reads, TMPDIR = the case's own
/// directory (the run's temporary tree goes there), Debian's Python with torch.
std::map<std::string, std::string> environment(const temp_dir& dir) {
    auto env = agent_support::clean_environment();
    env["TMPDIR"] = dir.str();
    env["PYTHON_EXEC"] = ELASTIC_TORCH_PYTHON;
    env.erase("ELASTIC_UPDATE_GOLDEN");
    return env;
}

/// The failure summary in elasticrun's stderr: from the blank line before the first `=` border
/// to the closing border (torchrun's text starts with a newline); empty when there is none.
std::string summary_of(const std::string& err) {
    std::istringstream in(err);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    const auto border = [](const std::string& l) {
        return l.size() >= 20 && l.find_first_not_of('=') == std::string::npos;
    };
    for (std::size_t i = 0; i < lines.size(); ++i) {
        if (!border(lines[i])) continue;
        std::string out = "\n";
        for (std::size_t j = i; j < lines.size(); ++j) {
            out += lines[j];
            if (j > i && border(lines[j])) return out;
            out += "\n";
        }
    }
    return {};
}

/// What changes from run to run, made constant: times, hosts, pids, the run's directory, the
/// test programs' and sources' directories.
std::string normalise(std::string text) {
    const std::pair<std::string, std::string> literal[] = {
        {ELASTIC_TEST_PROGRAM_DIR, "<PROGRAMS>"},
        {ELASTIC_TEST_SOURCE_DIR, "<SRC>"},
    };
    for (const auto& [from, to] : literal) {
        for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
            text.replace(at, from.size(), to);
        }
    }
    const std::pair<std::regex, std::string> patterns[] = {
        {std::regex(R"(time      : \d{4}-\d\d-\d\d_\d\d:\d\d:\d\d)"), "time      : <TIME>"},
        {std::regex(R"(host      : [^\n]*)"), "host      : <HOST>"},
        {std::regex(R"(\(pid: \d+\))"), "(pid: <PID>)"},
        {std::regex(R"(by PID \d+)"), "by PID <PID>"},
        {std::regex(R"([^ \n]*/attempt_(\d+)/(\d+)/error\.json)"), "<RUN_DIR>/attempt_$1/$2/error.json"},
    };
    for (const auto& [pattern, replacement] : patterns) text = std::regex_replace(text, pattern, replacement);
    return text;
}

/// Compares with the golden file; ELASTIC_UPDATE_GOLDEN=1 rewrites it instead.
void check_golden(const std::string& name, const std::string& text) {
    const auto path = golden_path(name);
    if (const char* update = std::getenv("ELASTIC_UPDATE_GOLDEN"); update != nullptr && std::string(update) == "1") {
        std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    }
    CHECK(text == test_files::read_file(path));
}

json read_json_file(const std::filesystem::path& path) { return json::parse(test_files::read_file(path.string())); }

std::vector<json> read_json_lines(const std::filesystem::path& path) {
    std::vector<json> out;
    for (const auto& line : agent_support::read_lines_of(path)) out.push_back(json::parse(line));
    return out;
}

/// Runs torch's Event.deserialize over every line of `path`; returns the names, one per line.
std::string torch_event_names(const temp_dir& dir, const std::filesystem::path& path) {
    const auto script = dir.path() / "read_events.py";
    std::ofstream(script) << R"PY(
import json, sys
from torch.distributed.elastic.events import Event, EventSource
with open(sys.argv[1]) as fp:
    for line in fp:
        e = Event.deserialize(line)
        assert isinstance(e.source, EventSource)
        assert isinstance(e.timestamp, int) and e.timestamp > 0
        assert json.loads(e.serialize()) == json.loads(line)
        print(e.name)
)PY";
    agent_support::launched l({script.string(), path.string()}, agent_support::clean_environment(),
                              ELASTIC_TORCH_PYTHON);
    const int code = l.wait();
    INFO(l.err());
    CHECK(code == 0);
    return l.out();
}

std::vector<std::string> names_of(const std::vector<json>& events) {
    std::vector<std::string> names;
    for (const auto& e : events) names.push_back(e["name"].get<std::string>());
    return names;
}

/// The report block docs/failure-report.md shows between its markers.
std::string doc_report() {
    const auto doc = test_files::read_file(ELASTIC_TEST_SOURCE_DIR "/docs/failure-report.md");
    const std::string begin = "<!-- report-example:begin -->\n```\n";
    const std::string end = "```\n<!-- report-example:end -->";
    const auto b = doc.find(begin);
    const auto e = doc.find(end);
    REQUIRE(b != std::string::npos);
    REQUIRE(e != std::string::npos);
    return doc.substr(b + begin.size(), e - b - begin.size());
}

}  // namespace test_report_elasticrun

using namespace test_report_elasticrun;

TEST_CASE("report: --event-log-handler values: null, console, file:PATH, nothing else") {
    using elastic::event_destination;
    CHECK(event_destination::parse("null") == event_destination{});
    CHECK(event_destination::parse(" console ") == event_destination{event_destination::kind::console, {}});
    CHECK(event_destination::parse("file:/var/log/job.jsonl") ==
          event_destination{event_destination::kind::file, "/var/log/job.jsonl"});
    CHECK(event_destination::parse("file:events.jsonl")->to_string() == "file:events.jsonl");
    for (const char* bad : {"", "file:", "syslog", "Console", "file", "/tmp/x.jsonl", "jsonl:/tmp/x"}) {
        CAPTURE(bad);
        CHECK_FALSE(event_destination::parse(bad).has_value());
    }
}

TEST_CASE("report: event_sink writes whole lines with three clocks, appends, and null writes nothing") {
    temp_dir dir;
    const auto path = dir.path() / "events.jsonl";
    {
        std::ofstream(path) << "{\"name\": \"earlier\"}\n";  // an existing log is appended to
        elastic::event_sink sink(elastic::event_destination{elastic::event_destination::kind::file, path.string()});
        REQUIRE(sink.enabled());
        elastic::event e;
        e.name = "elastic.test";
        e.metadata["text"] = std::string("bad byte \xff and a\nnewline");
        const auto steady = sink.origin() + std::chrono::milliseconds(1500);
        const std::chrono::system_clock::time_point wall{std::chrono::seconds(1795316400)};
        CHECK(sink.record(e, steady, wall));
        CHECK(sink.record(e));
    }
    const auto lines = agent_support::read_lines_of(path);
    REQUIRE(lines.size() == 3);
    CHECK(lines[0] == "{\"name\": \"earlier\"}");
    const auto first = json::parse(lines[1]);
    CHECK(first["timestamp"] == 1795316400000);
    CHECK(first["metadata"]["since_start_ns"] == 1500000000);
    CHECK(first["metadata"]["monotonic_ns"].get<std::int64_t>() > 0);
    CHECK(first["metadata"]["text"] == "bad byte \xEF\xBF\xBD and a\nnewline");
    const auto second = json::parse(lines[2]);
    CHECK(second["metadata"]["monotonic_ns"].get<std::int64_t>() > 0);

    elastic::event_sink null_sink;
    CHECK_FALSE(null_sink.enabled());
    CHECK_FALSE(null_sink.record(elastic::event{}));

    // console: one line on the descriptor, torch's StreamHandler format (the message alone).
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    {
        elastic::event_sink console(elastic::event_destination{elastic::event_destination::kind::console, {}}, fds[1]);
        elastic::event e;
        e.name = "elastic.console";
        CHECK(console.record(e));
    }
    ::close(fds[1]);
    std::string text;
    char buffer[4096];
    for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
    ::close(fds[0]);
    REQUIRE(!text.empty());
    CHECK(text.back() == '\n');
    CHECK(json::parse(text)["name"] == "elastic.console");

    CHECK_THROWS_AS(elastic::event_sink(elastic::event_destination{elastic::event_destination::kind::file,
                                                                   (dir.path() / "missing" / "x").string()}),
                    elastic::report_error);
}

TEST_CASE("report: elasticrun's summary of a native worker's exit 3 shows its stderr, and it exits 3") {
    temp_dir dir;
    auto env = environment(dir);
    env["TORCHELASTIC_ERROR_FILE"] = (dir.path() / "agent_error.json").string();
    const auto r = agent_support::run({"--nproc-per-node=1", program("report-native-crash"), "exit", "3"}, env);
    INFO(r.err);
    CHECK(r.code == 3);
    check_golden("elasticrun_exit3.txt", normalise(summary_of(r.err)));
    const auto agent_file = read_json_file(dir.path() / "agent_error.json");
    CHECK(agent_file["message"]["errorCode"] == 3);
    CHECK(agent_file["message"]["extraInfo"]["py_callstack"].get<std::string>().find(
              "fatal: checkpoint directory is not writable") != std::string::npos);
}

TEST_CASE("report: elasticrun's summary of a worker killed by SIGKILL, and it exits 137") {
    temp_dir dir;
    const auto r = agent_support::run({"--nproc-per-node=1", program("report-native-crash"), "signal", "9"},
                                      environment(dir));
    INFO(r.err);
    CHECK(r.code == 137);
    check_golden("elasticrun_sigkill.txt", normalise(summary_of(r.err)));
}

TEST_CASE("report: elasticrun reads the error file torch's @record writes, and passes it up") {
    temp_dir dir;
    auto env = environment(dir);
    env["TORCHELASTIC_ERROR_FILE"] = (dir.path() / "agent_error.json").string();
    const auto r = agent_support::run({"--nproc-per-node=1", python_worker(), "record"}, env);
    INFO(r.err);
    CHECK(r.code == 1);
    const auto summary = normalise(summary_of(r.err));
    CAPTURE(summary);
    CHECK(summary.find("\n<SRC>/tests/report/elasticrun/python_worker.py FAILED\n") != std::string::npos);
    CHECK(summary.find("  exitcode  : 1 (pid: <PID>)\n  error_file: <RUN_DIR>/attempt_0/0/error.json\n"
                       "  traceback : Traceback (most recent call last):\n") != std::string::npos);
    CHECK(summary.find("\n  ValueError: learning rate must be positive, got -0.1\n") != std::string::npos);
    // The agent's file is the worker's, copied, with errorCode (torch's @record on main).
    const auto agent_file = read_json_file(dir.path() / "agent_error.json");
    CHECK(agent_file["message"]["message"] == "ValueError: learning rate must be positive, got -0.1");
    CHECK(agent_file["message"]["errorCode"] == 1);
}

TEST_CASE("report: elasticrun reads a flat error file") {
    temp_dir dir;
    const auto r = agent_support::run({"--nproc-per-node=1", python_worker(), "flat"}, environment(dir));
    INFO(r.err);
    CHECK(r.code == 5);
    check_golden("elasticrun_flat_error_file.txt", normalise(summary_of(r.err)));
}

TEST_CASE("report: elasticrun reports a malformed error file as malformed, with the stderr tail") {
    temp_dir dir;
    const auto r = agent_support::run({"--nproc-per-node=1", python_worker(), "malformed"}, environment(dir));
    INFO(r.err);
    CHECK(r.code == 4);
    check_golden("elasticrun_malformed_error_file.txt", normalise(summary_of(r.err)));
}

TEST_CASE("report: elasticrun reads elastic::record's error file: the exception first, then the backtrace") {
    temp_dir dir;
    const auto r = agent_support::run({"--nproc-per-node=1", program("report-recorded-crash"), "throw"},
                                      environment(dir));
    INFO(r.err);
    CHECK(r.code == 1);
    const auto summary = normalise(summary_of(r.err));
    CAPTURE(summary);
    CHECK(summary.find("  error_file: <RUN_DIR>/attempt_0/0/error.json\n"
                       "  traceback : std::runtime_error: checkpoint step_1200.pt is truncated\n") !=
          std::string::npos);
    CHECK(summary.find("report_recorded_crash_load_checkpoint") != std::string::npos);
}

TEST_CASE("report: exit codes: 2 for a usage error (no error file), 251 for an internal error (error file)") {
    temp_dir dir;
    auto env = environment(dir);
    const auto agent_file = dir.path() / "agent_error.json";
    env["TORCHELASTIC_ERROR_FILE"] = agent_file.string();
    SUBCASE("usage") {
        for (const std::vector<std::string>& args :
             {std::vector<std::string>{"--nproc-per-node=0", program("report-native-crash"), "exit", "3"},
              std::vector<std::string>{"--event-log-handler=syslog", program("report-native-crash"), "exit", "3"},
              std::vector<std::string>{"--event-log-handler=file:" + (dir.path() / "no" / "such" / "dir").string(),
                                       program("report-native-crash"), "exit", "3"}}) {
            CAPTURE(args.front());
            const auto r = agent_support::run(args, env);
            CHECK(r.code == elastic::exit_codes::usage);
            CHECK(r.err.find(args.front().substr(0, args.front().find('='))) != std::string::npos);
            CHECK_FALSE(std::filesystem::exists(agent_file));
        }
    }
    SUBCASE("internal: the agent cannot make its temporary tree") {
        env["TMPDIR"] = (dir.path() / "missing").string();
        const auto events = dir.path() / "events.jsonl";
        const auto r = agent_support::run({"--nproc-per-node=1", "--event-log-handler=file:" + events.string(),
                                           program("report-native-crash"), "exit", "3"},
                                          env);
        INFO(r.err);
        CHECK(r.code == elastic::exit_codes::internal);
        CHECK(r.code == 251);
        const auto file = read_json_file(agent_file);
        CHECK(file["message"]["errorCode"] == 251);
        CHECK(file["message"]["message"].get<std::string>().find("cannot create a directory") != std::string::npos);
        const auto log = read_json_lines(events);
        REQUIRE(!log.empty());
        CHECK(log.back()["name"] == "elastic.agent.shutdown");
        CHECK(log.back()["metadata"]["exit_code"] == 251);
        CHECK(log.back()["metadata"]["reason"] == "internal error");
    }
}

TEST_CASE("report: a rendezvous error exits 250 and writes the agent's error file, any other error 251") {
    temp_dir dir;
    const auto agent_file = dir.path() / "agent_error.json";
    REQUIRE(::setenv("TORCHELASTIC_ERROR_FILE", agent_file.c_str(), 1) == 0);  // this case's own process
    CHECK(elastic::detail::launch::guarded("elasticrun", []() -> int {
              throw elastic::rendezvous_error("no quorum: 1 of 2 nodes joined round 0 of run job7 within 600 s");
          }) == elastic::exit_codes::rendezvous);
    auto file = read_json_file(agent_file);
    CHECK(file["message"]["errorCode"] == 250);
    CHECK(file["message"]["message"] ==
          "elastic::rendezvous_error: no quorum: 1 of 2 nodes joined round 0 of run job7 within 600 s");
    CHECK(file["message"]["extraInfo"]["timestamp"].is_string());

    CHECK(elastic::detail::launch::guarded("elasticrun", []() -> int { throw elastic::agent_error("cannot bind"); }) ==
          elastic::exit_codes::internal);
    CHECK(read_json_file(agent_file)["message"]["message"] == "elastic::agent_error: cannot bind");
    CHECK(elastic::detail::launch::guarded("elasticrun", []() -> int { throw 42; }) == elastic::exit_codes::internal);
    std::filesystem::remove(agent_file);
    CHECK(elastic::detail::launch::guarded("elasticrun", []() -> int { throw elastic::usage_error("--bogus"); }) == 2);
    CHECK_FALSE(std::filesystem::exists(agent_file));  // torch's @record never sees argparse's exit
    ::unsetenv("TORCHELASTIC_ERROR_FILE");

    // The shutdown event says which.
    const auto events = dir.path() / "events.jsonl";
    elastic::launch_config config;
    config.event_log_handler = {elastic::event_destination::kind::file, events.string()};
    elastic::agent_events log(config.workers(), config.rendezvous(), config.event_log_handler);
    log.shutdown(std::make_exception_ptr(elastic::rendezvous_error("store at node0:29400 vanished")));
    const auto lines = read_json_lines(events);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0]["metadata"]["exit_code"] == 250);
    CHECK(lines[0]["metadata"]["reason"] == "rendezvous error");
    CHECK(lines[0]["metadata"]["error_type"] == "elastic::rendezvous_error");
    CHECK(lines[0]["metadata"]["message"] == "store at node0:29400 vanished");
}

TEST_CASE("report: the event log of a run with one restart is ordered and torch's Event reads every line") {
    temp_dir dir;
    auto env = environment(dir);
    env["AGENT_WORKER_DIR"] = dir.str();
    env["AGENT_WORKER_DO"] = "a0r0:hang;a0r1:exit3";  // attempt 0: rank 1 fails, rank 0 waits; attempt 1 succeeds
    const auto path = dir.path() / "events.jsonl";
    const auto r = agent_support::run({"--nproc-per-node=2", "--max-restarts=1", "--rdzv-id=job7",
                                       "--event_log_handler=file:" + path.string(), agent_support::worker()},
                                      env);
    INFO(r.err);
    REQUIRE(r.code == 0);
    const auto events = read_json_lines(path);
    const std::vector<std::string> expected{"elastic.rendezvous.done",
                                            "elastic.worker.started",
                                            "elastic.worker.started",
                                            "elastic.worker.exited",
                                            "elastic.worker.exited",
                                            "elastic.policy.decision",
                                            "elastic.agent.restart",
                                            "elastic.rendezvous.done",
                                            "elastic.worker.started",
                                            "elastic.worker.started",
                                            "elastic.worker.exited",
                                            "elastic.worker.exited",
                                            "torchelastic.worker.status.SUCCEEDED",
                                            "torchelastic.worker.status.SUCCEEDED",
                                            "elastic.agent.shutdown"};
    REQUIRE(names_of(events) == expected);

    // Ordered on the monotonic clock; every stamp present; common metadata on every event.
    std::int64_t last_monotonic = 0;
    std::int64_t last_since_start = -1;
    for (const auto& e : events) {
        CAPTURE(e.dump());
        const auto& m = e["metadata"];
        CHECK(m["monotonic_ns"].get<std::int64_t>() >= last_monotonic);
        CHECK(m["since_start_ns"].get<std::int64_t>() >= last_since_start);
        last_monotonic = m["monotonic_ns"].get<std::int64_t>();
        last_since_start = m["since_start_ns"].get<std::int64_t>();
        CHECK(e["timestamp"].get<std::int64_t>() > 1700000000000);  // wall clock, milliseconds
        CHECK(m["run_id"] == "job7");
        CHECK(m["role"] == "default");
        CHECK(!m["hostname"].get<std::string>().empty());
        const auto name = e["name"].get<std::string>();
        CHECK(e["source"] == (name.rfind("elastic.worker.", 0) == 0 || name.rfind("torchelastic.worker.", 0) == 0
                                  ? "WORKER"
                                  : "AGENT"));
        for (auto it = m.begin(); it != m.end(); ++it) {
            const std::string key = it.key();  // clang 14: no structured binding in CAPTURE's lambda
            CAPTURE(key);
            CHECK(it.value().is_primitive());  // torch's EventMetadataValue: str, int, float, bool, None
        }
    }

    // What each says.
    CHECK(events[0]["metadata"]["restart_count"] == 0);
    CHECK(events[0]["metadata"]["world_size"] == 2);
    CHECK(events[0]["metadata"]["group_rank"] == 0);
    CHECK(events[0]["metadata"]["master_port"].get<int>() > 0);
    std::map<int, long> pids;
    for (int i : {1, 2})
        pids[events[static_cast<std::size_t>(i)]["metadata"]["local_rank"].get<int>()] =
            events[static_cast<std::size_t>(i)]["metadata"]["pid"].get<long>();
    CHECK(pids.size() == 2);
    const auto& failed = events[3]["metadata"];
    CHECK(failed["global_rank"] == 1);
    CHECK(failed["state"] == "FAILED");
    CHECK(failed["exitcode"] == 3);
    CHECK(failed["signal"].is_null());
    CHECK(failed["pid"] == pids[1]);
    const auto& stopped = events[4]["metadata"];
    CHECK(stopped["global_rank"] == 0);
    CHECK(stopped["state"] == "TERMINATED");
    CHECK(stopped["exitcode"] == -15);
    CHECK(stopped["signal"] == "SIGTERM");
    const auto& decision = events[5]["metadata"];
    CHECK(decision["action"] == "restart");
    CHECK(decision["reason"].get<std::string>().find("--max-restarts=1") != std::string::npos);
    CHECK(decision["root_cause_global_rank"] == 1);
    CHECK(decision["root_cause_exitcode"] == 3);
    CHECK(decision["failed_global_ranks"] == "1");
    CHECK(events[6]["metadata"]["restart_count"] == 1);
    CHECK(events[7]["metadata"]["restart_count"] == 1);
    for (int i : {10, 11}) {
        CHECK(events[static_cast<std::size_t>(i)]["metadata"]["state"] == "SUCCEEDED");
        CHECK(events[static_cast<std::size_t>(i)]["metadata"]["exitcode"] == 0);
        CHECK(events[static_cast<std::size_t>(i)]["metadata"]["restart_count"] == 1);
    }
    // torch 1.13's end of a successful run: one SUCCEEDED status per worker, in local rank
    // order, naming the workers of the last attempt.
    for (int local_rank : {0, 1}) {
        const auto& m = events[static_cast<std::size_t>(12 + local_rank)]["metadata"];
        CAPTURE(m.dump());
        CHECK(m["state"] == "SUCCEEDED");
        CHECK(m["global_rank"] == local_rank);
        CHECK(m["group_rank"] == 0);
        CHECK(m["raw_error"].is_null());
        CHECK(m["exitcode"] == 0);
        CHECK(m["agent_restarts"] == 1);
        CHECK(m["rdzv_backend"] == "static");
        const auto inner = json::parse(m["metadata"].get<std::string>());
        CHECK(inner["local_rank"] == json::array({local_rank}));
        CHECK(inner["role_rank"] == json::array({local_rank}));
        CHECK(inner["role_world_size"] == json::array({2}));
        CHECK(inner["group_world_size"] == 1);
        bool of_last_attempt = false;
        for (int i : {8, 9}) {
            const auto& started = events[static_cast<std::size_t>(i)]["metadata"];
            if (started["local_rank"] == local_rank)
                of_last_attempt = m["worker_id"] == std::to_string(started["pid"].get<long>());
        }
        CHECK(of_last_attempt);
    }
    CHECK(events[14]["metadata"]["exit_code"] == 0);
    CHECK(events[14]["metadata"]["reason"] == "every worker succeeded");

    // torch 1.13's Event.deserialize reads every line and serialises it back to the same JSON.
    std::string names;
    for (const auto& n : expected) names += n + "\n";
    CHECK(torch_event_names(dir, path) == names);
}

TEST_CASE("report: --event-log-handler=console prints each event as one JSON line on stderr, and a failed run's "
          "log ends with torch's worker status events and the shutdown") {
    temp_dir dir;
    auto env = environment(dir);
    env["AGENT_WORKER_DIR"] = dir.str();
    env["AGENT_WORKER_DO"] = "r0:hang;r1:sig9";
    const auto r = agent_support::run({"--nproc-per-node=2", "--event-log-handler", "console", agent_support::worker()},
                                      env);
    INFO(r.err);
    CHECK(r.code == 137);
    std::vector<json> events;
    std::istringstream in(r.err);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("{\"name\":", 0) == 0) events.push_back(json::parse(line));
    }
    const std::vector<std::string> expected{"elastic.rendezvous.done",
                                            "elastic.worker.started",
                                            "elastic.worker.started",
                                            "elastic.worker.exited",
                                            "elastic.worker.exited",
                                            "elastic.policy.decision",
                                            "torchelastic.worker.status.TERMINATED",
                                            "torchelastic.worker.status.FAILED",
                                            "elastic.agent.shutdown"};
    REQUIRE(names_of(events) == expected);
    CHECK(events[3]["metadata"]["signal"] == "SIGKILL");
    CHECK(events[5]["metadata"]["action"] == "stop");
    CHECK(events[7]["metadata"]["exitcode"] == -9);
    CHECK(events[7]["metadata"]["raw_error"] == R"({"message": "<NONE>"})");
    CHECK(events[8]["metadata"]["exit_code"] == 137);
    CHECK(events[8]["metadata"]["reason"].get<std::string>().find("Signal 9 (SIGKILL) received by PID") !=
          std::string::npos);
}

TEST_CASE("report: the report docs/failure-report.md shows is what elasticrun prints for the example") {
    temp_dir dir;
    const auto r = agent_support::run({"--standalone", "--nproc-per-node=2", program("report-crashing-worker")},
                                      environment(dir));
    INFO(r.err);
    CHECK(r.code == 134);
    auto printed = normalise(summary_of(r.err));
    const std::string shown_path = "./bin/crashing-worker";
    const std::string built = "<PROGRAMS>/report-crashing-worker";
    for (auto at = printed.find(built); at != std::string::npos; at = printed.find(built)) {
        printed.replace(at, built.size(), shown_path);
    }
    const auto doc = summary_of(doc_report());  // the block is the whole console output
    REQUIRE(!doc.empty());
    CHECK(printed == normalise(doc));
}

TEST_CASE("report: a signal to elasticrun ends its event log with the workers it stopped and the reason") {
    temp_dir dir;
    auto env = environment(dir);
    env["AGENT_WORKER_DIR"] = dir.str();
    env["AGENT_WORKER_DO"] = "*:hang";
    const auto path = dir.path() / "events.jsonl";
    agent_support::launched l({"--nproc-per-node=2", "--event-log-handler=file:" + path.string(),
                               agent_support::worker()},
                              env);
    REQUIRE(l.read_lines("ready ", 2));  // both workers run
    l.signal(SIGTERM);
    CHECK(l.wait() == 128 + SIGTERM);
    const auto events = read_json_lines(path);
    const std::vector<std::string> expected{"elastic.rendezvous.done", "elastic.worker.started",
                                            "elastic.worker.started",  "elastic.worker.exited",
                                            "elastic.worker.exited",   "elastic.agent.shutdown"};
    REQUIRE(names_of(events) == expected);
    for (int i : {3, 4}) {
        const auto& m = events[static_cast<std::size_t>(i)]["metadata"];
        CHECK(m["state"] == "TERMINATED");
        CHECK(m["signal"] == "SIGTERM");
    }
    CHECK(events[5]["metadata"]["exit_code"] == 143);
    CHECK(events[5]["metadata"]["reason"] == "received SIGTERM");
}
