// This machine's record of where a job's rendezvous store may move: its text, another job's or a
// broken record refused, the private directory it lives in, and the sweep of old records.
#include <elastic/rendezvous/moved_record.hpp>

#include <doctest/doctest.h>

#include "test_files.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

namespace test_moved_record {

namespace fs = std::filesystem;
using elastic::detail::rendezvous::moved_record_entry;

/// XDG_RUNTIME_DIR pointed at a directory of the test's own while it lives.
struct private_runtime {
    test_files::temp_dir root{"moved"};
    private_runtime() { ::setenv("XDG_RUNTIME_DIR", root.path().c_str(), 1); }
    ~private_runtime() { ::unsetenv("XDG_RUNTIME_DIR"); }
    [[nodiscard]] fs::path dir() const { return fs::path(root.path()) / "elastic"; }
};

std::vector<elastic::store_successor> successors(int n) {
    std::vector<elastic::store_successor> out;
    for (int i = 0; i < n; ++i) {
        out.push_back({"node" + std::to_string(i), "10.0.0." + std::to_string(i + 1),
                       static_cast<std::uint16_t>(4000 + i)});
    }
    return out;
}

}  // namespace test_moved_record

TEST_CASE("moved record: the text keeps the first successors, and only this job's record is read back") {
    using namespace test_moved_record;
    namespace r = elastic::detail::rendezvous;
    const std::string key = "job/formed@127.0.0.1:29400";
    auto list = successors(12);
    list.insert(list.begin() + 1, elastic::store_successor{"bad", "has space", 1});  // cannot be written: left out
    list.insert(list.begin() + 2, elastic::store_successor{"none", "10.9.9.9", 0});  // no idle store: left out
    const auto text = r::moved_record_text(key, list);
    const auto read = r::parse_moved_record(text, key);
    REQUIRE(read.size() == r::moved_record_limit);
    CHECK(read.front() == moved_record_entry{"10.0.0.1", 4000});
    CHECK(read[1] == moved_record_entry{"10.0.0.2", 4001});
    CHECK(read.back() == moved_record_entry{"10.0.0.8", 4007});
    CHECK(r::parse_moved_record(text, "job/formed@127.0.0.1:29401").empty());  // another first endpoint
    CHECK(r::parse_moved_record("", key).empty());
    CHECK(r::parse_moved_record("something else\n" + key + "\n4000 10.0.0.1\n", key).empty());
    // Broken lines are skipped; a last line without its newline is no line.
    const auto mixed = r::parse_moved_record("elastic moved-store record 1\n" + key +
                                                 "\n0 10.0.0.1\n70000 10.0.0.2\nx 10.0.0.3\n4000\n4001 \n"
                                                 "4002 [::1]\n4003 10.0.0.4",
                                             key);
    CHECK(mixed == std::vector<moved_record_entry>{{"[::1]", 4002}});
    // Another job's key never names the same file by accident of spelling alone.
    CHECK(r::moved_record_name(key) != r::moved_record_name("job/formed@127.0.0.1:29401"));
}

TEST_CASE("moved record: written, read and removed in the private directory, which must be this user's alone") {
    using namespace test_moved_record;
    namespace r = elastic::detail::rendezvous;
    private_runtime runtime;
    const std::string key = "job/formed@127.0.0.1:29400";
    CHECK(r::read_moved_record(key).empty());  // no directory yet
    CHECK(r::write_moved_record(key, successors(2)).empty());
    CHECK(r::read_moved_record(key) == std::vector<moved_record_entry>{{"10.0.0.1", 4000}, {"10.0.0.2", 4001}});
    CHECK(r::read_moved_record("job/formed@127.0.0.1:1").empty());
    r::remove_moved_record(key);
    CHECK(r::read_moved_record(key).empty());
    CHECK(fs::is_empty(runtime.dir()));  // nothing left aside

    // A record that is no regular file is not read (a FIFO is never waited on).
    REQUIRE(::mkfifo((runtime.dir() / r::moved_record_name(key)).c_str(), 0600) == 0);
    CHECK(r::read_moved_record(key).empty());
    fs::remove(runtime.dir() / r::moved_record_name(key));

    // A directory that others may write is refused: nothing read from it, and the write says why.
    CHECK(r::write_moved_record(key, successors(1)).empty());
    fs::permissions(runtime.dir(), fs::perms::group_write, fs::perm_options::add);
    CHECK(r::read_moved_record(key).empty());
    CHECK(r::write_moved_record(key, successors(1)).find("only it may write") != std::string::npos);
    fs::permissions(runtime.dir(), fs::perms::group_write, fs::perm_options::remove);
    CHECK(r::read_moved_record(key).size() == 1);
}

TEST_CASE("moved record: a write removes records not written for 30 days whose writer is gone") {
    using namespace test_moved_record;
    namespace r = elastic::detail::rendezvous;
    private_runtime runtime;
    REQUIRE(r::write_moved_record("recent/formed@a:1", successors(1)).empty());
    REQUIRE(r::write_moved_record("alive/formed@a:1", successors(1)).empty());  // this process wrote it
    // One written by a process that is gone (a pid above any pid_max).
    const auto dead_path = runtime.dir() / r::moved_record_name("dead/formed@a:1");
    {
        auto text = r::moved_record_text("dead/formed@a:1", successors(1));
        const auto writer = text.find("writer ");
        REQUIRE(writer != std::string::npos);
        text.replace(writer, text.find('\n', writer) - writer, "writer 1073676288");
        std::ofstream(dead_path) << text;
    }
    CHECK(r::read_moved_record("dead/formed@a:1").size() == 1);  // the writer line is no entry
    const timeval long_ago[2] = {{::time(nullptr) - r::moved_record_max_age_s - 60, 0},
                                 {::time(nullptr) - r::moved_record_max_age_s - 60, 0}};
    const auto alive_path = runtime.dir() / r::moved_record_name("alive/formed@a:1");
    REQUIRE(::utimes(dead_path.c_str(), long_ago) == 0);
    REQUIRE(::utimes(alive_path.c_str(), long_ago) == 0);
    std::ofstream(runtime.dir() / "4242.json") << "{}";  // a status file is not a record
    REQUIRE(r::write_moved_record("this/formed@a:1", successors(1)).empty());
    CHECK_FALSE(fs::exists(dead_path));
    CHECK(fs::exists(alive_path));  // old, but its writer still runs (a long job without a round)
    CHECK(r::read_moved_record("recent/formed@a:1").size() == 1);
    CHECK(r::read_moved_record("this/formed@a:1").size() == 1);
    CHECK(fs::exists(runtime.dir() / "4242.json"));
}
