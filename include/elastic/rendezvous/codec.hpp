// The rendezvous's store values (docs/rendezvous.md, "What the agents trust"): how a node's
// info, an assignment, an abort notice and a decision are written, and how each is read back
// and checked, since any client of the store may have written it.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/rendezvous/concepts.hpp"
#include "elastic/rendezvous/error.hpp"

#include <asio/ip/address.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

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
        else out += fmt::format("\\x{:02x}", u);
    }
    if (value.size() > limit) out += fmt::format("... ({} bytes)", value.size());
    return out;
}

inline nlohmann::json parse_object(std::string_view text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) throw invalid_value("not JSON");
    if (!j.is_object()) throw invalid_value("not a JSON object");
    return j;
}

/// Field `name` of `j` as an integer within [lo, hi].
inline std::int64_t field_int(const nlohmann::json& j, const char* name, std::int64_t lo, std::int64_t hi) {
    const auto it = j.find(name);
    if (it == j.end()) throw invalid_value(fmt::format("no '{}'", name));
    if (!it->is_number_integer()) throw invalid_value(fmt::format("'{}' is not an integer", name));
    const auto v = it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(hi)
                       ? hi + 1
                       : it->get<std::int64_t>();
    if (v < lo || v > hi) throw invalid_value(fmt::format("'{}' = {} is outside {}..{}", name, v, lo, hi));
    return v;
}

inline int field_small(const nlohmann::json& j, const char* name, std::int64_t lo, std::int64_t hi) {
    return static_cast<int>(field_int(j, name, lo, std::min<std::int64_t>(hi, 1'000'000'000)));
}

/// Field `name` of `j` as a string of at most `max` bytes (and at least `min`).
inline std::string field_string(const nlohmann::json& j, const char* name, std::size_t max, std::size_t min = 0) {
    const auto it = j.find(name);
    if (it == j.end()) throw invalid_value(fmt::format("no '{}'", name));
    if (!it->is_string()) throw invalid_value(fmt::format("'{}' is not a string", name));
    auto v = it->get<std::string>();
    if (v.size() > max || v.size() < min)
        throw invalid_value(fmt::format("'{}' has {} bytes (allowed: {}..{})", name, v.size(), min, max));
    return v;
}

inline bool field_bool(const nlohmann::json& j, const char* name, std::optional<bool> absent = std::nullopt) {
    const auto it = j.find(name);
    if (it == j.end()) {
        if (absent) return *absent;
        throw invalid_value(fmt::format("no '{}'", name));
    }
    if (!it->is_boolean()) throw invalid_value(fmt::format("'{}' is not true or false", name));
    return it->get<bool>();
}

/// Bounds of what a node may say of itself: names and addresses as DNS allows them, a reason
/// of a few lines, a node's workers and ranks as counted in int.
inline constexpr std::size_t max_host = 255;
inline constexpr std::size_t max_id = 512;
inline constexpr std::size_t max_reason = 4096;
inline constexpr int max_nproc = 1 << 20;
inline constexpr int max_nodes = 1 << 20;
inline constexpr std::size_t max_addrs = 64;  ///< interface addresses one node publishes

/// Whether `text` is an IPv4 or IPv6 address literal.
inline bool is_address_literal(const std::string& text) {
    std::error_code ec;
    (void)asio::ip::make_address(text, ec);
    return !ec;
}

inline std::string encode(const node_info& i) {
    nlohmann::json j{
        {"host", i.host}, {"addr", i.store_addr}, {"port", i.store_port}, {"nproc", i.nproc}, {"pid", i.pid}};
    if (i.node_rank) j["node_rank"] = *i.node_rank;
    if (i.previous_rank) j["previous_rank"] = *i.previous_rank;
    if (!i.id.empty()) j["id"] = i.id;
    if (i.backup_port != 0) j["backup"] = i.backup_port;
    if (i.hosts_store) j["hosts_store"] = true;
    if (!i.addrs.empty()) j["addrs"] = i.addrs;
    return j.dump();
}

/// A node's info (an arrival); invalid_value when it is not one.
inline node_info decode_node(std::string_view text) {
    const auto j = parse_object(text);
    node_info i;
    i.host = field_string(j, "host", max_host);
    i.store_addr = field_string(j, "addr", max_host, 1);
    i.store_port = static_cast<std::uint16_t>(field_int(j, "port", 1, 65535));
    i.nproc = field_small(j, "nproc", 1, max_nproc);
    i.pid = static_cast<long>(field_int(j, "pid", 1, std::numeric_limits<std::int32_t>::max()));
    if (j.contains("node_rank")) i.node_rank = field_small(j, "node_rank", 0, max_nodes - 1);
    if (j.contains("previous_rank")) i.previous_rank = field_small(j, "previous_rank", 0, max_nodes - 1);
    if (j.contains("id")) i.id = field_string(j, "id", max_id, 1);
    if (j.contains("backup")) i.backup_port = static_cast<std::uint16_t>(field_int(j, "backup", 0, 65535));
    i.hosts_store = field_bool(j, "hosts_store", false);
    if (const auto it = j.find("addrs"); it != j.end()) {
        if (!it->is_array() || it->size() > max_addrs)
            throw invalid_value(fmt::format("'addrs' is not a list of at most {} addresses", max_addrs));
        for (const auto& a : *it) {
            if (!a.is_string() || a.get<std::string>().size() > max_host || !is_address_literal(a.get<std::string>()))
                throw invalid_value("an entry of 'addrs' is not an IP address literal");
            i.addrs.push_back(a.get<std::string>());
        }
    }
    return i;
}

/// The successors a completer named: [{"id", "addr", "port"}, ...] (at most 3 are written).
inline std::vector<store_successor> decode_successors(const nlohmann::json& list) {
    if (!list.is_array()) throw invalid_value("'successors' is not a list");
    if (list.size() > 16)
        throw invalid_value(fmt::format("'successors' names {} servers (at most 3 are written)", list.size()));
    std::vector<store_successor> out;
    for (const auto& x : list) {
        if (!x.is_object()) throw invalid_value("a successor is not a JSON object");
        out.push_back({field_string(x, "id", max_id, 1), field_string(x, "addr", max_host, 1),
                       static_cast<std::uint16_t>(field_int(x, "port", 1, 65535))});
    }
    return out;
}

/// The successors a completer names, as decode_successors reads them.
inline nlohmann::json encode_successors(const std::vector<store_successor>& successors) {
    auto out = nlohmann::json::array();
    for (const auto& x : successors) out.push_back({{"id", x.id}, {"addr", x.addr}, {"port", x.port}});
    return out;
}

/// `<round>/successors`, for a standby: whether the store's host was a member, and the list.
inline std::pair<bool, std::vector<store_successor>> decode_round_successors(std::string_view text) {
    const auto j = parse_object(text);
    const bool host_in = field_bool(j, "host_in");
    const auto it = j.find("successors");
    if (it == j.end()) throw invalid_value("no 'successors'");
    return {host_in, decode_successors(*it)};
}

/// A node's assignment as the completer wrote it; rendezvous_error when the round failed;
/// nothing when the round lost a node while forming and everyone rejoins the next one;
/// invalid_value when it is no assignment of a round of at most `nnodes` nodes.
inline std::optional<rendezvous_round> decode_assignment(std::string_view text, int nnodes) {
    const auto j = parse_object(text);
    if (j.contains("error")) throw rendezvous_error(field_string(j, "error", max_reason));
    if (j.contains("retry")) return std::nullopt;
    rendezvous_round r;
    r.group_world_size = field_small(j, "size", 1, nnodes);
    r.epoch = field_int(j, "epoch", 0, std::numeric_limits<std::int64_t>::max());
    r.host_in_round = field_bool(j, "host_in", false);
    if (j.contains("successors")) r.successors = decode_successors(j["successors"]);
    r.restart_count = field_small(j, "restarts", 0, std::numeric_limits<int>::max());
    r.group_rank = field_small(j, "group_rank", 0, r.group_world_size - 1);
    r.world_size = field_small(j, "world_size", r.group_world_size, std::numeric_limits<int>::max());
    r.rank_base = field_small(j, "rank_base", 0, r.world_size - 1);
    r.master_addr = field_string(j, "master_addr", max_host, 1);
    r.master_port = static_cast<std::uint16_t>(field_int(j, "master_port", 1, 65535));
    if (const auto it = j.find("peers"); it != j.end()) {
        if (!it->is_array() || it->size() > (max_addrs + 2) * static_cast<std::size_t>(nnodes))
            throw invalid_value(fmt::format("'peers' is not a list of at most {} addresses per node", max_addrs + 2));
        for (const auto& p : *it) {
            if (!p.is_string() || p.get<std::string>().size() > max_host)
                throw invalid_value("a peer is not a host name or address");
            r.peers.push_back(p.get<std::string>());
        }
    }
    return r;
}

inline std::vector<std::string> decode_hosts(const std::string& text) {
    return nlohmann::json::parse(text).get<std::vector<std::string>>();
}

inline std::string encode(const abort_notice& a) {
    const char* what = a.what == abort_notice::kind::membership ? "membership"
                       : a.what == abort_notice::kind::closed   ? "closed"
                                                                : "failure";
    nlohmann::json j{{"group_rank", a.group_rank}, {"host", a.host}, {"reason", a.reason}, {"kind", what}};
    if (a.admission) j["admission"] = true;
    return j.dump();
}

/// A round's abort notice; invalid_value when it is none, or names a group rank outside a round
/// of `size` nodes (-1: a node that is no member, a standby or a lost node's observer).
inline abort_notice decode_abort(std::string_view text, int size) {
    const auto j = parse_object(text);
    abort_notice a{field_small(j, "group_rank", -1, size - 1), field_string(j, "host", max_host),
                   field_string(j, "reason", max_reason)};
    const auto what = field_string(j, "kind", 16);
    if (what == "membership") a.what = abort_notice::kind::membership;
    else if (what == "closed") a.what = abort_notice::kind::closed;
    else if (what == "failure") a.what = abort_notice::kind::failure;
    else throw invalid_value(fmt::format("unknown kind '{}'", shown(what)));
    a.admission = field_bool(j, "admission", false);
    return a;
}

inline std::string encode(const job_decision& d) {
    return nlohmann::json{{"restart", d.restart}, {"exit_code", d.exit_code}, {"reason", d.reason}}.dump();
}

/// A decision after an aborted round; invalid_value when it is none (an exit code is 0..255).
inline job_decision decode_decision(std::string_view text) {
    const auto j = parse_object(text);
    return {field_bool(j, "restart"), field_small(j, "exit_code", 0, 255), field_string(j, "reason", max_reason)};
}

/// A counter the rendezvous keeps as decimal text (`__epoch`, `<round>/size`): invalid_value
/// unless it is a whole number within [lo, hi].
inline std::int64_t decode_count(std::string_view text, std::int64_t lo, std::int64_t hi) {
    std::int64_t v = 0;
    const auto* end = text.data() + text.size();
    const auto [p, ec] = std::from_chars(text.data(), end, v);
    if (ec != std::errc{} || p != end || text.empty()) throw invalid_value("not a whole number");
    if (v < lo || v > hi) throw invalid_value(fmt::format("{} is outside {}..{}", v, lo, hi));
    return v;
}

/// What a torchrun agent's C10dRendezvousBackend keeps its pickled state under.
inline std::string torchrun_key(const std::string& run_id) { return "torch.rendezvous." + run_id; }

/// What elastic writes at that key: not base64 of a pickle, so a torchrun agent joining the
/// same run stops with "the rendezvous state is corrupt" instead of mixing with us.
inline std::string guard_value(const std::string& run_id) {
    return fmt::format("elasticrun rendezvous of run '{}' (not a torchrun state)", run_id);
}

}  // namespace detail::rendezvous

}  // namespace elastic::inline v0
