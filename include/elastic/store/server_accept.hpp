// SPDX-License-Identifier: MIT
// The accept loop of a tcp_store_server: who is let in (max_connections, accept_peer, out of
// descriptors), the connection shed for a newcomer, and the server's stop.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/store/server_connection.hpp"
#include "elastic/store/server_core.hpp"

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/use_awaitable.hpp>
#include "elastic/detail/format.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string_view>
#include <system_error>
#include <utility>

#include <poll.h>

namespace elastic::inline v0::detail::store {

// Whether a client waits in the listening socket's queue (never blocks).
inline bool client_waiting(asio::ip::tcp::acceptor& acceptor) noexcept {
    pollfd p{acceptor.native_handle(), POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

// Stops accepting and closes every connection (their waits are dropped).
inline void stop_server(store_server_core& core) noexcept {
    if (core.stopped) return;
    core.stopped = true;
    std::error_code ignored;
    core.acceptor.close(ignored);
    core.resume_accept.notify();
    core.release_descriptor();
    for (auto* c : core.connections) c->close();
}

// Closes the newest connection that never sent a request (store_server_options::
// shed_unused_after) so a new client can be served; false when there is none.
inline bool shed_unused(store_server_core& core, std::string_view why) {
    if (!core.options.shed_unused_after) return false;
    const auto after = *core.options.shed_unused_after;
    const auto now = std::chrono::steady_clock::now();
    store_connection* victim = nullptr;
    for (auto* c : core.connections)
        if (c->unused_since(now, after) && (!victim || c->opened() > victim->opened())) victim = c;
    if (!victim) return false;
    victim->expire(
        detail::format("{}: it has completed no request in the {} ms since it connected, and a new client "
                       "is served in its place (store_server_options::shed_unused_after)",
                       why, std::chrono::duration_cast<std::chrono::milliseconds>(now - victim->opened()).count()));
    return true;
}

// Accepts connections until the server stops, each served by a coroutine of its own; out of
// descriptors or at max_connections, makes room or refuses the newcomer plainly.
template <class Defer = void>
asio::awaitable<void> accept_loop(std::shared_ptr<store_server_core> core) {
    while (!core->stopped) {
        auto [ec, socket] = co_await core->acceptor.async_accept(detail::as_tuple_awaitable<Defer>);
        if (ec == asio::error::operation_aborted || core->stopped) break;
        if (ec == asio::error::no_descriptors || ec == std::errc::too_many_files_open_in_system) {
            // Out of descriptors. The kernel says so before it looks at the queue, so
            // first see whether a client is waiting at all; if none, wait for one (stop()
            // closes the acceptor, which ends the wait), without a retry loop.
            if (!client_waiting(core->acceptor)) {
                co_await core->acceptor.async_wait(asio::ip::tcp::acceptor::wait_read,
                                                   detail::as_tuple_awaitable<Defer>);
                continue;
            }
            // A client waits: close an unused connection for it, or take it with the
            // reserve descriptor and refuse it plainly.
            if (shed_unused(*core, "the process is out of file descriptors")) continue;
            if (core->spare_fd >= 0) {
                core->release_descriptor();
                auto [ec2, refused] = co_await core->acceptor.async_accept(detail::as_tuple_awaitable<Defer>);
                if (!ec2) {
                    core->log(detail::format("refusing connection from {}: the process is out of file "
                                             "descriptors ({}) and no connection can make room; raise `ulimit "
                                             "-n` or lower store_server_options::max_connections",
                                             format_peer(refused), ec.message()));
                    std::error_code ignored;
                    refused.close(ignored);
                }
                if (core->stopped) break;
                core->reserve_descriptor();
                if (!ec2 || ec2 == asio::error::operation_aborted) continue;
            }
            core->log(detail::format("cannot accept: {}; waiting until a connection closes", ec.message()));
            co_await core->resume_accept.wait();
            continue;
        }
        if (ec) {
            core->log(detail::format("accept failed: {}", ec.message()));
            continue;
        }
        std::error_code ignored;
        if (core->options.accept_peer) {
            const auto remote = socket.remote_endpoint(ignored);
            if (ignored || !core->options.accept_peer(remote.address())) {
                core->log(detail::format("refusing connection from {}: not a peer this store "
                                         "accepts (store_server_options::accept_peer)",
                                         format_peer(socket)));
                socket.close(ignored);
                continue;
            }
        }
        socket.set_option(asio::ip::tcp::no_delay(true), ignored);
        // Connections already closed (shed a moment ago) leave the set when their coroutine
        // runs: they do not count, or each new client would shed one more.
        if (core->connections.size() >= core->options.max_connections &&
            static_cast<std::size_t>(std::ranges::count_if(core->connections,
                                                           [](const auto* c) { return c->is_open(); })) >=
                core->options.max_connections &&
            !shed_unused(*core, "max_connections is reached")) {
            core->log(detail::format("refusing connection from {}: {} connections reach the "
                                     "limit (store_server_options::max_connections)",
                                     format_peer(socket), core->connections.size()));
            socket.close(ignored);
            continue;
        }
        auto conn = std::make_shared<store_connection>(core, std::move(socket));
        core->connections.insert(conn.get());
        asio::co_spawn(core->executor, store_connection::serve<Defer>(std::move(conn)), detail::detached<Defer>);
    }
    stop_server(*core);
}

}  // namespace elastic::inline v0::detail::store
