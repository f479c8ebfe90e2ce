// SPDX-License-Identifier: MIT
// One connection of a tcp_store_client: its socket and the deadline every operation on it has,
// and the backoff between connection attempts.
#pragma once

#include "elastic/detail/config.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <system_error>

namespace elastic::inline v0::detail::store {

// One TCP connection and its deadline timer. Shared with the timer's handler (weakly), which
// may run after the client or the connection is gone.
struct store_client_connection : std::enable_shared_from_this<store_client_connection> {
    explicit store_client_connection(const asio::any_io_executor& ex) : socket(ex), timer(ex) {}
    asio::ip::tcp::socket socket;
    asio::steady_timer timer;
    std::uint64_t generation = 0;  // bumped by each arm/disarm; stale expiries are ignored
    bool expired = false;          // the armed deadline passed: pending I/O was cancelled

    // Arms the connection's deadline: when it passes, pending socket I/O is cancelled and
    // `expired` set, so the operation reports a timeout instead of hanging.
    // `may_extend`: false for a deadline that only schedules something (a heartbeat's send
    // time), which must never move later.
    ELASTIC_DECL void arm_deadline(std::chrono::steady_clock::time_point deadline, bool may_extend = true);

    // The timer of one arm: at `deadline`, unless the peer's bytes wait unread, which is this
    // process's delay (stopped, or starved of CPU), not the peer's: then once more after `span`.
    ELASTIC_DECL void watch(std::chrono::steady_clock::time_point deadline, std::uint64_t armed,
                            std::chrono::steady_clock::duration span, bool may_extend);

    ELASTIC_DECL void disarm() noexcept;

    // Shuts the socket down and closes it; the deadline lapses.
    ELASTIC_DECL void close() noexcept;
};

// The delay after failed connection attempt `attempt` (from 1): `initial`, doubled up to
// `max`, multiplied by a random factor in [0.5, 1] so many clients do not retry in lockstep.
ELASTIC_DECL std::chrono::milliseconds connect_backoff(int attempt, std::chrono::milliseconds initial,
                                                       std::chrono::milliseconds max, std::minstd_rand& rng);

}  // namespace elastic::inline v0::detail::store

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::store {

ELASTIC_DECL std::chrono::milliseconds connect_backoff(int attempt, std::chrono::milliseconds initial,
                                                       std::chrono::milliseconds max, std::minstd_rand& rng) {
    auto d = initial;
    for (int i = 1; i < attempt && d < max; ++i) d *= 2;
    d = std::min(d, max);
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    return std::chrono::milliseconds(static_cast<std::chrono::milliseconds::rep>(static_cast<double>(d.count()) *
                                                                                 jitter(rng)));
}

}  // namespace elastic::inline v0::detail::store

namespace elastic::inline v0::detail::store {

ELASTIC_DECL void store_client_connection::arm_deadline(std::chrono::steady_clock::time_point deadline,
                                                        bool may_extend) {
    expired = false;
    const auto armed = ++generation;
    watch(deadline, armed, deadline - std::chrono::steady_clock::now(), may_extend);
}

ELASTIC_DECL void store_client_connection::watch(std::chrono::steady_clock::time_point deadline, std::uint64_t armed,
                                                 std::chrono::steady_clock::duration span, bool may_extend) {
    timer.expires_at(deadline);
    timer.async_wait([weak = weak_from_this(), armed, span, may_extend](const std::error_code& ec) {
        if (ec) return;
        const auto conn = weak.lock();
        if (!conn || conn->generation != armed) return;
        // Not the peer's delay but this process's: the peer's bytes wait unread, or the timer
        // ran long after its time (this process was stopped, or starved of CPU, and could not
        // have read a reply). Once per arm, one more span.
        const auto now = std::chrono::steady_clock::now();
        const auto late = now - conn->timer.expiry();
        std::error_code unread;
        const bool spoke = conn->socket.is_open() && conn->socket.available(unread) > 0 && !unread;
        const bool stalled = late >
                             std::max<std::chrono::steady_clock::duration>(span / 4, std::chrono::milliseconds(100));
        if (may_extend && (spoke || stalled)) {
            conn->watch(now + span, armed, span, false);
            return;
        }
        conn->expired = true;
        std::error_code ignored;
        conn->socket.cancel(ignored);
    });
}

ELASTIC_DECL void store_client_connection::disarm() noexcept {
    ++generation;
    timer.cancel();
}

ELASTIC_DECL void store_client_connection::close() noexcept {
    std::error_code ignored;
    socket.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    disarm();
}

}  // namespace elastic::inline v0::detail::store

#endif  // ELASTIC_DETAIL_BODIES
