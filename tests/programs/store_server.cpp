// A store server on 127.0.0.1 and a free port, printed on stdout; exits 0 on SIGTERM (the idle
// CPU test measures this process).
#include <elastic/store/server.hpp>

#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <fmt/format.h>

#include <csignal>
#include <cstdio>

int main() {
    asio::io_context ctx;
    elastic::store_server_options options;
    options.host = "127.0.0.1";
    elastic::tcp_store_server server(ctx.get_executor(), options);
    server.start();
    asio::signal_set signals(ctx, SIGTERM, SIGINT);
    signals.async_wait([&](const std::error_code&, int) { server.stop(); });
    fmt::print("{}\n", server.port());
    std::fflush(stdout);
    ctx.run();
    return 0;
}
