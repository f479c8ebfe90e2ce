// An agent for the process-layer tests: spawns workers that fork grandchildren, reports every pid,
// then waits for the test to SIGKILL it.
//   process-agent WORKER_PROGRAM COUNT [restart-watcher | daemon | adopted | adopted-exit]
// prints "worker <pid> grandchild <pid>" per worker, "watcher <pid>", then "ready".
// With restart-watcher, the watcher is SIGKILLed after the first worker (its death awaited, and
// reported as "old-watcher <pid>"), so the next spawn must start another that learns every group.
// With daemon, each worker's "grandchild" is a daemon that left the worker's process group
// (process-worker daemon).
// With adopted, the same without cgroups (as where the agent can make none): the agent is the
// child subreaper and the watcher follows the workers' trees; the agent has the watcher walk them
// (watcher::sync) before it says "ready".
// With adopted-exit, no cgroups either, and COUNT is ignored: worker A starts a daemon (which
// leaves its session) and stays; worker B starts a child that leaves its process group only
// (and whose main thread ends while a second one runs on: /proc shows it a zombie, yet it
// lives), and exits. The agent reaps B ("reaped <B>": B's child must be dead, A's daemon not),
// waits for a line on stdin, then SIGKILLs A and reaps it ("reaped <A>": now A's daemon must be
// dead too).
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

enum class mode { plain, restart_watcher, daemon, adopted, adopted_exit };

asio::awaitable<void> run(std::string worker, int count, mode how, std::vector<elastic::child_process>& out) {
    auto executor = co_await asio::this_coro::executor;
    const bool adopted = how == mode::adopted || how == mode::adopted_exit;
    if (adopted) elastic::detail::process::cgroups::instance().disable("process-agent: no cgroups, by request");
    const auto start = [&](std::vector<std::string> args, bool contained) -> asio::awaitable<void> {
        elastic::spawn_options options;
        options.program = worker;
        options.args = std::move(args);
        options.own_cgroup = contained;
        options.out = elastic::stdio::pipe();
        out.push_back(elastic::spawn(executor, options));
        if (adopted && !out.back().cgroup().empty()) throw std::runtime_error("the worker got a cgroup");
        auto pipe = out.back().take_stdout();
        std::string buffer;
        const std::string grandchild = co_await read_line(*pipe, buffer);  // "grandchild <pid>"
        const std::string ready = co_await read_line(*pipe, buffer);
        if (ready != "ready") throw std::runtime_error("worker said '" + ready + "'");
        std::printf("worker %d %s\n", static_cast<int>(out.back().pid()), grandchild.c_str());
    };
    const auto reap = [&](elastic::child_process& child) -> asio::awaitable<void> {
        co_await child.wait();
        child.reap();
        std::printf("reaped %d\n", static_cast<int>(child.pid()));
        std::fflush(stdout);
    };
    if (how == mode::adopted_exit) {
        // (No braced lists inside co_await: g++ 12 miscompiles them in coroutines.)
        std::vector<std::string> daemon_args{"daemon"};
        std::vector<std::string> child_args{"setpgid-child", "exit", "main-exits"};
        co_await start(std::move(daemon_args), true);
        co_await start(std::move(child_args), true);
        co_await reap(out[1]);
        // The test looks at what is left, then says "go" on stdin.
        char go[8] = {};
        if (std::fgets(go, sizeof go, stdin) == nullptr) throw std::runtime_error("no go-ahead on stdin");
        out[0].signal(SIGKILL);
        co_await reap(out[0]);
    }
    for (int i = 0; how != mode::adopted_exit && i < count; ++i) {
        // Only the daemons need containment; the others test the watcher's process-group table.
        std::vector<std::string> args{how == mode::daemon || adopted ? "daemon" : "fork-grandchild"};
        co_await start(std::move(args), how == mode::daemon || adopted);
        if (i == 0 && how == mode::restart_watcher) kill_watcher();
    }
    if (adopted && !elastic::detail::process::subreaper::instance().enabled()) {
        throw std::runtime_error("not the child subreaper: " +
                                 elastic::detail::process::subreaper::instance().reason());
    }
    if (adopted && !elastic::detail::process::watcher::instance().sync(60'000)) {
        throw std::runtime_error("the watcher did not answer");
    }
    std::printf("watcher %d\n", static_cast<int>(elastic::detail::process::watcher::instance().ensure_started()));
    std::printf("ready\n");
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3 && argc != 4) {
        std::fprintf(stderr,
                     "usage: process-agent WORKER_PROGRAM COUNT [restart-watcher | daemon | adopted | adopted-exit]\n");
        return 2;
    }
    const std::string name = argc == 4 ? argv[3] : "";
    const mode how = name == "restart-watcher" ? mode::restart_watcher
                     : name == "daemon"        ? mode::daemon
                     : name == "adopted"       ? mode::adopted
                     : name == "adopted-exit"  ? mode::adopted_exit
                                               : mode::plain;
    try {
        asio::io_context io;
        std::vector<elastic::child_process> workers;
        auto done = asio::co_spawn(io, run(argv[1], std::atoi(argv[2]), how, workers), asio::use_future);
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
