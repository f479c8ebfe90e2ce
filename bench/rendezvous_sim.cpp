// rdzv-sim: the c10d rendezvous at a scale one machine cannot host as processes. N simulated
// agents are coroutines on one thread, each with the three connections a real agent opens (its
// requests, its long waits, its lease) and the real store_rendezvous over them, against the
// real store server on a thread of its own. No workers: what is measured is the rendezvous.
//
//   rdzv-sim --agents N [--keep-alive-ms 1000] [--missed 5] [--hold-s 5] [--cycles 3]
//
// Phases, each timed and with the server's requests by kind and its CPU time:
//   form       every agent connects, takes its lease and joins: first connect -> every agent in
//              the first round
//   hold       --hold-s seconds of a formed round: heartbeats only (server CPU per heartbeat)
//   loss       one agent's connections close (a killed agent): -> the N-1 others in a new round
//   scale-up   a new agent starts: -> all N in a new round
// `loss` and `scale-up` repeat --cycles times; the server's key count and memory after each
// cycle show whether anything grows per round.
//
// Elastic membership (MIN = N/2, MAX = N), the split guard on (an agent-hosted store's
// default). Connections go to 127.0.0.1, 127.0.0.2, ... (the server listens on 0.0.0.0), as
// many addresses as the ephemeral port range needs; the open-files limit is raised to fit.
#include <elastic/rendezvous/store_rendezvous.hpp>
#include <elastic/store/client.hpp>
#include <elastic/store/server.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

namespace {

using clock_type = std::chrono::steady_clock;
using client = elastic::tcp_store_client;
using rendezvous = elastic::store_rendezvous<client>;

struct settings {
    int agents = 1000;
    std::chrono::milliseconds keep_alive{1000};
    unsigned missed = 5;
    int hold_s = 5;
    int cycles = 3;
};

[[noreturn]] void usage(std::string_view why) {
    std::fprintf(stderr,
                 "rdzv-sim: %.*s\nusage: rdzv-sim --agents N [--keep-alive-ms MS] [--missed K] [--hold-s S] "
                 "[--cycles C]\n",
                 static_cast<int>(why.size()), why.data());
    std::exit(2);
}

long parse_number(std::string_view flag, const char* text, long low, long high) {
    char* end = nullptr;
    errno = 0;
    const long value = std::strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < low || value > high) {
        usage(fmt::format("{} wants a whole number from {} to {}, not '{}'", flag, low, high, text));
    }
    return value;
}

settings parse(int argc, char** argv) {
    settings s;
    for (int i = 1; i < argc; ++i) {
        const std::string_view flag = argv[i];
        if (i + 1 >= argc) usage(fmt::format("{} wants a value", flag));
        const char* value = argv[++i];
        if (flag == "--agents") s.agents = static_cast<int>(parse_number(flag, value, 2, 1000000));
        else if (flag == "--keep-alive-ms")
            s.keep_alive = std::chrono::milliseconds(parse_number(flag, value, 10, 600000));
        else if (flag == "--missed") s.missed = static_cast<unsigned>(parse_number(flag, value, 1, 1000));
        else if (flag == "--hold-s") s.hold_s = static_cast<int>(parse_number(flag, value, 0, 3600));
        else if (flag == "--cycles") s.cycles = static_cast<int>(parse_number(flag, value, 0, 10000));
        else usage(fmt::format("unknown option {}", flag));
    }
    return s;
}

// The open-files limit, raised to `want` (root may raise the hard limit too).
void raise_open_files(std::size_t want) {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
    if (limit.rlim_cur >= want) return;
    limit.rlim_cur = want;
    if (limit.rlim_max < want) limit.rlim_max = want;
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
        std::fprintf(stderr, "rdzv-sim: cannot raise the open-files limit to %zu (%s): run as root or lower --agents\n",
                     want, std::strerror(errno));
        std::exit(2);
    }
}

double cpu_seconds(clockid_t clock) {
    timespec t{};
    ::clock_gettime(clock, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

constexpr std::size_t op_kinds = 32;
std::array<std::atomic<std::uint64_t>, op_kinds> requests{};

std::array<std::uint64_t, op_kinds> snapshot() {
    std::array<std::uint64_t, op_kinds> out{};
    for (std::size_t i = 0; i < op_kinds; ++i) out[i] = requests[i].load(std::memory_order_relaxed);
    return out;
}

std::string describe_requests(const std::array<std::uint64_t, op_kinds>& before,
                              const std::array<std::uint64_t, op_kinds>& after, int per) {
    static constexpr const char* names[] = {"validate",   "set",       "compare_set", "get",         "add",
                                            "check",      "wait",      "num_keys",    "watch_key",   "delete_key",
                                            "append",     "multi_get", "multi_set",   "cancel_wait", "ping",
                                            "queue_push", "queue_pop", "queue_len",   "list_keys",   "barrier"};
    std::string text;
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < op_kinds; ++i) {
        const auto n = after[i] - before[i];
        if (n == 0) continue;
        total += n;
        const char* name = i < std::size(names) ? names[i] : "?";
        text += fmt::format("{}{} {}", text.empty() ? "" : ", ", name, n);
    }
    return fmt::format("{} requests ({:.1f} per agent: {})", total, static_cast<double>(total) / per, text);
}

// One simulated agent: the three connections and the rendezvous over them.
struct agent {
    std::unique_ptr<client> store;
    std::unique_ptr<client> watcher;
    std::unique_ptr<client> lease;
    std::unique_ptr<rendezvous> rdzv;
    int round = -1;
    bool alive = true;
    std::string failed;
};

// Counts which round every live agent is in, and wakes the coordinator on each change.
struct progress {
    explicit progress(const asio::any_io_executor& ex) : changed(ex, clock_type::time_point::max()) {}
    std::map<int, int> in_round;  // round -> live agents whose latest round it is
    asio::steady_timer changed;
    void moved(int from, int to) {
        if (from >= 0 && --in_round[from] == 0) in_round.erase(from);
        if (to >= 0) ++in_round[to];
        changed.cancel();
    }
};

class simulation {
public:
    simulation(asio::io_context& io, settings s, std::uint16_t port, int addresses)
        : io_(io), settings_(s), port_(port), addresses_(addresses), progress_(io.get_executor()) {}

    // Starts agent `index` (its coroutine runs until its connections close).
    void start(std::size_t index) {
        if (agents_.size() <= index) agents_.resize(index + 1);
        auto& a = agents_[index];
        a = std::make_unique<agent>();
        const auto connection = [&](int which) {
            elastic::store_client_options o;
            o.host = fmt::format("127.0.0.{}", 1 + (static_cast<int>(index) * 3 + which) % addresses_);
            o.port = port_;
            o.dialect = elastic::client_dialect::current;
            o.lease_heartbeat_interval = settings_.keep_alive;
            o.lease_missed_heartbeats = settings_.missed;
            o.timeout = std::chrono::minutes(30);
            o.connect_timeout = std::chrono::minutes(5);
            return std::make_unique<client>(io_.get_executor(), o);
        };
        a->store = connection(0);
        a->watcher = connection(1);
        a->lease = connection(2);
        elastic::store_rendezvous_options o;
        o.run_id = "sim";
        o.nnodes = settings_.agents;
        o.min_nodes = std::max(1, settings_.agents / 2);
        o.join_timeout = std::chrono::minutes(30);
        o.last_call_timeout = std::chrono::seconds(30);
        a->rdzv = std::make_unique<rendezvous>(*a->store, *a->watcher, o);
        asio::co_spawn(io_, run(index), asio::detached);
    }

    // Closes agent `index`'s connections, as its process's death would.
    void kill(std::size_t index) {
        auto& a = *agents_[index];
        a.alive = false;
        progress_.moved(a.round, -1);
        a.store->close();
        a.watcher->close();
        a.lease->close();
    }

    // Waits until every live agent is in one round newer than `after`; returns it.
    asio::awaitable<int> all_in_a_round_after(int after) {
        for (;;) {
            const int live = live_agents();
            for (const auto& [r, n] : progress_.in_round) {
                if (r > after && n == live) co_return r;
            }
            progress_.changed.expires_at(clock_type::time_point::max());
            std::error_code ec;
            co_await progress_.changed.async_wait(asio::redirect_error(asio::use_awaitable, ec));
            if (!failures_.empty()) throw std::runtime_error(failures_);
        }
    }

    int live_agents() const {
        int n = 0;
        for (const auto& a : agents_) n += a && a->alive ? 1 : 0;
        return n;
    }

private:
    asio::awaitable<void> run(std::size_t index) {
        auto& a = *agents_[index];
        elastic::node_info me;
        me.host = fmt::format("sim{}", index);
        me.store_addr = "127.0.0.1";
        me.store_port = 29500;
        me.pid = static_cast<long>(index) + 1;
        me.id = fmt::format("a{}", index);
        try {
            co_await a.rdzv->start_liveness(*a.lease, me);
            asio::co_spawn(io_, a.rdzv->keep_membership(), asio::detached);
            for (;;) {
                const auto round = co_await a.rdzv->next_round(me);
                const int from = std::exchange(a.round, round.number);
                if (a.alive) progress_.moved(from, a.round);
                (void)co_await a.rdzv->wait_for_abort();
            }
        } catch (const std::exception& e) {
            if (a.alive) {
                failures_ += fmt::format("agent {}: {}\n", index, e.what());
                progress_.changed.cancel();
            }
        }
    }

    asio::io_context& io_;
    settings settings_;
    std::uint16_t port_;
    int addresses_;
    std::vector<std::unique_ptr<agent>> agents_;
    progress progress_;
    std::string failures_;
};

struct server_side {
    asio::io_context io;
    std::unique_ptr<elastic::tcp_store_server> server;
    std::thread thread;
    clockid_t cpu_clock{};
};

}  // namespace

int main(int argc, char** argv) {
    const settings s = parse(argc, argv);
    const auto connections = static_cast<std::size_t>(s.agents + 1) * 3;
    raise_open_files(connections * 2 + 1024);
    // Each (source, destination) address pair offers the ephemeral port range once.
    const int addresses = static_cast<int>(std::min<std::size_t>(250, connections / 20000 + 1));

    server_side side;
    elastic::store_server_options so;
    so.host = "0.0.0.0";
    so.max_connections = connections + 64;
    so.max_memory = std::size_t{16} << 30;
    so.lease_heartbeat_interval = s.keep_alive;
    so.lease_missed_heartbeats = s.missed;
    so.on_request = [](elastic::wire::op op) {
        const auto i = static_cast<std::size_t>(op);
        if (i < op_kinds) requests[i].fetch_add(1, std::memory_order_relaxed);
    };
    side.server = std::make_unique<elastic::tcp_store_server>(side.io.get_executor(), so);
    side.server->start();
    const std::uint16_t port = side.server->port();
    side.thread = std::thread([&side] {
        auto guard = asio::make_work_guard(side.io);
        side.io.run();
    });
    ::pthread_getcpuclockid(side.thread.native_handle(), &side.cpu_clock);

    // What the server holds, read on its own thread.
    struct held {
        std::size_t memory = 0;
        std::size_t keys = 0;
        std::size_t engine = 0;
        std::size_t awaited = 0;
        std::size_t connections = 0;
        std::string largest;
    };
    const auto server_state = [&side] {
        std::promise<held> done;
        auto future = done.get_future();
        asio::post(side.io, [&] {
            held h;
            h.memory = side.server->memory();
            h.connections = side.server->connections();
            auto& engine = side.server->engine();
            h.keys = engine.size();
            h.engine = engine.bytes();
            h.awaited = engine.awaited_keys();
            std::vector<std::pair<std::size_t, std::string>> sizes;
            engine.for_each([&](std::string_view k, std::string_view v) { sizes.emplace_back(v.size(), k); });
            std::sort(sizes.rbegin(), sizes.rend());
            for (std::size_t i = 0; i < std::min<std::size_t>(3, sizes.size()); ++i)
                h.largest += fmt::format("{}{} ({} B)", i ? ", " : "", sizes[i].second, sizes[i].first);
            done.set_value(std::move(h));
        });
        return future.get();
    };

    asio::io_context io;
    simulation sim(io, s, port, addresses);
    int status = 0;
    std::printf("rdzv-sim: %d agents, %zu connections over %d loopback addresses, keep-alive %lld ms x %u\n", s.agents,
                connections, addresses, static_cast<long long>(s.keep_alive.count()), s.missed);
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
            const auto phase = [&](const char* name, auto body) -> asio::awaitable<void> {
                const auto before = snapshot();
                const double cpu0 = cpu_seconds(side.cpu_clock);
                const auto t0 = clock_type::now();
                co_await body();
                const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
                const double cpu = cpu_seconds(side.cpu_clock) - cpu0;
                const held h = server_state();
                std::printf("%-9s %10.1f ms  server CPU %8.1f ms  keys %zu  memory %.2f MiB (%.0f B per agent; "
                            "keys and waits %.2f MiB, awaited keys %zu, connections %zu)\n  %s\n  largest values: %s\n",
                            name, ms, cpu * 1e3, h.keys, static_cast<double>(h.memory) / (1 << 20),
                            static_cast<double>(h.memory) / sim.live_agents(),
                            static_cast<double>(h.engine) / (1 << 20), h.awaited, h.connections,
                            describe_requests(before, snapshot(), sim.live_agents()).c_str(), h.largest.c_str());
                std::fflush(stdout);
            };
            int round = -1;
            co_await phase("form", [&]() -> asio::awaitable<void> {
                for (int i = 0; i < s.agents; ++i) sim.start(static_cast<std::size_t>(i));
                round = co_await sim.all_in_a_round_after(-1);
            });
            co_await phase("hold", [&]() -> asio::awaitable<void> {
                asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::seconds(s.hold_s));
                co_await t.async_wait(asio::use_awaitable);
            });
            std::size_t next = static_cast<std::size_t>(s.agents);
            for (int c = 0; c < s.cycles; ++c) {
                co_await phase("loss", [&]() -> asio::awaitable<void> {
                    sim.kill(static_cast<std::size_t>(c));  // the lowest agents go first
                    round = co_await sim.all_in_a_round_after(round);
                });
                co_await phase("scale-up", [&]() -> asio::awaitable<void> {
                    sim.start(next++);
                    round = co_await sim.all_in_a_round_after(round);
                });
            }
        },
        [&](std::exception_ptr e) {
            if (e) {
                try {
                    std::rethrow_exception(e);
                } catch (const std::exception& x) {
                    std::fprintf(stderr, "rdzv-sim: %s\n", x.what());
                }
                status = 1;
            }
            io.stop();
        });
    io.run();
    std::fflush(stdout);
    // Hundreds of thousands of connections and coroutines: let the kernel take them.
    std::_Exit(status);
}
