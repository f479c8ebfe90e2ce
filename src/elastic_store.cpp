// elastic-store: a standalone TCPStore server for jobs with a dedicated rendezvous host.
// PyTorch workers of any version (1.13 to current) and elastic's own client connect to it.
//   elastic-store --host 0.0.0.0 --port 29400
#include <elastic/process/sys.hpp>
#include <elastic/store/server.hpp>

#include <CLI/CLI.hpp>
#include <asio/io_context.hpp>
#include <asio/signal_set.hpp>
#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
    CLI::App app{"elastic-store: PyTorch's TCPStore protocol (1.13 and current dialects) as a "
                 "standalone server"};
    elastic::store_server_options options;
    // Loopback unless told otherwise: a store reachable from the network is a choice, and
    // anyone who reaches it can read and write every key.
    options.host = "127.0.0.1";
    app.add_option("--host", options.host,
                   "Address to listen on: 0.0.0.0 or \"::\" (dual-stack) for every interface, or "
                   "one address or host name")
        ->capture_default_str();
    app.add_option("--port", options.port, "Port to listen on (0 picks a free one)")->capture_default_str();
    app.add_option("--max-connections", options.max_connections,
                   "Connections served at once; more are closed at once and logged")
        ->capture_default_str();
    app.add_option("--max-value-size", options.limits.max_value_size,
                   "Largest value in bytes; a larger one closes that connection")
        ->capture_default_str();
    app.add_option("--max-memory", options.max_memory,
                   "Bytes the server may hold (keys, values, requests, replies); a request past "
                   "it is refused and its connection closed")
        ->capture_default_str();
    app.add_option("--max-reply-size", options.max_reply_size,
                   "Largest reply one request may ask for (MULTI_GET, LIST_KEYS)")
        ->capture_default_str();
    app.add_option("--max-queued-output", options.max_queued_output,
                   "Unread replies and notifications queued for one client before it is "
                   "disconnected")
        ->capture_default_str();
    std::int64_t request_timeout_ms = options.request_timeout.count();
    std::int64_t idle_timeout_ms = options.idle_timeout.count();
    app.add_option("--request-timeout-ms", request_timeout_ms,
                   "A request begun must arrive, and a reply be taken, within this (0: never)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    app.add_option("--idle-timeout-ms", idle_timeout_ms,
                   "Close connections silent this long that hold no WAIT, watch or lease (0: "
                   "never; PyTorch clients keep idle connections for a whole job)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    CLI11_PARSE(app, argc, argv);
    options.request_timeout = std::chrono::milliseconds(request_timeout_ms);
    options.idle_timeout = std::chrono::milliseconds(idle_timeout_ms);
    // One descriptor per client: take the hard limit, not the shell's soft 1024.
    const auto open_files = elastic::detail::process::raise_open_files_limit();
    if (open_files != 0 && options.max_connections + 16 > open_files)
        fmt::print(stderr,
                   "elastic-store: the open-files limit ({}) is below --max-connections ({}); "
                   "past it, connections that never sent a request make room for new clients "
                   "and others are refused (raise `ulimit -Hn` to serve more)\n",
                   open_files, options.max_connections);

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
