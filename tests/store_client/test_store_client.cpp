// The TCP store client against our server: every operation in each dialect, waits answered by
// another client and timeouts that keep the connection usable, connect retries, a vanished
// server named in the error, the blocking facade against a server in another process.
#include <elastic/store/blocking_client.hpp>
#include <elastic/store/client.hpp>
#include <elastic/store/server.hpp>

#include <doctest/doctest.h>

#include "client_support.hpp"
#include "spawn_support.hpp"
#include "store_support.hpp"

#include <asio/co_spawn.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <chrono>
#include <csignal>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <sys/wait.h>

namespace test_store_client {

using namespace std::chrono_literals;
using elastic::client_dialect;
using elastic::store_client_options;
using elastic::tcp_store_client;

static_assert(elastic::store<tcp_store_client>);
static_assert(elastic::multi_key_store<tcp_store_client>);

// A server of ours on 127.0.0.1:0 in this process.
struct fixture {
    explicit fixture(elastic::store_server_options options = {}) {
        options.host = "127.0.0.1";
        options.log = [this](std::string_view line) { logs.emplace_back(line); };
        server.emplace(ctx.get_executor(), std::move(options));
        server->start();
    }

    store_client_options client_options(client_dialect d = client_dialect::detect) const {
        store_client_options o;
        o.host = "127.0.0.1";
        o.port = server->port();
        o.dialect = d;
        return o;
    }

    // Runs the test body; stops the server when it ends so the loop runs dry.
    void run(asio::awaitable<void> body) {
        std::exception_ptr error;
        asio::co_spawn(ctx, std::move(body), [&](std::exception_ptr e) {
            error = e;
            if (server) server->stop();
        });
        ctx.run();
        if (error) std::rethrow_exception(error);
    }

    asio::io_context ctx;
    std::optional<elastic::tcp_store_server> server;
    std::vector<std::string> logs;
};

// Key lists built outside co_await expressions: g++ 12 rejects a braced list of strings in the
// full-expression of a co_await ("array used as initializer").
template <class... A>
std::vector<std::string> ks(A... a) {
    return {std::string(a)...};
}

template <class F>
asio::awaitable<std::string> error_of(F f) {
    try {
        co_await f();
    } catch (const elastic::store_error& e) {
        co_return std::string(e.what());
    }
    co_return std::string("no error");
}

asio::awaitable<void> every_operation(tcp_store_client& c) {
    co_await c.set("k1", "v1");
    CHECK(co_await c.get("k1") == "v1");
    const std::string binary("\x00\x01\xff", 3);
    co_await c.set("bin", binary);
    CHECK(co_await c.get("bin") == binary);
    co_await c.set("empty", "");
    CHECK(co_await c.get("empty") == "");

    CHECK(co_await c.add("cnt", 5) == 5);
    CHECK(co_await c.add("cnt", -2) == 3);
    CHECK(co_await c.get("cnt") == "3");

    CHECK(co_await c.compare_set("k1", "v1", "v2") == "v2");    // match: replaced
    CHECK(co_await c.compare_set("k1", "zz", "v3") == "v2");    // mismatch: current
    CHECK(co_await c.compare_set("newkey", "", "n1") == "n1");  // absent, "": created
    CHECK(co_await c.compare_set("absent2", "x", "y") == "x");  // absent: expected back
    CHECK(co_await c.get("k1") == "v2");
    CHECK(co_await c.get("newkey") == "n1");
    CHECK_FALSE(co_await c.check(ks("absent2")));

    CHECK(co_await c.check(ks("k1", "cnt")));
    CHECK_FALSE(co_await c.check(ks("k1", "nope")));
    CHECK(co_await c.check({}));
    co_await c.wait(ks("k1", "cnt"));
    co_await c.wait({});

    // k1, bin, empty, cnt, newkey
    CHECK(co_await c.num_keys() == 5);
    CHECK(co_await c.delete_key("k1"));
    CHECK_FALSE(co_await c.delete_key("k1"));
    CHECK(co_await c.num_keys() == 4);

    co_await c.multi_set(ks("m1", "m2", "m3"), ks("a", "", std::string("\0b", 2)));
    const auto got = co_await c.multi_get(ks("m3", "m1", "m2"));
    CHECK(got == std::vector<std::string>{std::string("\0b", 2), "a", ""});
    CHECK((co_await c.multi_get({})).empty());
    CHECK(co_await error_of([&]() -> asio::awaitable<void> { co_await c.multi_set(ks("a", "b"), ks("1")); }) ==
          "multi_set needs as many values as keys, got 2 keys and 1 values");

    co_await c.append("log", "ab");
    co_await c.append("log", "cd");
    CHECK(co_await c.get("log") == "abcd");

    const std::string big(3 * 1024 * 1024 + 7, 'z');
    co_await c.set("big", big);
    CHECK(co_await c.get("big") == big);
}

TEST_CASE("store_client: every operation against our server, in each dialect") {
    for (const auto d : {client_dialect::current, client_dialect::legacy, client_dialect::detect}) {
        CAPTURE(static_cast<int>(d));
        fixture f;
        tcp_store_client c(f.ctx.get_executor(), f.client_options(d));
        f.run([&]() -> asio::awaitable<void> {
            co_await every_operation(c);
            // The client's "/" prefix is PyTorch's: the server holds "/k" for the key "k".
            CHECK(f.server->engine().find("/cnt") != nullptr);
            CHECK(f.server->engine().find("cnt") == nullptr);
        }());
        // detect settles on the current dialect against a server that speaks it.
        CHECK(c.dialect() ==
              (d == client_dialect::legacy ? elastic::wire::dialect::legacy : elastic::wire::dialect::current));
    }
}

TEST_CASE("store_client: an empty key prefix gives raw wire keys") {
    fixture f;
    auto o = f.client_options();
    o.key_prefix = "";
    tcp_store_client c(f.ctx.get_executor(), o);
    f.run([&]() -> asio::awaitable<void> {
        co_await c.set("raw", "1");
        CHECK(co_await c.get("raw") == "1");  // a reply: the server has run the SET too
        CHECK(f.server->engine().find("raw") != nullptr);
    }());
}

TEST_CASE("store_client: a wait is answered by another client's writes") {
    for (const auto d : {client_dialect::current, client_dialect::legacy}) {
        fixture f;
        tcp_store_client waiter(f.ctx.get_executor(), f.client_options(d));
        tcp_store_client writer(f.ctx.get_executor(), f.client_options(d));
        bool waited = false;
        std::string got;
        f.run([&]() -> asio::awaitable<void> {
            using namespace asio::experimental::awaitable_operators;
            // Both run side by side; whatever order the server sees, the wait ends when the
            // last of its keys exists and the get returns the written value.
            auto waiting = [&]() -> asio::awaitable<void> {
                co_await waiter.wait(ks("a", "b"));
                waited = true;
                got = co_await waiter.get("late");
            };
            auto writing = [&]() -> asio::awaitable<void> {
                co_await writer.set("a", "1");
                co_await writer.add("b", 1);
                co_await writer.set("late", "here");
            };
            co_await (waiting() && writing());
        }());
        CHECK(waited);
        CHECK(got == "here");
    }
}

TEST_CASE("store_client: a wait timeout is store_timeout and the connection stays usable") {
    for (const auto d : {client_dialect::current, client_dialect::legacy}) {
        CAPTURE(static_cast<int>(d));
        fixture f;
        tcp_store_client c(f.ctx.get_executor(), f.client_options(d));
        tcp_store_client other(f.ctx.get_executor(), f.client_options(d));
        f.run([&]() -> asio::awaitable<void> {
            co_await c.set("x", "1");
            std::string message;
            try {
                co_await c.wait(ks("x", "never"), 50ms);
            } catch (const elastic::store_timeout& e) {
                message = e.what();
            }
            CHECK(message.find("keys '/x', '/never' not set within 50 ms") != std::string::npos);
            CHECK(message.find(c.address()) != std::string::npos);
            // The stale wait must not answer a later request: writing "never" now and then
            // using the connection reads only the replies of the new requests.
            co_await other.set("never", "now");
            CHECK(co_await c.add("n", 1) == 1);
            CHECK(co_await c.get("never") == "now");
            CHECK(co_await c.compare_set("x", "1", "2") == "2");

            // get's own wait has the same deadline: timeout() (set_timeout changes it).
            c.set_timeout(30ms);
            std::string get_message;
            try {
                (void)co_await c.get("absent");
            } catch (const elastic::store_timeout& e) {
                get_message = e.what();
            }
            CHECK(get_message.find("get on the store at") != std::string::npos);
            CHECK(get_message.find("key '/absent' not set within 30 ms") != std::string::npos);
            CHECK(co_await c.get("x") == "2");
        }());
    }
}

TEST_CASE("store_client: concurrent operations on one client queue up in order") {
    fixture f;
    tcp_store_client c(f.ctx.get_executor(), f.client_options());
    std::vector<std::int64_t> results;
    spawn_support::spawn_errors errors;
    f.run([&]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        int done = 0;
        asio::steady_timer all_done(ex, asio::steady_timer::time_point::max());
        for (int i = 0; i < 100; ++i)
            asio::co_spawn(
                ex, [&]() -> asio::awaitable<void> { results.push_back(co_await c.add("counter", 1)); },
                errors.handler([&] {
                    if (++done == 100) all_done.cancel();  // a throw counts too: it fails the test, not hangs it
                }));
        co_await all_done.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        CHECK(co_await c.get("counter") == "100");
    }());
    errors.check();
    REQUIRE(results.size() == 100);
    for (std::size_t i = 0; i < results.size(); ++i) CHECK(results[i] == static_cast<std::int64_t>(i + 1));
}

TEST_CASE("store_client: connect retries with backoff until the server appears") {
    asio::io_context ctx;
    const auto port = client_support::unused_port(ctx);
    std::optional<elastic::tcp_store_server> server;
    std::vector<elastic::store_connect_attempt> attempts;
    store_client_options o;
    o.port = port;
    o.initial_backoff = 1ms;
    o.on_retry = [&](const elastic::store_connect_attempt& a) {
        attempts.push_back(a);
        // The first refusal starts the server the retry will find.
        if (!server) {
            elastic::store_server_options so;
            so.host = "127.0.0.1";
            so.port = port;
            server.emplace(ctx.get_executor(), so);
            server->start();
        }
    };
    tcp_store_client c(ctx.get_executor(), o);
    store_support::run(ctx, [&]() -> asio::awaitable<void> {
        co_await c.set("k", "v");
        CHECK(co_await c.get("k") == "v");
        server->stop();
    }());
    REQUIRE(attempts.size() == 1);
    CHECK(attempts[0].attempt == 1);
    CHECK(attempts[0].error == asio::error::connection_refused);
    CHECK(attempts[0].delay <= o.initial_backoff);
}

TEST_CASE("store_client: no server is a store_error naming host, port and the remedy") {
    asio::io_context ctx;
    store_client_options o;
    o.port = client_support::unused_port(ctx);
    o.connect_timeout = 100ms;
    o.initial_backoff = 5ms;
    int retries = 0;
    o.on_retry = [&](const elastic::store_connect_attempt& a) {
        CHECK(a.attempt == ++retries);
        CHECK(a.delay <= o.max_backoff);
    };
    tcp_store_client c(ctx.get_executor(), o);
    const auto message = store_support::run(ctx,
                                            error_of([&]() -> asio::awaitable<void> { co_await c.set("k", "v"); }));
    CHECK(message.find(fmt::format("cannot connect to the store at 127.0.0.1:{}", o.port)) != std::string::npos);
    CHECK(message.find("Connection refused") != std::string::npos);
    CHECK(message.find("MASTER_ADDR/MASTER_PORT") != std::string::npos);
    CHECK(retries >= 1);
}

TEST_CASE("store_client: a server that stops during a wait is a store_error, not a hang") {
    std::optional<fixture> holder;
    elastic::store_server_options so;
    fixture* fp = nullptr;
    so.on_request = [&](elastic::wire::op o) {
        // Stop once the WAIT is registered (posted: not from inside the server's own loop).
        if (o == elastic::wire::op::wait) asio::post(fp->ctx, [fp] { fp->server->stop(); });
    };
    holder.emplace(so);
    auto& f = *holder;
    fp = &f;
    auto o = f.client_options();
    o.connect_timeout = 100ms;
    tcp_store_client c(f.ctx.get_executor(), o);
    f.run([&]() -> asio::awaitable<void> {
        co_await c.set("k", "v");
        const auto during = co_await error_of([&]() -> asio::awaitable<void> { co_await c.wait(ks("never"), 1h); });
        CHECK(during.find(fmt::format("the store at {} closed the connection during WAIT '/never'", c.address())) !=
              std::string::npos);
        // The next operation reconnects, finds nobody and says where it looked.
        const auto after = co_await error_of([&]() -> asio::awaitable<void> { (void)co_await c.num_keys(); });
        CHECK(after.find(fmt::format("cannot connect to the store at {}", c.address())) != std::string::npos);
    }());
}

TEST_CASE("store_client: close() during a wait ends it with a store_error, and the next call reconnects") {
    std::optional<fixture> holder;
    elastic::store_server_options so;
    tcp_store_client* cp = nullptr;
    int waits = 0;
    so.on_request = [&](elastic::wire::op o) {
        // Once the first WAIT is registered, the client's owner closes it (from another
        // coroutine of the same loop: posted, not from inside the server's handler).
        if (o == elastic::wire::op::wait && ++waits == 1) asio::post(holder->ctx, [&] { cp->close(); });
    };
    holder.emplace(so);
    auto& f = *holder;
    tcp_store_client c(f.ctx.get_executor(), f.client_options());
    cp = &c;
    f.run([&]() -> asio::awaitable<void> {
        co_await c.set("k", "v");
        const auto during = co_await error_of([&]() -> asio::awaitable<void> { co_await c.wait(ks("never"), 1h); });
        CHECK(during.find(fmt::format("the store at {}: WAIT '/never' ended: this client was closed", c.address())) !=
              std::string::npos);
        co_await c.set("never", "now");
        co_await c.wait(ks("never"), 1h);
        CHECK(co_await c.get("k") == "v");
    }());
    CHECK(waits == 3);  // the first, the second, and get's own WAIT before its GET
}

TEST_CASE("store_client: close() while connecting ends the call at once, with no retry and no dialect guessed") {
    // A listener that accepts and never answers: the client is connected, in its handshake (it
    // detects the dialect), when its owner closes it.
    asio::io_context ctx;
    asio::ip::tcp::acceptor silent(ctx, {asio::ip::make_address("127.0.0.1"), 0});
    asio::ip::tcp::socket accepted(ctx);
    store_client_options o;
    o.port = silent.local_endpoint().port();
    int retries = 0;
    o.on_retry = [&](const elastic::store_connect_attempt&) { ++retries; };
    tcp_store_client c(ctx.get_executor(), o);
    silent.async_accept(accepted, [&](std::error_code ec) {
        CHECK_FALSE(ec);
        c.close();
    });
    const auto message = store_support::run(ctx, error_of([&]() -> asio::awaitable<void> { co_await c.connect(); }));
    CHECK(message.find(fmt::format("the store at {}: connect ended: this client was closed", c.address())) !=
          std::string::npos);
    CHECK(retries == 0);
    CHECK_FALSE(c.dialect().has_value());  // an abort is no answer of a PyTorch 1.13 server
}

TEST_CASE("store_client: ADD on a non-numeric value fails and the next call reconnects") {
    fixture f;
    tcp_store_client c(f.ctx.get_executor(), f.client_options());
    f.run([&]() -> asio::awaitable<void> {
        co_await c.set("word", "yes");
        const auto message = co_await error_of([&]() -> asio::awaitable<void> { (void)co_await c.add("word", 1); });
        CHECK(message.find("closed the connection during ADD '/word'") != std::string::npos);
        CHECK(co_await c.get("word") == "yes");
        CHECK(co_await c.add("num", 2) == 2);
    }());
}

TEST_CASE("store_client: blocking facade against the store-server program") {
    asio::io_context ctx;
    auto server = store_support::spawn({ELASTIC_TEST_PROGRAM_DIR "/store-server"});
    std::string rest;
    const auto port = static_cast<std::uint16_t>(
        std::stoi(store_support::run(ctx, client_support::first_line(server.out_fd, rest))));

    store_client_options o;
    o.port = port;
    elastic::blocking_store_client a(o);
    elastic::blocking_store_client b(o);
    a.set("k", "v");
    CHECK(b.get("k") == "v");
    CHECK(a.add("n", 40) == 40);
    CHECK(b.add("n", 2) == 42);
    CHECK(a.compare_set("k", "v", "w") == "w");
    CHECK(b.check({"k", "n"}));
    CHECK_FALSE(b.check({"nothing"}));
    b.multi_set({"x", "y"}, {"1", "2"});
    CHECK(a.multi_get({"y", "x"}) == std::vector<std::string>{"2", "1"});
    CHECK(a.num_keys() == 4);
    CHECK(a.delete_key("x"));
    CHECK(b.dialect() == elastic::wire::dialect::current);
    CHECK_THROWS_AS(a.wait({"absent"}, 20ms), elastic::store_timeout);
    a.set("absent", "now");
    b.wait({"absent"});
    CHECK(a.get("absent") == "now");

    // The server process dies: the next reply never comes, and the error names the address.
    ::kill(server.pid, SIGKILL);
    int status = 0;
    ::waitpid(server.pid, &status, 0);
    ::close(server.out_fd);
    std::string message;
    try {
        (void)b.get("k");
    } catch (const elastic::store_error& e) {
        message = e.what();
    }
    CHECK(message.find(fmt::format("127.0.0.1:{}", port)) != std::string::npos);
}

}  // namespace test_store_client
