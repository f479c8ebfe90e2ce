// crashing-worker: a native worker (no elastic::record) that fails the way real ones do at
// 3 a.m., to see what elasticrun reports: one rank logs a little, then throws an exception
// nobody catches (std::terminate, SIGABRT); the other ranks wait for it forever, as ranks stuck
// in a collective do, until the agent stops them.
//
//     elasticrun --standalone --nproc-per-node=2 ./bin/crashing-worker
//
// --fail-rank=R picks the failing rank (default 1); --exit=N makes it exit with code N instead
// of throwing. docs/failure-report.md shows the report of the command above.
#include <elastic/env.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

#include <unistd.h>

namespace {

void say(std::FILE* stream, const std::string& line) {
    std::fputs((line + "\n").c_str(), stream);  // one line per call: ranks share the console
    std::fflush(stream);
}

}  // namespace

int main(int argc, char** argv) {
    int fail_rank = 1;
    int exit_code = -1;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg.rfind("--fail-rank=", 0) == 0) fail_rank = std::stoi(std::string(arg.substr(12)));
        if (arg.rfind("--exit=", 0) == 0) exit_code = std::stoi(std::string(arg.substr(7)));
    }
    const auto& env = elastic::env();
    if (env.rank != fail_rank) {
        say(stdout, fmt::format("rank {}: waiting for rank {} in all_reduce", env.rank, fail_rank));
        for (;;) ::pause();  // until the agent stops the group
    }
    say(stderr, fmt::format("rank {}: loading shard {} of {}", env.rank, env.rank + 1, env.world_size));
    say(stderr, fmt::format("rank {}: step 1: loss 0.6931", env.rank));
    if (exit_code >= 0) {
        say(stderr, fmt::format("rank {}: fatal: checkpoint directory is not writable", env.rank));
        return exit_code;
    }
    throw std::runtime_error("NCCL error: unhandled system error (peer rank 0 closed the connection)");
}
