// The store's wire codec (opcode tables, detection, incremental parsing, limits), the shared
// engine, the in-memory store and the prefix wrapper.
#include <elastic/store/concepts.hpp>
#include <elastic/store/engine.hpp>
#include <elastic/store/memory_store.hpp>
#include <elastic/store/prefix_store.hpp>
#include <elastic/store/wire.hpp>

#include <doctest/doctest.h>

#include "store_support.hpp"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>

#include <chrono>
#include <deque>
#include <string>
#include <vector>

namespace test_store_models {

using namespace std::chrono_literals;
using elastic::wire::dialect;
using elastic::wire::op;
using elastic::wire::parse_status;
using store_support::unhex;

static_assert(elastic::store<elastic::memory_store>);
static_assert(elastic::multi_key_store<elastic::memory_store>);
static_assert(elastic::store<elastic::prefix_store<elastic::memory_store>>);
static_assert(elastic::multi_key_store<elastic::prefix_store<elastic::memory_store>>);

// Parses one whole request and checks it is complete, consumes all bytes, and that every
// strict prefix asks for more with a correct lower bound.
// The request's views point into the bytes, which therefore live as long as the test.
std::deque<std::string> kept_bytes;

elastic::wire::request parse_all(dialect d, std::string input) {
    const std::string& bytes = kept_bytes.emplace_back(std::move(input));
    elastic::wire::request req;
    for (std::size_t n = 0; n < bytes.size(); ++n) {
        const auto r = elastic::wire::parse_request(d, std::string_view(bytes).substr(0, n), req);
        REQUIRE(r.status == parse_status::need_more);
        CHECK(r.size > n);
        CHECK(r.size <= bytes.size());
    }
    const auto r = elastic::wire::parse_request(d, bytes, req);
    REQUIRE(r.status == parse_status::complete);
    CHECK(r.size == bytes.size());
    return req;
}

// Builds a vector of keys outside any coroutine: g++ 12 rejects a braced list of strings whose
// backing array lives across a co_await ("array used as initializer").
template <class... A>
std::vector<std::string> ks(A&&... a) {
    std::vector<std::string> v;
    (v.emplace_back(std::forward<A>(a)), ...);
    return v;
}

// A waiter for engine tests: counts its wake-ups.
struct counting_waiter final : elastic::detail::store::store_waiter {
    void on_ready() override { ++woken; }
    int woken = 0;
};

}  // namespace test_store_models

using namespace test_store_models;

TEST_CASE("store: opcode tables of both dialects") {
    using elastic::wire::to_byte;
    using elastic::wire::to_op;
    // 1.13: SET=0 ... WATCH_KEY=7, DELETE_KEY=8; ~2.0 adds APPEND..CANCEL_WAIT = 9..12.
    const std::vector<op> legacy{op::set,       op::compare_set, op::get,        op::add,        op::check,
                                 op::wait,      op::num_keys,    op::watch_key,  op::delete_key, op::append,
                                 op::multi_get, op::multi_set,   op::cancel_wait};
    for (std::size_t i = 0; i < legacy.size(); ++i) {
        CHECK(to_op(dialect::legacy, static_cast<std::uint8_t>(i)) == legacy[i]);
        CHECK(to_byte(dialect::legacy, legacy[i]) == i);
    }
    CHECK_FALSE(to_op(dialect::legacy, 13));
    CHECK_FALSE(to_byte(dialect::legacy, op::validate));
    CHECK_FALSE(to_byte(dialect::legacy, op::ping));
    const std::vector<op> current{op::validate,  op::set,       op::compare_set, op::get,        op::add,
                                  op::check,     op::wait,      op::num_keys,    op::delete_key, op::append,
                                  op::multi_get, op::multi_set, op::cancel_wait, op::ping,       op::queue_push,
                                  op::queue_pop, op::queue_len, op::list_keys,   op::barrier};
    for (std::size_t i = 0; i < current.size(); ++i) {
        CHECK(to_op(dialect::current, static_cast<std::uint8_t>(i)) == current[i]);
        CHECK(to_byte(dialect::current, current[i]) == i);
    }
    CHECK_FALSE(to_op(dialect::current, 19));
    CHECK_FALSE(to_byte(dialect::current, op::watch_key));
    CHECK(elastic::wire::name(op::num_keys) == "GETNUMKEYS");
}

TEST_CASE("store: dialect detection from the first bytes") {
    using elastic::wire::detect_dialect;
    using elastic::wire::detection;
    CHECK(detect_dialect("") == detection::need_more);
    CHECK(detect_dialect(unhex("03")) == detection::legacy);  // 1.13 ADD init/
    CHECK(detect_dialect(unhex("01")) == detection::legacy);  // 1.13 COMPARE_SET
    CHECK(detect_dialect(unhex("00")) == detection::need_more);
    CHECK(detect_dialect(unhex("00 ce f7 85")) == detection::need_more);
    CHECK(detect_dialect(unhex("00 ce f7 85 3c")) == detection::current);
    CHECK(detect_dialect(unhex("00 ce f7 85 3c 0d 01 02 03 04")) == detection::current);
    CHECK(detect_dialect(unhex("00 03")) == detection::legacy);  // 1.13 SET, key length 3
    CHECK(detect_dialect(unhex("00 ce f7 85 3d")) == detection::legacy);
}

TEST_CASE("store: parsing the observed 1.13 requests byte by byte") {
    // wire §1.6
    auto r = parse_all(dialect::legacy, unhex("03 05 00x7 69 6e 69 74 2f 01 00x7"));
    CHECK(r.operation == op::add);
    CHECK(r.key == "init/");
    CHECK(r.number == 1);
    r = parse_all(dialect::legacy, unhex("03 04 00x7 2f 63 6e 74 fe ff ff ff ff ff ff ff"));
    CHECK(r.number == -2);
    r = parse_all(dialect::legacy, unhex("00 03 00x7 2f 6b 31 02 00x7 76 31"));
    CHECK(r.operation == op::set);
    CHECK(r.key == "/k1");
    CHECK(r.value == "v1");
    r = parse_all(dialect::legacy, unhex("05 02 00x7 02 00x7 2f 61 02 00x7 2f 62"));
    CHECK(r.operation == op::wait);
    CHECK(r.keys == std::vector<std::string_view>{"/a", "/b"});
    r = parse_all(dialect::legacy, unhex("01 07 00x7 2f 6e 65 77 6b 65 79 00x8 02 00x7 6e 31"));
    CHECK(r.operation == op::compare_set);
    CHECK(r.key == "/newkey");
    CHECK(r.expected.empty());
    CHECK(r.value == "n1");
    r = parse_all(dialect::legacy, unhex("06"));
    CHECK(r.operation == op::num_keys);
    r = parse_all(dialect::legacy, unhex("08 03 00x7 2f 6b 31"));
    CHECK(r.operation == op::delete_key);
    r = parse_all(dialect::legacy, unhex("00 04 00x7 2f 62 69 6e 03 00x7 00 01 ff"));
    CHECK(r.value == std::string("\x00\x01\xff", 3));
    r = parse_all(dialect::legacy, unhex("0b 02 00x7 01 00x7 61 01 00x7 31 01 00x7 62 00x8"));
    CHECK(r.operation == op::multi_set);
    CHECK(r.keys == std::vector<std::string_view>{"a", "b"});
    CHECK(r.values == std::vector<std::string_view>{"1", ""});
    r = parse_all(dialect::current, unhex("00 ce f7 85 3c"));
    CHECK(r.operation == op::validate);
    CHECK(r.nonce == elastic::wire::validate_magic);
    r = parse_all(dialect::current, unhex("0d 39 30 00 00"));
    CHECK(r.operation == op::ping);
    CHECK(r.nonce == 12345);
    r = parse_all(dialect::current, unhex("01 03 00x7 2f 6b 31 02 00x7 76 31"));
    CHECK(r.operation == op::set);
    r = parse_all(dialect::current, unhex("12 01 00x7 62 04 00x7"));
    CHECK(r.operation == op::barrier);
    CHECK(r.number == 4);
}

TEST_CASE("store: two requests in one buffer parse one at a time") {
    const auto bytes = unhex("06 08 03 00x7 2f 6b 31");
    elastic::wire::request req;
    auto r = elastic::wire::parse_request(dialect::legacy, bytes, req);
    REQUIRE(r.status == parse_status::complete);
    CHECK(r.size == 1);
    r = elastic::wire::parse_request(dialect::legacy, std::string_view(bytes).substr(1), req);
    REQUIRE(r.status == parse_status::complete);
    CHECK(req.operation == op::delete_key);
}

TEST_CASE("store: malformed requests name the rule they break") {
    elastic::wire::request req;
    const elastic::wire::limits lim{
        .max_key_size = 16, .max_value_size = 32, .max_keys_per_request = 4, .max_request_size = 100};
    auto r = elastic::wire::parse_request(dialect::legacy, unhex("0d"), req, lim);
    CHECK(r.status == parse_status::malformed);
    CHECK(r.reason.find("unknown opcode 0x0d") != std::string::npos);
    r = elastic::wire::parse_request(dialect::current, unhex("13"), req, lim);
    CHECK(r.status == parse_status::malformed);
    // The limit is checked from the length field, before the bytes arrive.
    r = elastic::wire::parse_request(dialect::legacy, unhex("02 11 00x7"), req, lim);
    CHECK(r.status == parse_status::malformed);
    CHECK(r.reason.find("max_key_size") != std::string::npos);
    r = elastic::wire::parse_request(dialect::legacy, unhex("00 01 00x7 6b 21 00x7"), req, lim);
    CHECK(r.status == parse_status::malformed);
    CHECK(r.reason.find("max_value_size") != std::string::npos);
    r = elastic::wire::parse_request(dialect::legacy, unhex("05 05 00x7"), req, lim);
    CHECK(r.status == parse_status::malformed);
    CHECK(r.reason.find("max_keys_per_request") != std::string::npos);
    // A length whose high bytes are set (what a 2.x handshake looks like to 1.13).
    r = elastic::wire::parse_request(dialect::legacy, unhex("00 ce f7 85 3c 0d 01 02 03"), req);
    CHECK(r.status == parse_status::malformed);
    // max_request_size: 4 keys of 16 bytes plus headers pass 100 bytes.
    std::string many = unhex("05 04 00x7");
    for (int i = 0; i < 4; ++i) many += unhex("10 00x7") + std::string(16, 'k');
    r = elastic::wire::parse_request(dialect::legacy, many, req, lim);
    CHECK(r.status == parse_status::malformed);
    CHECK(r.reason.find("max_request_size") != std::string::npos);
}

TEST_CASE("store: encode_request writes what parse_request reads") {
    elastic::wire::request req;
    req.operation = op::compare_set;
    req.key = "/k1";
    req.expected = "v1";
    req.value = "v2";
    std::string out;
    elastic::wire::encode_request(dialect::legacy, req, out);
    CHECK(out == unhex("01 03 00x7 2f 6b 31 02 00x7 76 31 02 00x7 76 32"));
    out.clear();
    elastic::wire::encode_request(dialect::current, req, out);
    CHECK(out == unhex("02 03 00x7 2f 6b 31 02 00x7 76 31 02 00x7 76 32"));
    req.operation = op::ping;
    CHECK_THROWS_AS(elastic::wire::encode_request(dialect::legacy, req, out), std::invalid_argument);
}

TEST_CASE("store: engine semantics follow PyTorch's libuv server") {
    elastic::detail::store::store_engine e;
    CHECK(e.add("cnt", 5) == 5);
    CHECK(e.add("cnt", -2) == 3);
    CHECK(*e.find("cnt") == "3");  // decimal ASCII like std::to_string
    e.set("word", std::string_view("yes"));
    CHECK_THROWS_AS(e.add("word", 1), elastic::store_error);
    CHECK(*e.find("word") == "yes");
    e.set("big", std::string_view("9223372036854775807"));
    CHECK_THROWS_AS(e.add("big", 1), elastic::store_error);
    e.set("trail", std::string_view("12abc"));
    CHECK_THROWS_AS(e.add("trail", 1), elastic::store_error);
    // compare_set, all four cases (wire §1.3 / §1.6).
    CHECK(e.compare_set("k", "", "n1") == "n1");  // absent, expected empty: created
    CHECK(e.compare_set("a2", "x", "y") == "x");  // absent, expected non-empty: echoed
    CHECK(e.find("a2") == nullptr);
    CHECK(e.compare_set("k", "n1", "n2") == "n2");  // equal: replaced
    CHECK(e.compare_set("k", "zz", "n3") == "n2");  // different: current
    CHECK(e.size() == 5);                           // cnt, word, big, trail, k
    CHECK(e.erase("k"));
    CHECK_FALSE(e.erase("k"));
    e.append("log", "a");
    e.append("log", "b");
    CHECK(*e.find("log") == "ab");
}

TEST_CASE("store: engine waiters are woken by the write that creates their last key") {
    elastic::detail::store::store_engine e;
    counting_waiter w;
    const std::vector<std::string> keys{"a", "b", "a"};
    CHECK_FALSE(e.wait(w, keys));
    CHECK(w.registered());
    e.set("a", std::string_view("1"));
    CHECK(w.woken == 0);
    e.set("a", std::string_view("2"));  // not a creation: nobody to wake
    CHECK(w.woken == 0);
    CHECK(e.compare_set("b", "", "x") == "x");  // a creating CAS wakes (1.13 did not)
    CHECK(w.woken == 1);
    CHECK_FALSE(w.registered());
    CHECK(e.awaited_keys() == 0);

    counting_waiter now;
    CHECK(e.wait(now, keys));  // all exist: answered at once, nothing registered
    CHECK(now.woken == 0);

    counting_waiter gone;
    const std::vector<std::string> missing{"m1", "m2"};
    CHECK_FALSE(e.wait(gone, missing));
    e.cancel(gone);
    CHECK(e.awaited_keys() == 0);
    e.set("m1", std::string_view("x"));
    e.set("m2", std::string_view("x"));
    CHECK(gone.woken == 0);

    counting_waiter by_add;
    const std::vector<std::string> counter{"c"};
    CHECK_FALSE(e.wait(by_add, counter));
    e.add("c", 0);
    CHECK(by_add.woken == 1);
}

TEST_CASE("store: memory_store operations") {
    asio::io_context ctx;
    elastic::memory_store s(5s);
    store_support::run(ctx, [&]() -> asio::awaitable<void> {
        co_await s.set("k1", "v1");
        CHECK(co_await s.get("k1") == "v1");
        CHECK(co_await s.add("cnt", 5) == 5);
        CHECK(co_await s.add("cnt", -2) == 3);
        CHECK(co_await s.get("cnt") == "3");
        CHECK(co_await s.compare_set("k1", "v1", "v2") == "v2");
        CHECK(co_await s.compare_set("k1", "zz", "v3") == "v2");
        CHECK(co_await s.compare_set("newkey", "", "n1") == "n1");
        CHECK(co_await s.compare_set("absent2", "x", "y") == "x");
        CHECK(co_await s.num_keys() == 3);
        CHECK(co_await s.check(ks("k1", "cnt")));
        CHECK_FALSE(co_await s.check(ks("k1", "absent2")));
        CHECK(co_await s.delete_key("k1"));
        CHECK_FALSE(co_await s.delete_key("k1"));
        co_await s.multi_set(ks("a", "b"), ks("1", std::string("\0\1", 2)));
        CHECK(co_await s.multi_get(ks("b", "a")) == ks(std::string("\0\1", 2), "1"));
        co_await s.append("a", "23");
        CHECK(co_await s.get("a") == "123");
        bool threw = false;
        try {
            co_await s.add("a2", 1);
            co_await s.set("word", "yes");
            co_await s.add("word", 1);
        } catch (const elastic::store_error&) {
            threw = true;
        }
        CHECK(threw);
        threw = false;
        try {
            co_await s.multi_set(ks("x"), ks());
        } catch (const elastic::store_error&) {
            threw = true;
        }
        CHECK(threw);
    }());
}

TEST_CASE("store: memory_store wait is woken by a write and times out cleanly") {
    using namespace asio::experimental::awaitable_operators;
    asio::io_context ctx;
    elastic::memory_store s(60s);
    store_support::run(ctx, [&]() -> asio::awaitable<void> {
        // A waiter and a writer side by side: the wait returns once both keys exist.
        auto waiter = [&]() -> asio::awaitable<std::string> {
            co_await s.wait(ks("late1", "late2"));
            co_return co_await s.get("late2");
        };
        auto writer = [&]() -> asio::awaitable<void> {
            co_await s.set("late1", "1");
            CHECK(s.engine().awaited_keys() == 1);  // still waiting for late2
            co_await s.set("late2", "2");
        };
        const std::string got = co_await (waiter() && writer());
        CHECK(got == "2");
        CHECK(s.engine().awaited_keys() == 0);

        bool timed_out = false;
        try {
            co_await s.wait(ks("never"), 20ms);
        } catch (const elastic::store_timeout& e) {
            timed_out = true;
            CHECK(std::string(e.what()).find("never") != std::string::npos);
        }
        CHECK(timed_out);
        CHECK(s.engine().awaited_keys() == 0);  // no registration left behind

        // get waits up to the store's timeout.
        s.set_timeout(10ms);
        timed_out = false;
        try {
            co_await s.get("nothing");
        } catch (const elastic::store_timeout&) {
            timed_out = true;
        }
        CHECK(timed_out);
    }());
}

TEST_CASE("store: prefix_store joins with '/' like PyTorch's PrefixStore") {
    asio::io_context ctx;
    elastic::memory_store inner(5s);
    elastic::prefix_store outer("torch.rendezvous.job.0", inner);
    elastic::prefix_store nested("worker", outer);
    store_support::run(ctx, [&]() -> asio::awaitable<void> {
        co_await outer.set("MASTER_ADDR", "localhost");
        CHECK(inner.engine().find("torch.rendezvous.job.0/MASTER_ADDR") != nullptr);
        CHECK(co_await outer.get("MASTER_ADDR") == "localhost");
        CHECK(co_await nested.add("n", 2) == 2);
        CHECK(co_await inner.get("torch.rendezvous.job.0/worker/n") == "2");
        CHECK(co_await nested.compare_set("c", "", "1") == "1");
        CHECK(co_await nested.check(ks("n", "c")));
        co_await nested.wait(ks("n"), 1s);
        co_await nested.multi_set(ks("m"), ks("v"));
        CHECK(co_await nested.multi_get(ks("m")) == ks("v"));
        co_await nested.append("m", "w");
        CHECK(co_await inner.get("torch.rendezvous.job.0/worker/m") == "vw");
        CHECK(co_await nested.num_keys() == 4);  // the inner store's count, as PyTorch
        CHECK(co_await nested.delete_key("m"));
        CHECK_FALSE(co_await inner.check(ks("torch.rendezvous.job.0/worker/m")));
        CHECK(nested.timeout() == 5s);
    }());
}
