// A store server on 127.0.0.1 and a free port, printed on stdout; exits 0 on SIGTERM (the idle
// CPU test measures this process). Options for the hostile-client tests:
//   --open-files N        the process's open-files limit, soft and hard (as `ulimit -n N`)
//   --max-memory BYTES    store_server_options::max_memory
//   --shed-unused-after-ms N
//   --lease-heartbeat-ms N, --lease-missed N   store_server_options::lease_heartbeat_interval,
//                         lease_missed_heartbeats
#include <elastic/store/server.hpp>

#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <string_view>

#include <sys/resource.h>

int main(int argc, char** argv) {
    elastic::store_server_options options;
    options.host = "127.0.0.1";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string_view flag = argv[i];
        const auto value = std::stoull(argv[i + 1]);
        if (flag == "--open-files") {
            const rlimit limit{value, value};
            if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return 3;
        } else if (flag == "--max-memory") {
            options.max_memory = value;
        } else if (flag == "--shed-unused-after-ms") {
            options.shed_unused_after = std::chrono::milliseconds(value);
        } else if (flag == "--lease-heartbeat-ms") {
            options.lease_heartbeat_interval = std::chrono::milliseconds(value);
        } else if (flag == "--lease-missed") {
            options.lease_missed_heartbeats = static_cast<unsigned>(value);
        } else {
            fmt::print(stderr, "store-server: unknown option {}\n", flag);
            return 2;
        }
    }
    asio::io_context ctx;
    elastic::tcp_store_server server(ctx.get_executor(), options);
    server.start();
    asio::signal_set signals(ctx, SIGTERM, SIGINT);
    signals.async_wait([&](const std::error_code&, int) { server.stop(); });
    fmt::print("{}\n", server.port());
    std::fflush(stdout);
    ctx.run();
    return 0;
}
