// SPDX-License-Identifier: MIT
// The typed values of torchrun's options (node ranges, endpoints, stream selections, rendezvous
// settings, signal lists, durations) and the parsers of their text forms.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/text.hpp"
#include "elastic/agent/spec.hpp"
#include "elastic/usage_error.hpp"
#include "elastic/process/signal_name.hpp"
#include "elastic/rendezvous/parameters.hpp"

#include "elastic/detail/format.hpp"
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace elastic::inline v0 {

using namespace std::chrono_literals;

namespace detail::launch {
using detail::lower;
using detail::show;
using detail::split;
using detail::to_integer;
using detail::trim;
}  // namespace detail::launch

/// An integer in [min, max]; `name` and `text` appear in the error.
[[nodiscard]] ELASTIC_DECL int parse_integer(std::string_view text, std::string_view name, int min, int max = INT_MAX);

/// A duration in seconds, decimals allowed (`0.5`), at least 0 (or above 0 unless `allow_zero`),
/// held to the millisecond.
[[nodiscard]] ELASTIC_DECL std::chrono::milliseconds parse_seconds(std::string_view text, std::string_view name,
                                                                   bool allow_zero);

/// A boolean word as torchrun's rendezvous parameters read it: 1/true/t/yes/y or 0/false/f/no/n,
/// in any case.
[[nodiscard]] ELASTIC_DECL bool parse_boolean(std::string_view text, std::string_view name);

/// A PET_* flag variable, read as torchrun does (`bool(int(value))`): an integer, non-zero is on.
[[nodiscard]] ELASTIC_DECL bool parse_flag_variable(std::string_view text, std::string_view name);

/// `--nnodes`: `N` or `MIN:MAX` with 0 < MIN <= MAX.
[[nodiscard]] ELASTIC_DECL node_range parse_node_range(std::string_view text, std::string_view name);

namespace detail::launch {

/// Host names, IPv4 addresses and (unbracketed) IPv6 addresses: torchrun's `[\w.:-]+`, plus `%` for
/// an IPv6 zone.
[[nodiscard]] ELASTIC_DECL bool valid_host(std::string_view host) noexcept;

}  // namespace detail::launch

/// A host name or address (`--master-addr`, `--local-addr`): letters, digits, `_ . : - %`.
[[nodiscard]] ELASTIC_DECL std::string parse_host(std::string_view text, std::string_view name);

/// `host`, `host:port`, `[ipv6]` or `[ipv6]:port` with a port from 0 to 65535. An IPv6 address
/// must be in brackets: torchrun would split `::1` into host `:` and port 1, we refuse it.
[[nodiscard]] ELASTIC_DECL host_port parse_host_port(std::string_view text, std::string_view name);

/// `--rdzv-backend`. torchrun's etcd backends (`etcd`, `etcd-v2`) use etcd's v2 API, which etcd 3.6
/// removed; elastic speaks the v3 API as `etcd-v3`, and says so instead of failing later.
[[nodiscard]] ELASTIC_DECL rendezvous_backend parse_rendezvous_backend(std::string_view text, std::string_view name);

namespace detail::launch {

/// What one `--rdzv-conf` key is, and which backends read it.
struct rdzv_key {
    std::string_view key;
    bool static_;
    bool c10d;
    bool etcd_v3;
};
inline constexpr std::array<rdzv_key, 17> rdzv_keys{{
    {"join_timeout", false, true, true},
    {"last_call_timeout", false, true, true},
    {"close_timeout", false, true, true},
    {"read_timeout", false, true, true},
    {"timeout", true, false, false},
    {"is_host", false, true, false},
    {"store_type", false, true, false},
    {"use_libuv", false, true, false},
    {"protocol", false, false, true},
    {"exit_barrier_timeout", true, true, true},
    {"keep_alive_interval", false, true, true},
    {"keep_alive_max_attempt", false, true, true},
    {"secret_file", true, true, false},
    {"workers_store_peers", false, true, true},
    {"cacert", false, false, true},
    {"cert", false, false, true},
    {"key", false, false, true},
}};

[[nodiscard]] ELASTIC_DECL bool reads_key(const rdzv_key& k, rendezvous_backend backend) noexcept;

[[nodiscard]] ELASTIC_DECL std::string keys_of(rendezvous_backend backend);

}  // namespace detail::launch

/// `--rdzv-conf k1=v1,k2=v2` for `backend`, over torchrun's defaults. An empty key or value and
/// a key given twice are errors; the value is everything after the first `=`; quotes a shell
/// left around the whole text or a value are removed. A key the backend does not read is an
/// error when `warnings` is null; otherwise, as torchrun does, it is ignored, and a line saying
/// so is appended to `warnings` (as is one for removed quotes).
[[nodiscard]] ELASTIC_DECL rendezvous_settings parse_rendezvous_settings(std::string_view text, std::string_view name,
                                                                         rendezvous_backend backend,
                                                                         std::vector<std::string>* warnings = nullptr);

/// `--redirects` / `--tee`: `0`..`3` for every local rank, or `lr:v,lr:v` per local rank
/// (torchrun's regex allows one-digit local ranks only; any non-negative rank is accepted here).
[[nodiscard]] ELASTIC_DECL stream_selection parse_stream_selection(std::string_view text, std::string_view name);

/// `--local-ranks-filter`: comma-separated local ranks; empty means every rank.
[[nodiscard]] ELASTIC_DECL std::set<int> parse_local_ranks(std::string_view text, std::string_view name);

/// `--duplicate-stdout-filters` / `--duplicate-stderr-filters`: comma-separated substrings, `,,`
/// standing for a comma inside one (`a,,b,c` is `a,b` and `c`); empty items are dropped. A
/// filter is matched as written: spaces count. Nothing to refuse: every text is a filter list.
[[nodiscard]] ELASTIC_DECL std::vector<std::string> parse_duplicate_filters(std::string_view text);

/// `--signals-to-handle`: comma-separated signal names (`SIGTERM,SIGUSR1`; the `SIG` prefix and the
/// case are optional). Duplicates are dropped; order is kept.
[[nodiscard]] ELASTIC_DECL std::vector<int> parse_signals(std::string_view text, std::string_view name);

/// `LOGLEVEL`: DEBUG, INFO, WARNING (or WARN), ERROR, CRITICAL (or FATAL), in any case.
[[nodiscard]] ELASTIC_DECL log_level parse_log_level(std::string_view text, std::string_view name);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL int parse_integer(std::string_view text, std::string_view name, int min, int max) {
    const auto value = detail::launch::to_integer(text);
    if (!value || *value < min || *value > max) {
        const auto rule = max == INT_MAX ? detail::format("an integer >= {}", min)
                                         : detail::format("an integer from {} to {}", min, max);
        throw usage_error{detail::format("{}: must be {}", detail::launch::show(name, text), rule)};
    }
    return static_cast<int>(*value);
}

[[nodiscard]] ELASTIC_DECL std::chrono::milliseconds parse_seconds(std::string_view text, std::string_view name,
                                                                   bool allow_zero) {
    const auto trimmed = detail::launch::trim(text);
    double seconds = -1;
    const auto [end, ec] = std::from_chars(trimmed.data(), trimmed.data() + trimmed.size(), seconds,
                                           std::chars_format::fixed);
    const bool ok = !trimmed.empty() && ec == std::errc{} && end == trimmed.data() + trimmed.size() &&
                    std::isfinite(seconds) && seconds <= 1e9 && (allow_zero ? seconds >= 0 : seconds > 0);
    if (!ok) {
        throw usage_error{detail::format("{}: must be a number of seconds {} (at most 1e9)",
                                         detail::launch::show(name, text), allow_zero ? ">= 0" : "> 0")};
    }
    return std::chrono::milliseconds{std::llround(seconds * 1000.0)};
}

[[nodiscard]] ELASTIC_DECL bool parse_boolean(std::string_view text, std::string_view name) {
    const auto word = detail::launch::lower(detail::launch::trim(text));
    if (word == "1" || word == "true" || word == "t" || word == "yes" || word == "y") {
        return true;
    }
    if (word == "0" || word == "false" || word == "f" || word == "no" || word == "n") {
        return false;
    }
    throw usage_error{
        detail::format("{}: must be a boolean (1/true/yes or 0/false/no)", detail::launch::show(name, text))};
}

[[nodiscard]] ELASTIC_DECL bool parse_flag_variable(std::string_view text, std::string_view name) {
    const auto value = detail::launch::to_integer(text);
    if (!value) {
        throw usage_error{
            detail::format("{}: must be an integer (1 turns the flag on, 0 off)", detail::launch::show(name, text))};
    }
    return *value != 0;
}

[[nodiscard]] ELASTIC_DECL node_range parse_node_range(std::string_view text, std::string_view name) {
    const auto fail = [&](std::string_view why) {
        return usage_error{
            detail::format("{}: {} (want N or MIN:MAX with 0 < MIN <= MAX)", detail::launch::show(name, text), why)};
    };
    const auto pieces = detail::launch::split(text, ':');
    if (pieces.size() > 2) {
        throw fail("too many ':'");
    }
    const auto min = detail::launch::to_integer(pieces.front());
    const auto max = pieces.size() == 2 ? detail::launch::to_integer(pieces.back()) : min;
    if (!min || !max) {
        throw fail("not an integer");
    }
    if (*min <= 0 || *max <= 0) {
        throw fail("node counts must be positive");
    }
    if (*min > *max) {
        throw fail(detail::format("the minimum {} exceeds the maximum {}", *min, *max));
    }
    if (*max > INT_MAX) {
        throw fail("too large");
    }
    return node_range{static_cast<int>(*min), static_cast<int>(*max)};
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::launch {

[[nodiscard]] ELASTIC_DECL bool valid_host(std::string_view host) noexcept {
    return !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' || c == ':' || c == '-' ||
               c == '%';
    });
}

}  // namespace detail::launch
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL std::string parse_host(std::string_view text, std::string_view name) {
    const auto host = detail::launch::trim(text);
    if (!detail::launch::valid_host(host)) {
        throw usage_error{
            detail::format("{}: must be a host name, an IPv4 or an IPv6 address", detail::launch::show(name, text))};
    }
    return std::string{host};
}

[[nodiscard]] ELASTIC_DECL host_port parse_host_port(std::string_view text, std::string_view name) {
    const auto fail = [&](std::string_view why) {
        return usage_error{detail::format("{}: {} (want host[:port], an IPv6 address as [addr]:port)",
                                          detail::launch::show(name, text), why)};
    };
    const auto endpoint = detail::launch::trim(text);
    if (endpoint.empty()) {
        throw fail("empty");
    }
    host_port result;
    std::string_view port_text;
    bool has_port = false;
    if (endpoint.front() == '[') {
        const auto close = endpoint.find(']');
        if (close == std::string_view::npos) {
            throw fail("no ']' after the IPv6 address");
        }
        result.host = std::string{endpoint.substr(1, close - 1)};
        const auto rest = endpoint.substr(close + 1);
        if (!rest.empty()) {
            if (rest.front() != ':') {
                throw fail("unexpected text after ']'");
            }
            port_text = rest.substr(1);
            has_port = true;
        }
        if (result.host.find(':') == std::string::npos || !detail::launch::valid_host(result.host)) {
            throw fail("the bracketed part is not an IPv6 address");
        }
    } else {
        const auto colon = endpoint.find(':');
        if (colon != std::string_view::npos && endpoint.find(':', colon + 1) != std::string_view::npos) {
            throw fail("an IPv6 address must be written in brackets");
        }
        result.host = std::string{endpoint.substr(0, colon)};
        if (colon != std::string_view::npos) {
            port_text = endpoint.substr(colon + 1);
            has_port = true;
        }
        if (!detail::launch::valid_host(result.host)) {
            throw fail("bad host name");
        }
    }
    if (has_port) {
        const auto port = detail::launch::to_integer(port_text);
        if (!port || *port < 0 || *port > 65535 || detail::launch::trim(port_text) != port_text) {
            throw fail("the port must be an integer from 0 to 65535");
        }
        result.port = static_cast<std::uint16_t>(*port);
    }
    return result;
}

[[nodiscard]] ELASTIC_DECL rendezvous_backend parse_rendezvous_backend(std::string_view text, std::string_view name) {
    const auto word = detail::launch::trim(text);
    if (word == "static") {
        return rendezvous_backend::static_;
    }
    if (word == "c10d") {
        return rendezvous_backend::c10d;
    }
    if (word == "etcd-v3") {
        return rendezvous_backend::etcd_v3;
    }
    if (word == "etcd" || word == "etcd-v2") {
        throw usage_error{detail::format(
            "{}: torchrun's etcd backends use etcd's v2 API (removed in etcd 3.6), which elastic does not "
            "speak; use --rdzv-backend=etcd-v3 (etcd's v3 API) or --rdzv-backend=c10d",
            detail::launch::show(name, text))};
    }
    throw usage_error{detail::format("{}: unknown rendezvous backend (known: static, c10d, etcd-v3)",
                                     detail::launch::show(name, text))};
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::launch {

[[nodiscard]] ELASTIC_DECL bool reads_key(const rdzv_key& k, rendezvous_backend backend) noexcept {
    switch (backend) {
        case rendezvous_backend::static_: return k.static_;
        case rendezvous_backend::c10d: return k.c10d;
        case rendezvous_backend::etcd_v3: return k.etcd_v3;
    }
    return false;
}

[[nodiscard]] ELASTIC_DECL std::string keys_of(rendezvous_backend backend) {
    std::string out;
    for (const auto& k : rdzv_keys) {
        if (reads_key(k, backend)) {
            out += out.empty() ? "" : ", ";
            out += k.key;
        }
    }
    return out;
}

}  // namespace detail::launch
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL rendezvous_settings parse_rendezvous_settings(std::string_view text, std::string_view name,
                                                                         rendezvous_backend backend,
                                                                         std::vector<std::string>* warnings) {
    rendezvous_settings settings;
    const auto whole = detail::launch::show(name, text);
    // A script that quotes the value twice ("'join_timeout=5,...'") passes the quotes on.
    bool unquoted = false;
    const auto unquote = [&](std::string_view t) {
        t = detail::launch::trim(t);
        if (t.size() >= 2 && (t.front() == '\'' || t.front() == '"') && t.back() == t.front()) {
            unquoted = true;
            return detail::launch::trim(t.substr(1, t.size() - 2));
        }
        return t;
    };
    text = unquote(text);
    if (text.empty()) {
        return settings;
    }
    std::set<std::string, std::less<>> seen;
    std::vector<std::string> ignored;
    for (const auto item : detail::launch::split(text, ',')) {
        const auto equals = item.find('=');
        const auto key = detail::launch::trim(item.substr(0, equals));
        const auto value = equals == std::string_view::npos ? std::string_view{} : unquote(item.substr(equals + 1));
        if (key.empty() || equals == std::string_view::npos || value.empty()) {
            throw usage_error{
                detail::format("{}: '{}' is not key=value (want k1=v1,k2=v2 with non-empty keys and values)", whole,
                               item)};
        }
        if (!seen.emplace(key).second) {
            throw usage_error{detail::format("{}: key '{}' given twice", whole, key)};
        }
        const auto what = detail::format("{} key {}", name, key);
        if (key == "rank") {
            throw usage_error{detail::format("{}: the node's rank is set with --node-rank, not with rank=", whole)};
        }
        if (key == "ca_cert" || key == "ssl_cert" || key == "ssl_cert_key") {
            throw usage_error{
                detail::format("{}: '{}' is not a key of elastic's: TLS to etcd takes protocol=https with "
                               "cacert, cert and key (torchrun's etcd keys)",
                               whole, key)};
        }
        const auto known = std::find_if(detail::launch::rdzv_keys.begin(), detail::launch::rdzv_keys.end(),
                                        [&](const detail::launch::rdzv_key& k) { return k.key == key; });
        if (known == detail::launch::rdzv_keys.end() || !detail::launch::reads_key(*known, backend)) {
            if (warnings == nullptr) {
                throw usage_error{detail::format("{}: the {} backend does not read '{}' (it reads: {})", whole,
                                                 to_string(backend), key, detail::launch::keys_of(backend))};
            }
            ignored.emplace_back(key);
            continue;
        }
        if (key == "join_timeout") {
            settings.join_timeout = parse_seconds(value, what, false);
        } else if (key == "last_call_timeout") {
            settings.last_call_timeout = parse_seconds(value, what, true);  // 0: close the round at MIN
        } else if (key == "close_timeout") {
            settings.close_timeout = parse_seconds(value, what, false);
        } else if (key == "read_timeout") {
            settings.read_timeout = parse_seconds(value, what, false);
        } else if (key == "timeout") {
            settings.timeout = parse_seconds(value, what, false);
        } else if (key == "exit_barrier_timeout") {
            settings.exit_barrier_timeout = parse_seconds(value, what, true);  // 0: do not wait
        } else if (key == "keep_alive_interval") {
            settings.keep_alive_interval = parse_seconds(value, what, false);
        } else if (key == "keep_alive_max_attempt") {
            settings.keep_alive_max_attempt = parse_integer(value, what, 1, 1000);
        } else if (key == "is_host") {
            settings.is_host = parse_boolean(value, what);
        } else if (key == "workers_store_peers") {
            const auto peers = detail::launch::lower(value);
            if (peers != "members" && peers != "any") {
                throw usage_error{detail::format("{}: workers_store_peers must be members (the round's nodes' "
                                                 "addresses only) or any (every peer, for NAT between the nodes)",
                                                 whole)};
            }
            settings.workers_store_any_peer = peers == "any";
        } else if (key == "secret_file") {
            settings.secret_file = std::string(value);
        } else if (key == "store_type") {
            const auto type = detail::launch::lower(value);
            if (type == "file") {
                throw usage_error{detail::format("{}: store_type=file (a FileStore) is not implemented; elastic's c10d "
                                                 "backend uses a TCP store (store_type=tcp)",
                                                 whole)};
            }
            if (type != "tcp") {
                throw usage_error{detail::format("{}: store_type must be tcp", whole)};
            }
        } else if (key == "use_libuv") {
            // Accepted for compatibility: it picks the Python TCPStore server's event loop; elastic's
            // store server is its own, so the value is checked and has nothing to change.
            (void)parse_boolean(value, what);
        } else if (key == "protocol") {
            const auto protocol = detail::launch::lower(value);
            if (protocol != "http" && protocol != "https") {
                throw usage_error{detail::format("{}: protocol must be http or https", whole)};
            }
            settings.tls = protocol == "https";
        } else if (key == "cacert") {
            settings.cacert = std::string(value);
        } else if (key == "cert") {
            settings.cert = std::string(value);
        } else if (key == "key") {
            settings.key = std::string(value);
        }
    }
    if ((settings.cacert || settings.cert || settings.key) && !settings.tls) {
        throw usage_error{detail::format("{}: cacert, cert and key are for TLS to etcd: add protocol=https", whole)};
    }
    if (settings.key.has_value() != settings.cert.has_value()) {
        throw usage_error{
            detail::format("{}: cert and key go together (a client certificate and its private key)", whole)};
    }
    if (warnings != nullptr && unquoted) {
        warnings->push_back(detail::format("{}: the quotes around its value were removed (a script quoted it twice); "
                                           "read as {}",
                                           name, text));
    }
    if (warnings != nullptr && !ignored.empty()) {
        warnings->push_back(detail::format("{}: the {} backend does not read {} '{}'; ignored, as torchrun does (it "
                                           "reads: {})",
                                           name, to_string(backend), ignored.size() == 1 ? "the key" : "the keys",
                                           fmt::join(ignored, "', '"), detail::launch::keys_of(backend)));
    }
    return settings;
}

[[nodiscard]] ELASTIC_DECL stream_selection parse_stream_selection(std::string_view text, std::string_view name) {
    const auto fail = [&]() {
        return usage_error{detail::format("{}: want 0 (none), 1 (stdout), 2 (stderr), 3 (both), or per local rank "
                                          "LOCAL_RANK:N,... such as 0:3,1:2",
                                          detail::launch::show(name, text))};
    };
    const auto streams_of = [&](std::string_view digit) {
        const auto value = detail::launch::to_integer(digit);
        if (!value || *value < 0 || *value > 3 || detail::launch::trim(digit) != digit) {
            throw fail();
        }
        return static_cast<std_streams>(*value);
    };
    stream_selection selection;
    const auto trimmed = detail::launch::trim(text);
    if (trimmed.find(':') == std::string_view::npos) {
        selection.every_rank = streams_of(trimmed);
        return selection;
    }
    for (const auto item : detail::launch::split(trimmed, ',')) {
        const auto colon = item.find(':');
        if (colon == std::string_view::npos) {
            throw fail();
        }
        const auto rank = detail::launch::to_integer(item.substr(0, colon));
        if (!rank || *rank < 0 || *rank > INT_MAX ||
            detail::launch::trim(item.substr(0, colon)) != item.substr(0, colon)) {
            throw fail();
        }
        if (!selection.per_rank.emplace(static_cast<int>(*rank), streams_of(item.substr(colon + 1))).second) {
            throw usage_error{detail::format("{}: local rank {} given twice", detail::launch::show(name, text), *rank)};
        }
    }
    return selection;
}

[[nodiscard]] ELASTIC_DECL std::set<int> parse_local_ranks(std::string_view text, std::string_view name) {
    std::set<int> ranks;
    if (detail::launch::trim(text).empty()) {
        return ranks;
    }
    for (const auto item : detail::launch::split(text, ',')) {
        const auto rank = detail::launch::to_integer(item);
        if (!rank || *rank < 0 || *rank > INT_MAX) {
            throw usage_error{detail::format("{}: want comma-separated local ranks such as 0,2 ('{}' is not one)",
                                             detail::launch::show(name, text), item)};
        }
        ranks.insert(static_cast<int>(*rank));
    }
    return ranks;
}

[[nodiscard]] ELASTIC_DECL std::vector<std::string> parse_duplicate_filters(std::string_view text) {
    std::vector<std::string> filters;
    std::string item;
    for (std::size_t i = 0; i <= text.size(); ++i) {
        if (i < text.size() && text[i] != ',') {
            item += text[i];
        } else if (i + 1 < text.size() && text[i + 1] == ',') {
            item += ',';  // ",," is a comma inside the item
            ++i;
        } else {
            if (!item.empty()) filters.push_back(std::move(item));
            item.clear();
        }
    }
    return filters;
}

[[nodiscard]] ELASTIC_DECL std::vector<int> parse_signals(std::string_view text, std::string_view name) {
    std::vector<int> numbers;
    for (const auto item : detail::launch::split(text, ',')) {
        auto word = detail::launch::lower(detail::launch::trim(item));
        if (word.rfind("sig", 0) != 0) {
            word = "sig" + word;
        }
        const int number = signal_number(word);
        const auto known = std::find(forwardable_signal_numbers.begin(), forwardable_signal_numbers.end(), number);
        if (number == 0 || known == forwardable_signal_numbers.end()) {
            const bool untrappable = word == "sigkill" || word == "sigstop" || word == "sigchld" || word == "sigsegv" ||
                                     word == "sigbus" || word == "sigfpe" || word == "sigill" || word == "sigabrt" ||
                                     word == "sigtrap" || word == "sigsys" || word == "sigpipe";
            throw usage_error{
                detail::format("{}: '{}' {} (want names such as SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2)",
                               detail::launch::show(name, text), detail::launch::trim(item),
                               untrappable ? "cannot be trapped and forwarded by the agent" : "is not a signal name")};
        }
        if (std::find(numbers.begin(), numbers.end(), number) == numbers.end()) {
            numbers.push_back(number);
        }
    }
    return numbers;
}

[[nodiscard]] ELASTIC_DECL log_level parse_log_level(std::string_view text, std::string_view name) {
    const auto word = detail::launch::lower(detail::launch::trim(text));
    if (word == "debug") return log_level::debug;
    if (word == "info") return log_level::info;
    if (word == "warning" || word == "warn") return log_level::warning;
    if (word == "error") return log_level::error;
    if (word == "critical" || word == "fatal") return log_level::critical;
    throw usage_error{
        detail::format("{}: must be DEBUG, INFO, WARNING, ERROR or CRITICAL", detail::launch::show(name, text))};
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
