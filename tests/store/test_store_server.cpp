// The TCP store server: byte-exact transcripts of both dialects, PyTorch 1.13's Python client,
// malformed input that closes only its own connection, thousands of connections, and an idle
// server that uses no CPU.
// test-tags: concurrent
#include <elastic/store/client.hpp>
#include <elastic/store/memory_store.hpp>
#include <elastic/store/server.hpp>

#include <doctest/doctest.h>

#include "idle_cpu.hpp"

#include "store_support.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/read.hpp>
#include <asio/write.hpp>

#include <chrono>
#include <csignal>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace test_store_server {

using store_support::hex;
using store_support::raw_client;
using store_support::unhex;

using fixture = store_support::server_fixture;

// Sends a request and checks the reply bytes (none when reply_hex is empty).
asio::awaitable<void> exchange(raw_client& c, std::string_view request_hex, std::string_view reply_hex) {
    co_await c.send_hex(request_hex);
    const auto expected = unhex(reply_hex);
    if (expected.empty()) co_return;
    const auto got = co_await c.read_hex(expected.size());
    INFO("request: ", request_hex);
    CHECK(got == hex(expected));
}

// Reads as many bytes as `reply_hex` has and checks them.
asio::awaitable<void> expect(raw_client& c, std::string_view reply_hex) {
    const auto expected = unhex(reply_hex);
    CHECK(co_await c.read_hex(expected.size()) == hex(expected));
}

// A legacy client blocked in WAIT ["/late"], registered for sure: the GETNUMKEYS sent after it
// is answered first, which proves the server ran the WAIT.
asio::awaitable<raw_client> blocked_waiter(std::uint16_t port) {
    auto w = co_await raw_client::connect(port);
    co_await w.send_hex("05 01 00x7 05 00x7 2f 6c 61 74 65   06");
    co_await w.read(8);
    co_return w;
}

// Writes "/late" from a fresh connection and checks the blocked waiter gets its STOP_WAITING.
asio::awaitable<void> release_waiter(std::uint16_t port, raw_client& w) {
    auto setter = co_await raw_client::connect(port);
    co_await setter.send_hex("00 05 00x7 2f 6c 61 74 65 01 00x7 31");
    CHECK(co_await w.read_hex(1) == "00");
}

// One malformed input: it closes only its connection, is logged with peer and reason, and a
// client blocked in WAIT meanwhile still gets its reply.
void check_rejected(const std::string& bad_bytes, std::string_view reason, elastic::store_server_options options = {}) {
    fixture f(std::move(options));
    f.run([&]() -> asio::awaitable<void> {
        auto w = co_await blocked_waiter(f.port());
        auto bad = co_await raw_client::connect(f.port());
        co_await bad.send(bad_bytes);
        CHECK(co_await bad.closed_by_peer());
        co_await release_waiter(f.port(), w);
        // The waiter's connection still serves requests.
        co_await exchange(w, "02 05 00x7 2f 6c 61 74 65", "01 00x7 31");
    }());
    INFO("log: ", f.logs.empty() ? std::string("(empty)") : f.logs.front());
    CHECK(f.logged("127.0.0.1:"));
    CHECK(f.logged(reason));
}

}  // namespace test_store_server

using namespace test_store_server;

TEST_CASE("store: server answers the observed 1.13 bytes (legacy dialect)") {
    fixture f;
    f.run([&]() -> asio::awaitable<void> {
        auto master = co_await raw_client::connect(f.port());
        auto c = co_await raw_client::connect(f.port());
        auto idle = co_await raw_client::connect(f.port());  // 1.13's unused second connection
        // wire §1.6, in the order captured; the master's init/ ADD comes first.
        co_await exchange(master, "03 05 00x7 69 6e 69 74 2f 01 00x7", "01 00x7");
        co_await exchange(c, "03 05 00x7 69 6e 69 74 2f 01 00x7", "02 00x7");
        co_await exchange(c, "00 03 00x7 2f 6b 31 02 00x7 76 31", "");
        co_await exchange(c, "05 01 00x7 03 00x7 2f 6b 31", "00");
        co_await exchange(c, "02 03 00x7 2f 6b 31", "02 00x7 76 31");
        co_await exchange(c, "03 04 00x7 2f 63 6e 74 05 00x7", "05 00x7");
        co_await exchange(c, "03 04 00x7 2f 63 6e 74 fe ff ff ff ff ff ff ff", "03 00x7");
        co_await exchange(c, "01 03 00x7 2f 6b 31 02 00x7 76 31 02 00x7 76 32", "02 00x7 76 32");
        co_await exchange(c, "01 03 00x7 2f 6b 31 02 00x7 7a 7a 02 00x7 76 33", "02 00x7 76 32");
        co_await exchange(c, "01 07 00x7 2f 6e 65 77 6b 65 79 00x8 02 00x7 6e 31", "02 00x7 6e 31");
        co_await exchange(c, "01 08 00x7 2f 61 62 73 65 6e 74 32 01 00x7 78 01 00x7 79", "01 00x7 78");
        co_await exchange(c, "06", "04 00x7");  // init/, /k1, /cnt, /newkey
        co_await exchange(c, "08 03 00x7 2f 6b 31", "01 00x7");
        co_await exchange(c, "08 06 00x7 2f 6e 6f 6b 65 79", "00x8");
        co_await exchange(c, "00 04 00x7 2f 62 69 6e 03 00x7 00 01 ff", "");
        co_await exchange(c, "02 04 00x7 2f 62 69 6e", "03 00x7 00 01 ff");
        // Raw probes: CHECK, WAIT on an empty list.
        co_await exchange(c, "00 06 00x7 2f 61 6c 69 76 65 01 00x7 31", "");
        co_await exchange(c, "04 02 00x7 06 00x7 2f 61 6c 69 76 65 05 00x7 2f 6e 6f 70 65", "01");
        co_await exchange(c, "04 01 00x7 06 00x7 2f 61 6c 69 76 65", "00");
        co_await exchange(c, "05 00x8", "00");
        // GET of a missing key: an empty value (1.13 closed the connection; libuv answers).
        co_await exchange(c, "02 08 00x7 2f 6d 69 73 73 69 6e 67", "00x8");
        // A request that arrives one byte per segment, as 1.13 sends opcodes.
        for (const char b : unhex("03 04 00x7 2f 63 6e 74 0a 00x7")) co_await c.send(std::string(1, b));
        CHECK(co_await c.read_hex(8) == hex(unhex("0d 00x7")));
        // Two requests in one segment.
        co_await exchange(c, "06 08 04 00x7 2f 62 69 6e", "05 00x7 01 00x7");
        CHECK(f.server->engine().find("/cnt") != nullptr);
        CHECK(*f.server->engine().find("/cnt") == "13");  // decimal ASCII
        (void)idle;
    }());
    CHECK(f.logs.empty());
}

TEST_CASE("store: server legacy WAIT is answered by push when the last key is written") {
    fixture f;
    f.run([&]() -> asio::awaitable<void> {
        auto a = co_await raw_client::connect(f.port());
        auto b = co_await raw_client::connect(f.port());
        // WAIT ["/a", "/b"], then GETNUMKEYS, whose reply comes first: the wait is registered.
        co_await a.send_hex("05 02 00x7 02 00x7 2f 61 02 00x7 2f 62   06");
        CHECK(co_await a.read_hex(8) == hex(unhex("00x8")));
        co_await exchange(b, "00 02 00x7 2f 61 01 00x7 31   06", "01 00x7");
        CHECK(f.server->engine().awaited_keys() == 1);  // still waiting for /b
        co_await exchange(b, "00 02 00x7 2f 62 01 00x7 32", "");
        CHECK(co_await a.read_hex(1) == "00");
        // A creating COMPARE_SET wakes a waiter too (the libuv server's improvement).
        co_await a.send_hex("05 01 00x7 02 00x7 2f 63   06");
        CHECK(co_await a.read_hex(8) == hex(unhex("02 00x7")));
        co_await exchange(b, "01 02 00x7 2f 63 00x8 01 00x7 78", "01 00x7 78");
        CHECK(co_await a.read_hex(1) == "00");
        // APPEND (0x09) creating a key wakes; ADD creating one wakes.
        co_await a.send_hex("05 02 00x7 02 00x7 2f 64 02 00x7 2f 65   06");
        CHECK(co_await a.read_hex(8) == hex(unhex("03 00x7")));
        co_await exchange(b, "09 02 00x7 2f 64 01 00x7 61", "");
        co_await exchange(b, "03 02 00x7 2f 65 07 00x7", "07 00x7");
        CHECK(co_await a.read_hex(1) == "00");
        CHECK(f.server->engine().awaited_keys() == 0);
    }());
}

TEST_CASE("store: server legacy WATCH_KEY, APPEND, MULTI_GET, MULTI_SET, CANCEL_WAIT") {
    fixture f;
    f.run([&]() -> asio::awaitable<void> {
        auto w = co_await raw_client::connect(f.port());
        auto c = co_await raw_client::connect(f.port());
        // WATCH_KEY "/w" -> KEY_CALLBACK_REGISTERED, then notifications (wire §1.6 probes).
        co_await exchange(w, "07 02 00x7 2f 77", "03");
        co_await exchange(c, "00 02 00x7 2f 77 03 00x7 6f 6e 65", "");
        co_await expect(w, "01 02 00x7 2f 77 00x8 03 00x7 6f 6e 65");
        co_await exchange(c, "00 02 00x7 2f 77 03 00x7 74 77 6f", "");
        co_await expect(w, "00 02 00x7 2f 77 03 00x7 6f 6e 65 03 00x7 74 77 6f");
        co_await exchange(c, "08 02 00x7 2f 77", "01 00x7");
        co_await expect(w, "02 02 00x7 2f 77 03 00x7 74 77 6f 00x8");
        co_await exchange(c, "03 02 00x7 2f 77 07 00x7", "07 00x7");
        co_await expect(w, "01 02 00x7 2f 77 00x8 01 00x7 37");
        // APPEND 0x09, MULTI_SET 0x0b, MULTI_GET 0x0a (missing key: empty value).
        co_await exchange(c, "09 02 00x7 2f 78 01 00x7 61", "");
        co_await exchange(c, "09 02 00x7 2f 78 01 00x7 62", "");
        co_await exchange(c, "0b 02 00x7 02 00x7 2f 79 01 00x7 31 02 00x7 2f 7a 00x8", "");
        co_await exchange(c, "0a 04 00x7 02 00x7 2f 78 02 00x7 2f 79 02 00x7 2f 7a 02 00x7 2f 71",
                          "02 00x7 61 62 01 00x7 31 00x8 00x8");
        // CANCEL_WAIT 0x0c: a pending wait is dropped and answered WAIT_CANCELED only.
        co_await exchange(c, "05 01 00x7 02 00x7 2f 6e", "");
        co_await exchange(c, "0c", "01");
        co_await exchange(w, "00 02 00x7 2f 6e 01 00x7 31   06", "05 00x7");  // /n written
        co_await exchange(c, "06", "05 00x7");                                // no stray 0x00 before this reply
    }());
}

TEST_CASE("store: server current dialect: VALIDATE, PING, WAIT, CANCEL_WAIT and its race") {
    fixture f;
    f.run([&]() -> asio::awaitable<void> {
        // VALIDATE without PING (clients of about 2.2-2.5), then SET=1 and GET=3.
        auto a = co_await raw_client::connect(f.port());
        co_await exchange(a, "00 ce f7 85 3c   01 03 00x7 2f 6b 31 02 00x7 76 31", "");
        co_await exchange(a, "03 03 00x7 2f 6b 31", "02 00x7 76 31");
        co_await exchange(a, "04 04 00x7 2f 63 6e 74 05 00x7", "05 00x7");  // ADD=4
        co_await exchange(a, "05 01 00x7 04 00x7 2f 63 6e 74", "00");       // CHECK=5
        co_await exchange(a, "07", "02 00x7");                              // GETNUMKEYS=7: /k1, /cnt
        co_await exchange(a, "02 03 00x7 2f 6b 31 02 00x7 76 31 02 00x7 76 32",
                          "02 00x7 76 32");  // COMPARE_SET=2
        // VALIDATE then PING: the nonce is echoed.
        auto b = co_await raw_client::connect(f.port());
        co_await exchange(b, "00 ce f7 85 3c   0d 39 30 00 00", "39 30 00 00");
        // A legacy client sees the same keys.
        auto legacy = co_await raw_client::connect(f.port());
        co_await exchange(legacy, "02 03 00x7 2f 6b 31", "02 00x7 76 32");
        // WAIT=6 answered later: PING after it is answered first, proving registration.
        co_await b.send_hex("06 01 00x7 02 00x7 2f 77   0d 01 00 00 00");
        CHECK(co_await b.read_hex(4) == "01 00 00 00");
        co_await exchange(a, "01 02 00x7 2f 77 01 00x7 31", "");
        CHECK(co_await b.read_hex(1) == "00");
        // CANCEL_WAIT=12 before any write: only WAIT_CANCELED, and no late STOP_WAITING.
        co_await b.send_hex("06 01 00x7 02 00x7 2f 78   0c");
        CHECK(co_await b.read_hex(1) == "01");
        CHECK(f.server->engine().awaited_keys() == 0);
        co_await exchange(a, "01 02 00x7 2f 78 01 00x7 31   07", "04 00x7");  // /x written
        co_await exchange(b, "0d 02 00 00 00", "02 00 00 00");                // the next reply is the PING's
        // CANCEL_WAIT racing STOP_WAITING: the key is written before the cancel arrives; the
        // client reads 0x00 then 0x01 (what PyTorch's client expects, wire §1.4).
        co_await b.send_hex("06 01 00x7 02 00x7 2f 79   0d 03 00 00 00");
        CHECK(co_await b.read_hex(4) == "03 00 00 00");
        co_await exchange(a, "01 02 00x7 2f 79 01 00x7 31   07", "05 00x7");  // /y is written
        co_await b.send_hex("0c");
        CHECK(co_await b.read_hex(2) == "00 01");
        // The same race within one segment: WAIT, the write, CANCEL_WAIT.
        co_await exchange(b, "06 01 00x7 02 00x7 2f 7a   01 02 00x7 2f 7a 00x8   0c", "00 01");
        // APPEND=9, MULTI_SET=11, MULTI_GET=10, DELETE_KEY=8, LIST_KEYS=17.
        co_await exchange(b, "09 03 00x7 2f 6b 31 01 00x7 21", "");
        co_await exchange(b, "0b 01 00x7 02 00x7 2f 6d 01 00x7 6d", "");
        co_await exchange(b, "0a 02 00x7 03 00x7 2f 6b 31 02 00x7 2f 6d", "03 00x7 76 32 21 01 00x7 6d");
        co_await exchange(b, "08 02 00x7 2f 6d", "01 00x7");
        auto lister = co_await raw_client::connect(f.port());
        co_await exchange(lister,
                          "00 ce f7 85 3c  01 02 00x7 2f 71 00x8  08 03 00x7 2f 6b 31  "
                          "08 04 00x7 2f 63 6e 74  08 02 00x7 2f 77 08 02 00x7 2f 78  "
                          "08 02 00x7 2f 79  08 02 00x7 2f 7a",
                          "01 00x7 01 00x7 01 00x7 01 00x7 01 00x7 01 00x7");
        co_await exchange(lister, "11", "01 00x7 02 00x7 2f 71");
    }());
    CHECK(f.logs.empty());
}

TEST_CASE("store: make_room_for raises the connection and memory limits for a large job, never lowers them") {
    const elastic::store_server_options defaults;
    elastic::store_server_options small;
    small.make_room_for(300);  // a 100-node rendezvous: the defaults already fit
    CHECK(small.max_connections == defaults.max_connections);
    CHECK(small.max_memory == defaults.max_memory);

    elastic::store_server_options large;
    large.make_room_for(30000);  // a 10,000-node rendezvous: three connections per agent
    CHECK(large.max_connections >= 2 * 30000);
    CHECK(large.max_memory == defaults.max_memory);  // 16 KiB per connection fits in the default

    elastic::store_server_options huge;
    huge.make_room_for(300000);  // 100,000 nodes
    CHECK(huge.max_connections >= 2 * 300000);
    CHECK(huge.max_memory > defaults.max_memory);
    CHECK(huge.max_memory >= huge.max_connections * 16 * 1024);

    elastic::store_server_options set_by_hand;
    set_by_hand.max_connections = 1000000;
    set_by_hand.max_memory = std::size_t{64} << 30;
    set_by_hand.make_room_for(30000);
    CHECK(set_by_hand.max_connections == 1000000);
    CHECK(set_by_hand.max_memory == std::size_t{64} << 30);

    elastic::store_server_options absurd;  // a count no job has must not wrap around to a small limit
    absurd.make_room_for(std::numeric_limits<std::size_t>::max());
    CHECK(absurd.max_connections > std::size_t{1} << 40);
    CHECK(absurd.max_memory > absurd.max_connections);
}

TEST_CASE("store: a connection gives back the buffers of a large request and its reply") {
    // Kept, the capacity of the largest message each connection ever carried would add up over
    // a long job: a different member completes each round and reads every member's information.
    fixture f;
    std::size_t baseline = 0;
    std::size_t buffered = 0;
    f.run([&]() -> asio::awaitable<void> {
        elastic::store_client_options o;
        o.port = f.port();
        o.dialect = elastic::client_dialect::current;
        elastic::tcp_store_client client(co_await asio::this_coro::executor, o);
        std::vector<std::string> keys{"big"};
        CHECK_FALSE(co_await client.check(keys));
        baseline = f.server->memory() - f.server->engine().bytes();
        const std::string big(512 * 1024, 'x');
        co_await client.set("big", big);
        CHECK((co_await client.get("big")).size() == big.size());
        // One more request: its reply comes once the server has written the large one.
        CHECK(co_await client.check(keys));
        buffered = f.server->memory() - f.server->engine().bytes();
    }());
    CHECK(baseline <= 2 * elastic::detail::store::retained_buffer + 4096);
    CHECK(buffered <= 2 * elastic::detail::store::retained_buffer + 4096);
}

TEST_CASE("store: an unknown legacy opcode closes only its connection") {
    check_rejected(unhex("0d 00x8"), "unknown opcode 0x0d in the legacy");
}

TEST_CASE("store: an unknown current opcode closes only its connection") {
    check_rejected(unhex("00 ce f7 85 3c  13"), "unknown opcode 0x13 in the current");
}

TEST_CASE("store: ADD on a non-numeric value closes only its connection") {
    check_rejected(unhex("00 02 00x7 2f 79 03 00x7 79 65 73   03 02 00x7 2f 79 01 00x7"),
                   "is not a decimal 64-bit integer");
}

TEST_CASE("store: a key beyond the limit closes only its connection") {
    elastic::store_server_options o;
    o.limits.max_key_size = 1024;
    check_rejected(unhex("00 01 04 00 00 00 00 00 00") + std::string(1025, 'k'), "max_key_size", std::move(o));
}

TEST_CASE("store: a value beyond the limit closes only its connection") {
    elastic::store_server_options o;
    o.limits.max_value_size = 1024;
    check_rejected(unhex("00 01 00x7 6b 01 04 00 00 00 00 00 00"), "max_value_size", std::move(o));
}

TEST_CASE("store: too many keys in one request close only its connection") {
    check_rejected(unhex("05 ff ff ff ff ff ff ff ff"), "max_keys_per_request");
}

TEST_CASE("store: a 2.x handshake read as legacy SET closes only its connection") {
    // A VALIDATE with a wrong magic makes the connection legacy: 0x00 is SET and the next bytes
    // are a huge key length (what a 1.13 server did to new clients, wire §1.6).
    check_rejected(unhex("00 ce f7 85 3d 0d 01 02 03 04"), "max_key_size");
}

TEST_CASE("store: an unsupported operation closes only its connection") {
    check_rejected(unhex("00 ce f7 85 3c  0e 01 00x7 71 01 00x7 76"), "QUEUE_PUSH is not supported");
}

TEST_CASE("store: a connection beyond max_connections is closed, the others carry on") {
    elastic::store_server_options o;
    o.max_connections = 3;  // waiter, bad, setter
    fixture f(std::move(o));
    f.run([&]() -> asio::awaitable<void> {
        auto w = co_await blocked_waiter(f.port());
        auto second = co_await raw_client::connect(f.port());
        co_await exchange(second, "06", "00x8");
        auto setter = co_await raw_client::connect(f.port());
        co_await exchange(setter, "06", "00x8");
        auto extra = co_await raw_client::connect(f.port());
        CHECK(co_await extra.closed_by_peer());
        co_await exchange(setter, "00 05 00x7 2f 6c 61 74 65 01 00x7 31", "");
        CHECK(co_await w.read_hex(1) == "00");
    }());
    CHECK(f.logged("max_connections"));
    CHECK(f.logged("refusing connection from 127.0.0.1:"));
}

TEST_CASE("store: accept_peer refuses a peer before reading from it, the accepted ones are served") {
    std::vector<std::string> asked;
    bool refuse = true;
    elastic::store_server_options o;
    o.accept_peer = [&](const asio::ip::address& a) {
        asked.push_back(a.to_string());
        return !(refuse && a == asio::ip::make_address("127.0.0.1"));
    };
    fixture f(std::move(o));
    f.run([&]() -> asio::awaitable<void> {
        // Refused: closed at once, its request never answered (PING in the legacy dialect).
        auto refused = co_await raw_client::connect(f.port());
        CHECK(co_await refused.closed_by_peer());
        // Accepted once the predicate says so: served as usual.
        refuse = false;
        auto accepted = co_await raw_client::connect(f.port());
        co_await exchange(accepted, "06", "00x8");
    }());
    CHECK(asked == std::vector<std::string>{"127.0.0.1", "127.0.0.1"});
    CHECK(f.logged("refusing connection from 127.0.0.1:"));
    CHECK(f.logged("store_server_options::accept_peer"));
}

TEST_CASE("store: 2000 connections blocked in WAIT are all answered by one SET") {
    constexpr int n = 2000;
    fixture f;
    f.run([&]() -> asio::awaitable<void> {
        std::vector<raw_client> clients;
        clients.reserve(n);
        for (int i = 0; i < n; ++i) {
            clients.push_back(co_await raw_client::connect(f.port()));
            // Half speak each dialect; each WAITs for "/go" and proves registration.
            if (i % 2 == 0) co_await clients.back().send_hex("05 01 00x7 03 00x7 2f 67 6f   06");
            else co_await clients.back().send_hex("00 ce f7 85 3c   06 01 00x7 03 00x7 2f 67 6f   07");
            co_await clients.back().read(8);
        }
        CHECK(f.server->connections() == static_cast<std::size_t>(n));
        auto setter = co_await raw_client::connect(f.port());
        co_await exchange(setter, "00 03 00x7 2f 67 6f 01 00x7 31", "");
        int answered = 0;
        for (auto& c : clients)
            if (co_await c.read_hex(1) == "00") ++answered;
        CHECK(answered == n);
    }());
}

TEST_CASE("store: PyTorch 1.13's Python TCPStore client against our server") {
    const char* script = R"PY(
import datetime, sys
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 1, False, datetime.timedelta(seconds=60))
def p(*a): print(*a, flush=True)
s.set("k1", "v1")
p("get", s.get("k1"))
p("add", s.add("cnt", 5), s.add("cnt", -2))
p("cas-match", s.compare_set("k1", "v1", "v2"))
p("cas-mismatch", s.compare_set("k1", "zz", "v3"))
p("cas-absent-empty", s.compare_set("newkey", "", "n1"))
p("cas-absent-expected", s.compare_set("absent2", "x", "y"))
p("num_keys", s.num_keys())
s.set("bin", b"\x00\x01\xff")
p("bin", s.get("bin"))
s.wait(["k1", "cnt"])
p("wait-existing")
s.wait(["late"])
p("wait-late", s.get("late"))
p("delete", s.delete_key("k1"), s.delete_key("nokey"))
p("num_keys", s.num_keys())
try:
    s.wait(["never"], datetime.timedelta(milliseconds=300))
    p("no-timeout")
except RuntimeError as e:
    p("timeout", e)
)PY";
    elastic::store_server_options o;
    fixture* self = nullptr;
    bool late_set = false;
    // When the client's WAIT for "/late" is registered, write "/late": the push must answer it.
    o.on_request = [&](elastic::wire::op op) {
        if (op != elastic::wire::op::wait || late_set) return;
        auto& engine = self->server->engine();
        if (engine.awaited_keys() != 1 || engine.find("/k1") == nullptr) return;
        late_set = true;
        asio::post(self->ctx, [&engine] { engine.set("/late", std::string_view("L8")); });
    };
    fixture f(std::move(o));
    self = &f;
    std::pair<std::string, int> result;
    f.run([&]() -> asio::awaitable<void> {
        auto child = store_support::spawn({ELASTIC_TORCH_PYTHON, "-c", script, std::to_string(f.port())});
        result = co_await store_support::collect(child);
    }());
    INFO("python output:\n", result.first);
    CHECK(WIFEXITED(result.second));
    CHECK(WEXITSTATUS(result.second) == 0);
    const std::string expected_start = "get b'v1'\n"
                                       "add 5 3\n"
                                       "cas-match b'v2'\n"
                                       "cas-mismatch b'v2'\n"
                                       "cas-absent-empty b'n1'\n"
                                       "cas-absent-expected b'x'\n"
                                       "num_keys 4\n"
                                       "bin b'\\x00\\x01\\xff'\n"
                                       "wait-existing\n"
                                       "wait-late b'L8'\n"
                                       "delete True False\n"
                                       "num_keys 5\n"
                                       "timeout ";
    CHECK(result.first.substr(0, expected_start.size()) == expected_start);
    CHECK(late_set);
    auto& engine = f.server->engine();
    REQUIRE(engine.find("/cnt") != nullptr);
    CHECK(*engine.find("/cnt") == "3");
    REQUIRE(engine.find("init/") != nullptr);
    CHECK(*engine.find("init/") == "1");
    CHECK(engine.find("/absent2") == nullptr);
}

TEST_CASE("store: a server with 100 idle connections uses no CPU") {
    auto child = store_support::spawn({ELASTIC_TEST_PROGRAM_DIR "/store-server"});
    std::string line;
    char ch = 0;
    while (::read(child.out_fd, &ch, 1) == 1 && ch != '\n') line += ch;
    REQUIRE_FALSE(line.empty());
    const auto port = static_cast<std::uint16_t>(std::stoi(line));
    asio::io_context ctx;
    std::vector<asio::ip::tcp::socket> idle;
    for (int i = 0; i < 100; ++i) {
        idle.emplace_back(ctx);
        idle.back().connect({asio::ip::make_address("127.0.0.1"), port});
    }
    // A round trip on the last connection: the server has accepted all of them (in order) and
    // every connection coroutine sits in its read.
    asio::write(idle.back(), asio::buffer(unhex("06")));
    std::string reply(8, '\0');
    asio::read(idle.back(), asio::buffer(reply));
    CHECK(reply == unhex("00x8"));
    const auto before = idle_cpu::cpu_time(child.pid);
    // The measurement window itself: nothing to wait for, the point is that nothing happens.
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const auto after = idle_cpu::cpu_time(child.pid);
    REQUIRE(before.count() >= 0);
    INFO("the server's CPU in the 2 s window: ", idle_cpu::ms(after - before), " ms");
    CHECK(after - before <= idle_cpu::budget);
    const int status = store_support::terminate(child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("store: server binding errors name the address and the remedy") {
    asio::io_context ctx;
    elastic::store_server_options o;
    o.host = "127.0.0.1";
    elastic::tcp_store_server first(ctx.get_executor(), o);
    CHECK(first.port() != 0);
    o.port = first.port();
    try {
        elastic::tcp_store_server second(ctx.get_executor(), o);
        FAIL("a second server bound the same port");
    } catch (const elastic::store_error& e) {
        const std::string what = e.what();
        CHECK(what.find(fmt::format("127.0.0.1:{}", o.port)) != std::string::npos);
        CHECK(what.find("0 picks a free one") != std::string::npos);
    }
}

TEST_CASE("store: a server destroyed with a client blocked in WAIT closes it and leaks nothing") {
    asio::io_context ctx;
    std::optional<elastic::tcp_store_server> server;
    elastic::store_server_options o;
    o.host = "127.0.0.1";
    server.emplace(ctx.get_executor(), o);
    server->start();
    const auto port = server->port();
    store_support::run(ctx, [&]() -> asio::awaitable<void> {
        auto w = co_await blocked_waiter(port);
        CHECK(server->connections() == 1);
        server.reset();  // the connection coroutines outlive the object, not its state
        CHECK(co_await w.closed_by_peer());
    }());
    CHECK_FALSE(server.has_value());
}

TEST_CASE("store: cancelling run() stops the server and closes its connections") {
    asio::io_context ctx;
    elastic::store_server_options o;
    o.host = "127.0.0.1";
    elastic::tcp_store_server server(ctx.get_executor(), o);
    asio::cancellation_signal cancel;
    bool run_returned = false;
    asio::co_spawn(ctx, server.run(), asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) {
                       run_returned = true;
                       CHECK_FALSE(e);
                   }));
    store_support::run(ctx, [&]() -> asio::awaitable<void> {
        auto w = co_await blocked_waiter(server.port());
        cancel.emit(asio::cancellation_type::terminal);
        CHECK(co_await w.closed_by_peer());
    }());
    CHECK(run_returned);
    CHECK(server.connections() == 0);
}

TEST_CASE("store: the hosting agent shares the server's keys and waiters in process") {
    fixture f;
    elastic::memory_store local(f.server->engine());
    f.run([&]() -> asio::awaitable<void> {
        co_await local.set("/from_agent", "A");
        auto c = co_await raw_client::connect(f.port());
        co_await exchange(c, "02 0b 00x7 2f 66 72 6f 6d 5f 61 67 65 6e 74", "01 00x7 41");
        // The in-process wait is woken by a TCP client's SET; the SET's GETNUMKEYS reply comes
        // after it ran.
        auto writer = [&]() -> asio::awaitable<void> {
            co_await exchange(c, "00 05 00x7 2f 6c 61 74 65 02 00x7 6f 6b   06", "02 00x7");
        };
        auto reader = [&]() -> asio::awaitable<std::string> { co_return co_await local.get("/late"); };
        using namespace asio::experimental::awaitable_operators;
        const std::string got = co_await (reader() && writer());
        CHECK(got == "ok");
    }());
}
