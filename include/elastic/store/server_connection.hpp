// SPDX-License-Identifier: MIT
// One connection of a tcp_store_server: reads its requests, runs them on the key table (the
// request dispatch), writes the replies in order; its memory, its deadlines, its leases.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/store/auth.hpp"
#include "elastic/store/engine.hpp"
#include "elastic/store/errors.hpp"
#include "elastic/store/lease.hpp"
#include "elastic/store/server_core.hpp"
#include "elastic/store/server_leases.hpp"
#include "elastic/store/wire.hpp"

#include <asio/awaitable.hpp>
#include <asio/error.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include "elastic/detail/format.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <iterator>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace elastic::inline v0::detail::store {

/// The buffer capacity a connection keeps between messages. A larger request or reply grows its
/// buffer for that message only: kept, the capacity of the largest message each connection ever
/// carried would add up over a long job (the member that completes a round reads every member's
/// information, and a different member completes each round).
inline constexpr std::size_t retained_buffer = std::size_t{16} * 1024;

// One client connection: reads requests, runs them on the engine, writes replies in order. A
// WAIT whose keys are missing is answered later by on_ready, which queues STOP_WAITING in the
// same output stream and wakes the coroutine (wake()) so it flushes it.
class store_connection : public std::enable_shared_from_this<store_connection> {
public:
    store_connection(std::shared_ptr<store_server_core> core, asio::ip::tcp::socket socket)
        : core_(std::move(core)),
          socket_(std::move(socket)),
          timer_(socket_.get_executor()),
          peer_(format_peer(socket_)),
          watcher_(*this),
          opened_(clock::now()),
          last_heard_(opened_) {
        if (core_->options.secret) auth_ = std::make_unique<store_auth::server_handshake>(*core_->options.secret);
    }

    store_connection(const store_connection&) = delete;
    store_connection& operator=(const store_connection&) = delete;

    ~store_connection() { delete[] buf_; }

    template <class Defer = void>
    static asio::awaitable<void> serve(std::shared_ptr<store_connection> self) {
        // Whatever ends the loop — including a throw (out of memory, a throwing log sink, the
        // random source failing) — the connection must leave the engine and the server's set:
        // a waiter left registered would be called after the connection is gone.
        try {
            co_await self->loop();
        } catch (const std::exception& e) {
            self->expire(detail::format("internal error: {}", e.what()));
        } catch (...) {
            self->expire("internal error");
        }
        self->finish();
    }

    ELASTIC_DECL void close() noexcept;

    // Whether the server may close this connection to serve a new client (out of descriptors
    // or at max_connections): it has never sent a request nor begun one, holds nothing, and
    // has been open at least `after`.
    // A connection that is authenticating or part-way through its first request counts too:
    // one byte each must not let a flood hold every slot.
    ELASTIC_DECL bool unused_since(std::chrono::steady_clock::time_point now,
                                   std::chrono::steady_clock::duration after) const noexcept;
    std::chrono::steady_clock::time_point opened() const noexcept { return opened_; }
    bool is_open() const noexcept { return socket_.is_open(); }

    // Closes the connection for the reason given (logged, and kept for the lease log).
    ELASTIC_DECL void expire(std::string reason);

    // `key` was released (DELETE_KEY by its holder): it is no longer this connection's to lose.
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
            if (!conn.room_to_push(1 + 3 * 8 + key.size() + old_value.size() + new_value.size())) return;
            wire::put_u8(conn.out_, static_cast<std::uint8_t>(change));
            wire::put_bytes(conn.out_, key);
            wire::put_bytes(conn.out_, old_value);
            wire::put_bytes(conn.out_, new_value);
            conn.account();
            conn.wake();
        }
        store_connection& conn;
    };

    ELASTIC_DECL void wait_ready(std::list<pending_wait>::iterator it);

    template <class Defer = void>
    asio::awaitable<void> loop() {
        for (;;) {
            // After a malformed request the replies to the requests before it still go out.
            const bool ok = process();
            account();
            schedule();
            if (!out_.empty() && socket_.is_open()) {
                wbuf_.swap(out_);
                write_since_ = clock::now();
                schedule();
                const auto [ec, n] = co_await asio::async_write(socket_, asio::buffer(wbuf_),
                                                                detail::as_tuple_awaitable<Defer>);
                (void)n;
                write_since_.reset();
                wbuf_.clear();
                // A large reply grew the buffer: give the memory back once it is written.
                if (wbuf_.capacity() > retained_buffer) std::string().swap(wbuf_);
                account();
                if (ec) co_return;
                if (ok) continue;
            }
            if (!ok) co_return;
            if (!waits_.empty() || watching_) {
                // A reply may be pushed while we wait for input: wait for readiness, which a
                // push cancels (wake()); cancelling a readiness wait loses no bytes. One
                // operation, not a race of two: nothing to outlive the other.
                if (!out_.empty()) continue;  // pushed while the last write was in flight
                in_readiness_wait_ = true;
                const auto [ec] = co_await socket_.async_wait(asio::ip::tcp::socket::wait_read,
                                                              detail::as_tuple_awaitable<Defer>);
                in_readiness_wait_ = false;
                if (!socket_.is_open()) co_return;
                if (ec == asio::error::operation_aborted) continue;  // woken: flush
                if (ec) co_return;
            }
            if (!socket_.is_open() || !reserve()) co_return;
            const auto [ec, n] = co_await socket_.async_read_some(asio::buffer(buf_ + end_, cap_ - end_),
                                                                  detail::as_tuple_awaitable<Defer>);
            if (ec) {  // EOF, reset or stop(): the client is gone
                // Replies it has not acknowledged for so long that they were sent again: it ended
                // while this server's bytes did not reach it (a one-way cut: it gave up on a
                // server it could no longer hear). Silent. (A reply merely in flight — a push to
                // a holder killed a moment ago — has not been retransmitted yet.)
                if (!leases_.empty() && unheard()) silent_ = true;
                co_return;
            }
            end_ += n;
            const auto now = clock::now();  // the only per-read cost of the deadlines
            // Bytes read after a gap longer than the lease deadline: it would have closed the
            // connection had this process run meanwhile (docs/store.md, "Silent or not").
            if (!leases_.empty() && now - last_heard_ > core_->lease_timeout() + stall_threshold()) stalled_at_ = now;
            last_heard_ = now;
            forgiven_ = false;
        }
    }

    // A reply was queued from outside the loop (a WAIT answered, a watched key changed): end
    // the loop's readiness wait so it writes it. Outside that wait the loop finds out_ full on
    // its own; cancelling then would cancel a write.
    ELASTIC_DECL void wake() noexcept;

    // ---- memory ------------------------------------------------------------------------------

    // Tells the server how many bytes this connection's buffers hold now.
    ELASTIC_DECL void account() noexcept;

    // Why `n` more bytes for `what` would pass the server's memory limit; empty when they fit.
    ELASTIC_DECL std::string no_memory_for(std::size_t n, std::string_view what) const;

    // What appending `n` bytes to `out_` allocates: std::string grows its capacity by doubling,
    // so a queue of 32 MiB that takes 2 MiB more takes 32 MiB more of memory.
    ELASTIC_DECL std::size_t output_growth(std::size_t n) const noexcept;

    // Why a reply of `n` bytes to `what` cannot be queued; empty when it can.
    ELASTIC_DECL std::string no_room_for_reply(std::size_t n, std::string_view what) const;

    // Whether a notification of `n` bytes may be queued; if not, the client, which is not
    // reading what it is sent, is disconnected.
    ELASTIC_DECL bool room_to_push(std::size_t n);

    // Makes room for the next read; false (logged) when the server's memory limit forbids it.
    // The buffer grows with the bytes that arrive, at most doubling, never to the size a
    // request's header announces: a client that announces 16 MiB and sends 10 bytes holds
    // 4 KiB, not 16 MiB.
    ELASTIC_DECL bool reserve();

    // Runs every complete request in the buffer; false closes the connection.
    ELASTIC_DECL bool process();

    ELASTIC_DECL bool fail(std::string_view reason);

    // ---- authentication ----------------------------------------------------------------------

    ELASTIC_DECL bool refuse(std::string_view reason);

    // ---- leases ------------------------------------------------------------------------------

    // Why a write (or DELETE_KEY) of `key` by this connection is refused because another live
    // connection holds that lease, or empty. Only the holder writes its lease: otherwise any
    // client could take a node's lease and drop it at will (a loss the job acts on), and a
    // holder that reconnects holds a lease under a new name anyway (its old one was lost).
    ELASTIC_DECL std::string lease_held_elsewhere(wire::op o, std::string_view key) const;

    // The key now belongs to this connection (the write has been done; lease_held_elsewhere
    // refused it before if another connection held it).
    ELASTIC_DECL void bind_lease(std::string_view key);

    // DELETE_KEY of a lease key: the lease ends without a loss (its holder, or someone on its
    // behalf, released it).
    void release_lease(std::string_view key) {
        if (auto* holder = core_->leases.unbind(key)) holder->forget_lease(key);
    }

    // ---- deadlines ---------------------------------------------------------------------------

    // One timer per connection for every deadline it has: a lease's silence, a request begun
    // and not finished, a reply the client does not take, idleness. It is not moved by each
    // request (that would cost a cancel per request): it fires at the earliest deadline known
    // when it was armed, and then either closes the connection or re-arms for what is left.
    std::optional<clock::time_point> next_deadline() const {
        std::optional<clock::time_point> at;
        const auto consider = [&](clock::time_point t) {
            if (!at || t < *at) at = t;
        };
        const auto& o = core_->options;
        if (!leases_.empty()) consider(last_heard_ + core_->lease_timeout());
        if (o.request_timeout.count() > 0) {
            if (partial_since_) consider(*partial_since_ + o.request_timeout);
            if (write_since_) consider(*write_since_ + o.request_timeout);
        }
        if (o.idle_timeout.count() > 0 && idle()) consider(last_heard_ + o.idle_timeout);
        // Half a handshake must not hold a connection: it has auth_timeout from the accept.
        if (auth_) consider(opened_ + o.auth_timeout);
        return at;
    }

    // Whether bytes this server sent wait unacknowledged past a retransmission (Linux TCP_INFO):
    // the client's side has not heard this server for at least a retransmission timeout.
    bool unheard() noexcept {
        ::tcp_info info{};
        ::socklen_t size = sizeof info;
        if (!socket_.is_open() || ::getsockopt(socket_.native_handle(), IPPROTO_TCP, TCP_INFO, &info, &size) != 0)
            return false;
        return info.tcpi_unacked > 0 && (info.tcpi_retransmits > 0 || info.tcpi_backoff > 0);
    }

    // How late a deadline must be handled to show that this process did not run meanwhile
    // (stopped, or starved of CPU): a heartbeat interval, at least 100 ms.
    clock::duration stall_threshold() const {
        return std::max<clock::duration>(core_->options.lease_heartbeat_interval, std::chrono::milliseconds(100));
    }

    // Nothing to wait for on this connection's behalf (the idle timeout's subject).
    bool idle() const noexcept {
        return begin_ == end_ && waits_.empty() && !watching_ && leases_.empty() && !write_since_;
    }

    // Arms the timer for the next deadline unless it is armed for an earlier one already.
    ELASTIC_DECL void schedule();

    ELASTIC_DECL void deadline_passed();

    ELASTIC_DECL bool execute();

    ELASTIC_DECL void cancel_waits() noexcept;

    // The coroutine has ended: forget every registration, lose the leases (unless the whole
    // server is stopping) and leave the server's set.
    ELASTIC_DECL void finish() noexcept;

    ELASTIC_DECL void lose_leases() noexcept;

    std::shared_ptr<store_server_core> core_;
    asio::ip::tcp::socket socket_;
    asio::steady_timer timer_;  // schedule()
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
    bool in_readiness_wait_ = false;   // the loop awaits readability (wake() may cancel it)
    std::size_t watches_ = 0;          // keys watched
    std::vector<std::string> leases_;  // lease keys this connection holds
    clock::time_point opened_;
    clock::time_point last_heard_;                    // the last read (or the lease's binding)
    bool forgiven_ = false;                           // a lease window given for a stall, since the last read
    bool silent_ = false;                             // closed for the client's silence (a silent lease loss)
    std::optional<clock::time_point> stalled_at_;     // when this process was last found not to have run
    std::optional<clock::time_point> partial_since_;  // the head request's first byte
    std::optional<clock::time_point> write_since_;    // the write in flight's start
    clock::time_point timer_at_{};
    std::uint64_t timer_generation_ = 0;
    bool timer_armed_ = false;
    std::uint64_t requests_ = 0;                          // requests run
    std::size_t accounted_ = 0;                           // bytes of this connection in core_->buffered
    std::string close_reason_;                            // why the server ended the connection, for the lease log
    std::unique_ptr<store_auth::server_handshake> auth_;  // until authenticated (with a secret)
};

}  // namespace elastic::inline v0::detail::store

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::store {

ELASTIC_DECL void store_connection::close() noexcept {
    std::error_code ignored;
    socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    timer_.cancel();
}

ELASTIC_DECL bool store_connection::unused_since(std::chrono::steady_clock::time_point now,
                                                 std::chrono::steady_clock::duration after) const noexcept {
    return requests_ == 0 && waits_.empty() && !watching_ && leases_.empty() && socket_.is_open() &&
           now - opened_ >= after;
}

ELASTIC_DECL void store_connection::expire(std::string reason) {
    if (!socket_.is_open()) return;
    core_->log(detail::format("closing connection from {}: {}", peer_, reason));
    if (close_reason_.empty()) close_reason_ = detail::format("the server closed it: {}", reason);
    close();
}

ELASTIC_DECL void store_connection::wait_ready(std::list<pending_wait>::iterator it) {
    wire::put_u8(out_, static_cast<std::uint8_t>(wire::wait_response::stop_waiting));
    waits_.erase(it);
    wake();
}

ELASTIC_DECL void store_connection::wake() noexcept {
    if (!in_readiness_wait_) return;
    std::error_code ignored;
    socket_.cancel(ignored);
}

ELASTIC_DECL void store_connection::account() noexcept {
    const std::size_t now = cap_ + out_.capacity() + wbuf_.capacity();
    core_->buffered += now;
    core_->buffered -= accounted_;
    accounted_ = now;
}

ELASTIC_DECL std::string store_connection::no_memory_for(std::size_t n, std::string_view what) const {
    const auto& o = core_->options;
    const std::size_t held = core_->held();
    if (n <= o.max_memory && held <= o.max_memory - n) return {};
    return detail::format("{} needs {} bytes more while the server holds {} of its {} "
                          "(store_server_options::max_memory); the store is full",
                          what, n, held, o.max_memory);
}

ELASTIC_DECL std::size_t store_connection::output_growth(std::size_t n) const noexcept {
    const std::size_t need = out_.size() + n;
    if (need <= out_.capacity()) return 0;
    return std::max(need, 2 * out_.capacity()) - out_.capacity();
}

ELASTIC_DECL std::string store_connection::no_room_for_reply(std::size_t n, std::string_view what) const {
    const auto& o = core_->options;
    if (n > o.max_reply_size)
        return detail::format("{} asks for a reply of {} bytes, over the limit of {} "
                              "(store_server_options::max_reply_size); ask for fewer keys",
                              what, n, o.max_reply_size);
    if (out_.size() + n > o.max_queued_output)
        return detail::format("the client has left {} bytes of replies unread and {} wants {} "
                              "more (store_server_options::max_queued_output)",
                              out_.size(), what, n);
    return no_memory_for(output_growth(n), what);
}

ELASTIC_DECL bool store_connection::room_to_push(std::size_t n) {
    if (!socket_.is_open()) return false;
    const auto& o = core_->options;
    const std::size_t queued = out_.size() + wbuf_.size();
    std::string why;
    if (queued + n > o.max_queued_output)
        why = detail::format("it does not read what it is sent: {} bytes of replies and "
                             "notifications are queued for it, and {} more would pass "
                             "store_server_options::max_queued_output ({})",
                             queued, n, o.max_queued_output);
    else if (auto full = no_memory_for(output_growth(n), "its next notification"); !full.empty())
        why = detail::format("it does not read what it is sent ({} bytes are queued for it), "
                             "and {}",
                             queued, full);
    if (why.empty()) return true;
    expire(std::move(why));
    return false;
}

ELASTIC_DECL bool store_connection::reserve() {
    const std::size_t have = end_ - begin_;
    std::size_t want = 4096;
    if (needed_ > have) want = std::max(want, std::min(needed_ - have, have));
    if (cap_ - end_ >= want) return true;
    if (begin_ > 0) {
        std::memmove(buf_, buf_ + begin_, have);
        begin_ = 0;
        end_ = have;
        if (cap_ - end_ >= want) return true;
    }
    const std::size_t cap = std::max(cap_ * 2, have + want);
    if (auto why = no_memory_for(cap - cap_, "a request being read"); !why.empty()) return fail(why);
    char* bigger = new char[cap];
    if (have) std::memcpy(bigger, buf_, have);
    delete[] buf_;
    buf_ = bigger;
    cap_ = cap;
    account();
    return true;
}

ELASTIC_DECL bool store_connection::process() {
    bool completed = false;  // a request ran: a partial one after it is a new one
    while (out_.size() < core_->options.max_pending_output && socket_.is_open()) {
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
            if (auth_->done()) auth_.reset();  // its deadline (schedule()) lapses
            continue;
        }
        if (!dialect_) {
            const auto d = wire::detect_dialect(data);
            if (d == wire::detection::need_more) {
                needed_ = data.size() + 1;
                break;
            }
            dialect_ = d == wire::detection::current ? wire::dialect::current : wire::dialect::legacy;
        }
        auto r = wire::parse_request(*dialect_, data, req_, core_->options.limits);
        if (r.status == wire::parse_status::need_more) {
            needed_ = r.size;
            break;
        }
        if (r.status == wire::parse_status::malformed) return fail(r.reason);
        needed_ = 0;
        if (!execute()) return false;
        ++requests_;
        completed = true;
        begin_ += r.size;
        if (core_->options.on_request) core_->options.on_request(req_.operation);
    }
    if (begin_ == end_) {
        begin_ = end_ = 0;
        // A large request grew the buffer: give the memory back once it is consumed.
        if (cap_ > retained_buffer) {
            delete[] buf_;
            buf_ = nullptr;
            cap_ = 0;
        }
    }
    // The request timeout runs from the first byte of the request at the head of the
    // buffer: restarted by every request that completes, stopped when none is begun.
    if (begin_ == end_ || end_ - begin_ >= needed_) partial_since_.reset();
    else if (completed || !partial_since_) partial_since_ = clock::now();
    return true;
}

ELASTIC_DECL bool store_connection::fail(std::string_view reason) {
    core_->log(detail::format("closing connection from {} ({} dialect): {}", peer_,
                              dialect_ == wire::dialect::current ? "current" : "legacy", reason));
    if (close_reason_.empty()) close_reason_ = detail::format("the server closed it: {}", reason);
    return false;
}

ELASTIC_DECL bool store_connection::refuse(std::string_view reason) {
    core_->log(detail::format("closing connection from {}: authentication failed: {}", peer_, reason));
    auth_.reset();  // said once
    return false;
}

ELASTIC_DECL std::string store_connection::lease_held_elsewhere(wire::op o, std::string_view key) const {
    const auto* holder = core_->leases.holder(key);
    if (!holder || holder == this) return {};
    return detail::format("{} of lease '{}', which the connection from {} holds (only a lease's "
                          "holder writes or deletes it; docs/store.md, Leases)",
                          wire::name(o), store_engine::printable(key), holder->peer());
}

ELASTIC_DECL void store_connection::bind_lease(std::string_view key) {
    if (!core_->leases.bind(key, this)) return;  // this connection's already
    leases_.emplace_back(key);
    const std::string space(parse_lease_key(key)->space);
    for (const auto* counter : {"__epoch", "__silent"}) {
        if (!core_->engine.find(space + counter)) core_->engine.set(space + counter, std::string_view("0"));
    }
    last_heard_ = clock::now();
    schedule();
}

ELASTIC_DECL void store_connection::schedule() {
    if (!socket_.is_open()) return;
    const auto at = next_deadline();
    if (!at || (timer_armed_ && timer_at_ <= *at)) return;
    timer_armed_ = true;
    timer_at_ = *at;
    const auto generation = ++timer_generation_;  // a re-arm cancels the wait before it
    timer_.expires_at(*at);
    timer_.async_wait([weak = weak_from_this(), generation](const std::error_code& ec) {
        const auto self = weak.lock();
        if (!self || self->timer_generation_ != generation) return;
        self->timer_armed_ = false;
        if (!ec) self->deadline_passed();
    });
}

ELASTIC_DECL void store_connection::deadline_passed() {
    if (!socket_.is_open()) return;
    const auto now = clock::now();
    const auto& o = core_->options;
    const auto ms = [](clock::duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
    if (!leases_.empty() && now >= last_heard_ + core_->lease_timeout()) {
        // The silence may be this process's own, not the client's: its bytes wait unread, or
        // this timer ran long after its time (the server was stopped, or starved of CPU, and a
        // holder in the same process, the store's host agent, could not speak either). The
        // lease's silence is then counted from now: one more window, once per read, so that
        // neither a loop that keeps running late nor a client that sends but takes no replies
        // (the server cannot read while it cannot write) keeps a lease for ever.
        if (!forgiven_) {
            std::error_code unread;
            const bool spoke = socket_.available(unread) > 0 && !unread;
            const auto late = now - timer_at_;
            const bool stalled = late > stall_threshold();
            if (spoke || stalled) {
                forgiven_ = true;
                if (stalled) stalled_at_ = now;
                if (stalled && now - core_->stall_said > core_->lease_timeout()) {  // once per stall
                    core_->stall_said = now;
                    core_->log(detail::format("the store did not run for {} ms (its process was stopped, or starved of "
                                              "CPU): the leases' silence is counted from now, not from before",
                                              ms(late)));
                }
                last_heard_ = now;
                schedule();
                return;
            }
        }
        silent_ = true;
        close_reason_ = detail::format("silent for {} ms ({} missed heartbeats of {} ms; "
                                       "store_server_options::lease_heartbeat_interval, lease_missed_heartbeats)",
                                       ms(now - last_heard_), o.lease_missed_heartbeats,
                                       o.lease_heartbeat_interval.count());
        core_->log(detail::format("closing connection from {}: {}", peer_, close_reason_));
        close();
        return;
    }
    if (auth_ && now >= opened_ + o.auth_timeout) {
        auth_.reset();  // said once
        return expire(detail::format("authentication failed: no complete handshake within {} "
                                     "ms (store_server_options::auth_timeout)",
                                     o.auth_timeout.count()));
    }
    // A client whose bytes stop mid-request or mid-reply went silent too (a cut-off link
    // leaves a write unacknowledged).
    if (o.request_timeout.count() > 0 && partial_since_ && now >= *partial_since_ + o.request_timeout) {
        silent_ = true;
        return expire(detail::format("a request begun {} ms ago is still incomplete ({} of at least {} bytes "
                                     "arrived; store_server_options::request_timeout is {} ms)",
                                     ms(now - *partial_since_), end_ - begin_, needed_, o.request_timeout.count()));
    }
    if (o.request_timeout.count() > 0 && write_since_ && now >= *write_since_ + o.request_timeout) {
        silent_ = true;
        return expire(detail::format("it has not taken a reply of {} bytes in {} ms (store_server_options::"
                                     "request_timeout)",
                                     wbuf_.size(), ms(now - *write_since_)));
    }
    if (o.idle_timeout.count() > 0 && idle() && now >= last_heard_ + o.idle_timeout)
        return expire(detail::format("idle for {} ms (store_server_options::idle_timeout)", ms(now - last_heard_)));
    schedule();
}

ELASTIC_DECL bool store_connection::execute() {
    using wire::op;
    auto& engine = core_->engine;
    auto& r = req_;
    switch (r.operation) {
        case op::validate:
            if (r.nonce != wire::validate_magic)
                return fail(detail::format("VALIDATE with magic 0x{:08x}, expected 0x{:08x}", r.nonce,
                                           wire::validate_magic));
            return true;
        case op::ping: wire::put_u32(out_, r.nonce); return true;
        case op::set:
            if (auto why = store_lease_table::refusal(r.operation, r.key, true); !why.empty()) return fail(why);
            if (auto why = lease_held_elsewhere(r.operation, r.key); !why.empty()) return fail(why);
            if (auto why = no_memory_for(engine.growth(r.key, r.value.size()), "SET"); !why.empty()) return fail(why);
            engine.set(r.key, r.value);
            if (parse_lease_key(r.key)) bind_lease(r.key);
            return true;
        case op::compare_set: {
            if (auto why = store_lease_table::refusal(r.operation, r.key, true); !why.empty()) return fail(why);
            // Whether this CAS writes (PyTorch's rules), known before it runs: a lease is
            // bound only by the CAS that wins; one that would not write only reads.
            const auto* before = engine.find(r.key);
            const bool writes = before ? *before == r.expected : r.expected.empty();
            if (auto why = lease_held_elsewhere(r.operation, r.key); writes && !why.empty()) return fail(why);
            const std::size_t reply = 8 + std::max(r.value.size(), before ? before->size() : r.expected.size());
            if (auto why = no_room_for_reply(reply, "COMPARE_SET"); !why.empty()) return fail(why);
            if (writes)
                if (auto why = no_memory_for(engine.growth(r.key, r.value.size()) + output_growth(reply),
                                             "COMPARE_SET");
                    !why.empty())
                    return fail(why);
            wire::put_bytes(out_, engine.compare_set(r.key, r.expected, r.value));
            if (writes && parse_lease_key(r.key)) bind_lease(r.key);
            return true;
        }
        case op::get: {
            // Missing: an empty value, like the libuv server (clients WAIT first anyway).
            const auto* v = engine.find(r.key);
            if (auto why = no_room_for_reply(8 + (v ? v->size() : 0), "GET"); !why.empty()) return fail(why);
            wire::put_bytes(out_, v ? std::string_view(*v) : std::string_view{});
            return true;
        }
        case op::add:
            if (auto why = store_lease_table::refusal(r.operation, r.key, false); !why.empty()) return fail(why);
            if (auto why = no_memory_for(engine.growth(r.key, 20), "ADD"); !why.empty()) return fail(why);
            try {
                wire::put_i64(out_, engine.add(r.key, r.number));
            } catch (const store_error& e) {
                return fail(e.what());
            }
            return true;
        case op::check:
            wire::put_u8(out_, static_cast<std::uint8_t>(engine.check(r.keys) ? wire::check_response::ready
                                                                              : wire::check_response::not_ready));
            return true;
        case op::wait: {
            if (waits_.size() >= core_->options.max_waits_per_connection)
                return fail(detail::format("{} WAITs pending on one connection reach the limit "
                                           "(store_server_options::max_waits_per_connection)",
                                           waits_.size()));
            std::size_t awaited = 0;
            for (const auto k : r.keys) awaited += store_engine::awaited_bytes(k.size());
            if (auto why = no_memory_for(awaited, "WAIT"); !why.empty()) return fail(why);
            auto& w = waits_.emplace_back(*this);
            w.self = std::prev(waits_.end());
            if (engine.wait(w, r.keys)) {
                waits_.pop_back();
                wire::put_u8(out_, static_cast<std::uint8_t>(wire::wait_response::stop_waiting));
            }
            return true;
        }
        case op::num_keys: wire::put_i64(out_, static_cast<std::int64_t>(engine.size())); return true;
        case op::watch_key:
            if (watches_ >= core_->options.max_waits_per_connection)
                return fail(detail::format("{} keys watched on one connection reach the limit "
                                           "(store_server_options::max_waits_per_connection)",
                                           watches_));
            if (auto why = no_memory_for(store_engine::watch_bytes(r.key.size()), "WATCH_KEY"); !why.empty())
                return fail(why);
            if (engine.watch(watcher_, r.key)) ++watches_;
            watching_ = true;
            wire::put_u8(out_, static_cast<std::uint8_t>(wire::watch_response::key_callback_registered));
            return true;
        case op::delete_key:
            if (const auto parts = parse_lease_key(r.key)) {
                if (parts->reserved() || parts->name.empty())
                    return fail(store_lease_table::refusal(r.operation, r.key, true));
                if (auto why = lease_held_elsewhere(r.operation, r.key); !why.empty()) return fail(why);
                release_lease(r.key);
            }
            wire::put_i64(out_, engine.erase(r.key) ? 1 : 0);
            return true;
        case op::append:
            if (auto why = store_lease_table::refusal(r.operation, r.key, false); !why.empty()) return fail(why);
            if (const auto* v = engine.find(r.key);
                v && v->size() + r.value.size() > core_->options.limits.max_value_size)
                return fail(detail::format("APPEND of {} bytes to '{}' would make a value of {} "
                                           "bytes, over the limit of {} "
                                           "(wire::limits::max_value_size)",
                                           r.value.size(), store_engine::printable(r.key), v->size() + r.value.size(),
                                           core_->options.limits.max_value_size));
            if (auto why = no_memory_for(engine.growth(r.key, r.value.size()), "APPEND"); !why.empty())
                return fail(why);
            engine.append(r.key, r.value);
            return true;
        case op::multi_get: {
            // The reply's size is known before it is built: a request naming one large
            // value many times is refused, not answered with gigabytes.
            std::size_t reply = 0;
            for (const auto k : r.keys) {
                const auto* v = engine.find(k);
                reply += 8 + (v ? v->size() : 0);
            }
            if (auto why = no_room_for_reply(reply, detail::format("MULTI_GET of {} keys", r.keys.size()));
                !why.empty())
                return fail(why);
            for (const auto k : r.keys) {
                const auto* v = engine.find(k);
                wire::put_bytes(out_, v ? std::string_view(*v) : std::string_view{});
            }
            return true;
        }
        case op::multi_set: {
            // All or nothing: a refused lease key refuses the whole request.
            std::size_t growth = 0;
            for (std::size_t i = 0; i < r.keys.size(); ++i) {
                if (auto why = store_lease_table::refusal(r.operation, r.keys[i], true); !why.empty()) return fail(why);
                if (auto why = lease_held_elsewhere(r.operation, r.keys[i]); !why.empty()) return fail(why);
                growth += engine.growth(r.keys[i], r.values[i].size());
            }
            if (auto why = no_memory_for(growth, "MULTI_SET"); !why.empty()) return fail(why);
            for (std::size_t i = 0; i < r.keys.size(); ++i) {
                engine.set(r.keys[i], r.values[i]);
                if (parse_lease_key(r.keys[i])) bind_lease(r.keys[i]);
            }
            return true;
        }
        case op::cancel_wait:
            // Any STOP_WAITING already queued stays in front of this reply: a client that
            // raced reads 0x00 then 0x01, as PyTorch's client expects (it reads a second byte
            // after a 0x00).
            cancel_waits();
            wire::put_u8(out_, static_cast<std::uint8_t>(wire::wait_response::wait_canceled));
            return true;
        case op::list_keys: {
            std::size_t reply = 8;
            engine.for_each([&](std::string_view k, std::string_view) { reply += 8 + k.size(); });
            if (auto why = no_room_for_reply(reply, "LIST_KEYS"); !why.empty()) return fail(why);
            wire::put_i64(out_, static_cast<std::int64_t>(engine.size()));
            engine.for_each([&](std::string_view k, std::string_view) { wire::put_bytes(out_, k); });
            return true;
        }
        case op::queue_push:
        case op::queue_pop:
        case op::queue_len:
        case op::barrier:
            return fail(detail::format("{} is not supported by this server (docs/store.md)", wire::name(r.operation)));
    }
    return fail("unreachable opcode");
}

ELASTIC_DECL void store_connection::cancel_waits() noexcept {
    for (auto& w : waits_) core_->engine.cancel(w);
    waits_.clear();
}

ELASTIC_DECL void store_connection::finish() noexcept {
    if (auth_ && auth_->challenged() && !core_->stopped) {
        try {
            core_->log(detail::format("connection from {} closed during the authentication "
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
    delete[] buf_;
    buf_ = nullptr;
    cap_ = begin_ = end_ = 0;
    out_ = std::string();
    wbuf_ = std::string();
    core_->buffered -= accounted_;
    accounted_ = 0;
    core_->connections.erase(this);
    core_->resume_accept.notify();
}

ELASTIC_DECL void store_connection::lose_leases() noexcept {
    auto leases = std::move(leases_);
    leases_.clear();
    if (leases.empty()) return;
    // A connection that ended while its deadline was overdue and not yet handled ended while
    // this process did not run: its holder may have given up on the server's silence (a store
    // host stopped past the keep-alive), so the loss counts as silent, not as a death.
    // So does one that ended soon after such a stall was found: the holder's bytes sent during
    // the stall, read first, moved its deadline, and its end may be read after the deadline ran.
    // (The lease deadline itself, not the timer's: the timer is a periodic check, and a loop
    // merely late for it must not make a killed holder's loss look silent.)
    const auto now = clock::now();
    const bool stalled = now - (last_heard_ + core_->lease_timeout()) > stall_threshold() ||
                         (stalled_at_ && now - *stalled_at_ <= core_->lease_timeout());
    const bool silent = silent_ || stalled;
    const std::string why = !close_reason_.empty() ? close_reason_
                            : core_->stopped       ? std::string("the server stopped")
                            : stalled
                                ? std::string("the connection closed while the server did not run (its process was "
                                              "stopped or starved of CPU)")
                                : std::string("the connection closed");
    for (const auto& key : leases) {
        core_->leases.unbind(key);
        if (core_->stopped) continue;  // the store goes away with its keys: nobody to tell
        try {
            core_->leases.record_loss(core_->engine, core_->options.lease_lost_records_kept, key, peer_, why, silent,
                                      [&](std::string_view line) { core_->log(line); });
        } catch (...) {
            // Out of memory while writing the loss: the key is gone either way.
        }
    }
}

}  // namespace elastic::inline v0::detail::store

#endif  // ELASTIC_DETAIL_BODIES
