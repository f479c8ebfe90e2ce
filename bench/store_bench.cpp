// store-bench: operations per second and p50/p99 latency of set, get, add and wait-then-set
// with 1, 16 and 256 concurrent clients, against our TCP store server and against PyTorch
// 1.13's own TCPStore server, both driven by the same client (tcp_store_client, legacy
// dialect, one connection per client, all clients on one thread).
//
//   store-bench [--clients 1,16,256] [--ops 20000] [--server ours|torch|both|auth|all]
//               [--python PATH]
//
// --server auth compares our server without and with a secret (store_server_options::secret):
// the handshake is per connection, so it shows in the connection set-up time (the connect
// column: all clients connecting at once, including the handshake), not in the operations.
// --server all runs the three side by side: ours, ours with a secret, PyTorch 1.13's.
//
// Each cell runs about `ops` operations in total (split between the clients) after a warm-up
// of one operation per client; latency is measured per operation on the client.
#include <elastic/store/client.hpp>
#include <elastic/store/server.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <csignal>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#ifndef ELASTIC_TORCH_PYTHON
#define ELASTIC_TORCH_PYTHON "/usr/bin/python3"
#endif

namespace {

using clock_type = std::chrono::steady_clock;

enum class operation { set, get, add, wait_then_set };

const char* name(operation o) {
    switch (o) {
        case operation::set: return "set";
        case operation::get: return "get";
        case operation::add: return "add";
        case operation::wait_then_set: return "wait-then-set";
    }
    return "?";
}

struct result {
    double ops_per_second = 0;
    double p50_us = 0;
    double p99_us = 0;
    double connect_ms = 0;  // all clients connecting at once (and authenticating)
};

// One client's share of a cell: a connection (two for wait-then-set: a waiter and a setter).
asio::awaitable<void> drive(elastic::tcp_store_client& c, elastic::tcp_store_client* setter, operation op, int id,
                            int count, std::vector<double>& latencies) {
    using namespace asio::experimental::awaitable_operators;
    const std::string value(32, 'v');
    const auto key = fmt::format("bench/{}", id);
    if (op == operation::get) co_await c.set(key, value);
    for (int i = -1; i < count; ++i) {  // i = -1: warm-up (connects), not measured
        const auto start = clock_type::now();
        switch (op) {
            case operation::set: co_await c.set(key, value); break;
            case operation::get: (void)co_await c.get(key); break;
            case operation::add: (void)co_await c.add("bench/counter", 1); break;
            case operation::wait_then_set: {
                const auto k = fmt::format("bench/{}/{}", id, i);
                std::vector<std::string> keys(1, k);
                co_await (c.wait(std::move(keys)) && setter->set(k, value));
                break;
            }
        }
        if (i >= 0) latencies.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count());
    }
    // SET has no reply: one round trip at the end makes the cell's time include the server
    // having run every SET (a set's latency is its write alone, as for PyTorch's clients).
    if (op == operation::set) (void)co_await c.check(std::vector<std::string>{});
}

result run_cell(std::uint16_t port, operation op, int clients, int total_ops,
                std::optional<std::string> secret = std::nullopt) {
    asio::io_context ctx(1);
    elastic::store_client_options o;
    o.port = port;
    o.secret = std::move(secret);
    o.dialect = elastic::client_dialect::legacy;  // the dialect both servers speak
    o.timeout = std::chrono::seconds(120);
    std::vector<std::unique_ptr<elastic::tcp_store_client>> cs, setters;
    for (int i = 0; i < clients; ++i) {
        cs.push_back(std::make_unique<elastic::tcp_store_client>(ctx.get_executor(), o));
        if (op == operation::wait_then_set)
            setters.push_back(std::make_unique<elastic::tcp_store_client>(ctx.get_executor(), o));
    }
    const int per_client = std::max(20, total_ops / clients);
    std::vector<std::vector<double>> lat(static_cast<std::size_t>(clients));
    // Connect and warm up first, so the timed part is the operations alone.
    int connected = 0;
    const auto connect_start = clock_type::now();
    for (int i = 0; i < clients; ++i) {
        const auto u = static_cast<std::size_t>(i);
        asio::co_spawn(
            ctx,
            [&, u]() -> asio::awaitable<void> {
                co_await cs[u]->connect();
                if (!setters.empty()) co_await setters[u]->connect();
                ++connected;
            },
            [](std::exception_ptr e) {
                if (e) std::rethrow_exception(e);
            });
    }
    ctx.run();
    const double connect_ms = std::chrono::duration<double, std::milli>(clock_type::now() - connect_start).count();
    if (connected != clients) throw std::runtime_error("not every client connected");
    ctx.restart();
    const auto start = clock_type::now();
    for (int i = 0; i < clients; ++i) {
        const auto u = static_cast<std::size_t>(i);
        asio::co_spawn(ctx, drive(*cs[u], setters.empty() ? nullptr : setters[u].get(), op, i, per_client, lat[u]),
                       [](std::exception_ptr e) {
                           if (e) std::rethrow_exception(e);
                       });
    }
    ctx.run();
    const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    std::vector<double> all;
    for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
    std::sort(all.begin(), all.end());
    result r;
    r.ops_per_second = static_cast<double>(all.size()) / seconds;
    r.p50_us = all[all.size() / 2];
    r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
    r.connect_ms = connect_ms;
    return r;
}

// PyTorch 1.13's server in a Python child; returns {pid, port}.
std::pair<pid_t, std::uint16_t> start_torch_server(const std::string& python, int& stdin_fd) {
    int out[2], in[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    const std::string code = "import sys, datetime\n"
                             "import torch.distributed as d\n"
                             "s = d.TCPStore('127.0.0.1', 0, None, True, datetime.timedelta(seconds=300), "
                             "wait_for_workers=False)\n"
                             "print(s.port, flush=True)\n"
                             "sys.stdin.read()\n";
    std::vector<char*> argv{const_cast<char*>(python.c_str()), const_cast<char*>("-c"), const_cast<char*>(code.c_str()),
                            nullptr};
    pid_t pid = -1;
    if (posix_spawn(&pid, python.c_str(), &fa, nullptr, argv.data(), environ) != 0)
        throw std::runtime_error("cannot start " + python);
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    ::close(in[0]);
    stdin_fd = in[1];
    std::string line;
    char c = 0;
    while (::read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
    ::close(out[0]);
    return {pid, static_cast<std::uint16_t>(std::stoi(line))};
}

std::vector<int> parse_list(const std::string& s) {
    std::vector<int> out;
    std::size_t pos = 0;
    while (pos < s.size()) {
        const auto comma = s.find(',', pos);
        out.push_back(std::stoi(s.substr(pos, comma - pos)));
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<int> clients{1, 16, 256};
    int total_ops = 20000;
    std::string which = "both";
    std::string python = ELASTIC_TORCH_PYTHON;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--clients") clients = parse_list(argv[i + 1]);
        else if (a == "--ops") total_ops = std::stoi(argv[i + 1]);
        else if (a == "--server") which = argv[i + 1];
        else if (a == "--python") python = argv[i + 1];
        else {
            std::fprintf(stderr, "unknown option %s\n", a.c_str());
            return 2;
        }
    }
    std::signal(SIGPIPE, SIG_IGN);

    // Our server on its own thread, as an agent would run it.
    asio::io_context server_ctx(1);
    elastic::store_server_options so;
    so.host = "127.0.0.1";
    elastic::tcp_store_server ours(server_ctx.get_executor(), so);
    ours.start();
    // The same server with a secret (--server auth).
    const std::string secret = "store-bench secret, 32 bytes....";
    elastic::store_server_options sa = so;
    sa.secret = secret;
    elastic::tcp_store_server ours_auth(server_ctx.get_executor(), sa);
    ours_auth.start();
    std::thread server_thread([&] { server_ctx.run(); });

    int torch_stdin = -1;
    pid_t torch_pid = -1;
    std::uint16_t torch_port = 0;
    if (which != "ours" && which != "auth") std::tie(torch_pid, torch_port) = start_torch_server(python, torch_stdin);

    fmt::print("| operation | clients | server | ops/s | p50 µs | p99 µs | connect ms |\n");
    fmt::print("|---|---:|---|---:|---:|---:|---:|\n");
    enum class kind { plain, torch, with_secret };
    std::vector<kind> kinds;
    if (which == "auth") kinds = {kind::plain, kind::with_secret};
    else if (which == "ours") kinds = {kind::plain};
    else if (which == "torch") kinds = {kind::torch};
    else if (which == "all") kinds = {kind::plain, kind::with_secret, kind::torch};
    else kinds = {kind::plain, kind::torch};
    for (const auto op : {operation::set, operation::get, operation::add, operation::wait_then_set}) {
        for (const int n : clients) {
            for (const auto k : kinds) {
                const auto r = k == kind::torch         ? run_cell(torch_port, op, n, total_ops)
                               : k == kind::with_secret ? run_cell(ours_auth.port(), op, n, total_ops, secret)
                                                        : run_cell(ours.port(), op, n, total_ops);
                fmt::print("| {} | {} | {} | {:.0f} | {:.0f} | {:.0f} | {:.1f} |\n", name(op), n,
                           k == kind::torch         ? "PyTorch 1.13"
                           : k == kind::with_secret ? "elastic, secret"
                                                    : "elastic",
                           r.ops_per_second, r.p50_us, r.p99_us, r.connect_ms);
                std::fflush(stdout);
            }
        }
    }

    asio::post(server_ctx, [&] {
        ours.stop();
        ours_auth.stop();
    });
    server_thread.join();
    if (torch_pid > 0) {
        ::close(torch_stdin);
        int status = 0;
        ::waitpid(torch_pid, &status, 0);
    }
    return 0;
}
