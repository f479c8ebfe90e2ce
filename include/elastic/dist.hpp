// SPDX-License-Identifier: MIT
// elastic::dist: composer-style collectives for native C++ workers over the job's TCP store:
// barrier, broadcast, all_gather, gather, scatter of bytes or any serializable value, all_reduce
// of scalars and arrays, the node-local and node-leader groups, local-rank-zero-first helpers,
// the distributed sampler, and the rank and size helpers.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/dist/codec.hpp"
#include "elastic/dist/sampler.hpp"
#include "elastic/env.hpp"
#include "elastic/store/client_dialect.hpp"
#include "elastic/store/errors.hpp"
// The store client only where group's members are compiled: with ELASTIC_SEPARATE_COMPILATION,
// in elastic/impl/src.hpp's file alone, so a worker's files parse none of Asio.
#if ELASTIC_DETAIL_BODIES
#include "elastic/store/blocking_client.hpp"
#include "elastic/store/client.hpp"
#endif

#include "elastic/detail/format.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/stat.h>

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

/// How `all_reduce` combines the ranks' values. The bitwise operations take integers only, avg
/// floating-point types only (the sum in rank order, divided by the number of ranks).
enum class reduce_op : std::uint8_t { sum, min, max, product, band, bor, bxor, avg };

/// The types `all_reduce` combines: arithmetic types other than bool.
template <class T>
concept reducible = std::is_arithmetic_v<T> && !std::is_same_v<std::remove_cv_t<T>, bool>;

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
    /// The largest value the group stores under one key: a payload beyond 64 KiB is split into
    /// chunks of at most this size (4 KiB .. 16 MiB), so any payload fits under the store's
    /// value limit (16 MiB for ours).
    std::size_t chunk_size = std::size_t{4} << 20;
};

/// The options for this worker, from what the launcher set (`elastic::env()` or a test's
/// `worker_env::from(map)`). A multi-rank environment without MASTER_ADDR/MASTER_PORT is an
/// env_error naming them.
inline group_options options_from(const worker_env& e) {
    group_options o;
    o.rank = e.rank;
    o.world_size = e.world_size;
    o.key_namespace = elastic::detail::format("elastic.dist/attempt_{}", e.restart_count);
    if (e.world_size > 1) {
        if (!e.master_addr || !e.master_port)
            throw env_error(elastic::detail::format("invalid worker environment: elastic::dist needs the "
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

/// The node-local group: the workers of this node (agent), as rank LOCAL_RANK of
/// LOCAL_WORLD_SIZE, with keys under "<namespace>/node_<GROUP_RANK>". Workers started with
/// --virtual-local-rank all have LOCAL_RANK 0 and cannot form it.
inline group_options local_options_from(const worker_env& e) {
    auto o = options_from(e);
    o.rank = e.local_rank;
    o.world_size = e.local_world_size;
    o.key_namespace += elastic::detail::format("/node_{}", e.node_rank);
    return o;
}

/// The node leaders: LOCAL_RANK 0 of every node, as rank GROUP_RANK of GROUP_WORLD_SIZE, with
/// keys under "<namespace>/leaders". Another local rank is a std::logic_error: it is no member.
inline group_options leaders_options_from(const worker_env& e) {
    if (e.local_rank != 0)
        throw std::logic_error(
            elastic::detail::format("elastic::dist: the node leaders' group has LOCAL_RANK 0 of each node; "
                                    "this worker is local rank {} (rank {})",
                                    e.local_rank, e.rank));
    auto o = options_from(e);
    o.rank = e.node_rank;
    o.world_size = e.node_count;
    o.key_namespace += "/leaders";
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
    /// Connects to the store now, within the connect timeout (collectives otherwise connect on
    /// first use). A store that cannot be reached is a store_error naming it.
    ELASTIC_DECL void connect();

    /// Makes sure no other process of this group's namespace claimed this rank (one ADD on the
    /// store): a std::logic_error if one did. The node groups check this when they are built,
    /// since their ranks come from LOCAL_RANK, which --virtual-local-rank sets to 0 everywhere.
    ELASTIC_DECL void claim_rank();

    /// Returns when every rank has called barrier(). dist_timeout names the ranks missing.
    ELASTIC_DECL void barrier();

    /// Returns `root`'s bytes on every rank (the others' `bytes` are ignored). Only the root's
    /// arrival is awaited; dist_timeout names it when it does not come.
    ELASTIC_DECL std::string broadcast(std::string bytes, int root = 0);

    /// Every rank's bytes, indexed by rank.
    ELASTIC_DECL std::vector<std::string> all_gather(std::string bytes);

    /// On `root`, every rank's bytes indexed by rank; on the others an empty vector (they do not
    /// wait for anyone).
    ELASTIC_DECL std::vector<std::string> gather(std::string bytes, int root = 0);

    /// `root`'s parts[r] on rank r. On the root `parts` must hold one entry per rank (else every
    /// rank fails with std::invalid_argument's message); elsewhere it is ignored.
    ELASTIC_DECL std::string scatter(std::vector<std::string> parts, int root = 0);

    /// `root`'s value on every rank, for any serializable type (see dist/codec.hpp).
    /// A value that cannot be encoded (a user's serialize that throws) fails this rank with that
    /// exception and the ranks that wait for it with a store_error carrying its message.
    template <serializable T>
    T broadcast(const T& value, int root = 0) {
        check_rank(root, "broadcast root");
        if (options_.world_size == 1) return value;
        auto bytes = options_.rank == root
                         ? or_abandon("broadcast", part::root, root, [&] { return dist::encode(value); })
                         : std::string();
        return dist::decode<T>(broadcast(std::move(bytes), root));
    }
    /// Every rank's value, indexed by rank.
    template <serializable T>
    std::vector<T> all_gather(const T& value) {
        if (options_.world_size == 1) return std::vector<T>(1, value);
        return decode_all<T>(all_gather(or_abandon("all_gather", part::own, 0, [&] { return dist::encode(value); })));
    }
    /// Every rank's value on `root`, indexed by rank; empty elsewhere.
    template <serializable T>
    std::vector<T> gather(const T& value, int root = 0) {
        check_rank(root, "gather root");
        const auto p = options_.rank == root ? part::none : part::own;
        return decode_all<T>(gather(or_abandon("gather", p, root, [&] { return dist::encode(value); }), root));
    }
    /// `root`'s values[r] on rank r.
    template <serializable T>
    T scatter(const std::vector<T>& values, int root = 0) {
        check_rank(root, "scatter root");
        std::vector<std::string> parts;
        if (options_.rank == root)
            parts = or_abandon("scatter", part::others, root, [&] {
                std::vector<std::string> encoded;
                encoded.reserve(values.size());
                for (const auto& v : values) encoded.push_back(dist::encode(v));
                return encoded;
            });
        return dist::decode<T>(scatter(std::move(parts), root));
    }

    /// Combines every rank's `data` element by element with `op`, in place; every rank ends with
    /// the same values. Combination follows rank order ((r0 op r1) op r2 ...), so floating-point
    /// results are the same bit for bit on every rank and in every run. Small arrays (all ranks'
    /// together up to 256 KiB) are read by every rank; larger ones are combined by rank 0 and
    /// read back from it.
    template <reducible T>
    void all_reduce(std::span<T> data, reduce_op op = reduce_op::sum) {
        const auto who = options_.world_size == 1 ? part::none : options_.rank == 0 ? part::reducer : part::own;
        (void)or_abandon("all_reduce", who, 0, [&] {
            check_op<T>(op);
            return 0;
        });
        if (options_.world_size == 1) return;
        std::string mine = reduce_header<T>(op, data.size());
        const auto header_size = mine.size();
        if (!data.empty()) mine.append(reinterpret_cast<const char*>(data.data()), data.size_bytes());
        auto r = reduce_exchange(std::move(mine), header_size);
        if (data.empty()) return;
        if (r.from_root) {  // the root's result, already checked
            std::memcpy(data.data(), r.parts[0].data(), data.size_bytes());
            return;
        }
        std::vector<T> acc(data.size());
        for (std::size_t rank = 0; rank < r.parts.size(); ++rank) {
            const char* p = r.parts[rank].data() + header_size;
            for (std::size_t i = 0; i < data.size(); ++i) {
                T v;
                std::memcpy(&v, p + i * sizeof(T), sizeof(T));
                acc[i] = rank == 0 ? v : combine(acc[i], v, op);
            }
        }
        if (op == reduce_op::avg)
            for (auto& v : acc) v = static_cast<T>(v / static_cast<T>(options_.world_size));
        std::memcpy(data.data(), acc.data(), data.size_bytes());
        if (r.publish) reduce_publish(r.n, std::string(reinterpret_cast<const char*>(acc.data()), data.size_bytes()));
    }
    /// all_reduce of a contiguous range in place (a std::vector<double>, a std::array<int, N>).
    // clang-format off
    template <class R>
        requires std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                 reducible<std::ranges::range_value_t<R>> && (!std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>)
    void all_reduce(R& range, reduce_op op = reduce_op::sum) {
        // clang-format on
        all_reduce(std::span<std::ranges::range_value_t<R>>(std::ranges::data(range), std::ranges::size(range)), op);
    }
    /// Combines one value over every rank; every rank gets the same result.
    template <reducible T>
    T all_reduce(T value, reduce_op op = reduce_op::sum) {
        all_reduce(std::span<T>(&value, 1), op);
        return value;
    }

private:
    struct reduce_result {
        std::uint64_t n = 0;
        std::vector<std::string> parts;  // every rank's contribution, or the root's result alone
        bool from_root = false;          // parts[0] is the combined data
        bool publish = false;            // this rank combines for the others: reduce_publish
    };

    template <class T>
    static void check_op(reduce_op op) {
        const bool bitwise = op == reduce_op::band || op == reduce_op::bor || op == reduce_op::bxor;
        if (bitwise && !std::is_integral_v<T>)
            throw std::invalid_argument("elastic::dist::all_reduce: band, bor and bxor take integers only");
        if (op == reduce_op::avg && !std::is_floating_point_v<T>)
            throw std::invalid_argument("elastic::dist::all_reduce: avg takes floating-point types only (for "
                                        "integers, reduce with sum and divide as you need)");
        if (static_cast<unsigned>(op) > static_cast<unsigned>(reduce_op::avg))
            throw std::invalid_argument("elastic::dist::all_reduce: not a reduce_op");
    }

    // What each rank reduces: type kind and size, operation, count. Ranks that disagree fail.
    template <class T>
    static std::string reduce_header(reduce_op op, std::size_t count) {
        const char kind = std::is_floating_point_v<T> ? 'f' : std::is_signed_v<T> ? 'i' : 'u';
        std::string h{kind, static_cast<char>(sizeof(T)), static_cast<char>(op)};
        const auto c = static_cast<std::uint64_t>(count);
        h.append(reinterpret_cast<const char*>(&c), sizeof c);
        return h;
    }

    template <class T>
    static T combine(T a, T b, reduce_op op) {
        if constexpr (std::is_integral_v<T>) {
            // Unsigned, and at least unsigned int (a narrower type would be promoted to int): wraps
            // on overflow as the hardware does, never undefined behaviour.
            using U = std::common_type_t<std::make_unsigned_t<T>, unsigned>;
            const auto ua = static_cast<U>(static_cast<std::make_unsigned_t<T>>(a));
            const auto ub = static_cast<U>(static_cast<std::make_unsigned_t<T>>(b));
            switch (op) {
                case reduce_op::sum: return static_cast<T>(static_cast<U>(ua + ub));
                case reduce_op::product: return static_cast<T>(static_cast<U>(ua * ub));
                case reduce_op::band: return static_cast<T>(ua & ub);
                case reduce_op::bor: return static_cast<T>(ua | ub);
                case reduce_op::bxor: return static_cast<T>(ua ^ ub);
                default: break;
            }
        } else {
            if (op == reduce_op::sum || op == reduce_op::avg) return a + b;
            if (op == reduce_op::product) return a * b;
        }
        return op == reduce_op::min ? std::min(a, b) : std::max(a, b);
    }

    // Which keys of a collective a rank that cannot take part fills with its error: its own
    // (all_gather, a gather's sender, all_reduce), its own and the result (all_reduce's rank 0,
    // whose result the others may wait for), the root's (a broadcast's root), every other rank's
    // (a scatter's root), or none (a gather's root: nobody waits for it).
    enum class part : std::uint8_t { own, reducer, root, others, none };

    // make()'s result; if it throws, the rest of the group hears of it (abandon) and the
    // exception goes on.
    template <class F>
    auto or_abandon(std::string_view what, part p, int root, F&& make) {
        try {
            return make();
        } catch (const std::exception& e) {
            abandon(what, p, root, e.what());
            throw;
        } catch (...) {
            abandon(what, p, root, "an exception that is not a std::exception");
            throw;
        }
    }

    template <class T>
    static std::vector<T> decode_all(const std::vector<std::string>& parts) {
        std::vector<T> out;
        out.reserve(parts.size());
        for (const auto& p : parts) out.push_back(dist::decode<T>(p));
        return out;
    }

    ELASTIC_DECL void check_rank(int r, std::string_view what) const;
    // This rank cannot do its part of the next collective: it takes the collective's number, as
    // every rank does, and stores `why` in the keys `p` names, so that the ranks waiting for them
    // fail at once with it rather than at the timeout. Never throws.
    ELASTIC_DECL void abandon(std::string_view what, part p, int root, std::string_view why) noexcept;
    ELASTIC_DECL std::vector<std::string> keys_of(std::uint64_t n) const;
    // Stores a payload under `key`: chunks first (beyond 64 KiB), then the head that readers wait
    // for. With `keep`, the keys are remembered for this rank's clean-up (forget_before); without,
    // the readers delete them (a broadcast's last reader, a gather's root, a scatter's receiver).
    ELASTIC_DECL void put(const std::string& key, std::string_view payload, bool keep = true);
    // Stores an error under `key`: a reader of it throws store_error with `message`.
    ELASTIC_DECL void put_error(const std::string& key, std::string_view message);
    // The payloads under `keys` (heads, then their chunks), in order; an error head throws. The
    // chunk keys read are added to `chunks` when given.
    ELASTIC_DECL std::vector<std::string> fetch(const std::vector<std::string>& keys,
                                                std::vector<std::string>* chunks = nullptr);
    // Deletes keys this rank has read and no other rank will.
    ELASTIC_DECL void drop(const std::vector<std::string>& keys);
    // Waits for `keys` of collective n; on timeout, a dist_timeout names the writers (owners[i]
    // writes keys[i]; the last owner stands for any key beyond) of the keys still missing.
    ELASTIC_DECL void await(std::string_view what, std::uint64_t n, const std::vector<std::string>& keys,
                            const std::vector<int>& owners);
    // After this rank has seen every rank's key of a collective: deletes the keys it wrote
    // before that collective (the first `mark` of written_).
    ELASTIC_DECL void forget_before(std::size_t mark);
    // Each rank writes `<ns>/<n>/<rank>` and waits for all of them: every rank has arrived.
    ELASTIC_DECL std::vector<std::string> exchange(std::string_view what, std::string payload, bool read);
    ELASTIC_DECL reduce_result reduce_exchange(std::string mine, std::size_t header_size);
    ELASTIC_DECL void reduce_publish(std::uint64_t n, std::string data);
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
        throw std::invalid_argument(elastic::detail::format(
            "elastic::dist::group: world_size {} is not a size (1 or more)", options_.world_size));
    if (options_.rank < 0 || options_.rank >= options_.world_size)
        throw std::invalid_argument(
            elastic::detail::format("elastic::dist::group: rank {} is outside 0..{} (world size {})", options_.rank,
                                    options_.world_size - 1, options_.world_size));
    if (options_.chunk_size < 4096 || options_.chunk_size > (std::size_t{16} << 20))
        throw std::invalid_argument(elastic::detail::format(
            "elastic::dist::group: chunk_size {} is outside 4 KiB .. 16 MiB", options_.chunk_size));
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

ELASTIC_DECL void group::connect() {
    if (client_) client_->connect();
}

ELASTIC_DECL void group::barrier() {
    if (options_.world_size == 1) return;
    (void)exchange("barrier", {}, false);
}

ELASTIC_DECL std::string group::broadcast(std::string bytes, int root) {
    check_rank(root, "broadcast root");
    if (options_.world_size == 1) return bytes;
    const auto n = next_++;
    const auto key = elastic::detail::format("{}/{}/root", options_.key_namespace, n);
    if (options_.rank == root) {
        put(key, bytes, false);
        return bytes;
    }
    const std::vector<std::string> keys(1, key);
    await("broadcast", n, keys, {root});
    std::vector<std::string> read = keys;
    auto value = std::move(fetch(keys, &read)[0]);
    // The last of the world-1 readers deletes what the root wrote.
    const auto acks = elastic::detail::format("{}/{}/acks", options_.key_namespace, n);
    if (client_->add(acks, 1) == options_.world_size - 1) {
        read.push_back(acks);
        drop(read);
    }
    return value;
}

ELASTIC_DECL std::vector<std::string> group::all_gather(std::string bytes) {
    if (options_.world_size == 1) return {std::move(bytes)};
    return exchange("all_gather", std::move(bytes), true);
}

ELASTIC_DECL std::vector<std::string> group::gather(std::string bytes, int root) {
    check_rank(root, "gather root");
    if (options_.world_size == 1) return {std::move(bytes)};
    const auto n = next_++;
    const auto keys = keys_of(n);
    if (options_.rank != root) {
        put(keys[static_cast<std::size_t>(options_.rank)], bytes, false);  // the root deletes it
        return {};
    }
    std::vector<std::string> others;
    std::vector<int> owners;
    for (int r = 0; r < options_.world_size; ++r)
        if (r != root) {
            others.push_back(keys[static_cast<std::size_t>(r)]);
            owners.push_back(r);
        }
    const auto mark = written_.size();
    await("gather", n, others, owners);
    std::vector<std::string> read = others;
    auto got = fetch(others, &read);
    drop(read);
    forget_before(mark);  // every rank reached collective n
    got.insert(got.begin() + root, std::move(bytes));
    return got;
}

ELASTIC_DECL std::string group::scatter(std::vector<std::string> parts, int root) {
    check_rank(root, "scatter root");
    const auto world = static_cast<std::size_t>(options_.world_size);
    if (options_.rank == root && parts.size() != world) {
        const auto why = elastic::detail::format("root {} has {} values for {} ranks (it needs one per rank)", root,
                                                 parts.size(), world);
        if (world > 1) abandon("scatter", part::others, root, why);
        throw std::invalid_argument("elastic::dist::scatter: " + why);
    }
    if (world == 1) return std::move(parts[0]);
    const auto n = next_++;
    const auto keys = keys_of(n);
    if (options_.rank == root) {
        for (std::size_t r = 0; r < world; ++r)
            if (static_cast<int>(r) != root) put(keys[r], parts[r], false);  // each receiver deletes its own
        return std::move(parts[static_cast<std::size_t>(root)]);
    }
    const std::vector<std::string> mine(1, keys[static_cast<std::size_t>(options_.rank)]);
    await("scatter", n, mine, {root});
    std::vector<std::string> read = mine;
    auto value = std::move(fetch(mine, &read)[0]);
    drop(read);
    return value;
}

ELASTIC_DECL void group::abandon(std::string_view what, part p, int root, std::string_view why) noexcept {
    const auto n = next_++;
    if (p == part::none || !client_) return;
    try {
        const auto message = elastic::detail::format("elastic::dist::{} #{}: rank {} could not take part: {}", what, n,
                                                     options_.rank, why);
        if (p == part::root) {
            put_error(elastic::detail::format("{}/{}/root", options_.key_namespace, n), message);
        } else if (p == part::reducer) {
            put_error(keys_of(n)[static_cast<std::size_t>(options_.rank)], message);
            put_error(elastic::detail::format("{}/{}/result", options_.key_namespace, n), message);
        } else {
            const auto keys = keys_of(n);
            for (int r = 0; r < options_.world_size; ++r)
                if (p == part::own ? r == options_.rank : r != root)
                    put_error(keys[static_cast<std::size_t>(r)], message);
        }
    } catch (...) {
        // The store failed too: the others find out at their timeout, naming this rank.
    }
}

ELASTIC_DECL void group::claim_rank() {
    if (!client_) return;
    const auto key = elastic::detail::format("{}/members/{}", options_.key_namespace, options_.rank);
    if (const auto claims = client_->add(key, 1); claims != 1)
        throw std::logic_error(
            elastic::detail::format("elastic::dist: {} processes claim rank {} of the group '{}': its ranks "
                                    "come from LOCAL_RANK and GROUP_RANK, and workers started with "
                                    "--virtual-local-rank all have LOCAL_RANK 0, so they cannot form the "
                                    "node groups",
                                    claims, options_.rank, options_.key_namespace));
}

ELASTIC_DECL void group::check_rank(int r, std::string_view what) const {
    if (r < 0 || r >= options_.world_size)
        throw std::invalid_argument(elastic::detail::format("elastic::dist: {} {} is outside 0..{}", what, r,
                                                            options_.world_size - 1));
}

ELASTIC_DECL std::vector<std::string> group::keys_of(std::uint64_t n) const {
    std::vector<std::string> keys;
    keys.reserve(static_cast<std::size_t>(options_.world_size));
    for (int r = 0; r < options_.world_size; ++r)
        keys.push_back(elastic::detail::format("{}/{}/{}", options_.key_namespace, n, r));
    return keys;
}

namespace detail {
// A stored value's first byte: the payload itself, an index of chunks, or an error to raise.
inline constexpr char frame_value = 'v';
inline constexpr char frame_chunked = 'c';
inline constexpr char frame_error = 'e';
// Payloads up to this size sit in the head itself.
inline constexpr std::size_t inline_payload = 64 * 1024;
// What one MULTI_GET may bring back (half our server's reply limit).
inline constexpr std::size_t fetch_budget = std::size_t{32} << 20;
}  // namespace detail

ELASTIC_DECL void group::put(const std::string& key, std::string_view payload, bool keep) {
    if (payload.size() <= detail::inline_payload) {
        std::string head(1, detail::frame_value);
        head.append(payload);
        client_->set(key, std::move(head));
        if (keep) written_.push_back(key);
        return;
    }
    const auto chunk = options_.chunk_size;
    const auto count = static_cast<std::uint32_t>((payload.size() + chunk - 1) / chunk);
    for (std::uint32_t i = 0; i < count; ++i) {
        auto k = elastic::detail::format("{}/{}", key, i);
        client_->set(k, std::string(payload.substr(std::size_t{i} * chunk, chunk)));
        if (keep) written_.push_back(std::move(k));
    }
    std::string head(1, detail::frame_chunked);
    const auto total = static_cast<std::uint64_t>(payload.size());
    head.append(reinterpret_cast<const char*>(&total), sizeof total);
    head.append(reinterpret_cast<const char*>(&count), sizeof count);
    client_->set(key, std::move(head));  // last: readers wait for the head
    if (keep) written_.push_back(key);
}

ELASTIC_DECL void group::put_error(const std::string& key, std::string_view message) {
    std::string head(1, detail::frame_error);
    head.append(message);
    client_->set(key, std::move(head));
    written_.push_back(key);
}

ELASTIC_DECL void group::drop(const std::vector<std::string>& keys) {
    for (const auto& k : keys) (void)client_->delete_key(k);
}

ELASTIC_DECL std::vector<std::string> group::fetch(const std::vector<std::string>& keys,
                                                   std::vector<std::string>* chunks) {
    std::vector<std::string> heads;
    heads.reserve(keys.size());
    const std::size_t per_request = detail::fetch_budget / (detail::inline_payload + 64);
    for (std::size_t i = 0; i < keys.size(); i += per_request) {
        std::vector<std::string> batch(keys.begin() + static_cast<std::ptrdiff_t>(i),
                                       keys.begin() +
                                           static_cast<std::ptrdiff_t>(std::min(keys.size(), i + per_request)));
        for (auto& v : client_->multi_get(std::move(batch))) heads.push_back(std::move(v));
    }
    std::vector<std::string> out(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
        auto& head = heads[i];
        const auto bad = [&](std::string_view why) {
            return store_error(
                elastic::detail::format("elastic::dist: key '{}' holds {} bytes that elastic::dist did not write "
                                        "({}): another program wrote under the key namespace '{}'",
                                        keys[i], head.size(), why, options_.key_namespace));
        };
        if (head.empty()) throw bad("an empty value");
        if (head[0] == detail::frame_value) {
            out[i] = head.substr(1);
        } else if (head[0] == detail::frame_error) {
            throw store_error(head.substr(1));
        } else if (head[0] == detail::frame_chunked) {
            std::uint64_t total = 0;
            std::uint32_t count = 0;
            if (head.size() != 1 + sizeof total + sizeof count) throw bad("a chunk index of the wrong size");
            std::memcpy(&total, head.data() + 1, sizeof total);
            std::memcpy(&count, head.data() + 1 + sizeof total, sizeof count);
            // A writer's chunks are 4 KiB .. 16 MiB, all full but the last.
            if (count == 0 || total < count || total / count > (std::uint64_t{16} << 20) ||
                count > (total + 4095) / 4096)
                throw bad(elastic::detail::format("{} bytes in {} chunks", total, count));
            const auto per_chunk = static_cast<std::size_t>((total + count - 1) / count);
            const std::size_t per_batch = std::clamp<std::size_t>(detail::fetch_budget / per_chunk, 1, 1024);
            // Grown as the chunks arrive, never reserved from the header: a forged total costs
            // nothing until the store really holds that much.
            std::string value;
            for (std::uint32_t c = 0; c < count; c += static_cast<std::uint32_t>(per_batch)) {
                std::vector<std::string> batch;
                for (std::uint32_t j = c; j < count && j < c + per_batch; ++j)
                    batch.push_back(elastic::detail::format("{}/{}", keys[i], j));
                if (chunks) chunks->insert(chunks->end(), batch.begin(), batch.end());
                for (const auto& chunk : client_->multi_get(std::move(batch))) {
                    if (value.size() + chunk.size() > total) break;
                    value += chunk;
                }
            }
            if (value.size() != total)
                throw bad(elastic::detail::format("{} bytes in its chunks, not {}", value.size(), total));
            out[i] = std::move(value);
        } else {
            throw bad(elastic::detail::format("first byte {:#04x}", static_cast<unsigned char>(head[0])));
        }
        head = std::string();
    }
    return out;
}

ELASTIC_DECL void group::await(std::string_view what, std::uint64_t n, const std::vector<std::string>& keys,
                               const std::vector<int>& owners) {
    try {
        client_->wait(keys, options_.timeout);
    } catch (const store_timeout&) {
        std::vector<int> missing;
        for (std::size_t i = 0; i < keys.size(); ++i) {
            std::vector<std::string> one(1, keys[i]);
            const int owner = owners[std::min(i, owners.size() - 1)];
            if (!client_->check(std::move(one)) && std::find(missing.begin(), missing.end(), owner) == missing.end())
                missing.push_back(owner);
        }
        throw timeout_error(what, n, std::move(missing));
    }
}

ELASTIC_DECL void group::forget_before(std::size_t mark) {
    // Every rank has reached the current collective, so each has finished everything before it:
    // nobody reads the keys this rank wrote earlier any more.
    for (std::size_t i = 0; i < mark; ++i) (void)client_->delete_key(written_[i]);
    written_.erase(written_.begin(), written_.begin() + static_cast<std::ptrdiff_t>(mark));
}

ELASTIC_DECL std::vector<std::string> group::exchange(std::string_view what, std::string payload, bool read) {
    const auto n = next_++;
    const auto keys = keys_of(n);
    std::vector<int> owners(keys.size());
    for (std::size_t r = 0; r < owners.size(); ++r) owners[r] = static_cast<int>(r);
    const auto mark = written_.size();
    put(keys[static_cast<std::size_t>(options_.rank)], payload);
    await(what, n, keys, owners);
    std::vector<std::string> out;
    if (read) out = fetch(keys);
    forget_before(mark);
    return out;
}

ELASTIC_DECL group::reduce_result group::reduce_exchange(std::string mine, std::size_t header_size) {
    const auto n = next_++;
    const auto keys = keys_of(n);
    std::vector<int> owners(keys.size());
    for (std::size_t r = 0; r < owners.size(); ++r) owners[r] = static_cast<int>(r);
    const auto world = keys.size();
    const bool large = world * mine.size() > 256 * 1024;
    const auto result_key = elastic::detail::format("{}/{}/result", options_.key_namespace, n);
    const auto mark = written_.size();
    put(keys[static_cast<std::size_t>(options_.rank)], mine);
    reduce_result result;
    result.n = n;
    if (large && options_.rank != 0) {
        // Rank 0 combines; its result (or its complaint) comes back under <n>/result. Every
        // array first, with the same timeout as rank 0's wait for them, so that a late rank is
        // named by every rank alike; then rank 0's answer, within a timeout of its own.
        await("all_reduce", n, keys, owners);
        const std::vector<std::string> answer(1, result_key);
        await("all_reduce", n, answer, {0});
        result.parts = fetch(answer);
        if (result.parts[0].size() != mine.size() - header_size)
            throw store_error(
                elastic::detail::format("elastic::dist::all_reduce #{}: rank 0 returned {} bytes for {} (another "
                                        "program wrote under '{}'?)",
                                        n, result.parts[0].size(), mine.size() - header_size, options_.key_namespace));
        result.from_root = true;
        forget_before(mark);
        return result;
    }
    const auto describe = [&](const std::string& contribution) {
        if (contribution.size() < header_size) return elastic::detail::format("{} bytes", contribution.size());
        std::uint64_t count = 0;
        std::memcpy(&count, contribution.data() + 3, sizeof count);
        static constexpr std::array<std::string_view, 8> ops{"sum",  "min", "max",  "product",
                                                             "band", "bor", "bxor", "avg"};
        const auto op = static_cast<unsigned char>(contribution[2]);
        return elastic::detail::format("{} values of {}{}-bit type with {}", count,
                                       contribution[0] == 'f'   ? "a floating "
                                       : contribution[0] == 'i' ? "a signed "
                                                                : "an unsigned ",
                                       8 * static_cast<unsigned char>(contribution[1]),
                                       op < ops.size() ? ops[op] : "?");
    };
    try {
        await("all_reduce", n, keys, owners);
        result.parts = fetch(keys);
        forget_before(mark);
        for (std::size_t r = 0; r < world; ++r) {
            const auto& contribution = result.parts[r];
            if (contribution.size() == mine.size() && contribution.compare(0, header_size, mine, 0, header_size) == 0)
                continue;
            throw store_error(
                elastic::detail::format("elastic::dist::all_reduce #{}: rank {} reduces {}, rank {} {}: every rank "
                                        "must reduce as many values of the same type with the same operation",
                                        n, r, describe(contribution), options_.rank, describe(mine)));
        }
    } catch (const std::exception& e) {
        // Rank 0 tells the ranks that wait for its result (a large reduce, or ranks that took the
        // large path because their arrays differ in size) why none comes.
        if (options_.rank == 0) {
            try {
                put_error(result_key, e.what());
            } catch (...) {
                // the store failed too: they find out at their timeout
            }
        }
        throw;
    }
    result.publish = large;  // rank 0 of a large reduce
    return result;
}

ELASTIC_DECL void group::reduce_publish(std::uint64_t n, std::string data) {
    put(elastic::detail::format("{}/{}/result", options_.key_namespace, n), data);
}

ELASTIC_DECL dist_timeout group::timeout_error(std::string_view what, std::uint64_t n, std::vector<int> missing) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 32; ++i)
        list += elastic::detail::format("{}{}", i ? ", " : "", missing[i]);
    if (missing.size() > 32) list += elastic::detail::format(" and {} more", missing.size() - 32);
    // The message first: the vector is moved into the exception after it.
    auto message = elastic::detail::format("elastic::dist::{} #{} on rank {} of {}: rank{} {} did not arrive within "
                                           "{} ms (exited, hung, or called the collectives in another order); "
                                           "store {}:{}, keys '{}/{}/'",
                                           what, n, options_.rank, options_.world_size, missing.size() == 1 ? "" : "s",
                                           missing.empty() ? "?" : list, options_.timeout.count(), options_.host,
                                           options_.port, options_.key_namespace, n);
    return dist_timeout(message, std::move(missing));
}

}  // namespace dist
#endif  // definitions

namespace detail::worker {

// elastic::dist's process-wide groups, built on first use: the world, the node's workers, the
// node leaders.
struct dist_world {
    std::mutex mutex;
    std::optional<std::chrono::milliseconds> timeout;  // dist::set_timeout or initialize
    std::optional<dist::group> world;
    std::optional<dist::group> local;
    std::optional<dist::group> leaders;

    void build(std::optional<dist::group>& g, dist::group_options o) {
        if (timeout) o.timeout = *timeout;
        g.emplace(std::move(o));
    }

    // A node group, built on first use once its rank is known to be this process's alone.
    dist::group& node_group(std::optional<dist::group>& g, dist::group_options o) {
        if (!g) {
            build(g, std::move(o));
            try {
                g->claim_rank();
            } catch (...) {
                g.reset();
                throw;
            }
        }
        return *g;
    }
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
    if (!s.world) s.build(s.world, dist::options_from(env()));
    return std::forward<F>(f)(*s.world);
}

}  // namespace detail::worker

namespace dist {

/// elastic::dist works wherever the program runs (a single process needs no store): always true.
constexpr bool is_available() noexcept { return true; }

/// True once the process-wide group exists: after a successful initialize() or the first
/// collective.
inline bool is_initialized() {
    auto& s = elastic::detail::worker::dist_world_instance();
    const std::lock_guard lock(s.mutex);
    return s.world.has_value();
}

/// Joins the job's group now rather than at the first collective (composer's initialize_dist):
/// connects to the store at MASTER_ADDR:MASTER_PORT and waits until every rank has called it,
/// each within `timeout`, which also becomes the collectives' timeout. A collective: every rank
/// calls it. A store that cannot be reached is a store_error naming MASTER_ADDR:MASTER_PORT; a
/// rank that does not come, a dist_timeout naming it.
inline void initialize(std::chrono::milliseconds timeout = std::chrono::minutes(30)) {
    auto& s = elastic::detail::worker::dist_world_instance();
    const std::lock_guard lock(s.mutex);
    s.timeout = timeout;
    const bool built_here = !s.world;
    if (built_here) {
        auto o = options_from(env());
        o.connect_timeout = timeout;
        s.build(s.world, std::move(o));
    }
    for (auto* g : {&s.world, &s.local, &s.leaders})
        if (*g) (*g)->set_timeout(timeout);
    if (s.world->world_size() == 1) return;
    try {
        try {
            s.world->connect();
        } catch (const store_error& e) {
            throw store_error(
                elastic::detail::format("elastic::dist::initialize: cannot reach the job's store at MASTER_ADDR:"
                                        "MASTER_PORT = {}:{} within {} ms ({}); is the launcher (elasticrun, "
                                        "torchrun) still running, and are both variables what it set?",
                                        s.world->options().host, s.world->options().port, timeout.count(), e.what()));
        }
        s.world->barrier();
    } catch (...) {
        // Not initialized: a later initialize (or collective) starts over with a group of its own.
        if (built_here) s.world.reset();
        throw;
    }
}

/// This node's workers as a group (see local_options_from), built on first use. Not thread-safe:
/// use it from one thread at a time.
inline group& local_group() {
    auto& s = elastic::detail::worker::dist_world_instance();
    const std::lock_guard lock(s.mutex);
    return s.node_group(s.local, local_options_from(env()));
}

/// The node leaders (local rank 0 of every node) as a group (see leaders_options_from), built on
/// first use; std::logic_error on any other local rank. Not thread-safe.
inline group& leaders_group() {
    auto& s = elastic::detail::worker::dist_world_instance();
    const std::lock_guard lock(s.mutex);
    return s.node_group(s.leaders, leaders_options_from(env()));
}

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
/// GROUP_WORLD_SIZE: the number of nodes.
inline int get_node_count() { return env().node_count; }

/// Waits for every rank (see group::barrier).
inline void barrier() {
    elastic::detail::worker::with_dist_world([](group& g) { g.barrier(); });
}
/// `root`'s bytes on every rank (see group::broadcast).
inline std::string broadcast(std::string bytes, int root = 0) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.broadcast(std::move(bytes), root); });
}
/// `root`'s value on every rank.
template <serializable T>
T broadcast(const T& value, int root = 0) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.broadcast(value, root); });
}
/// Every rank's bytes, by rank (see group::all_gather).
inline std::vector<std::string> all_gather(std::string bytes) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.all_gather(std::move(bytes)); });
}
/// Every rank's value, by rank.
template <serializable T>
std::vector<T> all_gather(const T& value) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.all_gather(value); });
}
/// Every rank's bytes on `root` (empty elsewhere; see group::gather).
inline std::vector<std::string> gather(std::string bytes, int root = 0) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.gather(std::move(bytes), root); });
}
/// Every rank's value on `root`, by rank; empty elsewhere.
template <serializable T>
std::vector<T> gather(const T& value, int root = 0) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.gather(value, root); });
}
/// `root`'s parts[r] on rank r (see group::scatter).
inline std::string scatter(std::vector<std::string> parts, int root = 0) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.scatter(std::move(parts), root); });
}
/// `root`'s values[r] on rank r.
template <serializable T>
T scatter(const std::vector<T>& values, int root = 0) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.scatter(values, root); });
}
/// composer's all_gather_object: every rank's object, by rank.
template <serializable T>
std::vector<T> all_gather_object(const T& object) {
    return all_gather(object);
}
/// composer's broadcast_object_list: `objects` becomes root's list on every rank.
template <serializable T>
void broadcast_object_list(std::vector<T>& objects, int root = 0) {
    objects = broadcast(objects, root);
}
/// An array combined element by element over every rank, in place (see group::all_reduce).
template <reducible T>
void all_reduce(std::span<T> data, reduce_op op = reduce_op::sum) {
    elastic::detail::worker::with_dist_world([&](group& g) { g.all_reduce(data, op); });
}
/// A contiguous range (std::vector, std::array) combined over every rank, in place.
// clang-format off
template <class R>
    requires std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
             reducible<std::ranges::range_value_t<R>> && (!std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>)
void all_reduce(R& range, reduce_op op = reduce_op::sum) {
    // clang-format on
    elastic::detail::worker::with_dist_world([&](group& g) { g.all_reduce(range, op); });
}
/// A scalar combined over every rank (see group::all_reduce).
template <reducible T>
T all_reduce(T value, reduce_op op = reduce_op::sum) {
    return elastic::detail::worker::with_dist_world([&](group& g) { return g.all_reduce(value, op); });
}
/// How long the process-wide groups' collectives wait for the other ranks (default 30 min).
inline void set_timeout(std::chrono::milliseconds t) {
    auto& s = elastic::detail::worker::dist_world_instance();
    const std::lock_guard lock(s.mutex);
    s.timeout = t;
    for (auto* g : {&s.world, &s.local, &s.leaders})
        if (*g) (*g)->set_timeout(t);
}

/// Runs `f` on local rank 0 first, then, once it has returned, on the node's other workers
/// (composer's run_local_rank_zero_first): for work one process per node must do before the
/// others use it, such as unpacking a dataset. A collective of the node's workers, each waiting
/// up to the timeout. If `f` throws on local rank 0, its exception goes on there and every other
/// worker of the node gets a store_error with its message, without running `f`.
template <class F>
std::invoke_result_t<F&> run_local_rank_zero_first(F&& f) {
    using R = std::invoke_result_t<F&>;
    auto& g = local_group();
    if (g.rank() != 0) {
        const auto status = g.broadcast(std::string(), 0);
        if (!status.empty())
            throw store_error(
                elastic::detail::format("elastic::dist::run_local_rank_zero_first: local rank 0 failed, so "
                                        "local rank {} does not run: {}",
                                        g.rank(), status));
        return f();
    }
    // Tells the others that rank 0 failed, with what (never an empty status: that means done).
    const auto tell = [&g] {
        std::string why = "an exception that is not a std::exception";
        try {
            throw;
        } catch (const std::exception& e) {
            why = *e.what() ? e.what() : "an exception with no message";
        } catch (...) {
        }
        try {
            (void)g.broadcast(std::move(why), 0);
        } catch (...) {
            // the store failed too: the others time out naming local rank 0; f's exception goes on
        }
    };
    if constexpr (std::is_void_v<R>) {
        try {
            f();
        } catch (...) {
            tell();
            throw;
        }
        (void)g.broadcast(std::string(), 0);
    } else {
        R result = [&]() -> R {
            try {
                return f();
            } catch (...) {
                tell();
                throw;
            }
        }();
        (void)g.broadcast(std::string(), 0);
        return std::forward<R>(result);
    }
}

/// Waits on every worker of the node until `path` exists, local rank 0 having made it (composer's
/// local_rank_zero_download_and_wait). A collective of the node's workers: local rank 0 calls it
/// once the file is in place and does not wait; the others return when it has, without polling.
/// The file missing on local rank 0, or missing for another worker after rank 0 saw it (not the
/// same filesystem), is a store_error on every worker of the node naming the path.
inline void local_rank_zero_download_and_wait(const std::string& path) {
    auto& g = local_group();
    struct stat st {};
    if (g.rank() == 0) {
        const bool there = ::stat(path.c_str(), &st) == 0;
        const auto message =
            there ? std::string()
                  : elastic::detail::format(
                        "elastic::dist::local_rank_zero_download_and_wait: local rank 0 found no '{}' ({}); "
                        "it must download or create the file before calling",
                        path, std::strerror(errno));
        (void)g.broadcast(message, 0);
        if (!there) throw store_error(message);
        return;
    }
    const auto status = g.broadcast(std::string(), 0);
    if (!status.empty()) throw store_error(status);
    if (::stat(path.c_str(), &st) != 0)
        throw store_error(
            elastic::detail::format("elastic::dist::local_rank_zero_download_and_wait: local rank 0 has '{}', but "
                                    "local rank {} cannot see it ({}): do the node's workers share that filesystem?",
                                    path, g.rank(), std::strerror(errno)));
}

}  // namespace dist
}  // namespace elastic::inline v0
