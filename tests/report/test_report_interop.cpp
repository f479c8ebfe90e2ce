// Interoperability of the report layer with Debian's PyTorch 1.13 and with real native workers:
// we read what torch's @record writes, torch reads what our agent writes, our summary is
// byte-for-byte torch's ChildFailedError for the failures torch can express, and a crashing
// native binary gets its signal and stderr tail reported.
#include "elastic/report.hpp"

#include "report_support.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace test_report_interop {

using namespace std::chrono_literals;
using elastic::error_file_status;
using elastic::exit_status;
using elastic::worker_failure;

inline std::string python() { return ELASTIC_TORCH_PYTHON; }

inline std::string native_crash() { return ELASTIC_TEST_PROGRAM_DIR "/report-native-crash"; }

/// Run a Python script (written to `dir`) under Debian's interpreter; returns its result.
inline report_support::run_result run_python(const report_support::temp_dir& dir, const std::string& script,
                                             const std::vector<std::string>& args = {},
                                             const std::map<std::string, std::string>& env = {}) {
    const std::string path = dir / "script.py";
    report_support::write_file(path, script);
    std::vector<std::string> argv = {python(), path};
    argv.insert(argv.end(), args.begin(), args.end());
    return report_support::run(argv, env);
}

/// A failure of `global_rank` observed at whole second `t` (on both clocks' scale).
inline worker_failure observed(int global_rank, exit_status status, long long t, long pid) {
    worker_failure f;
    f.global_rank = global_rank;
    f.local_rank = global_rank;
    f.pid = pid;
    f.host = "node0.example.com";
    f.status = status;
    f.observed_system = std::chrono::system_clock::time_point(std::chrono::seconds(t));
    f.observed_steady = std::chrono::steady_clock::time_point(std::chrono::seconds(t));
    return f;
}

/// torch's ChildFailedError.format_msg() for each scenario of `spec` (see the script).
constexpr const char* torch_summary_script = R"PY(
import json, os, socket, sys, time
os.chdir(sys.argv[1])
with open("spec.json") as fp:
    spec = json.load(fp)
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
socket.getfqdn = lambda *args: spec["host"]
out = []
for scenario in spec["scenarios"]:
    failures = {}
    for f in scenario["failures"]:
        # ProcessFailure stamps a failure without error file with time.time().
        time.time = (lambda t: (lambda: t))(float(f["notice"]))
        failures[f["rank"]] = ProcessFailure(local_rank=f["local_rank"], pid=f["pid"],
                                             exitcode=f["exitcode"], error_file=f["error_file"])
    out.append(ChildFailedError(scenario["name"], failures).format_msg())
sys.stdout.write("\0".join(out))
)PY";

}  // namespace test_report_interop

using namespace test_report_interop;

TEST_CASE("report: reads the error file torch's @record writes") {
    report_support::temp_dir dir;
    const std::string error_file = dir / "error.json";
    const auto before = std::chrono::system_clock::now();
    const auto r = run_python(dir, R"PY(
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise ValueError("loss is nan at step 1200 \u00e9 \u2713 \udcff")

main()
)PY",
                              {}, {{"TORCHELASTIC_ERROR_FILE", error_file}});
    const auto after = std::chrono::system_clock::now();
    CAPTURE(r.err);
    CHECK(exit_status::from_wait_status(r.wait_status) == exit_status::from_exit_code(1));

    const auto read = elastic::read_error_file(error_file);
    CAPTURE(read.problem);
    REQUIRE(read.parsed());
    const auto& c = read.content;
    CHECK(c.format == elastic::error_file_format::nested);
    // torch writes "\udcff" (a lone surrogate escape) for the undecodable byte; we show U+FFFD.
    CHECK(c.message == "ValueError: loss is nan at step 1200 \xC3\xA9 \xE2\x9C\x93 \xEF\xBF\xBD");
    REQUIRE(c.traceback);
    CHECK(c.traceback->find("Traceback (most recent call last):") == 0);
    CHECK(c.traceback->find("raise ValueError(") != std::string::npos);
    REQUIRE(c.timestamp);
    CHECK(c.timestamp_whole_seconds);
    CHECK(*c.timestamp >= std::chrono::floor<std::chrono::seconds>(before));
    CHECK(*c.timestamp <= after);
    CHECK_FALSE(c.error_code);

    // The same file as the agent reports it, and as it copies it into its own error file.
    auto f = observed(0, exit_status::from_exit_code(1), 1795316400, 4242);
    f.error_file = read;
    const auto summary = elastic::format_summary("train.py", std::vector{f});
    CHECK(summary.find("  traceback : Traceback (most recent call last):\n") != std::string::npos);
    CHECK(elastic::agent_error_document(f)["message"]["errorCode"] == 1);
}

TEST_CASE("report: torch reads the agent's error file") {
    report_support::temp_dir dir;
    // A native worker killed by SIGSEGV, no error file, some stderr.
    auto seg = observed(3, exit_status::from_signal(11), 1795316400, 4321);
    elastic::stderr_tail tail;
    tail.feed("about to touch a null pointer\n");
    seg.stderr_tail = tail.snapshot();
    elastic::write_agent_error_file(dir / "native.json", seg);
    // A worker whose flat-format file is copied up (errorCode at the top level).
    auto flat = observed(1, exit_status::from_exit_code(2), 1795316400, 99);
    flat.error_file = elastic::parse_error_file(R"({"message": "flat", "timestamp": 1795316399})", "/w.json");
    REQUIRE(flat.error_file.parsed());
    elastic::write_agent_error_file(dir / "flat.json", flat);

    const auto r = run_python(dir, R"PY(
import json, os, sys
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure, ErrorHandler
d = sys.argv[1]
out = {}
for name in ["native", "flat"]:
    path = os.path.join(d, name + ".json")
    pf = ProcessFailure(local_rank=0, pid=1, exitcode=-11, error_file=path)
    out[name] = {"message": pf.message, "timestamp": pf.timestamp, "error_file": pf.error_file}
# An outer torchrun's @record copies our file into its own, overriding errorCode.
os.environ["TORCHELASTIC_ERROR_FILE"] = os.path.join(d, "outer.json")
ErrorHandler().dump_error_file(os.path.join(d, "native.json"), 139)
with open(os.path.join(d, "outer.json")) as fp:
    out["outer"] = json.load(fp)
print(json.dumps(out))
)PY",
                              {dir.path()});
    CAPTURE(r.err);
    REQUIRE(exit_status::from_wait_status(r.wait_status).success());
    const auto out = nlohmann::json::parse(r.out);

    const auto& native = out["native"];
    CHECK(native["error_file"] == dir / "native.json");
    CHECK(native["timestamp"] == 1795316400);
    CHECK(native["message"]["message"] == "Signal 11 (SIGSEGV) received by PID 4321");
    CHECK(native["message"]["extraInfo"]["py_callstack"] ==
          "Signal 11 (SIGSEGV) received by PID 4321\nstderr (1 line):\n"
          "  about to touch a null pointer");
    CHECK(native["message"]["errorCode"] == -11);

    CHECK(out["flat"]["message"] == "flat");
    CHECK(out["flat"]["timestamp"] == 1795316399);

    CHECK(out["outer"]["message"]["errorCode"] == 139);
    CHECK(out["outer"]["message"]["message"] == "Signal 11 (SIGSEGV) received by PID 4321");
}

TEST_CASE("report: summary is byte for byte torch's ChildFailedError") {
    report_support::temp_dir dir;
    const long long T = 1795316400;
    const auto write = [&](const std::string& name, const nlohmann::json& j) {
        report_support::write_file(dir / name, j.dump());
    };
    nlohmann::json nested;
    nested["message"]["message"] = "ValueError: loss is nan";
    nested["message"]["extraInfo"]["py_callstack"] =
        "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
        "    main()\nValueError: loss is nan\n";
    nested["message"]["extraInfo"]["timestamp"] = std::to_string(T + 5);
    write("r0.json", nested);
    write("r3.json", {{"message", "RuntimeError: \xD0\xBE\xD1\x88\xD0\xB8\xD0\xB1\xD0\xBA\xD0\xB0 "
                                  "\xC3\xA9"},
                      {"timestamp", T + 7}});
    nlohmann::json no_stack;
    no_stack["message"]["message"] = "KeyError: 'lr'";
    no_stack["message"]["extraInfo"]["timestamp"] = std::to_string(T + 2);
    no_stack["message"]["errorCode"] = 1;
    write("r5.json", no_stack);
    nlohmann::json wide;
    wide["message"]["message"] = "xxxxxxxxxx";
    wide["message"]["extraInfo"]["py_callstack"] = "Traceback:\n" + std::string(30, 'x') +
                                                   " \xE2\x9C\x93\xE2\x9C\x93 " + std::string(60, 'y') + "\n";
    wide["message"]["extraInfo"]["timestamp"] = std::to_string(T);
    write("r6.json", wide);

    // Each failure: rank, exit, when the agent noticed it, pid, error file (relative to dir).
    struct spec_failure {
        int rank;
        exit_status status;
        long long notice;
        long pid;
        std::string file;
    };
    struct scenario {
        std::string name;
        std::vector<spec_failure> failures;
    };
    const std::vector<scenario> scenarios = {
        {"train.py",
         {{0, exit_status::from_exit_code(1), T + 6, 100, "r0.json"},
          {1, exit_status::from_exit_code(1), T + 3, 101, "missing.json"},
          {2, exit_status::from_signal(9), T + 4, 102, "missing.json"},
          {3, exit_status::from_exit_code(1), T + 8, 103, "r3.json"}}},
        {"native_trainer", {{0, exit_status::from_signal(11), T, 7, "missing.json"}}},
        {"x",
         {{4, exit_status::from_signal(6), T + 3, 8, "missing.json"},
          {5, exit_status::from_exit_code(1), T + 3, 9, "r5.json"}}},
        {"wide", {{6, exit_status::from_exit_code(1), T + 1, 10, "r6.json"}}},
    };

    nlohmann::json spec;
    spec["host"] = "node0.example.com";
    std::vector<std::string> ours;
    for (const auto& s : scenarios) {
        nlohmann::json js;
        js["name"] = s.name;
        std::vector<worker_failure> failures;
        for (const auto& f : s.failures) {
            js["failures"].push_back({{"rank", f.rank},
                                      {"local_rank", f.rank},
                                      {"pid", f.pid},
                                      {"exitcode", f.status.returncode()},
                                      {"error_file", f.file},
                                      {"notice", f.notice}});
            auto w = observed(f.rank, f.status, f.notice, f.pid);
            w.error_file = elastic::read_error_file(dir / f.file);
            w.error_file.path = f.file;  // torch is given the relative name
            failures.push_back(w);
        }
        spec["scenarios"].push_back(js);
        ours.push_back(elastic::format_summary(s.name, failures, {.utc = true}));
    }
    report_support::write_file(dir / "spec.json", spec.dump());
    const auto r = run_python(dir, torch_summary_script, {dir.path()}, {{"TZ", "UTC"}});
    CAPTURE(r.err);
    REQUIRE(exit_status::from_wait_status(r.wait_status).success());
    std::vector<std::string> theirs;
    std::size_t start = 0;
    for (;;) {
        const auto end = r.out.find('\0', start);
        theirs.push_back(r.out.substr(start, end == std::string::npos ? end : end - start));
        if (end == std::string::npos) {
            break;
        }
        start = end + 1;
    }
    REQUIRE(theirs.size() == ours.size());
    for (std::size_t i = 0; i < ours.size(); ++i) {
        CAPTURE(i);
        CHECK(ours[i] == theirs[i]);
    }
}

TEST_CASE("report: torch's Event.deserialize reads our events") {
    report_support::temp_dir dir;
    elastic::worker_event_context ctx;
    ctx.run_id = "job";
    ctx.entry_point = "trainer";
    ctx.hostname = "node0.example.com";
    auto f = observed(3, exit_status::from_signal(6), 1795316400, 77);
    {
        elastic::event_log log(dir / "events.jsonl");
        REQUIRE(log.record(elastic::worker_status_event(f, ctx)));
        f.state = elastic::failure_state::stopped_by_agent;
        REQUIRE(log.record(elastic::worker_status_event(f, ctx)));
        // An error file with nesting, a list, numbers, non-ASCII text and escapes: its raw_error
        // must be what Python's json.dumps writes for the same document.
        f.state = elastic::failure_state::failed;
        f.error_file = elastic::parse_error_file(
            R"({"message": {"message": "RuntimeError: caf\u00e9 \u2603 \"q\"\n\t", "extraInfo": {"py_callstack": "a\\b", "timestamp": "1795316400"}}, "list": [1, 2.5, -3, true, null, [], {}], "\ud83d\ude00": "x"})",
            "/e");
        REQUIRE(f.error_file.parsed());
        REQUIRE(log.record(elastic::worker_status_event(f, ctx)));
        REQUIRE(log.record(elastic::worker_succeeded_event(
            {78, 1, 4, "default"}, ctx, std::chrono::system_clock::time_point(std::chrono::seconds(1795316401)))));
    }
    const auto r = run_python(dir, R"PY(
import json, sys
from torch.distributed.elastic.events import Event, EventSource
out = []
with open(sys.argv[1]) as fp:
    for line in fp:
        e = Event.deserialize(line)
        assert e.source in (EventSource.AGENT, EventSource.WORKER)
        out.append({"name": e.name, "source": e.source.value, "timestamp": e.timestamp,
                    "state": e.metadata["state"], "raw_error": e.metadata["raw_error"],
                    "reserialized": json.loads(e.serialize()) == json.loads(line),
                    # torch writes both texts with json.dumps: ours must be byte for byte the same
                    "metadata_as_torch": json.dumps(json.loads(e.metadata["metadata"])) == e.metadata["metadata"],
                    "raw_error_as_torch": e.metadata["raw_error"] is None
                        or json.dumps(json.loads(e.metadata["raw_error"])) == e.metadata["raw_error"]})
print(json.dumps(out))
)PY",
                              {dir / "events.jsonl"});
    CAPTURE(r.err);
    REQUIRE(exit_status::from_wait_status(r.wait_status).success());
    const auto out = nlohmann::json::parse(r.out);
    REQUIRE(out.size() == 4);
    for (const auto& e : out) {
        CAPTURE(e.dump());
        CHECK(e["reserialized"] == true);
        CHECK(e["metadata_as_torch"] == true);
        CHECK(e["raw_error_as_torch"] == true);
    }
    CHECK(out[0]["name"] == "torchelastic.worker.status.FAILED");
    CHECK(out[0]["source"] == "WORKER");
    CHECK(out[0]["timestamp"] == 1795316400000);
    CHECK(out[0]["raw_error"] == R"({"message": "<NONE>"})");
    CHECK(out[0]["reserialized"] == true);
    CHECK(out[1]["state"] == "TERMINATED");
    CHECK(out[1]["raw_error"].is_null());
    CHECK(out[2]["state"] == "FAILED");
    CHECK(nlohmann::json::parse(out[2]["raw_error"].get<std::string>())["list"].size() == 7);
    CHECK(out[3]["name"] == "torchelastic.worker.status.SUCCEEDED");
    CHECK(out[3]["timestamp"] == 1795316401000);
    CHECK(out[3]["raw_error"].is_null());
}

TEST_CASE("report: signal names agree with Python's") {
    report_support::temp_dir dir;
    const auto r = run_python(dir, R"PY(
import signal
for n in range(0, 70):
    try:
        print(n, signal.Signals(n).name)
    except ValueError:
        pass
)PY");
    REQUIRE(exit_status::from_wait_status(r.wait_status).success());
    int named = 0;
    std::size_t start = 0;
    while (start < r.out.size()) {
        const auto end = r.out.find('\n', start);
        const std::string line = r.out.substr(start, end - start);
        start = end + 1;
        const auto space = line.find(' ');
        const int n = std::stoi(line.substr(0, space));
        CAPTURE(n);
        CHECK(elastic::signal_name(n) == line.substr(space + 1));
        ++named;
    }
    CHECK(named >= 33);
}

TEST_CASE("report: a native worker's uncaught exception is reported with its stderr") {
    elastic::stderr_tail tail;
    const auto r = report_support::run({native_crash(), "throw"}, {},
                                       [&](std::string_view chunk) { tail.feed(chunk); });
    worker_failure f;
    f.pid = r.pid;
    f.host = "node0.example.com";
    f.status = exit_status::from_wait_status(r.wait_status);
    f.observe_now();
    f.error_file = elastic::read_error_file("");
    f.stderr_tail = tail.snapshot();
    CHECK(f.status.signal() == SIGABRT);  // with or without a core dump
    CHECK(elastic::launcher_exit_code(f) == 134);
    const auto text = elastic::format_summary("report-native-crash", std::vector{f});
    CAPTURE(text);
    CHECK(text.find(fmt::format("  traceback : Signal 6 (SIGABRT) received by PID {}\n", r.pid)) != std::string::npos);
    CHECK(text.find("\n    loading shard 7 of 8\n") != std::string::npos);
    CHECK(text.find("what():  NCCL error: unhandled system error") != std::string::npos);
    CHECK(text.find("  error_file: <N/A>\n") != std::string::npos);
}

TEST_CASE("report: a native worker's fatal signal and exit code") {
    {
        elastic::stderr_tail tail;
        const auto r = report_support::run({native_crash(), "signal", "11"}, {},
                                           [&](std::string_view c) { tail.feed(c); });
        const auto status = exit_status::from_wait_status(r.wait_status);
        CHECK(status.signal() == SIGSEGV);  // with or without a core dump
        CHECK(status.shell_code() == 139);
        CHECK(tail.snapshot().lines.back() == "loading shard 7 of 8");
    }
    {
        elastic::stderr_tail tail;
        const auto r = report_support::run({native_crash(), "exit", "42"}, {},
                                           [&](std::string_view c) { tail.feed(c); });
        worker_failure f;
        f.status = exit_status::from_wait_status(r.wait_status);
        f.stderr_tail = tail.snapshot();
        CHECK(elastic::launcher_exit_code(f) == 42);
        CHECK(elastic::failure_traceback(f) ==
              "stderr (3 lines):\n  worker starting (mode exit)\n  loading shard 7 of 8\n"
              "  fatal: checkpoint directory is not writable");
    }
}

TEST_CASE("report: a worker flooding stderr keeps only the bounded tail") {
    elastic::stderr_tail tail;
    const auto r = report_support::run({native_crash(), "flood", "100000"}, {},
                                       [&](std::string_view c) { tail.feed(c); });
    CHECK(exit_status::from_wait_status(r.wait_status) == exit_status::from_exit_code(3));
    const auto s = tail.snapshot();
    REQUIRE(s.lines.size() == elastic::stderr_tail::default_max_lines);
    CHECK(s.total_lines == 100003);
    CHECK(s.total_bytes == r.err.size());
    CHECK(s.lines.front() == "step 99982: loss=nan");
    CHECK(s.lines[18] == "step 100000: loss=nan");
    CHECK(s.lines.back() == "giving up after 100000 steps");
    worker_failure f;
    f.stderr_tail = s;
    CHECK(elastic::failure_traceback(f).find("stderr (last 20 of 100003 lines):\n") == 0);
}

TEST_CASE("report: reads the error file elastic::record writes") {
    report_support::temp_dir dir;
    const std::string program = ELASTIC_TEST_PROGRAM_DIR "/report-recorded-crash";
    {
        const std::string error_file = dir / "throw.json";
        const auto r = report_support::run({program, "throw"}, {{"TORCHELASTIC_ERROR_FILE", error_file}});
        CAPTURE(r.err);
        const auto status = exit_status::from_wait_status(r.wait_status);
        CHECK(status == exit_status::from_exit_code(1));
        const auto read = elastic::read_error_file(error_file);
        CAPTURE(read.problem);
        REQUIRE(read.parsed());
        CHECK(read.content.format == elastic::error_file_format::nested);
        CHECK(read.content.message == "std::runtime_error: checkpoint step_1200.pt is truncated");
        REQUIRE(read.content.traceback);
        CHECK(read.content.traceback->find("report_recorded_crash_load_checkpoint") != std::string::npos);
        CHECK(read.content.timestamp);

        auto f = observed(0, status, 1795316400, r.pid);
        f.observe_now();
        f.error_file = read;
        const auto text = elastic::format_summary("report-recorded-crash", std::vector{f});
        CHECK(text.find("  error_file: " + error_file + "\n") != std::string::npos);
        // The C++ backtrace does not contain the message, so it comes first.
        CHECK(text.find("  traceback : std::runtime_error: checkpoint step_1200.pt is truncated\n"
                        "  C++ backtrace") != std::string::npos);
        CHECK(text.find("report_recorded_crash_load_checkpoint") != std::string::npos);
        // The agent's copy keeps the worker's message and adds the exit code.
        const auto doc = elastic::agent_error_document(f);
        CHECK(doc["message"]["message"] == read.content.message);
        CHECK(doc["message"]["errorCode"] == 1);
    }
    {
        const std::string error_file = dir / "segv.json";
        const auto r = report_support::run({program, "segv"}, {{"TORCHELASTIC_ERROR_FILE", error_file}});
        CAPTURE(r.err);
        const auto status = exit_status::from_wait_status(r.wait_status);
        CHECK(status.signal() == SIGSEGV);
        const auto read = elastic::read_error_file(error_file);
        CAPTURE(read.problem);
        REQUIRE(read.parsed());
        CHECK(read.content.message.find("SIGSEGV") != std::string::npos);
        auto f = observed(0, status, 1795316400, r.pid);
        f.error_file = read;
        CHECK(elastic::launcher_exit_code(f) == 139);
        CHECK(elastic::agent_error_document(f)["message"]["errorCode"] == -11);
        // No stray temporary file from the worker's atomic write.
        for (const auto& name : report_support::list_dir(dir.path())) {
            CHECK(name.find(".tmp.") == std::string::npos);
        }
    }
}
