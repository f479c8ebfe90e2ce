// libFuzzer target for the store's authentication handshake (store/auth.hpp): arbitrary bytes
// fed to the server's and the client's state machines in arbitrary splits, as connections
// deliver them; neither accepts bytes that do not carry the right MAC.
#include <elastic/store/auth.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

namespace auth = elastic::store_auth;

[[noreturn]] void fail() { std::abort(); }

constexpr std::string_view secret = "fuzzing secret";

auth::nonce filled(unsigned char b) {
    auth::nonce n{};
    n.fill(b);
    return n;
}

// Feeds `in` to `side` the way a connection would: a prefix first (a partial read), then what
// is there, consuming what each step takes. Checks the promises of every step: need_more asks
// for more than it has, ok consumes at most what it has, refused says why and ends it all.
template <class Side>
void drive(Side& side, std::string_view in, std::size_t split, std::string& out) {
    for (int steps = 0; steps < 8; ++steps) {
        const auto partial = in.substr(0, split % (in.size() + 1));
        const auto before = out.size();
        auto p = side.feed(partial, out);
        if (p.status == auth::status::need_more) {
            if (p.size <= partial.size() || out.size() != before) fail();
        } else if (p.status == auth::status::refused) {
            if (p.reason.empty()) fail();
            // Once refused, always refused.
            if (side.feed(in, out).status != auth::status::refused) fail();
            return;
        } else if (p.size == 0 || p.size > partial.size()) {
            fail();
        } else {
            in.remove_prefix(p.size);
            split = split * 31 + 7;
            continue;
        }
        const auto r = side.feed(in, out);
        if (r.status == auth::status::need_more) {
            if (r.size <= in.size()) fail();
            return;
        }
        if (r.status == auth::status::refused) {
            if (r.reason.empty()) fail();
            return;
        }
        if (r.size == 0 || r.size > in.size()) fail();
        in.remove_prefix(r.size);
        split = split * 31 + 7;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) return 0;
    const std::size_t split = data[0];
    const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);

    // Where the peer's nonce and MAC sit in a hello followed by a proof, or in a challenge.
    const auto nonce_at = auth::magic.size() + 1;
    const auto mac_at = nonce_at + auth::nonce_size;
    const auto mac_matches = [&](std::string_view label, const auth::nonce& client_nonce,
                                 const auth::nonce& server_nonce) {
        const auto m = auth::compute_mac(secret, label, client_nonce, server_nonce);
        return in.size() >= mac_at + auth::mac_size &&
               in.substr(mac_at, auth::mac_size) == std::string_view(reinterpret_cast<const char*>(m.data()), m.size());
    };
    const auto input_nonce = [&] {
        auth::nonce n{};
        for (std::size_t i = 0; i < n.size() && nonce_at + i < in.size(); ++i)
            n[i] = static_cast<unsigned char>(in[nonce_at + i]);
        return n;
    };

    // The server accepts only a hello followed by the client's MAC of both nonces.
    auth::server_handshake server(std::string(secret), filled(0x22));
    std::string out;
    drive(server, in, split, out);
    if (server.done() && !mac_matches(auth::client_label, input_nonce(), filled(0x22))) fail();

    // The client sends its proof only after the server's MAC verified, and finishes only on
    // the verdict byte.
    auth::client_handshake client(std::string(secret), filled(0x11));
    std::string sent;
    client.start(sent);
    drive(client, in, split + 1, sent);
    if (sent.size() != auth::client_hello_size && (sent.size() != auth::client_hello_size + auth::mac_size ||
                                                   !mac_matches(auth::server_label, filled(0x11), input_nonce())))
        fail();
    if (client.done() && (in.size() <= auth::server_challenge_size ||
                          static_cast<unsigned char>(in[auth::server_challenge_size]) != auth::accepted))
        fail();

    // An honest client against the server, its bytes cut where the input says: always done.
    auth::server_handshake s2(std::string(secret), filled(static_cast<unsigned char>(split)));
    auth::client_handshake c2(std::string(secret), filled(0x33));
    std::string to_server;
    c2.start(to_server);
    std::string to_client;
    drive(s2, to_server, split + 2, to_client);
    std::string proof;
    drive(c2, to_client, split + 3, proof);
    std::string verdict;
    drive(s2, proof, split + 4, verdict);
    std::string none;
    drive(c2, verdict, split + 5, none);
    if (!s2.done() || !c2.done() || !none.empty()) fail();
    return 0;
}
