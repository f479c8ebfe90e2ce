// Helpers for the store tests: hex transcripts, running a coroutine to completion, a raw TCP
// client speaking bytes, and child processes whose output is read without blocking the loop.
#pragma once

#include <elastic/store/server.hpp>

#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/read.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <fmt/format.h>

#include <csignal>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace store_support {

/// Bytes from hex tokens separated by blanks or '·'; "00x7" (or "00×7") repeats a byte 7 times.
inline std::string unhex(std::string_view text) {
    std::string out;
    std::size_t i = 0;
    const auto is_hex = [](char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    };
    while (i < text.size()) {
        if (!is_hex(text[i])) {
            ++i;
            continue;
        }
        if (i + 1 >= text.size() || !is_hex(text[i + 1]))
            throw std::invalid_argument(fmt::format("odd hex digit at {} in '{}'", i, text));
        const auto byte = static_cast<char>(std::stoi(std::string(text.substr(i, 2)), nullptr, 16));
        i += 2;
        std::size_t repeat = 1;
        if (i < text.size() && text[i] == 'x') {
            ++i;
            repeat = 0;
            while (i < text.size() && text[i] >= '0' && text[i] <= '9')
                repeat = repeat * 10 + static_cast<std::size_t>(text[i++] - '0');
        } else if (text.substr(i, 2) == "\xc3\x97") {  // UTF-8 '×'
            i += 2;
            repeat = 0;
            while (i < text.size() && text[i] >= '0' && text[i] <= '9')
                repeat = repeat * 10 + static_cast<std::size_t>(text[i++] - '0');
        }
        out.append(repeat, byte);
    }
    return out;
}

/// Lower-case hex of bytes, space separated (for readable failure messages).
inline std::string hex(std::string_view bytes) {
    std::string out;
    for (const char c : bytes) {
        if (!out.empty()) out.push_back(' ');
        out += fmt::format("{:02x}", static_cast<unsigned char>(c));
    }
    return out;
}

/// Runs `a` on `ctx` until it and everything it left behind finished; rethrows its exception.
template <class T>
T run(asio::io_context& ctx, asio::awaitable<T> a) {
    std::exception_ptr error;
    std::optional<T> result;
    asio::co_spawn(ctx, std::move(a), [&](std::exception_ptr e, T v) {
        error = e;
        if (!e) result.emplace(std::move(v));
    });
    ctx.restart();
    ctx.run();
    if (error) std::rethrow_exception(error);
    return std::move(*result);
}

inline void run(asio::io_context& ctx, asio::awaitable<void> a) {
    std::exception_ptr error;
    asio::co_spawn(ctx, std::move(a), [&](std::exception_ptr e) { error = e; });
    ctx.restart();
    ctx.run();
    if (error) std::rethrow_exception(error);
}

/// A client that writes and reads raw bytes, for byte-exact transcripts.
class raw_client {
public:
    explicit raw_client(asio::ip::tcp::socket s) : socket_(std::move(s)) {}

    static asio::awaitable<raw_client> connect(std::uint16_t port) {
        asio::ip::tcp::socket s(co_await asio::this_coro::executor);
        co_await s.async_connect({asio::ip::make_address("127.0.0.1"), port}, asio::use_awaitable);
        co_return raw_client(std::move(s));
    }

    /// Writes the bytes of a hex transcript.
    asio::awaitable<void> send_hex(std::string_view h) { co_await send(unhex(h)); }

    asio::awaitable<void> send(std::string bytes) {
        co_await asio::async_write(socket_, asio::buffer(bytes), asio::use_awaitable);
    }

    /// Writes the bytes of a hex transcript at once, outside any coroutine (a loopback socket
    /// takes a few bytes without blocking).
    void send_hex_now(std::string_view h) { asio::write(socket_, asio::buffer(unhex(h))); }

    /// Closes the connection (the server reads EOF).
    void close() {
        std::error_code ignored;
        socket_.close(ignored);
    }

    /// Reads exactly n bytes (throws on EOF).
    asio::awaitable<std::string> read(std::size_t n) {
        std::string out(n, '\0');
        co_await asio::async_read(socket_, asio::buffer(out), asio::use_awaitable);
        co_return out;
    }

    /// Reads n bytes and returns them as hex.
    asio::awaitable<std::string> read_hex(std::size_t n) { co_return hex(co_await read(n)); }

    /// True when the server closed the connection (EOF or reset) before sending a byte.
    asio::awaitable<bool> closed_by_peer() {
        char c = 0;
        const auto [ec, n] = co_await asio::async_read(socket_, asio::buffer(&c, 1),
                                                       asio::experimental::as_tuple(asio::use_awaitable));
        co_return ec&& n == 0;
    }

    asio::ip::tcp::socket& socket() { return socket_; }

private:
    asio::ip::tcp::socket socket_;
};

/// A child process with its stdout on a pipe.
struct child {
    pid_t pid = -1;
    int out_fd = -1;
};

/// Starts argv[0] with stdout on a pipe (stderr inherited).
inline child spawn(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe2");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    if (rc != 0) {
        ::close(fds[0]);
        throw std::system_error(rc, std::generic_category(), "posix_spawn " + args[0]);
    }
    return {pid, fds[0]};
}

/// Stops the child with SIGTERM, reaps it and closes its pipe; returns its wait status.
inline int terminate(child& c) {
    ::kill(c.pid, SIGTERM);
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    ::close(c.out_fd);
    c.out_fd = -1;
    return status;
}

/// Reads the child's stdout to EOF on the loop (no thread, no blocking), then reaps it.
/// Returns {output, wait status}.
inline asio::awaitable<std::pair<std::string, int>> collect(child c) {
    asio::posix::stream_descriptor in(co_await asio::this_coro::executor, c.out_fd);
    std::string out;
    char buf[4096];
    for (;;) {
        const auto [ec, n] = co_await in.async_read_some(asio::buffer(buf),
                                                         asio::experimental::as_tuple(asio::use_awaitable));
        out.append(buf, n);
        if (ec == asio::error::operation_aborted) {
            // Cancelled (a test body beside it failed): the child would outlive the test and
            // the wait below would never return.
            ::kill(c.pid, SIGKILL);
            break;
        }
        if (ec) break;
    }
    int status = 0;
    ::waitpid(c.pid, &status, 0);  // stdout closed: the child is exiting
    co_return std::pair{out, status};
}

/// A TCP store server on 127.0.0.1:0 in the test's process, its log captured; run() drives a
/// test coroutine and stops the server when it ends, so the loop runs dry.
struct server_fixture {
    explicit server_fixture(elastic::store_server_options options = {}) {
        options.host = "127.0.0.1";
        options.log = [this](std::string_view line) {
            logs.emplace_back(line);
            if (on_log) on_log(line);
        };
        server.emplace(ctx.get_executor(), std::move(options));
        server->start();
    }
    server_fixture(const server_fixture&) = delete;
    server_fixture& operator=(const server_fixture&) = delete;

    std::uint16_t port() const { return server->port(); }

    void run(asio::awaitable<void> body) {
        std::exception_ptr error;
        asio::co_spawn(ctx, std::move(body), [&](std::exception_ptr e) {
            error = e;
            server->stop();
        });
        ctx.run();
        if (error) std::rethrow_exception(error);
    }

    bool logged(std::string_view part) const {
        for (const auto& l : logs)
            if (l.find(part) != std::string::npos) return true;
        return false;
    }

    asio::io_context ctx;
    std::vector<std::string> logs;
    /// Called with each log line after it is stored (a test awaits a line as an event).
    std::function<void(std::string_view)> on_log;
    std::optional<elastic::tcp_store_server> server;
};

}  // namespace store_support
