// SPDX-License-Identifier: MIT
// memory_store: the store concept over the shared engine, in process (unit tests, one-node jobs).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/store/concepts.hpp"
#include "elastic/store/engine.hpp"
#include "elastic/store/errors.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/awaitable.hpp>
#include <asio/error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include "elastic/detail/format.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// An in-memory store with exactly the TCP server's semantics (both front the same engine).
/// Use it from coroutines on one thread; it must outlive every operation awaited on it.
template <class Defer = void>
class basic_memory_store {
public:
    /// A store whose get/wait without a timeout wait up to `timeout` (PyTorch's default 300 s).
    explicit basic_memory_store(std::chrono::milliseconds timeout = std::chrono::seconds(300))
        : owned_(std::make_unique<detail::store::store_engine>()), engine_(owned_.get()), timeout_(timeout) {}

    /// A view of an existing engine, e.g. `tcp_store_server::engine()`: the agent that hosts the
    /// server uses the same keys and waiters in process, without a loopback connection. The
    /// engine must outlive the store; use both on the engine's thread.
    explicit basic_memory_store(detail::store::store_engine& engine,
                                std::chrono::milliseconds timeout = std::chrono::seconds(300))
        : engine_(&engine), timeout_(timeout) {}

    /// The default timeout of get, multi_get and wait(keys).
    std::chrono::milliseconds timeout() const noexcept { return timeout_; }
    /// Changes the default timeout.
    void set_timeout(std::chrono::milliseconds timeout) noexcept { timeout_ = timeout; }

    /// Overwrites `key` and wakes its waiters.
    asio::awaitable<void> set(std::string key, std::string value) {
        engine_->set(key, std::move(value));
        co_return;
    }

    /// Waits (up to timeout()) for `key`, then returns its value.
    asio::awaitable<std::string> get(std::string key) {
        // (g++ 12 miscompiles a braced temporary inside co_await: "array used as initializer")
        std::vector<std::string> keys;
        keys.push_back(key);
        co_await wait_for(std::move(keys), timeout_);
        const auto* v = engine_->find(key);
        // Deleted between the wake-up and now: PyTorch's libuv server answers empty.
        co_return v ? *v : std::string{};
    }

    /// Adds `delta` to the decimal counter at `key`; store_error when it holds something else.
    asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta) { co_return engine_->add(key, delta); }

    /// PyTorch's compare_set (see the `store` concept); creating a key wakes its waiters.
    asio::awaitable<std::string> compare_set(std::string key, std::string expected, std::string desired) {
        co_return std::string(engine_->compare_set(key, expected, desired));
    }

    /// Waits up to timeout() until every key exists.
    asio::awaitable<void> wait(std::vector<std::string> keys) { co_await wait_for(std::move(keys), timeout_); }

    /// Waits up to `timeout` until every key exists; store_timeout after that.
    asio::awaitable<void> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
        co_await wait_for(std::move(keys), timeout);
    }

    /// Whether every key exists now.
    asio::awaitable<bool> check(std::vector<std::string> keys) { co_return engine_->check(keys); }

    /// Removes `key`; true when it existed.
    asio::awaitable<bool> delete_key(std::string key) { co_return engine_->erase(key); }

    /// The number of keys.
    asio::awaitable<std::int64_t> num_keys() { co_return static_cast<std::int64_t>(engine_->size()); }

    /// Waits (up to timeout()) for every key, then returns their values in order.
    asio::awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys) {
        co_await wait_for(keys, timeout_);
        std::vector<std::string> values;
        values.reserve(keys.size());
        for (const auto& k : keys) {
            const auto* v = engine_->find(k);
            values.push_back(v ? *v : std::string{});
        }
        co_return values;
    }

    /// Sets each key to the value at the same position.
    asio::awaitable<void> multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
        if (keys.size() != values.size())
            throw store_error(detail::format("multi_set needs as many values as keys: got {} keys "
                                             "and {} values",
                                             keys.size(), values.size()));
        for (std::size_t i = 0; i < keys.size(); ++i) engine_->set(keys[i], std::move(values[i]));
        co_return;
    }

    /// Appends to `key`'s value (creates it) and wakes its waiters.
    asio::awaitable<void> append(std::string key, std::string value) {
        engine_->append(key, value);
        co_return;
    }

    /// The engine (shared semantics; the server exposes the same).
    detail::store::store_engine& engine() noexcept { return *engine_; }

private:
    // One timer is both the deadline and the wake-up: on_ready cancels it. `done` is the truth,
    // so a deadline that expires in the same turn as the write still counts as success.
    struct timed_waiter final : detail::store::store_waiter {
        explicit timed_waiter(const asio::any_io_executor& ex) : timer(ex) {}
        void on_ready() override {
            done = true;
            timer.cancel();
        }
        asio::steady_timer timer;
        bool done = false;
    };

    asio::awaitable<void> wait_for(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
        timed_waiter w(co_await asio::this_coro::executor);
        if (engine_->wait(w, keys)) co_return;
        w.timer.expires_after(timeout);
        const auto [ec] = co_await w.timer.async_wait(detail::as_tuple_awaitable<Defer>);
        if (w.done) co_return;
        engine_->cancel(w);
        if (ec == asio::error::operation_aborted)  // our own caller cancelled us
            throw std::system_error(ec, "store wait cancelled");
        std::string names;
        for (const auto& k : keys)
            if (!engine_->find(k)) names += (names.empty() ? "" : ", ") + detail::store::store_engine::printable(k);
        throw store_timeout(detail::format("wait timed out after {} ms; keys still missing: {}", timeout.count(),
                                           names));
    }

    std::unique_ptr<detail::store::store_engine> owned_;  // null when viewing another's engine
    detail::store::store_engine* engine_;
    std::chrono::milliseconds timeout_;
};
using memory_store = basic_memory_store<>;

static_assert(store<memory_store>);
static_assert(multi_key_store<memory_store>);

}  // namespace elastic::inline v0
