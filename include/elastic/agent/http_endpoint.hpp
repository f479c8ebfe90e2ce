// SPDX-License-Identifier: MIT
// A small HTTP/1.1 endpoint for what the agent shows while it runs (--metrics-port: /metrics,
// /status, /health; TORCHELASTIC_HEALTH_CHECK_PORT: the health check). GET and HEAD only, one
// request per connection, and bounded against a hostile client: at most 16 connections at once,
// 8 KiB of request head, 5 s to send it and read the answer.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/write.hpp>

#include "elastic/detail/format.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <list>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace elastic::inline v0 {

/// What the endpoint answers to one GET.
struct http_response {
    int status = 200;
    std::string content_type = "text/plain; charset=utf-8";
    std::string body;
};

namespace detail::agent {

/// The request line's method and path ("GET", "/metrics"; the query cut), or an answer when the
/// head is no request this endpoint serves (400, 405).
struct http_request_line {
    std::string method;
    std::string path;
    std::optional<http_response> refusal;
};
[[nodiscard]] ELASTIC_DECL http_request_line parse_http_request_line(std::string_view head);

/// The whole answer: status line, headers (Connection: close), and the body unless `head_only`.
[[nodiscard]] ELASTIC_DECL std::string http_answer(const http_response& r, bool head_only);

}  // namespace detail::agent

/// Listens on host:port and answers each GET with `handler(path)`. The listening socket is
/// made by the constructor (errors are the caller's to report); serve() answers until it is
/// cancelled. Connections still open when the endpoint goes are closed, and the handler is never
/// called after that.
template <class Defer = void>
class basic_http_endpoint {
public:
    static constexpr std::size_t max_connections = 16;
    static constexpr std::size_t max_head = 8192;
    static constexpr std::chrono::seconds deadline{5};

    /// Binds host:port (port 0: one the kernel picks). Throws std::system_error.
    basic_http_endpoint(asio::any_io_executor executor, const std::string& host, std::uint16_t port,
                        std::function<http_response(std::string_view path)> handler)
        : executor_(executor), acceptor_(executor), shared_(std::make_shared<shared>()) {
        shared_->handler = std::move(handler);
        const asio::ip::tcp::endpoint at(asio::ip::make_address(host), port);
        acceptor_.open(at.protocol());
        acceptor_.set_option(asio::ip::tcp::acceptor::reuse_address(true));
        acceptor_.bind(at);
        acceptor_.listen();
    }
    ~basic_http_endpoint() {
        shared_->handler = nullptr;
        for (auto& entry : shared_->open) {
            asio::error_code ignored;
            entry.first->close(ignored);
        }
    }
    basic_http_endpoint(const basic_http_endpoint&) = delete;
    basic_http_endpoint& operator=(const basic_http_endpoint&) = delete;

    [[nodiscard]] std::uint16_t port() const { return acceptor_.local_endpoint().port(); }

    /// Accepts and answers until cancelled.
    asio::awaitable<void> serve() {
        asio::steady_timer pause(executor_);
        for (;;) {
            auto [ec, socket] = co_await acceptor_.async_accept(detail::as_tuple_awaitable<Defer>);
            if (ec == asio::error::operation_aborted) throw asio::system_error(ec);
            if (ec) {
                // Out of descriptors (or another transient error): wait rather than spin.
                pause.expires_after(std::chrono::milliseconds(100));
                co_await pause.async_wait(detail::use_awaitable<Defer>);
                continue;
            }
            if (shared_->open.size() >= max_connections && !shared_->evict_one()) continue;  // all busy answering
            asio::co_spawn(executor_, answer(connection(shared_, std::move(socket))), detail::detached<Defer>);
        }
    }

private:
    struct shared {
        std::function<http_response(std::string_view)> handler;
        /// Open connections, oldest first, each with whether its request head has come.
        std::list<std::pair<asio::ip::tcp::socket*, bool>> open;

        /// Full: the oldest connection that has not sent its head yet makes room (a client that
        /// stalls cannot hold a place a real one needs). False when every one is being answered.
        bool evict_one() {
            for (auto& [socket, heard] : open) {
                asio::error_code ec;
                // Bytes waiting: a request that came, its coroutine not yet resumed.
                if (!heard && socket->available(ec) == 0 && !ec) {
                    asio::error_code ignored;
                    socket->close(ignored);
                    heard = true;  // closing: not evicted twice
                    return true;
                }
            }
            return false;
        }
        void heard(asio::ip::tcp::socket* socket) {
            for (auto& entry : open) {
                if (entry.first == socket) entry.second = true;
            }
        }
    };

    /// One accepted connection, counted among the open ones from its accept to its end (a
    /// coroutine frame dropped unrun ends it too).
    struct connection {
        std::shared_ptr<shared> state;
        std::unique_ptr<asio::ip::tcp::socket> socket;
        connection(std::shared_ptr<shared> s, asio::ip::tcp::socket&& accepted)
            : state(std::move(s)), socket(std::make_unique<asio::ip::tcp::socket>(std::move(accepted))) {
            state->open.emplace_back(socket.get(), false);
        }
        connection(connection&&) noexcept = default;
        connection& operator=(connection&&) = delete;
        ~connection() {
            if (socket) state->open.remove_if([this](const auto& entry) { return entry.first == socket.get(); });
        }
    };

    static asio::awaitable<void> answer(connection c) {
        using namespace asio::experimental::awaitable_operators;
        auto& state = c.state;
        auto& socket = c.socket;
        asio::steady_timer timer(socket->get_executor());
        timer.expires_after(deadline);
        std::string head;
        auto read = co_await (asio::async_read_until(*socket, asio::dynamic_buffer(head, max_head), "\r\n\r\n",
                                                     detail::as_tuple_awaitable<Defer>) ||
                              timer.async_wait(detail::as_tuple_awaitable<Defer>));
        if (read.index() == 1) co_return;  // too slow: closed without an answer
        const auto [ec, n] = std::get<0>(read);
        state->heard(socket.get());
        detail::agent::http_request_line request;
        if (ec == asio::error::not_found) {
            request.refusal = http_response{431, "text/plain; charset=utf-8", "request head too large\n"};
        } else if (ec) {
            co_return;  // gone, or closed by the endpoint's end
        } else {
            request = detail::agent::parse_http_request_line(std::string_view(head).substr(0, n));
        }
        http_response r;
        if (request.refusal) {
            r = std::move(*request.refusal);
        } else if (!state->handler) {
            co_return;
        } else {
            r = state->handler(request.path);
        }
        const auto text = detail::agent::http_answer(r, request.method == "HEAD");
        (void)co_await (asio::async_write(*socket, asio::buffer(text), detail::as_tuple_awaitable<Defer>) ||
                        timer.async_wait(detail::as_tuple_awaitable<Defer>));
        asio::error_code ignored;
        socket->shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    }

    asio::any_io_executor executor_;
    asio::ip::tcp::acceptor acceptor_;
    std::shared_ptr<shared> shared_;
};

using http_endpoint = basic_http_endpoint<>;

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL detail::agent::http_request_line detail::agent::parse_http_request_line(std::string_view head) {
    http_request_line out;
    const auto end = head.find("\r\n");
    const auto line = head.substr(0, end);
    const auto a = line.find(' ');
    const auto b = a == std::string_view::npos ? a : line.find(' ', a + 1);
    if (a == std::string_view::npos || b == std::string_view::npos || line.substr(b + 1).rfind("HTTP/1.", 0) != 0) {
        out.refusal = http_response{400, "text/plain; charset=utf-8", "not an HTTP/1.x request\n"};
        return out;
    }
    out.method = std::string(line.substr(0, a));
    const auto target = line.substr(a + 1, b - a - 1);
    out.path = std::string(target.substr(0, target.find('?')));
    if (out.method != "GET" && out.method != "HEAD") {
        out.refusal = http_response{405, "text/plain; charset=utf-8", "only GET and HEAD are served\n"};
    }
    return out;
}

ELASTIC_DECL std::string detail::agent::http_answer(const http_response& r, bool head_only) {
    const char* reason = "OK";
    switch (r.status) {
        case 200: reason = "OK"; break;
        case 400: reason = "Bad Request"; break;
        case 404: reason = "Not Found"; break;
        case 405: reason = "Method Not Allowed"; break;
        case 431: reason = "Request Header Fields Too Large"; break;
        case 503: reason = "Service Unavailable"; break;
        default: reason = "Unknown"; break;
    }
    auto out = detail::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
                              r.status, reason, r.content_type, r.body.size(),
                              r.status == 405 ? "Allow: GET, HEAD\r\n" : "");
    if (!head_only) out += r.body;
    return out;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
