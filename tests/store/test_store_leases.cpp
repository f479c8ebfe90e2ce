// Leases in the TCP store: a killed holder (a real child process) and a silent one lose their
// lease and wake the observer of the epoch by push; a heartbeating holder keeps its lease; a
// PyTorch 1.13 client meets the namespace as documented; malformed lease requests close only
// their connection; the client notices a killed and a stopped server.
// test-tags: concurrent
#include <elastic/store/client.hpp>
#include <elastic/store/lease.hpp>
#include <elastic/store/prefix_store.hpp>
#include <elastic/store/server.hpp>

#include <doctest/doctest.h>

#include "store_support.hpp"

#include <asio/co_spawn.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/read_until.hpp>
#include <asio/steady_timer.hpp>
#include <asio/streambuf.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace test_store_leases {

using namespace std::chrono_literals;
using store_support::raw_client;
using store_support::unhex;

// A server on 127.0.0.1:0 in this process with small lease settings, its log captured.
struct fixture : store_support::server_fixture {
    fixture(std::chrono::milliseconds interval, unsigned misses, elastic::store_server_options options = {})
        : server_fixture(with_lease(std::move(options), interval, misses)) {}

    static elastic::store_server_options with_lease(elastic::store_server_options options,
                                                    std::chrono::milliseconds interval, unsigned misses) {
        options.lease_heartbeat_interval = interval;
        options.lease_missed_heartbeats = misses;
        return options;
    }

    std::optional<std::string> value(std::string_view wire_key) {
        const auto* v = server->engine().find(wire_key);
        return v ? std::optional<std::string>(*v) : std::nullopt;
    }

    elastic::store_client_options client_options(std::chrono::milliseconds interval = 50ms,
                                                 unsigned misses = 20) const {
        elastic::store_client_options o;
        o.host = "127.0.0.1";
        o.port = port();
        o.lease_heartbeat_interval = interval;
        o.lease_missed_heartbeats = misses;
        return o;
    }
};

// A child process whose stdout lines are read on the loop.
class child_process {
public:
    child_process(asio::io_context& ctx, const std::vector<std::string>& args)
        : child_(store_support::spawn(args)), out_(ctx, child_.out_fd) {}

    child_process(const child_process&) = delete;
    child_process& operator=(const child_process&) = delete;

    ~child_process() {
        if (!reaped_) {
            ::kill(child_.pid, SIGKILL);
            (void)wait_status();
        }
    }

    pid_t pid() const { return child_.pid; }

    // The next line of its stdout, without the newline; empty at EOF.
    asio::awaitable<std::string> line() {
        const auto [ec, n] = co_await asio::async_read_until(out_, buf_, '\n',
                                                             asio::experimental::as_tuple(asio::use_awaitable));
        if (ec && n == 0) co_return std::string{};
        std::string l(asio::buffers_begin(buf_.data()),
                      asio::buffers_begin(buf_.data()) + static_cast<std::ptrdiff_t>(n));
        buf_.consume(n);
        if (!l.empty() && l.back() == '\n') l.pop_back();
        co_return l;
    }

    void signal(int sig) const { ::kill(child_.pid, sig); }

    // Reaps it (blocking: call after the child was killed or has exited).
    int wait_status() {
        int status = 0;
        ::waitpid(child_.pid, &status, 0);
        reaped_ = true;
        return status;
    }

private:
    store_support::child child_;
    asio::posix::stream_descriptor out_;
    asio::streambuf buf_;
    bool reaped_ = false;
};

// The store server program (tests/programs/store_server.cpp).
inline std::vector<std::string> server_args() {
    return std::vector<std::string>(1, ELASTIC_TEST_PROGRAM_DIR "/store-server");
}

// The store server program in a child process: its port.
asio::awaitable<std::uint16_t> server_port(child_process& server) {
    const auto l = co_await server.line();
    REQUIRE_FALSE(l.empty());
    co_return static_cast<std::uint16_t>(std::stoi(l));
}

TEST_CASE("store: lease keys are <group>/__lease__/<name>, the parser finds the marker") {
    CHECK(elastic::lease_key("", "n1") == "__lease__/n1");
    CHECK(elastic::lease_key("job", "n1") == "job/__lease__/n1");
    CHECK(elastic::lease_key("job/", "n1") == "job/__lease__/n1");
    CHECK(elastic::lease_epoch_key("job") == "job/__lease__/__epoch");
    CHECK(elastic::lease_lost_key("job", 7) == "job/__lease__/__lost/7");
    const auto p = elastic::parse_lease_key("/job/__lease__/n1");
    REQUIRE(p);
    CHECK(p->space == "/job/__lease__/");
    CHECK(p->name == "n1");
    CHECK_FALSE(p->reserved());
    CHECK(elastic::parse_lease_key("/job/__lease__/__epoch")->reserved());
    CHECK(elastic::parse_lease_key("__lease__/x")->name == "x");
    // Only a whole segment marks a lease: "my__lease__/x" is an ordinary key.
    CHECK_FALSE(elastic::parse_lease_key("/my__lease__/x"));
    CHECK_FALSE(elastic::parse_lease_key("/job/lease/x"));
    CHECK(elastic::parse_lease_key("/a/__lease__/")->name.empty());
}

TEST_CASE("store: a killed lease holder loses its lease at once and wakes the epoch's observer") {
    // A heartbeat deadline of an hour: the loss below can only come from the closed connection.
    fixture f(std::chrono::hours(1), 1);
    const auto key = elastic::lease_key("job", "node1");
    std::string lost_name;
    std::string holder_exit;
    // Built outside the coroutine: g++ 12 rejects string-literal initializer lists inside one.
    const std::vector<std::string> args{std::string(ELASTIC_TEST_PROGRAM_DIR "/store-lease-holder"),
                                        std::to_string(f.port()), key, std::string("10.0.0.1:29400"),
                                        std::string("50")};
    const std::vector<std::string> keys(1, key);
    f.run([&]() -> asio::awaitable<void> {
        child_process holder(f.ctx, args);
        CHECK(co_await holder.line() == "held");
        CHECK(f.server->leases() == 1);
        CHECK(f.value("/" + key) == "10.0.0.1:29400");

        // The observer: reads the epoch, then ONE wait for the next loss's key.
        elastic::tcp_store_client observer(f.ctx.get_executor(), f.client_options());
        const auto epoch = std::stoll(co_await observer.get(elastic::lease_epoch_key("job")));
        CHECK(epoch == 0);
        holder.signal(SIGKILL);
        lost_name = co_await observer.get(elastic::lease_lost_key("job", epoch + 1));
        CHECK(co_await observer.get(elastic::lease_epoch_key("job")) == "1");
        CHECK(co_await observer.get(elastic::lease_silent_key("job")) == "0");  // it closed: no silence
        CHECK_FALSE(co_await observer.check(keys));
        holder_exit = co_await holder.line();  // EOF: the holder printed nothing more
        const int status = holder.wait_status();
        CHECK(WIFSIGNALED(status));
    }());
    CHECK(lost_name == "node1");
    CHECK(holder_exit.empty());
    CHECK(f.server->leases() == 0);
    CHECK(f.server->leases_lost() == 1);
    CHECK(f.logged("lease '/job/__lease__/node1' of 127.0.0.1:"));
    CHECK(f.logged("lost: the connection closed"));
}

TEST_CASE("store: a silent lease holder loses its lease after the missed heartbeats") {
    fixture f(50ms, 3);
    bool closed = false;
    std::string lost;
    f.run([&]() -> asio::awaitable<void> {
        // A legacy SET of "/g/__lease__/quiet" = "x", then nothing: no heartbeat ever.
        auto quiet = co_await raw_client::connect(f.port());
        co_await quiet.send_hex("00 12 00x7 2f 67 2f 5f 5f 6c 65 61 73 65 5f 5f 2f 71 75 69 65 74"
                                " 01 00x7 78");
        elastic::tcp_store_client observer(f.ctx.get_executor(), f.client_options());
        lost = co_await observer.get(elastic::lease_lost_key("g", 1));
        CHECK(co_await observer.get(elastic::lease_epoch_key("g")) == "1");
        CHECK(co_await observer.get(elastic::lease_silent_key("g")) == "1");
        closed = co_await quiet.closed_by_peer();
    }());
    CHECK(lost == "quiet");
    CHECK(f.logged("lost (silent): silent for"));
    CHECK(closed);
    CHECK_FALSE(f.value("/g/__lease__/quiet"));
    CHECK(f.logged("silent for"));
    CHECK(f.logged("3 missed heartbeats of 50 ms"));
    CHECK(f.logged("lease '/g/__lease__/quiet' of 127.0.0.1:"));
}

TEST_CASE("store: a holder that closes its connection while the server does not run is lost silently") {
    // A store host stopped past the keep-alive: its holders give up on its silence and close
    // their connections, which it reads only when it runs again, its deadlines for them overdue.
    // Their losses are silent (they may be alive), not deaths. Two holders: one closes with
    // nothing unread, one after a heartbeat it sent during the stall, which is read first.
    // A deadline of 16 x 250 ms (4 s, ample for the setup on a busy machine), a stall of 5 s:
    // only the stall can end these leases.
    fixture f(250ms, 16);
    std::string silent;
    std::string epoch;
    f.run([&]() -> asio::awaitable<void> {
        auto first = co_await raw_client::connect(f.port());
        auto second = co_await raw_client::connect(f.port());
        // Legacy SETs of "/g/__lease__/one" and "/g/__lease__/two" = "x".
        co_await first.send_hex("00 10 00x7 2f 67 2f 5f 5f 6c 65 61 73 65 5f 5f 2f 6f 6e 65 01 00x7 78");
        co_await second.send_hex("00 10 00x7 2f 67 2f 5f 5f 6c 65 61 73 65 5f 5f 2f 74 77 6f 01 00x7 78");
        elastic::tcp_store_client observer(f.ctx.get_executor(), f.client_options());
        std::vector<std::string> held{elastic::lease_key("g", "one"), elastic::lease_key("g", "two")};
        co_await observer.wait(std::move(held), std::chrono::seconds(60));
        // The loop does not run for 5 s; meanwhile the first holder closes, and the second
        // sends a CHECK of no keys (legacy op 4), then closes.
        asio::post(f.ctx, [&] {
            first.close();
            second.send_hex_now("04 00x8");
            second.close();
            std::this_thread::sleep_for(std::chrono::seconds(5));
        });
        (void)co_await observer.get(elastic::lease_lost_key("g", 2));
        epoch = co_await observer.get(elastic::lease_epoch_key("g"));
        silent = co_await observer.get(elastic::lease_silent_key("g"));
    }());
    std::size_t stalled = 0;
    for (const auto& line : f.logs) {
        if (line.find("lost (silent): the connection closed while the server did not run") != std::string::npos)
            ++stalled;
    }
    CHECK(stalled == 2);
    CHECK_FALSE(f.logged("silent for"));
    CHECK(epoch == "2");
    CHECK(silent == "2");
    CHECK(f.server->leases_lost() == 2);
}

TEST_CASE("store: a heartbeating client keeps its lease across many intervals") {
    using namespace asio::experimental::awaitable_operators;
    // Deadline 20 x 50 ms. Each PING the server hears is counted; the test waits for 100 of
    // them from two holders (50 intervals at least: two and a half deadlines), while a silent
    // holder on the same server is lost meanwhile: the lease timers run, and the heartbeats
    // keep the leases. The second holder sets its lease through prefix_store's plain `set`
    // (code written against the `store` concept): the client keeps it alive all the same.
    int pings = 0;
    asio::steady_timer* enough = nullptr;
    elastic::store_server_options o;
    o.on_request = [&](elastic::wire::op op) {
        if (op == elastic::wire::op::ping && ++pings == 100 && enough) enough->cancel();
    };
    fixture f(50ms, 20, std::move(o));
    std::string lost;
    f.run([&]() -> asio::awaitable<void> {
        asio::steady_timer timer(f.ctx, asio::steady_timer::time_point::max());
        enough = &timer;
        elastic::tcp_store_client holder(f.ctx.get_executor(), f.client_options(50ms, 20));
        co_await holder.hold_lease(elastic::lease_key("g", "alive"), "1");
        elastic::tcp_store_client setter(f.ctx.get_executor(), f.client_options(50ms, 20));
        elastic::prefix_store<elastic::tcp_store_client> job("g", setter);
        co_await job.set(elastic::lease_key("", "via-set"), "2");
        auto quiet = co_await raw_client::connect(f.port());
        co_await quiet.send_hex("00 13 00x7 2f 67 2f 5f 5f 6c 65 61 73 65 5f 5f 2f 73 69 6c 65 6e"
                                " 74 01 00x7 78");
        elastic::tcp_store_client observer(f.ctx.get_executor(), f.client_options());
        const auto wait_pings = [&]() -> asio::awaitable<void> {
            if (pings >= 100) co_return;
            co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        };
        lost = co_await (observer.get(elastic::lease_lost_key("g", 1)) && wait_pings());
        CHECK(pings >= 100);
        CHECK(holder.leases() == std::vector<std::string>{"g/__lease__/alive"});
        CHECK(setter.leases() == std::vector<std::string>{"g/__lease__/via-set"});
        CHECK(co_await observer.get(elastic::lease_key("g", "alive")) == "1");
        CHECK(co_await observer.get(elastic::lease_key("g", "via-set")) == "2");
        CHECK(co_await observer.get(elastic::lease_epoch_key("g")) == "1");
        enough = nullptr;
        holder.close();
        setter.close();
    }());
    CHECK(lost == "silent");
    CHECK_FALSE(f.logged("lease '/g/__lease__/alive' of 127.0.0.1:"));
}

TEST_CASE("store: CAS binds a lease, DELETE releases it without a loss, another connection cannot take it") {
    fixture f(std::chrono::hours(1), 1);
    f.run([&]() -> asio::awaitable<void> {
        auto o = f.client_options();
        elastic::tcp_store_client a(f.ctx.get_executor(), o);
        elastic::tcp_store_client b(f.ctx.get_executor(), o);
        const auto slot = elastic::lease_key("r", "slot0");
        // CAS creates the key: a lease of a; b's CAS loses and binds nothing.
        CHECK(co_await a.compare_set(slot, "", "a") == "a");
        CHECK(co_await b.compare_set(slot, "", "b") == "a");
        CHECK(f.server->leases() == 1);
        // DELETE releases: no loss is counted, the epoch stays 0.
        CHECK(co_await a.release_lease(slot));
        CHECK(f.server->leases() == 0);
        CHECK(co_await a.get(elastic::lease_epoch_key("r")) == "0");
        // b holds "n1". A SET, COMPARE_SET, MULTI_SET or DELETE_KEY of it from any other live
        // connection is refused: the server closes that connection, and b keeps its lease.
        const auto n1 = elastic::lease_key("r", "n1");
        co_await b.hold_lease(n1, "b");
        const auto attack = [&](auto write) -> asio::awaitable<void> {
            elastic::tcp_store_client x(f.ctx.get_executor(), o);
            bool refused = false;
            try {
                co_await write(x);
                (void)co_await x.get("/anything");  // a SET has no reply: the next request sees the close
            } catch (const elastic::store_error& e) {
                refused = true;
                MESSAGE("refused as expected: " << std::string(e.what()));
            }
            CHECK(refused);
            CHECK(co_await a.get(n1) == "b");
            CHECK(f.server->leases() == 1);
        };
        co_await attack([&](elastic::tcp_store_client& x) { return x.set(n1, "x"); });
        co_await attack([&](elastic::tcp_store_client& x) { return x.hold_lease(n1, "x"); });
        co_await attack([&](elastic::tcp_store_client& x) -> asio::awaitable<void> {
            (void)co_await x.compare_set(n1, "b", "x");
        });
        co_await attack([&](elastic::tcp_store_client& x) -> asio::awaitable<void> {
            std::vector<std::string> keys{"/r/other", n1};
            std::vector<std::string> values{"1", "x"};
            co_await x.multi_set(std::move(keys), std::move(values));
        });
        co_await attack([&](elastic::tcp_store_client& x) -> asio::awaitable<void> {
            (void)co_await x.delete_key(n1);
        });
        // None of the refused connections held a lease: no loss so far.
        CHECK(co_await a.get(elastic::lease_epoch_key("r")) == "0");
        // The holder itself may write its lease again.
        co_await b.set(n1, "b2");
        CHECK(co_await a.get(n1) == "b2");
        // Then b is lost: one loss, named under __lost/1.
        b.close();
        CHECK(co_await a.get(elastic::lease_lost_key("r", 1)) == "n1");
        // Several losses: the epoch tells how many, one multi_get names them.
        elastic::tcp_store_client c(f.ctx.get_executor(), o);
        elastic::tcp_store_client d(f.ctx.get_executor(), o);
        co_await c.hold_lease(elastic::lease_key("r", "c"), "1");
        co_await d.hold_lease(elastic::lease_key("r", "d"), "1");
        c.close();
        d.close();
        std::vector<std::string> last(1, elastic::lease_lost_key("r", 3));
        co_await a.wait(last);
        CHECK(co_await a.get(elastic::lease_epoch_key("r")) == "3");
        std::vector<std::string> both;
        both.push_back(elastic::lease_lost_key("r", 2));
        both.push_back(elastic::lease_lost_key("r", 3));
        auto names = co_await a.multi_get(both);
        std::sort(names.begin(), names.end());
        CHECK(names == std::vector<std::string>{"c", "d"});
    }());
    // The log line names both peers.
    CHECK(f.logged("SET of lease '/r/__lease__/n1', which the connection from 127.0.0.1:"));
    CHECK(f.logged("MULTI_SET of lease '/r/__lease__/n1'"));
    CHECK(f.logged("COMPARE_SET of lease '/r/__lease__/n1'"));
    CHECK(f.logged("DELETE_KEY of lease '/r/__lease__/n1'"));
    CHECK_FALSE(f.logged("moves from"));
    CHECK(f.server->leases_lost() == 3);
}

TEST_CASE("store: hold_lease refuses a key outside the lease namespace") {
    fixture f(1s, 5);
    const std::vector<std::string> bad_keys{std::string("plain"), std::string("g/__lease__/"),
                                            std::string("g/__lease__/__epoch"), std::string("g/__lease__/__lost/1"),
                                            std::string("my__lease__/x")};
    f.run([&]() -> asio::awaitable<void> {
        elastic::tcp_store_client c(f.ctx.get_executor(), f.client_options());
        for (const auto& bad : bad_keys) {
            bool refused = false;
            try {
                co_await c.hold_lease(bad, "v");
            } catch (const elastic::store_error& e) {
                refused = std::string_view(e.what()).find("not a lease key") != std::string_view::npos;
            }
            INFO(bad);
            CHECK(refused);
        }
        CHECK(c.leases().empty());
    }());
}

// A malformed lease request: logged, closes only its connection; a client blocked in WAIT and
// a lease holder on other connections carry on.
void check_malformed(const std::string& bad_bytes, std::string_view reason) {
    fixture f(std::chrono::hours(1), 1);
    f.run([&]() -> asio::awaitable<void> {
        elastic::tcp_store_client holder(f.ctx.get_executor(), f.client_options());
        co_await holder.hold_lease(elastic::lease_key("g", "h"), "1");
        auto w = co_await raw_client::connect(f.port());
        co_await w.send_hex("05 01 00x7 05 00x7 2f 6c 61 74 65   06");  // WAIT ["/late"], NUMKEYS
        co_await w.read(8);
        auto bad = co_await raw_client::connect(f.port());
        co_await bad.send(bad_bytes);
        CHECK(co_await bad.closed_by_peer());
        co_await holder.set("late", "1");
        CHECK(co_await w.read_hex(1) == "00");
        CHECK(co_await holder.get(elastic::lease_key("g", "h")) == "1");
    }());
    INFO(fmt::format("{}", fmt::join(f.logs, "\n")));
    CHECK(f.logged("malformed lease request"));
    CHECK(f.logged(reason));
    CHECK(f.server->leases_lost() == 0);
}

TEST_CASE("store: malformed lease requests close only their connection") {
    const auto key = [](std::string_view k) {
        std::string out;
        elastic::wire::put_bytes(out, k);
        return out;
    };
    // Legacy opcodes: SET 0, ADD 3, DELETE_KEY 8, APPEND 9, MULTI_SET 11.
    const auto op = [](char byte) { return std::string(1, byte); };
    // SET of a lease key with no name.
    check_malformed(op(0) + key("/g/__lease__/") + key("v"), "names no lease");
    // SET and ADD of the server's own names.
    check_malformed(op(0) + key("/g/__lease__/__epoch") + key("5"), "a name the server keeps");
    check_malformed(op(3) + key("/g/__lease__/__epoch") + unhex("01 00x7"), "ADD of '/g/__lease__/__epoch'");
    // DELETE of a lost-lease record.
    check_malformed(op(8) + key("/g/__lease__/__lost/1"), "DELETE_KEY of '/g/__lease__/__lost/1'");
    // APPEND to a lease.
    check_malformed(op(9) + key("/g/__lease__/h") + key("more"), "APPEND of lease key");
    // MULTI_SET with one refused key refuses the whole request.
    check_malformed(op(11) + unhex("02 00x7") + key("/ok") + key("1") + key("/g/__lease__/__epoch") + key("9"),
                    "MULTI_SET of '/g/__lease__/__epoch'");
}

TEST_CASE("store: PyTorch 1.13 clients: ordinary keys unaffected, a lease key is a lease") {
    const char* script = R"PY(
import datetime, sys
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 1, False, datetime.timedelta(seconds=60))
def p(*a): print(*a, flush=True)
s.set("plain", "1")
p("plain", s.get("plain"), s.add("cnt", 2))
s.set("grp/__lease__/py", "here")
p("lease", s.get("grp/__lease__/py"), s.get("grp/__lease__/__epoch"))
try:
    s.add("grp/__lease__/__epoch", 1)
    p("add-accepted")
except RuntimeError as e:
    p("add-refused")
)PY";
    fixture f(std::chrono::hours(1), 1);
    std::pair<std::string, int> result;
    std::string lost;
    const std::vector<std::string> args{std::string(ELASTIC_TORCH_PYTHON), std::string("-c"), std::string(script),
                                        std::to_string(f.port())};
    f.run([&]() -> asio::awaitable<void> {
        elastic::tcp_store_client observer(f.ctx.get_executor(), f.client_options());
        auto child = store_support::spawn(args);
        // The refused ADD closes the Python client's connection: its lease is lost then.
        lost = co_await observer.get(elastic::lease_lost_key("grp", 1));
        result = co_await store_support::collect(child);
    }());
    INFO("python output:\n", result.first);
    CHECK(WIFEXITED(result.second));
    CHECK(result.first == "plain b'1' 2\nlease b'here' b'0'\nadd-refused\n");
    CHECK(lost == "py");
    CHECK(f.value("/plain") == "1");
    CHECK(f.value("/cnt") == "2");
    CHECK_FALSE(f.value("/grp/__lease__/py"));
    CHECK(f.logged("malformed lease request: ADD of '/grp/__lease__/__epoch'"));
}

TEST_CASE("store: the client notices a killed server through connection_lost()") {
    asio::io_context ctx;
    std::optional<elastic::store_connection_loss> loss;
    int status = 0;
    store_support::run(ctx, [&]() -> asio::awaitable<void> {
        child_process server(ctx, server_args());
        elastic::store_client_options o;
        o.port = co_await server_port(server);
        o.lease_heartbeat_interval = 50ms;
        o.lease_missed_heartbeats = 3;
        elastic::tcp_store_client client(ctx.get_executor(), o);
        co_await client.hold_lease(elastic::lease_key("job", "me"), "1");
        server.signal(SIGKILL);
        loss = co_await client.connection_lost();
        status = server.wait_status();
        CHECK(client.leases().empty());
    }());
    REQUIRE(loss);
    INFO(loss->reason);
    CHECK(loss->reason.find("closed the connection") != std::string::npos);
    CHECK(loss->leases == std::vector<std::string>{"job/__lease__/me"});
    CHECK(WIFSIGNALED(status));
}

/// What a lease holder saw when its server (a child process) was SIGSTOPped after `before`
/// and then `op` ran: the error `op` ended with ("timeout: ..." for a store_timeout, "" for
/// none) and the connection's loss. Heartbeats every 50 ms, 3 missed: a deadline of 150 ms;
/// `timeout` bounds every request.
struct stopped_server_outcome {
    std::string error;
    std::optional<elastic::store_connection_loss> loss;
};

template <class Before, class Op>
stopped_server_outcome with_stopped_server(std::chrono::milliseconds timeout, Before before, Op op) {
    asio::io_context ctx;
    stopped_server_outcome out;
    store_support::run(ctx, [&]() -> asio::awaitable<void> {
        child_process server(ctx, server_args());
        elastic::store_client_options o;
        o.port = co_await server_port(server);
        o.lease_heartbeat_interval = 50ms;
        o.lease_missed_heartbeats = 3;
        o.timeout = timeout;
        elastic::tcp_store_client client(ctx.get_executor(), o);
        co_await client.hold_lease(elastic::lease_key("job", "me"), "1");
        co_await before(client);
        server.signal(SIGSTOP);
        try {
            co_await op(client);
        } catch (const elastic::store_timeout& e) {
            out.error = std::string("timeout: ") + e.what();
        } catch (const elastic::store_error& e) {
            out.error = e.what();
        }
        out.loss = co_await client.connection_lost();
        server.signal(SIGKILL);  // a stopped process dies of SIGKILL too
        (void)server.wait_status();
    }());
    return out;
}

asio::awaitable<void> nothing_first(elastic::tcp_store_client&) { co_return; }

TEST_CASE("store: the client notices a stopped (silent) server through connection_lost()") {
    const auto out = with_stopped_server(300s, nothing_first, nothing_first);  // idle: the heartbeats tell
    CHECK(out.error.empty());
    REQUIRE(out.loss);
    INFO(out.loss->reason);
    CHECK(out.loss->reason.find("did not answer a heartbeat within 150 ms (3 missed heartbeats of "
                                "50 ms)") != std::string::npos);
    CHECK(out.loss->leases == std::vector<std::string>{"job/__lease__/me"});
}

TEST_CASE("store: a server stopped past its lease deadline keeps the leases whose holders spoke meanwhile, and "
          "the holder keeps its connection") {
    // The server drops a lease after 5 x 200 ms of silence; the holder waits 10 s for a
    // heartbeat reply. The server is stopped for 2 s (the fault's length, not a wait for an
    // event): the holder's heartbeats wait in the server's socket, and the server's lease
    // deadline is long past when it runs again. The silence was the server's, not the holder's:
    // what waits unread is read before an overdue deadline is judged.
    asio::io_context ctx;
    bool held = false;
    std::string epoch;
    store_support::run(ctx, [&]() -> asio::awaitable<void> {
        auto args = server_args();
        for (const char* a : {"--lease-heartbeat-ms", "200", "--lease-missed", "5"}) args.emplace_back(a);
        child_process server(ctx, args);
        elastic::store_client_options o;
        o.port = co_await server_port(server);
        o.lease_heartbeat_interval = 200ms;
        o.lease_missed_heartbeats = 50;
        elastic::tcp_store_client holder(ctx.get_executor(), o);
        co_await holder.hold_lease(elastic::lease_key("job", "me"), "1");
        server.signal(SIGSTOP);
        asio::steady_timer stopped(ctx, std::chrono::seconds(2));
        co_await stopped.async_wait(asio::use_awaitable);
        server.signal(SIGCONT);
        // A new client's first reply comes after the server ran its overdue deadlines.
        elastic::tcp_store_client observer(ctx.get_executor(), o);
        std::vector<std::string> lease{elastic::lease_key("job", "me")};
        held = co_await observer.check(std::move(lease));
        epoch = co_await observer.get(elastic::lease_epoch_key("job"));
        // The holder's connection lives (a closed one would have cleared its leases).
        CHECK(co_await holder.add("n", 1) == 1);
        CHECK(holder.leases().size() == 1);
        server.signal(SIGTERM);
        (void)server.wait_status();
    }());
    CHECK(held);
    CHECK(epoch == "0");
}

TEST_CASE("store: a server whose own process stalled past the lease deadline drops no lease, the holder in the "
          "same process included") {
    // The store's host agent holds its lease on its own server, in its own process: when that
    // process is stopped neither side runs, and on waking the server's lease timer is long
    // overdue with nothing heard. The loop is blocked for 1 s (the stall's length) against a
    // 3 x 50 ms deadline; the silence was the process's, not the holder's.
    fixture f(50ms, 3);
    std::size_t held = 0;
    f.run([&]() -> asio::awaitable<void> {
        elastic::tcp_store_client holder(f.ctx.get_executor(), f.client_options(50ms, 3));
        co_await holder.hold_lease(elastic::lease_key("job", "host"), "1");
        // Blocked while nothing is in flight; on waking, every overdue timer (the server's lease
        // deadline among them) runs before any read.
        asio::post(f.ctx, [] { std::this_thread::sleep_for(std::chrono::seconds(1)); });
        asio::steady_timer after(f.ctx, std::chrono::milliseconds(1));
        co_await after.async_wait(asio::use_awaitable);
        CHECK(co_await holder.add("n", 1) == 1);
        CHECK(co_await holder.add("n", 1) == 2);
        held = holder.leases().size();
    }());
    CHECK(held == 1);
    CHECK(f.server->leases_lost() == 0);
    CHECK_FALSE(f.logged("silent for"));
    CHECK(f.logged("the store did not run for"));
}

TEST_CASE("store: a client whose own process stalled past an operation's deadline, with the server in that "
          "process, takes the reply") {
    // The store's host agent is a client of its own server. The request goes out, then the
    // process is blocked for 1 s (the stall's length) against a 200 ms deadline: on waking, the
    // server reads the request and replies, and only then is the client's overdue deadline
    // handled. The delay was the process's own: the reply is taken, not reported as a timeout.
    fixture f(50ms, 3);
    std::int64_t added = 0;
    f.run([&]() -> asio::awaitable<void> {
        auto o = f.client_options();
        o.timeout = 200ms;
        elastic::tcp_store_client client(f.ctx.get_executor(), o);
        CHECK(co_await client.add("n", 1) == 1);  // connected
        // Runs after the request was written (a write is tried at once when it starts).
        asio::post(f.ctx, [] { std::this_thread::sleep_for(std::chrono::seconds(1)); });
        added = co_await client.add("n", 1);
    }());
    CHECK(added == 2);
}

TEST_CASE("store: a lease holder blocked in a long WAIT keeps its lease (heartbeat CHECKs)") {
    // Deadline 4 x 50 ms; the holder waits on its own connection for a key that is written
    // only after the server has heard 20 heartbeat CHECKs during the wait; then a wait that
    // times out with CHECKs in flight leaves the connection in step.
    int checks = 0;
    fixture* self = nullptr;
    elastic::store_server_options o;
    o.on_request = [&](elastic::wire::op op) {
        if (op == elastic::wire::op::check && ++checks == 20)
            asio::post(self->ctx, [self] { self->server->engine().set("/late", std::string_view("L8")); });
    };
    fixture f(50ms, 4, std::move(o));
    self = &f;
    bool timed_out = false;
    f.run([&]() -> asio::awaitable<void> {
        elastic::tcp_store_client holder(f.ctx.get_executor(), f.client_options(50ms, 4));
        co_await holder.hold_lease(elastic::lease_key("g", "waiter"), "1");
        CHECK(co_await holder.get("late") == "L8");
        CHECK(checks >= 20);
        const std::vector<std::string> never(1, "never");
        try {
            co_await holder.wait(never, std::chrono::milliseconds(300));
        } catch (const elastic::store_timeout&) {
            timed_out = true;
        }
        // Still in step, still holding: the next replies are this request's own.
        CHECK(co_await holder.get(elastic::lease_key("g", "waiter")) == "1");
        CHECK(co_await holder.add("n", 5) == 5);
        CHECK(holder.leases().size() == 1);
    }());
    CHECK(timed_out);
    CHECK(f.server->leases_lost() == 0);
    CHECK_FALSE(f.logged("silent for"));
}

TEST_CASE("store: a wait on a stopped server fails as a silent server, not after its timeout") {
    const auto out = with_stopped_server(300s, nothing_first,
                                         [](elastic::tcp_store_client& c) -> asio::awaitable<void> {
                                             const std::vector<std::string> never(1, "never");
                                             co_await c.wait(never);
                                         });
    INFO(out.error);
    CHECK(out.error.find("wait of key '/never': the store at") == 0);
    CHECK(out.error.find("did not answer a heartbeat within 150 ms") != std::string::npos);
    REQUIRE(out.loss);
    CHECK(out.loss->reason.find("did not answer a heartbeat") != std::string::npos);
}

TEST_CASE("store: a request on a stopped server fails as a silent server, not after its timeout") {
    // The request keeps the connection busy, so no heartbeat is sent while it runs: the
    // server's silence during the request is what tells.
    const auto out = with_stopped_server(
        std::chrono::hours(1),
        [](elastic::tcp_store_client& c) -> asio::awaitable<void> { CHECK(co_await c.add("n", 1) == 1); },
        [](elastic::tcp_store_client& c) -> asio::awaitable<void> { (void)co_await c.add("n", 1); });
    INFO(out.error);
    CHECK(out.error.find("ADD '/n': the store at") == 0);
    CHECK(out.error.find("said nothing within 150 ms (3 missed heartbeats of 50 ms)") != std::string::npos);
    REQUIRE(out.loss);
    CHECK(out.loss->reason.find("said nothing within 150 ms") != std::string::npos);
    CHECK(out.loss->leases == std::vector<std::string>{"job/__lease__/me"});
}

TEST_CASE("store: a timed-out wait whose CANCEL_WAIT a stopped server leaves unanswered fails as a silent server") {
    // The wait ends before its first heartbeat CHECK is due, so only the CANCEL_WAIT can tell.
    const auto out = with_stopped_server(std::chrono::hours(1), nothing_first,
                                         [](elastic::tcp_store_client& c) -> asio::awaitable<void> {
                                             const std::vector<std::string> never(1, "never");
                                             co_await c.wait(never, 1ms);
                                         });
    INFO(out.error);
    CHECK(out.error.find("CANCEL_WAIT '/never': the store at") == 0);
    CHECK(out.error.find("said nothing within 150 ms") != std::string::npos);
    REQUIRE(out.loss);
    CHECK(out.loss->leases == std::vector<std::string>{"job/__lease__/me"});
}

TEST_CASE("store: connection_lost() reports a loss that happened before it was awaited") {
    fixture f(1s, 5);
    std::optional<elastic::store_connection_loss> loss;
    bool cancelled = false;
    f.run([&]() -> asio::awaitable<void> {
        using namespace asio::experimental::awaitable_operators;
        elastic::tcp_store_client c(f.ctx.get_executor(), f.client_options());
        // Nothing lost yet: a timer wins the race and cancels the await cleanly.
        asio::steady_timer t(f.ctx, std::chrono::milliseconds(1));
        const auto first = co_await (c.connection_lost() ||
                                     t.async_wait(asio::experimental::as_tuple(asio::use_awaitable)));
        cancelled = first.index() == 1;
        co_await c.hold_lease(elastic::lease_key("", "x"), "1");
        c.close();
        loss = co_await c.connection_lost();
        // It is reported once: the client holds nothing now.
        CHECK(c.leases().empty());
    }());
    CHECK(cancelled);
    REQUIRE(loss);
    CHECK(loss->reason == "close() was called");
    CHECK(loss->leases == std::vector<std::string>{"__lease__/x"});
}

}  // namespace test_store_leases
