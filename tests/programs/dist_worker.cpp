// A native worker using elastic::dist from its environment (RANK, WORLD_SIZE, MASTER_ADDR, ...):
// `dist-worker <scenario> [timeout_ms]`. Prints what it saw; exits 0 when every rank's view
// checked out, 1 on a wrong value, 3 on dist_timeout (after printing the missing ranks).
#include <elastic/dist.hpp>
#include <elastic/store/blocking_client.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {

namespace dist = elastic::dist;

std::string pattern(std::size_t size) {
    std::string s(size, '\0');
    for (std::size_t j = 0; j < size; ++j) s[j] = static_cast<char>((j * 7 + 13) & 0xff);
    return s;
}

std::string gather_payload(int rank) {
    return fmt::format("rank-{}:", rank) + std::string(static_cast<std::size_t>(rank), 'x');
}

int fail(const std::string& what) {
    fmt::print("rank {}: {}\n", dist::get_global_rank(), what);
    return 1;
}

// 100 barriers; before barrier i each rank marks "probe/<i>/<rank>" with a client of its own,
// after it each checks that every rank's mark exists: a barrier that let anyone through early
// shows as a missing mark.
int barriers() {
    const auto& e = elastic::env();
    elastic::store_client_options o;
    o.host = *e.master_addr;
    o.port = *e.master_port;
    elastic::blocking_store_client probe(o);
    for (int i = 0; i < 100; ++i) {
        probe.set(fmt::format("probe/{}/{}", i, e.rank), "1");
        dist::barrier();
        std::vector<std::string> all;
        for (int r = 0; r < e.world_size; ++r) all.push_back(fmt::format("probe/{}/{}", i, r));
        if (!probe.check(all)) return fail(fmt::format("barrier {} let me through early", i));
    }
    fmt::print("rank {} passed 100 barriers\n", e.rank);
    return 0;
}

int broadcast() {
    const int rank = dist::get_global_rank();
    const auto expected = pattern(1024 * 1024);
    const auto got = dist::broadcast(rank == 0 ? expected : std::string("ignored"), 0);
    if (got != expected) return fail(fmt::format("broadcast gave {} bytes, not the pattern", got.size()));
    const int last = dist::get_world_size() - 1;
    const auto small = dist::broadcast(fmt::format("from rank {}", rank), last);
    if (small != fmt::format("from rank {}", last)) return fail("second broadcast: " + small);
    fmt::print("rank {} got {} bytes and '{}'\n", rank, got.size(), small);
    return 0;
}

int gather() {
    const int rank = dist::get_global_rank();
    const int world = dist::get_world_size();
    const auto all = dist::all_gather(gather_payload(rank));
    if (all.size() != static_cast<std::size_t>(world)) return fail("all_gather size");
    for (int r = 0; r < world; ++r)
        if (all[static_cast<std::size_t>(r)] != gather_payload(r))
            return fail(fmt::format("all_gather[{}] = '{}'", r, all[static_cast<std::size_t>(r)]));
    const auto sum = dist::all_reduce(rank + 1);
    const auto lo = dist::all_reduce(10 - rank, dist::reduce_op::min);
    const auto hi = dist::all_reduce(static_cast<std::int64_t>(rank) * 1000, dist::reduce_op::max);
    const auto half = dist::all_reduce(0.5 * rank);
    fmt::print("rank {} gathered {} in order; sum {} min {} max {} fsum {}\n", rank, all.size(), sum, lo, hi, half);
    return 0;
}

int barrier_once(std::chrono::milliseconds timeout) {
    dist::set_timeout(timeout);
    try {
        dist::barrier();
    } catch (const elastic::dist_timeout& e) {
        std::string missing;
        for (const int r : e.missing_ranks()) missing += fmt::format(" {}", r);
        fmt::print("rank {} missing:{}\n{}\n", dist::get_global_rank(), missing, e.what());
        return 3;
    }
    fmt::print("rank {} passed\n", dist::get_global_rank());
    return 0;
}

int single() {
    // A single-rank run: every collective is local, no store exists.
    dist::barrier();
    const auto b = dist::broadcast("alone");
    const auto g = dist::all_gather("me");
    const auto s = dist::all_reduce(41, dist::reduce_op::sum) + 1;
    fmt::print("{} {} {} {} of {}\n", b, g.size() == 1 ? g[0] : "?", s, dist::get_global_rank(),
               dist::get_world_size());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s barriers|broadcast|gather|barrier-once|single [ms]\n", argv[0]);
        return 2;
    }
    const std::string scenario = argv[1];
    const auto timeout = std::chrono::milliseconds(argc > 2 ? std::stol(argv[2]) : 60000);
    try {
        if (scenario != "single") dist::set_timeout(timeout);
        if (scenario == "barriers") return barriers();
        if (scenario == "broadcast") return broadcast();
        if (scenario == "gather") return gather();
        if (scenario == "barrier-once") return barrier_once(timeout);
        if (scenario == "single") return single();
    } catch (const std::exception& e) {
        fmt::print("rank {} error: {}\n", dist::get_global_rank(), e.what());
        return 4;
    }
    return 2;
}
