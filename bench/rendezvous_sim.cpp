// rdzv-sim: the c10d rendezvous at a scale one machine cannot host as processes. N simulated
// agents are coroutines on one thread, each with the three connections a real agent opens (its
// requests, its long waits, its lease) and the real store_rendezvous over them, against the
// real store server in a process of its own (as the store's host is another process than most
// agents). No workers: what is measured is the rendezvous.
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
// many addresses as the ephemeral port range needs; each process raises its open-files limit to
// fit its end of the 3 (N + 1) connections.
#include <elastic/rendezvous/store_rendezvous.hpp>
#include <elastic/store/client.hpp>
#include <elastic/store/server.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/read.hpp>
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
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
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

// The open-files limit, raised to `want` (above the hard limit only with CAP_SYS_RESOURCE).
void raise_open_files(std::size_t want, int agents) {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
    if (limit.rlim_cur >= want) return;
    const rlim_t hard = limit.rlim_max;
    limit.rlim_cur = want;
    if (limit.rlim_max < want) limit.rlim_max = want;
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) {
        std::fprintf(stderr,
                     "rdzv-sim: %d agents need %zu open files in each process (the simulation and the server each "
                     "hold one end of every connection), and the limit cannot be raised there (%s; hard limit %llu): "
                     "lower --agents, or raise the hard limit (a process with CAP_SYS_RESOURCE, or limits.conf)\n",
                     agents, want, std::strerror(errno), static_cast<unsigned long long>(hard));
        std::exit(2);
    }
}

double cpu_seconds(clockid_t clock) {
    timespec t{};
    ::clock_gettime(clock, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

constexpr std::size_t op_kinds = 32;
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "the counters are shared between processes");

// What the server holds, as its process reports it.
struct held {
    std::size_t memory = 0;
    std::size_t keys = 0;
    std::size_t engine = 0;
    std::size_t awaited = 0;
    std::size_t connections = 0;
    std::array<char, 512> largest{};  // its three largest values, NUL-terminated
};

// What the server process shares with the simulation: its request counts, kept as it serves,
// and what it holds, written when asked (one byte on a pipe) and announced by one byte back.
struct shared_block {
    std::array<std::atomic<std::uint64_t>, op_kinds> requests{};
    std::uint16_t port = 0;
    held state;
};

shared_block* shared = nullptr;

std::array<std::uint64_t, op_kinds> snapshot() {
    std::array<std::uint64_t, op_kinds> out{};
    for (std::size_t i = 0; i < op_kinds; ++i) out[i] = shared->requests[i].load(std::memory_order_relaxed);
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

// The server process: serves until the simulation closes its end of the `ask` pipe (or dies:
// the parent-death signal). Writes the port to `shared`, then one byte to `told`.
[[noreturn]] void serve(const settings& s, std::size_t connections, int ask, int told) {
    asio::io_context io;
    elastic::store_server_options so;
    so.host = "0.0.0.0";
    so.make_room_for(connections);  // as an agent's store sizes itself for its job
    so.lease_heartbeat_interval = s.keep_alive;
    so.lease_missed_heartbeats = s.missed;
    so.on_request = [](elastic::wire::op op) {
        const auto i = static_cast<std::size_t>(op);
        if (i < op_kinds) shared->requests[i].fetch_add(1, std::memory_order_relaxed);
    };
    elastic::tcp_store_server server(io.get_executor(), so);
    server.start();
    shared->port = server.port();
    const auto tell = [told] {
        const char byte = 1;
        if (::write(told, &byte, 1) != 1) std::_Exit(1);
    };
    tell();
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
            asio::posix::stream_descriptor asked(io, ask);
            for (;;) {
                char byte = 0;
                std::error_code ec;
                co_await asio::async_read(asked, asio::buffer(&byte, 1), asio::redirect_error(asio::use_awaitable, ec));
                if (ec) break;  // the simulation ended
                held& h = shared->state;
                h.memory = server.memory();
                h.connections = server.connections();
                auto& engine = server.engine();
                h.keys = engine.size();
                h.engine = engine.bytes();
                h.awaited = engine.awaited_keys();
                std::vector<std::pair<std::size_t, std::string>> sizes;
                engine.for_each([&](std::string_view k, std::string_view v) { sizes.emplace_back(v.size(), k); });
                std::sort(sizes.rbegin(), sizes.rend());
                std::string largest;
                for (std::size_t i = 0; i < std::min<std::size_t>(3, sizes.size()); ++i)
                    largest += fmt::format("{}{} ({} B)", i ? ", " : "", sizes[i].second, sizes[i].first);
                const auto n = std::min(largest.size(), h.largest.size() - 1);
                std::memcpy(h.largest.data(), largest.data(), n);
                h.largest[n] = '\0';
                tell();
            }
            io.stop();
        },
        asio::detached);
    io.run();
    std::_Exit(0);
}

// The server process's resident memory, from /proc/PID/status, in KiB (0 when unreadable).
long server_resident_kib(pid_t pid) {
    const std::string path = fmt::format("/proc/{}/status", pid);
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) return 0;
    char line[256];
    long kib = 0;
    while (std::fgets(line, sizeof line, f) != nullptr) {
        if (std::sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
    }
    std::fclose(f);
    return kib;
}

}  // namespace

int main(int argc, char** argv) {
    const settings s = parse(argc, argv);
    const auto connections = static_cast<std::size_t>(s.agents + 1) * 3;
    raise_open_files(connections + 1024, s.agents);
    // Each (source, destination) address pair offers the ephemeral port range once, and the
    // kernel's search for a free port in it grows with the connections the pair already has:
    // with all 18,000 connections of 6,000 agents on one pair, that search took a quarter of the
    // simulation's CPU while they formed (real agents on hosts of their own have their own
    // ports). So about 1,000 connections per pair, up to 250 addresses.
    const int addresses = static_cast<int>(std::min<std::size_t>(250, connections / 1000 + 1));

    // A server process that died is reported by the failed write, not a SIGPIPE.
    ::signal(SIGPIPE, SIG_IGN);
    void* block = ::mmap(nullptr, sizeof(shared_block), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) {
        std::fprintf(stderr, "rdzv-sim: cannot map the shared counters: %s\n", std::strerror(errno));
        return 2;
    }
    shared = new (block) shared_block{};
    int ask[2];
    int told[2];
    if (::pipe2(ask, O_CLOEXEC) != 0 || ::pipe2(told, O_CLOEXEC) != 0) {
        std::fprintf(stderr, "rdzv-sim: pipe2: %s\n", std::strerror(errno));
        return 2;
    }
    std::fflush(nullptr);
    const pid_t parent = ::getpid();
    const pid_t server_pid = ::fork();
    if (server_pid < 0) {
        std::fprintf(stderr, "rdzv-sim: fork: %s\n", std::strerror(errno));
        return 2;
    }
    if (server_pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (::getppid() != parent) std::_Exit(1);
        ::close(ask[1]);
        ::close(told[0]);
        serve(s, connections, ask[0], told[1]);
    }
    ::close(ask[0]);
    ::close(told[1]);
    const auto end_server = [&] {
        ::kill(server_pid, SIGKILL);
        int ignored = 0;
        ::waitpid(server_pid, &ignored, 0);
    };
    // One byte back: the server answered (or, at the start, listens).
    const auto await_server = [&] {
        char byte = 0;
        if (::read(told[0], &byte, 1) != 1) {
            int status = 0;
            ::waitpid(server_pid, &status, 0);
            std::fprintf(stderr, "rdzv-sim: the server process ended (wait status %d)\n", status);
            std::_Exit(1);
        }
    };
    await_server();
    const std::uint16_t port = shared->port;
    clockid_t server_clock{};
    if (::clock_getcpuclockid(server_pid, &server_clock) != 0) {
        std::fprintf(stderr, "rdzv-sim: no CPU clock for the server process\n");
        end_server();
        return 1;
    }
    const long idle_kib = server_resident_kib(server_pid);  // the server process before any agent

    const auto server_state = [&] {
        const char byte = 1;
        if (::write(ask[1], &byte, 1) != 1) {
            std::fprintf(stderr, "rdzv-sim: cannot ask the server process: %s\n", std::strerror(errno));
            std::_Exit(1);
        }
        await_server();
        return shared->state;
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
                const double cpu0 = cpu_seconds(server_clock);
                const auto t0 = clock_type::now();
                co_await body();
                const double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
                const double cpu = cpu_seconds(server_clock) - cpu0;
                const held h = server_state();
                const long resident_kib = server_resident_kib(server_pid);
                std::printf("%-9s %10.1f ms  server CPU %8.1f ms  keys %zu  memory %.2f MiB (%.0f B per agent; "
                            "keys and waits %.2f MiB, awaited keys %zu, connections %zu; server process resident "
                            "%.1f MiB, %.1f KiB per agent over its idle %.1f MiB)\n  %s\n  largest values: %s\n",
                            name, ms, cpu * 1e3, h.keys, static_cast<double>(h.memory) / (1 << 20),
                            static_cast<double>(h.memory) / sim.live_agents(),
                            static_cast<double>(h.engine) / (1 << 20), h.awaited, h.connections,
                            static_cast<double>(resident_kib) / 1024,
                            static_cast<double>(resident_kib - idle_kib) / sim.live_agents(),
                            static_cast<double>(idle_kib) / 1024,
                            describe_requests(before, snapshot(), sim.live_agents()).c_str(), h.largest.data());
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
    end_server();
    // Hundreds of thousands of connections and coroutines: let the kernel take them.
    std::_Exit(status);
}
