// SPDX-License-Identifier: MIT
// What a tcp_store_server is given (store_server_options) and the state it shares with its
// connections (detail::store::store_server_core).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/store/engine.hpp"
#include "elastic/store/server_leases.hpp"
#include "elastic/store/wire.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include "elastic/detail/format.hpp"
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

namespace elastic::inline v0 {

/// Where the server's log lines go (one line per call, no trailing newline). The agent may
/// replace it; the default prints "elastic-store: <line>" to stderr.
using store_log = std::function<void(std::string_view line)>;

/// How a tcp_store_server listens and what it accepts (limits are documented in docs/store.md).
struct store_server_options {
    /// Address to bind: an IPv4/IPv6 literal or a host name; "0.0.0.0" every IPv4 interface,
    /// "::" dual-stack. Loopback by default: a store others can reach is a choice to make.
    std::string host = "127.0.0.1";
    /// Port to bind; 0 picks a free one (read it back with port()).
    std::uint16_t port = 0;
    /// Per-request limits; a request beyond one closes only its connection.
    wire::limits limits{};
    /// Connections served at once; one more is accepted, logged and closed at once.
    std::size_t max_connections = 16384;
    /// WAITs pending on one connection (a 1.13 client that times out leaves one behind each
    /// time); also the keys one connection may watch (WATCH_KEY).
    std::size_t max_waits_per_connection = 4096;
    /// Replies buffered before the server stops reading that connection's requests and writes.
    std::size_t max_pending_output = 4 * 1024 * 1024;
    /// The largest reply one request may ask for (MULTI_GET, LIST_KEYS), checked before the
    /// reply is built; a request asking for more closes its connection.
    std::size_t max_reply_size = 64 * 1024 * 1024;
    /// Bytes queued for one connection that it has not read: replies and pushed notifications
    /// (WAIT wake-ups, WATCH_KEY changes). A client that stops reading is disconnected when its
    /// queue would pass this, never buffered without end. At least max_pending_output plus
    /// max_reply_size, and room for a WATCH_KEY notification of two values.
    std::size_t max_queued_output = 128 * 1024 * 1024;
    /// Bytes the whole server may hold: keys and values, awaited keys, requests being read and
    /// replies being written. A request that would pass it is refused (its connection closed,
    /// the refusal logged); the store keeps serving everyone else.
    std::size_t max_memory = std::size_t{1} << 30;
    /// Once the first byte of a request has arrived, the whole request must arrive within this
    /// (and a reply being written must be taken by the client within it); otherwise the
    /// connection is closed. Zero disables it.
    std::chrono::milliseconds request_timeout{std::chrono::seconds(60)};
    /// A connection that sends nothing for this long while it holds no WAIT, WATCH_KEY or lease
    /// is closed. Zero (the default) keeps idle connections: PyTorch's clients hold theirs for
    /// the whole job, idle between collectives' set-up, and do not reconnect.
    std::chrono::milliseconds idle_timeout{0};
    /// Out of descriptors or at max_connections, a new client is served by closing the newest
    /// connection that has never sent a request and has been open at least this long (an
    /// idle flood's, typically; a fresh client has its first request on the way). When there
    /// is no such connection the new one is accepted and closed at once, never left hanging in
    /// the kernel's backlog. Empty: never close one connection for another.
    std::optional<std::chrono::milliseconds> shed_unused_after{std::chrono::seconds(1)};
    /// Log sink; empty means stderr.
    store_log log;
    /// Called after each request has run (tracing, metrics, tests); may be empty.
    std::function<void(wire::op)> on_request;
    /// Leases (docs/store.md, "Leases"): a connection that holds one must be heard from (any
    /// request: PING, an empty CHECK, ...) at least once per `lease_heartbeat_interval`; after
    /// `lease_missed_heartbeats` intervals of silence the server closes it and records its
    /// leases as lost. One timer per leasing connection, re-armed lazily (no per-request cost
    /// beyond reading the clock).
    std::chrono::milliseconds lease_heartbeat_interval{std::chrono::seconds(1)};
    unsigned lease_missed_heartbeats = 5;
    /// How many `__lost/<n>` records of a lease group the server keeps (the newest ones; at
    /// least 1). An observer that falls further behind finds the older ones erased, counts
    /// them by `__epoch` and names no lease for them.
    std::int64_t lease_lost_records_kept = 1024;
    /// Which peers may connect (docs/store.md, "Who may connect"): asked with each accepted
    /// connection's remote address before anything is read; a refused peer is logged and
    /// closed. Empty: everyone. For clients that cannot authenticate (PyTorch workers).
    std::function<bool(const asio::ip::address&)> accept_peer;
    /// Authentication (docs/store.md, "Authentication"): with a secret, a connection must
    /// complete the handshake (store/auth.hpp) before any request, within `auth_timeout`, or it
    /// is closed and logged; nothing it sends reaches the key table. Without one (PyTorch's
    /// clients cannot authenticate) every connection is served as it comes. Not empty.
    std::optional<std::string> secret;
    std::chrono::milliseconds auth_timeout{std::chrono::seconds(10)};

    /// Raises max_connections and max_memory, never lowers them, for a store that expects
    /// `clients` connections at once (an agent's rendezvous store: three per node of the
    /// largest round; its workers' store: two per worker and one per agent): room for each
    /// twice over, as a client that reconnects holds its new connection before the server sees
    /// the old one close, plus 1024 (standbys, tools), and memory_per_connection bytes each.
    /// The defaults already give that room to 7,680 clients; a store sized for a larger
    /// job is still bounded by what that job can use.
    void make_room_for(std::size_t clients) noexcept {
        constexpr std::size_t memory_per_connection = 16 * 1024;
        constexpr std::size_t most = std::size_t{1} << 40;  // no product overflows below it
        const std::size_t connections = std::min(clients, most) * 2 + 1024;
        max_connections = std::max(max_connections, connections);
        max_memory = std::max(max_memory, connections * memory_per_connection);
    }
};

namespace detail::store {

class store_connection;

// State shared by the server object and its connections, so a connection that finishes after
// the server object is gone still finds its engine.
struct store_server_core {
    store_server_core(const asio::any_io_executor& ex, store_server_options opts)
        : executor(ex), acceptor(ex), resume_accept(ex), options(std::move(opts)) {
        reserve_descriptor();
    }

    store_server_core(const store_server_core&) = delete;
    store_server_core& operator=(const store_server_core&) = delete;

    ~store_server_core() { release_descriptor(); }

    // Bytes held now: the key table and its waiters, and every connection's buffers.
    std::size_t held() const noexcept { return engine.bytes() + buffered; }

    // One descriptor kept open for the moment the process runs out: closing it lets the
    // acceptor take the waiting client, to be refused with a log line instead of left hanging.
    void reserve_descriptor() noexcept {
        if (spare_fd < 0) spare_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    ELASTIC_DECL void release_descriptor() noexcept;

    ELASTIC_DECL void log(std::string_view line) const;

    // How long a leasing connection may stay silent.
    std::chrono::steady_clock::duration lease_timeout() const {
        return options.lease_heartbeat_interval * options.lease_missed_heartbeats;
    }

    asio::any_io_executor executor;
    asio::ip::tcp::acceptor acceptor;
    async_signal resume_accept;  // notified when a connection closes (after EMFILE)
    store_server_options options;
    store_engine engine;
    std::unordered_set<store_connection*> connections;
    store_lease_table leases;
    std::size_t buffered = 0;  // bytes in the connections' input and output buffers
    int spare_fd = -1;         // reserve_descriptor()
    bool stopped = false;
    // When the server last said it had not run for a while (said once per stall, not per lease).
    std::chrono::steady_clock::time_point stall_said{};
};

ELASTIC_DECL std::string format_peer(const asio::ip::tcp::socket& s);

}  // namespace detail::store

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::store {

ELASTIC_DECL std::string format_peer(const asio::ip::tcp::socket& s) {
    std::error_code ec;
    const auto ep = s.remote_endpoint(ec);
    if (ec) return "unknown peer";
    if (ep.address().is_v6()) return detail::format("[{}]:{}", ep.address().to_string(), ep.port());
    return detail::format("{}:{}", ep.address().to_string(), ep.port());
}

}  // namespace detail::store
}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::store {

ELASTIC_DECL void store_server_core::release_descriptor() noexcept {
    if (spare_fd >= 0) ::close(spare_fd);
    spare_fd = -1;
}

ELASTIC_DECL void store_server_core::log(std::string_view line) const {
    if (options.log) options.log(line);
    else fmt::print(stderr, "elastic-store: {}\n", line);
}

}  // namespace detail::store
}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
