// SPDX-License-Identifier: MIT
// blocking_store_client: tcp_store_client behind plain blocking calls, for worker code that is
// not asynchronous (each call runs a private io_context until the operation is done).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/store/client.hpp"
#include "elastic/store/errors.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// The TCP store client for synchronous code: the same operations, options, errors and
/// timeouts as tcp_store_client, each call returning when its operation is done. It owns its
/// io_context, so nothing runs between calls (no thread, no CPU). Not thread-safe: one
/// object per thread, or a mutex around it.
template <class Defer = void>
class basic_blocking_store_client {
public:
    explicit basic_blocking_store_client(store_client_options options)
        : client_(ctx_.get_executor(), std::move(options)) {}

    basic_blocking_store_client(const basic_blocking_store_client&) = delete;
    basic_blocking_store_client& operator=(const basic_blocking_store_client&) = delete;

    /// Connects now (otherwise the first operation does).
    void connect() { run(client_.connect()); }
    void close() noexcept { client_.close(); }

    void set(std::string key, std::string value) { run(client_.set(std::move(key), std::move(value))); }
    std::string get(std::string key) { return run(client_.get(std::move(key))); }
    std::int64_t add(std::string key, std::int64_t delta) { return run(client_.add(std::move(key), delta)); }
    std::string compare_set(std::string key, std::string expected, std::string desired) {
        return run(client_.compare_set(std::move(key), std::move(expected), std::move(desired)));
    }
    void wait(std::vector<std::string> keys) { run(client_.wait(std::move(keys))); }
    void wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
        run(client_.wait(std::move(keys), timeout));
    }
    bool check(std::vector<std::string> keys) { return run(client_.check(std::move(keys))); }
    bool delete_key(std::string key) { return run(client_.delete_key(std::move(key))); }
    std::int64_t num_keys() { return run(client_.num_keys()); }
    std::vector<std::string> multi_get(std::vector<std::string> keys) {
        return run(client_.multi_get(std::move(keys)));
    }
    void multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
        run(client_.multi_set(std::move(keys), std::move(values)));
    }
    void append(std::string key, std::string value) { run(client_.append(std::move(key), std::move(value))); }

    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return client_.timeout(); }
    void set_timeout(std::chrono::milliseconds t) noexcept { client_.set_timeout(t); }
    [[nodiscard]] std::optional<wire::dialect> dialect() const noexcept { return client_.dialect(); }
    [[nodiscard]] std::string address() const { return client_.address(); }

    /// The asynchronous client underneath (to co_spawn on `context()` yourself).
    tcp_store_client& async_client() noexcept { return client_; }
    asio::io_context& context() noexcept { return ctx_; }

private:
    template <class T>
    T run(asio::awaitable<T> op) {
        std::exception_ptr error;
        std::optional<T> result;
        asio::co_spawn(ctx_, std::move(op), [&](std::exception_ptr e, T v) {
            error = e;
            if (!e) result.emplace(std::move(v));
        });
        drive();
        if (error) std::rethrow_exception(error);
        return std::move(*result);
    }

    void run(asio::awaitable<void> op) {
        std::exception_ptr error;
        asio::co_spawn(ctx_, std::move(op), [&](std::exception_ptr e) { error = e; });
        drive();
        if (error) std::rethrow_exception(error);
    }

    void drive() {
        ctx_.restart();
        ctx_.run();
    }

    // Declared first: destroyed last, after the client that uses its executor.
    asio::io_context ctx_{1};
    tcp_store_client client_;
};
using blocking_store_client = basic_blocking_store_client<>;

}  // namespace elastic::inline v0
