// The store's authentication: the handshake's state machines without sockets, and a server
// with a secret on loopback against raw clients (refused, key table untouched, logged), half
// handshakes (closed after auth_timeout) and tcp_store_client with the right and wrong secret.
// test-tags: concurrent
#include <elastic/store/auth.hpp>
#include <elastic/store/client.hpp>
#include <elastic/store/server.hpp>

#include <doctest/doctest.h>

#include "store_support.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace test_store_auth {

using namespace std::chrono_literals;
using elastic::client_dialect;
using elastic::store_client_options;
using elastic::tcp_store_client;
using store_support::raw_client;
using store_support::unhex;
using fixture = store_support::server_fixture;
namespace auth = elastic::store_auth;

constexpr std::string_view secret = "the job's secret";

auth::nonce filled(unsigned char b) {
    auth::nonce n{};
    n.fill(b);
    return n;
}

elastic::store_server_options with_secret(std::string s = std::string(secret)) {
    elastic::store_server_options o;
    o.secret = std::move(s);
    return o;
}

store_client_options client_options(const fixture& f, std::optional<std::string> s,
                                    client_dialect d = client_dialect::detect) {
    store_client_options o;
    o.host = "127.0.0.1";
    o.port = f.port();
    o.dialect = d;
    o.secret = std::move(s);
    o.connect_timeout = 60s;
    return o;
}

template <class F>
asio::awaitable<std::string> auth_error_of(F f) {
    try {
        co_await f();
    } catch (const elastic::store_auth_error& e) {
        co_return std::string(e.what());
    }
    co_return std::string("no store_auth_error");
}

// The server's table as the test left it before any stranger came: one key.
void seed(fixture& f) { f.server->engine().set(std::string_view("/k"), std::string_view("v")); }

void check_untouched(fixture& f) {
    CHECK(f.server->engine().size() == 1);
    const auto* v = f.server->engine().find("/k");
    REQUIRE(v != nullptr);
    CHECK(*v == "v");
}

// The hello `c` sends first.
std::string hello_bytes(auth::client_handshake& c) {
    std::string out;
    c.start(out);
    return out;
}

}  // namespace test_store_auth
using namespace test_store_auth;

TEST_CASE("store auth: both sides with one secret complete the handshake, fed byte by byte") {
    auth::client_handshake client(std::string(secret), filled(0x11));
    auth::server_handshake server(std::string(secret), filled(0x22));
    const std::string hello = hello_bytes(client);
    REQUIRE(hello.size() == auth::client_hello_size);
    CHECK(static_cast<unsigned char>(hello[0]) == 0xEA);
    // The first byte tells it from both TCPStore dialects (wire::detect_dialect sees legacy,
    // and no legacy opcode is 0xEA).
    CHECK(elastic::wire::to_op(elastic::wire::dialect::legacy, 0xEA) == std::nullopt);

    // Every prefix of the hello needs more; the whole hello is consumed and answered.
    std::string challenge;
    for (std::size_t i = 1; i < hello.size(); ++i) {
        const auto s = server.feed(std::string_view(hello).substr(0, i), challenge);
        REQUIRE(s.status == auth::status::need_more);
        CHECK(s.size == auth::client_hello_size);
        CHECK(challenge.empty());
    }
    auto s = server.feed(hello, challenge);
    REQUIRE(s.status == auth::status::ok);
    CHECK(s.size == hello.size());
    REQUIRE(challenge.size() == auth::server_challenge_size);
    CHECK(server.challenged());

    std::string proof;
    s = client.feed(std::string_view(challenge).substr(0, 5), proof);
    CHECK(s.status == auth::status::need_more);
    s = client.feed(challenge, proof);
    REQUIRE(s.status == auth::status::ok);
    CHECK(s.size == challenge.size());
    REQUIRE(proof.size() == auth::client_proof_size);
    CHECK(client.proof_sent());

    std::string verdict;
    s = server.feed(proof, verdict);
    REQUIRE(s.status == auth::status::ok);
    CHECK(server.done());
    CHECK(verdict == std::string(1, static_cast<char>(auth::accepted)));
    std::string nothing;
    s = client.feed(verdict, nothing);
    REQUIRE(s.status == auth::status::ok);
    CHECK(client.done());
    CHECK(nothing.empty());
}

TEST_CASE("store auth: a client refuses a server with another secret before sending a proof") {
    auth::client_handshake client("mine", filled(0x11));
    auth::server_handshake server("theirs", filled(0x22));
    std::string challenge;
    REQUIRE(server.feed(hello_bytes(client), challenge).status == auth::status::ok);
    std::string proof;
    const auto s = client.feed(challenge, proof);
    CHECK(s.status == auth::status::refused);
    CHECK(s.reason.find("another secret") != std::string::npos);
    CHECK(proof.empty());  // nothing derived from the secret goes to an impostor
    CHECK(!client.done());
}

TEST_CASE("store auth: a server refuses a proof made with another secret, or replayed") {
    // A client with another secret that sends a proof anyway (it does not check the server).
    auth::server_handshake server(std::string(secret), filled(0x22));
    auth::client_handshake honest(std::string(secret), filled(0x11));
    std::string challenge;
    REQUIRE(server.feed(hello_bytes(honest), challenge).status == auth::status::ok);
    const auto server_nonce = std::string_view(challenge).substr(auth::magic.size() + 1, 32);
    const auto forged = auth::compute_mac("guess", auth::client_label, filled(0x11), [&] {
        auth::nonce n{};
        for (std::size_t i = 0; i < n.size(); ++i) n[i] = static_cast<unsigned char>(server_nonce[i]);
        return n;
    }());
    std::string out;
    auto s = server.feed(std::string_view(reinterpret_cast<const char*>(forged.data()), forged.size()), out);
    CHECK(s.status == auth::status::refused);
    CHECK(s.reason.find("another secret") != std::string::npos);
    CHECK(out.empty());
    CHECK(!server.done());

    // The server's own MAC sent back as the client's proof (a reflection) is refused: the
    // labels differ.
    auth::server_handshake second(std::string(secret), filled(0x22));
    std::string challenge2;
    REQUIRE(second.feed(hello_bytes(honest), challenge2).status == auth::status::ok);
    s = second.feed(std::string_view(challenge2).substr(auth::magic.size() + 1 + 32), out);
    CHECK(s.status == auth::status::refused);

    // A proof recorded on one connection does not open another (the server's nonce differs).
    auth::server_handshake first(std::string(secret), filled(0x33));
    auth::client_handshake c1(std::string(secret), filled(0x11));
    std::string ch1;
    std::string proof1;
    REQUIRE(first.feed(hello_bytes(c1), ch1).status == auth::status::ok);
    REQUIRE(c1.feed(ch1, proof1).status == auth::status::ok);
    auth::server_handshake later(std::string(secret), filled(0x44));
    std::string ch2;
    REQUIRE(later.feed(hello_bytes(c1), ch2).status == auth::status::ok);
    CHECK(later.feed(proof1, out).status == auth::status::refused);
}

TEST_CASE("store auth: a server names TCPStore requests and strangers sent instead of a hello") {
    const auto reason = [](std::string bytes) {
        auth::server_handshake server(std::string(secret), filled(0x22));
        std::string out;
        const auto s = server.feed(bytes, out);
        CHECK(s.status == auth::status::refused);
        CHECK(out.empty());
        return s.reason;
    };
    CHECK(reason(unhex("00 ce f7 85 3c")).find("TCPStore request") != std::string::npos);
    CHECK(reason(unhex("02 03 00x7")).find("PyTorch 1.13 dialect (opcode 2)") != std::string::npos);
    CHECK(reason("GET / HTTP/1.1\r\n").find("neither") != std::string::npos);
    // The magic with another version.
    CHECK(reason(unhex("ea 65 6c 61 73 74 69 63 02")).find("version 2") != std::string::npos);
    // A wrong byte inside the magic is refused as soon as it arrives.
    CHECK(reason(unhex("ea 65 6c 00")).find("neither") != std::string::npos);
}

TEST_CASE("store auth: an unauthenticated client is refused every read and write") {
    fixture f(with_secret());
    seed(f);
    f.run([&]() -> asio::awaitable<void> {
        const std::vector<std::string> attempts{
            unhex("00 02 00x7 2f 6b 01 00x7 78"),                  // legacy SET /k = x
            unhex("02 02 00x7 2f 6b"),                             // legacy GET /k
            unhex("03 02 00x7 2f 6e 05 00x7"),                     // legacy ADD /n 5
            unhex("08 02 00x7 2f 6b"),                             // legacy DELETE_KEY /k
            unhex("06"),                                           // legacy GETNUMKEYS
            unhex("00 ce f7 85 3c  01 02 00x7 2f 6b 01 00x7 78"),  // VALIDATE, SET /k = x
            unhex("00 ce f7 85 3c  11"),                           // VALIDATE, LIST_KEYS
        };
        for (const auto& bytes : attempts) {
            auto c = co_await raw_client::connect(f.port());
            co_await c.send(bytes);
            CHECK(co_await c.closed_by_peer());
        }
    }());
    check_untouched(f);
    INFO("log: ", f.logs.empty() ? std::string("(empty)") : f.logs.front());
    CHECK(f.logs.size() == 7);
    CHECK(f.logged("closing connection from 127.0.0.1:"));
    CHECK(f.logged("authentication failed: it sent a TCPStore request of the PyTorch 1.13 "
                   "dialect (opcode 0) without authenticating"));
    CHECK(f.logged("authentication failed: it sent a TCPStore request (bytes 00 ce f7 85 3c"));
}

TEST_CASE("store auth: half a handshake is closed after auth_timeout, the table untouched") {
    auto options = with_secret();
    options.auth_timeout = 50ms;
    fixture f(std::move(options));
    seed(f);
    f.run([&]() -> asio::awaitable<void> {
        auth::client_handshake c(std::string(secret), filled(0x11));
        auto half = co_await raw_client::connect(f.port());
        co_await half.send(hello_bytes(c).substr(0, 20));
        auto silent = co_await raw_client::connect(f.port());  // connects, sends nothing
        CHECK(co_await half.closed_by_peer());
        CHECK(co_await silent.closed_by_peer());
    }());
    check_untouched(f);
    CHECK(f.logged("no complete handshake within 50 ms (store_server_options::auth_timeout)"));
}

TEST_CASE("store auth: a raw client with a forged proof is refused and the server says why") {
    fixture f(with_secret());
    seed(f);
    f.run([&]() -> asio::awaitable<void> {
        auth::client_handshake c(std::string(secret), filled(0x11));
        auto raw = co_await raw_client::connect(f.port());
        co_await raw.send(hello_bytes(c));
        const auto challenge = co_await raw.read(auth::server_challenge_size);
        CHECK(challenge.substr(0, 1) == unhex("ea"));
        // 32 zero bytes instead of the MAC, then a SET that must never run.
        co_await raw.send(std::string(auth::mac_size, '\0') + unhex("00 02 00x7 2f 6b 01 00x7 78"));
        CHECK(co_await raw.closed_by_peer());
    }());
    check_untouched(f);
    CHECK(f.logged("authentication failed: its proof does not verify: the client was given "
                   "another secret"));
}

TEST_CASE("store auth: an authenticated client runs both dialects' operations and reconnects") {
    fixture f(with_secret());
    f.run([&]() -> asio::awaitable<void> {
        const auto ex = co_await asio::this_coro::executor;
        for (const auto d : {client_dialect::legacy, client_dialect::current, client_dialect::detect}) {
            CAPTURE(static_cast<int>(d));
            tcp_store_client c(ex, client_options(f, std::string(secret), d));
            co_await c.set("a", "1");
            CHECK(co_await c.get("a") == "1");
            CHECK(co_await c.add("n", 2) >= 2);
            CHECK(co_await c.compare_set("a", "1", "2") == "2");
            std::vector<std::string> keys{"a"};
            CHECK(co_await c.check(keys));
            co_await c.wait(keys, 10s);
            std::vector<std::string> mk{"m1", "m2"};
            std::vector<std::string> mv{"x", "y"};
            co_await c.multi_set(mk, mv);
            CHECK(co_await c.multi_get(mk) == mv);
            co_await c.append("m1", "z");
            CHECK(co_await c.get("m1") == "xz");
            CHECK(co_await c.num_keys() >= 4);
            // A reconnection authenticates again (the server serves nothing otherwise).
            c.close();
            CHECK(co_await c.delete_key("m2"));
            CHECK(c.dialect() ==
                  (d == client_dialect::legacy ? elastic::wire::dialect::legacy : elastic::wire::dialect::current));
        }
    }());
    // No connection was refused.
    INFO("log: ", f.logs.empty() ? std::string("(empty)") : f.logs.front());
    CHECK(!f.logged("authentication failed"));
}

TEST_CASE("store auth: the wrong secret is refused with a clear message on both sides") {
    fixture f(with_secret());
    seed(f);
    f.run([&]() -> asio::awaitable<void> {
        const auto ex = co_await asio::this_coro::executor;
        tcp_store_client wrong(ex, client_options(f, std::string("another secret")));
        const auto message = co_await auth_error_of([&]() -> asio::awaitable<void> {
            co_await wrong.set("k", "stolen");
        });
        CHECK(message.find("127.0.0.1:") != std::string::npos);
        CHECK(message.find("the server was given another secret than this client's") != std::string::npos);
        CHECK(message.find("store_client_options::secret") != std::string::npos);
        // The server logs the client's leaving after its challenge: awaited as that event.
        if (!f.logged("closed during the authentication handshake")) {
            asio::steady_timer logged(ex, asio::steady_timer::time_point::max());
            f.on_log = [&](std::string_view line) {
                if (line.find("closed during the authentication handshake") != std::string_view::npos) logged.cancel();
            };
            co_await logged.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
            f.on_log = nullptr;
        }
        // The server still serves a client of the right secret.
        tcp_store_client right(ex, client_options(f, std::string(secret)));
        CHECK(co_await right.get("k") == "v");
    }());
    check_untouched(f);
    CHECK(f.logged("closed during the authentication handshake, after this server's challenge"));
}

TEST_CASE("store auth: a client with a secret against a server without one says so") {
    fixture f;
    f.run([&]() -> asio::awaitable<void> {
        const auto ex = co_await asio::this_coro::executor;
        tcp_store_client c(ex, client_options(f, std::string(secret)));
        const auto message = co_await auth_error_of([&]() -> asio::awaitable<void> { co_await c.connect(); });
        CHECK(message.find("it has no secret (store_server_options::secret)") != std::string::npos);
    }());
    CHECK(f.logged("unknown opcode 0xea"));
}

TEST_CASE("store auth: empty secrets are refused when the options are made") {
    asio::io_context ctx;
    elastic::store_server_options o;
    o.secret = "";
    CHECK_THROWS_WITH_AS(elastic::tcp_store_server(ctx.get_executor(), o),
                         doctest::Contains("store_server_options::secret is empty"), elastic::store_error);
    store_client_options co;
    co.secret = "";
    CHECK_THROWS_WITH_AS(tcp_store_client(ctx.get_executor(), co),
                         doctest::Contains("store_client_options::secret is empty"), elastic::store_error);
}
