// SPDX-License-Identifier: MIT
// The c10d TCPStore wire codec: opcode tables of both dialects, primitive encodings, dialect
// detection and an incremental request parser shared by the server and the client.
#pragma once

#include "elastic/detail/config.hpp"

#include "elastic/detail/format.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// Byte layouts follow PyTorch's torch/csrc/distributed/c10d/TCPStore*.cpp (docs/store.md describes
// the dialects and their semantics). Integers are host-order memcpy copies in PyTorch, i.e.
// little-endian on every platform it runs on; we encode little-endian explicitly so the bytes are
// the same on any host.
namespace elastic::inline v0::wire {

/// The opcode numbering a connection speaks, chosen from its first bytes (`detect_dialect`).
enum class dialect : std::uint8_t {
    legacy,   ///< PyTorch 1.13 (SET=0 ... WATCH_KEY=7, DELETE_KEY=8), ~2.0's 9..12; no handshake
    current,  ///< PyTorch >= ~2.2: VALIDATE=0, SET=1, ..., PING=13, QUEUE_*, LIST_KEYS, BARRIER
};

/// A request's operation, independent of the numbering.
enum class op : std::uint8_t {
    validate,
    set,
    compare_set,
    get,
    add,
    check,
    wait,
    num_keys,
    watch_key,
    delete_key,
    append,
    multi_get,
    multi_set,
    cancel_wait,
    ping,
    queue_push,
    queue_pop,
    queue_len,
    list_keys,
    barrier,
};

/// VALIDATE's magic (u32 0x3C85F7CE, on the wire `CE F7 85 3C`).
inline constexpr std::uint32_t validate_magic = 0x3C85F7CEu;

/// `CheckResponseType`: the reply to CHECK.
enum class check_response : std::uint8_t { ready = 0, not_ready = 1 };
/// `WaitResponseType`: STOP_WAITING answers WAIT (maybe later); WAIT_CANCELED answers CANCEL_WAIT.
enum class wait_response : std::uint8_t { stop_waiting = 0, wait_canceled = 1 };
/// `WatchResponseType` (legacy dialect only): the first byte of a WATCH_KEY notification.
enum class watch_response : std::uint8_t {
    key_updated = 0,
    key_created = 1,
    key_deleted = 2,
    key_callback_registered = 3,
    key_appended = 4,
};

namespace detail {
inline constexpr std::array<op, 13> legacy_ops{op::set,        op::compare_set, op::get,       op::add,
                                               op::check,      op::wait,        op::num_keys,  op::watch_key,
                                               op::delete_key, op::append,      op::multi_get, op::multi_set,
                                               op::cancel_wait};
inline constexpr std::array<op, 19> current_ops{op::validate,    op::set,       op::compare_set, op::get,
                                                op::add,         op::check,     op::wait,        op::num_keys,
                                                op::delete_key,  op::append,    op::multi_get,   op::multi_set,
                                                op::cancel_wait, op::ping,      op::queue_push,  op::queue_pop,
                                                op::queue_len,   op::list_keys, op::barrier};
}  // namespace detail

/// The operation a byte means in `d`, or nothing for a byte the dialect does not define.
constexpr std::optional<op> to_op(dialect d, std::uint8_t byte) noexcept {
    if (d == dialect::legacy) {
        if (byte < detail::legacy_ops.size()) return detail::legacy_ops[byte];
    } else if (byte < detail::current_ops.size()) {
        return detail::current_ops[byte];
    }
    return std::nullopt;
}

/// The byte of `o` in `d`, or nothing when the dialect has no such operation (VALIDATE, PING,
/// queues, LIST_KEYS and BARRIER are current-only; WATCH_KEY is legacy-only).
constexpr std::optional<std::uint8_t> to_byte(dialect d, op o) noexcept {
    const auto find = [o](const auto& table) -> std::optional<std::uint8_t> {
        for (std::size_t i = 0; i < table.size(); ++i)
            if (table[i] == o) return static_cast<std::uint8_t>(i);
        return std::nullopt;
    };
    return d == dialect::legacy ? find(detail::legacy_ops) : find(detail::current_ops);
}

/// PyTorch's upper-case name of an operation (for logs).
constexpr std::string_view name(op o) noexcept {
    constexpr std::array<std::string_view, 20> names{"VALIDATE",  "SET",         "COMPARE_SET", "GET",
                                                     "ADD",       "CHECK",       "WAIT",        "GETNUMKEYS",
                                                     "WATCH_KEY", "DELETE_KEY",  "APPEND",      "MULTI_GET",
                                                     "MULTI_SET", "CANCEL_WAIT", "PING",        "QUEUE_PUSH",
                                                     "QUEUE_POP", "QUEUE_LEN",   "LIST_KEYS",   "BARRIER"};
    return names[static_cast<std::size_t>(o)];
}

/// Size limits a parser enforces (documented in docs/store.md). A request beyond one is
/// malformed: the server closes that connection and logs why.
struct limits {
    std::size_t max_key_size = 64 * 1024;             ///< bytes in one key
    std::size_t max_value_size = 16 * 1024 * 1024;    ///< bytes in one value
    std::size_t max_keys_per_request = 128 * 1024;    ///< n of CHECK/WAIT/MULTI_GET/MULTI_SET
    std::size_t max_request_size = 64 * 1024 * 1024;  ///< bytes of one whole request
};

// ---- primitive encodings -------------------------------------------------------------------

/// Appends one byte.
inline void put_u8(std::string& out, std::uint8_t v) { out.push_back(static_cast<char>(v)); }

/// Appends a little-endian unsigned integer of N bytes.
template <class T>
inline void put_le(std::string& out, T v) {
    char bytes[sizeof(T)];
    for (std::size_t i = 0; i < sizeof(T); ++i)
        bytes[i] = static_cast<char>(static_cast<std::uint8_t>(static_cast<std::uint64_t>(v) >> (8 * i)));
    out.append(bytes, sizeof(T));
}

/// Appends a u32 (VALIDATE magic, PING nonce).
inline void put_u32(std::string& out, std::uint32_t v) { put_le(out, v); }
/// Appends a u64 (lengths, counts).
inline void put_u64(std::string& out, std::uint64_t v) { put_le(out, v); }
/// Appends an i64 (ADD delta and result, GETNUMKEYS, DELETE_KEY's count): two's complement LE.
inline void put_i64(std::string& out, std::int64_t v) { put_le(out, static_cast<std::uint64_t>(v)); }
/// Appends a key or value: u64 length, then the raw bytes.
inline void put_bytes(std::string& out, std::string_view s) {
    put_u64(out, s.size());
    out.append(s);
}

/// Reads a little-endian integer from exactly sizeof(T) bytes at `p`.
template <class T>
inline T get_le(const char* p) noexcept {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i)
        v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
    return static_cast<T>(v);
}

// ---- dialect detection ---------------------------------------------------------------------

/// What the first bytes of a connection say: not enough yet, or which dialect.
enum class detection : std::uint8_t { need_more, legacy, current };

/// Chooses a connection's dialect from its first bytes: `00 CE F7 85 3C` (VALIDATE with its
/// magic) is the current dialect, anything else legacy. A first byte other than 0x00 decides at
/// once; after 0x00 five bytes are needed. A legacy SET would only match with a key length whose
/// low 32 bits are 0x3C85F7CE (about 1 GB), which is beyond any limit.
constexpr detection detect_dialect(std::string_view first) noexcept {
    if (first.empty()) return detection::need_more;
    if (first[0] != '\0') return detection::legacy;
    constexpr char magic[] = {'\0', '\xCE', '\xF7', '\x85', '\x3C'};
    for (std::size_t i = 1; i < 5; ++i) {
        if (i >= first.size()) return detection::need_more;
        if (first[i] != magic[i]) return detection::legacy;
    }
    return detection::current;
}

// ---- requests ------------------------------------------------------------------------------

/// One decoded request. Views point into the parsed buffer: valid until it changes. The parser
/// reuses the vectors' capacity, so keep one `request` per connection.
struct request {
    op operation = op::num_keys;
    /// SET, COMPARE_SET, GET, ADD, WATCH_KEY, DELETE_KEY, APPEND, QUEUE_*, BARRIER
    std::string_view key;
    std::string_view value;                ///< SET, APPEND, QUEUE_PUSH; COMPARE_SET's desired value
    std::string_view expected;             ///< COMPARE_SET's expected value
    std::int64_t number = 0;               ///< ADD's delta, BARRIER's world size
    std::uint32_t nonce = 0;               ///< VALIDATE's magic, PING's nonce
    std::vector<std::string_view> keys;    ///< CHECK, WAIT, MULTI_GET, MULTI_SET
    std::vector<std::string_view> values;  ///< MULTI_SET (same length as keys)
};

/// The state of a parse.
enum class parse_status : std::uint8_t {
    need_more,  ///< incomplete: read at least up to `size` bytes in total, then parse again
    complete,   ///< a whole request of `size` bytes is at the front of the buffer
    malformed,  ///< unknown opcode or a limit exceeded: `reason` says which; close the peer
};

/// The result of `parse_request`.
struct parse_result {
    parse_status status = parse_status::need_more;
    std::size_t size = 0;  ///< complete: bytes consumed; need_more: lower bound of the total
    std::string reason;    ///< malformed: what and why, for the log
};

namespace detail {

// A cursor over the input that records how far it got and why it stopped.
class request_reader {
public:
    request_reader(std::string_view in, const limits& lim) noexcept : in_(in), lim_(lim) {}

    // Each returns false when it cannot complete; status() then says need_more or malformed.
    bool fixed(std::size_t n, const char*& at) noexcept {
        if (in_.size() - pos_ < n) return need(pos_ + n);
        at = in_.data() + pos_;
        pos_ += n;
        return true;
    }
    bool u32(std::uint32_t& v) noexcept {
        const char* p = nullptr;
        if (!fixed(4, p)) return false;
        v = get_le<std::uint32_t>(p);
        return true;
    }
    bool i64(std::int64_t& v) noexcept {
        const char* p = nullptr;
        if (!fixed(8, p)) return false;
        v = static_cast<std::int64_t>(get_le<std::uint64_t>(p));
        return true;
    }
    bool count(std::size_t& n) {
        const char* p = nullptr;
        if (!fixed(8, p)) return false;
        const auto v = get_le<std::uint64_t>(p);
        if (v > lim_.max_keys_per_request)
            return fail(elastic::detail::format("{} keys in one request exceed the limit of {} "
                                                "(wire::limits::max_keys_per_request)",
                                                v, lim_.max_keys_per_request));
        n = static_cast<std::size_t>(v);
        return true;
    }
    bool str(std::string_view& s, bool is_key) {
        const char* p = nullptr;
        if (!fixed(8, p)) return false;
        const auto len = get_le<std::uint64_t>(p);
        const auto max = is_key ? lim_.max_key_size : lim_.max_value_size;
        if (len > max)
            return fail(elastic::detail::format("a {} of {} bytes exceeds the limit of {} (wire::limits::{})",
                                                is_key ? "key" : "value", len, max,
                                                is_key ? "max_key_size" : "max_value_size"));
        const auto n = static_cast<std::size_t>(len);
        if (pos_ + n > lim_.max_request_size)
            return fail(elastic::detail::format("a request of at least {} bytes exceeds the limit of {} "
                                                "(wire::limits::max_request_size)",
                                                pos_ + n, lim_.max_request_size));
        if (in_.size() - pos_ < n) return need(pos_ + n);
        s = in_.substr(pos_, n);
        pos_ += n;
        return true;
    }
    bool fail(std::string reason) {
        status_ = parse_status::malformed;
        reason_ = std::move(reason);
        return false;
    }

    parse_result result(bool ok) && {
        if (ok) return {parse_status::complete, pos_, {}};
        return {status_, status_ == parse_status::need_more ? needed_ : 0, std::move(reason_)};
    }

private:
    bool need(std::size_t total) noexcept {
        status_ = parse_status::need_more;
        needed_ = total;
        return false;
    }

    std::string_view in_;
    const limits& lim_;
    std::size_t pos_ = 0;
    std::size_t needed_ = 0;
    parse_status status_ = parse_status::need_more;
    std::string reason_;
};

}  // namespace detail

/// Parses the request at the front of `in` (the connection's unconsumed bytes) in dialect `d`.
/// Incremental: call again with more bytes after `need_more`; nothing is consumed until
/// `complete`. Never reads past `in`, never allocates beyond the reused vectors of `out` (and
/// the reason string when malformed), whatever the input.
ELASTIC_DECL parse_result parse_request(dialect d, std::string_view in, request& out, const limits& lim = {});

/// Appends the bytes of `req` in dialect `d` (for clients and tests). Throws std::invalid_argument
/// when `d` has no opcode for the operation.
ELASTIC_DECL void encode_request(dialect d, const request& req, std::string& out);

}  // namespace elastic::inline v0::wire

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::wire {

ELASTIC_DECL parse_result parse_request(dialect d, std::string_view in, request& out, const limits& lim) {
    detail::request_reader r{in, lim};
    const char* p = nullptr;
    if (!r.fixed(1, p)) return std::move(r).result(false);
    const auto byte = static_cast<std::uint8_t>(*p);
    const auto o = to_op(d, byte);
    if (!o) {
        r.fail(elastic::detail::format("unknown opcode 0x{:02x} in the {} dialect", byte,
                                       d == dialect::legacy ? "legacy (1.13)" : "current (VALIDATE)"));
        return std::move(r).result(false);
    }
    out.operation = *o;
    out.key = out.value = out.expected = {};  // no view may survive from an earlier request
    out.number = 0;
    out.nonce = 0;
    out.keys.clear();
    out.values.clear();
    bool ok = true;
    switch (*o) {
        case op::validate:
        case op::ping: ok = r.u32(out.nonce); break;
        case op::set:
        case op::append:
        case op::queue_push: ok = r.str(out.key, true) && r.str(out.value, false); break;
        case op::compare_set: ok = r.str(out.key, true) && r.str(out.expected, false) && r.str(out.value, false); break;
        case op::get:
        case op::watch_key:
        case op::delete_key:
        case op::queue_pop:
        case op::queue_len: ok = r.str(out.key, true); break;
        case op::add:
        case op::barrier: ok = r.str(out.key, true) && r.i64(out.number); break;
        case op::check:
        case op::wait:
        case op::multi_get:
        case op::multi_set: {
            std::size_t n = 0;
            ok = r.count(n);
            const bool pairs = *o == op::multi_set;
            for (std::size_t i = 0; ok && i < n; ++i) {
                std::string_view k;
                ok = r.str(k, true);
                if (ok) out.keys.push_back(k);
                if (ok && pairs) {
                    std::string_view v;
                    ok = r.str(v, false);
                    if (ok) out.values.push_back(v);
                }
            }
            break;
        }
        case op::num_keys:
        case op::cancel_wait:
        case op::list_keys: break;
    }
    return std::move(r).result(ok);
}

ELASTIC_DECL void encode_request(dialect d, const request& req, std::string& out) {
    const auto byte = to_byte(d, req.operation);
    if (!byte)
        throw std::invalid_argument(elastic::detail::format("{} does not exist in the {} dialect", name(req.operation),
                                                            d == dialect::legacy ? "legacy" : "current"));
    put_u8(out, *byte);
    switch (req.operation) {
        case op::validate:
        case op::ping: put_u32(out, req.nonce); break;
        case op::set:
        case op::append:
        case op::queue_push:
            put_bytes(out, req.key);
            put_bytes(out, req.value);
            break;
        case op::compare_set:
            put_bytes(out, req.key);
            put_bytes(out, req.expected);
            put_bytes(out, req.value);
            break;
        case op::get:
        case op::watch_key:
        case op::delete_key:
        case op::queue_pop:
        case op::queue_len: put_bytes(out, req.key); break;
        case op::add:
        case op::barrier:
            put_bytes(out, req.key);
            put_i64(out, req.number);
            break;
        case op::check:
        case op::wait:
        case op::multi_get:
            put_u64(out, req.keys.size());
            for (auto k : req.keys) put_bytes(out, k);
            break;
        case op::multi_set:
            if (req.keys.size() != req.values.size())
                throw std::invalid_argument(
                    elastic::detail::format("MULTI_SET needs as many values as keys, got {} keys and {} values",
                                            req.keys.size(), req.values.size()));
            put_u64(out, req.keys.size());
            for (std::size_t i = 0; i < req.keys.size(); ++i) {
                put_bytes(out, req.keys[i]);
                put_bytes(out, req.values[i]);
            }
            break;
        case op::num_keys:
        case op::cancel_wait:
        case op::list_keys: break;
    }
}

}  // namespace elastic::inline v0::wire

#endif  // ELASTIC_DETAIL_BODIES
