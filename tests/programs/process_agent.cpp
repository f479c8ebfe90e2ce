// An agent for the process-layer tests: spawns workers that fork grandchildren, reports every pid,
// then waits for the test to SIGKILL it.
//   process-agent WORKER_PROGRAM COUNT [restart-watcher | daemon]
// prints "worker <pid> grandchild <pid>" per worker, "watcher <pid>", then "ready".
// With restart-watcher, the watcher is SIGKILLed after the first worker (its death awaited, and
// reported as "old-watcher <pid>"), so the next spawn must start another that learns every group.
// With daemon, each worker's "grandchild" is a daemon that left the worker's process group
// (process-worker daemon).
#include "elastic/process.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/read_until.hpp>
#include <asio/use_future.hpp>

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

asio::awaitable<std::string> read_line(asio::posix::stream_descriptor& pipe, std::string& buffer) {
    const std::size_t n = co_await asio::async_read_until(pipe, asio::dynamic_buffer(buffer), '\n',
                                                          asio::use_awaitable);
    std::string line = buffer.substr(0, n - 1);
    buffer.erase(0, n);
    co_return line;
}

void kill_watcher() {
    const pid_t watcher = elastic::detail::process::watcher::instance().ensure_started();
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, watcher, 0U));
    if (pidfd < 0 || ::kill(watcher, SIGKILL) != 0) throw std::runtime_error("cannot kill the watcher");
    pollfd p{pidfd, POLLIN, 0};
    while (::poll(&p, 1, -1) < 0) {
    }
    ::close(pidfd);
    std::printf("old-watcher %d\n", static_cast<int>(watcher));
}

asio::awaitable<void> run(std::string worker, int count, bool restart_watcher, bool daemon,
                          std::vector<elastic::child_process>& out) {
    auto executor = co_await asio::this_coro::executor;
    for (int i = 0; i < count; ++i) {
        elastic::spawn_options options;
        options.program = worker;
        options.args = {daemon ? "daemon" : "fork-grandchild"};
        // Only the daemons need cgroups; the others test the watcher's process-group table.
        options.own_cgroup = daemon;
        options.out = elastic::stdio::pipe();
        out.push_back(elastic::spawn(executor, options));
        auto pipe = out.back().take_stdout();
        std::string buffer;
        const std::string grandchild = co_await read_line(*pipe, buffer);  // "grandchild <pid>"
        const std::string ready = co_await read_line(*pipe, buffer);
        if (ready != "ready") throw std::runtime_error("worker said '" + ready + "'");
        std::printf("worker %d %s\n", static_cast<int>(out.back().pid()), grandchild.c_str());
        if (i == 0 && restart_watcher) kill_watcher();
    }
    std::printf("watcher %d\n", static_cast<int>(elastic::detail::process::watcher::instance().ensure_started()));
    std::printf("ready\n");
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3 && argc != 4) {
        std::fprintf(stderr, "usage: process-agent WORKER_PROGRAM COUNT [restart-watcher | daemon]\n");
        return 2;
    }
    try {
        asio::io_context io;
        std::vector<elastic::child_process> workers;
        auto done = asio::co_spawn(io,
                                   run(argv[1], std::atoi(argv[2]),
                                       argc == 4 && std::string(argv[3]) == "restart-watcher",
                                       argc == 4 && std::string(argv[3]) == "daemon", workers),
                                   asio::use_future);
        io.run();
        done.get();
        // Wait to be killed; a signal that does not kill us ends the wait with an error.
        elastic::signal_events signals(io.get_executor(), {SIGUSR1});
        auto got = asio::co_spawn(io, signals.next(), asio::use_future);
        io.restart();
        io.run();
        std::fprintf(stderr, "process-agent: got signal %d\n", got.get());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "process-agent: %s\n", e.what());
        return 1;
    }
}
