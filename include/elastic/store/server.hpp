// SPDX-License-Identifier: MIT
// tcp_store_server: PyTorch's TCPStore server protocol, both dialects per connection, one
// coroutine per connection on one io_context, waits answered by push, leases bound to
// connections.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/store/engine.hpp"
#include "elastic/store/errors.hpp"
#include "elastic/store/server_accept.hpp"
#include "elastic/store/server_core.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/ip/v6_only.hpp>
#include "elastic/detail/format.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <utility>

namespace elastic::inline v0 {

/// PyTorch's TCPStore server. Both wire dialects are served side by side, chosen per connection
/// from its first bytes, over one key table. Bind in the constructor; serve with `start()` (or
/// `co_await run()`); stop with `stop()`, the destructor, or by cancelling `run()`. Use it on one
/// thread (run the io_context on one thread).
template <class Defer = void>
class basic_tcp_store_server {
public:
    /// Binds and listens on `options.host`:`options.port`; throws store_error when it cannot.
    explicit basic_tcp_store_server(const asio::any_io_executor& executor, store_server_options options = {})
        : core_(std::make_shared<detail::store::store_server_core>(executor, std::move(options))) {
        auto& o = core_->options;
        auto& acc = core_->acceptor;
        if (o.lease_heartbeat_interval.count() <= 0 || o.lease_missed_heartbeats == 0)
            throw store_error(detail::format("store_server_options: lease_heartbeat_interval {} ms and "
                                             "lease_missed_heartbeats {} must both be positive",
                                             o.lease_heartbeat_interval.count(), o.lease_missed_heartbeats));
        // A client that reads everything must never be cut off: its queue holds what reading
        // stops at plus one reply, or a WATCH_KEY notification of two values.
        const std::size_t notification = 25 + o.limits.max_key_size + 2 * o.limits.max_value_size;
        if (o.max_queued_output < o.max_pending_output + std::max(o.max_reply_size, notification))
            throw store_error(
                detail::format("store_server_options: max_queued_output {} is less than max_pending_output {} "
                               "plus the largest reply ({}) or notification ({})",
                               o.max_queued_output, o.max_pending_output, o.max_reply_size, notification));
        if (o.secret && o.secret->empty())
            throw store_error("store_server_options::secret is empty: give the job's secret, or "
                              "no secret (std::nullopt) for a store without authentication");
        if (o.secret && o.auth_timeout.count() <= 0)
            throw store_error(detail::format("store_server_options::auth_timeout {} ms must be "
                                             "positive",
                                             o.auth_timeout.count()));
        try {
            asio::ip::tcp::endpoint ep;
            std::error_code ec;
            const auto address = asio::ip::make_address(o.host, ec);
            if (!ec) {
                ep = {address, o.port};
            } else {
                asio::ip::tcp::resolver resolver(executor);
                const auto results = resolver.resolve(o.host, std::to_string(o.port), asio::ip::resolver_base::passive);
                ep = results.begin()->endpoint();
            }
            acc.open(ep.protocol());
            acc.set_option(asio::socket_base::reuse_address(true));
            if (ep.address().is_v6()) acc.set_option(asio::ip::v6_only(false));
            acc.bind(ep);
            acc.listen(asio::socket_base::max_listen_connections);
            bound_ = acc.local_endpoint();
        } catch (const std::system_error& e) {
            throw store_listen_error(detail::format("cannot listen on {}:{}: {}; choose another port (0 "
                                                    "picks a free one) or address",
                                                    o.host, o.port, e.code().message()),
                                     e.code());
        }
    }

    basic_tcp_store_server(const basic_tcp_store_server&) = delete;
    basic_tcp_store_server& operator=(const basic_tcp_store_server&) = delete;

    ~basic_tcp_store_server() { stop(); }

    /// The bound address and port (still after stop()).
    asio::ip::tcp::endpoint local_endpoint() const { return bound_; }
    /// The bound port (the chosen one when options.port was 0).
    std::uint16_t port() const { return local_endpoint().port(); }

    /// Serves in the background on the executor (the agent's usual way).
    void start() { asio::co_spawn(core_->executor, detail::store::accept_loop<Defer>(core_), detail::detached<Defer>); }

    /// Accepts and serves until stop() or until the awaiting coroutine is cancelled (which also
    /// stops the server). The coroutine owns the server's shared state, not `this`, so it may
    /// outlive the server object.
    asio::awaitable<void> run() { return detail::store::accept_loop(core_); }

    /// Stops accepting and closes every connection (their waits are dropped).
    void stop() noexcept { detail::store::stop_server(*core_); }

    /// The key table the connections share (for an embedding agent and for tests).
    detail::store::store_engine& engine() noexcept { return core_->engine; }

    /// The number of open connections.
    std::size_t connections() const noexcept { return core_->connections.size(); }

    /// Bytes held now, as store_server_options::max_memory counts them: keys, values, awaited
    /// keys, and the connections' request and reply buffers.
    std::size_t memory() const noexcept { return core_->held(); }

    /// The number of leases held now, and lost since the start (docs/store.md, "Leases").
    std::size_t leases() const noexcept { return core_->leases.size(); }
    std::uint64_t leases_lost() const noexcept { return core_->leases.lost(); }

private:
    std::shared_ptr<detail::store::store_server_core> core_;
    asio::ip::tcp::endpoint bound_;  ///< where it listens, from the start
};
using tcp_store_server = basic_tcp_store_server<>;

}  // namespace elastic::inline v0
