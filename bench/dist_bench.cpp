// dist-bench: the latency of elastic::dist's collectives, one rank per process, over our TCP store
// on loopback. bench/dist/bench_dist.py drives it (and the same operations through PyTorch's gloo
// ProcessGroup on the same store) and prints the table in docs/dist.md.
//
//   dist-bench serve              hosts our store on 127.0.0.1, prints "port N", serves until
//                                 its standard input ends
//   dist-bench run ITERATIONS     one rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the
//                                 environment); rank 0 prints "<operation> <microseconds>" lines
//
// Each operation runs a few times to warm up, then ITERATIONS times (a tenth of them, at least 3,
// for the 1 MiB ones) followed by a barrier; the figure is rank 0's wall time for that loop
// divided by the count: what one operation costs a job that issues them back to back.
#include <elastic/dist.hpp>
#include <elastic/store/server.hpp>

#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/read.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

namespace dist = elastic::dist;

int serve() {
    asio::io_context ctx;
    elastic::store_server_options o;
    o.host = "127.0.0.1";
    elastic::tcp_store_server server(ctx.get_executor(), o);
    server.start();
    fmt::print("port {}\n", server.port());
    std::fflush(stdout);
    // Until the driver closes our standard input.
    asio::posix::stream_descriptor in(ctx, ::dup(0));
    char byte = 0;
    in.async_read_some(asio::buffer(&byte, 1), [&](std::error_code, std::size_t) { ctx.stop(); });
    ctx.run();
    return 0;
}

template <class F>
double per_operation_us(int iterations, F op) {
    for (int i = 0; i < 3; ++i) op();
    dist::barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) op();
    dist::barrier();
    const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - t0;
    return took.count() / iterations;
}

int run(int iterations) {
    const int rank = dist::get_global_rank();
    const int big = std::max(3, iterations / 10);
    const std::string kib(1024, 'k');
    const std::string mib(std::size_t{1} << 20, 'm');
    std::vector<float> floats(std::size_t{1} << 18, 1.0f);  // 1 MiB
    struct row {
        const char* name;
        double us;
    };
    std::vector<row> rows;
    rows.push_back({"barrier", per_operation_us(iterations, [] { dist::barrier(); })});
    rows.push_back({"broadcast_1KiB", per_operation_us(iterations, [&] { (void)dist::broadcast(kib, 0); })});
    rows.push_back({"broadcast_1MiB", per_operation_us(big, [&] { (void)dist::broadcast(mib, 0); })});
    rows.push_back({"all_gather_1KiB", per_operation_us(iterations, [&] { (void)dist::all_gather(kib); })});
    rows.push_back({"all_reduce_scalar", per_operation_us(iterations, [&] { (void)dist::all_reduce(1.0 * rank); })});
    rows.push_back({"all_reduce_1MiB", per_operation_us(big, [&] { dist::all_reduce(floats); })});
    if (rank == 0)
        for (const auto& r : rows) fmt::print("{} {:.1f}\n", r.name, r.us);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string what = argc > 1 ? argv[1] : "";
    try {
        if (what == "serve") return serve();
        if (what == "run" && argc > 2) return run(std::max(1, std::atoi(argv[2])));
    } catch (const std::exception& e) {
        fmt::print(stderr, "dist-bench: {}\n", e.what());
        return 1;
    }
    fmt::print(stderr, "usage: dist-bench serve | dist-bench run ITERATIONS\n");
    return 2;
}
