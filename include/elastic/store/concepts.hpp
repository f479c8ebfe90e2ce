// SPDX-License-Identifier: MIT
// The store concepts: what every store model provides (store) and the batch operations some add
// (multi_key_store).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/store/errors.hpp"

#include <asio/awaitable.hpp>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

namespace elastic::inline v0 {

/*
 * store: a key-value store shared by the agents and workers of a job, with PyTorch's
 * c10d::Store semantics. Keys and values are bytes held in std::string (any byte, NUL included).
 * Every operation is a coroutine on Asio, awaited as a plain verb (`co_await s.get(key)`).
 * Arguments are taken by value, so the coroutine frame owns them.
 *
 * A model provides:
 *   set(key, value)                 -> awaitable<void>         overwrite, wake waiters of key
 *   get(key)                        -> awaitable<std::string>  wait for key (default timeout), read
 *   add(key, delta)                 -> awaitable<int64_t>      decimal counter, returns new value
 *   compare_set(key, expected, desired) -> awaitable<std::string>
 *        absent & expected empty: create; absent & expected non-empty: return expected;
 *        equal: replace; different: return current. Success <=> result == desired.
 *   wait(keys)  / wait(keys, timeout) -> awaitable<void>       until all exist; store_timeout
 *   check(keys)                     -> awaitable<bool>         all exist now
 *   delete_key(key)                 -> awaitable<bool>         whether it existed
 *   num_keys()                      -> awaitable<int64_t>
 *   timeout() / set_timeout(ms)                                the default for get and wait
 * It promises: a wait is answered the moment its keys exist (push, never polling); a timeout
 * leaves no registration behind; ADD stores decimal ASCII and rejects a non-numeric value with
 * store_error.
 */
template <class S>
concept store = requires(S& s, const S& cs, std::string key, std::string value, std::vector<std::string> keys,
                         std::int64_t delta, std::chrono::milliseconds timeout) {
    { s.set(key, value) } -> std::same_as<asio::awaitable<void>>;
    { s.get(key) } -> std::same_as<asio::awaitable<std::string>>;
    { s.add(key, delta) } -> std::same_as<asio::awaitable<std::int64_t>>;
    { s.compare_set(key, value, value) } -> std::same_as<asio::awaitable<std::string>>;
    { s.wait(keys) } -> std::same_as<asio::awaitable<void>>;
    { s.wait(keys, timeout) } -> std::same_as<asio::awaitable<void>>;
    { s.check(keys) } -> std::same_as<asio::awaitable<bool>>;
    { s.delete_key(key) } -> std::same_as<asio::awaitable<bool>>;
    { s.num_keys() } -> std::same_as<asio::awaitable<std::int64_t>>;
    { cs.timeout() } -> std::convertible_to<std::chrono::milliseconds>;
    s.set_timeout(timeout);
};

/*
 * multi_key_store: a store with PyTorch >= 2.0's batch operations.
 *   multi_get(keys)           -> awaitable<std::vector<std::string>>  waits for all, then reads
 *   multi_set(keys, values)   -> awaitable<void>   each like set; store_error on size mismatch
 *   append(key, value)        -> awaitable<void>   concatenate or create; wakes waiters
 */
// clang-format off
template <class S>
concept multi_key_store =
    store<S> && requires(S& s, std::string key, std::string value, std::vector<std::string> keys,
                         std::vector<std::string> values) {
        { s.multi_get(keys) } -> std::same_as<asio::awaitable<std::vector<std::string>>>;
        { s.multi_set(keys, values) } -> std::same_as<asio::awaitable<void>>;
        { s.append(key, value) } -> std::same_as<asio::awaitable<void>>;
    // clang-format on
};

}  // namespace elastic::inline v0
