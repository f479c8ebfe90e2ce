// tcp_store_server: PyTorch's TCPStore server protocol, both dialects per connection, one
// coroutine per connection on one io_context, waits answered by push, leases bound to
// connections.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/store/auth.hpp"
#include "elastic/store/engine.hpp"
#include "elastic/store/errors.hpp"
#include "elastic/store/lease.hpp"
#include "elastic/store/wire.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/ip/v6_only.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

namespace elastic::inline v0 {

/// Where the server's log lines go (one line per call, no trailing newline). The agent may
/// replace it; the default prints "elastic-store: <line>" to stderr.
using store_log = std::function<void(std::string_view line)>;

/// How a tcp_store_server listens and what it accepts (limits are documented in docs/store.md).
struct store_server_options {
    /// Address to bind: an IPv4/IPv6 literal or a host name; "::" listens dual-stack.
    std::string host = "0.0.0.0";
    /// Port to bind; 0 picks a free one (read it back with port()).
    std::uint16_t port = 0;
    /// Per-request limits; a request beyond one closes only its connection.
    wire::limits limits{};
    /// Connections served at once; one more is accepted, logged and closed at once.
    std::size_t max_connections = 16384;
    /// WAITs pending on one connection (a 1.13 client that times out leaves one behind each time).
    std::size_t max_waits_per_connection = 4096;
    /// Replies buffered before the server stops reading that connection's requests and writes.
    std::size_t max_pending_output = 4 * 1024 * 1024;
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
    /// Authentication (docs/store.md, "Authentication"): with a secret, a connection must
    /// complete the handshake (store/auth.hpp) before any request, within `auth_timeout`, or it
    /// is closed and logged; nothing it sends reaches the key table. Without one (PyTorch's
    /// clients cannot authenticate) every connection is served as it comes. Not empty.
    std::optional<std::string> secret;
    std::chrono::milliseconds auth_timeout{std::chrono::seconds(10)};
};

namespace detail {

class store_connection;

// State shared by the server object and its connections, so a connection that finishes after
// the server object is gone still finds its engine.
struct store_server_core {
    store_server_core(const asio::any_io_executor& ex, store_server_options opts)
        : executor(ex), acceptor(ex), resume_accept(ex), options(std::move(opts)) {}

    void log(std::string_view line) const {
        if (options.log)
            options.log(line);
        else
            fmt::print(stderr, "elastic-store: {}\n", line);
    }

    // How long a leasing connection may stay silent.
    std::chrono::steady_clock::duration lease_timeout() const {
        return options.lease_heartbeat_interval * options.lease_missed_heartbeats;
    }

    // A lease ends without its holder: delete the key, count the loss in the group's epoch and
    // name the lost lease under __lost/<epoch>, whose creation wakes the observers by push.
    void record_lease_loss(std::string_view key, std::string_view holder, std::string_view why) {
        const auto parts = parse_lease_key(key);
        if (!parts) return;
        engine.erase(key);
        const std::string space(parts->space);
        std::int64_t epoch = 0;
        try {
            epoch = engine.add(space + "__epoch", 1);
        } catch (const store_error& e) {
            // Only an in-process writer (memory_store over engine()) can have spoiled it.
            log(fmt::format("lease '{}' of {} lost ({}), but its epoch cannot count it: {}",
                            store_engine::printable(key), holder, why, e.what()));
            return;
        }
        ++leases_lost;
        engine.set(fmt::format("{}__lost/{}", space, epoch), parts->name);
        log(fmt::format("lease '{}' of {} lost: {}; {}__epoch is now {}",
                        store_engine::printable(key), holder, why,
                        store_engine::printable(space), epoch));
    }

    asio::any_io_executor executor;
    asio::ip::tcp::acceptor acceptor;
    asio::steady_timer resume_accept;  // cancelled when a connection closes (after EMFILE)
    store_server_options options;
    store_engine engine;
    std::unordered_set<store_connection*> connections;
    // Which connection holds each lease key (wire key -> holder).
    std::unordered_map<std::string, store_connection*, store_string_hash, std::equal_to<>>
        lease_holders;
    std::uint64_t leases_lost = 0;
    bool stopped = false;
};

inline std::string format_peer(const asio::ip::tcp::socket& s) {
    std::error_code ec;
    const auto ep = s.remote_endpoint(ec);
    if (ec) return "unknown peer";
    if (ep.address().is_v6()) return fmt::format("[{}]:{}", ep.address().to_string(), ep.port());
    return fmt::format("{}:{}", ep.address().to_string(), ep.port());
}

// One client connection: reads requests, runs them on the engine, writes replies in order. A
// WAIT whose keys are missing is answered later by on_ready, which queues STOP_WAITING in the
// same output stream and cancels `wake_` so the coroutine flushes it.
class store_connection : public std::enable_shared_from_this<store_connection> {
public:
    store_connection(std::shared_ptr<store_server_core> core, asio::ip::tcp::socket socket)
        : core_(std::move(core)), socket_(std::move(socket)), wake_(socket_.get_executor()),
          lease_timer_(socket_.get_executor()), peer_(format_peer(socket_)), watcher_(*this),
          auth_timer_(socket_.get_executor()) {
        wake_.expires_at(asio::steady_timer::time_point::max());
        if (core_->options.secret)
            auth_ = std::make_unique<store_auth::server_handshake>(*core_->options.secret);
    }

    store_connection(const store_connection&) = delete;
    store_connection& operator=(const store_connection&) = delete;

    ~store_connection() { delete[] buf_; }

    static asio::awaitable<void> serve(std::shared_ptr<store_connection> self) {
        if (self->auth_) self->arm_auth_timer();
        co_await self->loop();
        self->finish();
    }

    void close() noexcept {
        std::error_code ignored;
        socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
        socket_.close(ignored);
        wake_.cancel();
        lease_timer_.cancel();
        auth_timer_.cancel();
    }

    // Another connection took over `key` (the holder reconnected before this one was closed):
    // it is no longer this connection's to lose.
    void forget_lease(std::string_view key) noexcept { std::erase(leases_, key); }

    const std::string& peer() const noexcept { return peer_; }

private:
    using clock = std::chrono::steady_clock;

    // A pending WAIT of this connection.
    struct pending_wait final : store_waiter {
        explicit pending_wait(store_connection& c) : conn(c) {}
        void on_ready() override { conn.wait_ready(self); }
        store_connection& conn;
        std::list<pending_wait>::iterator self;
    };

    // WATCH_KEY registrations (legacy dialect): every change is pushed as a notification.
    struct key_watcher final : store_watcher {
        explicit key_watcher(store_connection& c) : conn(c) {}
        void on_change(store_change change, std::string_view key, std::string_view old_value,
                       std::string_view new_value) override {
            wire::put_u8(conn.out_, static_cast<std::uint8_t>(change));
            wire::put_bytes(conn.out_, key);
            wire::put_bytes(conn.out_, old_value);
            wire::put_bytes(conn.out_, new_value);
            conn.wake_.cancel();
        }
        store_connection& conn;
    };

    void wait_ready(std::list<pending_wait>::iterator it) {
        wire::put_u8(out_, static_cast<std::uint8_t>(wire::wait_response::stop_waiting));
        waits_.erase(it);
        wake_.cancel();
    }

    asio::awaitable<void> loop() {
        using namespace asio::experimental::awaitable_operators;
        constexpr auto tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);
        for (;;) {
            // After a malformed request the replies to the requests before it still go out.
            const bool ok = process();
            if (!out_.empty()) {
                wbuf_.swap(out_);
                const auto [ec, n] =
                    co_await asio::async_write(socket_, asio::buffer(wbuf_), tuple_awaitable);
                (void)n;
                wbuf_.clear();
                if (ec) co_return;
                if (ok) continue;
            }
            if (!ok) co_return;
            if (!waits_.empty() || watching_) {
                // A reply may be pushed while we wait for input: wait for readiness (cancelling
                // a readiness wait loses no bytes) or for wake_, whichever comes first.
                const auto which = co_await (
                    socket_.async_wait(asio::ip::tcp::socket::wait_read, tuple_awaitable) ||
                    wake_.async_wait(tuple_awaitable));
                if (which.index() == 1) {
                    if (!socket_.is_open()) co_return;
                    continue;
                }
                if (std::get<0>(std::get<0>(which))) co_return;
            }
            reserve();
            const auto [ec, n] = co_await socket_.async_read_some(
                asio::buffer(buf_ + end_, cap_ - end_), tuple_awaitable);
            if (ec) co_return;  // EOF, reset or stop(): the client is gone
            end_ += n;
            if (!leases_.empty()) last_heard_ = clock::now();  // the only per-read lease cost
        }
    }

    // Makes room for the next read: at least what the pending request needs, at least 4 KiB.
    void reserve() {
        const std::size_t have = end_ - begin_;
        const std::size_t want = std::max<std::size_t>(needed_ > have ? needed_ - have : 0, 4096);
        if (cap_ - end_ >= want) return;
        if (begin_ > 0) {
            std::memmove(buf_, buf_ + begin_, have);
            begin_ = 0;
            end_ = have;
            if (cap_ - end_ >= want) return;
        }
        const std::size_t cap = std::max(cap_ * 2, have + want);
        char* bigger = new char[cap];
        if (have) std::memcpy(bigger, buf_, have);
        delete[] buf_;
        buf_ = bigger;
        cap_ = cap;
    }

    // Runs every complete request in the buffer; false closes the connection.
    bool process() {
        while (out_.size() < core_->options.max_pending_output) {
            const std::string_view data(buf_ + begin_, end_ - begin_);
            if (data.empty() || data.size() < needed_) break;
            if (auth_) {  // the handshake comes before anything else
                const auto s = auth_->feed(data, out_);
                if (s.status == store_auth::status::refused) return refuse(s.reason);
                if (s.status == store_auth::status::need_more) {
                    needed_ = s.size;
                    break;
                }
                begin_ += s.size;
                needed_ = 0;
                if (auth_->done()) {
                    auth_.reset();
                    auth_timer_.cancel();
                }
                continue;
            }
            if (!dialect_) {
                const auto d = wire::detect_dialect(data);
                if (d == wire::detection::need_more) {
                    needed_ = data.size() + 1;
                    break;
                }
                dialect_ = d == wire::detection::current ? wire::dialect::current
                                                         : wire::dialect::legacy;
            }
            auto r = wire::parse_request(*dialect_, data, req_, core_->options.limits);
            if (r.status == wire::parse_status::need_more) {
                needed_ = r.size;
                break;
            }
            if (r.status == wire::parse_status::malformed) return fail(r.reason);
            needed_ = 0;
            if (!execute()) return false;
            begin_ += r.size;
            if (core_->options.on_request) core_->options.on_request(req_.operation);
        }
        if (begin_ == end_) {
            begin_ = end_ = 0;
            // A huge request grew the buffer: give the memory back once it is consumed.
            if (cap_ > 1024 * 1024) {
                delete[] buf_;
                buf_ = nullptr;
                cap_ = 0;
            }
        }
        return true;
    }

    bool fail(std::string_view reason) {
        core_->log(fmt::format("closing connection from {} ({} dialect): {}", peer_,
                               dialect_ == wire::dialect::current ? "current" : "legacy", reason));
        if (close_reason_.empty()) close_reason_ = fmt::format("the server closed it: {}", reason);
        return false;
    }

    // ---- authentication ----------------------------------------------------------------------

    bool refuse(std::string_view reason) {
        core_->log(fmt::format("closing connection from {}: authentication failed: {}", peer_,
                               reason));
        auth_.reset();  // said once
        return false;
    }

    // A connection that has not authenticated within auth_timeout is closed: a half handshake
    // must not hold a connection slot for ever.
    void arm_auth_timer() {
        auth_timer_.expires_after(core_->options.auth_timeout);
        auth_timer_.async_wait(
            [weak = weak_from_this()](const std::error_code& ec) {
                const auto self = weak.lock();
                if (ec || !self || !self->auth_) return;
                self->core_->log(fmt::format(
                    "closing connection from {}: authentication failed: no complete handshake "
                    "within {} ms (store_server_options::auth_timeout)",
                    self->peer_, self->core_->options.auth_timeout.count()));
                self->auth_.reset();
                self->close();
            });
    }

    // ---- leases ------------------------------------------------------------------------------

    // Why a write to a lease key is refused, or empty when it is allowed. `binds`: SET,
    // MULTI_SET and COMPARE_SET bind a lease; ADD and APPEND cannot (a lease's value is the
    // holder's, set whole); nobody writes the server's own names (__epoch, __lost/<n>).
    static std::string lease_refusal(wire::op o, std::string_view key, bool binds) {
        const auto parts = parse_lease_key(key);
        if (!parts) return {};
        if (parts->reserved())
            return fmt::format("malformed lease request: {} of '{}', a name the server keeps "
                               "(names after '{}' starting with '__' are read-only; "
                               "docs/store.md, Leases)",
                               wire::name(o), store_engine::printable(key), lease_marker);
        if (parts->name.empty())
            return fmt::format("malformed lease request: {} of '{}' names no lease (a lease key "
                               "is <group>/{}<name>, name not empty)",
                               wire::name(o), store_engine::printable(key), lease_marker);
        if (!binds)
            return fmt::format("malformed lease request: {} of lease key '{}' (a lease is bound "
                               "by SET, MULTI_SET or COMPARE_SET and released by DELETE_KEY)",
                               wire::name(o), store_engine::printable(key));
        return {};
    }

    // The key now belongs to this connection (the write has been done).
    void bind_lease(std::string_view key) {
        auto& holders = core_->lease_holders;
        auto it = holders.find(key);
        if (it == holders.end()) {
            it = holders.emplace(std::string(key), this).first;
        } else if (it->second == this) {
            return;
        } else {
            core_->log(fmt::format("lease '{}' moves from {} to {}", store_engine::printable(key),
                                   it->second->peer(), peer_));
            it->second->forget_lease(key);
            it->second = this;
        }
        leases_.emplace_back(key);
        const auto epoch = std::string(parse_lease_key(key)->space) + "__epoch";
        if (!core_->engine.find(epoch)) core_->engine.set(epoch, std::string_view("0"));
        last_heard_ = clock::now();
        if (!lease_timer_armed_) arm_lease_timer(last_heard_ + core_->lease_timeout());
    }

    // DELETE_KEY of a lease key: the lease ends without a loss (its holder, or someone on its
    // behalf, released it).
    void release_lease(std::string_view key) {
        auto& holders = core_->lease_holders;
        const auto it = holders.find(key);
        if (it == holders.end()) return;
        it->second->forget_lease(key);
        holders.erase(it);
    }

    // One timer per leasing connection. It is not moved by each request (that would cost a
    // cancel per request); it fires at the deadline computed from the last read, and then
    // either re-arms for the remaining time or ends the connection.
    void arm_lease_timer(clock::time_point at) {
        lease_timer_armed_ = true;
        lease_timer_.expires_at(at);
        lease_timer_.async_wait(
            [weak = weak_from_this()](const std::error_code& ec) {
                const auto self = weak.lock();
                if (!self) return;
                self->lease_timer_armed_ = false;
                if (!ec) self->lease_timer_fired();
            });
    }

    void lease_timer_fired() {
        if (leases_.empty() || !socket_.is_open()) return;
        const auto now = clock::now();
        const auto deadline = last_heard_ + core_->lease_timeout();
        if (now < deadline) {
            arm_lease_timer(deadline);
            return;
        }
        const auto silent =
            std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard_);
        close_reason_ = fmt::format(
            "silent for {} ms ({} missed heartbeats of {} ms; "
            "store_server_options::lease_heartbeat_interval, lease_missed_heartbeats)",
            silent.count(), core_->options.lease_missed_heartbeats,
            core_->options.lease_heartbeat_interval.count());
        core_->log(fmt::format("closing connection from {}: {}", peer_, close_reason_));
        close();
    }

    bool execute() {
        using wire::op;
        auto& engine = core_->engine;
        auto& r = req_;
        switch (r.operation) {
            case op::validate:
                if (r.nonce != wire::validate_magic)
                    return fail(fmt::format("VALIDATE with magic 0x{:08x}, expected 0x{:08x}",
                                            r.nonce, wire::validate_magic));
                return true;
            case op::ping:
                wire::put_u32(out_, r.nonce);
                return true;
            case op::set:
                if (auto why = lease_refusal(r.operation, r.key, true); !why.empty())
                    return fail(why);
                engine.set(r.key, r.value);
                if (parse_lease_key(r.key)) bind_lease(r.key);
                return true;
            case op::compare_set: {
                if (auto why = lease_refusal(r.operation, r.key, true); !why.empty())
                    return fail(why);
                // Whether this CAS writes (PyTorch's rules), known before it runs: a lease is
                // bound only by the CAS that wins.
                const auto* before = engine.find(r.key);
                const bool writes = before ? *before == r.expected : r.expected.empty();
                wire::put_bytes(out_, engine.compare_set(r.key, r.expected, r.value));
                if (writes && parse_lease_key(r.key)) bind_lease(r.key);
                return true;
            }
            case op::get: {
                // Missing: an empty value, like the libuv server (clients WAIT first anyway).
                const auto* v = engine.find(r.key);
                wire::put_bytes(out_, v ? std::string_view(*v) : std::string_view{});
                return true;
            }
            case op::add:
                if (auto why = lease_refusal(r.operation, r.key, false); !why.empty())
                    return fail(why);
                try {
                    wire::put_i64(out_, engine.add(r.key, r.number));
                } catch (const store_error& e) {
                    return fail(e.what());
                }
                return true;
            case op::check:
                wire::put_u8(out_, static_cast<std::uint8_t>(
                                       engine.check(r.keys) ? wire::check_response::ready
                                                            : wire::check_response::not_ready));
                return true;
            case op::wait: {
                if (waits_.size() >= core_->options.max_waits_per_connection)
                    return fail(fmt::format("{} WAITs pending on one connection reach the limit "
                                            "(store_server_options::max_waits_per_connection)",
                                            waits_.size()));
                auto& w = waits_.emplace_back(*this);
                w.self = std::prev(waits_.end());
                if (engine.wait(w, r.keys)) {
                    waits_.pop_back();
                    wire::put_u8(out_,
                                 static_cast<std::uint8_t>(wire::wait_response::stop_waiting));
                }
                return true;
            }
            case op::num_keys:
                wire::put_i64(out_, static_cast<std::int64_t>(engine.size()));
                return true;
            case op::watch_key:
                engine.watch(watcher_, r.key);
                watching_ = true;
                wire::put_u8(out_, static_cast<std::uint8_t>(
                                       wire::watch_response::key_callback_registered));
                return true;
            case op::delete_key:
                if (const auto parts = parse_lease_key(r.key)) {
                    if (parts->reserved() || parts->name.empty())
                        return fail(lease_refusal(r.operation, r.key, true));
                    release_lease(r.key);
                }
                wire::put_i64(out_, engine.erase(r.key) ? 1 : 0);
                return true;
            case op::append:
                if (auto why = lease_refusal(r.operation, r.key, false); !why.empty())
                    return fail(why);
                engine.append(r.key, r.value);
                return true;
            case op::multi_get:
                for (const auto k : r.keys) {
                    const auto* v = engine.find(k);
                    wire::put_bytes(out_, v ? std::string_view(*v) : std::string_view{});
                }
                return true;
            case op::multi_set:
                // All or nothing: a refused lease key refuses the whole request.
                for (const auto k : r.keys)
                    if (auto why = lease_refusal(r.operation, k, true); !why.empty())
                        return fail(why);
                for (std::size_t i = 0; i < r.keys.size(); ++i) {
                    engine.set(r.keys[i], r.values[i]);
                    if (parse_lease_key(r.keys[i])) bind_lease(r.keys[i]);
                }
                return true;
            case op::cancel_wait:
                // Any STOP_WAITING already queued stays in front of this reply: a client that
                // raced reads 0x00 then 0x01, as PyTorch's client expects (wire §1.4).
                cancel_waits();
                wire::put_u8(out_, static_cast<std::uint8_t>(wire::wait_response::wait_canceled));
                return true;
            case op::list_keys:
                wire::put_i64(out_, static_cast<std::int64_t>(engine.size()));
                engine.for_each(
                    [&](std::string_view k, std::string_view) { wire::put_bytes(out_, k); });
                return true;
            case op::queue_push:
            case op::queue_pop:
            case op::queue_len:
            case op::barrier:
                return fail(fmt::format("{} is not supported by this server (docs/store.md)",
                                        wire::name(r.operation)));
        }
        return fail("unreachable opcode");
    }

    void cancel_waits() noexcept {
        for (auto& w : waits_) core_->engine.cancel(w);
        waits_.clear();
    }

    // The coroutine has ended: forget every registration, lose the leases (unless the whole
    // server is stopping) and leave the server's set.
    void finish() noexcept {
        if (auth_ && auth_->challenged() && !core_->stopped) {
            try {
                core_->log(fmt::format("connection from {} closed during the authentication "
                                       "handshake, after this server's challenge: the client "
                                       "did not accept this server's proof (it has another "
                                       "secret) or left",
                                       peer_));
            } catch (...) {
                // Out of memory for a log line: the connection ends either way.
            }
        }
        cancel_waits();
        if (watching_) core_->engine.unwatch(watcher_);
        watching_ = false;
        close();
        lose_leases();
        core_->connections.erase(this);
        core_->resume_accept.cancel();
    }

    void lose_leases() noexcept {
        auto leases = std::move(leases_);
        leases_.clear();
        if (leases.empty()) return;
        const std::string why = !close_reason_.empty() ? close_reason_
                                : core_->stopped       ? std::string("the server stopped")
                                                       : std::string("the connection closed");
        for (const auto& key : leases) {
            core_->lease_holders.erase(key);
            if (core_->stopped) continue;  // the store goes away with its keys: nobody to tell
            try {
                core_->record_lease_loss(key, peer_, why);
            } catch (...) {
                // Out of memory while writing the loss: the key is gone either way.
            }
        }
    }

    std::shared_ptr<store_server_core> core_;
    asio::ip::tcp::socket socket_;
    asio::steady_timer wake_;
    asio::steady_timer lease_timer_;
    std::string peer_;
    std::optional<wire::dialect> dialect_;
    wire::request req_;
    char* buf_ = nullptr;  // [begin_, end_) unconsumed input; no zero-fill on growth
    std::size_t cap_ = 0;
    std::size_t begin_ = 0;
    std::size_t end_ = 0;
    std::size_t needed_ = 0;  // bytes of input the pending request needs at least
    std::string out_;         // replies not yet written, in order
    std::string wbuf_;        // the bytes of the write in flight
    std::list<pending_wait> waits_;
    key_watcher watcher_;
    bool watching_ = false;
    std::vector<std::string> leases_;  // lease keys this connection holds
    clock::time_point last_heard_{};   // last read, kept only while leases_ is not empty
    bool lease_timer_armed_ = false;
    std::string close_reason_;  // why the server ended the connection, for the lease log
    std::unique_ptr<store_auth::server_handshake> auth_;  // until authenticated (with a secret)
    asio::steady_timer auth_timer_;
};

}  // namespace detail

/// PyTorch's TCPStore server. Both wire dialects are served side by side, chosen per connection
/// from its first bytes, over one key table. Bind in the constructor; serve with `start()` (or
/// `co_await run()`); stop with `stop()`, the destructor, or by cancelling `run()`. Use it on one
/// thread (run the io_context on one thread).
class tcp_store_server {
public:
    /// Binds and listens on `options.host`:`options.port`; throws store_error when it cannot.
    explicit tcp_store_server(const asio::any_io_executor& executor,
                              store_server_options options = {})
        : core_(std::make_shared<detail::store_server_core>(executor, std::move(options))) {
        auto& o = core_->options;
        auto& acc = core_->acceptor;
        if (o.lease_heartbeat_interval.count() <= 0 || o.lease_missed_heartbeats == 0)
            throw store_error(fmt::format(
                "store_server_options: lease_heartbeat_interval {} ms and "
                "lease_missed_heartbeats {} must both be positive",
                o.lease_heartbeat_interval.count(), o.lease_missed_heartbeats));
        if (o.secret && o.secret->empty())
            throw store_error("store_server_options::secret is empty: give the job's secret, or "
                              "no secret (std::nullopt) for a store without authentication");
        if (o.secret && o.auth_timeout.count() <= 0)
            throw store_error(fmt::format("store_server_options::auth_timeout {} ms must be "
                                          "positive", o.auth_timeout.count()));
        try {
            asio::ip::tcp::endpoint ep;
            std::error_code ec;
            const auto address = asio::ip::make_address(o.host, ec);
            if (!ec) {
                ep = {address, o.port};
            } else {
                asio::ip::tcp::resolver resolver(executor);
                const auto results = resolver.resolve(o.host, std::to_string(o.port),
                                                      asio::ip::resolver_base::passive);
                ep = results.begin()->endpoint();
            }
            acc.open(ep.protocol());
            acc.set_option(asio::socket_base::reuse_address(true));
            if (ep.address().is_v6()) acc.set_option(asio::ip::v6_only(false));
            acc.bind(ep);
            acc.listen(asio::socket_base::max_listen_connections);
        } catch (const std::system_error& e) {
            throw store_error(fmt::format("cannot listen on {}:{}: {}; choose another port (0 "
                                          "picks a free one) or address",
                                          o.host, o.port, e.code().message()));
        }
    }

    tcp_store_server(const tcp_store_server&) = delete;
    tcp_store_server& operator=(const tcp_store_server&) = delete;

    ~tcp_store_server() { stop(); }

    /// The bound address and port.
    asio::ip::tcp::endpoint local_endpoint() const { return core_->acceptor.local_endpoint(); }
    /// The bound port (the chosen one when options.port was 0).
    std::uint16_t port() const { return local_endpoint().port(); }

    /// Serves in the background on the executor (the agent's usual way).
    void start() { asio::co_spawn(core_->executor, serve(core_), asio::detached); }

    /// Accepts and serves until stop() or until the awaiting coroutine is cancelled (which also
    /// stops the server). The coroutine owns the server's shared state, not `this`, so it may
    /// outlive the server object.
    asio::awaitable<void> run() { return serve(core_); }

    /// Stops accepting and closes every connection (their waits are dropped).
    void stop() noexcept { stop(*core_); }

    /// The key table the connections share (for an embedding agent and for tests).
    detail::store_engine& engine() noexcept { return core_->engine; }

    /// The number of open connections.
    std::size_t connections() const noexcept { return core_->connections.size(); }

    /// The number of leases held now, and lost since the start (docs/store.md, "Leases").
    std::size_t leases() const noexcept { return core_->lease_holders.size(); }
    std::uint64_t leases_lost() const noexcept { return core_->leases_lost; }

private:
    static void stop(detail::store_server_core& core) noexcept {
        if (core.stopped) return;
        core.stopped = true;
        std::error_code ignored;
        core.acceptor.close(ignored);
        core.resume_accept.cancel();
        for (auto* c : core.connections) c->close();
    }

    static asio::awaitable<void> serve(std::shared_ptr<detail::store_server_core> core) {
        constexpr auto tuple_awaitable = asio::experimental::as_tuple(asio::use_awaitable);
        while (!core->stopped) {
            auto [ec, socket] = co_await core->acceptor.async_accept(tuple_awaitable);
            if (ec == asio::error::operation_aborted || core->stopped) break;
            if (ec == asio::error::no_descriptors ||
                ec == std::errc::too_many_files_open_in_system) {
                // Out of descriptors: accept again once a connection closes (it cancels the
                // timer), not in a retry loop.
                core->log(fmt::format("cannot accept: {}; waiting until a connection closes",
                                      ec.message()));
                core->resume_accept.expires_at(asio::steady_timer::time_point::max());
                co_await core->resume_accept.async_wait(tuple_awaitable);
                continue;
            }
            if (ec) {
                core->log(fmt::format("accept failed: {}", ec.message()));
                continue;
            }
            std::error_code ignored;
            socket.set_option(asio::ip::tcp::no_delay(true), ignored);
            if (core->connections.size() >= core->options.max_connections) {
                core->log(fmt::format("refusing connection from {}: {} connections reach the "
                                      "limit (store_server_options::max_connections)",
                                      detail::format_peer(socket), core->connections.size()));
                socket.close(ignored);
                continue;
            }
            auto conn = std::make_shared<detail::store_connection>(core, std::move(socket));
            core->connections.insert(conn.get());
            asio::co_spawn(core->executor, detail::store_connection::serve(std::move(conn)),
                           asio::detached);
        }
        stop(*core);
    }

    std::shared_ptr<detail::store_server_core> core_;
};

}  // namespace elastic::inline v0
