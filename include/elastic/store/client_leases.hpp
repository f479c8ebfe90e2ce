// SPDX-License-Identifier: MIT
// The leases of a tcp_store_client (docs/store-client.md, "Leases"): the keys it holds on its
// connection, the heartbeat that keeps them alive on the wire, and the loss of the connection
// that held them, latched until someone awaits it.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/store/wire.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/error.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <unistd.h>

namespace elastic::inline v0 {

/// What `tcp_store_client::connection_lost()` reports: the connection that held leases ended,
/// and with it the leases (the server records them lost).
struct store_connection_loss {
    std::string reason;               ///< why: the store's silence, its EOF or reset, close()
    std::vector<std::string> leases;  ///< the keys that were held, as given to hold_lease
};

namespace detail::store {

// A request whose reply proves the server is there: PING (u32 nonce echoed) in the current
// dialect, an empty CHECK (READY) in the legacy one, which has no PING.
ELASTIC_DECL std::uint32_t heartbeat_nonce();

ELASTIC_DECL void encode_heartbeat(wire::dialect dialect, std::string& out);

ELASTIC_DECL std::size_t heartbeat_reply_size(wire::dialect dialect);

ELASTIC_DECL bool heartbeat_reply_ok(wire::dialect dialect, const char* p);

// The lease keys a client holds on its connection, and the loss of that connection: reported
// once, to whoever awaits (or next awaits) next_loss(). Use it on the client's thread.
template <class Defer = void>
class basic_store_client_leases {
public:
    explicit basic_store_client_leases(const asio::any_io_executor& executor) : lost_(executor) {}

    [[nodiscard]] const std::vector<std::string>& keys() const noexcept { return keys_; }
    [[nodiscard]] bool empty() const noexcept { return keys_.empty(); }

    void add(std::string key) {
        if (std::find(keys_.begin(), keys_.end(), key) == keys_.end()) keys_.push_back(std::move(key));
    }
    void remove(const std::string& key) { std::erase(keys_, key); }
    void clear() noexcept { keys_.clear(); }

    // The held connection ended: the leases are gone with it.
    void lose(std::string_view reason) noexcept {
        if (keys_.empty()) return;
        try {
            loss_ = store_connection_loss{std::string(reason), std::move(keys_)};
        } catch (...) {
            loss_.reset();
        }
        keys_.clear();
        lost_.notify();
    }

    // The next loss (at once for one latched before the call). `alive` is the client's: once it
    // is false, `this` is gone and nothing of it is touched.
    asio::awaitable<store_connection_loss> next_loss(std::shared_ptr<bool> alive) {
        while (!loss_) {
            co_await lost_.wait();
            if (!*alive) throw std::system_error(asio::error::operation_aborted, "store client destroyed");
            const auto cs = co_await asio::this_coro::cancellation_state;
            if (!loss_ && cs.cancelled() != asio::cancellation_type::none)
                throw std::system_error(asio::error::operation_aborted, "connection_lost() cancelled");
        }
        auto loss = std::move(*loss_);
        loss_.reset();
        co_return loss;
    }

private:
    std::vector<std::string> keys_;
    std::optional<store_connection_loss> loss_;
    async_signal lost_;
};
using store_client_leases = basic_store_client_leases<>;

}  // namespace detail::store

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::store {

ELASTIC_DECL std::uint32_t heartbeat_nonce() { return static_cast<std::uint32_t>(::getpid()); }

ELASTIC_DECL void encode_heartbeat(wire::dialect dialect, std::string& out) {
    if (dialect == wire::dialect::current) {
        wire::put_u8(out, *wire::to_byte(wire::dialect::current, wire::op::ping));
        wire::put_u32(out, heartbeat_nonce());
    } else {
        wire::put_u8(out, *wire::to_byte(wire::dialect::legacy, wire::op::check));
        wire::put_u64(out, 0);
    }
}

ELASTIC_DECL std::size_t heartbeat_reply_size(wire::dialect dialect) {
    return dialect == wire::dialect::current ? 4 : 1;
}

ELASTIC_DECL bool heartbeat_reply_ok(wire::dialect dialect, const char* p) {
    if (dialect == wire::dialect::current) return wire::get_le<std::uint32_t>(p) == heartbeat_nonce();
    return static_cast<std::uint8_t>(*p) == static_cast<std::uint8_t>(wire::check_response::ready);
}

}  // namespace detail::store
}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
