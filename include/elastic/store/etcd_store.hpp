// SPDX-License-Identifier: MIT
// etcd_store: the store concept over an etcd cluster's v3 API — every key under a prefix, waits
// by watch, counters and compare-and-set by transaction, and leases that etcd keeps alive and
// expires, with the loss records (`__epoch`, `__lost/<n>`) the store's leases promise.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/random.hpp"
#include "elastic/store/errors.hpp"
#include "elastic/store/etcd_client.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace elastic::inline v0 {

/// How an etcd_store keeps its keys and leases.
struct etcd_store_options {
    /// Every key of the store is this prefix and the key in etcd.
    std::string prefix = "/elastic/";
    /// The default timeout of get and wait.
    std::chrono::milliseconds timeout{std::chrono::seconds(300)};
    /// How often a held lease is renewed, and how many renewals may fail in a row before it is
    /// taken for lost: etcd expires it after interval x max_attempt (at least 2 s, whole seconds).
    std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(1)};
    int keep_alive_max_attempt = 5;
};

namespace detail::etcd {
struct lease_state;
}  // namespace detail::etcd

/// A store (store.hpp's concept, with multi_key_store's batch operations) over etcd: the key k
/// is `prefix + k` in etcd. Waits are watches (push, no polling); `add`, `compare_set` and
/// `append` are transactions that compare the key's revision, so concurrent writers never lose
/// an update. Several etcd_store objects may share one etcd_client (one per coroutine that
/// waits at the same time keeps the waits apart, as with a TCP store client).
///
/// Leases (hold_lease, the keys `<group>/__lease__/<name>`): the key is bound to an etcd lease
/// of keep_alive_interval x keep_alive_max_attempt, renewed every keep_alive_interval. When
/// etcd expires it (its holder died or was cut off) or its holder revokes it, etcd deletes the
/// key, and the store holders of the group record the loss as the TCP store's server does:
/// `__epoch` counts the losses and `__lost/<n>` names the n-th, written once by whichever holder
/// sees it first (a transaction). `__silent` stays 0: etcd's quorum decides who holds a lease,
/// so a holder cut off from it cannot go on beside the others. Once this store's own lease is
/// lost (etcd says it expired, or no member renewed it in time), every operation of this store
/// throws store_error saying so, and the waits in progress end with it.
class etcd_store {
public:
    ELASTIC_DECL etcd_store(std::shared_ptr<etcd_client> client, etcd_store_options options = {});
    ELASTIC_DECL ~etcd_store();
    etcd_store(const etcd_store&) = delete;
    etcd_store& operator=(const etcd_store&) = delete;

    ELASTIC_DECL asio::awaitable<void> set(std::string key, std::string value);
    ELASTIC_DECL asio::awaitable<std::string> get(std::string key);
    ELASTIC_DECL asio::awaitable<std::int64_t> add(std::string key, std::int64_t delta);
    ELASTIC_DECL asio::awaitable<std::string> compare_set(std::string key, std::string expected, std::string desired);
    ELASTIC_DECL asio::awaitable<void> wait(std::vector<std::string> keys);
    ELASTIC_DECL asio::awaitable<void> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout);
    ELASTIC_DECL asio::awaitable<bool> check(std::vector<std::string> keys);
    ELASTIC_DECL asio::awaitable<bool> delete_key(std::string key);
    ELASTIC_DECL asio::awaitable<std::int64_t> num_keys();
    ELASTIC_DECL asio::awaitable<std::vector<std::string>> multi_get(std::vector<std::string> keys);
    ELASTIC_DECL asio::awaitable<void> multi_set(std::vector<std::string> keys, std::vector<std::string> values);
    ELASTIC_DECL asio::awaitable<void> append(std::string key, std::string value);

    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return options_.timeout; }
    void set_timeout(std::chrono::milliseconds t) noexcept { options_.timeout = t; }

    /// Binds `key` (a lease key: lease_key(group, name)) to a new etcd lease of this store and
    /// sets it to `value`; the lease is renewed until release_lease(), close() or its loss. One
    /// lease per store. Creates the group's `__epoch` and `__silent` ("0") when absent.
    ELASTIC_DECL asio::awaitable<void> hold_lease(std::string key, std::string value);
    /// Revokes the held lease (etcd deletes its key; the group records the loss); false when
    /// this store holds none.
    ELASTIC_DECL asio::awaitable<bool> release_lease();
    /// Why this store's lease was lost, or empty while it is held (or none is).
    [[nodiscard]] ELASTIC_DECL std::string lease_lost() const;
    /// The etcd lease id held (0: none).
    [[nodiscard]] ELASTIC_DECL std::int64_t lease_id() const noexcept;

    /// Stops renewing the lease (etcd expires it) and observing the group. Operations started
    /// later still run.
    ELASTIC_DECL void close() noexcept;

    [[nodiscard]] etcd_client& client() noexcept { return *client_; }
    [[nodiscard]] const etcd_store_options& options() const noexcept { return options_; }

private:
    [[nodiscard]] std::string full(const std::string& key) const { return options_.prefix + key; }
    asio::awaitable<void> wait_until(std::vector<std::string> keys, std::chrono::milliseconds timeout);
    /// Replaces the value of `key` by `make(current)` (nothing: absent) in a transaction that
    /// compares the key's revision; returns the value written. A transaction whose fate is
    /// unknown is settled by this store's receipt, written in the same transaction. `counting`:
    /// the value is a counter (written as one); `increment`: add 1 by a put that keeps the
    /// value when the key holds a counter.
    asio::awaitable<std::string> replace(const std::string& key,
                                         std::string (*make)(const std::optional<std::string>&, const std::string&),
                                         std::string argument, bool keep_existing_unchanged, bool counting,
                                         bool increment);
    /// The value that `receipt`, written by an attempt of this store's call `seq`, says the
    /// call wrote. `increment`: the call may have raised a counter.
    asio::awaitable<std::string> settled(const std::string& key, const std::string& seq, const etcd_kv& receipt,
                                         bool increment);

    std::shared_ptr<etcd_client> client_;
    etcd_store_options options_;
    std::shared_ptr<detail::etcd::lease_state> lease_;
    std::string receipt_key_;  ///< "/.elastic-receipts/<random>": outside every store's prefix
    std::uint64_t receipt_seq_ = 0;
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

#include "elastic/detail/coro.hpp"
#include "elastic/store/lease.hpp"

#include <asio/cancellation_type.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/error.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include "elastic/detail/format.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

namespace elastic::inline v0 {
namespace detail::etcd {

/// etcd refuses a transaction of more operations than --max-txn-ops (128 by default).
inline constexpr std::size_t max_txn_ops = 128;
/// The loss records a group keeps (`__lost/<n>`): older ones are erased as the TCP server does.
inline constexpr std::int64_t lost_records_kept = 1024;
/// A watch is read again from scratch this often, whatever its connection says.
inline constexpr std::chrono::seconds rewatch{60};
/// How long a receipt lives (a receipt settles a transaction whose answer was lost).
inline constexpr std::int64_t receipt_ttl = 600;

/// What a lease-holding store shares with its renewal and observer tasks.
struct lease_state {
    explicit lease_state(asio::any_io_executor ex) : wake(ex), changed(ex) {}
    std::int64_t id = 0;
    std::int64_t ttl = 0;  ///< seconds, as etcd granted it
    std::string key;       ///< the lease key in etcd (prefixed)
    std::string space;     ///< its group's lease space in etcd ("<prefix><group>/__lease__/")
    std::string name;      ///< the lease's name
    std::string lost;      ///< why it was lost (empty: held)
    bool stopped = false;
    asio::steady_timer wake;       ///< the renewal task's sleep; cancelled to stop
    detail::async_signal changed;  ///< notified when the lease is lost or its store stops
};

inline std::optional<std::int64_t> decimal(std::string_view text) {
    std::int64_t v = 0;
    if (text.empty()) return std::nullopt;
    const auto* first = text.data() + (text.front() == '+' ? 1 : 0);
    const auto* last = text.data() + text.size();
    const auto [end, ec] = std::from_chars(first, last, v);
    if (ec != std::errc{} || end != last) return std::nullopt;
    return v;
}

/// Completes at the next change of `l`; throws operation_aborted once cancelled, so that no loop
/// over it spins on a cancelled wait.
inline asio::awaitable<void> next_change(std::shared_ptr<lease_state> l) {
    co_await l->changed.wait();
    const auto state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none) {
        throw std::system_error(asio::error::operation_aborted, "lease wait cancelled");
    }
}

/// Completes once the lease is lost.
inline asio::awaitable<void> lost(std::shared_ptr<lease_state> l) {
    while (l->lost.empty()) co_await next_change(l);
}

/// Completes once the lease is lost or its store stopped.
inline asio::awaitable<void> ended(std::shared_ptr<lease_state> l) {
    while (l->lost.empty() && !l->stopped) co_await next_change(l);
}

/// Runs `op`; once the lease `l` (when any) is lost, ends it with store_error saying so.
template <class T>
asio::awaitable<T> unless_lease_lost(const std::shared_ptr<lease_state>& l, asio::awaitable<T> op) {
    using namespace asio::experimental::awaitable_operators;
    if (!l) co_return co_await std::move(op);
    if (!l->lost.empty()) throw store_error(l->lost);
    auto raced = co_await (detail::settle(std::move(op)) || lost(l));
    if (raced.index() == 1) throw store_error(l->lost);
    if constexpr (std::is_void_v<T>) {
        std::get<0>(raced).take();
    } else {
        co_return std::get<0>(std::move(raced)).take();
    }
}

/// Runs `op` until the lease is lost or its store stopped; nothing when it ended that way.
template <class T>
asio::awaitable<std::optional<detail::settled<std::conditional_t<std::is_void_v<T>, std::monostate, T>>>> while_held(
    std::shared_ptr<lease_state> l, asio::awaitable<T> op) {
    using namespace asio::experimental::awaitable_operators;
    auto raced = co_await (detail::settle(std::move(op)) || ended(l));
    if (raced.index() == 1) co_return std::nullopt;
    co_return std::get<0>(std::move(raced));
}

/// The next message of `w` within `d`, or nothing when none came (read the keys again).
inline asio::awaitable<std::optional<etcd_watch_batch>> next_within(etcd_watch& w, std::chrono::milliseconds d) {
    using namespace asio::experimental::awaitable_operators;
    asio::steady_timer timer(co_await asio::this_coro::executor, d);
    auto raced = co_await (detail::settle(w.next()) || timer.async_wait(asio::use_awaitable));
    if (raced.index() == 1) co_return std::nullopt;
    co_return std::get<0>(std::move(raced)).take();
}

inline void lose(lease_state& l, std::string why) {
    if (!l.lost.empty()) return;
    l.lost = std::move(why);
    l.changed.notify();
}

/// Renews the lease every interval, each renewal bounded by the interval and by the lease's end
/// (the last renewal etcd confirmed, counted from when it was sent, plus the TTL); records its
/// loss when etcd says it is gone, or when no renewal succeeded before that end.
inline asio::awaitable<void> keep_alive(std::shared_ptr<lease_state> l, std::shared_ptr<etcd_client> client,
                                        std::chrono::milliseconds interval) {
    auto ends = clock::now() + std::chrono::seconds(l->ttl);
    while (!l->stopped && l->lost.empty()) {
        l->wake.expires_after(interval);
        std::error_code ec;
        co_await l->wake.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        if (l->stopped) co_return;
        const auto sent = clock::now();
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(ends - sent);
        std::string failed;
        std::int64_t ttl = -1;
        if (left.count() > 0) {
            const auto within = std::max(std::chrono::milliseconds(100), std::min(interval, left));
            auto renewed = co_await while_held(l, client->lease_keepalive(l->id, within));
            if (!renewed || l->stopped) co_return;
            try {
                ttl = renewed->take();
            } catch (const std::exception& e) {
                failed = e.what();
            }
        }
        if (failed.empty() && ttl == 0) {
            lose(*l, detail::format("etcd expired this node's lease '{}' (id {}): no renewal reached it within its TTL "
                                    "of {} s (this agent was stopped, starved of CPU, or cut off from etcd)",
                                    l->name, l->id, l->ttl));
            co_return;
        }
        if (failed.empty() && ttl > 0) {
            ends = sent + std::chrono::seconds(ttl);
            continue;
        }
        if (clock::now() >= ends) {
            lose(*l, detail::format("no etcd member renewed this node's lease '{}' within its TTL of {} s, so etcd has "
                                    "expired it or cannot keep it{}{}",
                                    l->name, l->ttl, failed.empty() ? "" : ": ", failed));
            co_return;
        }
    }
}

/// Records the loss of lease `name` of the group at `space` unless it is held or recorded: one
/// transaction that only one recorder wins (it compares the registration and the counter).
inline asio::awaitable<void> record_loss(etcd_client& client, std::string space, std::string name) {
    const auto held_key = space + "__held/" + name;
    const auto epoch_key = space + "__epoch";
    for (int attempt = 0; attempt < 64; ++attempt) {
        std::vector<etcd_request> reads{etcd_request::range(held_key), etcd_request::range(space + name),
                                        etcd_request::range(epoch_key)};
        auto now = co_await client.txn({}, std::move(reads));
        if (now.responses.size() != 3 || now.responses[0].kvs.empty()) co_return;  // not registered, or recorded
        const auto& held = now.responses[0].kvs.front();
        const auto& lease = now.responses[1].kvs;
        if (!lease.empty() && std::to_string(lease.front().lease) == held.value) co_return;  // still held
        std::int64_t epoch = 0;
        std::int64_t epoch_mod = 0;
        if (!now.responses[2].kvs.empty()) {
            epoch = decimal(now.responses[2].kvs.front().value).value_or(0);
            epoch_mod = now.responses[2].kvs.front().mod_revision;
        }
        std::vector<etcd_compare> guard{
            {held_key, etcd_compare::target::mod, etcd_compare::result::equal, held.mod_revision, {}, {}},
            {epoch_key, etcd_compare::target::mod, etcd_compare::result::equal, epoch_mod, {}, {}}};
        std::vector<etcd_request> writes{etcd_request::erase(held_key),
                                         etcd_request::put(epoch_key, std::to_string(epoch + 1)),
                                         etcd_request::put(space + "__lost/" + std::to_string(epoch + 1), name)};
        if (epoch + 1 > lost_records_kept) {
            writes.push_back(etcd_request::erase(space + "__lost/" + std::to_string(epoch + 1 - lost_records_kept)));
        }
        bool done = false;
        try {
            done = (co_await client.txn(std::move(guard), std::move(writes))).succeeded;
        } catch (const etcd_error& e) {
            if (!e.ambiguous()) throw;  // applied or not: the next reading tells
        }
        if (done) co_return;
    }
}

/// A read that counts the keys in [from, to).
inline etcd_request counted(std::string from, std::string to) {
    auto r = etcd_request::range(std::move(from), std::move(to));
    r.count_only = true;
    return r;
}

/// Every registration of the group whose lease is gone, recorded; returns the revision read.
/// A count of the registrations and the lease keys first; when they differ, one read of the
/// whole lease space, and a transaction for each registration whose lease key is missing or
/// bound to another lease.
inline asio::awaitable<std::int64_t> record_all(etcd_client& client, const std::string& space) {
    const auto held_space = space + "__held/";
    // While every node lives, each registration has its lease key: three counts in one read
    // tell so, and the space (two keys per node, read by every node) is read only otherwise.
    std::vector<etcd_request> counts{counted(space, space + "__"), counted(space + "_`", etcd_prefix_end(space)),
                                     counted(held_space, etcd_prefix_end(held_space))};
    const auto now = co_await client.txn({}, std::move(counts));
    if (now.responses.size() == 3 && now.responses[0].count + now.responses[1].count == now.responses[2].count) {
        co_return now.revision;
    }
    auto all = co_await client.range(space, etcd_prefix_end(space));
    std::map<std::string, std::int64_t, std::less<>> leases;
    std::vector<std::pair<std::string, std::string>> held;  // name, lease id registered
    for (auto& kv : all.kvs) {
        auto name = kv.key.substr(space.size());
        if (name.rfind("__held/", 0) == 0) held.emplace_back(name.substr(7), std::move(kv.value));
        else if (name.rfind("__", 0) != 0) leases.emplace(std::move(name), kv.lease);
    }
    for (const auto& [name, id] : held) {
        const auto lease = leases.find(name);
        if (lease != leases.end() && std::to_string(lease->second) == id) continue;  // held
        co_await record_loss(client, space, name);
    }
    co_return all.revision;
}

/// Records the losses of the group from its registrations, then each deletion of a lease key
/// (an expiry, a revoke) as it comes, for at most `rewatch`.
inline asio::awaitable<void> observe_once(std::shared_ptr<lease_state> l, std::shared_ptr<etcd_client> client) {
    const auto revision = co_await record_all(*client, l->space);
    // Deletions alone: every node's registration is a put the others need not hear of.
    auto w = co_await client->watch(l->space, etcd_prefix_end(l->space), revision + 1, false, true);
    for (;;) {
        auto batch = co_await next_within(w, rewatch);
        if (!batch || batch->canceled) co_return;
        for (const auto& e : batch->events) {
            if (!e.deleted) continue;
            const auto name = e.kv.key.substr(l->space.size());
            if (name.empty() || name.substr(0, 2) == "__") continue;
            co_await record_loss(*client, l->space, name);
        }
    }
}

/// Observes the group's lease keys for as long as the lease is held (observe_once, again and
/// again; a pause after a failure: a member went away, or the cluster has no quorum, and the
/// renewal decides the lease's fate).
inline asio::awaitable<void> observe(std::shared_ptr<lease_state> l, std::shared_ptr<etcd_client> client,
                                     std::chrono::milliseconds retry) {
    while (!l->stopped && l->lost.empty()) {
        auto once = co_await while_held(l, observe_once(l, client));
        if (!once) co_return;
        bool failed = false;
        try {
            once->take();
        } catch (const std::exception&) {
            failed = true;
        }
        if (!failed) continue;
        asio::steady_timer pause(co_await asio::this_coro::executor, retry);
        if (!co_await while_held(l, pause.async_wait(asio::use_awaitable))) co_return;
    }
}

inline std::string shown_keys(const std::vector<std::string>& keys) {
    std::string out;
    for (std::size_t i = 0; i < keys.size() && i < 4; ++i) out += detail::format("{}'{}'", i ? ", " : "", keys[i]);
    if (keys.size() > 4) out += detail::format(" and {} more", keys.size() - 4);
    return out;
}

/// Which of `keys` (prefixed) exist, read in transactions of at most max_txn_ops ranges; the
/// revision of the first read.
inline asio::awaitable<std::pair<std::int64_t, std::vector<bool>>> existing(etcd_client& client,
                                                                            const std::vector<std::string>& keys) {
    std::int64_t revision = 0;
    std::vector<bool> present;
    for (std::size_t at = 0; at < keys.size(); at += max_txn_ops) {
        std::vector<etcd_request> reads;
        for (std::size_t i = at; i < keys.size() && i < at + max_txn_ops; ++i) {
            auto r = etcd_request::range(keys[i]);
            r.count_only = true;
            reads.push_back(std::move(r));
        }
        auto got = co_await client.txn({}, std::move(reads));
        if (revision == 0) revision = got.revision;
        for (const auto& r : got.responses) present.push_back(r.count > 0);
    }
    co_return std::pair{revision, std::move(present)};
}

/// One round of a wait: the keys' presence, then a watch on the first missing one from the
/// revision read, until it is put or `rewatch` passed (false: read every key again); true when
/// every key exists.
inline asio::awaitable<bool> wait_round(std::shared_ptr<etcd_client> c, std::vector<std::string> w) {
    auto [revision, present] = co_await existing(*c, w);
    const auto missing = std::find(present.begin(), present.end(), false);
    if (missing == present.end()) co_return true;
    const auto k = w[static_cast<std::size_t>(missing - present.begin())];
    auto watch = co_await c->watch(k, {}, revision + 1);
    for (;;) {
        auto batch = co_await next_within(watch, rewatch);
        if (!batch || batch->canceled) co_return false;
        for (const auto& e : batch->events) {
            // A wait for one key ends with its put; with several, all are read again (the
            // others may have gone since: a wait is for every key there at once).
            if (!e.deleted && e.kv.key == k) co_return w.size() == 1;
        }
    }
}

/// A counter (a key `add` wrote) is kept as this tag and an offset: its number is the offset
/// plus the key's version, which etcd raises by one at every put. Adding 1 is then a put that
/// keeps the value: one request that never loses a race to the other adders, where a
/// compare-and-set would retry once per adder that came first (quadratic in a crowd).
inline constexpr std::string_view counter_tag = "\x01"
                                                "counter ";
/// Every value that starts with counter_tag lies strictly between these two.
inline constexpr std::string_view counter_floor = "\x01"
                                                  "counter";
inline constexpr std::string_view counter_ceiling = "\x01"
                                                    "counter!";

/// a + b and a - b as two's complement wraps them (a counter added past its range wraps, as
/// PyTorch's store's does; never undefined behaviour).
inline std::int64_t wrapped_sum(std::int64_t a, std::int64_t b) {
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
}
inline std::int64_t wrapped_difference(std::int64_t a, std::int64_t b) {
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) - static_cast<std::uint64_t>(b));
}

/// The value of a counter whose next put will be its version `next_version`.
inline std::string counter_text(std::int64_t value, std::int64_t next_version) {
    return detail::format("{}{}", counter_tag, wrapped_difference(value, next_version));
}

/// A key's value as the store's users see it: a counter's number, anything else as written.
inline std::string shown_value(const etcd_kv& kv) {
    if (kv.value.starts_with(counter_tag)) {
        if (const auto offset = decimal(std::string_view(kv.value).substr(counter_tag.size()))) {
            return std::to_string(wrapped_sum(*offset, kv.version));
        }
    }
    return kv.value;
}

/// The comparisons that hold when `key` holds a counter.
inline std::vector<etcd_compare> is_counter(const std::string& key) {
    return {{key, etcd_compare::target::value, etcd_compare::result::greater, 0, std::string(counter_floor), {}},
            {key, etcd_compare::target::value, etcd_compare::result::less, 0, std::string(counter_ceiling), {}}};
}

inline std::string added(const std::optional<std::string>& current, const std::string& delta) {
    std::int64_t value = 0;
    if (current) {
        const auto parsed = decimal(*current);
        if (!parsed) throw store_error(detail::format("the value is no decimal number ('{}')", current->substr(0, 64)));
        value = *parsed;
    }
    return std::to_string(wrapped_sum(value, *decimal(delta)));
}

/// Refuses a value that would read as a counter, or pass for one (anything from counter_floor).
inline void check_plain(std::string_view key, std::string_view value) {
    if (value.starts_with(counter_floor)) {
        throw store_error(detail::format("'{}': a value that starts with \\x01counter is kept for the store's counters",
                                         key));
    }
}

inline std::string appended(const std::optional<std::string>& current, const std::string& suffix) {
    auto out = current.value_or(std::string()) + suffix;
    if (out.starts_with(counter_floor)) {
        throw store_error("the value would start with \\x01counter, which is kept for the store's counters");
    }
    return out;
}

/// The error of an update whose receipt may be gone: whether it was applied cannot be told.
inline store_error receipt_gone(const std::string& key) {
    return store_error(
        detail::format("'{}': etcd's answer to an update was lost and its receipt may have expired since: "
                       "whether it was applied can no longer be told; check the etcd cluster (and the "
                       "clocks of suspended machines) and start the job again",
                       key));
}

/// The error of an update that ends while an attempt's fate is unknown: it may have been applied.
inline store_error maybe_applied(const std::string& key, std::string_view why) {
    return store_error(detail::format("'{}': {}; an earlier attempt's answer was lost, so the update may have been "
                                      "applied",
                                      key, why));
}

/// Revokes lease `id`; a failure leaves it to expire.
inline asio::awaitable<void> revoke_quietly(std::shared_ptr<etcd_client> client, std::int64_t id) {
    try {
        co_await client->lease_revoke(id);
    } catch (const std::exception&) {
        // It expires by itself.
    }
}

inline std::string random_token() { return detail::format("{:016x}", detail::random_u64()); }

}  // namespace detail::etcd

ELASTIC_DECL etcd_store::etcd_store(std::shared_ptr<etcd_client> client, etcd_store_options options)
    : client_(std::move(client)),
      options_(std::move(options)),
      receipt_key_("/.elastic-receipts/" + detail::etcd::random_token()) {
    if (!client_) throw store_error("etcd_store: no client");
}

ELASTIC_DECL etcd_store::~etcd_store() { close(); }

ELASTIC_DECL void etcd_store::close() noexcept {
    if (lease_) {
        lease_->stopped = true;
        lease_->wake.cancel();
        lease_->changed.notify();
    }
}

ELASTIC_DECL std::string etcd_store::lease_lost() const { return lease_ ? lease_->lost : std::string(); }
ELASTIC_DECL std::int64_t etcd_store::lease_id() const noexcept { return lease_ ? lease_->id : 0; }

ELASTIC_DECL asio::awaitable<void> etcd_store::set(std::string key, std::string value) {
    detail::etcd::check_plain(key, value);
    (void)co_await detail::etcd::unless_lease_lost(lease_, client_->put(full(key), std::move(value)));
}

ELASTIC_DECL asio::awaitable<std::string> etcd_store::get(std::string key) {
    for (;;) {
        // Read first: a key that is there costs one request, not a wait and a read.
        auto got = co_await detail::etcd::unless_lease_lost(lease_, client_->range(full(key)));
        if (!got.kvs.empty()) co_return detail::etcd::shown_value(got.kvs.front());
        std::vector<std::string> keys{key};
        co_await wait(std::move(keys));
    }
}

ELASTIC_DECL asio::awaitable<std::string> etcd_store::settled(const std::string& key, const std::string& seq,
                                                              const etcd_kv& receipt, bool increment) {
    const auto& text = receipt.value;
    if (text.size() <= seq.size() || text.compare(0, seq.size(), seq) != 0 || text[seq.size()] != ' ') {
        throw store_error(detail::format("'{}': the update's receipt in etcd holds what this store never writes", key));
    }
    if (!increment || text.substr(seq.size() + 1) != "@") co_return text.substr(seq.size() + 1);
    // An increment: the counter as it was at the receipt's revision (the same transaction).
    etcd_range_result then;
    try {
        then = co_await detail::etcd::unless_lease_lost(lease_,
                                                        client_->range(full(key), {}, false, receipt.mod_revision));
    } catch (const etcd_error& e) {
        if (e.code() != 11) throw;
        throw store_error(
            detail::format("add('{}'): etcd took the update but its answer was lost, and compaction removed "
                           "the revision that tells the counter's value ({}); the job's counters cannot be "
                           "trusted: start it again",
                           key, e.what()));
    }
    if (then.kvs.empty())
        throw store_error(detail::format("add('{}'): the counter was gone when it was added to", key));
    co_return detail::etcd::shown_value(then.kvs.front());
}

ELASTIC_DECL asio::awaitable<std::string> etcd_store::replace(
    const std::string& key, std::string (*make)(const std::optional<std::string>&, const std::string&),
    std::string argument, bool keep_existing_unchanged, bool counting, bool increment) {
    using detail::etcd::receipt_ttl;
    using clock = std::chrono::steady_clock;
    const auto k = full(key);
    // Every attempt of this call writes the same receipt and compares its absence: one attempt
    // at most is applied, also when etcd applies an attempt whose answer was lost after a later
    // one was sent, and the receipt says what it wrote.
    const auto seq = std::to_string(++receipt_seq_);
    const auto receipt = receipt_key_ + "/" + seq;
    const etcd_compare no_receipt{receipt, etcd_compare::target::create, etcd_compare::result::equal, 0, {}, {}};
    const auto deadline = clock::now() + options_.timeout;
    // When the first attempt whose answer was lost was sent. Its receipt lives at least half the
    // receipts' TTL (the shared lease is replaced at half its TTL); after that, an absent
    // receipt no longer proves the attempt was not applied. A read that says "absent" is
    // trusted only when it returned within that time (less a margin).
    const auto receipt_lives = std::chrono::seconds(receipt_ttl / 2 - 30);
    std::optional<clock::time_point> unsure_since;
    std::optional<std::vector<etcd_kv>> read;  // the key as the last failed attempt read it
    for (;;) {
        if (clock::now() >= deadline) {
            const auto why = detail::format("etcd did not take the update within {} ms", options_.timeout.count());
            if (unsure_since) throw detail::etcd::maybe_applied(key, why);
            throw store_error(detail::format("'{}': {}", key, why));
        }
        if (unsure_since && clock::now() - *unsure_since > receipt_lives) throw detail::etcd::receipt_gone(key);
        const auto sent = clock::now();
        std::int64_t lease = 0;  // the receipt's: shared by the client's stores, short-lived
        bool lease_gone = false;
        bool lost = false;
        try {
            if (!read && unsure_since) {
                // The key and the receipt in one read: the receipt says whether an attempt was applied.
                std::vector<etcd_request> both{etcd_request::range(k), etcd_request::range(receipt)};
                auto got = co_await detail::etcd::unless_lease_lost(lease_, client_->txn({}, std::move(both)));
                if (got.responses.size() != 2)
                    throw store_error(detail::format("'{}': etcd answered too few reads", key));
                if (!got.responses[1].kvs.empty()) {
                    co_return co_await settled(key, seq, got.responses[1].kvs.front(), increment);
                }
                // "No receipt" proves nothing once the receipt may have expired.
                if (clock::now() - *unsure_since > receipt_lives) throw detail::etcd::receipt_gone(key);
                read = std::move(got.responses[0].kvs);
            }
            if (!read && increment) {
                // One transaction: a counter is raised by a put that keeps its value (its
                // version counts); anything else is read, for the compare-and-set below.
                lease = co_await detail::etcd::unless_lease_lost(lease_, client_->shared_lease(receipt_ttl));
                auto raise = etcd_request::put(k, {});
                raise.ignore_value = true;
                raise.prev_kv = true;
                auto compare = detail::etcd::is_counter(k);
                compare.push_back(no_receipt);
                std::vector<etcd_request> writes{std::move(raise), etcd_request::put(receipt, seq + " @", lease)};
                std::vector<etcd_request> reads{etcd_request::range(k), etcd_request::range(receipt)};
                auto got = co_await detail::etcd::unless_lease_lost(lease_,
                                                                    client_->txn(std::move(compare), std::move(writes),
                                                                                 std::move(reads)));
                if (got.responses.size() < (got.succeeded ? 1U : 2U)) {
                    throw store_error(detail::format("'{}': etcd answered too few operations", key));
                }
                if (got.succeeded) {
                    auto& before = got.responses.front().prev;
                    if (!before) throw store_error(detail::format("'{}': etcd did not say what it added to", key));
                    ++before->version;  // the value as this put left it
                    auto value = detail::etcd::shown_value(*before);
                    if (!detail::etcd::decimal(value)) {
                        throw store_error(detail::format("'{}': the value is no counter", key));
                    }
                    co_return value;
                }
                if (!got.responses[1].kvs.empty()) {
                    co_return co_await settled(key, seq, got.responses[1].kvs.front(), increment);
                }
                read = std::move(got.responses[0].kvs);
            }
            if (!read) read = std::move((co_await detail::etcd::unless_lease_lost(lease_, client_->range(k))).kvs);
        } catch (const etcd_error& e) {
            if (e.code() == 5) lease_gone = true;  // the receipts' lease expired
            else if (!e.ambiguous() && unsure_since) throw detail::etcd::maybe_applied(key, e.what());
            else if (!e.ambiguous()) throw;
            else lost = true;
        }
        if (lease_gone) client_->forget_shared_lease(lease);
        // The receipts' lease died before its time (a suspended host, a revoke): an earlier
        // attempt's receipt died with it.
        if (lease_gone && unsure_since) throw detail::etcd::receipt_gone(key);
        if (lost && !unsure_since) unsure_since = sent;
        if (lease_gone || lost) {
            read.reset();
            continue;
        }
        std::optional<std::string> current;
        std::int64_t next_version = 1;
        etcd_compare guard{k, etcd_compare::target::create, etcd_compare::result::equal, 0, {}, {}};
        if (!read->empty()) {
            current = detail::etcd::shown_value(read->front());
            next_version = read->front().version + 1;
            guard = {k, etcd_compare::target::mod, etcd_compare::result::equal, read->front().mod_revision, {}, {}};
        }
        read.reset();
        if (current && keep_existing_unchanged) {
            (void)make(current, argument);  // checks it
            co_return *current;
        }
        std::string next;
        try {
            next = make(current, argument);
        } catch (const store_error& e) {
            throw store_error(detail::format("'{}': {}", key, e.what()));
        }
        const auto stored = counting ? detail::etcd::counter_text(*detail::etcd::decimal(next), next_version) : next;
        const auto cas_sent = clock::now();
        try {
            lease = co_await detail::etcd::unless_lease_lost(lease_, client_->shared_lease(receipt_ttl));
            std::vector<etcd_compare> compare{guard, no_receipt};
            std::vector<etcd_request> writes{etcd_request::put(k, stored),
                                             etcd_request::put(receipt, seq + " " + next, lease)};
            std::vector<etcd_request> reads{etcd_request::range(k), etcd_request::range(receipt)};
            auto got = co_await detail::etcd::unless_lease_lost(lease_,
                                                                client_->txn(std::move(compare), std::move(writes),
                                                                             std::move(reads)));
            if (got.succeeded) co_return next;
            if (got.responses.size() != 2) throw store_error(detail::format("'{}': etcd answered too few reads", key));
            if (!got.responses[1].kvs.empty()) {
                co_return co_await settled(key, seq, got.responses[1].kvs.front(), increment);
            }
            // Another writer came first: again with what it wrote (an increment: by the
            // one-request way, the key most likely a counter now).
            if (!increment) read = std::move(got.responses[0].kvs);
        } catch (const etcd_error& e) {
            if (e.code() == 5) lease_gone = true;
            else if (!e.ambiguous() && unsure_since) throw detail::etcd::maybe_applied(key, e.what());
            else if (!e.ambiguous()) throw;
            else lost = true;
        }
        if (lease_gone) client_->forget_shared_lease(lease);
        if (lease_gone && unsure_since) throw detail::etcd::receipt_gone(key);
        if (lost && !unsure_since) unsure_since = cas_sent;
    }
}

ELASTIC_DECL asio::awaitable<std::int64_t> etcd_store::add(std::string key, std::int64_t delta) {
    // ADD of 0 reads the counter (creating it at 0): no write when it exists.
    const auto value = co_await replace(key, detail::etcd::added, std::to_string(delta), delta == 0, true, delta == 1);
    const auto number = detail::etcd::decimal(value);
    if (!number) throw store_error(detail::format("add('{}'): the value is no decimal number", key));
    co_return *number;
}

ELASTIC_DECL asio::awaitable<void> etcd_store::append(std::string key, std::string value) {
    (void)co_await replace(key, detail::etcd::appended, std::move(value), false, false, false);
}

ELASTIC_DECL asio::awaitable<std::string> etcd_store::compare_set(std::string key, std::string expected,
                                                                  std::string desired) {
    detail::etcd::check_plain(key, desired);
    const auto k = full(key);
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    for (;;) {
        if (std::chrono::steady_clock::now() >= deadline) {
            throw store_error(detail::format("compare_set('{}'): etcd did not take it within {} ms", key,
                                             options_.timeout.count()));
        }
        std::vector<etcd_compare> compare;
        if (expected.empty()) {
            compare.push_back({k, etcd_compare::target::create, etcd_compare::result::equal, 0, {}, {}});
        } else {
            compare.push_back({k, etcd_compare::target::value, etcd_compare::result::equal, 0, expected, {}});
        }
        std::vector<etcd_request> writes{etcd_request::put(k, desired)};
        std::vector<etcd_request> reads{etcd_request::range(k)};
        etcd_txn_result got;
        bool unsure = false;
        try {
            got = co_await detail::etcd::unless_lease_lost(lease_, client_->txn(compare, writes, reads));
        } catch (const etcd_error& e) {
            if (!e.ambiguous()) throw;
            unsure = true;  // applied or not, the next attempt reads what is there
        }
        if (unsure) continue;
        if (got.succeeded) co_return desired;
        const auto& now = got.responses.empty() ? std::vector<etcd_kv>{} : got.responses.front().kvs;
        if (now.empty()) co_return expected;  // absent and a value was expected: PyTorch returns it
        auto shown = detail::etcd::shown_value(now.front());
        // Present and equal to `expected` as its users see it (a counter's number, or empty
        // where an empty `expected` compared absence): replace it at the revision read.
        if (shown == expected) {
            std::vector<etcd_compare> same{
                {k, etcd_compare::target::mod, etcd_compare::result::equal, now.front().mod_revision, {}, {}}};
            std::vector<etcd_request> put{etcd_request::put(k, desired)};
            bool done = false;
            try {
                done = (co_await detail::etcd::unless_lease_lost(lease_, client_->txn(same, put))).succeeded;
            } catch (const etcd_error& e) {
                if (!e.ambiguous()) throw;
            }
            if (done) co_return desired;
            continue;
        }
        co_return shown;
    }
}

ELASTIC_DECL asio::awaitable<void> etcd_store::wait(std::vector<std::string> keys) {
    co_await wait_until(std::move(keys), options_.timeout);
}

ELASTIC_DECL asio::awaitable<void> etcd_store::wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
    co_await wait_until(std::move(keys), timeout);
}

ELASTIC_DECL asio::awaitable<void> etcd_store::wait_until(std::vector<std::string> keys,
                                                          std::chrono::milliseconds timeout) {
    using namespace asio::experimental::awaitable_operators;
    std::vector<std::string> wanted;
    wanted.reserve(keys.size());
    for (const auto& k : keys) wanted.push_back(full(k));
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::milliseconds(100);
    std::string last_error;
    for (;;) {
        if (std::chrono::steady_clock::now() >= deadline) {
            throw store_timeout(detail::format("wait for {} timed out after {} ms{}", detail::etcd::shown_keys(keys),
                                               timeout.count(), last_error.empty() ? "" : "; etcd: " + last_error));
        }
        asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
        auto raced = co_await (
            detail::settle(detail::etcd::unless_lease_lost(lease_, detail::etcd::wait_round(client_, wanted))) ||
            timer.async_wait(asio::use_awaitable));
        if (raced.index() == 1) continue;  // the deadline: said above
        bool done = false;
        bool retry = false;
        try {
            done = std::get<0>(raced).take();
        } catch (const etcd_error& e) {
            if (!e.transient()) throw;
            // No member answered, or the watch's member went away: ask again (another member),
            // after a pause that grows.
            last_error = e.what();
            retry = true;
        }
        if (done) co_return;
        if (retry) {
            asio::steady_timer later(co_await asio::this_coro::executor,
                                     std::min<std::chrono::steady_clock::duration>(
                                         pause, std::max<std::chrono::steady_clock::duration>(
                                                    deadline - std::chrono::steady_clock::now(), {})));
            co_await later.async_wait(asio::use_awaitable);
            pause = std::min(pause * 2, std::chrono::milliseconds(2000));
        }
    }
}

ELASTIC_DECL asio::awaitable<bool> etcd_store::check(std::vector<std::string> keys) {
    std::vector<std::string> wanted;
    for (const auto& k : keys) wanted.push_back(full(k));
    auto got = co_await detail::etcd::unless_lease_lost(lease_, detail::etcd::existing(*client_, wanted));
    co_return std::all_of(got.second.begin(), got.second.end(), [](bool b) { return b; });
}

ELASTIC_DECL asio::awaitable<bool> etcd_store::delete_key(std::string key) {
    co_return co_await detail::etcd::unless_lease_lost(lease_, client_->erase(full(key))) > 0;
}

ELASTIC_DECL asio::awaitable<std::int64_t> etcd_store::num_keys() {
    auto got = co_await detail::etcd::unless_lease_lost(lease_, client_->range(options_.prefix,
                                                                               etcd_prefix_end(options_.prefix), true));
    co_return got.count;
}

ELASTIC_DECL asio::awaitable<std::vector<std::string>> etcd_store::multi_get(std::vector<std::string> keys) {
    for (bool first = true;; first = false) {
        // Read first: keys that are there cost one request per 128, not a wait and a read.
        if (!first) co_await wait(keys);
        std::vector<std::string> out;
        bool all = true;
        for (std::size_t at = 0; at < keys.size() && all; at += detail::etcd::max_txn_ops) {
            std::vector<etcd_request> reads;
            for (std::size_t i = at; i < keys.size() && i < at + detail::etcd::max_txn_ops; ++i) {
                reads.push_back(etcd_request::range(full(keys[i])));
            }
            auto got = co_await detail::etcd::unless_lease_lost(lease_, client_->txn({}, std::move(reads)));
            for (auto& r : got.responses) {
                if (r.kvs.empty()) {
                    all = false;  // not there (yet, or deleted since the wait): wait
                    break;
                }
                out.push_back(detail::etcd::shown_value(r.kvs.front()));
            }
        }
        if (all && out.size() == keys.size()) co_return out;
    }
}

ELASTIC_DECL asio::awaitable<void> etcd_store::multi_set(std::vector<std::string> keys,
                                                         std::vector<std::string> values) {
    if (keys.size() != values.size()) {
        throw store_error(detail::format("multi_set: {} keys and {} values", keys.size(), values.size()));
    }
    // etcd refuses a key put twice in one transaction: the last value of a key wins, as it would
    // one set after another.
    std::map<std::string, std::string> last;
    std::vector<std::string> order;
    for (std::size_t i = 0; i < keys.size(); ++i) {
        detail::etcd::check_plain(keys[i], values[i]);
        auto k = full(keys[i]);
        if (last.find(k) == last.end()) order.push_back(k);
        last[k] = std::move(values[i]);
    }
    for (std::size_t at = 0; at < order.size(); at += detail::etcd::max_txn_ops) {
        std::vector<etcd_request> writes;
        for (std::size_t i = at; i < order.size() && i < at + detail::etcd::max_txn_ops; ++i) {
            writes.push_back(etcd_request::put(order[i], last[order[i]]));
        }
        // Puts alone: the client sends them again after a lost answer, harmlessly.
        (void)co_await detail::etcd::unless_lease_lost(lease_, client_->txn({}, std::move(writes)));
    }
}

ELASTIC_DECL asio::awaitable<void> etcd_store::hold_lease(std::string key, std::string value) {
    const auto parts = parse_lease_key(key);
    if (!parts || parts->name.empty() || parts->reserved()) {
        throw store_error(
            detail::format("hold_lease('{}'): not a lease key; use lease_key(group, name) with a name that "
                           "does not start with \"__\"",
                           key));
    }
    if (lease_ && lease_->lost.empty() && !lease_->stopped) {
        throw store_error(detail::format("hold_lease('{}'): this store holds a lease already", key));
    }
    const auto ttl_ms = options_.keep_alive_interval * std::max(1, options_.keep_alive_max_attempt);
    const auto ttl = std::max<std::chrono::seconds>(std::chrono::seconds(2),
                                                    std::chrono::ceil<std::chrono::seconds>(ttl_ms));
    auto executor = co_await asio::this_coro::executor;
    auto l = std::make_shared<detail::etcd::lease_state>(executor);
    l->key = full(key);
    l->space = full(std::string(parts->space));
    l->name = std::string(parts->name);
    const auto granted = co_await client_->lease_grant(ttl.count());
    l->id = granted.id;
    l->ttl = std::max<std::int64_t>(granted.ttl, 1);
    // Renewed from now on: the registration below may take its time.
    asio::co_spawn(executor, detail::etcd::keep_alive(l, client_, options_.keep_alive_interval), asio::detached);
    const auto epoch_key = l->space + "__epoch";
    const auto silent_key = l->space + "__silent";
    const auto held_key = l->space + "__held/" + l->name;
    std::vector<etcd_compare> absent{{epoch_key, etcd_compare::target::create, etcd_compare::result::equal, 0, {}, {}}};
    std::vector<etcd_request> first{etcd_request::put(epoch_key, "0"), etcd_request::put(silent_key, "0"),
                                    etcd_request::put(l->key, value, l->id),
                                    etcd_request::put(held_key, std::to_string(l->id))};
    std::vector<etcd_request> later{etcd_request::put(l->key, value, l->id),
                                    etcd_request::put(held_key, std::to_string(l->id))};
    std::optional<std::string> failed;
    std::exception_ptr interrupted;  // cancelled, or worse: the lease must not outlive this call
    try {
        for (int attempt = 0; attempt < 8; ++attempt) {
            bool again = false;
            try {
                (void)co_await detail::etcd::unless_lease_lost(l, client_->txn(absent, first, later));
            } catch (const etcd_error& e) {
                if (e.ambiguous()) again = true;  // puts of this new lease's keys: the same again is harmless
                else failed = e.what();
            } catch (const store_error& e) {
                failed = e.what();
            }
            if (!again) break;
            if (attempt == 7) failed = "etcd did not confirm the lease's registration";
        }
    } catch (...) {
        interrupted = std::current_exception();
    }
    if (failed || interrupted) {
        // Nobody will release it: stop renewing and revoke it (a coroutine of its own, which a
        // cancellation of this one does not reach; etcd expires it should that fail too).
        l->stopped = true;
        l->wake.cancel();
        l->changed.notify();
        asio::co_spawn(executor, detail::etcd::revoke_quietly(client_, l->id), asio::detached);
        if (interrupted) std::rethrow_exception(interrupted);
        throw store_error(detail::format("hold_lease('{}'): {}", key, *failed));
    }
    lease_ = l;
    asio::co_spawn(executor, detail::etcd::observe(l, client_, options_.keep_alive_interval), asio::detached);
}

ELASTIC_DECL asio::awaitable<bool> etcd_store::release_lease() {
    if (!lease_ || lease_->stopped) co_return false;
    auto l = lease_;
    l->stopped = true;
    l->wake.cancel();
    l->changed.notify();
    co_await client_->lease_revoke(l->id);
    co_return true;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
