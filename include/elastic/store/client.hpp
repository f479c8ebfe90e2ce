// SPDX-License-Identifier: MIT
// tcp_store_client: a client of PyTorch's TCPStore protocol (both dialects) that models the
// `store` concept as coroutines; connect with backoff, a deadline on every operation; leases
// kept alive by heartbeats, and a lost connection reported as an event.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/detail/random.hpp"
#include "elastic/store/auth.hpp"
#include "elastic/store/client_connection.hpp"
#include "elastic/store/client_dialect.hpp"
#include "elastic/store/client_leases.hpp"
#include "elastic/store/concepts.hpp"
#include "elastic/store/errors.hpp"
#include "elastic/store/lease.hpp"
#include "elastic/store/wire.hpp"

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/connect.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/read.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include "elastic/detail/format.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <unistd.h>

namespace elastic::inline v0 {

/// One failed connection attempt, reported to `store_client_options::on_retry` before the
/// client sleeps `delay` and tries again.
struct store_connect_attempt {
    int attempt = 0;                  ///< 1 for the first attempt
    std::error_code error;            ///< why it failed (refused, reset, timed out, ...)
    std::chrono::milliseconds delay;  ///< the backoff before the next attempt
};

/// How a tcp_store_client reaches its server and how long it waits.
struct store_client_options {
    std::string host = "127.0.0.1";  ///< IPv4/IPv6 literal or a host name
    std::uint16_t port = 29500;      ///< PyTorch's default MASTER_PORT
    client_dialect dialect = client_dialect::detect;
    /// Prepended to every key, as PyTorch's TCPStore client does ("/"): a key "k" set by a
    /// Python or libtorch TCPStore is the key "k" here too. Empty gives raw wire keys.
    std::string key_prefix = "/";
    /// Default for `get` and `wait`, and the deadline of every other operation's reply
    /// (PyTorch's default store timeout, 300 s).
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};
    /// How long connection attempts go on (refused, reset, unreachable) before store_error.
    std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
    /// `detect`: how long to wait for the PING echo before calling the server legacy.
    std::chrono::milliseconds detect_timeout{std::chrono::seconds(1)};
    /// Exponential backoff between connection attempts: initial, doubled up to max, each
    /// multiplied by a random factor in [0.5, 1] so many clients do not retry in lockstep.
    std::chrono::milliseconds initial_backoff{10};
    std::chrono::milliseconds max_backoff{std::chrono::seconds(1)};
    /// Called after each failed connection attempt that will be retried (logging, tests).
    std::function<void(const store_connect_attempt&)> on_retry;
    /// Leases (hold_lease, docs/store-client.md "Leases"): while the client holds one it sends a
    /// heartbeat every `lease_heartbeat_interval` when the connection is idle (PING in the
    /// current dialect, an empty CHECK in the legacy one). A heartbeat unanswered for
    /// `lease_missed_heartbeats` intervals, or a closed connection, ends the connection and its
    /// leases: connection_lost() reports it. Use the server's values
    /// (store_server_options::lease_heartbeat_interval, lease_missed_heartbeats).
    std::chrono::milliseconds lease_heartbeat_interval{std::chrono::seconds(1)};
    unsigned lease_missed_heartbeats = 5;
    /// The store's secret (store_server_options::secret; docs/store.md, "Authentication"): each
    /// connection, reconnections included, runs the handshake first, within connect_timeout.
    /// A server that does not prove it knows the same secret, or refuses this client's proof,
    /// is a store_auth_error (not retried). Empty: no authentication (PyTorch's servers).
    std::optional<std::string> secret;
};

/// A client of a c10d TCPStore server: ours, PyTorch 1.13's, or a current PyTorch's. One TCP
/// connection, one request at a time (concurrent calls on one client queue up in order; a long
/// `wait` holds the connection, so give concurrent waiters their own clients). Connects on
/// first use and again after a failure. Use it on one thread (the executor's).
///
/// Errors: store_error naming host:port for a vanished, refusing or misbehaving server;
/// store_timeout when a wait (or the wait inside get) or a reply misses its deadline.
template <class Defer = void>
class basic_tcp_store_client {
public:
    basic_tcp_store_client(const asio::any_io_executor& executor, store_client_options options)
        : executor_(executor),
          options_(std::move(options)),
          rng_(detail::random_u64()),
          lock_(executor),
          leases_(executor),
          heartbeat_timer_(executor) {
        if (options_.dialect != client_dialect::detect)
            dialect_ = options_.dialect == client_dialect::current ? wire::dialect::current : wire::dialect::legacy;
        if (options_.secret && options_.secret->empty())
            throw store_error("store_client_options::secret is empty: give the store's secret, "
                              "or no secret (std::nullopt) for a store without authentication");
        if (options_.lease_heartbeat_interval.count() <= 0 || options_.lease_missed_heartbeats == 0)
            throw store_error(detail::format("store_client_options: lease_heartbeat_interval {} ms and "
                                             "lease_missed_heartbeats {} must both be positive",
                                             options_.lease_heartbeat_interval.count(),
                                             options_.lease_missed_heartbeats));
    }

    basic_tcp_store_client(const basic_tcp_store_client&) = delete;
    basic_tcp_store_client& operator=(const basic_tcp_store_client&) = delete;

    // The heartbeat coroutine may still be suspended: it sees *alive_ false and leaves.
    ~basic_tcp_store_client() {
        *alive_ = false;
        leases_.clear();
        drop();
    }

    /// Connects now (otherwise the first operation does). Throws store_error naming the address
    /// when no attempt succeeds within `connect_timeout`.
    asio::awaitable<void> connect() {
        auto lock = co_await acquire();
        co_await ensure_connected();
    }

    /// Closes the connection; the next operation reconnects. Leases held end with it
    /// (connection_lost() reports "close() was called").
    void close() noexcept {
        ++closes_;
        drop("close() was called");
    }

    /// The dialect in use: chosen by options, or known after `detect` has connected.
    [[nodiscard]] std::optional<wire::dialect> dialect() const noexcept { return dialect_; }

    /// "host:port" of the server, as error messages name it.
    [[nodiscard]] std::string address() const {
        if (options_.host.find(':') != std::string::npos)
            return detail::format("[{}]:{}", options_.host, options_.port);
        return detail::format("{}:{}", options_.host, options_.port);
    }

    [[nodiscard]] const store_client_options& options() const noexcept { return options_; }

    /// The default timeout of get and wait.
    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return options_.timeout; }
    void set_timeout(std::chrono::milliseconds t) noexcept { options_.timeout = t; }

    /// Writes `value` at `key` (no reply in the protocol: an error shows on a later operation).
    asio::awaitable<void> set(std::string key, std::string value) {
        auto lock = co_await acquire();
        co_await ensure_connected();
        const auto k = wire_key(key);
        begin(wire::op::set);
        req_.key = k;
        req_.value = value;
        co_await send(std::string_view("SET"), k);
        track_lease(std::move(key), k);
    }

    /// Waits for `key` (as PyTorch's clients do: a 1.13 server drops a connection that GETs a
    /// missing key), then reads it. store_timeout after `timeout()`.
    asio::awaitable<std::string> get(std::string key) {
        auto lock = co_await acquire();
        const auto k = wire_key(key);
        std::vector<std::string> keys(1, k);  // not `{k}`: g++ 12 rejects it in co_await
        co_await wait_locked(std::move(keys), options_.timeout, std::string_view("get"));
        begin(wire::op::get);
        req_.key = k;
        co_await send(std::string_view("GET"), k);
        co_return co_await read_bytes(std::string_view("GET"), k);
    }

    /// Adds `delta` to the decimal counter at `key` (created at 0) and returns the new value.
    asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta) {
        auto lock = co_await acquire();
        co_await ensure_connected();
        const auto k = wire_key(key);
        begin(wire::op::add);
        req_.key = k;
        req_.number = delta;
        co_await send(std::string_view("ADD"), k);
        co_return co_await read_i64(std::string_view("ADD"), k);
    }

    /// PyTorch's compare_set: returns `desired` on success, otherwise the current value (or
    /// `expected` when the key is absent and `expected` is not empty).
    asio::awaitable<std::string> compare_set(std::string key, std::string expected, std::string desired) {
        auto lock = co_await acquire();
        co_await ensure_connected();
        const auto k = wire_key(key);
        begin(wire::op::compare_set);
        req_.key = k;
        req_.expected = expected;
        req_.value = desired;
        co_await send(std::string_view("COMPARE_SET"), k);
        auto now = co_await read_bytes(std::string_view("COMPARE_SET"), k);
        if (now == desired) track_lease(std::move(key), k);
        co_return now;
    }

    /// Waits until every key exists; store_timeout after `timeout()`.
    asio::awaitable<void> wait(std::vector<std::string> keys) { co_await wait(std::move(keys), options_.timeout); }

    /// Waits until every key exists; store_timeout after `timeout`. The connection stays
    /// usable: the current dialect cancels the wait (CANCEL_WAIT), the legacy one reconnects
    /// (PyTorch 1.13 has no CANCEL_WAIT and would answer the stale wait later).
    asio::awaitable<void> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
        auto lock = co_await acquire();
        for (auto& k : keys) k = wire_key(k);
        co_await wait_locked(std::move(keys), timeout, std::string_view("wait"));
    }

    /// Whether every key exists now.
    asio::awaitable<bool> check(std::vector<std::string> keys) {
        auto lock = co_await acquire();
        co_await ensure_connected();
        for (auto& k : keys) k = wire_key(k);
        begin(wire::op::check);
        for (const auto& k : keys) req_.keys.emplace_back(k);
        co_await send(std::string_view("CHECK"), first_of(keys));
        const auto byte = co_await read_u8(std::string_view("CHECK"), first_of(keys));
        co_return byte == static_cast<std::uint8_t>(wire::check_response::ready);
    }

    /// Deletes `key`; whether it existed.
    asio::awaitable<bool> delete_key(std::string key) {
        auto lock = co_await acquire();
        co_await ensure_connected();
        const auto k = wire_key(key);
        begin(wire::op::delete_key);
        req_.key = k;
        leases_.remove(key);
        co_await send(std::string_view("DELETE_KEY"), k);
        co_return co_await read_i64(std::string_view("DELETE_KEY"), k) > 0;
    }

    /// The number of keys on the server (all of them, whatever their prefix).
    asio::awaitable<std::int64_t> num_keys() {
        auto lock = co_await acquire();
        co_await ensure_connected();
        begin(wire::op::num_keys);
        co_await send(std::string_view("GETNUMKEYS"), {});
        co_return co_await read_i64(std::string_view("GETNUMKEYS"), {});
    }

    /// Waits for every key, then reads them in order. The legacy dialect pipelines one GET per
    /// key (PyTorch 1.13 has no MULTI_GET).
    asio::awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys) {
        auto lock = co_await acquire();
        for (auto& k : keys) k = wire_key(k);
        co_await wait_locked(keys, options_.timeout, std::string_view("multi_get"));
        std::vector<std::string> out;
        if (keys.empty()) co_return out;
        if (*dialect_ == wire::dialect::current) {
            begin(wire::op::multi_get);
            for (const auto& k : keys) req_.keys.emplace_back(k);
            co_await send(std::string_view("MULTI_GET"), keys.front());
        } else {
            arm();
            wbuf_.clear();
            for (const auto& k : keys) {
                req_.operation = wire::op::get;
                req_.key = k;
                wire::encode_request(*dialect_, req_, wbuf_);
            }
            co_await flush(std::string_view("GET"), keys.front());
        }
        out.reserve(keys.size());
        for (const auto& k : keys) out.push_back(co_await read_bytes(std::string_view("MULTI_GET"), k));
        co_return out;
    }

    /// Writes every pair (store_error when the sizes differ). The legacy dialect pipelines one
    /// SET per pair.
    asio::awaitable<void> multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
        if (keys.size() != values.size())
            throw store_error(detail::format("multi_set needs as many values as keys, got {} keys "
                                             "and {} values",
                                             keys.size(), values.size()));
        auto lock = co_await acquire();
        co_await ensure_connected();
        if (keys.empty()) co_return;
        for (auto& k : keys) k = wire_key(k);
        if (*dialect_ == wire::dialect::current) {
            begin(wire::op::multi_set);
            for (std::size_t i = 0; i < keys.size(); ++i) {
                req_.keys.emplace_back(keys[i]);
                req_.values.emplace_back(values[i]);
            }
            co_await send(std::string_view("MULTI_SET"), keys.front());
        } else {
            arm();
            wbuf_.clear();
            for (std::size_t i = 0; i < keys.size(); ++i) {
                req_.operation = wire::op::set;
                req_.key = keys[i];
                req_.value = values[i];
                wire::encode_request(*dialect_, req_, wbuf_);
            }
            co_await flush(std::string_view("SET"), keys.front());
        }
        for (std::size_t i = 0; i < keys.size(); ++i) track_lease(keys[i].substr(options_.key_prefix.size()), keys[i]);
    }

    /// Appends `value` to `key` (creates it). PyTorch 1.13 servers lack APPEND and close the
    /// connection: a store_error here (the legacy dialect follows APPEND with an empty CHECK,
    /// whose reply proves the server took it, since APPEND itself has no reply).
    asio::awaitable<void> append(std::string key, std::string value) {
        auto lock = co_await acquire();
        co_await ensure_connected();
        const auto k = wire_key(key);
        begin(wire::op::append);
        req_.key = k;
        req_.value = value;
        wbuf_.clear();
        wire::encode_request(*dialect_, req_, wbuf_);
        if (*dialect_ == wire::dialect::current) {
            co_await flush(std::string_view("APPEND"), k);
            co_return;
        }
        req_.operation = wire::op::check;
        wire::encode_request(*dialect_, req_, wbuf_);
        co_await flush(std::string_view("APPEND"), k);
        (void)co_await read_u8(std::string_view("APPEND"), k);
    }

    // ---- leases ----------------------------------------------------------------------------

    /// Sets `key` to `value` as a lease bound to this client's connection, and returns once the
    /// server has it (a heartbeat's reply follows the SET). `key` is in the client's key space,
    /// like set's, and must be a lease key: `lease_key(group, name)`, i.e. `<group>/__lease__/
    /// <name>`, name neither empty nor starting with "__" (store_error otherwise). Our server
    /// deletes the key and records the loss (`lease_epoch_key`, `lease_lost_key`) when the
    /// connection closes or stays silent; a PyTorch server stores it as an ordinary key.
    /// Heartbeats start with the first lease. The lease does not survive the connection: after
    /// connection_lost(), hold it again (the next operation reconnects).
    asio::awaitable<void> hold_lease(std::string key, std::string value) {
        const auto k = wire_key(key);
        const auto parts = parse_lease_key(k);
        if (!parts || parts->name.empty() || parts->reserved())
            throw store_error(detail::format("hold_lease('{}'): not a lease key; use lease_key(group, name): "
                                             "<group>/{}<name>, with a name neither empty nor starting with '__'",
                                             key, lease_marker));
        auto lock = co_await acquire();
        co_await ensure_connected();
        begin(wire::op::set);
        req_.key = k;
        req_.value = value;
        wbuf_.clear();
        wire::encode_request(*dialect_, req_, wbuf_);
        detail::store::encode_heartbeat(*dialect_, wbuf_);
        co_await flush(std::string_view("SET"), k);
        co_await read_heartbeat(std::string_view("SET"), k);
        leases_.add(std::move(key));
        start_heartbeat();
    }

    /// Ends the lease at `key` without a loss (DELETE_KEY, as `delete_key` of a lease key
    /// does); whether the key existed.
    asio::awaitable<bool> release_lease(std::string key) { co_return co_await delete_key(std::move(key)); }

    /// The lease keys this client holds now.
    [[nodiscard]] const std::vector<std::string>& leases() const noexcept { return leases_.keys(); }

    /// Completes when the connection that held this client's leases ends: a heartbeat left
    /// unanswered for lease_missed_heartbeats x lease_heartbeat_interval (a hung, stopped or
    /// unreachable server), an EOF or reset (a server that died: seen by the next heartbeat,
    /// within one interval), a failed operation, or close(). A loss that happened before the
    /// call is reported at once; each loss is reported once. Cancel it as any awaitable.
    asio::awaitable<store_connection_loss> connection_lost() { return leases_.next_loss(alive_); }

private:
    using clock = std::chrono::steady_clock;

    std::chrono::milliseconds heartbeat_deadline() const {
        return options_.lease_heartbeat_interval * options_.lease_missed_heartbeats;
    }

    asio::awaitable<void> read_heartbeat(std::string_view what, std::string_view key) {
        const auto n = detail::store::heartbeat_reply_size(*dialect_);
        if (const auto ec = co_await fill(n)) fail(what, key, ec);
        if (!detail::store::heartbeat_reply_ok(*dialect_, rbuf_.data() + rbeg_))
            throw_protocol(what, key, "a wrong heartbeat reply");
        rbeg_ += n;
    }

    // set, multi_set and a winning compare_set of a lease key bind it on our server, as
    // hold_lease does: keep it alive the same way, so code written against the `store` concept
    // holds leases correctly through this client.
    void track_lease(std::string key, std::string_view wire) {
        const auto parts = parse_lease_key(wire);
        if (!parts || parts->name.empty() || parts->reserved()) return;
        leases_.add(std::move(key));
        start_heartbeat();
    }

    void start_heartbeat() {
        if (heartbeat_running_) return;
        heartbeat_running_ = true;
        asio::co_spawn(executor_, heartbeat(alive_), detail::detached<Defer>);
    }

    // Every interval while leases are held: one heartbeat when the connection is idle. A busy
    // connection is skipped: the operation on it is traffic the server hears (a long WAIT is
    // not: docs/store-client.md). `this` is touched only after checking *alive: the client may
    // be destroyed while this coroutine is suspended.
    asio::awaitable<void> heartbeat(std::shared_ptr<bool> alive) {
        for (;;) {
            heartbeat_timer_.expires_after(options_.lease_heartbeat_interval);
            co_await heartbeat_timer_.async_wait(detail::as_tuple_awaitable<Defer>);
            if (!*alive) co_return;
            if (leases_.empty()) {
                heartbeat_running_ = false;
                co_return;
            }
            if (!conn_ || !lock_.try_lock()) continue;
            co_await beat(alive);
            if (!*alive) co_return;
            release();
        }
    }

    // One heartbeat on the held connection, read into the frame (not rbuf_), so a destroyed
    // client is never touched after a suspension.
    asio::awaitable<void> beat(std::shared_ptr<bool> alive) {
        const auto conn = conn_;
        if (rbeg_ != rend_) {
            drop(detail::format("the store at {} sent {} bytes nobody asked for", address(), rend_ - rbeg_));
            co_return;
        }
        std::string out;
        detail::store::encode_heartbeat(*dialect_, out);
        arm_deadline(clock::now() + heartbeat_deadline());
        auto [ec, n] = co_await asio::async_write(conn->socket, asio::buffer(out), detail::as_tuple_awaitable<Defer>);
        (void)n;
        if (!*alive) co_return;
        std::array<char, 4> reply{};
        if (!ec) {
            const auto [rec, got] = co_await asio::async_read(
                conn->socket, asio::buffer(reply.data(), detail::store::heartbeat_reply_size(*dialect_)),
                detail::as_tuple_awaitable<Defer>);
            (void)got;
            if (!*alive) co_return;
            ec = rec;
        }
        if (conn != conn_) co_return;  // closed meanwhile (close()): already reported
        if (!ec && detail::store::heartbeat_reply_ok(*dialect_, reply.data())) {
            disarm();
            co_return;
        }
        if (conn->expired) drop(silent_server_message());
        else if (ec)
            drop(detail::format("the store at {} closed the connection ({}): the server stopped "
                                "or died, or it ended this connection (see its log)",
                                address(), ec.message()));
        else
            drop(detail::format("the store at {} answered a heartbeat with a wrong reply: not our "
                                "server, or a desynchronised stream",
                                address()));
    }

    // `silence`: what the server did not do in time ("did not answer a heartbeat" while idle).
    std::string silent_server_message(std::string_view silence = "did not answer a heartbeat") const {
        return detail::format("the store at {} {} within {} ms ({} missed "
                              "heartbeats of {} ms): the server is hung, stopped or unreachable "
                              "(store_client_options::lease_heartbeat_interval, "
                              "lease_missed_heartbeats)",
                              address(), silence, heartbeat_deadline().count(), options_.lease_missed_heartbeats,
                              options_.lease_heartbeat_interval.count());
    }

    // ---- one request at a time ---------------------------------------------------------------
    // Every operation holds lock_ for its whole length; the guard's release also ends the
    // operation's deadline.
    class lock_guard {
    public:
        explicit lock_guard(basic_tcp_store_client* c) noexcept : client_(c) {}
        lock_guard(lock_guard&& o) noexcept : client_(std::exchange(o.client_, nullptr)) {}
        lock_guard& operator=(lock_guard&&) = delete;
        ~lock_guard() {
            if (client_) client_->release();
        }

    private:
        basic_tcp_store_client* client_;
    };

    asio::awaitable<lock_guard> acquire() {
        co_await lock_.lock("store operation cancelled while queued");
        co_return lock_guard(this);
    }

    void release() noexcept {
        disarm();
        lock_.unlock();
    }

    // ---- connection --------------------------------------------------------------------------
    std::string wire_key(std::string_view key) const {
        std::string k;
        k.reserve(options_.key_prefix.size() + key.size());
        k.append(options_.key_prefix).append(key);
        return k;
    }

    static std::string_view first_of(const std::vector<std::string>& keys) {
        return keys.empty() ? std::string_view{} : std::string_view(keys.front());
    }

    void drop(std::string_view reason = "the connection was closed") noexcept {
        if (!conn_) return;
        leases_.lose(reason);  // reported once, to whoever awaits (or next awaits) connection_lost()
        conn_->close();
        conn_.reset();
        rbeg_ = rend_ = 0;
    }

    void arm_deadline(clock::time_point deadline, bool may_extend = true) {
        silence_bound_ = false;
        conn_->arm_deadline(deadline, may_extend);
    }

    // Whether the running request's deadline fired. A connection close() dropped while the
    // request was suspended (conn_ empty) did not expire: it was closed.
    [[nodiscard]] bool expired() const noexcept { return conn_ && conn_->expired; }

    // Every request, even one without a reply, is bounded by `timeout` (its write too). While
    // leases are held, the server's silence is also bounded by the heartbeat deadline, counted
    // from the request and from every byte of its reply: the request keeps the connection too
    // busy for a heartbeat, and a server that says nothing for that long has lost the leases
    // anyway, so the request fails then (and the loss is reported), not after `timeout`.
    void arm() {
        const auto now = clock::now();
        request_deadline_ = now + options_.timeout;
        if (leases_.empty()) {
            arm_deadline(request_deadline_);
            return;
        }
        arm_deadline(std::min(request_deadline_, now + heartbeat_deadline()));
        silence_bound_ = true;
    }

    void disarm() noexcept {
        silence_bound_ = false;
        if (conn_) conn_->disarm();
    }

    void begin(wire::op o) {
        req_.operation = o;
        req_.keys.clear();
        req_.values.clear();
        req_.key = {};
        req_.value = {};
        req_.expected = {};
        req_.number = 0;
        arm();
    }

    asio::awaitable<void> ensure_connected() {
        if (conn_ && conn_->socket.is_open()) co_return;
        co_await open();
    }

    // Resolves (once per open) and connects, retrying with backoff until connect_timeout; then
    // the handshake of the dialect, detecting it if asked.
    asio::awaitable<void> open() {
        drop();
        const auto deadline = clock::now() + options_.connect_timeout;
        std::error_code last;
        std::vector<asio::ip::tcp::endpoint> endpoints;
        // close() while connecting ends the call (no retries, no dialect guessed from the abort).
        const auto closes = closes_;
        const auto still_open = [&] {
            if (closes_ != closes) closed("connect");
        };
        for (int attempt = 1;; ++attempt) {
            last = co_await connect_once(endpoints, deadline);
            still_open();
            if (!last) {
                if (dialect_ == wire::dialect::legacy) co_return;
                last = co_await handshake(deadline);
                still_open();
                if (!last) {
                    dialect_ = wire::dialect::current;
                    co_return;
                }
                drop();
                if (!dialect_) {
                    // detect: a 1.13 server resets on VALIDATE (read as a SET with a huge
                    // key) or waits for more bytes; either way it is legacy.
                    dialect_ = wire::dialect::legacy;
                    last = co_await connect_once(endpoints, deadline);
                    still_open();
                    if (!last) co_return;
                    drop();
                }
            }
            const auto delay = detail::store::connect_backoff(attempt, options_.initial_backoff, options_.max_backoff,
                                                              rng_);
            if (clock::now() + delay >= deadline) {
                throw store_error(detail::format(
                    "cannot connect to the store at {} after {} attempt{} in {} ms: {}{}; is the "
                    "server (the agent, or rank 0) running and is MASTER_ADDR/MASTER_PORT right? "
                    "(store_client_options::connect_timeout)",
                    address(), attempt, attempt == 1 ? "" : "s", options_.connect_timeout.count(), last.message(),
                    options_.dialect == client_dialect::current
                        ? " (current dialect forced: a PyTorch <= 2.1 server resets the "
                          "VALIDATE handshake; use client_dialect::detect or legacy)"
                        : ""));
            }
            if (options_.on_retry) options_.on_retry({attempt, last, delay});
            asio::steady_timer t(executor_);
            t.expires_after(delay);
            co_await t.async_wait(detail::as_tuple_awaitable<Defer>);
            still_open();
        }
    }

    asio::awaitable<std::error_code> connect_once(std::vector<asio::ip::tcp::endpoint>& endpoints,
                                                  clock::time_point deadline) {
        if (endpoints.empty()) {
            std::error_code ec;
            const auto address = asio::ip::make_address(options_.host, ec);
            if (!ec) {
                endpoints.emplace_back(address, options_.port);
            } else {
                asio::ip::tcp::resolver resolver(executor_);
                const auto [rec, results] = co_await resolver.async_resolve(options_.host,
                                                                            std::to_string(options_.port),
                                                                            detail::as_tuple_awaitable<Defer>);
                if (rec) co_return rec;
                for (const auto& r : results) endpoints.push_back(r.endpoint());
            }
        }
        // The connection is held here too: close() meanwhile must not free the socket under the
        // pending connect (which touches it when it completes).
        const auto conn = conn_ = std::make_shared<detail::store::store_client_connection>(executor_);
        rbeg_ = rend_ = 0;
        arm_deadline(deadline);
        const auto [ec, ep] = co_await asio::async_connect(conn->socket, endpoints, detail::as_tuple_awaitable<Defer>);
        (void)ep;
        if (conn != conn_) co_return make_error_code(asio::error::operation_aborted);  // close() meanwhile
        const bool timed_out = expired();
        disarm();
        if (ec) {
            drop();
            co_return timed_out ? make_error_code(asio::error::timed_out) : ec;
        }
        std::error_code local_error;
        std::error_code remote_error;
        const auto local = conn_->socket.local_endpoint(local_error);
        const auto remote = conn_->socket.remote_endpoint(remote_error);
        if (!local_error && !remote_error && local == remote) {
            // Connected to itself: the kernel drew the server's port as this socket's own
            // (TCP's simultaneous open, possible when that port is in the ephemeral range and
            // nothing listens there). No server answered.
            drop();
            co_return make_error_code(asio::error::connection_refused);
        }
        std::error_code ignored;
        conn_->socket.set_option(asio::ip::tcp::no_delay(true), ignored);
        if (options_.secret) co_return co_await authenticate(deadline);
        co_return std::error_code{};
    }

    // The authentication handshake (store/auth.hpp), before any request of either dialect. A
    // refusal throws store_auth_error; a timeout is returned, to be retried like a connection.
    asio::awaitable<std::error_code> authenticate(clock::time_point deadline) {
        store_auth::client_handshake hs(*options_.secret);
        wbuf_.clear();
        hs.start(wbuf_);
        arm_deadline(deadline);
        for (;;) {
            if (!wbuf_.empty()) {
                const auto conn = conn_;  // held: see connect_once
                const auto [wec, n] = co_await asio::async_write(conn->socket, asio::buffer(wbuf_),
                                                                 detail::as_tuple_awaitable<Defer>);
                (void)n;
                wbuf_.clear();
                if (conn != conn_) co_return make_error_code(asio::error::operation_aborted);
                if (wec) co_return auth_io_failed(hs, wec);
            }
            if (hs.done()) break;
            const auto s = hs.feed(std::string_view(rbuf_.data() + rbeg_, rend_ - rbeg_), wbuf_);
            if (s.status == store_auth::status::refused) {
                disarm();
                drop();
                throw store_auth_error(
                    detail::format("the store at {} failed the authentication handshake: {}; give every agent "
                                   "and the store the same secret (store_client_options::secret, "
                                   "store_server_options::secret)",
                                   address(), s.reason));
            }
            if (s.status == store_auth::status::need_more) {
                if (const auto ec = co_await fill(s.size)) co_return auth_io_failed(hs, ec);
                continue;
            }
            rbeg_ += s.size;
        }
        disarm();
        co_return std::error_code{};
    }

    // The connection failed during the handshake. A close is the server's answer (it refused
    // the secret, or it has none and refused the handshake as an unknown request): thrown.
    // Anything else (a timeout) is returned, to be retried until connect_timeout.
    std::error_code auth_io_failed(const store_auth::client_handshake& hs, std::error_code ec) {
        const bool timed_out = expired();
        disarm();
        drop();
        if (timed_out) return make_error_code(asio::error::timed_out);
        if (ec != asio::error::eof && ec != asio::error::connection_reset && ec != asio::error::broken_pipe) return ec;
        if (hs.proof_sent())
            throw store_auth_error(
                detail::format("the store at {} refused this client's secret (it closed the connection after "
                               "the proof: {}); give the client the store's secret "
                               "(store_client_options::secret = store_server_options::secret)",
                               address(), ec.message()));
        throw store_auth_error(
            detail::format("the store at {} closed the connection during the authentication handshake ({}): it "
                           "has no secret (store_server_options::secret), or it is not an elastic store; give "
                           "the server the same secret, or the client none",
                           address(), ec.message()));
    }

    // VALIDATE then PING (nonce = pid), as current PyTorch clients do; the echo proves the
    // dialect. A reset, an EOF or no echo within the limit is returned as an error.
    asio::awaitable<std::error_code> handshake(clock::time_point deadline) {
        const auto limit = dialect_ ? deadline : std::min(deadline, clock::now() + options_.detect_timeout);
        const auto nonce = static_cast<std::uint32_t>(::getpid());
        wbuf_.clear();
        wire::put_u8(wbuf_, *wire::to_byte(wire::dialect::current, wire::op::validate));
        wire::put_u32(wbuf_, wire::validate_magic);
        wire::put_u8(wbuf_, *wire::to_byte(wire::dialect::current, wire::op::ping));
        wire::put_u32(wbuf_, nonce);
        arm_deadline(limit);
        const auto conn = conn_;  // held: see connect_once
        const auto [wec, n] = co_await asio::async_write(conn->socket, asio::buffer(wbuf_),
                                                         detail::as_tuple_awaitable<Defer>);
        (void)n;
        if (conn != conn_) co_return make_error_code(asio::error::operation_aborted);
        std::error_code ec = wec;
        if (!ec) ec = co_await fill(4);
        if (ec) {
            const bool timed_out = expired();
            disarm();
            co_return timed_out ? make_error_code(asio::error::timed_out) : ec;
        }
        disarm();
        const auto echo = wire::get_le<std::uint32_t>(rbuf_.data() + rbeg_);
        rbeg_ += 4;
        if (echo != nonce)
            throw store_error(detail::format("the store at {} answered PING {} with {}: not a "
                                             "TCPStore server, or a desynchronised stream",
                                             address(), nonce, echo));
        co_return std::error_code{};
    }

    // ---- I/O ---------------------------------------------------------------------------------
    [[noreturn]] void fail(std::string_view what, std::string_view key, std::error_code ec) {
        const bool timed_out = expired();
        const auto about = key.empty() ? std::string(what) : detail::format("{} '{}'", what, key);
        if (!conn_) closed(about);
        if (timed_out && silence_bound_ && clock::now() < request_deadline_) {
            auto message = detail::format("{}: {}", about, silent_server_message("said nothing"));
            drop(message);
            throw store_error(message);
        }
        if (timed_out) {
            auto message = detail::format("the store at {} did not answer {} within {} ms; the server is stuck or "
                                          "overloaded (store_client_options::timeout)",
                                          address(), about, options_.timeout.count());
            drop(message);
            throw store_timeout(message);
        }
        std::string message;
        if (ec == asio::error::eof || ec == asio::error::connection_reset || ec == asio::error::broken_pipe)
            message = detail::format("the store at {} closed the connection during {} ({}): the server stopped, or "
                                     "rejected the request (ADD on a non-numeric value, a write to a lease key it "
                                     "refuses, or an operation a PyTorch 1.13 server lacks: APPEND, MULTI_*)",
                                     address(), about, ec.message());
        else message = detail::format("the store at {}: {} failed: {}", address(), about, ec.message());
        drop(message);
        throw store_error(message);
    }

    asio::awaitable<void> send(std::string_view what, std::string_view key) {
        wbuf_.clear();
        wire::encode_request(*dialect_, req_, wbuf_);
        co_await flush(what, key);
    }

    asio::awaitable<void> flush(std::string_view what, std::string_view key) {
        const auto conn = conn_;  // held: see connect_once
        if (!conn || conn->expired) fail(what, key, asio::error::timed_out);
        // Part by part: while leases are held, every part the server takes moves the silence
        // deadline on (heard_from_server), so a large request on a slow link is not silence.
        for (std::size_t sent = 0; sent < wbuf_.size();) {
            const auto [ec, n] = co_await conn->socket.async_write_some(asio::buffer(wbuf_.data() + sent,
                                                                                     wbuf_.size() - sent),
                                                                        detail::as_tuple_awaitable<Defer>);
            if (conn != conn_) fail(what, key, asio::error::operation_aborted);  // close() meanwhile
            if (ec) fail(what, key, ec);
            sent += n;
            heard_from_server(*conn);
        }
    }

    // The server took or sent bytes of the running request: its silence counts from now (arm()).
    void heard_from_server(detail::store::store_client_connection& conn) {
        if (silence_bound_) conn.arm_deadline(std::min(request_deadline_, clock::now() + heartbeat_deadline()));
    }

    // close() ended the request `about` (conn_ dropped while it was suspended).
    [[noreturn]] void closed(std::string_view about) const {
        throw store_error(detail::format("the store at {}: {} ended: this client was closed (close() was called during "
                                         "the request)",
                                         address(), about));
    }

    // Makes n bytes available at rbuf_[rbeg_, ...). An error code, not an exception, so WAIT
    // can tell its timeout from a failure.
    asio::awaitable<std::error_code> fill(std::size_t n) {
        while (rend_ - rbeg_ < n) {
            if (rbeg_ > 0 && rbeg_ == rend_) rbeg_ = rend_ = 0;
            if (rbuf_.size() - rbeg_ < n) {
                if (rbeg_ > 0) {
                    std::memmove(rbuf_.data(), rbuf_.data() + rbeg_, rend_ - rbeg_);
                    rend_ -= rbeg_;
                    rbeg_ = 0;
                }
                if (rbuf_.size() < n) rbuf_.resize(std::max(n, rbuf_.size() * 2));
            }
            if (rbuf_.size() - rend_ < 4096 && rbuf_.size() < 64 * 1024) rbuf_.resize(64 * 1024);
            const auto conn = conn_;  // held: see connect_once
            if (!conn) co_return make_error_code(asio::error::operation_aborted);
            if (conn->expired) co_return make_error_code(asio::error::timed_out);
            const auto [ec, got] = co_await conn->socket.async_read_some(asio::buffer(rbuf_.data() + rend_,
                                                                                      rbuf_.size() - rend_),
                                                                         detail::as_tuple_awaitable<Defer>);
            // close() while the read was suspended: the buffer was reset with the connection.
            if (conn != conn_) co_return make_error_code(asio::error::operation_aborted);
            rend_ += got;
            if (ec && rend_ - rbeg_ < n) co_return ec;
            if (got > 0) heard_from_server(*conn);
        }
        co_return std::error_code{};
    }

    asio::awaitable<std::uint64_t> read_u64(std::string_view what, std::string_view key) {
        if (const auto ec = co_await fill(8)) fail(what, key, ec);
        const auto v = wire::get_le<std::uint64_t>(rbuf_.data() + rbeg_);
        rbeg_ += 8;
        co_return v;
    }

    asio::awaitable<std::int64_t> read_i64(std::string_view what, std::string_view key) {
        co_return static_cast<std::int64_t>(co_await read_u64(what, key));
    }

    asio::awaitable<std::uint8_t> read_u8(std::string_view what, std::string_view key) {
        if (const auto ec = co_await fill(1)) fail(what, key, ec);
        const auto v = static_cast<std::uint8_t>(rbuf_[rbeg_]);
        ++rbeg_;
        co_return v;
    }

    asio::awaitable<std::string> read_bytes(std::string_view what, std::string_view key) {
        const auto len = co_await read_u64(what, key);
        if (len > max_reply_value) throw_protocol(what, key, detail::format("a value of {} bytes", len));
        const auto n = static_cast<std::size_t>(len);
        if (const auto ec = co_await fill(n)) fail(what, key, ec);
        std::string v(rbuf_.data() + rbeg_, n);
        rbeg_ += n;
        co_return v;
    }

    [[noreturn]] void throw_protocol(std::string_view what, std::string_view key, std::string_view got) {
        auto message = detail::format("the store at {} answered {} '{}' with {}: not a TCPStore "
                                      "server of the expected dialect, or a desynchronised stream",
                                      address(), what, key, got);
        drop(message);
        throw store_error(message);
    }

    // WAIT with its own deadline. On timeout the current dialect sends CANCEL_WAIT and reads
    // WAIT_CANCELED (after a STOP_WAITING that raced it, if any: the keys were written before the
    // cancel arrived, so the server's 0x00 comes first); the legacy dialect drops the connection,
    // which is the only way to clear a wait on a 1.13 server.
    //
    // While the client holds leases, a long WAIT must not silence the connection: every
    // heartbeat interval it also sends an empty CHECK. Its reply (READY, 0x00) is the same byte
    // as STOP_WAITING, and the server answers in order, so the wait is over when the zeros read
    // number the CHECKs sent plus one. CHECK number i (from 1) is surely unanswered while fewer
    // than i zeros have come; one that stays so past the heartbeat deadline means a silent
    // server, as for an idle heartbeat.
    asio::awaitable<void> wait_locked(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                                      std::string_view what) {
        co_await ensure_connected();
        req_.operation = wire::op::wait;
        req_.keys.clear();
        for (const auto& k : keys) req_.keys.emplace_back(k);
        wbuf_.clear();
        wire::encode_request(*dialect_, req_, wbuf_);
        const auto wait_deadline = clock::now() + timeout;
        const auto interval = options_.lease_heartbeat_interval;
        std::vector<clock::time_point> checks_sent;  // send times of the CHECKs
        std::size_t zeros = 0;                       // STOP_WAITING and READY bytes read
        auto next_beat = clock::now() + interval;
        const auto stop = static_cast<std::uint8_t>(wire::wait_response::stop_waiting);
        const auto next_deadline = [&] {
            auto d = wait_deadline;
            if (!leases_.empty()) d = std::min(d, next_beat);
            if (checks_sent.size() > zeros) d = std::min(d, checks_sent[zeros] + heartbeat_deadline());
            return d;
        };
        // A heartbeat's send time is a schedule, not a deadline to forgive: after a stall it
        // is sent at once, never a span later.
        const auto arm_next = [&] {
            const auto d = next_deadline();
            arm_deadline(d, leases_.empty() || d != next_beat);
        };
        arm_next();
        co_await flush(std::string_view("WAIT"), first_of(keys));
        for (;;) {
            const auto ec = co_await fill(1);
            if (!ec) {
                const auto byte = static_cast<std::uint8_t>(rbuf_[rbeg_++]);
                if (byte != stop) throw_protocol("WAIT", first_of(keys), detail::format("byte {}", byte));
                if (++zeros == checks_sent.size() + 1) {
                    disarm();
                    co_return;
                }
                continue;
            }
            if (!expired()) fail("WAIT", first_of(keys), ec);
            const auto now = clock::now();
            // An overdue CHECK first: a server silent past the heartbeat deadline is not asked
            // for a CANCEL_WAIT it would leave unanswered for another deadline.
            if (checks_sent.size() > zeros && now >= checks_sent[zeros] + heartbeat_deadline()) {
                auto message = silent_server_message();
                drop(message);
                throw store_error(detail::format("{} of {}: {}", what, describe_keys(keys), message));
            }
            if (now >= wait_deadline) break;
            if (!leases_.empty() && now >= next_beat) {
                wbuf_.clear();
                wire::put_u8(wbuf_, *wire::to_byte(*dialect_, wire::op::check));
                wire::put_u64(wbuf_, 0);
                checks_sent.push_back(now);
                next_beat = now + interval;
                arm_next();
                co_await flush(std::string_view("CHECK (heartbeat)"), first_of(keys));
                continue;
            }
            arm_next();
        }
        const auto message = detail::format(
            "{} on the store at {}: {} not set within {} ms (a rank or agent that should set "
            "{} has not; store_client_options::timeout or the wait's timeout)",
            what, address(), describe_keys(keys), timeout.count(), keys.size() == 1 ? "it" : "them");
        if (*dialect_ == wire::dialect::legacy) {
            drop(message);
            throw store_timeout(message);
        }
        // The deadline cancelled only our read: the WAIT is still registered on the server.
        // Before WAIT_CANCELED come the replies still owed: the CHECKs' and maybe a
        // STOP_WAITING that raced the cancel.
        req_.operation = wire::op::cancel_wait;
        wbuf_.clear();
        wire::encode_request(*dialect_, req_, wbuf_);
        arm();
        co_await flush(std::string_view("CANCEL_WAIT"), first_of(keys));
        auto byte = co_await read_u8(std::string_view("CANCEL_WAIT"), first_of(keys));
        while (byte == stop && zeros < checks_sent.size() + 1) {
            ++zeros;
            arm();
            byte = co_await read_u8(std::string_view("CANCEL_WAIT"), first_of(keys));
        }
        if (byte != static_cast<std::uint8_t>(wire::wait_response::wait_canceled))
            throw_protocol("CANCEL_WAIT", first_of(keys), detail::format("byte {}", byte));
        throw store_timeout(message);
    }

    static std::string describe_keys(const std::vector<std::string>& keys) {
        std::string out = keys.size() == 1 ? "key " : "keys ";
        for (std::size_t i = 0; i < keys.size() && i < 8; ++i) {
            if (i) out += ", ";
            out += detail::format("'{}'", keys[i]);
        }
        if (keys.size() > 8) out += detail::format(" and {} more", keys.size() - 8);
        return out;
    }

    static constexpr std::uint64_t max_reply_value = std::uint64_t{1} << 34;  // 16 GiB: sanity

    asio::any_io_executor executor_;
    store_client_options options_;
    std::optional<wire::dialect> dialect_;
    std::shared_ptr<detail::store::store_client_connection> conn_;
    std::uint64_t closes_ = 0;  // close() calls: one while connecting ends the connect (open())
    std::minstd_rand rng_;
    wire::request req_;
    std::string wbuf_;
    std::vector<char> rbuf_;
    std::size_t rbeg_ = 0;
    std::size_t rend_ = 0;
    clock::time_point request_deadline_{};  // the running request's `timeout` (arm())
    bool silence_bound_ = false;            // its deadline is also the server's silence (arm())
    detail::async_mutex lock_;              // one request at a time (acquire())
    // Leases: the keys held on conn_ and the latched loss for connection_lost(); the heartbeat.
    detail::store::store_client_leases leases_;
    std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
    asio::steady_timer heartbeat_timer_;
    bool heartbeat_running_ = false;
};
using tcp_store_client = basic_tcp_store_client<>;

static_assert(store<tcp_store_client>);
static_assert(multi_key_store<tcp_store_client>);

}  // namespace elastic::inline v0
