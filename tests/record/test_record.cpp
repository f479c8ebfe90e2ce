// elastic::record: real children (tests/programs/record_child.cpp) that throw, segfault, overflow
// the stack, abort and call std::terminate leave torchelastic's error file with a backtrace from
// the failing function; Debian's PyTorch reads the file; JSON escaping matches Python's json.dump.
#include <elastic/record.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "env_support.hpp"

#include <csignal>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace test_record {

const std::string child_program = ELASTIC_TEST_PROGRAM_DIR "/record-child";

struct failure {
    env_support::child_result child;
    nlohmann::json file;  // the parsed error file, or null when none was written
    std::string raw;
    std::int64_t before = 0;
    std::int64_t after = 0;
};

// Runs record-child in `mode` with TORCHELASTIC_ERROR_FILE under a fresh log tree in `dir`.
failure run(const env_support::temp_dir& dir, const std::string& mode) {
    failure f;
    const std::string error_file = dir / (mode + "/attempt_0/0/error.json");
    // The clock record.hpp reads (time() may read a coarser one, a tick behind at a second's edge).
    const auto now = [] {
        timespec t{};
        ::clock_gettime(CLOCK_REALTIME, &t);
        return static_cast<std::int64_t>(t.tv_sec);
    };
    f.before = now();
    f.child = env_support::run_child(child_program, {mode}, {{"TORCHELASTIC_ERROR_FILE", error_file}}, dir.path());
    f.after = now();
    f.raw = env_support::read_file(error_file);
    if (!f.raw.empty()) f.file = nlohmann::json::parse(f.raw);
    // Written as a temporary and renamed: nothing else is left beside it.
    CHECK(env_support::files_containing(dir / (mode + "/attempt_0/0"), ".tmp").empty());
    return f;
}

// The error file has exactly torchelastic's fields (§6.2) and an integer timestamp taken while the
// child ran. Returns the message.
std::string check_layout(const failure& f) {
    REQUIRE(f.file.is_object());
    CHECK(f.file.size() == 1);
    const auto& message = f.file.at("message");
    CHECK(message.size() == 2);
    const auto& extra = message.at("extraInfo");
    CHECK(extra.size() == 2);
    const std::string timestamp = extra.at("timestamp").get<std::string>();
    REQUIRE(!timestamp.empty());
    CHECK(timestamp.find_first_not_of("0123456789") == std::string::npos);
    const auto seconds = std::stoll(timestamp);
    CHECK(seconds >= f.before);
    CHECK(seconds <= f.after);
    CHECK(extra.at("py_callstack").is_string());
    // Byte for byte the layout of Python's json.dump (key order, ", " and ": " separators).
    CHECK(f.raw.rfind("{\"message\": {\"message\": \"", 0) == 0);
    CHECK(f.raw.find("\", \"extraInfo\": {\"py_callstack\": \"") != std::string::npos);
    CHECK(f.raw.find("\", \"timestamp\": \"" + timestamp + "\"}}}") != std::string::npos);
    return message.at("message").get<std::string>();
}

// The first frame line of the backtrace ("  #0 ...").
std::string first_frame(const std::string& callstack) {
    std::istringstream in(callstack);
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("  #0 ", 0) == 0) return line;
    }
    return "";
}

std::string callstack_of(const failure& f) {
    return f.file.at("message").at("extraInfo").at("py_callstack").get<std::string>();
}

std::string escape(const std::string& text) {
    std::string out;
    struct sink {
        std::string* s;
        void put(char c) { s->push_back(c); }
    } to{&out};
    elastic::detail::json_escape(to, text.data(), text.size());
    return out;
}

}  // namespace test_record

TEST_CASE("record: an uncaught exception writes the error file with the throwing function first") {
    env_support::temp_dir dir;
    const auto f = test_record::run(dir, "throw");
    REQUIRE(f.child.exited);
    CHECK(f.child.exit_code == elastic::uncaught_exception_exit_code);
    CHECK(f.child.exit_code == 1);
    const std::string message = test_record::check_layout(f);
    CHECK(message == "std::runtime_error: disk on fire: \"quoted\", tab\t, newline\n, caf\xc3\xa9, "
                     "\xf0\x9f\x94\xa5");
    const std::string stack = test_record::callstack_of(f);
    CAPTURE(stack);
    // Captured where the exception was thrown, not where anything caught it.
    CHECK(test_record::first_frame(stack).find("record_child_throwing_function(int)") != std::string::npos);
    CHECK(stack.find("worker_main(int, char**)") != std::string::npos);
    CHECK(stack.find("main") != std::string::npos);
    CHECK(stack.find("on_terminate") == std::string::npos);
    // The report also goes to stderr, and stdio buffers are flushed before the exit.
    CHECK(f.child.err.find("elastic::record: std::runtime_error: disk on fire") != std::string::npos);
    CHECK(f.child.err.find("error file written to") != std::string::npos);
    CHECK(f.child.out.find("working in mode throw") != std::string::npos);
}

TEST_CASE("record: an exception thrown in another thread names that thread's thrower") {
    env_support::temp_dir dir;
    const auto f = test_record::run(dir, "thread-throw");
    REQUIRE(f.child.exited);
    CHECK(f.child.exit_code == 1);
    CHECK(test_record::check_layout(f) == "std::logic_error: thread failed");
    CHECK(test_record::first_frame(test_record::callstack_of(f)).find("record_child_thread_throwing_function()") !=
          std::string::npos);
}

TEST_CASE("record: an exception that is not a std::exception is reported by its type") {
    env_support::temp_dir dir;
    const auto f = test_record::run(dir, "throw-int");
    REQUIRE(f.child.exited);
    CHECK(f.child.exit_code == 1);
    CHECK(test_record::check_layout(f).rfind("int: ", 0) == 0);
    CHECK(test_record::first_frame(test_record::callstack_of(f)).find("record_child_int_throwing_function()") !=
          std::string::npos);
}

TEST_CASE("record: a segfault leaves an error file and the process dies of SIGSEGV") {
    env_support::temp_dir dir;
    const auto f = test_record::run(dir, "segv");
    CHECK_FALSE(f.child.exited);
    CHECK(f.child.signal == SIGSEGV);
    const std::string message = test_record::check_layout(f);
    CAPTURE(message);
    CHECK(message.rfind("SIGSEGV: segmentation fault (signal 11) in PID ", 0) == 0);
    CHECK(message.find("fault address 0x") != std::string::npos);
    // Signal-safe path: names stay mangled (demangling allocates), the function is still named.
    CHECK(test_record::first_frame(test_record::callstack_of(f)).find("record_child_segfaulting_function") !=
          std::string::npos);
    CHECK(f.child.err.find("elastic::record: SIGSEGV") != std::string::npos);
}

TEST_CASE("record: a stack overflow is reported from the alternate signal stack") {
    env_support::temp_dir dir;
    const auto f = test_record::run(dir, "overflow");
    CHECK_FALSE(f.child.exited);
    CHECK(f.child.signal == SIGSEGV);
    CHECK(test_record::check_layout(f).rfind("SIGSEGV: segmentation fault (signal 11)", 0) == 0);
    CHECK(test_record::first_frame(test_record::callstack_of(f)).find("record_child_overflowing_function") !=
          std::string::npos);
}

TEST_CASE("record: std::terminate leaves an error file and ends in SIGABRT") {
    env_support::temp_dir dir;
    const auto f = test_record::run(dir, "terminate");
    CHECK_FALSE(f.child.exited);
    CHECK(f.child.signal == SIGABRT);
    CHECK(test_record::check_layout(f) == "std::terminate: called without an active exception");
    CHECK(test_record::first_frame(test_record::callstack_of(f)).find("record_child_terminating_function()") !=
          std::string::npos);
}

TEST_CASE("record: abort() is reported as SIGABRT from the aborting function") {
    env_support::temp_dir dir;
    const auto f = test_record::run(dir, "abort");
    CHECK_FALSE(f.child.exited);
    CHECK(f.child.signal == SIGABRT);
    const std::string message = test_record::check_layout(f);
    CHECK(message.rfind("SIGABRT: aborted (signal 6) in PID ", 0) == 0);
    CHECK(test_record::callstack_of(f).find("record_child_aborting_function") != std::string::npos);
}

TEST_CASE("record: a normal return passes the exit code through and writes nothing") {
    env_support::temp_dir dir;
    const auto f = test_record::run(dir, "return");
    REQUIRE(f.child.exited);
    CHECK(f.child.exit_code == 3);
    CHECK(f.raw.empty());
    CHECK(f.child.err.empty());
}

TEST_CASE("record: without TORCHELASTIC_ERROR_FILE the report goes to stderr only") {
    env_support::temp_dir dir;
    const auto child = env_support::run_child(test_record::child_program, {"throw"}, {}, dir.path());
    REQUIRE(child.exited);
    CHECK(child.exit_code == 1);
    CHECK(child.err.find("elastic::record: std::runtime_error: disk on fire") != std::string::npos);
    CHECK(child.err.find("  #0 ") != std::string::npos);
    CHECK(child.err.find("record_child_throwing_function(int)") != std::string::npos);
    CHECK(child.err.find("error file") == std::string::npos);
    CHECK(env_support::files_containing(dir.path(), ".json").empty());
}

TEST_CASE("record: an unwritable error file is reported on stderr and the exit code is kept") {
    env_support::temp_dir dir;
    const std::string blocker = dir / "not-a-directory";
    { std::ofstream(blocker) << "x"; }
    const auto child = env_support::run_child(test_record::child_program, {"throw"},
                                              {{"TORCHELASTIC_ERROR_FILE", blocker + "/error.json"}}, dir.path());
    REQUIRE(child.exited);
    CHECK(child.exit_code == 1);
    CHECK(child.err.find("could not write the error file " + blocker + "/error.json (errno ") != std::string::npos);
    CHECK(child.err.find("disk on fire") != std::string::npos);
}

TEST_CASE("record: JSON strings are escaped as Python's json.dump escapes them") {
    using test_record::escape;
    CHECK(escape("plain text") == "plain text");
    CHECK(escape("\"\\/") == "\\\"\\\\/");
    CHECK(escape("\n\r\t\b\f") == "\\n\\r\\t\\b\\f");
    CHECK(escape(std::string("\x01\x1f\x7f", 3)) == "\\u0001\\u001f\\u007f");
    CHECK(escape(std::string("\0", 1)) == "\\u0000");
    CHECK(escape("caf\xc3\xa9") == "caf\\u00e9");
    CHECK(escape("\xe2\x82\xac") == "\\u20ac");
    CHECK(escape("\xf0\x9f\x94\xa5") == "\\ud83d\\udd25");
    CHECK(escape("\xff") == "\\ufffd");
    CHECK(escape("\xc3") == "\\ufffd");                        // truncated sequence
    CHECK(escape("\xc0\xaf") == "\\ufffd\\ufffd");             // overlong
    CHECK(escape("\xed\xa0\x80") == "\\ufffd\\ufffd\\ufffd");  // a surrogate
}

TEST_CASE("record: Debian's PyTorch ProcessFailure parses our error files") {
    env_support::temp_dir dir;
    const auto thrown = test_record::run(dir, "throw");
    const auto segv = test_record::run(dir, "segv");
    const std::string thrown_file = dir / "throw/attempt_0/0/error.json";
    const std::string segv_file = dir / "segv/attempt_0/0/error.json";
    REQUIRE(!thrown.raw.empty());
    REQUIRE(!segv.raw.empty());

    // torch 1.13: ProcessFailure reads message = data["message"] (our dict) and
    // timestamp = int(message["extraInfo"]["timestamp"]). Also prove the bytes are what json.dump
    // would write for the same data.
    const std::string script = R"(
import json, sys
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
for path in sys.argv[1:]:
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=path)
    raw = open(path, encoding="ascii").read()
    print(json.dumps({"message": failure.message["message"], "timestamp": failure.timestamp,
                      "timestamp_is_int": type(failure.timestamp) is int,
                      "same_bytes_as_json_dump": json.dumps(json.loads(raw)) == raw}))
)";
    const auto python = env_support::run_child(ELASTIC_TORCH_PYTHON, {"-c", script, thrown_file, segv_file}, {},
                                               dir.path());
    CAPTURE(python.err);
    REQUIRE(python.exited);
    REQUIRE(python.exit_code == 0);
    std::istringstream lines(python.out);
    std::vector<nlohmann::json> results;
    std::string line;
    while (std::getline(lines, line)) {
        if (!line.empty() && line[0] == '{') results.push_back(nlohmann::json::parse(line));
    }
    REQUIRE(results.size() == 2);
    const test_record::failure* written[] = {&thrown, &segv};
    for (std::size_t i = 0; i < 2; ++i) {
        const auto& ours = written[i]->file.at("message");
        CHECK(results[i].at("message") == ours.at("message"));
        CHECK(results[i].at("timestamp").get<std::int64_t>() ==
              std::stoll(ours.at("extraInfo").at("timestamp").get<std::string>()));
        CHECK(results[i].at("timestamp_is_int") == true);
        CHECK(results[i].at("same_bytes_as_json_dump") == true);
    }
}
