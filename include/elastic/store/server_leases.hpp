// SPDX-License-Identifier: MIT
// The server's leases (docs/store.md, "Leases"): which connection holds each lease key, which
// writes to lease keys are refused, and how a lost lease is recorded in the key table.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/store/engine.hpp"
#include "elastic/store/errors.hpp"
#include "elastic/store/lease.hpp"
#include "elastic/store/wire.hpp"

#include "elastic/detail/format.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace elastic::inline v0::detail::store {

class store_connection;

class store_lease_table {
public:
    // Why a write to a lease key is refused, or empty when it is allowed. `binds`: SET,
    // MULTI_SET and COMPARE_SET bind a lease; ADD and APPEND cannot (a lease's value is the
    // holder's, set whole); nobody writes the server's own names (__epoch, __silent, __lost/<n>).
    static ELASTIC_DECL std::string refusal(wire::op o, std::string_view key, bool binds);

    // The connection that holds the lease at `key`, or null.
    ELASTIC_DECL store_connection* holder(std::string_view key) const;

    // `key` now belongs to `c`; false when it was bound already.
    ELASTIC_DECL bool bind(std::string_view key, store_connection* c);

    // `key` is bound no more (released or lost); the connection that held it, or null.
    ELASTIC_DECL store_connection* unbind(std::string_view key) noexcept;

    // The number of leases held now, and lost since the start.
    std::size_t size() const noexcept { return holders_.size(); }
    std::uint64_t lost() const noexcept { return lost_; }

    // A lease ends without its holder: delete the key, count the loss in the group's epoch (and
    // a silent one in __silent) and name the lost lease under __lost/<epoch>, whose creation
    // wakes the observers by push. `records_kept`: store_server_options::lease_lost_records_kept;
    // `log` takes a line.
    template <class Log>
    void record_loss(store_engine& engine, std::int64_t records_kept, std::string_view key, std::string_view holder,
                     std::string_view why, bool silent, const Log& log) {
        const auto parts = parse_lease_key(key);
        if (!parts) return;
        engine.erase(key);
        const std::string space(parts->space);
        std::int64_t epoch = 0;
        try {
            epoch = engine.add(space + "__epoch", 1);
        } catch (const store_error& e) {
            // Only an in-process writer (memory_store over engine()) can have spoiled it.
            log(detail::format("lease '{}' of {} lost ({}), but its epoch cannot count it: {}",
                               store_engine::printable(key), holder, why, e.what()));
            return;
        }
        ++lost_;
        // Counted before the record that wakes the observers, so that they read it with the loss.
        if (silent) {
            try {
                (void)engine.add(space + "__silent", 1);
            } catch (...) {
                // Spoiled in process (memory_store over engine()), or out of memory: the loss is
                // still recorded below; the count stays as it is (never lowered).
                log(detail::format("lease '{}' of {} lost silently, but {}__silent cannot count it",
                                   store_engine::printable(key), holder, store_engine::printable(space)));
            }
        }
        engine.set(detail::format("{}__lost/{}", space, epoch), parts->name);
        // The records do not pile up: an observer reads each one as it comes (it waits for the
        // next by push), and a new observer starts at the epoch. Older ones than this go.
        const auto kept = std::max<std::int64_t>(records_kept, 1);
        if (epoch > kept) engine.erase(detail::format("{}__lost/{}", space, epoch - kept));
        log(detail::format("lease '{}' of {} lost{}: {}; {}__epoch is now {}", store_engine::printable(key), holder,
                           silent ? " (silent)" : "", why, store_engine::printable(space), epoch));
    }

private:
    // Which connection holds each lease key (wire key -> holder).
    std::unordered_map<std::string, store_connection*, store_string_hash, std::equal_to<>> holders_;
    std::uint64_t lost_ = 0;
};

}  // namespace elastic::inline v0::detail::store

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::store {

ELASTIC_DECL std::string store_lease_table::refusal(wire::op o, std::string_view key, bool binds) {
    const auto parts = parse_lease_key(key);
    if (!parts) return {};
    if (parts->reserved())
        return detail::format("malformed lease request: {} of '{}', a name the server keeps "
                              "(names after '{}' starting with '__' are read-only; "
                              "docs/store.md, Leases)",
                              wire::name(o), store_engine::printable(key), lease_marker);
    if (parts->name.empty())
        return detail::format("malformed lease request: {} of '{}' names no lease (a lease key "
                              "is <group>/{}<name>, name not empty)",
                              wire::name(o), store_engine::printable(key), lease_marker);
    if (!binds)
        return detail::format("malformed lease request: {} of lease key '{}' (a lease is bound "
                              "by SET, MULTI_SET or COMPARE_SET and released by DELETE_KEY)",
                              wire::name(o), store_engine::printable(key));
    return {};
}

ELASTIC_DECL store_connection* store_lease_table::holder(std::string_view key) const {
    const auto it = holders_.find(key);
    return it == holders_.end() ? nullptr : it->second;
}

ELASTIC_DECL bool store_lease_table::bind(std::string_view key, store_connection* c) {
    if (holders_.find(key) != holders_.end()) return false;
    holders_.emplace(std::string(key), c);
    return true;
}

ELASTIC_DECL store_connection* store_lease_table::unbind(std::string_view key) noexcept {
    const auto it = holders_.find(key);
    if (it == holders_.end()) return nullptr;
    auto* c = it->second;
    holders_.erase(it);
    return c;
}

}  // namespace elastic::inline v0::detail::store

#endif  // ELASTIC_DETAIL_BODIES
