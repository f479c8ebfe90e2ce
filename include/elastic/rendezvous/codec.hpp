// SPDX-License-Identifier: MIT
// The rendezvous's store values (docs/rendezvous.md, "What the agents trust"): how a node's
// info, an assignment, an abort notice and a decision are written, and how each is read back
// and checked, since any client of the store may have written it.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/rendezvous/concepts.hpp"
#include "elastic/rendezvous/error.hpp"

#include <asio/ip/address.hpp>
#include "elastic/detail/format.hpp"
#if ELASTIC_DETAIL_BODIES
#include <nlohmann/json.hpp>
#endif

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

namespace detail::rendezvous {

/// A store value that is not what the rendezvous wrote there: bad JSON, a wrong type, a value
/// out of range. The rendezvous reports it (naming the key) and ignores it.
struct invalid_value : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// At most this many bytes of a value are shown in a message, non-printable bytes escaped.
inline std::string shown(std::string_view value, std::size_t limit = 120) {
    std::string out;
    for (const char c : value.substr(0, std::min(value.size(), limit))) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u < 0x7f && c != '\\') out += c;
        else out += detail::format("\\x{:02x}", u);
    }
    if (value.size() > limit) out += detail::format("... ({} bytes)", value.size());
    return out;
}

/// Bounds of what a node may say of itself: names and addresses as DNS allows them, a reason
/// of a few lines, a node's workers and ranks as counted in int.
inline constexpr std::size_t max_host = 255;
inline constexpr std::size_t max_id = 512;
inline constexpr std::size_t max_reason = 4096;
inline constexpr int max_nproc = 1 << 20;
inline constexpr int max_nodes = 1 << 20;
inline constexpr std::size_t max_addrs = 64;  ///< interface addresses one node publishes

/// What collect() deletes once no node can need a round any more: its arrivals (`k`), its size
/// (`n`) and its members' lease names.
struct round_manifest {
    int k = 0;
    int n = 0;
    std::vector<std::string> ids;
    /// The lease group's silent-loss count (`__silent`) when the round completed; -1: not read.
    std::int64_t silent = -1;
    /// The round's number (-1: not recorded), whose members the majority rule counts.
    int round = -1;
    /// The members' lease names by group rank (the job's `last_round` only): a member that
    /// stays away while its lease lives may be cut off and going on elsewhere.
    std::vector<std::string> by_rank{};
    /// The round formed before this one, as far as the split-brain rule still needs it (the
    /// job's `last_round` only): a member of it that never learned of this round (it wrote no
    /// `acked/<rank>`) counts that round's majority, not this one's.
    struct prior_round {
        int round = -1;
        int size = 0;
        /// Its members absent from this round that may be alive (a rule that counted them).
        std::vector<int> absent{};
        /// Its members in this round: {group rank here, group rank there}.
        std::vector<std::pair<int, int>> from{};
    };
    std::optional<prior_round> prior{};
};

/// A round formed before another: its number and size (the split-brain rule).
struct earlier_round {
    int round = 0;
    int size = 0;
};

/// `<run>/moved_from` in a store the job moved to: the last round its movers were members of,
/// and its size, until a round forms there (the majority rule counts that round's members).
/// `before`: the round formed before that one, when a mover never saw every member acknowledge
/// it (some may still go by `before`: the movers need its majority too).
struct moved_from {
    int round = 0;
    int size = 0;
    std::optional<earlier_round> before{};
};

/// Whether `text` is an IPv4 or IPv6 address literal.
inline bool is_address_literal(const std::string& text) {
    std::error_code ec;
    (void)asio::ip::make_address(text, ec);
    return !ec;
}

// Each decoder reads a value any client of the store may have written: invalid_value (never
// another exception) when it is not what the rendezvous writes there. The JSON code is compiled
// where ELASTIC_DETAIL_BODIES says (with ELASTIC_SEPARATE_COMPILATION, in one file only).

/// A node's info, as an arrival writes it.
ELASTIC_DECL std::string encode(const node_info& i);
/// A node's info (an arrival).
ELASTIC_DECL node_info decode_node(std::string_view text);
/// A node's assignment, as the completer writes it (with `peers` for group rank 0 only), and
/// the round formed before it when the split-brain rule keeps one.
ELASTIC_DECL std::string encode(const rendezvous_round& r, const std::optional<earlier_round>& before = std::nullopt);
/// The round formed before an assignment's (nothing when it names none); invalid_value when it
/// is no round before the assignment's `round` of at most `nnodes` nodes.
ELASTIC_DECL std::optional<earlier_round> decode_assignment_before(std::string_view text, int round, int nnodes);
/// A node's assignment as the completer wrote it; rendezvous_error when the round failed;
/// nothing when the round lost a node while forming and everyone rejoins the next one;
/// invalid_value when it is no assignment of a round of at most `nnodes` nodes.
ELASTIC_DECL std::optional<rendezvous_round> decode_assignment(std::string_view text, int nnodes);
/// The assignment every arrival gets when the round lost a node while forming; `majority_of`
/// (when above 0): too few joined after a member went silent, and the rounds that follow need a
/// majority of the last round's `majority_of` nodes.
/// `prior_of`: the size of the round before the last when the round was refused because too
/// many of its members may not have learned that the last one formed.
ELASTIC_DECL std::string encode_retry(int majority_of = 0, int prior_of = 0);
/// The `majority_of` of a retry (0 when it names none, or `text` is no retry); invalid_value
/// when it is outside 1..nnodes.
ELASTIC_DECL int decode_retry_majority(std::string_view text, int nnodes);
/// The `prior_of` of a retry (0 when it names none); invalid_value when outside 1..nnodes.
ELASTIC_DECL int decode_retry_prior(std::string_view text, int nnodes);
/// The assignment of an arrival the round left out because it wrote no info in time: a retry
/// (an older agent retries the next round) that tells this one the round formed without it.
ELASTIC_DECL std::string encode_left_out();
/// Whether an assignment is encode_left_out()'s (false for anything else, valid or not).
ELASTIC_DECL bool is_left_out(std::string_view text);
/// The assignment every arrival gets when the round failed: `message` says why.
ELASTIC_DECL std::string encode_round_error(std::string_view message);
/// `<round>/successors`, for a standby: whether the store's host was a member, and the list.
ELASTIC_DECL std::string encode_round_successors(bool host_in, const std::vector<store_successor>& successors);
ELASTIC_DECL std::pair<bool, std::vector<store_successor>> decode_round_successors(std::string_view text);
/// `<round>/hosts`: each group rank's host.
ELASTIC_DECL std::string encode_hosts(const std::vector<std::string>& hosts);
ELASTIC_DECL std::vector<std::string> decode_hosts(std::string_view text);
/// `<round>/manifest`; decoded with at most `nnodes` arrivals.
ELASTIC_DECL std::string encode(const round_manifest& m);
ELASTIC_DECL round_manifest decode_manifest(std::string_view text, int nnodes);
ELASTIC_DECL std::string encode(const moved_from& m);
/// `<run>/staying` ("<round> <group rank>": the store's host that finished and stays for the
/// others); invalid_value unless both are counts (a rank below nnodes).
ELASTIC_DECL std::pair<int, int> decode_staying(std::string_view text, int nnodes);
ELASTIC_DECL moved_from decode_moved_from(std::string_view text, int nnodes);
ELASTIC_DECL std::string encode(const abort_notice& a);
/// A round's abort notice; invalid_value when it is none, or names a group rank outside a round
/// of `size` nodes (-1: a node that is no member, a standby or a lost node's observer).
ELASTIC_DECL abort_notice decode_abort(std::string_view text, int size);
ELASTIC_DECL std::string encode(const job_decision& d);
/// A decision after an aborted round; invalid_value when it is none (an exit code is 0..255).
ELASTIC_DECL job_decision decode_decision(std::string_view text);

/// A counter the rendezvous keeps as decimal text (`__epoch`, `<round>/size`): invalid_value
/// unless it is a whole number within [lo, hi].
inline std::int64_t decode_count(std::string_view text, std::int64_t lo, std::int64_t hi) {
    std::int64_t v = 0;
    const auto* end = text.data() + text.size();
    const auto [p, ec] = std::from_chars(text.data(), end, v);
    if (ec != std::errc{} || p != end || text.empty()) throw invalid_value("not a whole number");
    if (v < lo || v > hi) throw invalid_value(detail::format("{} is outside {}..{}", v, lo, hi));
    return v;
}

/// What a torchrun agent's C10dRendezvousBackend keeps its pickled state under.
inline std::string torchrun_key(const std::string& run_id) { return "torch.rendezvous." + run_id; }

/// What elastic writes at that key: not base64 of a pickle, so a torchrun agent joining the
/// same run stops with "the rendezvous state is corrupt" instead of mixing with us.
inline std::string guard_value(const std::string& run_id) {
    return detail::format("elasticrun rendezvous of run '{}' (not a torchrun state)", run_id);
}

}  // namespace detail::rendezvous

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::rendezvous {

namespace codec {

inline nlohmann::json parse_object(std::string_view text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) throw invalid_value("not JSON");
    if (!j.is_object()) throw invalid_value("not a JSON object");
    return j;
}

/// Field `name` of `j` as an integer within [lo, hi].
inline std::int64_t field_int(const nlohmann::json& j, const char* name, std::int64_t lo, std::int64_t hi) {
    const auto it = j.find(name);
    if (it == j.end()) throw invalid_value(detail::format("no '{}'", name));
    if (!it->is_number_integer()) throw invalid_value(detail::format("'{}' is not an integer", name));
    const auto v = it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(hi)
                       ? hi + 1
                       : it->get<std::int64_t>();
    if (v < lo || v > hi) throw invalid_value(detail::format("'{}' = {} is outside {}..{}", name, v, lo, hi));
    return v;
}

inline int field_small(const nlohmann::json& j, const char* name, std::int64_t lo, std::int64_t hi) {
    return static_cast<int>(field_int(j, name, lo, std::min<std::int64_t>(hi, 1'000'000'000)));
}

/// Field `name` of `j` as a string of at most `max` bytes (and at least `min`).
inline std::string field_string(const nlohmann::json& j, const char* name, std::size_t max, std::size_t min = 0) {
    const auto it = j.find(name);
    if (it == j.end()) throw invalid_value(detail::format("no '{}'", name));
    if (!it->is_string()) throw invalid_value(detail::format("'{}' is not a string", name));
    auto v = it->get<std::string>();
    if (v.size() > max || v.size() < min)
        throw invalid_value(detail::format("'{}' has {} bytes (allowed: {}..{})", name, v.size(), min, max));
    return v;
}

/// A lease name: 1..max_id bytes, not the server's own ("__epoch", "__lost/<n>": a key that
/// always exists would pass for a lease that is held).
inline std::string lease_name(const nlohmann::json& j, const char* name) {
    auto v = field_string(j, name, max_id, 1);
    if (v.rfind("__", 0) == 0) throw invalid_value(detail::format("'{}' is the store's own name, no lease", name));
    return v;
}

inline bool field_bool(const nlohmann::json& j, const char* name, std::optional<bool> absent = std::nullopt) {
    const auto it = j.find(name);
    if (it == j.end()) {
        if (absent) return *absent;
        throw invalid_value(detail::format("no '{}'", name));
    }
    if (!it->is_boolean()) throw invalid_value(detail::format("'{}' is not true or false", name));
    return it->get<bool>();
}

/// `decode()`, with any exception of the JSON library as invalid_value (the checks above leave
/// none, but a decoder's promise should not rest on that).
template <class Decode>
auto decoded(Decode decode) -> decltype(decode()) {
    try {
        return decode();
    } catch (const nlohmann::json::exception& e) {
        throw invalid_value(e.what());
    }
}

/// The successors a completer named: [{"id", "addr", "port"}, ...] (at most 3 are written).
inline std::vector<store_successor> decode_successors(const nlohmann::json& list) {
    if (!list.is_array()) throw invalid_value("'successors' is not a list");
    if (list.size() > 16)
        throw invalid_value(detail::format("'successors' names {} servers (at most 3 are written)", list.size()));
    std::vector<store_successor> out;
    for (const auto& x : list) {
        if (!x.is_object()) throw invalid_value("a successor is not a JSON object");
        out.push_back({field_string(x, "id", max_id, 1), field_string(x, "addr", max_host, 1),
                       static_cast<std::uint16_t>(field_int(x, "port", 1, 65535))});
    }
    return out;
}

inline nlohmann::json encode_successors(const std::vector<store_successor>& successors) {
    auto out = nlohmann::json::array();
    for (const auto& x : successors) out.push_back({{"id", x.id}, {"addr", x.addr}, {"port", x.port}});
    return out;
}

/// A list of at most `max` strings of at most max_host bytes each.
inline std::vector<std::string> string_list(const nlohmann::json& list, std::size_t max, const char* what) {
    if (!list.is_array() || list.size() > max)
        throw invalid_value(detail::format("'{}' is not a list of at most {} entries", what, max));
    std::vector<std::string> out;
    for (const auto& x : list) {
        if (!x.is_string() || x.get_ref<const std::string&>().size() > max_host)
            throw invalid_value(detail::format("an entry of '{}' is not a host name or address", what));
        out.push_back(x.get<std::string>());
    }
    return out;
}

}  // namespace codec

ELASTIC_DECL std::string encode(const node_info& i) {
    nlohmann::json j{
        {"host", i.host}, {"addr", i.store_addr}, {"port", i.store_port}, {"nproc", i.nproc}, {"pid", i.pid}};
    if (i.node_rank) j["node_rank"] = *i.node_rank;
    if (i.role != "default") j["role"] = i.role;
    if (i.previous_rank) j["previous_rank"] = *i.previous_rank;
    if (i.member_of) j["member_of"] = *i.member_of;
    if (i.earlier_rank && i.earlier_of) j["earlier"] = {*i.earlier_of, *i.earlier_rank};
    if (!i.id.empty()) j["id"] = i.id;
    if (i.backup_port != 0) j["backup"] = i.backup_port;
    if (i.backup_listed) j["listed"] = true;
    if (i.hosts_store) j["hosts_store"] = true;
    if (!i.addrs.empty()) j["addrs"] = i.addrs;
    return j.dump();
}

ELASTIC_DECL node_info decode_node(std::string_view text) {
    return codec::decoded([&] {
        using namespace codec;
        const auto j = parse_object(text);
        node_info i;
        i.host = field_string(j, "host", max_host);
        i.store_addr = field_string(j, "addr", max_host, 1);
        i.store_port = static_cast<std::uint16_t>(field_int(j, "port", 1, 65535));
        i.nproc = field_small(j, "nproc", 1, max_nproc);
        if (j.contains("role")) i.role = field_string(j, "role", max_host, 1);
        i.pid = static_cast<long>(field_int(j, "pid", 1, std::numeric_limits<std::int32_t>::max()));
        if (j.contains("node_rank")) i.node_rank = field_small(j, "node_rank", 0, max_nodes - 1);
        if (j.contains("previous_rank")) i.previous_rank = field_small(j, "previous_rank", 0, max_nodes - 1);
        if (j.contains("member_of")) i.member_of = field_small(j, "member_of", 0, std::numeric_limits<int>::max());
        if (const auto it = j.find("earlier"); it != j.end()) {
            // [round, group rank there]: a round before member_of, a rank below max_nodes.
            const auto& e = *it;
            if (!i.member_of || !e.is_array() || e.size() != 2 || !e[0].is_number_integer() ||
                !e[1].is_number_integer() || e[0].get<std::int64_t>() < 0 || e[0].get<std::int64_t>() >= *i.member_of ||
                e[1].get<std::int64_t>() < 0 || e[1].get<std::int64_t>() >= max_nodes)
                throw invalid_value("'earlier' is not [a round before member_of, a group rank]");
            i.earlier_of = e[0].get<int>();
            i.earlier_rank = e[1].get<int>();
        }
        if (j.contains("id")) i.id = lease_name(j, "id");
        if (j.contains("backup")) i.backup_port = static_cast<std::uint16_t>(field_int(j, "backup", 0, 65535));
        i.backup_listed = field_bool(j, "listed", false);
        i.hosts_store = field_bool(j, "hosts_store", false);
        if (const auto it = j.find("addrs"); it != j.end()) {
            if (!it->is_array() || it->size() > max_addrs)
                throw invalid_value(detail::format("'addrs' is not a list of at most {} addresses", max_addrs));
            for (const auto& a : *it) {
                if (!a.is_string() || a.get<std::string>().size() > max_host ||
                    !is_address_literal(a.get<std::string>()))
                    throw invalid_value("an entry of 'addrs' is not an IP address literal");
                i.addrs.push_back(a.get<std::string>());
            }
        }
        return i;
    });
}

ELASTIC_DECL std::string encode(const rendezvous_round& r, const std::optional<earlier_round>& before) {
    auto j = nlohmann::json{{"group_rank", r.group_rank},
                            {"rank_base", r.rank_base},
                            {"world_size", r.world_size},
                            {"size", r.group_world_size},
                            {"epoch", r.epoch},
                            {"master_addr", r.master_addr},
                            {"master_port", r.master_port},
                            {"restarts", r.restart_count},
                            {"host_in", r.host_in_round},
                            {"successors", codec::encode_successors(r.successors)}};
    if (r.role_rank_base >= 0) j["role_rank_base"] = r.role_rank_base;
    if (r.role_world_size >= 0) j["role_world_size"] = r.role_world_size;
    if (r.group_rank == 0) j["peers"] = r.peers;
    if (before) j["before"] = {before->round, before->size};
    return j.dump();
}

namespace codec {
inline earlier_round decode_earlier(const nlohmann::json& pair, int below, int nnodes) {
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer() || !pair[1].is_number_integer() ||
        pair[0].get<std::int64_t>() < 0 || pair[0].get<std::int64_t>() >= below || pair[1].get<std::int64_t>() < 1 ||
        pair[1].get<std::int64_t>() > nnodes)
        throw invalid_value(detail::format("'before' is not [a round before {}, a size of 1..{}]", below, nnodes));
    return earlier_round{pair[0].get<int>(), pair[1].get<int>()};
}
}  // namespace codec

ELASTIC_DECL std::optional<earlier_round> decode_assignment_before(std::string_view text, int round, int nnodes) {
    return codec::decoded([&]() -> std::optional<earlier_round> {
        const auto j = codec::parse_object(text);
        const auto it = j.find("before");
        if (it == j.end()) return std::nullopt;
        return codec::decode_earlier(*it, round, nnodes);
    });
}

ELASTIC_DECL std::optional<rendezvous_round> decode_assignment(std::string_view text, int nnodes) {
    return codec::decoded([&]() -> std::optional<rendezvous_round> {
        using namespace codec;
        const auto j = parse_object(text);
        if (j.contains("error")) throw rendezvous_error(field_string(j, "error", max_reason));
        if (j.contains("retry")) return std::nullopt;
        rendezvous_round r;
        r.group_world_size = field_small(j, "size", 1, nnodes);
        r.epoch = field_int(j, "epoch", 0, std::numeric_limits<std::int64_t>::max());
        r.host_in_round = field_bool(j, "host_in", false);
        if (const auto it = j.find("successors"); it != j.end()) r.successors = decode_successors(*it);
        r.restart_count = field_small(j, "restarts", 0, std::numeric_limits<int>::max());
        r.group_rank = field_small(j, "group_rank", 0, r.group_world_size - 1);
        r.world_size = field_small(j, "world_size", r.group_world_size, std::numeric_limits<int>::max());
        r.rank_base = field_small(j, "rank_base", 0, r.world_size - 1);
        // A completer that predates roles sent neither: one role, the whole world.
        r.role_world_size = j.contains("role_world_size") ? field_small(j, "role_world_size", 1, r.world_size)
                                                          : r.world_size;
        r.role_rank_base = j.contains("role_rank_base") ? field_small(j, "role_rank_base", 0, r.role_world_size - 1)
                                                        : r.rank_base;
        r.master_addr = field_string(j, "master_addr", max_host, 1);
        r.master_port = static_cast<std::uint16_t>(field_int(j, "master_port", 1, 65535));
        if (const auto it = j.find("peers"); it != j.end()) {
            if (!it->is_array() || it->size() > (max_addrs + 2) * static_cast<std::size_t>(nnodes))
                throw invalid_value(detail::format("'peers' is not a list of at most {} addresses per node",
                                                   max_addrs + 2));
            for (const auto& p : *it) {
                if (!p.is_string() || p.get<std::string>().size() > max_host)
                    throw invalid_value("a peer is not a host name or address");
                r.peers.push_back(p.get<std::string>());
            }
        }
        return r;
    });
}

ELASTIC_DECL std::string encode_retry(int majority_of, int prior_of) {
    nlohmann::json j{{"retry", true}};
    if (majority_of > 0) j["majority_of"] = majority_of;
    if (prior_of > 0) j["prior_of"] = prior_of;
    return j.dump();
}

namespace codec {
// A retry's round size `name` (0 when the retry names none, or `text` is no retry).
inline int retry_size(std::string_view text, int nnodes, const char* name) {
    return decoded([&] {
        const auto j = parse_object(text);
        if (!j.contains("retry") || !j.contains(name)) return 0;
        return field_small(j, name, 1, nnodes);
    });
}
}  // namespace codec

ELASTIC_DECL int decode_retry_majority(std::string_view text, int nnodes) {
    return codec::retry_size(text, nnodes, "majority_of");
}

ELASTIC_DECL int decode_retry_prior(std::string_view text, int nnodes) {
    return codec::retry_size(text, nnodes, "prior_of");
}

ELASTIC_DECL std::string encode_left_out() { return nlohmann::json{{"retry", true}, {"left_out", true}}.dump(); }

ELASTIC_DECL bool is_left_out(std::string_view text) {
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("retry")) return false;
    const auto it = j.find("left_out");
    return it != j.end() && it->is_boolean() && it->get<bool>();
}

ELASTIC_DECL std::string encode_round_error(std::string_view message) {
    return nlohmann::json{{"error", std::string(message)}}.dump();
}

ELASTIC_DECL std::string encode_round_successors(bool host_in, const std::vector<store_successor>& successors) {
    return nlohmann::json{{"host_in", host_in}, {"successors", codec::encode_successors(successors)}}.dump();
}

ELASTIC_DECL std::pair<bool, std::vector<store_successor>> decode_round_successors(std::string_view text) {
    return codec::decoded([&] {
        const auto j = codec::parse_object(text);
        const bool host_in = codec::field_bool(j, "host_in");
        const auto it = j.find("successors");
        if (it == j.end()) throw invalid_value("no 'successors'");
        return std::pair{host_in, codec::decode_successors(*it)};
    });
}

ELASTIC_DECL std::string encode_hosts(const std::vector<std::string>& hosts) { return nlohmann::json(hosts).dump(); }

ELASTIC_DECL std::vector<std::string> decode_hosts(std::string_view text) {
    return codec::decoded([&] {
        const auto j = nlohmann::json::parse(text, nullptr, false);
        if (j.is_discarded()) throw invalid_value("not JSON");
        return codec::string_list(j, static_cast<std::size_t>(max_nodes), "hosts");
    });
}

ELASTIC_DECL std::string encode(const round_manifest& m) {
    nlohmann::json j{{"k", m.k}, {"n", m.n}, {"ids", m.ids}};
    if (m.silent >= 0) j["silent"] = m.silent;
    if (m.round >= 0) j["round"] = m.round;
    if (!m.by_rank.empty()) j["by_rank"] = m.by_rank;
    if (m.prior) {
        nlohmann::json from = nlohmann::json::array();
        for (const auto& [here, there] : m.prior->from) from.push_back({here, there});
        j["prior"] = {{"round", m.prior->round}, {"size", m.prior->size}, {"absent", m.prior->absent}, {"from", from}};
    }
    return j.dump();
}

ELASTIC_DECL std::string encode(const moved_from& m) {
    nlohmann::json j{{"round", m.round}, {"size", m.size}};
    if (m.before) j["before"] = {m.before->round, m.before->size};
    return j.dump();
}

ELASTIC_DECL std::pair<int, int> decode_staying(std::string_view text, int nnodes) {
    const auto space = text.find(' ');
    if (space == std::string_view::npos) throw invalid_value("not '<round> <group rank>'");
    const auto r = decode_count(text.substr(0, space), 0, std::numeric_limits<int>::max());
    const auto g = decode_count(text.substr(space + 1), 0, nnodes - 1);
    return {static_cast<int>(r), static_cast<int>(g)};
}

ELASTIC_DECL moved_from decode_moved_from(std::string_view text, int nnodes) {
    return codec::decoded([&] {
        using namespace codec;
        const auto j = parse_object(text);
        moved_from m;
        m.round = field_small(j, "round", 0, std::numeric_limits<int>::max());
        m.size = field_small(j, "size", 1, nnodes);
        if (const auto it = j.find("before"); it != j.end()) m.before = decode_earlier(*it, m.round, nnodes);
        return m;
    });
}

ELASTIC_DECL round_manifest decode_manifest(std::string_view text, int nnodes) {
    return codec::decoded([&] {
        using namespace codec;
        const auto j = parse_object(text);
        round_manifest m;
        m.k = field_small(j, "k", 0, nnodes);
        m.n = field_small(j, "n", 0, nnodes);
        const auto ids = j.find("ids");
        if (ids == j.end() || !ids->is_array() || ids->size() > static_cast<std::size_t>(m.k))
            throw invalid_value("'ids' is not a list of the arrivals");
        for (const auto& id : *ids) {
            if (!id.is_string()) throw invalid_value("an id is not a string");
            m.ids.push_back(id.get<std::string>());
        }
        if (j.contains("silent")) m.silent = field_int(j, "silent", 0, std::numeric_limits<std::int64_t>::max());
        if (j.contains("round")) m.round = field_small(j, "round", 0, std::numeric_limits<int>::max());
        if (const auto by = j.find("by_rank"); by != j.end()) {
            if (!by->is_array() || by->size() != static_cast<std::size_t>(m.n))
                throw invalid_value("'by_rank' is not a lease name per member");
            for (const auto& id : *by) {
                if (!id.is_string() || id.get_ref<const std::string&>().size() > max_id)
                    throw invalid_value("a member's lease name is not a string of at most 512 bytes");
                m.by_rank.push_back(id.get<std::string>());
            }
        }
        if (const auto prior = j.find("prior"); prior != j.end()) {
            if (!prior->is_object()) throw invalid_value("'prior' is not an object");
            round_manifest::prior_round p;
            p.round = field_small(*prior, "round", 0, std::numeric_limits<int>::max());
            p.size = field_small(*prior, "size", 1, nnodes);
            const auto absent = prior->find("absent");
            const auto from = prior->find("from");
            if (absent == prior->end() || !absent->is_array() || absent->size() > static_cast<std::size_t>(p.size))
                throw invalid_value("'prior' has no list of its absent members");
            for (const auto& rank : *absent) {
                if (!rank.is_number_integer() || rank.get<std::int64_t>() < 0 || rank.get<std::int64_t>() >= p.size)
                    throw invalid_value("an absent member's rank is outside the prior round");
                p.absent.push_back(rank.get<int>());
            }
            if (from == prior->end() || !from->is_array() ||
                from->size() > static_cast<std::size_t>(std::min(p.size, m.n)))
                throw invalid_value("'prior' has no list of the members it shares with this round");
            for (const auto& pair : *from) {
                const auto in_range = [](const nlohmann::json& v, int size) {
                    return v.is_number_integer() && v.get<std::int64_t>() >= 0 && v.get<std::int64_t>() < size;
                };
                if (!pair.is_array() || pair.size() != 2 || !in_range(pair[0], m.n) || !in_range(pair[1], p.size))
                    throw invalid_value("a shared member is not a pair of ranks in the two rounds");
                p.from.emplace_back(pair[0].get<int>(), pair[1].get<int>());
            }
            if (m.round >= 0 && p.round >= m.round) throw invalid_value("'prior' is no round before this one");
            m.prior = std::move(p);
        }
        return m;
    });
}

ELASTIC_DECL std::string encode(const abort_notice& a) {
    const char* what = a.what == abort_notice::kind::membership ? "membership"
                       : a.what == abort_notice::kind::closed   ? "closed"
                                                                : "failure";
    nlohmann::json j{{"group_rank", a.group_rank}, {"host", a.host}, {"reason", a.reason}, {"kind", what}};
    if (a.admission) j["admission"] = true;
    if (!a.node.empty()) j["node"] = a.node;
    return j.dump();
}

ELASTIC_DECL abort_notice decode_abort(std::string_view text, int size) {
    return codec::decoded([&] {
        using namespace codec;
        const auto j = parse_object(text);
        abort_notice a{field_small(j, "group_rank", -1, size - 1), field_string(j, "host", max_host),
                       field_string(j, "reason", max_reason)};
        const auto what = field_string(j, "kind", 16);
        if (what == "membership") a.what = abort_notice::kind::membership;
        else if (what == "closed") a.what = abort_notice::kind::closed;
        else if (what == "failure") a.what = abort_notice::kind::failure;
        else throw invalid_value(detail::format("unknown kind '{}'", shown(what)));
        a.admission = field_bool(j, "admission", false);
        if (j.contains("node")) a.node = lease_name(j, "node");
        return a;
    });
}

ELASTIC_DECL std::string encode(const job_decision& d) {
    nlohmann::json j{{"restart", d.restart}, {"exit_code", d.exit_code}, {"reason", d.reason}};
    if (d.regroup) j["regroup"] = true;
    return j.dump();
}

ELASTIC_DECL job_decision decode_decision(std::string_view text) {
    return codec::decoded([&] {
        using namespace codec;
        const auto j = parse_object(text);
        job_decision d{field_bool(j, "restart"), field_small(j, "exit_code", 0, 255),
                       field_string(j, "reason", max_reason)};
        d.regroup = field_bool(j, "regroup", false);
        if (d.regroup && !d.restart) throw invalid_value("a regroup that is no restart");
        return d;
    });
}

}  // namespace elastic::inline v0::detail::rendezvous

#endif  // ELASTIC_DETAIL_BODIES
