// Interoperability with Debian's PyTorch 1.13: our client against PyTorch's own TCPStore server
// (dialect detected), Python and libtorch clients sharing our server with ours, and two gloo
// workers whose init_process_group uses our server as the agent store.
#include <elastic/store/client.hpp>
#include <elastic/store/server.hpp>

#include <doctest/doctest.h>

#include "client_support.hpp"
#include "store_support.hpp"

#include <asio/io_context.hpp>

#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <vector>

namespace test_store_client_torch {

using namespace std::chrono_literals;
using elastic::client_dialect;
using elastic::store_client_options;
using elastic::tcp_store_client;

// Key lists built outside co_await expressions (g++ 12 rejects braced lists of strings there).
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

// A Python TCPStore client of 127.0.0.1:port running `body` (store object `s`).
std::string python_client(std::uint16_t port, const std::string& body) {
    return fmt::format("import datetime\n"
                       "import torch.distributed as d\n"
                       "s = d.TCPStore('127.0.0.1', {}, None, False, datetime.timedelta(seconds=60), "
                       "wait_for_workers=False)\n"
                       "{}",
                       port, body);
}

TEST_CASE("store_client: every operation against PyTorch 1.13's own TCPStore server") {
    asio::io_context ctx;
    auto server = client_support::torch_server::start(ctx);
    store_client_options o;
    o.port = server.port;
    tcp_store_client c(ctx.get_executor(), o);  // client_dialect::detect
    tcp_store_client other(ctx.get_executor(), o);

    store_support::run(ctx, [&]() -> asio::awaitable<void> {
        co_await c.set("k1", "v1");
        CHECK(co_await c.get("k1") == "v1");
        const std::string binary("\x00\x01\xff", 3);
        co_await c.set("bin", binary);
        CHECK(co_await c.get("bin") == binary);
        CHECK(co_await c.add("cnt", 5) == 5);
        CHECK(co_await c.add("cnt", -2) == 3);
        CHECK(co_await c.compare_set("k1", "v1", "v2") == "v2");
        CHECK(co_await c.compare_set("k1", "zz", "v3") == "v2");
        CHECK(co_await c.compare_set("newkey", "", "n1") == "n1");
        CHECK(co_await c.compare_set("absent2", "x", "y") == "x");
        CHECK(co_await c.check(ks("k1", "cnt")));
        CHECK_FALSE(co_await c.check(ks("k1", "absent2")));
        co_await c.wait(ks("k1", "newkey"));
        CHECK(co_await c.num_keys() == 4);  // k1, bin, cnt, newkey (no init/: no world size)
        CHECK(co_await c.delete_key("k1"));
        CHECK_FALSE(co_await c.delete_key("k1"));
        CHECK(co_await c.num_keys() == 3);
        // 1.13 has no MULTI_*: the legacy dialect pipelines SETs and GETs instead.
        co_await c.multi_set(ks("m1", "m2"), ks("a", "b"));
        CHECK(co_await c.multi_get(ks("m2", "m1")) == ks("b", "a"));
        // A wait that times out: 1.13 cannot cancel it, so the client reconnects; the stale
        // registration then dies with the old connection instead of answering a later request.
        std::string message;
        try {
            co_await c.wait(ks("later"), 50ms);
        } catch (const elastic::store_timeout& e) {
            message = e.what();
        }
        CHECK(message.find("key '/later' not set within 50 ms") != std::string::npos);
        co_await other.set("later", "now");
        CHECK(co_await c.get("later") == "now");
        CHECK(co_await c.add("cnt", 1) == 4);
        // get waits for its key first: 1.13 drops a connection that GETs a missing key.
        c.set_timeout(30ms);
        const auto missing = co_await error_of([&]() -> asio::awaitable<void> { (void)co_await c.get("missing"); });
        CHECK(missing.find("key '/missing' not set within 30 ms") != std::string::npos);
        c.set_timeout(60s);
        // APPEND does not exist in 1.13: the server drops the connection, we say why.
        const auto append = co_await error_of([&]() -> asio::awaitable<void> { co_await c.append("log", "x"); });
        CHECK(append.find("closed the connection during APPEND '/log'") != std::string::npos);
        CHECK(co_await c.get("cnt") == "4");
    }());
    CHECK(c.dialect() == elastic::wire::dialect::legacy);
    CHECK(other.dialect() == elastic::wire::dialect::legacy);

    // What we wrote is what PyTorch's own client reads.
    const auto [out, code] = client_support::python(
        ctx, python_client(server.port, "print(s.get('bin').hex(), s.get('cnt').decode(), "
                                        "s.get('newkey').decode(), s.get('m1').decode(), flush=True)\n"));
    CHECK(code == 0);
    CHECK(out == "0001ff 4 n1 a\n");
    const auto [rest, status] = server.stop(ctx);
    CHECK(client_support::exit_code(status) == 0);
}

TEST_CASE("store_client: the current dialect forced against PyTorch 1.13 names the remedy") {
    asio::io_context ctx;
    auto server = client_support::torch_server::start(ctx);
    store_client_options o;
    o.port = server.port;
    o.dialect = client_dialect::current;
    o.connect_timeout = 300ms;
    o.detect_timeout = 100ms;
    tcp_store_client c(ctx.get_executor(), o);
    const auto message = store_support::run(ctx,
                                            error_of([&]() -> asio::awaitable<void> { co_await c.set("k", "v"); }));
    CHECK(message.find(fmt::format("cannot connect to the store at 127.0.0.1:{}", server.port)) != std::string::npos);
    CHECK(message.find("use client_dialect::detect or legacy") != std::string::npos);
    // The server survived the handshakes it could not parse.
    const auto [out, code] = client_support::python(ctx,
                                                    python_client(server.port,
                                                                  "s.set('a', 'b'); print(s.get('a').decode())\n"));
    CHECK(code == 0);
    CHECK(out == "b\n");
    server.stop(ctx);
}

TEST_CASE("store_client: Python, libtorch and our client share our server") {
    asio::io_context ctx;
    elastic::store_server_options so;
    so.host = "127.0.0.1";
    elastic::tcp_store_server server(ctx.get_executor(), so);
    server.start();
    store_client_options o;
    o.port = server.port();
    tcp_store_client c(ctx.get_executor(), o);

    std::string py_out;
    int py_status = -1;
    store_support::run(ctx, [&]() -> asio::awaitable<void> {
        // Python sets a key and then waits for ours; we read its key and then set ours.
        auto py = client_support::spawn({ELASTIC_TORCH_PYTHON, "-c",
                                         python_client(server.port(),
                                                       "s.set('py_key', 'from python')\n"
                                                       "print('cpp_key =', s.get('cpp_key').decode(), flush=True)\n"
                                                       "print('cnt =', s.add('cnt', 10), flush=True)\n")});
        CHECK(co_await c.get("py_key") == "from python");
        co_await c.set("cpp_key", "from c++");
        std::tie(py_out, py_status) = co_await store_support::collect(py.output());
        CHECK(co_await c.get("cnt") == "10");

#ifdef ELASTIC_TEST_LIBTORCH_CLIENT
        // libtorch reads both, writes its own, and blocks in get until we set "later".
        auto lt = client_support::spawn({ELASTIC_TEST_LIBTORCH_CLIENT,
                                         std::to_string(server.port()),
                                         "get",
                                         "py_key",
                                         "get",
                                         "cpp_key",
                                         "add",
                                         "cnt",
                                         "5",
                                         "compare_set",
                                         "cas",
                                         "",
                                         "created",
                                         "compare_set",
                                         "cas",
                                         "wrong",
                                         "other",
                                         "check",
                                         "cas",
                                         "check",
                                         "nope",
                                         "num_keys",
                                         "delete",
                                         "cas",
                                         "set",
                                         "lt_key",
                                         "from libtorch",
                                         "get",
                                         "later"});
        CHECK(co_await c.get("lt_key") == "from libtorch");
        co_await c.set("later", "set by elastic");
        const auto [lt_out, lt_status] = co_await store_support::collect(lt.output());
        CHECK(client_support::exit_code(lt_status) == 0);
        CHECK(lt_out == "get py_key = from python\n"
                        "get cpp_key = from c++\n"
                        "add cnt = 15\n"
                        "compare_set cas = created\n"
                        "compare_set cas = created\n"
                        "check cas = 1\n"
                        "check nope = 0\n"
                        "num_keys = 4\n"  // py_key, cpp_key, cnt, cas
                        "delete cas = 1\n"
                        "set lt_key\n"
                        "get later = set by elastic\n");
        CHECK(co_await c.get("cnt") == "15");
        CHECK_FALSE(co_await c.check(ks("cas")));
#endif
        server.stop();
    }());
    CHECK(client_support::exit_code(py_status) == 0);
    CHECK(py_out == "cpp_key = from c++\ncnt = 10\n");
}

TEST_CASE("store_client: two PyTorch gloo workers init_process_group on our server") {
    asio::io_context ctx;
    elastic::store_server_options so;
    so.host = "127.0.0.1";
    elastic::tcp_store_server server(ctx.get_executor(), so);
    server.start();
    const std::string script = "import datetime, torch, torch.distributed as dist\n"
                               "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=120))\n"
                               "t = torch.tensor([float(dist.get_rank() + 1)])\n"
                               "dist.all_reduce(t)\n"
                               "print('rank', dist.get_rank(), 'of', dist.get_world_size(), 'sum', t.item(), "
                               "flush=True)\n"
                               "dist.barrier()\n"
                               "dist.destroy_process_group()\n";
    std::vector<std::pair<std::string, int>> results;
    store_support::run(ctx, [&]() -> asio::awaitable<void> {
        std::vector<client_support::child> workers;
        for (int rank = 0; rank < 2; ++rank)
            workers.push_back(client_support::spawn({ELASTIC_TORCH_PYTHON, "-c", script},
                                                    {{"RANK", std::to_string(rank)},
                                                     {"LOCAL_RANK", std::to_string(rank)},
                                                     {"WORLD_SIZE", "2"},
                                                     {"LOCAL_WORLD_SIZE", "2"},
                                                     {"MASTER_ADDR", "127.0.0.1"},
                                                     {"MASTER_PORT", std::to_string(server.port())},
                                                     {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                     {"TORCHELASTIC_RESTART_COUNT", "0"},
                                                     {"GLOO_SOCKET_IFNAME", "lo"}}));
        for (auto& w : workers) results.push_back(co_await store_support::collect(w.output()));
        server.stop();
    }());
    REQUIRE(results.size() == 2);
    for (int rank = 0; rank < 2; ++rank) {
        const auto& out = results[static_cast<std::size_t>(rank)].first;
        const int status = results[static_cast<std::size_t>(rank)].second;
        CAPTURE(out);
        CHECK(client_support::exit_code(status) == 0);
        CHECK(out.find(fmt::format("rank {} of 2 sum 3.0\n", rank)) != std::string::npos);
    }
    // The workers used the agent's store, under PyTorch 1.13's per-attempt prefix.
    bool attempt_keys = false;
    server.engine().for_each([&](std::string_view key, std::string_view) {
        if (key.find("/worker/attempt_0/") != std::string_view::npos) attempt_keys = true;
    });
    CHECK(attempt_keys);
}

}  // namespace test_store_client_torch
