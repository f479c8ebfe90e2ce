// SPDX-License-Identifier: MIT
// A client of etcd's v3 API through its JSON gateway (HTTP/1.1, TLS when asked): the calls a store
// over etcd needs — range, put, delete, transactions, leases and watches — with failover across
// the cluster's members. HTTP is parsed by the http-parser library, TLS is OpenSSL's (asio::ssl).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/store/errors.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace elastic::inline v0 {

/// A member of an etcd cluster: where its client URL listens.
struct etcd_endpoint {
    std::string host;
    std::uint16_t port = 2379;
    friend bool operator==(const etcd_endpoint&, const etcd_endpoint&) = default;
};

/// How an etcd_client reaches the cluster.
struct etcd_options {
    /// The members, in the order they are tried: a request goes to the member that answered
    /// last, and moves to the next one when that one fails.
    std::vector<etcd_endpoint> endpoints;
    bool tls = false;    ///< https (--rdzv-conf protocol=https)
    std::string cacert;  ///< PEM file of the CAs that sign the members' certificates (empty: the system's)
    std::string cert;    ///< PEM file of this client's certificate (empty: none)
    std::string key;     ///< PEM file of its private key (with cert)
    /// How long one request may take on one member (connect, send, answer), and how long a
    /// watch may wait for its first answer (--rdzv-conf read_timeout).
    std::chrono::milliseconds request_timeout{std::chrono::seconds(60)};
    /// How long a connection to one member may take before the next member is tried.
    std::chrono::milliseconds connect_timeout{std::chrono::seconds(5)};
};

/// An etcd request failed. `code()` is the gRPC status code the gateway answered with (0: no
/// code — an answer that was not etcd's; 14: no member answered or a stream broke). The message
/// names the member.
class etcd_error : public store_error {
public:
    etcd_error(const std::string& message, int code, bool ambiguous = false)
        : store_error(message), code_(code), ambiguous_(ambiguous) {}
    [[nodiscard]] int code() const noexcept { return code_; }
    /// The request was sent and no answer came: it may or may not have been applied.
    [[nodiscard]] bool ambiguous() const noexcept { return ambiguous_; }
    /// Asking again later may succeed: no member answered, or a watch's member went away
    /// (code 14). Refusals (credentials, TLS, no v3 gateway, a bad request) are not.
    [[nodiscard]] bool transient() const noexcept { return code_ == 14; }

private:
    int code_ = 0;
    bool ambiguous_ = false;
};

/// No member of the cluster served the request within the request timeout: each was
/// unreachable, refused the connection, had no quorum (no leader), or did not answer in time.
/// The message says what each one did. Transient (code 14).
class etcd_unavailable : public etcd_error {
public:
    using etcd_error::etcd_error;
};

/// A lease etcd granted: its id and the TTL it chose (at least what was asked, at least etcd's
/// minimum).
struct etcd_lease {
    std::int64_t id = 0;
    std::int64_t ttl = 0;
};

/// A key and its value as etcd keeps them.
struct etcd_kv {
    std::string key;
    std::string value;
    std::int64_t create_revision = 0;  ///< 0: the key does not exist
    std::int64_t mod_revision = 0;
    std::int64_t version = 0;
    std::int64_t lease = 0;
};

/// One comparison of a transaction: `target(key) how number` (or `value(key) how value`). With
/// `range_end`, every key in [key, range_end) must satisfy it (none there: a zero key does).
struct etcd_compare {
    enum class target { version_count, create, mod, value, lease };  /// version_count: etcd's VERSION
    enum class result { equal, greater, less, not_equal };
    std::string key;
    target what = target::mod;
    result how = result::equal;
    std::int64_t number = 0;
    std::string value;
    std::string range_end;
};

/// One operation of a transaction (or a request of its own).
struct etcd_request {
    enum class kind { range, put, delete_range };
    kind what = kind::range;
    std::string key;
    std::string value;          ///< put
    std::string range_end;      ///< range, delete_range: [key, range_end); empty: key alone
    std::int64_t lease = 0;     ///< put: the lease the key is bound to (0: none)
    bool count_only = false;    ///< range: count, no key-values
    std::int64_t revision = 0;  ///< range: as the store was at this revision (0: now)
    bool ignore_value = false;  ///< put: keep the key's value (value empty); the key must exist
    bool prev_kv = false;       ///< put: answer with the key as it was before

    static etcd_request range(std::string k, std::string end = {}) {
        etcd_request r;
        r.key = std::move(k);
        r.range_end = std::move(end);
        return r;
    }
    static etcd_request put(std::string k, std::string v, std::int64_t lease_id = 0) {
        etcd_request r;
        r.what = kind::put;
        r.key = std::move(k);
        r.value = std::move(v);
        r.lease = lease_id;
        return r;
    }
    static etcd_request erase(std::string k, std::string end = {}) {
        etcd_request r;
        r.what = kind::delete_range;
        r.key = std::move(k);
        r.range_end = std::move(end);
        return r;
    }
};

/// What one operation returned: a range's key-values and count, a delete's count, or the key
/// before a put that asked for it.
struct etcd_response {
    std::vector<etcd_kv> kvs;
    std::int64_t count = 0;
    std::optional<etcd_kv> prev;  ///< put with prev_kv: the key before (none: it did not exist)
};

/// A transaction's outcome: which branch ran, the store's revision after it, each op's result.
struct etcd_txn_result {
    bool succeeded = false;
    std::int64_t revision = 0;
    std::vector<etcd_response> responses;
};

/// A range's outcome at the store's revision.
struct etcd_range_result {
    std::int64_t revision = 0;
    std::vector<etcd_kv> kvs;
    std::int64_t count = 0;
};

/// One change a watch reports.
struct etcd_event {
    bool deleted = false;         ///< a delete (a lease's expiry deletes its keys); else a put
    etcd_kv kv;                   ///< the key as changed (a delete: the key and mod_revision)
    std::optional<etcd_kv> prev;  ///< the key before, when the watch asked for it
};

/// One message of a watch stream.
struct etcd_watch_batch {
    std::int64_t revision = 0;          ///< the store's revision when it was sent
    bool created = false;               ///< the watch now exists (the first message)
    bool canceled = false;              ///< the watch ended (see compact_revision)
    std::int64_t compact_revision = 0;  ///< canceled because its start was compacted away: re-read
    std::string cancel_reason;
    std::vector<etcd_event> events;
};

/// The first key after every key that starts with `prefix` (a range's end for a prefix).
[[nodiscard]] ELASTIC_DECL std::string etcd_prefix_end(std::string_view prefix);

namespace detail::etcd {
struct watch_stream;
struct client_state;
}  // namespace detail::etcd

/// A watch on etcd: one HTTP stream of its own. next() returns the stream's messages in order;
/// destroying the watch closes the stream (that is how a watch is cancelled over the gateway).
class etcd_watch {
public:
    /// No stream (next() throws): what a moved-from watch is.
    etcd_watch() = default;
    ELASTIC_DECL explicit etcd_watch(std::unique_ptr<detail::etcd::watch_stream> stream);
    ELASTIC_DECL ~etcd_watch();
    etcd_watch(etcd_watch&&) noexcept;
    etcd_watch& operator=(etcd_watch&&) noexcept;

    /// The next message; etcd_error when the stream ends or breaks (its member went away) or
    /// sends what is not a watch message.
    ELASTIC_DECL asio::awaitable<etcd_watch_batch> next();
    /// The member the stream is on ("host:port").
    [[nodiscard]] ELASTIC_DECL std::string endpoint() const;

private:
    std::unique_ptr<detail::etcd::watch_stream> stream_;
};

/// A client of an etcd cluster's v3 JSON gateway (etcd 3.4 and later). Each request goes to the
/// member that answered last; a member that cannot be reached, refuses the connection, has no
/// leader or does not answer in time is left for the next one, and the members are tried again,
/// with a growing pause, until the request timeout; then etcd_unavailable says what each did.
/// Idle connections are kept for the next request; every connection probes its peer (TCP
/// keep-alive), so a member whose machine vanished is noticed within seconds. Use it on one
/// thread (its executor's).
class etcd_client {
public:
    ELASTIC_DECL etcd_client(asio::any_io_executor executor, etcd_options options);
    ELASTIC_DECL ~etcd_client();
    etcd_client(const etcd_client&) = delete;
    etcd_client& operator=(const etcd_client&) = delete;

    [[nodiscard]] ELASTIC_DECL const etcd_options& options() const noexcept;
    /// The members as a list for messages ("http://h1:2379, http://h2:2379").
    [[nodiscard]] ELASTIC_DECL std::string describe() const;

    /// Checks that a member speaks the v3 API (its /version): etcd_error naming the problem when
    /// it is too old (a v2-only server) or no etcd; etcd_unavailable when none answers.
    ELASTIC_DECL asio::awaitable<std::string> server_version();

    /// Reads [key, range_end) (empty: key alone) as the store is now, or as it was at
    /// `revision` (etcd_error code 11 when compaction removed it).
    ELASTIC_DECL asio::awaitable<etcd_range_result> range(std::string key, std::string range_end = {},
                                                          bool count_only = false, std::int64_t revision = 0);
    /// Returns the store's revision after the put.
    ELASTIC_DECL asio::awaitable<std::int64_t> put(std::string key, std::string value, std::int64_t lease = 0);
    /// Returns how many keys were deleted.
    ELASTIC_DECL asio::awaitable<std::int64_t> erase(std::string key, std::string range_end = {});
    /// At most 128 operations per branch (etcd's default --max-txn-ops), no key put twice. A
    /// transaction with comparisons is not sent again after a failure that leaves its fate
    /// unknown: etcd_error::ambiguous() says so, and the caller reads what happened.
    ELASTIC_DECL asio::awaitable<etcd_txn_result> txn(std::vector<etcd_compare> compare,
                                                      std::vector<etcd_request> success,
                                                      std::vector<etcd_request> failure = {});

    /// Grants a lease of `ttl` seconds.
    ELASTIC_DECL asio::awaitable<etcd_lease> lease_grant(std::int64_t ttl);
    /// Renews lease `id`; returns its TTL in seconds, 0 when the lease is gone (expired or revoked).
    /// `within` bounds the renewal (0: request_timeout): a renewal is worth only as much as it
    /// is quick.
    ELASTIC_DECL asio::awaitable<std::int64_t> lease_keepalive(std::int64_t id, std::chrono::milliseconds within = {});
    /// Revokes lease `id` (its keys are deleted); a lease already gone is no error.
    ELASTIC_DECL asio::awaitable<void> lease_revoke(std::int64_t id);
    /// A lease of `ttl` seconds that this client's users share for keys that only need to
    /// outlive a call: granted when first asked, granted again once half its TTL has gone or
    /// after forget_shared_lease(id) (its user saw etcd say it is gone). Never renewed.
    ELASTIC_DECL asio::awaitable<std::int64_t> shared_lease(std::int64_t ttl);
    ELASTIC_DECL void forget_shared_lease(std::int64_t id) noexcept;

    /// Watches [key, range_end) (empty: key alone) from `start_revision` (0: from now), with each
    /// event's previous key-value when `prev_kv`, deletions alone when `deletions_only` (etcd
    /// leaves the puts out). Returns once etcd confirmed the watch. A member that loses its
    /// leader ends its watches (etcd's "require leader"), so a watch never waits on a member cut
    /// off from the cluster.
    ELASTIC_DECL asio::awaitable<etcd_watch> watch(std::string key, std::string range_end, std::int64_t start_revision,
                                                   bool prev_kv = false, bool deletions_only = false);

    /// Drops the idle connections (the next request opens a new one).
    ELASTIC_DECL void close() noexcept;

private:
    std::unique_ptr<detail::etcd::client_state> state_;
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

#include "elastic/detail/coro.hpp"

#include <asio/buffer.hpp>
#include <asio/connect.hpp>
#include <asio/error.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/ssl.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include "elastic/detail/format.hpp"
#include <http_parser.h>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <deque>
#include <exception>
#include <stdexcept>
#include <system_error>
#include <type_traits>
#include <utility>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace elastic::inline v0 {

ELASTIC_DECL std::string etcd_prefix_end(std::string_view prefix) {
    std::string end(prefix);
    while (!end.empty()) {
        auto& last = end.back();
        if (static_cast<unsigned char>(last) != 0xff) {
            last = static_cast<char>(static_cast<unsigned char>(last) + 1);
            return end;
        }
        end.pop_back();
    }
    return std::string(1, '\0');  // every key: etcd's "\0" range end
}

namespace detail::etcd {

using tcp = asio::ip::tcp;
using clock = std::chrono::steady_clock;

/// The largest answer kept: a unary answer's body, or one line of a watch stream. etcd's own
/// request limit is 1.5 MiB per value; a range of a whole job's keys stays far below this.
inline constexpr std::size_t max_body = 64u << 20;

inline constexpr const char* no_quorum_advice =
    "the cluster may have no quorum (too few of its members run, or they cannot reach each other): start the "
    "members that are down (or the member is overloaded)";

inline std::string base64(std::string_view bytes) {
    std::string out(4 * ((bytes.size() + 2) / 3), '\0');
    const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                  reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
    out.resize(static_cast<std::size_t>(std::max(n, 0)));
    return out;
}

inline std::string unbase64(std::string_view text) {
    if (text.empty()) return {};
    if (text.size() % 4 != 0) throw std::runtime_error("base64 text of a length that is no multiple of 4");
    std::string out(3 * (text.size() / 4), '\0');
    const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                  reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
    if (n < 0) throw std::runtime_error("invalid base64 text");
    std::size_t pad = 0;
    if (text.back() == '=') ++pad;
    if (text.size() >= 2 && text[text.size() - 2] == '=') ++pad;
    out.resize(static_cast<std::size_t>(n) - pad);
    return out;
}

// etcd writes 64-bit numbers as strings, omits zeros, and future versions may write numbers.
inline std::int64_t number(const nlohmann::json& j, const char* name) {
    const auto it = j.find(name);
    if (it == j.end() || it->is_null()) return 0;
    if (it->is_number_integer()) return it->get<std::int64_t>();
    if (it->is_string()) {
        const auto& s = it->get_ref<const std::string&>();
        std::size_t used = 0;
        const auto v = std::stoll(s, &used);
        if (used != s.size()) throw std::runtime_error(detail::format("'{}' is not a number: {}", name, s));
        return v;
    }
    if (it->is_boolean()) return it->get<bool>() ? 1 : 0;
    throw std::runtime_error(detail::format("'{}' is not a number", name));
}

inline std::string bytes(const nlohmann::json& j, const char* name) {
    const auto it = j.find(name);
    if (it == j.end() || it->is_null()) return {};
    return unbase64(it->get_ref<const std::string&>());
}

inline bool flag(const nlohmann::json& j, const char* name) {
    const auto it = j.find(name);
    return it != j.end() && it->is_boolean() && it->get<bool>();
}

inline etcd_kv kv_of(const nlohmann::json& j) {
    etcd_kv kv;
    kv.key = bytes(j, "key");
    kv.value = bytes(j, "value");
    kv.create_revision = number(j, "create_revision");
    kv.mod_revision = number(j, "mod_revision");
    kv.version = number(j, "version");
    kv.lease = number(j, "lease");
    return kv;
}

inline std::vector<etcd_kv> kvs_of(const nlohmann::json& j) {
    std::vector<etcd_kv> out;
    if (const auto it = j.find("kvs"); it != j.end() && it->is_array()) {
        for (const auto& kv : *it) out.push_back(kv_of(kv));
    }
    return out;
}

inline std::int64_t revision_of(const nlohmann::json& j) {
    const auto it = j.find("header");
    return it == j.end() ? 0 : number(*it, "revision");
}

inline nlohmann::json request_json(const etcd_request& r) {
    nlohmann::json j;
    j["key"] = base64(r.key);
    switch (r.what) {
        case etcd_request::kind::range:
            if (!r.range_end.empty()) j["range_end"] = base64(r.range_end);
            if (r.count_only) j["count_only"] = true;
            if (r.revision != 0) j["revision"] = std::to_string(r.revision);
            return nlohmann::json{{"request_range", j}};
        case etcd_request::kind::put:
            j["value"] = base64(r.value);
            if (r.lease != 0) j["lease"] = std::to_string(r.lease);
            if (r.ignore_value) j["ignore_value"] = true;
            if (r.prev_kv) j["prev_kv"] = true;
            return nlohmann::json{{"request_put", j}};
        case etcd_request::kind::delete_range:
            if (!r.range_end.empty()) j["range_end"] = base64(r.range_end);
            return nlohmann::json{{"request_delete_range", j}};
    }
    return j;
}

inline nlohmann::json compare_json(const etcd_compare& c) {
    static constexpr const char* targets[] = {"VERSION", "CREATE", "MOD", "VALUE", "LEASE"};
    static constexpr const char* results[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};
    nlohmann::json j;
    j["key"] = base64(c.key);
    if (!c.range_end.empty()) j["range_end"] = base64(c.range_end);
    j["target"] = targets[static_cast<int>(c.what)];
    j["result"] = results[static_cast<int>(c.how)];
    switch (c.what) {
        case etcd_compare::target::version_count: j["version"] = std::to_string(c.number); break;
        case etcd_compare::target::create: j["create_revision"] = std::to_string(c.number); break;
        case etcd_compare::target::mod: j["mod_revision"] = std::to_string(c.number); break;
        case etcd_compare::target::value: j["value"] = base64(c.value); break;
        case etcd_compare::target::lease: j["lease"] = std::to_string(c.number); break;
    }
    return j;
}

/// One connection to one member: TCP, or TLS over it. A plain connection uses the stream's
/// lower layer only.
struct connection {
    connection(asio::any_io_executor ex, asio::ssl::context& ctx, std::size_t which, bool secure)
        : stream(ex, ctx), member(which), tls(secure) {}

    asio::ssl::stream<tcp::socket> stream;
    std::size_t member;
    bool tls;

    tcp::socket& socket() { return stream.next_layer(); }
    void close() noexcept {
        std::error_code ignored;
        socket().shutdown(tcp::socket::shutdown_both, ignored);
        socket().close(ignored);
    }
};

/// What went wrong on one member, for the message that lists them all.
struct member_failure {
    std::string what;
    bool ambiguous = false;  ///< the request was sent whole, and its fate is unknown
    bool retry = true;       ///< the member may serve it later (else: a refusal, e.g. TLS)
    int code = 0;
    bool silent = false;  ///< the member took the request and did not answer in time
};

class member_error : public std::runtime_error {
public:
    explicit member_error(member_failure f) : std::runtime_error(f.what), failure(std::move(f)) {}
    member_failure failure;
};

inline bool cancelled(const std::system_error& e) { return e.code() == asio::error::operation_aborted; }

/// Runs `op` and throws member_error(`what`) when `deadline` comes first.
template <class T>
asio::awaitable<T> before(clock::time_point deadline, asio::awaitable<T> op, std::string what, bool ambiguous,
                          bool silent = false) {
    using namespace asio::experimental::awaitable_operators;
    asio::steady_timer timer(co_await asio::this_coro::executor, deadline);
    auto raced = co_await (detail::settle(std::move(op)) || timer.async_wait(asio::use_awaitable));
    if (raced.index() == 1) throw member_error({std::move(what), ambiguous, true, 0, silent});
    if constexpr (std::is_void_v<T>) {
        std::get<0>(raced).take();
        co_return;
    } else {
        co_return std::get<0>(std::move(raced)).take();
    }
}

/// An HTTP response read with http-parser: the status, the body (whole, or line by line for a
/// stream) and whether the connection may be reused.
struct response_parser {
    http_parser parser{};
    http_parser_settings settings{};
    bool headers_done = false;
    bool complete = false;
    bool leftover = false;  ///< bytes came after the response: the connection is not reused
    bool stream = false;    ///< deliver the body as lines (a watch): `lines`
    bool got_bytes = false;
    std::string body;  ///< the body so far (unary), or the part of a line not ended yet (stream)
    std::deque<std::string> lines;
    bool too_large = false;

    explicit response_parser(bool streaming) : stream(streaming) {
        http_parser_init(&parser, HTTP_RESPONSE);
        parser.data = this;
        http_parser_settings_init(&settings);
        settings.on_headers_complete = [](http_parser* p) {
            static_cast<response_parser*>(p->data)->headers_done = true;
            return 0;
        };
        settings.on_body = [](http_parser* p, const char* at, std::size_t n) {
            auto* self = static_cast<response_parser*>(p->data);
            return self->take(std::string_view(at, n));
        };
        settings.on_message_complete = [](http_parser* p) {
            auto* self = static_cast<response_parser*>(p->data);
            self->complete = true;
            http_parser_pause(p, 1);  // bytes after it belong to no request of ours
            return 0;
        };
    }

    int take(std::string_view chunk) {
        if (!stream) {
            if (body.size() + chunk.size() > max_body) {
                too_large = true;
                return 1;
            }
            body.append(chunk);
            return 0;
        }
        for (;;) {
            const auto nl = chunk.find('\n');
            const auto part = chunk.substr(0, nl);
            if (body.size() + part.size() > max_body) {
                too_large = true;
                return 1;
            }
            body.append(part);
            if (nl == std::string_view::npos) return 0;
            if (!body.empty()) lines.push_back(std::move(body));
            body.clear();
            chunk.remove_prefix(nl + 1);
        }
    }

    /// Feeds bytes (none: the connection ended, which ends a response framed by it); a
    /// description of the error when they are no HTTP response.
    std::optional<std::string> feed(std::string_view data) {
        if (!data.empty()) got_bytes = true;
        if (complete) {
            leftover = leftover || !data.empty();
            return std::nullopt;
        }
        const auto used = http_parser_execute(&parser, &settings, data.empty() ? nullptr : data.data(), data.size());
        const auto err = HTTP_PARSER_ERRNO(&parser);
        if (too_large) return detail::format("an answer over {} MiB", max_body >> 20);
        if (err != HPE_OK && err != HPE_PAUSED) {
            return detail::format("not an HTTP answer ({})", http_errno_description(err));
        }
        if (complete && used < data.size()) leftover = true;
        return std::nullopt;
    }

    [[nodiscard]] int status() const noexcept { return static_cast<int>(parser.status_code); }
    [[nodiscard]] bool keep_alive() const noexcept { return !leftover && http_should_keep_alive(&parser) != 0; }
};

struct client_state {
    client_state(asio::any_io_executor ex, etcd_options o)
        : executor(std::move(ex)),
          options(std::move(o)),
          tls(asio::ssl::context::tls_client),
          resolved(options.endpoints.size()) {}

    asio::any_io_executor executor;
    etcd_options options;
    asio::ssl::context tls;
    std::optional<std::string> tls_problem;                      ///< the TLS files could not be loaded: why
    std::size_t current = 0;                                     ///< the member that answered last
    std::int64_t shared_lease = 0;                               ///< shared_lease(): its id (0: none yet)
    std::chrono::steady_clock::time_point shared_lease_renew{};  ///< when to grant another
    bool shared_lease_granting = false;                          ///< a grant is on its way...
    asio::steady_timer shared_lease_granted{executor};           ///< ...and cancels this when done
    std::vector<std::unique_ptr<connection>> idle;
    /// Each member's addresses, resolved once (a name's resolution cannot be cancelled, and may
    /// stall): cleared when a connection to them fails, so a moved member is found again.
    std::vector<std::vector<tcp::endpoint>> resolved;

    [[nodiscard]] std::string name(std::size_t member) const {
        const auto& e = options.endpoints.at(member);
        const bool v6 = e.host.find(':') != std::string::npos;
        return detail::format("{}://{}{}{}:{}", options.tls ? "https" : "http", v6 ? "[" : "", e.host, v6 ? "]" : "",
                              e.port);
    }
    void move_on(std::size_t from) { current = (from + 1) % options.endpoints.size(); }
};

inline void set_up_tls(client_state& s) {
    if (!s.options.tls) return;
    try {
        s.tls.set_verify_mode(asio::ssl::verify_peer);
        if (s.options.cacert.empty()) s.tls.set_default_verify_paths();
        else s.tls.load_verify_file(s.options.cacert);
        if (!s.options.cert.empty()) s.tls.use_certificate_chain_file(s.options.cert);
        if (!s.options.key.empty()) s.tls.use_private_key_file(s.options.key, asio::ssl::context::pem);
    } catch (const std::system_error& e) {
        s.tls_problem = detail::format("cannot load the TLS files (cacert '{}', cert '{}', key '{}'): {}",
                                       s.options.cacert, s.options.cert, s.options.key, e.what());
    }
}

inline void check_tls(const client_state& s) {
    if (s.tls_problem) throw etcd_error(detail::format("etcd at {}: {}", s.name(s.current), *s.tls_problem), 16);
}

/// TCP keep-alive probes after 2 s of silence, every second, 3 unanswered end the connection;
/// unacknowledged data ends it after 5 s. A watch would otherwise wait for ever on a member
/// whose machine lost power (no reset ever comes).
inline void probe_peer(tcp::socket& socket) {
    std::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    socket.set_option(asio::socket_base::keep_alive(true), ignored);
    const int fd = socket.native_handle();
    const int idle = 2;
    const int interval = 1;
    const int count = 3;
    const unsigned user_timeout = 5000;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

inline asio::awaitable<std::vector<tcp::endpoint>> addresses(client_state& s, std::size_t member,
                                                             clock::time_point deadline) {
    if (!s.resolved[member].empty()) co_return s.resolved[member];
    const auto& e = s.options.endpoints.at(member);
    std::error_code not_ip;
    const auto literal = asio::ip::make_address(e.host, not_ip);
    std::vector<tcp::endpoint> out;
    if (!not_ip) {
        out.emplace_back(literal, e.port);
    } else {
        tcp::resolver resolver(s.executor);
        const auto found = co_await before(deadline,
                                           resolver.async_resolve(e.host, std::to_string(e.port), asio::use_awaitable),
                                           detail::format("the name '{}' did not resolve in time", e.host), false);
        for (const auto& r : found) out.push_back(r.endpoint());
    }
    s.resolved[member] = out;
    co_return out;
}

inline asio::awaitable<std::unique_ptr<connection>> open(client_state& s, std::size_t member,
                                                         clock::time_point deadline) {
    const auto& e = s.options.endpoints.at(member);
    auto c = std::make_unique<connection>(s.executor, s.tls, member, s.options.tls);
    const auto connect_by = std::min(deadline, clock::now() + s.options.connect_timeout);
    bool connected = false;
    bool handshaking = false;
    try {
        const auto where = co_await addresses(s, member, connect_by);
        co_await before(connect_by, asio::async_connect(c->socket(), where, asio::use_awaitable),
                        detail::format("no connection within {} ms", s.options.connect_timeout.count()), false);
        connected = true;
        probe_peer(c->socket());
        if (s.options.tls) {
            // The member's certificate must name the host it is reached at (a name or an IP
            // address, RFC 2818); SNI tells a name-based server which certificate to show.
            c->stream.set_verify_callback(asio::ssl::host_name_verification(e.host));
            std::error_code not_ip;
            (void)asio::ip::make_address(e.host, not_ip);
            if (not_ip) SSL_set_tlsext_host_name(c->stream.native_handle(), e.host.c_str());
            handshaking = true;
            co_await before(connect_by, c->stream.async_handshake(asio::ssl::stream_base::client, asio::use_awaitable),
                            "no TLS handshake within the connect timeout", false);
        }
    } catch (const member_error&) {
        if (!connected) s.resolved[member].clear();
        throw;
    } catch (const std::system_error& err) {
        if (cancelled(err)) throw;
        if (!connected) s.resolved[member].clear();
        const bool ssl = err.code().category() == asio::error::get_ssl_category() &&
                         err.code() != asio::ssl::error::stream_truncated;
        if (ssl) {
            // A refusal of this member's: another member may show a certificate that verifies.
            throw member_error(
                {detail::format("TLS handshake failed: {} — check --rdzv-conf cacert (the CA that signed "
                                "the members' certificates), cert and key",
                                err.what()),
                 false, false, 16});
        }
        if (handshaking) {
            // Ended mid-handshake: a member that does not speak TLS (it answers the hello with a
            // plain HTTP error and closes), or one that is restarting.
            throw member_error({detail::format("the member ended the connection during the TLS handshake ({}): does it "
                                               "serve https (protocol=https needs members started with --cert-file "
                                               "and --key-file), or is it restarting?",
                                               err.code().message()),
                                false, true, 0});
        }
        throw member_error({detail::format("cannot connect: {}", err.code().message()), false, true, 0});
    }
    co_return c;
}

/// A TLS alert after the handshake: with TLS 1.3 a member that wants a client certificate, or
/// does not trust the one it got, says so only when it reads the request.
inline bool tls_alert(const std::system_error& e) {
    return e.code().category() == asio::error::get_ssl_category() && e.code() != asio::ssl::error::stream_truncated;
}

inline member_error tls_refusal(const std::system_error& e) {
    return member_error({detail::format("the member refused this client over TLS: {} — check --rdzv-conf cert and key "
                                        "(a client certificate signed by a CA the members trust) and cacert",
                                        e.what()),
                         false, false, 16});
}

inline asio::awaitable<void> write_all(connection& c, const std::string& bytes) {
    if (c.tls) co_await asio::async_write(c.stream, asio::buffer(bytes), asio::use_awaitable);
    else co_await asio::async_write(c.socket(), asio::buffer(bytes), asio::use_awaitable);
}

/// What a failed send means for the member: a TLS refusal, else a connection it broke (nothing
/// of the request can have been applied, so another member may be asked).
inline member_error send_failure(const std::system_error& e) {
    if (tls_alert(e)) return tls_refusal(e);
    return member_error({detail::format("cannot send: {}", e.code().message()), false, true, 0});
}

inline asio::awaitable<std::size_t> read_some(connection& c, asio::mutable_buffer b) {
    if (c.tls) co_return co_await c.stream.async_read_some(b, asio::use_awaitable);
    co_return co_await c.socket().async_read_some(b, asio::use_awaitable);
}

inline std::string http_request(const client_state& s, std::size_t member, std::string_view method,
                                std::string_view path, std::string_view body, bool require_leader) {
    const auto& e = s.options.endpoints.at(member);
    return detail::format("{} {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
                          "Accept: application/json\r\n{}\r\n{}",
                          method, path, e.host, e.port, body.size(),
                          require_leader ? "Grpc-Metadata-hasleader: true\r\n" : "", body);
}

/// The response is complete.
inline bool whole(const response_parser& p) { return p.complete; }
/// A line of the stream is there, or the response ended.
inline bool line_or_end(const response_parser& p) { return !p.lines.empty() || p.complete; }

/// Reads until `done(parser)` or the end of the response; member_error on a broken connection,
/// bytes that are no HTTP, or the deadline (`budget` names it in the message).
inline asio::awaitable<void> read_response(connection& c, response_parser& p, clock::time_point deadline,
                                           bool (*done)(const response_parser&), bool ambiguous,
                                           std::string_view budget = "the read timeout") {
    std::array<char, 16384> buffer{};
    while (!done(p)) {
        std::size_t n = 0;
        bool ended = false;
        try {
            n = co_await before(deadline, read_some(c, asio::buffer(buffer)),
                                detail::format("no answer within {}", budget), ambiguous, true);
        } catch (const member_error&) {
            throw;
        } catch (const std::system_error& e) {
            if (cancelled(e)) throw;
            if (tls_alert(e)) throw tls_refusal(e);
            ended = e.code() == asio::error::eof || e.code() == asio::ssl::error::stream_truncated;
            if (!ended) {
                throw member_error({detail::format("the connection broke: {}", e.code().message()), ambiguous, true,
                                    0});
            }
        }
        if (ended) {
            // The end of the connection ends a response it frames; any other is cut short.
            if (auto bad = p.feed({}); !bad && done(p)) co_return;
            throw member_error({"the connection was closed before the answer", ambiguous, true, 0});
        }
        // Bytes that are no HTTP, or an answer over the bound: a member that sends them will not
        // answer better if asked again within this call (it is left for the others).
        if (auto bad = p.feed(std::string_view(buffer.data(), n))) throw member_error({*bad, ambiguous, false, 0});
    }
}

/// The gRPC code and message of an etcd error body, if it is one: a unary answer's
/// {"code":n,"message":"..."}, or a stream's {"error":{"grpc_code":n,"message":"..."}}.
inline std::pair<int, std::string> error_of(std::string_view body) {
    const auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_object()) {
        const auto* e = &j;
        if (const auto inner = j.find("error"); inner != j.end() && inner->is_object()) e = &*inner;
        int code = 0;
        for (const char* k : {"code", "grpc_code"}) {
            if (const auto it = e->find(k); it != e->end() && it->is_number_integer()) code = it->get<int>();
        }
        std::string message;
        for (const char* k : {"message", "error"}) {
            if (const auto it = e->find(k); message.empty() && it != e->end() && it->is_string()) message = *it;
        }
        if (!message.empty() || code != 0) return {code, message};
    }
    std::string text(body.substr(0, 200));
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    return {0, text};
}

// gRPC codes: 14 UNAVAILABLE, 4 DEADLINE_EXCEEDED (no leader, no quorum), 16 UNAUTHENTICATED,
// 7 PERMISSION_DENIED.
inline bool quorum_problem(int code, std::string_view message) {
    return code == 14 || code == 4 || message.find("request timed out") != std::string_view::npos ||
           message.find("no leader") != std::string_view::npos ||
           message.find("leader changed") != std::string_view::npos;
}

struct watch_stream {
    std::unique_ptr<connection> conn;
    std::unique_ptr<response_parser> parser;
    std::string member;
};

inline asio::awaitable<etcd_watch_batch> next_message(watch_stream& w) {
    for (;;) {
        if (!w.parser->lines.empty()) {
            auto line = std::move(w.parser->lines.front());
            w.parser->lines.pop_front();
            const auto j = nlohmann::json::parse(line, nullptr, false);
            if (!j.is_object())
                throw etcd_error(detail::format("etcd at {}: a watch message that is no JSON", w.member), 0);
            if (j.contains("error")) {
                const auto [code, message] = error_of(line);
                // The member lost its leader, or is stopping: the watch goes on elsewhere.
                throw etcd_error(detail::format("etcd at {}: the watch ended: {}", w.member, message),
                                 quorum_problem(code, message) || code == 0 ? 14 : code);
            }
            const auto r = j.find("result");
            if (r == j.end() || !r->is_object()) {
                throw etcd_error(detail::format("etcd at {}: a watch message without a result", w.member), 0);
            }
            etcd_watch_batch b;
            try {
                b.revision = revision_of(*r);
                b.created = flag(*r, "created");
                b.canceled = flag(*r, "canceled");
                b.compact_revision = number(*r, "compact_revision");
                if (const auto it = r->find("cancel_reason"); it != r->end() && it->is_string()) b.cancel_reason = *it;
                if (const auto events = r->find("events"); events != r->end() && events->is_array()) {
                    for (const auto& e : *events) {
                        etcd_event ev;
                        if (const auto t = e.find("type"); t != e.end()) ev.deleted = *t == "DELETE" || *t == 1;
                        if (const auto kv = e.find("kv"); kv != e.end()) ev.kv = kv_of(*kv);
                        if (const auto kv = e.find("prev_kv"); kv != e.end()) ev.prev = kv_of(*kv);
                        b.events.push_back(std::move(ev));
                    }
                }
            } catch (const std::exception& e) {
                throw etcd_error(detail::format("etcd at {}: a watch message etcd would not send: {}", w.member,
                                                e.what()),
                                 0);
            }
            co_return b;
        }
        if (w.parser->complete) throw etcd_error(detail::format("etcd at {} ended the watch stream", w.member), 14);
        try {
            // A watch waits as long as its events take: the caller bounds it; the connection's
            // keep-alive probes notice a member that vanished.
            co_await read_response(*w.conn, *w.parser, clock::time_point::max(), line_or_end, false);
        } catch (const member_error& e) {
            throw etcd_error(detail::format("etcd at {}: the watch stream broke: {}", w.member, e.what()), 14);
        }
    }
}

}  // namespace detail::etcd

ELASTIC_DECL etcd_watch::etcd_watch(std::unique_ptr<detail::etcd::watch_stream> stream) : stream_(std::move(stream)) {}
ELASTIC_DECL etcd_watch::~etcd_watch() {
    if (stream_ && stream_->conn) stream_->conn->close();
}
ELASTIC_DECL etcd_watch::etcd_watch(etcd_watch&&) noexcept = default;
ELASTIC_DECL etcd_watch& etcd_watch::operator=(etcd_watch&& other) noexcept {
    if (this != &other) {
        if (stream_ && stream_->conn) stream_->conn->close();
        stream_ = std::move(other.stream_);
    }
    return *this;
}

ELASTIC_DECL asio::awaitable<etcd_watch_batch> etcd_watch::next() {
    if (!stream_) throw etcd_error("the watch was moved from", 0);
    co_return co_await detail::etcd::next_message(*stream_);
}

ELASTIC_DECL std::string etcd_watch::endpoint() const { return stream_ ? stream_->member : std::string(); }

ELASTIC_DECL etcd_client::etcd_client(asio::any_io_executor executor, etcd_options options)
    : state_(std::make_unique<detail::etcd::client_state>(std::move(executor), std::move(options))) {
    if (state_->options.endpoints.empty()) throw store_error("etcd_client: no endpoint (give at least one member)");
    detail::etcd::set_up_tls(*state_);
}

ELASTIC_DECL etcd_client::~etcd_client() { close(); }

ELASTIC_DECL const etcd_options& etcd_client::options() const noexcept { return state_->options; }

ELASTIC_DECL std::string etcd_client::describe() const {
    std::string out;
    for (std::size_t i = 0; i < state_->options.endpoints.size(); ++i) {
        out += (i == 0 ? "" : ", ") + state_->name(i);
    }
    return out;
}

ELASTIC_DECL void etcd_client::close() noexcept {
    for (auto& c : state_->idle) c->close();
    state_->idle.clear();
}

namespace detail::etcd {

/// One request on one member, on a pooled connection or a new one, answered by `deadline`.
/// Returns the status and body; member_error when the member did not answer properly. A pooled
/// connection the member had closed is replaced when nothing of the request can have been
/// applied, or when `resend` allows it.
inline asio::awaitable<std::pair<int, std::string>> exchange(client_state& s, std::size_t member,
                                                             std::string_view method, std::string_view path,
                                                             const std::string& body, clock::time_point deadline,
                                                             bool resend, std::string_view budget) {
    std::unique_ptr<connection> c;
    bool reused = false;
    for (auto it = s.idle.begin(); it != s.idle.end(); ++it) {
        if ((*it)->member == member) {
            c = std::move(*it);
            s.idle.erase(it);
            reused = true;
            break;
        }
    }
    for (;;) {
        if (!c) c = co_await open(s, member, deadline);
        const auto request = http_request(s, member, method, path, body, false);
        try {
            co_await before(deadline, write_all(*c, request), detail::format("no room to send within {}", budget),
                            false);
        } catch (const std::system_error& e) {
            if (cancelled(e)) throw;
            if (reused && !tls_alert(e)) {  // the member closed an idle connection: nothing was sent
                c.reset();
                reused = false;
                continue;
            }
            throw send_failure(e);
        }
        response_parser p(false);
        try {
            co_await read_response(*c, p, deadline, whole, true, budget);
        } catch (const member_error& e) {
            // A pooled connection the member had closed: nothing came back at all.
            if (reused && resend && !p.got_bytes && !e.failure.silent) {
                c.reset();
                reused = false;
                continue;
            }
            throw;
        }
        if (p.keep_alive() && s.idle.size() < 8) s.idle.push_back(std::move(c));
        co_return std::pair{p.status(), std::move(p.body)};
    }
}

/// The request on the member that answered last, then on the others in turn, pass after pass
/// with a growing pause, until `within` (0: the request timeout) ends. A request that was sent
/// whole and got no answer (or an answer that it may still be applied) may have been applied: it
/// goes to the next member only when `resend` (it means the same applied twice), else
/// etcd_error(ambiguous) at once.
inline asio::awaitable<nlohmann::json> call(client_state& s, std::string path, const nlohmann::json& request,
                                            bool resend = true, std::chrono::milliseconds within = {}) {
    check_tls(s);
    const auto body = request.dump();
    const auto members = s.options.endpoints.size();
    const auto budget_ms = within.count() > 0 ? within : s.options.request_timeout;
    const auto budget = within.count() > 0 ? detail::format("{} ms", within.count()) : std::string("the read timeout");
    const auto deadline = clock::now() + budget_ms;
    // Each member gets a share of the time, so one that hangs leaves the others theirs.
    const auto share = std::max<clock::duration>(budget_ms / static_cast<long>(members),
                                                 std::chrono::milliseconds(200));
    auto pause = std::chrono::milliseconds(50);
    std::vector<std::string> seen(members);
    bool quorum = false;
    for (;;) {
        // Every member of this pass refused for good (TLS): asking again changes nothing.
        std::size_t refused = 0;
        for (std::size_t attempt = 0; attempt < members; ++attempt) {
            const auto member = (s.current + attempt) % members;
            const auto now = clock::now();
            if (now >= deadline) break;
            const auto by = std::min(deadline, now + share);
            member_failure failure;
            try {
                auto [status, text] = co_await exchange(s, member, "POST", path, body, by, resend, budget);
                auto j = nlohmann::json::parse(text, nullptr, false);
                if (status >= 200 && status < 300 && !(j.is_object() && j.contains("error"))) {
                    if (!j.is_object()) {
                        throw etcd_error(detail::format("etcd at {}: {} answered what is no JSON object: {}",
                                                        s.name(member), path, text.substr(0, 200)),
                                         0);
                    }
                    s.current = member;
                    co_return j;
                }
                // An error, or a stream's error message under a 200 (a keep-alive's).
                const auto [code, message] = error_of(text);
                if (status == 404 && code == 0) {
                    throw etcd_error(
                        detail::format("etcd at {} does not serve {} (HTTP 404: {}): it is no etcd 3.4 or "
                                       "later with its v3 JSON gateway (a v2-only etcd, or another server); "
                                       "run etcd 3.4 or later there",
                                       s.name(member), path, message),
                        12);
                }
                if (code == 16 || code == 7 || status == 401 || status == 403) {
                    throw etcd_error(
                        detail::format("etcd at {} refused the request ({}): wrong or missing credentials; "
                                       "check --rdzv-conf cert and key (a client certificate the cluster's "
                                       "CA signed)",
                                       s.name(member), message),
                        code == 0 ? 16 : code);
                }
                if (quorum_problem(code, message) || status >= 500 || status < 300) {
                    // The member may have proposed it before it gave up: it may still apply.
                    failure = {detail::format("{} (HTTP {})", message, status), true, true, code, false};
                    quorum = quorum || quorum_problem(code, message);
                } else {
                    throw etcd_error(detail::format("etcd at {} refused {}: {} (code {})", s.name(member), path,
                                                    message, code),
                                     code);
                }
            } catch (const member_error& e) {
                failure = e.failure;
            }
            quorum = quorum || failure.silent;
            if (failure.ambiguous && !resend) {
                s.move_on(member);
                std::string others;
                for (std::size_t m = 0; m < members; ++m) {
                    if (m != member && !seen[m].empty()) others += detail::format("; {}: {}", s.name(m), seen[m]);
                }
                throw etcd_error(detail::format("etcd at {} took the request and then: {} (it may still apply){}{}",
                                                s.name(member), failure.what, others,
                                                failure.silent || quorum ? detail::format("; {}", no_quorum_advice)
                                                                         : std::string()),
                                 14, true);
            }
            if (!failure.retry) ++refused;
            seen[member] = failure.what;
        }
        if (refused == members) {
            std::string all;
            for (std::size_t m = 0; m < members; ++m)
                all += detail::format("{}{}: {}", m ? "; " : "", s.name(m), seen[m]);
            throw etcd_error(detail::format("no etcd member served {}: {}", path, all), 16);
        }
        const auto left = deadline - clock::now();
        if (left <= clock::duration::zero()) break;
        asio::steady_timer wait(s.executor, std::min<clock::duration>(pause, left));
        co_await wait.async_wait(asio::use_awaitable);
        pause = std::min(pause * 2, std::chrono::milliseconds(1000));
    }
    std::string tried;
    for (std::size_t m = 0; m < members; ++m) {
        if (!seen[m].empty()) tried += detail::format("{}{}: {}", tried.empty() ? "" : "; ", s.name(m), seen[m]);
    }
    const auto advice = quorum ? no_quorum_advice
                               : "check that etcd runs there and that --rdzv-endpoint names its client URLs";
    throw etcd_unavailable(detail::format("no etcd member served {} within {}: {}; {}", path, budget, tried, advice),
                           14);
}

inline std::vector<etcd_response> responses_of(const nlohmann::json& j) {
    std::vector<etcd_response> out;
    if (const auto it = j.find("responses"); it != j.end() && it->is_array()) {
        for (const auto& r : *it) {
            etcd_response one;
            if (const auto range = r.find("response_range"); range != r.end()) {
                one.kvs = kvs_of(*range);
                one.count = number(*range, "count");
            } else if (const auto del = r.find("response_delete_range"); del != r.end()) {
                one.count = number(*del, "deleted");
            } else if (const auto put = r.find("response_put"); put != r.end()) {
                if (const auto prev = put->find("prev_kv"); prev != put->end()) one.prev = kv_of(*prev);
            }
            out.push_back(std::move(one));
        }
    }
    return out;
}

template <class F>
auto parsed(const client_state& s, std::string_view what, F f) -> decltype(f()) {
    try {
        return f();
    } catch (const etcd_error&) {
        throw;
    } catch (const std::exception& e) {
        throw etcd_error(detail::format("etcd at {}: an answer to {} etcd would not send: {}", s.name(s.current), what,
                                        e.what()),
                         0);
    }
}

inline etcd_range_result range_of(const client_state& s, const nlohmann::json& j) {
    return parsed(s, "a range", [&] {
        etcd_range_result out;
        out.revision = revision_of(j);
        out.kvs = kvs_of(j);
        out.count = number(j, "count");
        return out;
    });
}

inline etcd_txn_result txn_of(const client_state& s, const nlohmann::json& j) {
    return parsed(s, "a transaction", [&] {
        etcd_txn_result out;
        out.succeeded = flag(j, "succeeded");
        out.revision = revision_of(j);
        out.responses = responses_of(j);
        return out;
    });
}

inline etcd_lease lease_of(const client_state& s, const nlohmann::json& j) {
    return parsed(s, "a lease grant", [&] {
        etcd_lease out{number(j, "ID"), number(j, "TTL")};
        if (out.id == 0) throw std::runtime_error("no lease id");
        return out;
    });
}

inline std::int64_t keepalive_of(const client_state& s, const nlohmann::json& j) {
    // The gateway answers a keep-alive as a stream of one message: {"result":{...,"TTL":"n"}}.
    return parsed(s, "a lease keep-alive", [&] {
        const auto r = j.find("result");
        if (r == j.end()) throw std::runtime_error(j.dump().substr(0, 200));
        return number(*r, "TTL");
    });
}

inline std::string version_of(const client_state& s, std::size_t member, int status, const std::string& text) {
    const auto j = nlohmann::json::parse(text, nullptr, false);
    std::string server;
    if (j.is_object()) {
        if (const auto it = j.find("etcdserver"); it != j.end() && it->is_string()) server = it->get<std::string>();
    }
    if (status != 200 || server.empty()) {
        throw etcd_error(detail::format("{} answers no etcd version (HTTP {}: {}): it is no etcd member; check "
                                        "--rdzv-endpoint",
                                        s.name(member), status, text.substr(0, 120)),
                         12);
    }
    const auto major = std::atoi(server.c_str());
    const auto dot = server.find('.');
    const auto minor = dot == std::string::npos ? 0 : std::atoi(server.c_str() + dot + 1);
    if (major < 3 || (major == 3 && minor < 4)) {
        throw etcd_error(detail::format("etcd at {} is version {}, which has no v3 JSON gateway elastic can use "
                                        "(a v2-only server, or older than 3.4): run etcd 3.4 or later",
                                        s.name(member), server),
                         12);
    }
    return server;
}

}  // namespace detail::etcd

ELASTIC_DECL asio::awaitable<std::string> etcd_client::server_version() {
    auto& s = *state_;
    detail::etcd::check_tls(s);
    std::string tried;
    const auto members = s.options.endpoints.size();
    for (std::size_t attempt = 0; attempt < members; ++attempt) {
        const auto member = (s.current + attempt) % members;
        std::string why;
        try {
            const auto by = detail::etcd::clock::now() + s.options.request_timeout;
            const auto [status, text] = co_await detail::etcd::exchange(s, member, "GET", "/version", std::string(), by,
                                                                        true, "the read timeout");
            auto server = detail::etcd::version_of(s, member, status, text);
            s.current = member;
            co_return server;
        } catch (const detail::etcd::member_error& e) {
            why = e.what();
        }
        tried += detail::format("{}{}: {}", tried.empty() ? "" : "; ", s.name(member), why);
    }
    throw etcd_unavailable(
        detail::format("no etcd member answered: {}; check that etcd runs there and that --rdzv-endpoint names its "
                       "client URLs",
                       tried),
        14);
}

ELASTIC_DECL asio::awaitable<etcd_range_result> etcd_client::range(std::string key, std::string range_end,
                                                                   bool count_only, std::int64_t revision) {
    auto r = etcd_request::range(std::move(key), std::move(range_end));
    r.count_only = count_only;
    r.revision = revision;
    const auto body = detail::etcd::request_json(r)["request_range"];
    const auto j = co_await detail::etcd::call(*state_, "/v3/kv/range", body);
    co_return detail::etcd::range_of(*state_, j);
}

ELASTIC_DECL asio::awaitable<std::int64_t> etcd_client::put(std::string key, std::string value, std::int64_t lease) {
    const auto body = detail::etcd::request_json(etcd_request::put(std::move(key), std::move(value),
                                                                   lease))["request_put"];
    const auto j = co_await detail::etcd::call(*state_, "/v3/kv/put", body);
    co_return detail::etcd::revision_of(j);
}

ELASTIC_DECL asio::awaitable<std::int64_t> etcd_client::erase(std::string key, std::string range_end) {
    const auto body = detail::etcd::request_json(etcd_request::erase(std::move(key),
                                                                     std::move(range_end)))["request_delete_range"];
    const auto j = co_await detail::etcd::call(*state_, "/v3/kv/deleterange", body);
    co_return detail::etcd::number(j, "deleted");
}

ELASTIC_DECL asio::awaitable<etcd_txn_result> etcd_client::txn(std::vector<etcd_compare> compare,
                                                               std::vector<etcd_request> success,
                                                               std::vector<etcd_request> failure) {
    nlohmann::json body = nlohmann::json::object();
    for (const auto& c : compare) body["compare"].push_back(detail::etcd::compare_json(c));
    for (const auto& r : success) body["success"].push_back(detail::etcd::request_json(r));
    for (const auto& r : failure) body["failure"].push_back(detail::etcd::request_json(r));
    // Without a comparison, the same operations applied twice leave the same keys: such a
    // transaction may go to the next member after a failure that leaves its fate unknown.
    const bool resend = compare.empty();
    const auto j = co_await detail::etcd::call(*state_, "/v3/kv/txn", body, resend);
    co_return detail::etcd::txn_of(*state_, j);
}

ELASTIC_DECL asio::awaitable<etcd_lease> etcd_client::lease_grant(std::int64_t ttl) {
    const nlohmann::json body{{"TTL", std::to_string(ttl)}};
    const auto j = co_await detail::etcd::call(*state_, "/v3/lease/grant", body);
    co_return detail::etcd::lease_of(*state_, j);
}

ELASTIC_DECL asio::awaitable<std::int64_t> etcd_client::shared_lease(std::int64_t ttl) {
    auto& s = *state_;
    for (;;) {
        const auto now = std::chrono::steady_clock::now();
        if (s.shared_lease != 0 && now < s.shared_lease_renew) co_return s.shared_lease;
        if (!s.shared_lease_granting) break;
        // One grant at a time: the others wait for it (and ask again should it fail). Only the
        // granter sets the timer: setting it would cancel the waits already on it.
        (void)co_await s.shared_lease_granted.async_wait(detail::as_tuple_awaitable<void>);
    }
    s.shared_lease_granting = true;
    s.shared_lease_granted.expires_at(std::chrono::steady_clock::time_point::max());
    const auto now = std::chrono::steady_clock::now();
    std::exception_ptr failed;
    try {
        const auto granted = co_await lease_grant(ttl);
        s.shared_lease = granted.id;
        s.shared_lease_renew = now + std::chrono::seconds(granted.ttl / 2);
    } catch (...) {
        failed = std::current_exception();
    }
    s.shared_lease_granting = false;
    s.shared_lease_granted.cancel();
    if (failed) std::rethrow_exception(failed);
    co_return s.shared_lease;
}

ELASTIC_DECL void etcd_client::forget_shared_lease(std::int64_t id) noexcept {
    if (state_->shared_lease == id) state_->shared_lease = 0;
}

ELASTIC_DECL asio::awaitable<std::int64_t> etcd_client::lease_keepalive(std::int64_t id,
                                                                        std::chrono::milliseconds within) {
    const nlohmann::json body{{"ID", std::to_string(id)}};
    const auto j = co_await detail::etcd::call(*state_, "/v3/lease/keepalive", body, true, within);
    co_return detail::etcd::keepalive_of(*state_, j);
}

ELASTIC_DECL asio::awaitable<void> etcd_client::lease_revoke(std::int64_t id) {
    const nlohmann::json body{{"ID", std::to_string(id)}};
    std::optional<etcd_error> failed;
    try {
        (void)co_await detail::etcd::call(*state_, "/v3/lease/revoke", body);
    } catch (const etcd_error& e) {
        if (e.code() != 5) failed = e;  // NOT_FOUND: gone already
    }
    if (failed) throw *failed;
}

ELASTIC_DECL asio::awaitable<etcd_watch> etcd_client::watch(std::string key, std::string range_end,
                                                            std::int64_t start_revision, bool prev_kv,
                                                            bool deletions_only) {
    auto& s = *state_;
    detail::etcd::check_tls(s);
    nlohmann::json create;
    create["key"] = detail::etcd::base64(key);
    if (!range_end.empty()) create["range_end"] = detail::etcd::base64(range_end);
    if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
    if (prev_kv) create["prev_kv"] = true;
    if (deletions_only) create["filters"] = nlohmann::json::array({"NOPUT"});
    const auto body = nlohmann::json{{"create_request", create}}.dump();
    std::string tried;
    const auto members = s.options.endpoints.size();
    for (std::size_t attempt = 0; attempt < members; ++attempt) {
        const auto member = (s.current + attempt) % members;
        std::string why;
        try {
            const auto deadline = detail::etcd::clock::now() + s.options.request_timeout;
            auto w = std::make_unique<detail::etcd::watch_stream>();
            w->member = s.name(member);
            w->conn = co_await detail::etcd::open(s, member, deadline);
            w->parser = std::make_unique<detail::etcd::response_parser>(true);
            const auto request = detail::etcd::http_request(s, member, "POST", "/v3/watch", body, true);
            try {
                co_await detail::etcd::before(deadline, detail::etcd::write_all(*w->conn, request),
                                              "no room to send within the read timeout", false);
            } catch (const std::system_error& e) {
                // The member went between connecting and sending (killed, restarted): another
                // member serves the watch.
                if (detail::etcd::cancelled(e)) throw;
                throw detail::etcd::send_failure(e);
            }
            co_await detail::etcd::read_response(*w->conn, *w->parser, deadline, detail::etcd::line_or_end, false);
            const int status = w->parser->status();
            if (status != 200) {
                const auto text = w->parser->lines.empty() ? w->parser->body : w->parser->lines.front();
                const auto [code, message] = detail::etcd::error_of(text);
                if (!detail::etcd::quorum_problem(code, message) && status < 500) {
                    throw etcd_error(detail::format("etcd at {} refused the watch: {} (HTTP {})", w->member, message,
                                                    status),
                                     code);
                }
                throw detail::etcd::member_error({detail::format("{} (HTTP {})", message, status), false, true, code});
            }
            etcd_watch out(std::move(w));
            auto first = co_await out.next();
            if (!first.created) throw detail::etcd::member_error({"the watch was not created", false, true, 0});
            s.current = member;
            co_return out;
        } catch (const detail::etcd::member_error& e) {
            why = e.what();
        } catch (const etcd_error& e) {
            if (!e.transient()) throw;
            why = e.what();
        }
        tried += detail::format("{}{}: {}", tried.empty() ? "" : "; ", s.name(member), why);
    }
    throw etcd_unavailable(detail::format("no etcd member served the watch: {}", tried), 14);
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
