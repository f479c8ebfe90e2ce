// Helpers for the store client and dist tests: child processes with their own environment and
// pipes, Debian's PyTorch as a child, and free ports.
#pragma once

#include "store_support.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/read_until.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

namespace client_support {

/// A child with stdout (and stderr, merged) on a pipe, and optionally its stdin on a pipe.
struct child {
    pid_t pid = -1;
    int out_fd = -1;
    int in_fd = -1;  ///< write end of the child's stdin, -1 when stdin is inherited

    store_support::child output() const { return {pid, out_fd}; }
    /// Closes the child's stdin (a hosting Python script exits on EOF).
    void close_stdin() {
        if (in_fd >= 0) ::close(in_fd);
        in_fd = -1;
    }
};

/// Starts args[0] with the parent's environment plus `env` (which wins; an empty value unsets
/// the variable), stdout and stderr on
/// one pipe, and with `stdin_pipe` its stdin on a pipe.
inline child spawn(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {},
                   bool stdin_pipe = false) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
    int in[2] = {-1, -1};
    if (stdin_pipe && pipe2(in, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, out[1], 2);
    if (stdin_pipe) posix_spawn_file_actions_adddup2(&fa, in[0], 0);

    std::map<std::string, std::string> merged;
    for (char** e = environ; *e; ++e) {
        const std::string kv(*e);
        const auto eq = kv.find('=');
        if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const auto& [k, v] : env) {
        if (v.empty()) merged.erase(k);
        else merged[k] = v;
    }
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    pid_t pid = -1;
    const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    if (stdin_pipe) ::close(in[0]);
    if (rc != 0) {
        ::close(out[0]);
        if (stdin_pipe) ::close(in[1]);
        throw std::system_error(rc, std::generic_category(), "posix_spawn " + args[0]);
    }
    return {pid, out[0], stdin_pipe ? in[1] : -1};
}

/// Exit code of a wait status, or 128+signal.
inline int exit_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

/// Reads the first line of a child's output without consuming the rest (the descriptor is
/// duplicated, so `store_support::collect` can read the remainder later).
inline asio::awaitable<std::string> first_line(int fd, std::string& rest) {
    asio::posix::stream_descriptor in(co_await asio::this_coro::executor, ::dup(fd));
    std::string buf;
    const auto n = co_await asio::async_read_until(in, asio::dynamic_buffer(buf), '\n', asio::use_awaitable);
    rest = buf.substr(n);
    ::close(in.release());  // only the duplicate: the original descriptor stays open
    co_return buf.substr(0, n - 1);
}

/// Python (Debian's, with torch 1.13) hosting a TCPStore master on 127.0.0.1 and a free port;
/// it prints the port and serves until its stdin is closed.
struct torch_server {
    child proc;
    std::uint16_t port = 0;

    static torch_server start(asio::io_context& ctx) {
        torch_server s;
        s.proc = spawn({ELASTIC_TORCH_PYTHON, "-c",
                        "import sys, datetime\n"
                        "import torch.distributed as d\n"
                        "s = d.TCPStore('127.0.0.1', 0, None, True, "
                        "datetime.timedelta(seconds=120), wait_for_workers=False)\n"
                        "print(s.port, flush=True)\n"
                        "sys.stdin.read()\n"},
                       {}, true);
        std::string rest;
        const auto line = store_support::run(ctx, first_line(s.proc.out_fd, rest));
        s.port = static_cast<std::uint16_t>(std::stoi(line));
        return s;
    }

    /// Ends the server (EOF on its stdin) and returns its exit status and remaining output.
    std::pair<std::string, int> stop(asio::io_context& ctx) {
        proc.close_stdin();
        return store_support::run(ctx, store_support::collect(proc.output()));
    }
};

/// Runs a Python snippet to completion; returns {output, exit code}.
inline std::pair<std::string, int> python(asio::io_context& ctx, const std::string& code,
                                          const std::map<std::string, std::string>& env = {}) {
    auto c = spawn({ELASTIC_TORCH_PYTHON, "-c", code}, env);
    auto [out, status] = store_support::run(ctx, store_support::collect(c.output()));
    return {out, exit_code(status)};
}

/// A port nobody listens on right now (bound, then released).
inline std::uint16_t unused_port(asio::io_context& ctx) {
    asio::ip::tcp::acceptor a(ctx, {asio::ip::make_address("127.0.0.1"), 0});
    return a.local_endpoint().port();
}

}  // namespace client_support
