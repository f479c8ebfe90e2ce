// SPDX-License-Identifier: MIT
// prefix_store: a view of another store whose keys all start with "<prefix>/" (PyTorch's
// PrefixStore).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/store/concepts.hpp"

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// Every key goes to the inner store as `prefix + "/" + key`, as PyTorch's PrefixStore joins
/// them, so Python and native workers sharing a prefix see the same keys. Nested prefixes nest
/// ("b" over "a" gives "a/b/key"). `num_keys` counts the inner store's keys, as PyTorch does.
/// The inner store must outlive the prefix store.
template <store Inner>
class prefix_store {
public:
    /// A view of `inner` under `prefix`.
    prefix_store(std::string prefix, Inner& inner) : prefix_(std::move(prefix)), inner_(&inner) {}

    /// The prefix (without the joining '/').
    const std::string& prefix() const noexcept { return prefix_; }
    /// The store underneath.
    Inner& inner() const noexcept { return *inner_; }

    /// The inner store's key for `key`.
    std::string join(std::string_view key) const {
        std::string out;
        out.reserve(prefix_.size() + 1 + key.size());
        out.append(prefix_).push_back('/');
        out.append(key);
        return out;
    }

    std::chrono::milliseconds timeout() const { return inner_->timeout(); }
    void set_timeout(std::chrono::milliseconds t) { inner_->set_timeout(t); }

    asio::awaitable<void> set(std::string key, std::string value) { return inner_->set(join(key), std::move(value)); }
    asio::awaitable<std::string> get(std::string key) { return inner_->get(join(key)); }
    asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta) { return inner_->add(join(key), delta); }
    asio::awaitable<std::string> compare_set(std::string key, std::string expected, std::string desired) {
        return inner_->compare_set(join(key), std::move(expected), std::move(desired));
    }
    asio::awaitable<void> wait(std::vector<std::string> keys) { return inner_->wait(join_all(std::move(keys))); }
    asio::awaitable<void> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
        return inner_->wait(join_all(std::move(keys)), timeout);
    }
    asio::awaitable<bool> check(std::vector<std::string> keys) { return inner_->check(join_all(std::move(keys))); }
    asio::awaitable<bool> delete_key(std::string key) { return inner_->delete_key(join(key)); }
    asio::awaitable<std::int64_t> num_keys() { return inner_->num_keys(); }

    // clang-format off
    asio::awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys)
        requires multi_key_store<Inner>
    {
        return inner_->multi_get(join_all(std::move(keys)));
    }
    asio::awaitable<void> multi_set(std::vector<std::string> keys, std::vector<std::string> values)
        requires multi_key_store<Inner>
    {
        return inner_->multi_set(join_all(std::move(keys)), std::move(values));
    }
    asio::awaitable<void> append(std::string key, std::string value)
        requires multi_key_store<Inner>
    {
        return inner_->append(join(key), std::move(value));
    }
    // clang-format on

private:
    std::vector<std::string> join_all(std::vector<std::string> keys) const {
        for (auto& k : keys) k = join(k);
        return keys;
    }

    std::string prefix_;
    Inner* inner_;
};

}  // namespace elastic::inline v0
