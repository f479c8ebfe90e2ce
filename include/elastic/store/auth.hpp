// SPDX-License-Identifier: MIT
// The store's authentication handshake: a mutual HMAC-SHA256 challenge-response over a shared
// job secret, as two pure state machines (client and server) that consume bytes and produce
// bytes, so they can be tested and fuzzed without sockets. Byte layout in docs/store.md.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/store/errors.hpp"

#include "elastic/detail/format.hpp"
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

// Why this shape (docs/store.md, "Authentication"):
// - The first byte, 0xEA, is no opcode of either TCPStore dialect (legacy opcodes are 0..12,
//   the current dialect starts 00 CE F7 85 3C), so a server tells a handshake from a request
//   by its first byte, and a server without a secret rejects it as an unknown opcode.
// - The server proves itself first: a client sends nothing derived from the secret to a server
//   that has not shown it knows the secret.
// - Each MAC covers a direction label and both nonces, so neither side's proof can be replayed
//   on another connection (fresh nonces) or reflected back as the other side's (labels).
namespace elastic::inline v0::store_auth {

/// Bytes of a nonce and of a MAC (HMAC-SHA256).
inline constexpr std::size_t nonce_size = 32;
inline constexpr std::size_t mac_size = 32;
/// The version this code speaks (the byte after the magic).
inline constexpr std::uint8_t version = 1;
/// The 8 bytes that open both hellos: 0xEA then "elastic".
inline constexpr std::array<char, 8> magic{'\xEA', 'e', 'l', 'a', 's', 't', 'i', 'c'};
/// The client's hello: magic, version, client nonce.
inline constexpr std::size_t client_hello_size = magic.size() + 1 + nonce_size;
/// The server's challenge: magic, version, server nonce, server MAC.
inline constexpr std::size_t server_challenge_size = magic.size() + 1 + nonce_size + mac_size;
/// The client's proof: its MAC.
inline constexpr std::size_t client_proof_size = mac_size;
/// The server's verdict: one byte, `accepted`. A refused client is closed instead.
inline constexpr std::size_t verdict_size = 1;
inline constexpr std::uint8_t accepted = 0x01;

/// The labels each side's MAC starts with (same length, so the MAC input is unambiguous).
inline constexpr std::string_view server_label = "elastic-store-auth v1 server";
inline constexpr std::string_view client_label = "elastic-store-auth v1 client";
static_assert(server_label.size() == client_label.size());

using nonce = std::array<unsigned char, nonce_size>;
using mac = std::array<unsigned char, mac_size>;

/// A fresh nonce from OpenSSL's CSPRNG; store_error when it has no entropy.
ELASTIC_DECL nonce random_nonce();

/// HMAC-SHA256(secret, label || client nonce || server nonce).
ELASTIC_DECL mac compute_mac(std::string_view secret, std::string_view label, const nonce& client, const nonce& server);

/// What one `feed` did.
enum class status : std::uint8_t {
    need_more,  ///< `size` is how many bytes of input the next step needs; nothing consumed
    ok,         ///< `size` bytes consumed; the reply (if any) was appended to `out`
    refused,    ///< the peer failed; `reason` says how. Close the connection
};

struct step {
    store_auth::status status = status::need_more;
    std::size_t size = 0;
    std::string reason;
};

namespace detail {

ELASTIC_DECL std::string hex(std::string_view bytes, std::size_t at_most = 8);

// How many leading bytes of `in` match magic + version: all available ones, or the index of
// the first that differs.
ELASTIC_DECL std::size_t matching_prefix(std::string_view in);

ELASTIC_DECL void put_nonce(std::string& out, const nonce& n);

ELASTIC_DECL nonce get_nonce(std::string_view in);

ELASTIC_DECL void put_header(std::string& out);

ELASTIC_DECL bool same_mac(const mac& expected, std::string_view got);

}  // namespace detail

/// The server's side: reads the client's hello, answers with its nonce and proof, reads the
/// client's proof and answers `accepted`. Feed it the unconsumed input until done() or refused.
class server_handshake {
public:
    /// `secret` must not be empty. `server_nonce` is injectable for tests and fuzzing.
    server_handshake(std::string secret, const nonce& server_nonce)
        : secret_(std::move(secret)), server_nonce_(server_nonce) {}
    explicit server_handshake(std::string secret) : server_handshake(std::move(secret), random_nonce()) {}

    /// Consumes the next message from the front of `in`, appending the reply to `out`.
    step feed(std::string_view in, std::string& out) {
        switch (phase_) {
            case phase::hello: {
                const auto match = detail::matching_prefix(in);
                if (match < std::min(in.size(), magic.size() + 1)) {
                    phase_ = phase::failed;
                    return {status::refused, 0, describe_stranger(in, match)};
                }
                if (in.size() < client_hello_size) return {status::need_more, client_hello_size, {}};
                client_nonce_ = detail::get_nonce(in.substr(magic.size() + 1));
                detail::put_header(out);
                detail::put_nonce(out, server_nonce_);
                const auto m = compute_mac(secret_, server_label, client_nonce_, server_nonce_);
                out.append(reinterpret_cast<const char*>(m.data()), m.size());
                phase_ = phase::proof;
                return {status::ok, client_hello_size, {}};
            }
            case phase::proof: {
                if (in.size() < client_proof_size) return {status::need_more, client_proof_size, {}};
                const auto expected = compute_mac(secret_, client_label, client_nonce_, server_nonce_);
                if (!detail::same_mac(expected, in.substr(0, client_proof_size))) {
                    phase_ = phase::failed;
                    return {status::refused, 0,
                            "its proof does not verify: the client was given another secret "
                            "than this server's"};
                }
                out.push_back(static_cast<char>(accepted));
                phase_ = phase::done;
                return {status::ok, client_proof_size, {}};
            }
            case phase::done:
            case phase::failed: break;
        }
        return {status::refused, 0, "no handshake in progress (it has ended)"};
    }

    /// The client has proved it knows the secret.
    [[nodiscard]] bool done() const noexcept { return phase_ == phase::done; }
    /// This server's challenge is out; the client's proof is awaited.
    [[nodiscard]] bool challenged() const noexcept { return phase_ == phase::proof; }

private:
    enum class phase : std::uint8_t { hello, proof, done, failed };

    // The first bytes are not a handshake: say what they look like, for the log.
    static std::string describe_stranger(std::string_view in, std::size_t match) {
        const auto first = static_cast<unsigned char>(in[0]);
        if (match >= magic.size())
            return elastic::detail::format("its handshake has version {}, this server speaks {}",
                                           static_cast<unsigned>(static_cast<unsigned char>(in[match])), version);
        // 00 CE ...: the current dialect's VALIDATE; 00 anything else: a legacy SET.
        if (first == 0x00 && (in.size() == 1 || in[1] == '\xCE'))
            return elastic::detail::format("it sent a TCPStore request (bytes {}) without authenticating; "
                                           "this store needs the job's secret",
                                           detail::hex(in));
        if (first <= 12)
            return elastic::detail::format("it sent a TCPStore request of the PyTorch 1.13 dialect (opcode "
                                           "{}) without authenticating; this store needs the job's secret",
                                           static_cast<unsigned>(first));
        return elastic::detail::format("its first bytes ({}) are neither an authentication handshake nor a "
                                       "TCPStore request",
                                       detail::hex(in));
    }

    std::string secret_;
    nonce server_nonce_;
    nonce client_nonce_{};
    phase phase_ = phase::hello;
};

/// The client's side: start() gives the hello; feed() reads the server's challenge (checking
/// the server's proof before sending anything derived from the secret), appends the client's
/// proof, then reads the verdict.
class client_handshake {
public:
    /// `secret` must not be empty. `client_nonce` is injectable for tests and fuzzing.
    client_handshake(std::string secret, const nonce& client_nonce)
        : secret_(std::move(secret)), client_nonce_(client_nonce) {}
    explicit client_handshake(std::string secret) : client_handshake(std::move(secret), random_nonce()) {}

    /// Appends the hello to `out`.
    void start(std::string& out) const {
        detail::put_header(out);
        detail::put_nonce(out, client_nonce_);
    }

    /// Consumes the next server message from the front of `in`, appending the reply to `out`.
    step feed(std::string_view in, std::string& out) {
        switch (phase_) {
            case phase::challenge: {
                const auto match = detail::matching_prefix(in);
                if (match < std::min(in.size(), magic.size() + 1)) {
                    phase_ = phase::failed;
                    return {status::refused, 0,
                            match >= magic.size()
                                ? elastic::detail::format("it answered with handshake version {}, this "
                                                          "client speaks {}",
                                                          static_cast<unsigned>(static_cast<unsigned char>(in[match])),
                                                          version)
                                : elastic::detail::format("it answered the authentication handshake with "
                                                          "bytes {}: it is not an elastic store with a "
                                                          "secret",
                                                          detail::hex(in))};
                }
                if (in.size() < server_challenge_size) return {status::need_more, server_challenge_size, {}};
                const auto server_nonce = detail::get_nonce(in.substr(magic.size() + 1));
                const auto expected = compute_mac(secret_, server_label, client_nonce_, server_nonce);
                if (!detail::same_mac(expected, in.substr(magic.size() + 1 + nonce_size, mac_size))) {
                    phase_ = phase::failed;
                    return {status::refused, 0,
                            "its proof does not verify: the server was given another secret "
                            "than this client's (or it is not the job's store)"};
                }
                const auto m = compute_mac(secret_, client_label, client_nonce_, server_nonce);
                out.append(reinterpret_cast<const char*>(m.data()), m.size());
                phase_ = phase::verdict;
                return {status::ok, server_challenge_size, {}};
            }
            case phase::verdict: {
                if (in.size() < verdict_size) return {status::need_more, verdict_size, {}};
                if (static_cast<unsigned char>(in[0]) != accepted) {
                    phase_ = phase::failed;
                    return {status::refused, 0,
                            elastic::detail::format("it answered the proof with verdict 0x{:02x}, not "
                                                    "0x{:02x}",
                                                    static_cast<unsigned char>(in[0]), accepted)};
                }
                phase_ = phase::done;
                return {status::ok, verdict_size, {}};
            }
            case phase::done:
            case phase::failed: break;
        }
        return {status::refused, 0, "no handshake in progress (it has ended)"};
    }

    /// The server has accepted this client's proof.
    [[nodiscard]] bool done() const noexcept { return phase_ == phase::done; }
    /// The client's proof is sent: a close now means the server refused the secret.
    [[nodiscard]] bool proof_sent() const noexcept { return phase_ == phase::verdict; }

private:
    enum class phase : std::uint8_t { challenge, verdict, done, failed };

    std::string secret_;
    nonce client_nonce_;
    phase phase_ = phase::challenge;
};

}  // namespace elastic::inline v0::store_auth

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::store_auth {

ELASTIC_DECL nonce random_nonce() {
    nonce n{};
    if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
        throw store_error("the store's authentication cannot draw a random nonce (OpenSSL "
                          "RAND_bytes failed): the system has no entropy source");
    return n;
}

ELASTIC_DECL mac compute_mac(std::string_view secret, std::string_view label, const nonce& client,
                             const nonce& server) {
    std::array<unsigned char, server_label.size() + 2 * nonce_size> input{};
    auto* p = input.data();
    for (const char c : label) *p++ = static_cast<unsigned char>(c);
    for (const auto b : client) *p++ = b;
    for (const auto b : server) *p++ = b;
    mac out{};
    unsigned int len = 0;
    if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), input.data(), input.size(), out.data(),
             &len) == nullptr ||
        len != out.size())
        throw store_error("the store's authentication cannot compute HMAC-SHA256 (OpenSSL HMAC "
                          "failed)");
    return out;
}

}  // namespace elastic::inline v0::store_auth

namespace elastic::inline v0::store_auth {
namespace detail {

ELASTIC_DECL std::string hex(std::string_view bytes, std::size_t at_most) {
    std::string out;
    for (std::size_t i = 0; i < bytes.size() && i < at_most; ++i)
        out += elastic::detail::format("{}{:02x}", i ? " " : "", static_cast<unsigned char>(bytes[i]));
    if (bytes.size() > at_most) out += " ...";
    return out;
}

ELASTIC_DECL std::size_t matching_prefix(std::string_view in) {
    const std::size_t n = std::min(in.size(), magic.size() + 1);
    for (std::size_t i = 0; i < n; ++i) {
        const char want = i < magic.size() ? magic[i] : static_cast<char>(version);
        if (in[i] != want) return i;
    }
    return n;
}

ELASTIC_DECL void put_nonce(std::string& out, const nonce& n) {
    out.append(reinterpret_cast<const char*>(n.data()), n.size());
}

ELASTIC_DECL nonce get_nonce(std::string_view in) {
    nonce n{};
    for (std::size_t i = 0; i < n.size(); ++i) n[i] = static_cast<unsigned char>(in[i]);
    return n;
}

ELASTIC_DECL void put_header(std::string& out) {
    out.append(magic.data(), magic.size());
    out.push_back(static_cast<char>(version));
}

ELASTIC_DECL bool same_mac(const mac& expected, std::string_view got) {
    return got.size() == expected.size() && CRYPTO_memcmp(expected.data(), got.data(), expected.size()) == 0;
}

}  // namespace detail
}  // namespace elastic::inline v0::store_auth

#endif  // ELASTIC_DETAIL_BODIES
