// SPDX-License-Identifier: MIT
// The store's semantics in one place: the key table, waiters woken by push, and watchers. The
// in-memory store and the TCP server are both front-ends to this engine.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/store/errors.hpp"

#include "elastic/detail/format.hpp"

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ranges>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace elastic::inline v0::detail::store {

// Heterogeneous lookup: find a std::string key with a std::string_view, no temporary string.
struct store_string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

/// Someone waiting for keys to exist. The engine calls `on_ready` exactly once, when the last
/// awaited key has been written, after it has forgotten the waiter; `on_ready` may destroy the
/// waiter but must not call back into the engine or destroy other waiters: it only schedules
/// (posts a wake-up, queues a reply). A waiter that is destroyed while registered must first be
/// `cancel`ed.
class store_waiter {
public:
    store_waiter() = default;
    store_waiter(const store_waiter&) = delete;
    store_waiter& operator=(const store_waiter&) = delete;

    /// Whether the waiter is registered (some awaited key is still missing).
    bool registered() const noexcept { return pending_ != 0; }

protected:
    ~store_waiter() = default;

private:
    friend class store_engine;
    virtual void on_ready() = 0;

    std::size_t pending_ = 0;        // registrations not yet consumed by a write
    std::vector<std::string> keys_;  // where it is registered, for cancel
};

/// What happened to a watched key (PyTorch 1.13's WATCH_KEY notifications).
enum class store_change : std::uint8_t { updated = 0, created = 1, deleted = 2, appended = 4 };

/// Someone told of every change to a key (legacy WATCH_KEY). Same rules as `store_waiter`:
/// `on_change` only schedules; a watcher is `unwatch`ed before it is destroyed.
class store_watcher {
public:
    store_watcher() = default;
    store_watcher(const store_watcher&) = delete;
    store_watcher& operator=(const store_watcher&) = delete;

protected:
    ~store_watcher() = default;

private:
    friend class store_engine;
    virtual void on_change(store_change change, std::string_view key, std::string_view old_value,
                           std::string_view new_value) = 0;
};

/// The key table with PyTorch's semantics (the libuv server's, where it improved on the legacy
/// one). Keys and values are bytes held in std::string. Not thread-safe: use it from one thread
/// (the io_context's). Every write that creates a key wakes the waiters of that key by a direct
/// call: no timer, no polling.
class store_engine {
public:
    store_engine() = default;
    store_engine(const store_engine&) = delete;
    store_engine& operator=(const store_engine&) = delete;

    /// The value of `key`, or null when absent. Valid until the next write.
    ELASTIC_DECL const std::string* find(std::string_view key) const;

    /// Sets `key` to `value` (overwrites) and wakes its waiters.
    ELASTIC_DECL void set(std::string_view key, std::string_view value);
    /// Sets `key`, taking the value's storage.
    ELASTIC_DECL void set(std::string_view key, std::string&& value);

    /// Appends to `key`'s value, creating it when absent; wakes its waiters.
    ELASTIC_DECL void append(std::string_view key, std::string_view value);

    /// Adds `delta` to the decimal integer at `key` (absent counts as 0), stores the result as
    /// decimal ASCII like PyTorch (`std::to_string`), wakes waiters and returns it. Throws
    /// store_error, leaving the value as it was, when the value is not a decimal int64 or the sum
    /// overflows.
    ELASTIC_DECL std::int64_t add(std::string_view key, std::int64_t delta);

    /// PyTorch's compare-and-set: absent and `expected` empty -> create with `desired`; absent
    /// and `expected` non-empty -> write nothing, return `expected`; present and equal to
    /// `expected` -> replace with `desired`; present and different -> return the current value.
    /// Returns the value now stored (or `expected` in the second case); the view is valid until
    /// the next write or as long as the arguments. Creating a key wakes its waiters (the libuv
    /// server does; 1.13 did not).
    ELASTIC_DECL std::string_view compare_set(std::string_view key, std::string_view expected,
                                              std::string_view desired);

    /// Removes `key`; true when it existed. Waiters are untouched (they wait for missing keys).
    ELASTIC_DECL bool erase(std::string_view key);

    /// Whether every key exists.
    template <std::ranges::input_range R>
    bool check(const R& keys) const {
        for (const auto& k : keys)
            if (!table_.contains(std::string_view(k))) return false;
        return true;
    }

    /// The number of keys.
    std::size_t size() const noexcept { return table_.size(); }

    /// Bytes the engine holds for keys, values and awaited keys, counted as their lengths plus
    /// a fixed overhead per entry (the hash node and the string headers). Not the allocator's
    /// exact figure, but it grows and shrinks with every entry, which is what a memory limit
    /// needs (store_server_options::max_memory).
    std::size_t bytes() const noexcept { return table_bytes_ + waiter_bytes_ + watcher_bytes_; }

    /// Bytes that writing `value_size` bytes under `key` would add (0 when it would not grow).
    ELASTIC_DECL std::size_t growth(std::string_view key, std::size_t value_size) const;

    /// What one entry of `key_size` and `value_size` bytes is counted as.
    static constexpr std::size_t entry_bytes(std::size_t key_size, std::size_t value_size) {
        return key_size + value_size + entry_overhead;
    }
    /// What one awaited key is counted as (the engine keeps it twice: in its index and in the
    /// waiter's own list, for cancel).
    static constexpr std::size_t awaited_bytes(std::size_t key_size) { return 2 * key_size + entry_overhead; }

    /// Calls `f(key, value)` for every entry.
    template <class F>
    void for_each(F&& f) const {
        for (const auto& [k, v] : table_) f(std::string_view(k), std::string_view(v));
    }

    /// Registers `w` for the missing ones among `keys`. Returns true (registering nothing) when
    /// all exist already; otherwise `w.on_ready()` runs when the last one is written. `w` must
    /// not be registered already.
    template <std::ranges::input_range R>
    bool wait(store_waiter& w, const R& keys) {
        for (const auto& k : keys) {
            const std::string_view key(k);
            if (table_.contains(key)) continue;
            auto it = waiters_.find(key);
            if (it == waiters_.end()) it = waiters_.emplace(std::string(key), waiter_list{}).first;
            it->second.push_back(&w);
            w.keys_.emplace_back(key);
            ++w.pending_;
            waiter_bytes_ += awaited_bytes(key.size());
        }
        return w.pending_ == 0;
    }

    /// Forgets `w` wherever it is registered (a timeout, CANCEL_WAIT, a closed connection).
    /// Harmless when it is not registered.
    ELASTIC_DECL void cancel(store_waiter& w) noexcept;

    /// The number of keys someone waits for (for tests and metrics).
    std::size_t awaited_keys() const noexcept { return waiters_.size(); }

    /// Tells `w` of every later change of `key` until `unwatch`. Watching a key twice is
    /// watching it once. Returns whether this registered anything new.
    ELASTIC_DECL bool watch(store_watcher& w, std::string_view key);

    /// What watching `key` may add (for a memory limit checked before the call).
    static constexpr std::size_t watch_bytes(std::size_t key_size) {
        return entry_bytes(key_size, 0) + sizeof(store_watcher*);
    }

    /// Stops every watch of `w`.
    ELASTIC_DECL void unwatch(store_watcher& w) noexcept;

    /// A key shown in a message: printable ASCII as is, other bytes as \xNN, long keys cut.
    static ELASTIC_DECL std::string printable(std::string_view key);

private:
    using waiter_list = std::vector<store_waiter*>;
    using watcher_list = std::vector<store_watcher*>;

    static ELASTIC_DECL std::int64_t parse_int(std::string_view key, const std::string& v);

    // Applies `mutate(value, created)` to the entry of `key` (creating it), then tells watchers
    // and wakes waiters. Waiters only exist for keys that were absent, so only a creation can
    // wake anyone; the list is moved out before the calls, so on_ready may free its waiter.
    template <class Mutate>
    void write(std::string_view key, Mutate&& mutate, store_change change) {
        auto it = table_.find(key);
        const bool created = it == table_.end();
        const auto watched = watchers_.find(key);
        std::string old;
        if (watched != watchers_.end() && !created) old = it->second;
        if (created) {
            it = table_.emplace(std::string(key), std::string{}).first;
            table_bytes_ += entry_bytes(key.size(), 0);
        }
        const std::size_t before = it->second.size();
        mutate(it->second, created);
        table_bytes_ += it->second.size();
        table_bytes_ -= before;
        if (watched != watchers_.end()) {
            const auto kind = created ? store_change::created : change;
            for (auto* w : watched->second) w->on_change(kind, key, old, it->second);
        }
        if (created) wake(key);
    }

    ELASTIC_DECL void wake(std::string_view key);

    std::unordered_map<std::string, std::string, store_string_hash, std::equal_to<>> table_;
    std::unordered_map<std::string, waiter_list, store_string_hash, std::equal_to<>> waiters_;
    std::unordered_map<std::string, watcher_list, store_string_hash, std::equal_to<>> watchers_;
    std::size_t table_bytes_ = 0;    // entry_bytes of every key and value
    std::size_t waiter_bytes_ = 0;   // awaited_bytes of every registration not yet consumed
    std::size_t watcher_bytes_ = 0;  // watched keys and their registrations

    static constexpr std::size_t entry_overhead = 64;
};

}  // namespace elastic::inline v0::detail::store

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::store {

ELASTIC_DECL const std::string* store_engine::find(std::string_view key) const {
    const auto it = table_.find(key);
    return it == table_.end() ? nullptr : &it->second;
}

ELASTIC_DECL void store_engine::set(std::string_view key, std::string_view value) {
    write(
        key, [&](std::string& v, bool) { v.assign(value); }, store_change::updated);
}

ELASTIC_DECL void store_engine::set(std::string_view key, std::string&& value) {
    write(
        key, [&](std::string& v, bool) { v = std::move(value); }, store_change::updated);
}

ELASTIC_DECL void store_engine::append(std::string_view key, std::string_view value) {
    write(
        key, [&](std::string& v, bool) { v.append(value); }, store_change::appended);
}

ELASTIC_DECL std::int64_t store_engine::add(std::string_view key, std::int64_t delta) {
    std::int64_t current = 0;
    if (const auto* v = find(key)) current = parse_int(key, *v);
    std::int64_t sum = 0;
    if (__builtin_add_overflow(current, delta, &sum))
        throw store_error(detail::format("ADD {} to key '{}' holding {} overflows a 64-bit "
                                         "integer",
                                         delta, printable(key), current));
    char digits[24];
    const auto res = std::to_chars(digits, digits + sizeof digits, sum);
    const std::string_view text(digits, static_cast<std::size_t>(res.ptr - digits));
    write(
        key, [&](std::string& v, bool) { v.assign(text); }, store_change::updated);
    return sum;
}

ELASTIC_DECL std::string_view store_engine::compare_set(std::string_view key, std::string_view expected,
                                                        std::string_view desired) {
    const auto it = table_.find(key);
    if (it == table_.end()) {
        if (!expected.empty()) return expected;
    } else if (it->second != expected) {
        return it->second;
    }
    write(
        key, [&](std::string& v, bool) { v.assign(desired); }, store_change::updated);
    return *find(key);
}

ELASTIC_DECL bool store_engine::erase(std::string_view key) {
    const auto it = table_.find(key);
    if (it == table_.end()) return false;
    table_bytes_ -= entry_bytes(it->first.size(), it->second.size());
    if (const auto w = watchers_.find(key); w != watchers_.end()) {
        const std::string old = std::move(it->second);
        table_.erase(it);
        for (auto* watcher : w->second) watcher->on_change(store_change::deleted, key, old, {});
        return true;
    }
    table_.erase(it);
    return true;
}

ELASTIC_DECL std::size_t store_engine::growth(std::string_view key, std::size_t value_size) const {
    const auto* v = find(key);
    if (!v) return entry_bytes(key.size(), value_size);
    return value_size > v->size() ? value_size - v->size() : 0;
}

ELASTIC_DECL void store_engine::cancel(store_waiter& w) noexcept {
    for (const auto& k : w.keys_) {
        const auto it = waiters_.find(std::string_view(k));
        if (it == waiters_.end()) continue;
        auto& list = it->second;
        waiter_bytes_ -= std::erase(list, &w) * awaited_bytes(k.size());
        if (list.empty()) waiters_.erase(it);
    }
    w.keys_.clear();
    w.pending_ = 0;
}

ELASTIC_DECL bool store_engine::watch(store_watcher& w, std::string_view key) {
    auto it = watchers_.find(key);
    if (it == watchers_.end()) {
        it = watchers_.emplace(std::string(key), watcher_list{}).first;
        watcher_bytes_ += entry_bytes(key.size(), 0);
    } else if (std::ranges::find(it->second, &w) != it->second.end()) {
        return false;
    }
    it->second.push_back(&w);
    watcher_bytes_ += sizeof(store_watcher*);
    return true;
}

ELASTIC_DECL void store_engine::unwatch(store_watcher& w) noexcept {
    for (auto it = watchers_.begin(); it != watchers_.end();) {
        watcher_bytes_ -= std::erase(it->second, &w) * sizeof(store_watcher*);
        if (it->second.empty()) {
            watcher_bytes_ -= entry_bytes(it->first.size(), 0);
            it = watchers_.erase(it);
        } else {
            it = std::next(it);
        }
    }
}

ELASTIC_DECL std::string store_engine::printable(std::string_view key) {
    std::string out;
    for (const char c : key.substr(0, 200)) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u < 0x7f && u != '\\') out.push_back(c);
        else out += detail::format("\\x{:02x}", u);
    }
    if (key.size() > 200) out += detail::format("...({} bytes)", key.size());
    return out;
}

ELASTIC_DECL std::int64_t store_engine::parse_int(std::string_view key, const std::string& v) {
    std::int64_t n = 0;
    const auto* first = v.data();
    const auto* last = v.data() + v.size();
    const auto res = std::from_chars(first, last, n);
    if (v.empty() || res.ec != std::errc{} || res.ptr != last)
        throw store_error(detail::format("ADD on key '{}' whose value '{}' is not a decimal "
                                         "64-bit integer; ADD needs a counter written by ADD",
                                         printable(key), printable(v)));
    return n;
}

ELASTIC_DECL void store_engine::wake(std::string_view key) {
    const auto it = waiters_.find(key);
    if (it == waiters_.end()) return;
    waiter_list list = std::move(it->second);
    waiters_.erase(it);
    waiter_bytes_ -= list.size() * awaited_bytes(key.size());
    for (auto* w : list) {
        // A waiter listed twice under this key (WAIT [k, k]) counts twice; it is ready at
        // its last registration, after which no list holds it any more.
        if (--w->pending_ == 0) {
            w->keys_.clear();
            w->on_ready();
        }
    }
}

}  // namespace elastic::inline v0::detail::store

#endif  // ELASTIC_DETAIL_BODIES
