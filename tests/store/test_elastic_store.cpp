// The elastic-store program: where it listens by default, and its limits from the command line.
#include <doctest/doctest.h>

#include "store_support.hpp"

#include <csignal>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace test_elastic_store {

// Starts elastic-store with `args` and returns its first line of stdout, then stops it.
std::string first_line(const std::vector<std::string>& args) {
    std::vector<std::string> argv{ELASTIC_TEST_BINARY_DIR "/bin/elastic-store"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto child = store_support::spawn(argv);
    std::string line;
    char ch = 0;
    while (::read(child.out_fd, &ch, 1) == 1 && ch != '\n') line += ch;
    const int status = store_support::terminate(child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    return line;
}

}  // namespace test_elastic_store

TEST_CASE("elastic-store: listens on loopback unless --host says otherwise") {
    const auto line = test_elastic_store::first_line({"--port", "0"});
    CHECK(line.starts_with("elastic-store listening on 127.0.0.1:"));
    const auto all = test_elastic_store::first_line({"--port", "0", "--host", "0.0.0.0"});
    CHECK(all.starts_with("elastic-store listening on 0.0.0.0:"));
}

TEST_CASE("elastic-store: limits that would cut off a reading client are refused with a message") {
    auto child = store_support::spawn({ELASTIC_TEST_BINARY_DIR "/bin/elastic-store", "--port", "0",
                                       "--max-queued-output", "1024"});
    auto result = [&] {
        asio::io_context ctx;
        return store_support::run(ctx, store_support::collect(child));
    }();
    CHECK(WIFEXITED(result.second));
    CHECK(WEXITSTATUS(result.second) == 1);
    CHECK(result.first.empty());
}
