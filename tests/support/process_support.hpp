// Helpers for the process-layer tests: run a coroutine to its end, read a child's lines, await
// arbitrary pids' deaths, and the paths of the test programs.
#pragma once

#include "elastic/process.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/read.hpp>
#include <asio/read_until.hpp>
#include <asio/use_future.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace process_support {

#if defined(ELASTIC_TEST_PROGRAM_DIR)
/// The worker program (tests/programs/process_worker.cpp).
inline std::string worker_program() { return ELASTIC_TEST_PROGRAM_DIR "/process-worker"; }
/// The agent program (tests/programs/process_agent.cpp).
inline std::string agent_program() { return ELASTIC_TEST_PROGRAM_DIR "/process-agent"; }
#endif

/// Why workers cannot get cgroups of their own here, or empty if they can: the same probe the
/// agent makes (a directory in this process's v2 cgroup, with a cgroup.kill), without keeping
/// anything. The daemon tests need cgroups: nothing else reaches a daemon.
inline std::string cgroup_unavailable() {
    std::string why;
    const std::string own = elastic::detail::process::own_cgroup2_dir(why);
    if (own.empty()) return why;
    const std::string dir = own + "/elastic.probe." + std::to_string(::getpid());
    if (::mkdir(dir.c_str(), 0755) != 0) return "cannot make " + dir + ": " + std::strerror(errno);
    const bool kill = ::access((dir + "/cgroup.kill").c_str(), F_OK) == 0;
    ::rmdir(dir.c_str());
    return kill ? std::string() : dir + " has no cgroup.kill";
}

/// Runs `task` on `io` until it completes; returns its result (or rethrows).
template <class T>
T run(asio::io_context& io, asio::awaitable<T> task) {
    auto future = asio::co_spawn(io, std::move(task), asio::use_future);
    io.restart();
    io.run();
    return future.get();
}

/// One line (without '\n') from `pipe`; `buffer` keeps what was read past it. "" at EOF.
inline asio::awaitable<std::string> read_line(asio::posix::stream_descriptor& pipe, std::string& buffer) {
    auto [ec, n] = co_await asio::async_read_until(pipe, asio::dynamic_buffer(buffer), '\n',
                                                   asio::experimental::as_tuple(asio::use_awaitable));
    if (ec && n == 0) {
        std::string rest = std::move(buffer);
        buffer.clear();
        co_return rest;
    }
    std::string line = buffer.substr(0, n - 1);
    buffer.erase(0, n);
    co_return line;
}

/// Everything until EOF.
inline asio::awaitable<std::string> read_all(asio::posix::stream_descriptor& pipe) {
    std::string out;
    auto [ec, n] = co_await asio::async_read(pipe, asio::dynamic_buffer(out),
                                             asio::experimental::as_tuple(asio::use_awaitable));
    (void)ec;
    (void)n;
    co_return out;
}

/// Spawns the worker program with `args`, stdout to a pipe; returns the child.
inline elastic::child_process spawn_worker(asio::io_context& io, std::vector<std::string> args,
                                           elastic::stdio err = elastic::stdio::inherit()) {
    elastic::spawn_options options;
    options.program = worker_program();
    options.args = std::move(args);
    options.out = elastic::stdio::pipe();
    options.err = err;
    return elastic::spawn(io.get_executor(), options);
}

/// Whether `pid` still runs: a thread of it has not ended (a zombie has none; a process whose
/// main thread alone ended, which /proc shows as a zombie, still runs).
inline bool alive(pid_t pid) { return elastic::detail::process::threads_left(pid); }

/// Awaits the death of every pid (not necessarily our children) through pidfds; `safety` only
/// catches a hang. Returns the pids still alive at the end (empty: all died).
inline std::vector<pid_t> await_deaths(const std::vector<pid_t>& pids, std::chrono::milliseconds safety) {
    std::vector<pollfd> fds;
    std::vector<pid_t> watched;
    for (pid_t pid : pids) {
        const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0U));
        if (fd < 0) continue;  // ESRCH: already gone (and reaped)
        fds.push_back({fd, POLLIN, 0});
        watched.push_back(pid);
    }
    const auto deadline = std::chrono::steady_clock::now() + safety;
    for (bool first = true;; first = false) {
        bool all = true;
        for (const auto& p : fds) all = all && (p.revents & POLLIN) != 0;
        const auto left = std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                     deadline - std::chrono::steady_clock::now()));
        if (all || (!first && left.count() == 0)) break;
        std::vector<pollfd> waiting;
        for (const auto& p : fds) {
            if ((p.revents & POLLIN) == 0) waiting.push_back({p.fd, POLLIN, 0});
        }
        if (::poll(waiting.data(), waiting.size(), static_cast<int>(left.count())) < 0) break;
        for (const auto& w : waiting) {
            for (auto& p : fds) {
                if (p.fd == w.fd) p.revents = w.revents;
            }
        }
    }
    std::vector<pid_t> left;
    for (std::size_t i = 0; i < fds.size(); ++i) {
        if ((fds[i].revents & POLLIN) == 0) left.push_back(watched[i]);
        ::close(fds[i].fd);
    }
    return left;
}

}  // namespace process_support
