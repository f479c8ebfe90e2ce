// Tests of the report layer without Python: signal names, exit statuses of real children, the
// stderr tail, the error-file reader on good and broken files, the root-cause rule, exit codes,
// the summary against golden files, and the agent's own error file.
#include "elastic/report.hpp"

#include "report_support.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <climits>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

namespace test_report {

using namespace std::chrono_literals;
using elastic::error_file_format;
using elastic::error_file_status;
using elastic::exit_status;
using elastic::failure_state;
using elastic::worker_failure;
using report_support::failure;

/// A torch @record error file (ErrorHandler.record_exception's shape) as JSON text.
inline std::string torch_error_json(std::string_view message, std::string_view callstack, long long timestamp) {
    nlohmann::json j;
    j["message"]["message"] = message;
    j["message"]["extraInfo"]["py_callstack"] = callstack;
    j["message"]["extraInfo"]["timestamp"] = std::to_string(timestamp);
    return j.dump();
}

inline elastic::error_file_read parse(std::string_view text) {
    return elastic::parse_error_file(text, "/run/error.json");
}

inline void check_malformed(std::string_view text, std::string_view expected_problem_part) {
    CAPTURE(text);
    const auto r = parse(text);
    CHECK(r.status == error_file_status::malformed);
    CHECK(r.problem.find(expected_problem_part) != std::string::npos);
    CAPTURE(r.problem);
    // The reason must itself be safe to print and to put into JSON.
    CHECK(elastic::detail::report::valid_utf8(r.problem) == r.problem);
}

/// Compare `text` with tests/report/golden/<name>.txt (the file holds the text plus a final
/// newline). ELASTIC_UPDATE_GOLDEN=1 rewrites the file instead.
inline void check_golden(const std::string& name, const std::string& text) {
    const std::string path = std::string(ELASTIC_TEST_SOURCE_DIR) + "/tests/report/golden/" + name + ".txt";
    if (const char* update = std::getenv("ELASTIC_UPDATE_GOLDEN"); update && *update == '1') {
        report_support::write_file(path, text + "\n");
    }
    REQUIRE(report_support::file_exists(path));
    const std::string expected = report_support::read_file(path);
    CHECK(text + "\n" == expected);
}

constexpr elastic::summary_options utc{.utc = true};

const std::string python_traceback = "Traceback (most recent call last):\n"
                                     "  File \"/opt/job/train.py\", line 41, in <module>\n"
                                     "    main()\n"
                                     "  File \"/opt/job/train.py\", line 37, in main\n"
                                     "    raise ValueError(\"loss is nan at step 1200\")\n"
                                     "ValueError: loss is nan at step 1200\n";

}  // namespace test_report

using namespace test_report;

// ---- signal names and exit statuses -----------------------------------------------------------

TEST_CASE("report: signal names follow Python's signal.Signals and kill -l") {
    CHECK(elastic::signal_name(1) == "SIGHUP");
    CHECK(elastic::signal_name(6) == "SIGABRT");
    CHECK(elastic::signal_name(9) == "SIGKILL");
    CHECK(elastic::signal_name(11) == "SIGSEGV");
    CHECK(elastic::signal_name(15) == "SIGTERM");
    CHECK(elastic::signal_name(16) == "SIGSTKFLT");
    CHECK(elastic::signal_name(29) == "SIGIO");
    CHECK(elastic::signal_name(31) == "SIGSYS");
    CHECK(elastic::signal_name(SIGRTMIN) == "SIGRTMIN");
    CHECK(elastic::signal_name(SIGRTMIN + 1) == "SIGRTMIN+1");
    CHECK(elastic::signal_name(SIGRTMIN + 15) == "SIGRTMIN+15");
    CHECK(elastic::signal_name(SIGRTMAX - 14) == "SIGRTMAX-14");
    CHECK(elastic::signal_name(SIGRTMAX) == "SIGRTMAX");
    for (const int unknown : {0, 32, 33, SIGRTMAX + 1, 1000, -1, -9}) {
        CAPTURE(unknown);
        CHECK(elastic::signal_name(unknown) == "<N/A>");
    }
    CHECK(elastic::signal_message(9, 1234) == "Signal 9 (SIGKILL) received by PID 1234");
    CHECK(elastic::signal_message(77, 5) == "Signal 77 (<N/A>) received by PID 5");
}

TEST_CASE("report: exit statuses of real children, in torchrun's and the shell's numbering") {
    const auto killed = report_support::run({"/bin/sh", "-c", "kill -KILL $$"});
    const auto k = exit_status::from_wait_status(killed.wait_status);
    CHECK(k == exit_status::from_signal(9));
    CHECK(k.signaled());
    CHECK(k.returncode() == -9);
    CHECK(k.shell_code() == 137);

    const auto exited = report_support::run({"/bin/sh", "-c", "exit 3"});
    const auto e = exit_status::from_wait_status(exited.wait_status);
    CHECK(e == exit_status::from_exit_code(3));
    CHECK_FALSE(e.signaled());
    CHECK_FALSE(e.success());
    CHECK(e.returncode() == 3);
    CHECK(e.shell_code() == 3);

    const auto ok = report_support::run({"/bin/sh", "-c", "exit 0"});
    CHECK(exit_status::from_wait_status(ok.wait_status).success());

    CHECK(exit_status::from_siginfo(CLD_EXITED, 2) == exit_status::from_exit_code(2));
    CHECK(exit_status::from_siginfo(CLD_KILLED, 15) == exit_status::from_signal(15));
    CHECK(exit_status::from_siginfo(CLD_DUMPED, 11) == exit_status::from_signal(11, true));
    CHECK(exit_status::from_siginfo(CLD_DUMPED, 11).describe() == "killed by signal 11 (SIGSEGV), core dumped");
    CHECK(exit_status::from_siginfo(CLD_DUMPED, 11).returncode() == -11);
    CHECK(exit_status::from_siginfo(CLD_DUMPED, 11).shell_code() == 139);
    CHECK(exit_status::from_signal(SIGRTMAX).shell_code() == 128 + SIGRTMAX);
    // Nonsense numbers neither overflow nor pass for an exit code.
    CHECK(exit_status::from_signal(INT_MAX).shell_code() == 255);
    CHECK(exit_status::from_signal(0).shell_code() == 255);
    CHECK(exit_status::from_signal(INT_MIN).returncode() == INT_MAX);
}

// ---- stderr tail --------------------------------------------------------------------------------

TEST_CASE("report: stderr tail is the same however the stream is chunked") {
    const std::string stream = "line one\nline two\r\nprogress 10%\rprogress 90%\rprogress 100%\nlast, unterminated";
    const std::vector<std::string> expected = {"line one", "line two", "progress 100%", "last, unterminated"};
    // Every split point, and byte by byte.
    for (std::size_t cut = 0; cut <= stream.size(); ++cut) {
        elastic::stderr_tail tail;
        tail.feed(std::string_view(stream).substr(0, cut));
        tail.feed(std::string_view(stream).substr(cut));
        const auto s = tail.snapshot();
        CAPTURE(cut);
        CHECK(s.lines == expected);
        CHECK(s.total_lines == 4);
        CHECK(s.total_bytes == stream.size());
    }
    elastic::stderr_tail bytewise;
    for (const char c : stream) {
        bytewise.feed(std::string_view(&c, 1));
    }
    CHECK(bytewise.snapshot().lines == expected);
}

TEST_CASE("report: stderr tail keeps the last N lines and counts all") {
    elastic::stderr_tail tail(3);
    CHECK(tail.snapshot().empty());
    for (int i = 1; i <= 10; ++i) {
        tail.feed("message " + std::to_string(i) + "\n");
    }
    auto s = tail.snapshot();
    CHECK(s.lines == std::vector<std::string>{"message 8", "message 9", "message 10"});
    CHECK(s.total_lines == 10);
    // An unterminated final line pushes the oldest out of the snapshot, not out of the ring.
    tail.feed("partial");
    s = tail.snapshot();
    CHECK(s.lines == std::vector<std::string>{"message 9", "message 10", "partial"});
    CHECK(s.total_lines == 11);
    tail.feed(" line\n");
    CHECK(tail.snapshot().lines == std::vector<std::string>{"message 9", "message 10", "partial line"});
    // Empty lines are lines.
    tail.feed("\n\n");
    CHECK(tail.snapshot().lines == std::vector<std::string>{"partial line", "", ""});
    tail.clear();
    CHECK(tail.snapshot().empty());
    CHECK(tail.snapshot().total_bytes == 0);
    CHECK(elastic::stderr_tail::default_max_lines == 20);
}

TEST_CASE("report: stderr tail truncates long lines on a UTF-8 boundary and repairs bad bytes") {
    elastic::stderr_tail tail(5, 32);
    // 40 bytes of 'a' then a newline: 32 kept, 8 counted.
    tail.feed(std::string(40, 'a') + "\n");
    // 31 ASCII bytes then a 2-byte character straddling the 32-byte bound: it is cut whole.
    tail.feed(std::string(31, 'b') + "\xC3\xA9" + "tail\n");
    // Invalid bytes and a lone continuation byte become U+FFFD; valid multi-byte text stays.
    tail.feed("bad \xFF\xFE byte \x80 ok \xE2\x9C\x93\n");
    // A line cut short by the end of the stream in the middle of a character.
    tail.feed("end \xE2\x9C");
    const auto s = tail.snapshot();
    REQUIRE(s.lines.size() == 4);
    CHECK(s.lines[0] == std::string(32, 'a') + " [... 8 more bytes]");
    CHECK(s.lines[1] == std::string(31, 'b') + " [... 6 more bytes]");
    CHECK(s.lines[2] == "bad \xEF\xBF\xBD\xEF\xBF\xBD byte \xEF\xBF\xBD ok \xE2\x9C\x93");
    CHECK(s.lines[3] == "end \xEF\xBF\xBD\xEF\xBF\xBD");
    for (const auto& line : s.lines) {
        CHECK(elastic::detail::report::valid_utf8(line) == line);
        // Every line can be serialised as JSON without an exception.
        CHECK_NOTHROW((void)nlohmann::json(line).dump());
    }
    // A megabyte without a newline costs at most one bounded line.
    elastic::stderr_tail flood(2, 64);
    flood.feed(std::string(1 << 20, 'x'));
    const auto f = flood.snapshot();
    REQUIRE(f.lines.size() == 1);
    CHECK(f.lines[0].size() < 100);
    CHECK(f.total_bytes == (1u << 20));
}

// ---- error files --------------------------------------------------------------------------------

TEST_CASE("report: error file in @record's nested format") {
    const auto r = parse(torch_error_json("ValueError: boom", python_traceback, 1795316400));
    REQUIRE(r.status == error_file_status::parsed);
    CHECK(r.path == "/run/error.json");
    const auto& c = r.content;
    CHECK(c.format == error_file_format::nested);
    CHECK(c.message == "ValueError: boom");
    REQUIRE(c.traceback);
    CHECK(*c.traceback == python_traceback);
    REQUIRE(c.timestamp);
    CHECK(c.timestamp->time_since_epoch() == std::chrono::seconds(1795316400));
    CHECK(c.timestamp_whole_seconds);
    CHECK_FALSE(c.error_code);

    // After a parent copied it up: errorCode inside the outer message; numbers as timestamps.
    const auto copied = parse(R"({"message": {"message": "RuntimeError: x", "extraInfo":
        {"py_callstack": "tb", "timestamp": 1795316400}, "errorCode": -9}})");
    REQUIRE(copied.parsed());
    CHECK(copied.content.error_code == -9);
    CHECK(copied.content.timestamp->time_since_epoch() == std::chrono::seconds(1795316400));

    // Fields torchrun treats as optional when formatting are optional here too.
    const auto bare = parse(R"({"message": {"message": "only a message"}})");
    REQUIRE(bare.parsed());
    CHECK(bare.content.message == "only a message");
    CHECK_FALSE(bare.content.traceback);
    CHECK_FALSE(bare.content.timestamp);

    // Sub-second precision is kept when a writer gives it.
    const auto precise = parse(R"({"message": {"message": "m", "extraInfo":
        {"timestamp": "1795316400.25"}}})");
    REQUIRE(precise.parsed());
    CHECK_FALSE(precise.content.timestamp_whole_seconds);
    CHECK(precise.content.timestamp->time_since_epoch() == std::chrono::milliseconds(1795316400250));
}

TEST_CASE("report: error file in the flat format") {
    const auto r = parse(R"({"message": "CUDA error: out of memory", "timestamp": 1795316401})");
    REQUIRE(r.parsed());
    CHECK(r.content.format == error_file_format::flat);
    CHECK(r.content.message == "CUDA error: out of memory");
    CHECK(r.content.timestamp->time_since_epoch() == std::chrono::seconds(1795316401));
    CHECK_FALSE(r.content.traceback);

    const auto string_ts = parse(R"({"message": "m", "timestamp": "1795316401"})");
    REQUIRE(string_ts.parsed());
    CHECK(string_ts.content.timestamp->time_since_epoch() == std::chrono::seconds(1795316401));

    // torchrun reads a missing timestamp as 0 (which makes it the root cause); we read "none".
    const auto no_ts = parse(R"({"message": "m"})");
    REQUIRE(no_ts.parsed());
    CHECK_FALSE(no_ts.content.timestamp);

    const auto with_code = parse(R"({"message": "m", "errorCode": 3})");
    REQUIRE(with_code.parsed());
    CHECK(with_code.content.error_code == 3);
}

TEST_CASE("report: malformed error files are reported with the reason, never thrown") {
    check_malformed("", "empty");
    check_malformed(" \n\t ", "white space");
    check_malformed("{\"message\": {\"message\": \"cut off", "not valid JSON");
    check_malformed("not json at all", "not valid JSON");
    check_malformed("{} trailing", "not valid JSON");
    check_malformed("[1, 2]", "top level is a JSON array");
    check_malformed("42", "top level is a JSON number");
    check_malformed("{}", "no \"message\"");
    check_malformed(R"({"msg": "typo"})", "no \"message\"");
    check_malformed(R"({"message": 5})", "neither a string nor an object");
    check_malformed(R"({"message": null})", "neither a string nor an object");
    check_malformed(R"({"message": {"message": 7}})", "\"message.message\" is a JSON number");
    check_malformed(R"({"message": {"message": "m", "extraInfo": "x"}})", "\"message.extraInfo\" is a JSON string");
    check_malformed(R"({"message": {"message": "m", "extraInfo": {"py_callstack": [1]}}})",
                    "py_callstack\" is a JSON array");
    check_malformed(R"({"message": {"message": "m", "extraInfo": {"timestamp": "soon"}}})",
                    "is not a number of seconds");
    check_malformed(R"({"message": {"message": "m", "extraInfo": {"timestamp": "1e9"}}})",
                    "is not a number of seconds");
    check_malformed(R"({"message": {"message": "m", "extraInfo": {"timestamp": -5}}})", "is not a number of seconds");
    check_malformed(R"({"message": {"message": "m", "extraInfo": {"timestamp": 1e300}}})",
                    "is not a number of seconds");
    check_malformed(R"({"message": "m", "timestamp": {}})", "is not a number of seconds");
    // Past 2200: found by the fuzzer, it overflowed system_clock's nanoseconds.
    check_malformed(R"({"message": "flat", "timestamp": 9795316400})", "is not a number of seconds");
    CHECK(parse(R"({"message": "m", "timestamp": 7258118400})").parsed());
    check_malformed(R"({"message": {"message": "m", "errorCode": "137"}})", "errorCode\" \"137\" is not an integer");
    // Raw bytes that are not UTF-8 inside a string: invalid JSON, and the reason is printable.
    check_malformed("{\"message\": \"caf\xE9 \xFF\"}", "not valid JSON");
    check_malformed(std::string("{\"message\": \"nul\0byte\"}", 23), "not valid JSON");
    // Nesting bombs are refused before parsing.
    check_malformed(std::string(100000, '[') + std::string(100000, ']'), "nested deeper");
    check_malformed("{\"message\": " + std::string(40, '[') + std::string(40, ']') + "}", "nested deeper");
    // Too large.
    check_malformed(std::string(elastic::max_error_file_bytes + 1, ' '), "more than");
}

TEST_CASE("report: Python's lone-surrogate escapes are repaired, not rejected") {
    // json.dump of a traceback holding undecodable bytes (surrogateescape) writes "\udcff".
    const auto r = parse(R"({"message": {"message": "OSError: bad \udcff name \ud83d\ude00 ok",
        "extraInfo": {"py_callstack": "\ud800", "timestamp": "1"}}})");
    REQUIRE(r.parsed());
    CHECK(r.content.message == "OSError: bad \xEF\xBF\xBD name \xF0\x9F\x98\x80 ok");
    CHECK(*r.content.traceback == "\xEF\xBF\xBD");
    // An escaped backslash before "u" is not an escape.
    const auto s = parse(R"({"message": "path C:\\udcff"})");
    REQUIRE(s.parsed());
    CHECK(s.content.message == "path C:\\udcff");
}

TEST_CASE("report: reading error files from disk") {
    report_support::temp_dir dir;
    // No path, no file, a missing directory: absent, which torchrun shows as <N/A>.
    CHECK(elastic::read_error_file("").status == error_file_status::absent);
    const auto missing = elastic::read_error_file(dir / "missing.json");
    CHECK(missing.status == error_file_status::absent);
    CHECK(missing.path == dir / "missing.json");
    CHECK(elastic::read_error_file(dir / "no/such/dir.json").status == error_file_status::absent);

    report_support::write_file(dir / "good.json", torch_error_json("KeyError: 'lr'", "tb", 7));
    const auto good = elastic::read_error_file(dir / "good.json");
    REQUIRE(good.parsed());
    CHECK(good.content.message == "KeyError: 'lr'");
    CHECK(good.path == dir / "good.json");

    report_support::write_file(dir / "cut.json", "{\"message\": {\"mess");
    const auto cut = elastic::read_error_file(dir / "cut.json");
    CHECK(cut.status == error_file_status::malformed);
    CHECK(cut.path == dir / "cut.json");

    // A directory, and a FIFO nobody writes to (opening it must not block).
    CHECK(elastic::read_error_file(dir.path()).problem == "not a regular file");
    REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
    const auto fifo = elastic::read_error_file(dir / "fifo");
    CHECK(fifo.status == error_file_status::malformed);
    CHECK(fifo.problem == "not a regular file");

    // Larger than the bound: refused by size without reading it all.
    {
        std::string big(elastic::max_error_file_bytes + 10, 'x');
        report_support::write_file(dir / "big.json", big);
    }
    const auto big = elastic::read_error_file(dir / "big.json");
    CHECK(big.status == error_file_status::malformed);
    CHECK(big.problem.find("more than") != std::string::npos);

    if (::geteuid() != 0) {  // root reads anything
        report_support::write_file(dir / "locked.json", "{}");
        ::chmod((dir / "locked.json").c_str(), 0);
        const auto locked = elastic::read_error_file(dir / "locked.json");
        CHECK(locked.status == error_file_status::malformed);
        CHECK(locked.problem.find("cannot be opened") != std::string::npos);
    }
}

// ---- root cause and exit codes ------------------------------------------------------------------

TEST_CASE("report: root cause is the earliest observed failure, lowest rank on a tie") {
    std::vector<worker_failure> fs = {failure(2, exit_status::from_exit_code(1), 300ms),
                                      failure(0, exit_status::from_exit_code(1), 200ms),
                                      failure(1, exit_status::from_signal(9), 100ms)};
    CHECK(elastic::root_cause(fs) == 2u);
    fs[2].observed_steady += 100ms;  // rank 1 and rank 0 now at the same instant
    fs[2].observed_system += 100ms;
    CHECK(elastic::root_cause(fs) == 1u);  // rank 0
    CHECK(elastic::launcher_exit_code(fs) == 1);

    // The steady clock orders, not the wall clock (which may have been stepped back).
    std::vector<worker_failure> stepped = {failure(0, exit_status::from_exit_code(4), 500ms),
                                           failure(1, exit_status::from_exit_code(5), 900ms)};
    stepped[1].observed_system -= std::chrono::hours(1);
    CHECK(elastic::root_cause(stepped) == 0u);

    CHECK_FALSE(elastic::root_cause({}));
    CHECK_FALSE(elastic::launcher_exit_code(std::span<const worker_failure>{}));
}

TEST_CASE("report: workers stopped by the agent are never the root cause") {
    std::vector<worker_failure> fs = {failure(0, exit_status::from_signal(15), 100ms),
                                      failure(1, exit_status::from_exit_code(2), 200ms)};
    fs[0].state = failure_state::stopped_by_agent;
    CHECK(elastic::root_cause(fs) == 1u);
    CHECK(elastic::launcher_exit_code(fs) == 2);
    fs[1].state = failure_state::stopped_by_agent;
    CHECK_FALSE(elastic::root_cause(fs));
    CHECK_FALSE(elastic::launcher_exit_code(fs));
}

TEST_CASE("report: an error file's time counts only when it proves an earlier failure") {
    using namespace std::chrono;
    // Rank 0 is observed at +2.5 s, rank 1 at +1.0 s (origin is a whole second, T).
    std::vector<worker_failure> fs = {failure(0, exit_status::from_exit_code(1), 2500ms),
                                      failure(1, exit_status::from_exit_code(1), 1000ms)};
    const auto T = duration_cast<seconds>(fs[0].observed_system.time_since_epoch()) - 2s;
    const auto with_file_time = [](worker_failure& f, seconds ts) {
        f.error_file = elastic::parse_error_file(torch_error_json("E: e", "tb", ts.count()), "/e.json");
        REQUIRE(f.error_file.parsed());
    };
    // Rank 0's file says T+1: the second [T+1, T+2) may have ended after rank 1's exit at T+1.0,
    // so it proves nothing; rank 1 stays the root cause.
    with_file_time(fs[0], T + 1s);
    CHECK(elastic::root_cause(fs) == 1u);
    // Rank 0's file says T-1: the error happened before T, earlier than rank 1's exit at T+1.
    with_file_time(fs[0], T - 1s);
    CHECK(elastic::root_cause(fs) == 0u);
    CHECK(elastic::failure_time(fs[0]) == fs[0].observed_steady - 2500ms - 1ns);
    // The second is half-open: a file saying T (the error happened in [T, T+1)) is earlier than
    // an exit observed at exactly T+1.0, and wins even against a lower rank.
    with_file_time(fs[0], T);
    CHECK(elastic::root_cause(fs) == 0u);
    with_file_time(fs[0], T + 1s);
    CHECK(elastic::root_cause(fs) == 1u);
    // A file time after the observation (a skewed or bogus stamp) never moves a failure later.
    with_file_time(fs[1], T + 100s);
    CHECK(elastic::failure_time(fs[1]) == fs[1].observed_steady);
    // Display: the file's time when it has one, as torchrun shows.
    CHECK(elastic::failure_display_time(fs[0]).time_since_epoch() == T + 1s);
    // A malformed file's time is not used.
    fs[0].error_file = elastic::parse_error_file("{", "/e.json");
    CHECK(elastic::failure_time(fs[0]) == fs[0].observed_steady);
    CHECK(elastic::root_cause(fs) == 1u);
}

TEST_CASE("report: torchrun's log line for a detected failure") {
    CHECK(elastic::failure_log_line(failure(1, exit_status::from_signal(9), 0ms), "train.py") ==
          "failed (exitcode: -9) local_rank: 1 (pid: 4201) of binary: train.py");
    CHECK(elastic::failure_log_line(failure(0, exit_status::from_exit_code(3), 0ms, 7), "a\xFF") ==
          "failed (exitcode: 3) local_rank: 0 (pid: 7) of binary: a\xEF\xBF\xBD");
}

TEST_CASE("report: elasticrun's exit code is the root cause's, 128+N for signal N") {
    CHECK(elastic::launcher_exit_code(failure(0, exit_status::from_exit_code(3), 0ms)) == 3);
    CHECK(elastic::launcher_exit_code(failure(0, exit_status::from_exit_code(255), 0ms)) == 255);
    CHECK(elastic::launcher_exit_code(failure(0, exit_status::from_signal(9), 0ms)) == 137);
    CHECK(elastic::launcher_exit_code(failure(0, exit_status::from_signal(11), 0ms)) == 139);
    CHECK(elastic::launcher_exit_code(failure(0, exit_status::from_signal(15), 0ms)) == 143);
    // A "failure" that exited 0 (the agent judged it failed for another reason) is still 1.
    CHECK(elastic::launcher_exit_code(failure(0, exit_status::from_exit_code(0), 0ms)) == 1);
    std::vector<worker_failure> fs = {failure(3, exit_status::from_exit_code(7), 50ms),
                                      failure(1, exit_status::from_signal(6), 10ms)};
    CHECK(elastic::launcher_exit_code(fs) == 134);
}

// ---- summary (golden files) ---------------------------------------------------------------------

TEST_CASE("report: summary of one failure without error file") {
    const std::vector<worker_failure> fs = {failure(0, exit_status::from_exit_code(1), 0ms)};
    const auto text = elastic::format_summary("train.py", fs, utc);
    check_golden("one_failure", text);
    CHECK(text.find(elastic::no_traceback_hint) != std::string::npos);
}

TEST_CASE("report: summary of several failures with a signal root cause") {
    std::vector<worker_failure> fs = {failure(3, exit_status::from_exit_code(1), 1500ms),
                                      failure(1, exit_status::from_signal(9), 1000ms),
                                      failure(0, exit_status::from_exit_code(1), 1700ms)};
    const auto text = elastic::format_summary("trainer", fs, utc);
    check_golden("several_failures", text);
    CHECK(text.find("Signal 9 (SIGKILL) received by PID 4201") != std::string::npos);
}

TEST_CASE("report: summary of a signal with stderr tail") {
    std::vector<worker_failure> fs = {failure(5, exit_status::from_signal(6), 0ms, 31337, 1)};
    elastic::stderr_tail tail(2);
    tail.feed("loading shard 7\nterminate called after throwing an instance of "
              "'std::runtime_error'\n  what():  NCCL error: unhandled system error\n");
    fs[0].stderr_tail = tail.snapshot();
    check_golden("signal_stderr_tail", elastic::format_summary("native_trainer", fs, utc));
}

TEST_CASE("report: summary of an exit with stderr tail and no error file") {
    std::vector<worker_failure> fs = {failure(0, exit_status::from_exit_code(2), 0ms)};
    elastic::stderr_tail tail;
    tail.feed("E1122 03:00:00.000 trainer.cc:88] Check failed: batch > 0\n");
    fs[0].stderr_tail = tail.snapshot();
    check_golden("stderr_tail", elastic::format_summary("trainer", fs, utc));
}

TEST_CASE("report: summary with error files from @record") {
    std::vector<worker_failure> fs = {failure(0, exit_status::from_exit_code(1), 2000ms),
                                      failure(1, exit_status::from_exit_code(1), 2100ms)};
    fs[0].error_file = elastic::parse_error_file(torch_error_json("ValueError: loss is nan at step 1200",
                                                                  python_traceback, 1795316401),
                                                 "/tmp/torchelastic_x/attempt_0/0/error.json");
    fs[1].error_file = elastic::parse_error_file(
        R"({"message": "flat message from a custom writer", "timestamp": 1795316402})",
        "/tmp/torchelastic_x/attempt_0/1/error.json");
    REQUIRE(fs[0].error_file.parsed());
    REQUIRE(fs[1].error_file.parsed());
    check_golden("error_file", elastic::format_summary("train.py", fs, utc));
}

TEST_CASE("report: summary with elastic::record's error file puts the message first") {
    std::vector<worker_failure> fs = {failure(0, exit_status::from_signal(11), 0ms)};
    nlohmann::json j;
    j["message"]["message"] = "SIGSEGV: segmentation fault (signal 11) in PID 4200";
    j["message"]["extraInfo"]["py_callstack"] =
        "C++ backtrace (most recent call first):\n"
        "  #0 0x55d0c0de1234 in trainer::step(int)+0x42 (/opt/job/trainer+0x1234)\n"
        "  #1 0x55d0c0de5678 in main+0x29 (/opt/job/trainer+0x5678)\n";
    j["message"]["extraInfo"]["timestamp"] = "1795316400";
    fs[0].error_file = elastic::parse_error_file(j.dump(), "/tmp/torchelastic_x/0/error.json");
    REQUIRE(fs[0].error_file.parsed());
    check_golden("record_error_file", elastic::format_summary("trainer", fs, utc));
}

TEST_CASE("report: summary with a malformed error file") {
    std::vector<worker_failure> fs = {failure(0, exit_status::from_signal(11), 0ms)};
    fs[0].error_file = elastic::parse_error_file("{\"message\": {\"mess", "/tmp/torchelastic_x/attempt_0/0/error.json");
    elastic::stderr_tail tail;
    tail.feed("Fatal Python error: Segmentation fault\n");
    fs[0].stderr_tail = tail.snapshot();
    const auto text = elastic::format_summary("train.py", fs, utc);
    check_golden("malformed_error_file", text);
    CHECK(text.find("Malformed error file: not valid JSON") != std::string::npos);
}

TEST_CASE("report: summary lists workers stopped by the agent apart from failures") {
    std::vector<worker_failure> fs;
    for (int rank = 0; rank < 4; ++rank) {
        fs.push_back(failure(rank, exit_status::from_signal(15), 1000ms));
        fs.back().state = failure_state::stopped_by_agent;
    }
    fs[2] = failure(2, exit_status::from_exit_code(1), 900ms);
    fs[3].status = exit_status::from_exit_code(0);  // exited cleanly on SIGTERM
    const auto text = elastic::format_summary("trainer", fs, utc);
    check_golden("stopped_by_agent", text);
    CHECK(text.find("<NO_OTHER_FAILURES>") != std::string::npos);
    // Only stopped workers (the agent itself was told to stop): no root cause to show.
    fs.erase(fs.begin() + 2);
    const auto none = elastic::format_summary("trainer", fs, utc);
    CHECK(none.find("Root Cause (first observed failure):\n  <NO_ROOT_CAUSE>\n") != std::string::npos);
}

TEST_CASE("report: summary width follows the longest line up to 60 columns") {
    const std::vector<worker_failure> fs = {failure(0, exit_status::from_exit_code(1), 0ms)};
    // A long title widens the borders, up to 60.
    const auto wide = elastic::format_summary(std::string(100, 'x'), fs, utc);
    CHECK(wide.find("\n" + std::string(60, '=') + "\n") == 0);
    // Width counts characters, not bytes (Python's len()): "  traceback : " + 40 x "é" is 54
    // characters (94 bytes), the longest line.
    std::vector<worker_failure> short_fs = {failure(0, exit_status::from_exit_code(1), 0ms)};
    std::string accents;
    for (int i = 0; i < 40; ++i) {
        accents += "\xC3\xA9";
    }
    short_fs[0].error_file = elastic::parse_error_file(nlohmann::json{{"message", accents}}.dump(), "/e");
    REQUIRE(short_fs[0].error_file.parsed());
    const auto narrow = elastic::format_summary("t", short_fs, utc);
    CHECK(narrow.find("\n" + std::string(54, '=') + "\n") == 0);
}

// ---- the agent's own error file -----------------------------------------------------------------

TEST_CASE("report: agent error file copies the root cause's file with errorCode") {
    auto f = failure(1, exit_status::from_signal(9), 0ms);
    f.error_file = elastic::parse_error_file(torch_error_json("RuntimeError: x", "Traceback ...", 1795316401),
                                             "/e.json");
    const auto doc = elastic::agent_error_document(f);
    CHECK(doc["message"]["message"] == "RuntimeError: x");
    CHECK(doc["message"]["extraInfo"]["py_callstack"] == "Traceback ...");
    CHECK(doc["message"]["extraInfo"]["timestamp"] == "1795316401");
    CHECK(doc["message"]["errorCode"] == -9);

    f.error_file = elastic::parse_error_file(R"({"message": "flat", "timestamp": 5})", "/e");
    f.status = exit_status::from_exit_code(3);
    const auto flat = elastic::agent_error_document(f);
    CHECK(flat["message"] == "flat");
    CHECK(flat["errorCode"] == 3);
}

TEST_CASE("report: agent error file for a worker without one") {
    auto f = failure(2, exit_status::from_signal(11), 0ms, 999);
    elastic::stderr_tail tail;
    tail.feed("about to crash\n");
    f.stderr_tail = tail.snapshot();
    const auto doc = elastic::agent_error_document(f);
    CHECK(doc["message"]["message"] == "Signal 11 (SIGSEGV) received by PID 999");
    CHECK(doc["message"]["extraInfo"]["py_callstack"] ==
          "Signal 11 (SIGSEGV) received by PID 999\nstderr (1 line):\n  about to crash");
    CHECK(doc["message"]["extraInfo"]["timestamp"] == "1795316400");
    CHECK(doc["message"]["errorCode"] == -11);
    // Round trip: our reader reads what our writer writes.
    const auto back = elastic::parse_error_file(doc.dump(), "/x");
    REQUIRE(back.parsed());
    CHECK(back.content.error_code == -11);

    auto e = failure(0, exit_status::from_exit_code(4), 0ms, 77);
    CHECK(elastic::agent_error_document(e)["message"]["message"] ==
          "Process 77 (rank: 0, local_rank: 0) exited with code 4");
}

TEST_CASE("report: agent error file is replaced atomically and bad paths throw report_error") {
    report_support::temp_dir dir;
    const std::string path = dir / "agent_error.json";
    report_support::write_file(path, "old contents");
    const auto f = failure(0, exit_status::from_exit_code(1), 0ms);
    elastic::write_agent_error_file(path, f);
    const auto written = elastic::read_error_file(path);
    REQUIRE(written.parsed());
    CHECK(written.content.error_code == 1);
    // No temporary file is left behind.
    CHECK(report_support::list_dir(dir.path()) == std::vector<std::string>{"agent_error.json"});
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0644);

    CHECK_THROWS_AS(elastic::write_agent_error_file(dir / "no/such/dir/e.json", f), elastic::report_error);
    CHECK_THROWS_AS(elastic::write_agent_error_file(dir.path() + "/", f), elastic::report_error);
    try {
        elastic::write_agent_error_file(dir / "no/such/dir/e.json", f);
    } catch (const elastic::error& e) {
        CHECK(std::string(e.what()).find("no/such/dir/e.json") != std::string::npos);
    }

    // From the environment, as torchrun's own main: unset writes nothing.
    ::unsetenv("TORCHELASTIC_ERROR_FILE");
    CHECK_FALSE(elastic::write_agent_error_file(f));
    const std::string env_path = dir / "from_env.json";
    ::setenv("TORCHELASTIC_ERROR_FILE", env_path.c_str(), 1);
    CHECK(elastic::write_agent_error_file(f));
    ::unsetenv("TORCHELASTIC_ERROR_FILE");
    CHECK(elastic::read_error_file(env_path).parsed());
}

// ---- events -------------------------------------------------------------------------------------

TEST_CASE("report: worker status events carry torch's metadata") {
    elastic::worker_event_context ctx;
    ctx.run_id = "job-17";
    ctx.group_rank = 2;
    ctx.group_world_size = 4;
    ctx.role_world_size = 32;
    ctx.entry_point = "trainer";
    ctx.rdzv_backend = "c10d";
    ctx.total_run_time = 3600;
    ctx.agent_restarts = 1;
    ctx.hostname = "node2.example.com";

    auto f = failure(17, exit_status::from_signal(9), 250ms, 4242, 1);
    const auto e = elastic::worker_status_event(f, ctx);
    CHECK(e.name == "torchelastic.worker.status.FAILED");
    CHECK(e.source == elastic::event_source::worker);
    CHECK(e.timestamp == 1795316400250);
    const auto& m = e.metadata;
    CHECK(m["run_id"] == "job-17");
    CHECK(m["global_rank"] == 17);
    CHECK(m["group_rank"] == 2);
    CHECK(m["worker_id"] == "4242");
    CHECK(m["role"] == "default");
    CHECK(m["hostname"] == "node2.example.com");
    CHECK(m["state"] == "FAILED");
    CHECK(m["total_run_time"] == 3600);
    CHECK(m["rdzv_backend"] == "c10d");
    CHECK(m["raw_error"] == R"({"message": "<NONE>"})");
    CHECK(m["agent_restarts"] == 1);
    CHECK(m["exitcode"] == -9);
    const auto md = nlohmann::json::parse(m["metadata"].get<std::string>());
    CHECK(md["group_world_size"] == 4);
    CHECK(md["entry_point"] == "trainer");
    CHECK(md["local_rank"] == nlohmann::json::array({1}));
    CHECK(md["role_rank"] == nlohmann::json::array({17}));
    CHECK(md["role_world_size"] == nlohmann::json::array({32}));

    // A stopped worker is TERMINATED with no raw error, as torch records it.
    f.state = failure_state::stopped_by_agent;
    const auto t = elastic::worker_status_event(f, ctx);
    CHECK(t.name == "torchelastic.worker.status.TERMINATED");
    CHECK(t.metadata["raw_error"].is_null());

    // An error file's content is the raw error; a malformed one says so.
    f.state = failure_state::failed;
    f.error_file = elastic::parse_error_file(R"({"message": "flat"})", "/e");
    CHECK(nlohmann::json::parse(
              elastic::worker_status_event(f, ctx).metadata["raw_error"].get<std::string>())["message"] == "flat");
    f.error_file = elastic::parse_error_file("{", "/e");
    CHECK(elastic::worker_status_event(f, ctx).metadata["raw_error"].get<std::string>().find("Malformed error file") !=
          std::string::npos);

    // Serialised: one line of JSON in torch's shape, even with invalid bytes in a field.
    elastic::event odd;
    odd.name = "bad \xFF name";
    const auto line = odd.serialize();
    CHECK(line.find('\n') == std::string::npos);
    const auto parsed = nlohmann::json::parse(line);
    CHECK(parsed["source"] == "AGENT");
    CHECK(parsed["timestamp"] == 0);
    CHECK(parsed["metadata"].is_object());
}

TEST_CASE("report: event metadata keeps its order and holds only JSON scalars") {
    elastic::event e;
    e.name = "elastic.test";
    auto& m = e.metadata;
    m["b"] = true;
    m["i"] = std::int64_t{-7};
    m["port"] = std::uint16_t{29500};
    m["f"] = 0.5;
    m["s"] = std::string("text");
    m["n"] = nullptr;
    m["i"] = 8;  // setting a key again keeps its place
    CHECK(m.size() == 6);
    std::vector<std::string> keys;
    for (const auto& [key, value] : m) keys.push_back(key);
    CHECK(keys == std::vector<std::string>{"b", "i", "port", "f", "s", "n"});
    CHECK(m["i"].get<std::int64_t>() == 8);
    CHECK(m["port"] == 29500);
    CHECK(m["f"].is_float());
    CHECK_FALSE(m["f"] == 0);  // 0.5 is no integer, and 1.0 would not be 1 either
    CHECK(m.find("missing") == nullptr);

    const auto& fixed = e.metadata;
    CHECK_THROWS_AS((void)fixed["missing"], std::out_of_range);
    CHECK_THROWS_AS((void)fixed["s"].get<bool>(), std::bad_variant_access);
    CHECK(m.erase("b"));
    CHECK_FALSE(m.erase("b"));
    m["inf"] = std::numeric_limits<double>::infinity();
    m["bytes"] = "a\xff\n";

    const auto parsed = nlohmann::ordered_json::parse(e.serialize());
    const auto& md = parsed["metadata"];
    std::vector<std::string> written;
    for (auto it = md.begin(); it != md.end(); ++it) written.push_back(it.key());
    CHECK(written == std::vector<std::string>{"i", "port", "f", "s", "n", "inf", "bytes"});
    CHECK(md["i"] == 8);
    CHECK(md["port"] == 29500);
    CHECK(md["f"] == 0.5);
    CHECK(md["s"] == "text");
    CHECK(md["n"].is_null());
    CHECK(md["inf"].is_null());               // JSON has no infinity
    CHECK(md["bytes"] == "a\xef\xbf\xbd\n");  // U+FFFD for the byte that is not UTF-8
}

TEST_CASE("report: the event log appends one line per event") {
    report_support::temp_dir dir;
    const std::string path = dir / "events.jsonl";
    report_support::write_file(path, "{\"name\": \"earlier\", \"source\": \"AGENT\"}\n");
    {
        elastic::event_log log(path);
        elastic::worker_event_context ctx;
        ctx.run_id = "r";
        for (int rank = 0; rank < 3; ++rank) {
            CHECK(log.record(elastic::worker_status_event(failure(rank, exit_status::from_exit_code(1), 0ms), ctx)));
        }
        elastic::event_log moved = std::move(log);
        elastic::event agent_event;
        agent_event.name = "torchelastic.agent.status.FAILED";
        CHECK(moved.record(agent_event));
    }
    const std::string text = report_support::read_file(path);
    std::vector<nlohmann::json> lines;
    std::size_t start = 0;
    while (start < text.size()) {
        const auto end = text.find('\n', start);
        REQUIRE(end != std::string::npos);
        lines.push_back(nlohmann::json::parse(text.substr(start, end - start)));
        start = end + 1;
    }
    REQUIRE(lines.size() == 5);
    CHECK(lines[0]["name"] == "earlier");  // appended, not truncated
    CHECK(lines[1]["metadata"]["global_rank"] == 0);
    CHECK(lines[3]["metadata"]["global_rank"] == 2);
    CHECK(lines[4]["name"] == "torchelastic.agent.status.FAILED");

    CHECK_THROWS_AS(elastic::event_log(dir / "no/such/dir/events.jsonl"), elastic::report_error);
    // A descriptor that cannot be written loses the event, quietly.
    auto closed = elastic::event_log::to_descriptor(-1);
    CHECK_FALSE(closed.record(elastic::event{}));
}
