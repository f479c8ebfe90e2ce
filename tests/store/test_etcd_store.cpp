// The etcd client and etcd_store against a real etcd (Debian's etcd-server, started here on
// loopback ports): the store's operations, waits by watch, leases and their loss records,
// failover between members, TLS, and servers that are no etcd or misbehave.
// test-tags: etcd
#include <elastic/store/concepts.hpp>
#include <elastic/store/etcd_client.hpp>
#include <elastic/store/etcd_store.hpp>
#include <elastic/store/lease.hpp>

#include <doctest/doctest.h>

#include "etcd_support.hpp"
#include "test_files.hpp"

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

namespace test_etcd_store {

using namespace std::chrono_literals;

static_assert(elastic::store<elastic::etcd_store>);
static_assert(elastic::multi_key_store<elastic::etcd_store>);

elastic::etcd_options options_for(const etcd_support::cluster& c) {
    elastic::etcd_options o;
    for (const auto& m : c.members()) o.endpoints.push_back({"127.0.0.1", m.client_port});
    o.request_timeout = 10s;
    o.connect_timeout = 2s;
    return o;
}

std::vector<std::string> ks(std::initializer_list<const char*> keys) { return {keys.begin(), keys.end()}; }

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// A loopback port nothing listens on: bound, then closed.
std::uint16_t closed_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    ::close(fd);
    return ntohs(a.sin_port);
}

/// A socket listening on a free loopback port (`port`).
int listening_socket(std::uint16_t& port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 16) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
    return fd;
}

/// A server on a loopback port that answers every connection with `answer` (then keeps the
/// connection open until the client closes it, or closes at once with `close_after`); an empty
/// answer says nothing at all. One thread, accepting until destroyed.
class fake_server {
public:
    explicit fake_server(std::string answer, bool close_after = false)
        : answer_(std::move(answer)), close_after_(close_after) {
        fd_ = listening_socket(port_);
        thread_ = std::thread([this] { serve(); });
    }
    ~fake_server() {
        stop_ = true;
        ::shutdown(fd_, SHUT_RDWR);
        thread_.join();
        ::close(fd_);
        for (int c : clients_) ::close(c);
    }
    fake_server(const fake_server&) = delete;
    fake_server& operator=(const fake_server&) = delete;

    [[nodiscard]] std::uint16_t port() const { return port_; }

private:
    void serve() {
        while (!stop_) {
            const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) return;
            // Reads the request head (the tests send small requests) before answering.
            char buf[4096];
            (void)::recv(c, buf, sizeof buf, 0);
            std::size_t sent = 0;
            while (sent < answer_.size()) {
                const auto n = ::send(c, answer_.data() + sent, answer_.size() - sent, MSG_NOSIGNAL);
                if (n <= 0) break;
                sent += static_cast<std::size_t>(n);
            }
            if (close_after_) ::close(c);
            else clients_.push_back(c);
        }
    }

    std::string answer_;
    bool close_after_;
    int fd_ = -1;
    std::uint16_t port_ = 0;
    std::atomic<bool> stop_{false};
    std::vector<int> clients_;
    std::thread thread_;
};

/// Runs `a` on `io` until it is done, while what it left running (a lease's renewal and its
/// observer) goes on; rethrows its exception.
template <class T>
T run(asio::io_context& io, asio::awaitable<T> a) {
    std::exception_ptr error;
    std::optional<T> result;
    bool done = false;
    asio::co_spawn(io, std::move(a), [&](std::exception_ptr e, T v) {
        error = e;
        if (!e) result.emplace(std::move(v));
        done = true;
    });
    io.restart();
    while (!done) io.run_one();
    if (error) std::rethrow_exception(error);
    return std::move(*result);
}

inline void run(asio::io_context& io, asio::awaitable<void> a) {
    std::exception_ptr error;
    bool done = false;
    asio::co_spawn(io, std::move(a), [&](std::exception_ptr e) {
        error = e;
        done = true;
    });
    io.restart();
    while (!done) io.run_one();
    if (error) std::rethrow_exception(error);
}

/// A proxy to an etcd member that loses the answer to the first transaction that compares: it
/// reads it, closes the client's connection unanswered, and sends it to etcd later, just before
/// the next transaction that compares — an answer lost on the way and a request etcd applies
/// late, the worst order for a client that tries again. Everything else is passed on. One
/// thread, one client connection at a time (the tests' stores use one).
class late_proxy {
public:
    explicit late_proxy(std::uint16_t upstream) : upstream_(upstream) {
        fd_ = listening_socket(port_);
        thread_ = std::thread([this] { serve(); });
    }
    ~late_proxy() {
        ::shutdown(fd_, SHUT_RDWR);
        thread_.join();
        ::close(fd_);
    }
    late_proxy(const late_proxy&) = delete;
    late_proxy& operator=(const late_proxy&) = delete;

    [[nodiscard]] std::uint16_t port() const { return port_; }
    /// The lost transaction was sent to etcd, and what etcd answered it.
    [[nodiscard]] std::string late_answer() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return late_answer_;
    }

private:
    /// One HTTP message with a Content-Length body from `fd`; empty when the peer closed.
    static std::string read_message(int fd) {
        std::string in;
        char buf[65536];
        for (;;) {
            const auto head_end = in.find("\r\n\r\n");
            if (head_end != std::string::npos) {
                std::size_t length = 0;
                const auto at = in.find("Content-Length: ");
                if (at != std::string::npos && at < head_end) length = std::stoul(in.substr(at + 16));
                if (in.size() >= head_end + 4 + length) return in.substr(0, head_end + 4 + length);
            }
            const auto n = ::recv(fd, buf, sizeof buf, 0);
            if (n <= 0) return {};
            in.append(buf, static_cast<std::size_t>(n));
        }
    }
    /// Bounds every blocking call on `fd` (10 s): a peer that never answers ends the exchange.
    static void bounded(int fd) {
        timeval limit{10, 0};
        (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
        (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    }
    static void send_all(int fd, const std::string& bytes) {
        std::size_t sent = 0;
        while (sent < bytes.size()) {
            const auto n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
            if (n <= 0) return;
            sent += static_cast<std::size_t>(n);
        }
    }
    /// Sends `request` to etcd on a connection of its own; returns the answer.
    std::string forward(const std::string& request) const {
        const int up = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        bounded(up);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(upstream_);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        std::string answer;
        if (::connect(up, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
            send_all(up, request);
            answer = read_message(up);
        }
        ::close(up);
        return answer;
    }
    void serve() {
        std::string held;
        bool done = false;
        for (;;) {
            const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) return;
            bounded(c);
            for (;;) {
                const auto request = read_message(c);
                if (request.empty()) break;
                const bool compares = request.rfind("POST /v3/kv/txn ", 0) == 0 &&
                                      request.find("\"compare\"") != std::string::npos;
                if (compares && !done && held.empty()) {
                    held = request;  // lost: the client hears nothing
                    break;
                }
                if (compares && !held.empty()) {
                    auto late = forward(held);
                    held.clear();
                    done = true;
                    std::lock_guard<std::mutex> lock(mutex_);
                    late_answer_ = std::move(late);
                }
                send_all(c, forward(request));
            }
            ::close(c);
        }
    }

    std::uint16_t upstream_;
    int fd_ = -1;
    std::uint16_t port_ = 0;
    std::thread thread_;
    mutable std::mutex mutex_;
    std::string late_answer_;
};

/// The message of the store_error `a` ends with (fails the case when it ends otherwise).
template <class T>
std::string error_of(asio::io_context& io, asio::awaitable<T> a) {
    try {
        (void)run(io, std::move(a));
    } catch (const elastic::store_error& e) {
        return e.what();
    }
    FAIL("no store_error");
    return {};
}

}  // namespace test_etcd_store

using namespace test_etcd_store;

TEST_CASE("etcd store: the store's operations with c10d's semantics") {
    etcd_support::cluster etcd(1);
    asio::io_context io;
    auto client = std::make_shared<elastic::etcd_client>(io.get_executor(), options_for(etcd));
    elastic::etcd_store s(client);
    CHECK(run(io, client->server_version()).rfind("3.", 0) == 0);
    run(io, s.set("a", std::string("x\0y", 3)));
    CHECK(run(io, s.get("a")) == std::string("x\0y", 3));
    CHECK(run(io, s.add("n", 5)) == 5);
    CHECK(run(io, s.add("n", -7)) == -2);
    CHECK(run(io, s.get("n")) == "-2");
    // compare_set: absent & expected empty creates; absent & expected set returns expected;
    // equal replaces; different returns the current value.
    CHECK(run(io, s.compare_set("c", "", "one")) == "one");
    CHECK(run(io, s.compare_set("d", "nope", "two")) == "nope");
    CHECK_FALSE(run(io, s.check(ks({"d"}))));
    CHECK(run(io, s.compare_set("c", "other", "three")) == "one");
    CHECK(run(io, s.compare_set("c", "one", "four")) == "four");
    run(io, s.set("empty", ""));
    CHECK(run(io, s.compare_set("empty", "", "filled")) == "filled");
    CHECK(run(io, s.check(ks({"a", "n", "c"}))));
    CHECK_FALSE(run(io, s.check(ks({"a", "missing"}))));
    run(io, s.multi_set(ks({"m1", "m2", "m1"}), ks({"1", "2", "3"})));
    CHECK(run(io, s.multi_get(ks({"m1", "m2"}))) == ks({"3", "2"}));
    run(io, s.append("ap", "ab"));
    run(io, s.append("ap", "cd"));
    CHECK(run(io, s.get("ap")) == "abcd");
    CHECK(run(io, s.num_keys()) == 7);
    CHECK(run(io, s.delete_key("ap")));
    CHECK_FALSE(run(io, s.delete_key("ap")));
    CHECK(has(error_of(io, s.add("a", 1)), "no decimal number"));
    CHECK(has(error_of(io, s.multi_set(ks({"x"}), ks({}))), "1 keys and 0 values"));
    // More keys than one etcd transaction takes (128 operations).
    std::vector<std::string> many;
    std::vector<std::string> values;
    for (int i = 0; i < 300; ++i) {
        many.push_back(fmt::format("k{}", i));
        values.push_back(std::to_string(i));
    }
    run(io, s.multi_set(many, values));
    CHECK(run(io, s.multi_get(many)) == values);
    CHECK(run(io, s.check(many)));
    // The keys live under the prefix: another prefix sees none of them.
    elastic::etcd_store other(client, {.prefix = "/other/"});
    CHECK(run(io, other.num_keys()) == 0);
    CHECK_FALSE(run(io, other.check(ks({"a"}))));
}

namespace test_etcd_store {

asio::awaitable<void> add_ones(elastic::etcd_store& s, const char* key, int times, std::vector<std::int64_t>& got) {
    for (int i = 0; i < times; ++i) got.push_back(co_await s.add(key, 1));
}

}  // namespace test_etcd_store

TEST_CASE(
    "etcd store: a crowd adding 1 gets every number once, one transaction per add, a counter reads as its number") {
    etcd_support::cluster etcd(1);
    asio::io_context io;
    constexpr int stores = 16;
    constexpr int times = 4;
    std::vector<std::unique_ptr<elastic::etcd_store>> crowd;
    for (int i = 0; i < stores; ++i) {
        crowd.push_back(std::make_unique<elastic::etcd_store>(
            std::make_shared<elastic::etcd_client>(io.get_executor(), options_for(etcd))));
    }
    auto& s = *crowd.front();
    CHECK(run(io, s.add("crowd", 0)) == 0);  // created (a compare-and-set of its own)
    const auto txns = etcd.requests(0, "Txn");
    const auto ranges = etcd.requests(0, "Range");
    // Every store adds at once, each over its own connection: with a compare-and-set, all but
    // one of each race would read and try again.
    std::vector<std::int64_t> got;
    int done = 0;
    std::vector<std::string> errors;
    for (auto& one : crowd) {
        asio::co_spawn(io, add_ones(*one, "crowd", times, got), [&](std::exception_ptr e) {
            if (e) {
                try {
                    std::rethrow_exception(e);
                } catch (const std::exception& x) {
                    errors.emplace_back(x.what());
                }
            }
            ++done;
        });
    }
    io.restart();
    while (done < stores) io.run_one();
    CHECK(errors.empty());
    std::sort(got.begin(), got.end());
    std::vector<std::int64_t> every(stores * times);
    std::iota(every.begin(), every.end(), 1);
    CHECK(got == every);
    CHECK(etcd.requests(0, "Txn") - txns == stores * times);
    CHECK(etcd.requests(0, "Range") == ranges);
    // Stores of one client share their receipts' lease: one grant, however many ask at once.
    const auto grants = etcd.requests(0, "LeaseGrant");
    auto one_client = std::make_shared<elastic::etcd_client>(io.get_executor(), options_for(etcd));
    std::vector<std::unique_ptr<elastic::etcd_store>> sharing;
    for (int i = 0; i < 8; ++i) sharing.push_back(std::make_unique<elastic::etcd_store>(one_client));
    std::vector<std::int64_t> more;
    done = 0;
    for (auto& one : sharing) {
        asio::co_spawn(io, add_ones(*one, "shared", 1, more), [&](std::exception_ptr e) {
            CHECK(e == nullptr);
            ++done;
        });
    }
    io.restart();
    while (done < 8) io.run_one();
    CHECK(more.size() == 8);
    CHECK(etcd.requests(0, "LeaseGrant") - grants == 1);
    // Read, compared and replaced as its number.
    CHECK(run(io, s.get("crowd")) == "64");
    CHECK(run(io, s.multi_get(ks({"crowd"}))) == ks({"64"}));
    CHECK(run(io, s.add("crowd", -4)) == 60);
    CHECK(run(io, s.add("crowd", 1)) == 61);
    CHECK(run(io, s.compare_set("crowd", "60", "no")) == "61");
    CHECK(run(io, s.compare_set("crowd", "61", "done")) == "done");
    CHECK(has(error_of(io, s.add("crowd", 1)), "no decimal number"));
    // A number set as text is added to, and becomes a counter; a deleted counter starts again.
    run(io, s.set("plain", "41"));
    CHECK(run(io, s.add("plain", 1)) == 42);
    CHECK(run(io, s.add("plain", 1)) == 43);
    CHECK(run(io, s.get("plain")) == "43");
    CHECK(run(io, s.delete_key("plain")));
    CHECK(run(io, s.add("plain", 1)) == 1);
    CHECK(run(io, s.add("plain", std::int64_t{1} << 32)) == (std::int64_t{1} << 32) + 1);
    CHECK(run(io, s.add("plain", 1)) == (std::int64_t{1} << 32) + 2);
    // Past the range a counter wraps (as PyTorch's store's does), never undefined behaviour.
    const auto top = std::numeric_limits<std::int64_t>::max();
    CHECK(run(io, s.add("edge", top)) == top);
    CHECK(run(io, s.add("edge", 1)) == std::numeric_limits<std::int64_t>::min());
    CHECK(run(io, s.add("edge", -1)) == top);
    // A value that would read as a counter is refused, not misread.
    CHECK(has(error_of(io, s.set("fake", std::string("\x01"
                                                     "counter 5"))),
              "kept for the store's counters"));
    CHECK_FALSE(run(io, s.check(ks({"fake"}))));
}

TEST_CASE(
    "etcd store: an update whose answer is lost and that etcd applies late, after a retry was sent, counts once") {
    etcd_support::cluster etcd(1);
    asio::io_context io;
    elastic::etcd_store direct(std::make_shared<elastic::etcd_client>(io.get_executor(), options_for(etcd)));
    // Adding 1 (one transaction that raises the counter), adding 2 (a compare-and-set) and an
    // append, each through a proxy that loses the call's first transaction and applies it late.
    for (const std::int64_t delta : {1, 2, 0}) {
        CAPTURE(delta);
        const auto key = fmt::format("n{}", delta);
        CHECK(run(io, direct.add(key, 10)) == 10);
        late_proxy proxy(etcd.members().front().client_port);
        auto o = options_for(etcd);
        o.endpoints = {{"127.0.0.1", proxy.port()}};
        elastic::etcd_store s(std::make_shared<elastic::etcd_client>(io.get_executor(), o));
        if (delta == 0) {
            run(io, direct.set(key, "ab"));
            run(io, s.append(key, "cd"));
            CHECK(run(io, direct.get(key)) == "abcd");
        } else {
            CHECK(run(io, s.add(key, delta)) == 10 + delta);
            CHECK(run(io, direct.get(key)) == std::to_string(10 + delta));
        }
        // The lost transaction did reach etcd, late, and etcd applied it.
        CHECK(has(proxy.late_answer(), "\"succeeded\":true"));
    }
}

TEST_CASE("etcd store: a wait is woken by the write that makes its keys exist, and a timeout says which keys") {
    using namespace asio::experimental::awaitable_operators;
    etcd_support::cluster etcd(1);
    asio::io_context io;
    auto client = std::make_shared<elastic::etcd_client>(io.get_executor(), options_for(etcd));
    elastic::etcd_store waiter(client);
    elastic::etcd_store writer(client);
    bool woken = false;
    const auto both = ks({"w1", "w2"});
    auto wait = [&]() -> asio::awaitable<void> {
        co_await waiter.wait(both, std::chrono::hours(1));
        woken = true;
    };
    auto write = [&]() -> asio::awaitable<void> {
        co_await writer.set("w1", "1");
        CHECK_FALSE(woken);
        co_await writer.set("w2", "2");
    };
    run(io, [&]() -> asio::awaitable<void> { co_await (wait() && write()); }());
    CHECK(woken);
    const auto why = error_of(io, waiter.wait(ks({"w1", "never"}), 200ms));
    CHECK(has(why, "wait for 'w1', 'never' timed out after 200 ms"));
    // get waits for its key as well.
    bool got = false;
    auto get = [&]() -> asio::awaitable<void> {
        CHECK(co_await waiter.get("late") == "here");
        got = true;
    };
    run(io, [&]() -> asio::awaitable<void> { co_await (get() && writer.set("late", "here")); }());
    CHECK(got);
}

TEST_CASE("etcd store: a lease that etcd expires is recorded once as the group's next loss, and a release too") {
    etcd_support::cluster etcd(1);
    asio::io_context io;
    auto client = std::make_shared<elastic::etcd_client>(io.get_executor(), options_for(etcd));
    elastic::etcd_store_options short_lease;
    short_lease.keep_alive_interval = 500ms;
    short_lease.keep_alive_max_attempt = 4;  // 2 s
    elastic::etcd_store observer(client, short_lease);
    elastic::etcd_store second_observer(client, short_lease);
    elastic::etcd_store holder(client, short_lease);
    elastic::etcd_store leaver(client, short_lease);
    elastic::etcd_store reader(client);
    const std::string group = "job/nodes";
    run(io, observer.hold_lease(elastic::lease_key(group, "observer"), "o"));
    run(io, second_observer.hold_lease(elastic::lease_key(group, "observer2"), "o"));
    run(io, holder.hold_lease(elastic::lease_key(group, "holder"), "h"));
    run(io, leaver.hold_lease(elastic::lease_key(group, "leaver"), "l"));
    CHECK(run(io, reader.get(elastic::lease_epoch_key(group))) == "0");
    CHECK(run(io, reader.get(elastic::lease_silent_key(group))) == "0");
    CHECK(run(io, reader.check({elastic::lease_key(group, "holder")})));
    CHECK_THROWS_AS(run(io, holder.hold_lease(elastic::lease_key(group, "again"), "h")), elastic::store_error);
    CHECK_THROWS_AS(run(io, reader.hold_lease("no-lease-key", "v")), elastic::store_error);
    CHECK_THROWS_AS(run(io, reader.hold_lease(elastic::lease_key(group, "__epoch"), "v")), elastic::store_error);

    // The holder stops renewing (as a killed agent does): etcd expires its lease, and one of
    // the observers records it.
    holder.close();
    CHECK(run(io, reader.get(elastic::lease_lost_key(group, 1))) == "holder");
    CHECK_FALSE(run(io, reader.check({elastic::lease_key(group, "holder")})));
    // A release is a loss as well, recorded next.
    CHECK(run(io, leaver.release_lease()));
    CHECK(run(io, reader.get(elastic::lease_lost_key(group, 2))) == "leaver");
    CHECK(run(io, reader.get(elastic::lease_epoch_key(group))) == "2");
    CHECK(run(io, reader.get(elastic::lease_silent_key(group))) == "0");
    CHECK_FALSE(run(io, reader.check({elastic::lease_lost_key(group, 3)})));
    CHECK(observer.lease_lost().empty());
    observer.close();
    second_observer.close();
}

TEST_CASE("etcd store: a registration whose lease went while nobody observed is recorded by the next holder") {
    etcd_support::cluster etcd(1);
    asio::io_context io;
    auto client = std::make_shared<elastic::etcd_client>(io.get_executor(), options_for(etcd));
    elastic::etcd_store_options short_lease;
    short_lease.keep_alive_interval = 500ms;
    short_lease.keep_alive_max_attempt = 4;
    const std::string group = "job/nodes";
    {
        elastic::etcd_store alone(client, short_lease);
        run(io, alone.hold_lease(elastic::lease_key(group, "alone"), "a"));
        // Revoked behind its holder's back, with nobody observing the group.
        alone.close();
        run(io, client->lease_revoke(alone.lease_id()));
    }
    elastic::etcd_store next(client, short_lease);
    elastic::etcd_store reader(client);
    run(io, next.hold_lease(elastic::lease_key(group, "next"), "n"));
    CHECK(run(io, reader.get(elastic::lease_lost_key(group, 1))) == "alone");
    next.close();
}

TEST_CASE("etcd store: once its own lease is gone, the store's waits end and its operations fail, saying why") {
    etcd_support::cluster etcd(1);
    asio::io_context io;
    auto client = std::make_shared<elastic::etcd_client>(io.get_executor(), options_for(etcd));
    elastic::etcd_store_options short_lease;
    short_lease.keep_alive_interval = 200ms;
    short_lease.keep_alive_max_attempt = 10;
    elastic::etcd_store lease(client, short_lease);
    run(io, lease.hold_lease(elastic::lease_key("g", "me"), "v"));
    auto revoke = [&]() -> asio::awaitable<void> { co_await client->lease_revoke(lease.lease_id()); };
    std::string why;
    const auto never = ks({"never"});
    auto wait = [&]() -> asio::awaitable<void> {
        try {
            co_await lease.wait(never, std::chrono::hours(1));
        } catch (const elastic::store_error& e) {
            why = e.what();
        }
    };
    run(io, [&]() -> asio::awaitable<void> {
        using namespace asio::experimental::awaitable_operators;
        co_await (wait() && revoke());
    }());
    CHECK(has(why, "etcd expired this node's lease 'me'"));
    CHECK(has(lease.lease_lost(), "etcd expired"));
    CHECK(has(error_of(io, lease.set("k", "v")), "etcd expired"));
}

TEST_CASE("etcd client: members that do not answer are left for the next, none answering names each and why") {
    etcd_support::cluster etcd(1);
    asio::io_context io;
    auto o = options_for(etcd);
    const auto dead = closed_port();
    o.endpoints.insert(o.endpoints.begin(), elastic::etcd_endpoint{"127.0.0.1", dead});
    auto client = std::make_shared<elastic::etcd_client>(io.get_executor(), o);
    elastic::etcd_store s(client);
    run(io, s.set("k", "v"));
    CHECK(run(io, s.get("k")) == "v");

    elastic::etcd_options nobody;
    nobody.endpoints = {{"127.0.0.1", dead}, {"127.0.0.1", closed_port()}};
    auto lost = std::make_shared<elastic::etcd_client>(io.get_executor(), nobody);
    const auto why = error_of(io, lost->server_version());
    CHECK(has(why, fmt::format("http://127.0.0.1:{}: cannot connect", dead)));
    CHECK(has(why, "check that etcd runs there"));
    elastic::etcd_store none(lost);
    CHECK(has(error_of(io, none.set("k", "v")), "no etcd member served /v3/kv/put"));
}

TEST_CASE("etcd client: a server that is no etcd, too old, silent, or answers garbage is named, never waited on") {
    asio::io_context io;
    auto client_at = [&](std::uint16_t port) {
        elastic::etcd_options o;
        o.endpoints = {{"127.0.0.1", port}};
        o.request_timeout = 300ms;
        return std::make_shared<elastic::etcd_client>(io.get_executor(), o);
    };
    {
        fake_server v2("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 45\r\n\r\n"
                       "{\"etcdserver\":\"2.3.8\",\"etcdcluster\":\"2.3.0\"}\n");
        CHECK(has(error_of(io, client_at(v2.port())->server_version()), "is version 2.3.8"));
    }
    {
        fake_server not_found("HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 19\r\n\r\n"
                              "404 page not found\n");
        const auto why = error_of(io, client_at(not_found.port())->put("k", "v"));
        CHECK(has(why, "does not serve /v3/kv/put"));
        CHECK(has(why, "404 page not found"));
    }
    {
        fake_server garbage("\x16\x03\x01 this is no HTTP at all\r\n\r\n", true);
        CHECK(has(error_of(io, client_at(garbage.port())->put("k", "v")), "not an HTTP answer"));
    }
    {
        fake_server silent("");
        CHECK(has(error_of(io, client_at(silent.port())->put("k", "v")), "no answer within the read timeout"));
    }
    {
        fake_server closes("", true);
        CHECK(has(error_of(io, client_at(closes.port())->put("k", "v")), "closed before the answer"));
    }
    {
        // An answer larger than any etcd sends: refused at the bound, not held in memory.
        std::string huge = "HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n";
        huge.append(70u << 20, 'x');
        fake_server big(huge, true);
        auto c = client_at(big.port());
        elastic::etcd_options o = c->options();
        o.request_timeout = 20s;
        CHECK(has(error_of(io, std::make_shared<elastic::etcd_client>(io.get_executor(), o)->put("k", "v")),
                  "an answer over 64 MiB"));
    }
    {
        fake_server not_json("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        CHECK(has(error_of(io, client_at(not_json.port())->put("k", "v")), "no JSON object"));
    }
    {
        // A member that breaks the connection while a watch's request is being sent (it closes
        // with the request unread: a reset, which the request's size makes certain to come
        // before the last byte): a member that failed, never an error of another kind.
        fake_server resets("", true);
        elastic::etcd_options o;
        o.endpoints = {{"127.0.0.1", resets.port()}};
        o.request_timeout = 20s;
        auto c = std::make_shared<elastic::etcd_client>(io.get_executor(), o);
        const auto why = error_of(io, c->watch(std::string(32u << 20, 'k'), "", 0));
        CHECK(has(why, "no etcd member served the watch"));
        CHECK(has(why, "cannot send"));
    }
}

TEST_CASE("etcd client: TLS with the cluster's CA and a client certificate, a wrong CA or no certificate is named") {
    test_files::temp_dir dir;
    const auto certs = etcd_support::make_test_certs(dir.path());
    REQUIRE_MESSAGE(certs, certs.error);
    etcd_support::cluster etcd(1, certs.server_options(true));
    asio::io_context io;
    auto o = options_for(etcd);
    o.tls = true;
    o.cacert = certs.ca_cert;
    o.cert = certs.client_cert;
    o.key = certs.client_key;
    auto client = std::make_shared<elastic::etcd_client>(io.get_executor(), o);
    elastic::etcd_store s(client);
    run(io, s.set("secure", "yes"));
    CHECK(run(io, s.get("secure")) == "yes");

    auto wrong_ca = o;
    wrong_ca.cacert = certs.server_cert;  // no CA: the member's certificate does not verify
    const auto why = error_of(io, std::make_shared<elastic::etcd_client>(io.get_executor(), wrong_ca)->put("k", "v"));
    CHECK(has(why, "TLS handshake failed"));
    CHECK(has(why, "cacert"));

    auto no_cert = o;
    no_cert.cert.clear();
    no_cert.key.clear();
    // TLS 1.3: the member's refusal comes as an alert on the first read, after the handshake.
    const auto unsigned_in = error_of(
        io, std::make_shared<elastic::etcd_client>(io.get_executor(), no_cert)->put("k", "v"));
    CHECK(has(unsigned_in, "cert and key"));
    CHECK_FALSE(has(unsigned_in, "connection broke"));

    auto missing = o;
    missing.cacert = dir.path() + "/missing.pem";
    CHECK(has(error_of(io, std::make_shared<elastic::etcd_client>(io.get_executor(), missing)->put("k", "v")),
              "cannot load the TLS files"));

    auto plain = options_for(etcd);  // http to an https member
    CHECK_THROWS_AS(run(io, std::make_shared<elastic::etcd_client>(io.get_executor(), plain)->put("k", "v")),
                    elastic::etcd_error);
}

TEST_CASE("etcd client: a watch whose member is killed ends with an error the store retries at another member") {
    etcd_support::cluster etcd(3);
    asio::io_context io;
    auto client = std::make_shared<elastic::etcd_client>(io.get_executor(), options_for(etcd));
    auto watch = run(io, client->watch("k", "", 0));
    CHECK(watch.endpoint() == fmt::format("http://127.0.0.1:{}", etcd.members()[0].client_port));
    etcd.kill(0);
    try {
        (void)run(io, watch.next());
        FAIL("the watch did not end");
    } catch (const elastic::etcd_error& e) {
        CHECK(e.code() == 14);
        CHECK(has(e.what(), "the watch stream broke"));
    }
    // The next requests go to the members left.
    elastic::etcd_store s(client);
    run(io, s.set("k", "v"));
    CHECK(run(io, s.get("k")) == "v");
}

TEST_CASE("etcd store: three members, the one a wait watches on is killed: the wait goes on at another and is woken") {
    using namespace asio::experimental::awaitable_operators;
    etcd_support::cluster etcd(3);
    asio::io_context io;
    auto client = std::make_shared<elastic::etcd_client>(io.get_executor(), options_for(etcd));
    elastic::etcd_store waiter(client);
    elastic::etcd_store writer(client);
    // The first member serves first: kill it while the wait watches there.
    bool woken = false;
    const auto after = ks({"after"});
    // The wait keeps its own error: were both sides to throw (the writer's error cancels the
    // wait), `&&` would report only "multiple exceptions", hiding which failed and why.
    std::string wait_error;
    auto wait = [&]() -> asio::awaitable<void> {
        try {
            co_await waiter.wait(after, std::chrono::hours(1));
            woken = true;
        } catch (const std::exception& e) {
            wait_error = e.what();
        }
    };
    auto kill_then_write = [&]() -> asio::awaitable<void> {
        co_await writer.set("before", "1");  // the watch of the wait is open by now or soon
        etcd.kill(0);
        co_await writer.set("after", "2");
    };
    run(io, [&]() -> asio::awaitable<void> { co_await (wait() && kill_then_write()); }());
    CHECK_MESSAGE(wait_error.empty(), wait_error);
    CHECK(woken);
    CHECK(run(io, writer.get("after")) == "2");
}
