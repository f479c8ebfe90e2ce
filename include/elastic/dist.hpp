// SPDX-License-Identifier: MIT
// elastic::dist: composer-style collectives for native C++ workers (barrier, broadcast,
// all_gather, all_reduce of scalars, rank and size helpers) over the job's TCP store.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/env.hpp"
#include "elastic/store/client_dialect.hpp"
#include "elastic/store/errors.hpp"
// The store client only where group's members are compiled: with ELASTIC_SEPARATE_COMPILATION,
// in elastic/impl/src.hpp's file alone, so a worker's files parse none of Asio.
#if ELASTIC_DETAIL_BODIES
#include "elastic/store/blocking_client.hpp"
#include "elastic/store/client.hpp"
#endif

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// A collective did not complete in time because some ranks never arrived. The message names
/// them, the collective and the store; `missing_ranks()` lists them in order.
class dist_timeout : public store_timeout {
public:
    dist_timeout(const std::string& message, std::vector<int> missing)
        : store_timeout(message), missing_(std::move(missing)) {}

    /// The ranks that had not arrived when the timeout expired.
    [[nodiscard]] const std::vector<int>& missing_ranks() const noexcept { return missing_; }

private:
    std::vector<int> missing_;
};

template <class>
class basic_blocking_store_client;  // elastic/store/blocking_client.hpp

namespace dist {

/// How `all_reduce` combines the ranks' values.
enum class reduce_op : std::uint8_t { sum, min, max };

/// What a `group` needs: who we are, where the store is, and the key namespace.
struct group_options {
    int rank = 0;                    ///< this process's rank, 0 <= rank < world_size
    int world_size = 1;              ///< processes in the group; 1 needs no store
    std::string host = "127.0.0.1";  ///< the store (MASTER_ADDR)
    std::uint16_t port = 29500;      ///< the store's port (MASTER_PORT)
    /// Prefix of every key the group writes. `from_env` makes it "elastic.dist/attempt_<N>"
    /// with N = TORCHELASTIC_RESTART_COUNT, so a restarted group never sees the keys a previous
    /// attempt left behind (a rank that died mid-barrier, for instance).
    std::string key_namespace = "elastic.dist/attempt_0";
    /// How long a collective waits for the other ranks (PyTorch's process group default).
    std::chrono::milliseconds timeout{std::chrono::minutes(30)};
    /// How long connecting to the store may take (attempts back off exponentially).
    std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
    client_dialect dialect = client_dialect::detect;
};

/// The options for this worker, from what the launcher set (`elastic::env()` or a test's
/// `worker_env::from(map)`). A multi-rank environment without MASTER_ADDR/MASTER_PORT is an
/// env_error naming them.
inline group_options options_from(const worker_env& e) {
    group_options o;
    o.rank = e.rank;
    o.world_size = e.world_size;
    o.key_namespace = fmt::format("elastic.dist/attempt_{}", e.restart_count);
    if (e.world_size > 1) {
        if (!e.master_addr || !e.master_port)
            throw env_error(fmt::format("invalid worker environment: elastic::dist needs the "
                                        "store at MASTER_ADDR:MASTER_PORT for a world of {} ranks, "
                                        "but {} is not set; start the workers with elasticrun "
                                        "or torchrun, or set both",
                                        e.world_size, !e.master_addr ? "MASTER_ADDR" : "MASTER_PORT"),
                            {"MASTER_ADDR", "MASTER_PORT"});
        o.host = *e.master_addr;
        o.port = *e.master_port;
    }
    return o;
}

/// A group of ranks synchronising through a TCP store. Every rank must call the same
/// collectives in the same order (as with torch.distributed). Each collective uses fresh keys
/// `<namespace>/<n>/...` (n counts collectives); once all ranks have passed collective n, the
/// keys this rank wrote before n are deleted, so the store does not grow with the run. With
/// world_size 1 every collective is a local no-op and no store is needed. Not thread-safe; the
/// free functions below lock around the process-wide group.
class group {
public:
    ELASTIC_DECL explicit group(group_options options);
    ELASTIC_DECL ~group();
    group(const group&) = delete;
    group& operator=(const group&) = delete;

    [[nodiscard]] int rank() const noexcept { return options_.rank; }
    [[nodiscard]] int world_size() const noexcept { return options_.world_size; }
    [[nodiscard]] const group_options& options() const noexcept { return options_; }

    [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return options_.timeout; }
    /// Changes how long later collectives wait for the other ranks.
    ELASTIC_DECL void set_timeout(std::chrono::milliseconds t);

    /// Returns when every rank has called barrier(). dist_timeout names the ranks missing.
    ELASTIC_DECL void barrier();

    /// Returns `root`'s bytes on every rank (the others' `bytes` are ignored). Only the root's
    /// arrival is awaited; dist_timeout names it when it does not come.
    ELASTIC_DECL std::string broadcast(std::string bytes, int root = 0);

    /// Every rank's bytes, indexed by rank.
    ELASTIC_DECL std::vector<std::string> all_gather(std::string bytes);

    /// Combines every rank's value with `op`; every rank gets the same result (sums are taken
    /// in rank order, so floating-point results agree bit for bit).
    // clang-format off
    template <class T>
        requires std::is_arithmetic_v<T>
    T all_reduce(T value, reduce_op op = reduce_op::sum) {
        // clang-format on
        if (options_.world_size == 1) return value;
        std::string bytes(sizeof(T), '\0');
        std::memcpy(bytes.data(), &value, sizeof(T));
        const auto all = exchange("all_reduce", std::move(bytes), true);
        T result{};
        for (std::size_t r = 0; r < all.size(); ++r) {
            if (all[r].size() != sizeof(T))
                throw store_error(
                    fmt::format("elastic::dist::all_reduce: rank {} sent {} bytes, expected {} (a value of "
                                "another type: every rank must reduce the same type)",
                                r, all[r].size(), sizeof(T)));
            T v;
            std::memcpy(&v, all[r].data(), sizeof(T));
            if (r == 0) result = v;
            else if (op == reduce_op::sum) result = static_cast<T>(result + v);
            else if (op == reduce_op::min) result = std::min(result, v);
            else result = std::max(result, v);
        }
        return result;
    }

private:
    ELASTIC_DECL void check_rank(int r, std::string_view what) const;
    // Each rank writes `<ns>/<n>/<rank>` and waits for all of them: every rank has arrived.
    ELASTIC_DECL std::vector<std::string> exchange(std::string_view what, std::string payload, bool read);
    ELASTIC_DECL dist_timeout timeout_error(std::string_view what, std::uint64_t n, std::vector<int> missing);

    group_options options_;
    std::unique_ptr<basic_blocking_store_client<void>> client_;  // null for a world of 1
    std::uint64_t next_ = 0;                                     // collectives started by this rank
    std::vector<std::string> written_;                           // keys written since the last full synchronisation
};

}  // namespace dist

// group's members, out of the class so that ELASTIC_SEPARATE_COMPILATION can leave them (and the
// store client) to elastic/impl/src.hpp's file.
#if ELASTIC_DETAIL_BODIES
namespace dist {

ELASTIC_DECL group::group(group_options options) : options_(std::move(options)) {
    if (options_.world_size < 1)
        throw std::invalid_argument(fmt::format("elastic::dist::group: world_size {} is not a size (1 or more)",
                                                options_.world_size));
    if (options_.rank < 0 || options_.rank >= options_.world_size)
        throw std::invalid_argument(fmt::format("elastic::dist::group: rank {} is outside 0..{} (world size {})",
                                                options_.rank, options_.world_size - 1, options_.world_size));
    if (options_.world_size > 1) {
        store_client_options c;
        c.host = options_.host;
        c.port = options_.port;
        c.dialect = options_.dialect;
        c.timeout = options_.timeout;
        c.connect_timeout = options_.connect_timeout;
        client_ = std::make_unique<blocking_store_client>(std::move(c));
    }
}

ELASTIC_DECL group::~group() = default;

ELASTIC_DECL void group::set_timeout(std::chrono::milliseconds t) {
    options_.timeout = t;
    if (client_) client_->set_timeout(t);
}

ELASTIC_DECL void group::barrier() {
    if (options_.world_size == 1) return;
    (void)exchange("barrier", {}, false);
}

ELASTIC_DECL std::string group::broadcast(std::string bytes, int root) {
    check_rank(root, "broadcast root");
    if (options_.world_size == 1) return bytes;
    const auto n = next_++;
    const auto key = fmt::format("{}/{}/root", options_.key_namespace, n);
    if (options_.rank == root) {
        client_->set(key, bytes);
        written_.push_back(key);
        return bytes;
    }
    try {
        std::vector<std::string> keys(1, key);
        client_->wait(std::move(keys), options_.timeout);
    } catch (const store_timeout&) {
        throw timeout_error("broadcast", n, {root});
    }
    return client_->get(key);
}

ELASTIC_DECL std::vector<std::string> group::all_gather(std::string bytes) {
    if (options_.world_size == 1) return {std::move(bytes)};
    return exchange("all_gather", std::move(bytes), true);
}

ELASTIC_DECL void group::check_rank(int r, std::string_view what) const {
    if (r < 0 || r >= options_.world_size)
        throw std::invalid_argument(fmt::format("elastic::dist: {} {} is outside 0..{}", what, r,
                                                options_.world_size - 1));
}

ELASTIC_DECL std::vector<std::string> group::exchange(std::string_view what, std::string payload, bool read) {
    const auto n = next_++;
    std::vector<std::string> keys;
    keys.reserve(static_cast<std::size_t>(options_.world_size));
    for (int r = 0; r < options_.world_size; ++r) keys.push_back(fmt::format("{}/{}/{}", options_.key_namespace, n, r));
    const auto& mine = keys[static_cast<std::size_t>(options_.rank)];
    client_->set(mine, std::move(payload));
    try {
        client_->wait(keys, options_.timeout);
    } catch (const store_timeout&) {
        std::vector<int> missing;
        for (int r = 0; r < options_.world_size; ++r) {
            std::vector<std::string> one(1, keys[static_cast<std::size_t>(r)]);
            if (!client_->check(std::move(one))) missing.push_back(r);
        }
        throw timeout_error(what, n, std::move(missing));
    }
    std::vector<std::string> out;
    if (read) out = client_->multi_get(keys);
    // Every rank has written its key of collective n, so each has finished everything
    // before n: nobody reads the keys this rank wrote earlier any more.
    for (const auto& k : written_) (void)client_->delete_key(k);
    written_.clear();
    written_.push_back(mine);
    return out;
}

ELASTIC_DECL dist_timeout group::timeout_error(std::string_view what, std::uint64_t n, std::vector<int> missing) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 32; ++i) list += fmt::format("{}{}", i ? ", " : "", missing[i]);
    if (missing.size() > 32) list += fmt::format(" and {} more", missing.size() - 32);
    // The message first: the vector is moved into the exception after it.
    auto message = fmt::format("elastic::dist::{} #{} on rank {} of {}: rank{} {} did not arrive within "
                               "{} ms (exited, hung, or called the collectives in another order); "
                               "store {}:{}, keys '{}/{}/'",
                               what, n, options_.rank, options_.world_size, missing.size() == 1 ? "" : "s",
                               missing.empty() ? "?" : list, options_.timeout.count(), options_.host, options_.port,
                               options_.key_namespace, n);
    return dist_timeout(message, std::move(missing));
}

}  // namespace dist
#endif  // definitions

namespace detail::worker {

// The process-wide group of elastic::dist's free functions, built on first use.
struct dist_world {
    std::mutex mutex;
    std::optional<dist::group> world;
};

inline dist_world& dist_world_instance() {
    static dist_world s;
    return s;
}

// Runs f on the process-wide group (built from elastic::env() on first use) under its lock.
template <class F>
decltype(auto) with_dist_world(F&& f) {
    auto& s = dist_world_instance();
    const std::lock_guard lock(s.mutex);
    if (!s.world) s.world.emplace(dist::options_from(env()));
    return std::forward<F>(f)(*s.world);
}

}  // namespace detail::worker

namespace dist {

/// RANK: this worker's global rank, 0 <= rank < WORLD_SIZE (0 when started by hand).
inline int get_global_rank() { return env().rank; }
/// LOCAL_RANK: the rank on this node.
inline int get_local_rank() { return env().local_rank; }
/// WORLD_SIZE: the number of workers in the job.
inline int get_world_size() { return env().world_size; }
/// LOCAL_WORLD_SIZE: the number of workers on this node.
inline int get_local_world_size() { return env().local_world_size; }
/// GROUP_RANK (NODE_RANK): this node's rank.
inline int get_node_rank() { return env().node_rank; }

/// Waits for every rank (see group::barrier).
inline void barrier() {
    elastic::detail::worker::with_dist_world([](group& g) { g.barrier(); });
}
/// `root`'s bytes on every rank (see group::broadcast).
inline std::string broadcast(std::string bytes, int root = 0) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.broadcast(std::move(bytes), root); });
}
/// Every rank's bytes, by rank (see group::all_gather).
inline std::vector<std::string> all_gather(std::string bytes) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.all_gather(std::move(bytes)); });
}
/// A scalar combined over every rank (see group::all_reduce).
// clang-format off
template <class T>
    requires std::is_arithmetic_v<T>
T all_reduce(T value, reduce_op op = reduce_op::sum) {
    // clang-format on
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.all_reduce(value, op); });
}
/// How long the process-wide group's collectives wait for the other ranks (default 30 min).
inline void set_timeout(std::chrono::milliseconds t) {
    elastic::detail::worker::with_dist_world([&](group& g) { g.set_timeout(t); });
}

}  // namespace dist
}  // namespace elastic::inline v0
