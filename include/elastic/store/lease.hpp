// SPDX-License-Identifier: MIT
// Leases in the TCP store: the reserved key namespace `<group>/__lease__/<name>`, the keys an
// observer reads (`__epoch`, `__silent`, `__lost/<n>`) and the parser the server and the client share.
#pragma once

#include "elastic/detail/config.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

// A lease is a key bound to the connection that set it: when that connection closes, or stays
// silent longer than the server's heartbeat deadline, the server deletes the key and records the
// loss in keys next to it, so observers are woken by push (docs/store.md, "Leases"):
//
//   <group>/__lease__/<name>       the lease itself; its value is whatever the holder set
//   <group>/__lease__/__epoch      decimal count of losses in the group ("0" once a lease exists)
//   <group>/__lease__/__silent     decimal count of those losses that were silent ("0" likewise)
//   <group>/__lease__/__lost/<n>   the name of the n-th lost lease (n = 1, 2, ...)
//
// An observer that has read epoch e waits for `__lost/<e+1>`: one WAIT, answered by the loss.
// Names starting with "__" are the server's; clients may read them but never write them.
namespace elastic::inline v0 {

/// The segment that marks a lease key: at the start of a wire key or right after a '/'.
inline constexpr std::string_view lease_marker = "__lease__/";

namespace detail::store {

ELASTIC_DECL std::string lease_space(std::string_view group);

}  // namespace detail::store

/// The key of lease `name` in `group` ("" for none): `<group>/__lease__/<name>`. `name` must
/// not be empty nor start with "__" (hold_lease and the server refuse such names).
ELASTIC_DECL std::string lease_key(std::string_view group, std::string_view name);

/// The loss counter of `group`: `<group>/__lease__/__epoch` (decimal, "0" when the first lease
/// of the group is bound, +1 per lost lease).
ELASTIC_DECL std::string lease_epoch_key(std::string_view group);

/// The silent-loss counter of `group`: `<group>/__lease__/__silent` (decimal, "0" when the
/// first lease of the group is bound, +1 per lease lost without word from its holder's side: its
/// heartbeat deadline passed, its bytes stopped mid-request or mid-reply, or its connection ended
/// while the server itself had not run for a while, so the holder may have given up on the
/// server's silence). A holder that was killed closes its connection at once; one cut off by the
/// network, stopped, or on a machine that died goes silent: the counter tells the two apart.
ELASTIC_DECL std::string lease_silent_key(std::string_view group);

/// The key that names the `epoch`-th lost lease of `group`: `<group>/__lease__/__lost/<epoch>`.
/// Waiting for `lease_lost_key(group, e + 1)` after reading epoch e wakes at the next loss.
ELASTIC_DECL std::string lease_lost_key(std::string_view group, std::int64_t epoch);

/// A wire key split at its lease marker.
struct lease_key_parts {
    std::string_view space;  ///< everything up to and including "__lease__/"
    std::string_view name;   ///< what follows (may be empty: a malformed lease key)
    /// The name is the server's (starts with "__": `__epoch`, `__silent`, `__lost/<n>`).
    [[nodiscard]] bool reserved() const noexcept { return name.substr(0, 2) == "__"; }
};

/// Splits `key` at its first lease marker (one at the start or right after a '/'), or nothing
/// when `key` is an ordinary key.
ELASTIC_DECL std::optional<lease_key_parts> parse_lease_key(std::string_view key) noexcept;

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::store {

ELASTIC_DECL std::string lease_space(std::string_view group) {
    std::string out(group);
    if (!out.empty() && out.back() != '/') out.push_back('/');
    out.append(lease_marker);
    return out;
}

}  // namespace detail::store
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL std::string lease_key(std::string_view group, std::string_view name) {
    return detail::store::lease_space(group).append(name);
}

ELASTIC_DECL std::string lease_epoch_key(std::string_view group) {
    return detail::store::lease_space(group).append("__epoch");
}

ELASTIC_DECL std::string lease_silent_key(std::string_view group) {
    return detail::store::lease_space(group).append("__silent");
}

ELASTIC_DECL std::string lease_lost_key(std::string_view group, std::int64_t epoch) {
    return detail::store::lease_space(group).append("__lost/").append(std::to_string(epoch));
}

ELASTIC_DECL std::optional<lease_key_parts> parse_lease_key(std::string_view key) noexcept {
    for (std::size_t pos = key.find(lease_marker); pos != std::string_view::npos;
         pos = key.find(lease_marker, pos + 1)) {
        if (pos == 0 || key[pos - 1] == '/') {
            const auto end = pos + lease_marker.size();
            return lease_key_parts{key.substr(0, end), key.substr(end)};
        }
    }
    return std::nullopt;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
