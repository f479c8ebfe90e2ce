// elastic-store: a standalone TCPStore server for jobs with a dedicated rendezvous host.
// PyTorch workers of any version (1.13 to current) and elastic's own client connect to it.
//   elastic-store --host 0.0.0.0 --port 29400
#include <elastic/store/server.hpp>

#include <CLI/CLI.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
    CLI::App app{"elastic-store: PyTorch's TCPStore protocol (1.13 and current dialects) as a "
                 "standalone server"};
    elastic::store_server_options options;
    app.add_option("--host", options.host, "Address to listen on (\"::\" for dual-stack)")
        ->capture_default_str();
    app.add_option("--port", options.port, "Port to listen on (0 picks a free one)")
        ->capture_default_str();
    app.add_option("--max-connections", options.max_connections,
                   "Connections served at once; more are closed at once and logged")
        ->capture_default_str();
    app.add_option("--max-value-size", options.limits.max_value_size,
                   "Largest value in bytes; a larger one closes that connection")
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    try {
        asio::io_context ctx;
        elastic::tcp_store_server server(ctx.get_executor(), options);
        server.start();
        asio::signal_set signals(ctx, SIGINT, SIGTERM);
        signals.async_wait([&](const std::error_code&, int sig) {
            fmt::print(stderr, "elastic-store: signal {}, stopping\n", sig);
            server.stop();
        });
        const auto ep = server.local_endpoint();
        fmt::print("elastic-store listening on {}:{}\n", ep.address().to_string(), ep.port());
        std::fflush(stdout);
        ctx.run();
        return 0;
    } catch (const std::exception& e) {
        fmt::print(stderr, "elastic-store: {}\n", e.what());
        return 1;
    }
}
