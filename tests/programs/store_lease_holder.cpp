// Holds a lease in a store and keeps it by heartbeats until killed: the agent whose death the
// lease tests observe. Usage: store-lease-holder PORT KEY VALUE [INTERVAL_MS]. Prints "held"
// once the server has the lease; if the connection is lost it prints "lost: <reason>" and
// exits 3.
#include <elastic/store/client.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

int main(int argc, char** argv) {
    if (argc < 4) {
        fmt::print(stderr, "usage: store-lease-holder PORT KEY VALUE [INTERVAL_MS]\n");
        return 2;
    }
    asio::io_context ctx;
    elastic::store_client_options o;
    o.host = "127.0.0.1";
    o.port = static_cast<std::uint16_t>(std::stoi(argv[1]));
    if (argc > 4) o.lease_heartbeat_interval = std::chrono::milliseconds(std::stoi(argv[4]));
    elastic::tcp_store_client client(ctx.get_executor(), o);
    int rc = 0;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
            co_await client.hold_lease(argv[2], argv[3]);
            fmt::print("held\n");
            std::fflush(stdout);
            const auto loss = co_await client.connection_lost();
            fmt::print("lost: {}\n", loss.reason);
            std::fflush(stdout);
            rc = 3;
        },
        [&](std::exception_ptr e) {
            if (!e) return;
            try {
                std::rethrow_exception(e);
            } catch (const std::exception& ex) {
                fmt::print("error: {}\n", ex.what());
                rc = 1;
            }
        });
    ctx.run();
    return rc;
}
