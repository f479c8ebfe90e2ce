// A native worker using elastic::dist from its environment (RANK, WORLD_SIZE, MASTER_ADDR, ...):
// `dist-worker <scenario> [timeout_ms]`. Prints what it saw; exits 0 when every rank's view
// checked out, 1 on a wrong value, 3 on dist_timeout (after printing the missing ranks).
#include <elastic/detail/text.hpp>
#include <elastic/dist.hpp>
#include <elastic/dist/json.hpp>

#include <nlohmann/json.hpp>
#include <elastic/store/blocking_client.hpp>

#include <fmt/format.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

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

// A user type with its own serialisation.
struct checkpoint {
    std::string name;
    std::vector<double> weights;
    int step = 0;
    void serialize(dist::writer& w) const {
        w(name);
        w(weights);
        w(step);
    }
    static checkpoint deserialize(dist::reader& r) {
        checkpoint c;
        c.name = r.read<std::string>();
        c.weights = r.read<std::vector<double>>();
        c.step = r.read<int>();
        return c;
    }
    bool operator==(const checkpoint&) const = default;
};

// A user type that travels through nlohmann::json (elastic/dist/json.hpp).
struct config {
    std::string optimizer;
    double lr = 0;
    bool operator==(const config&) const = default;
};
void to_json(nlohmann::json& j, const config& c) { j = nlohmann::json{{"optimizer", c.optimizer}, {"lr", c.lr}}; }
void from_json(const nlohmann::json& j, config& c) {
    c.optimizer = j.at("optimizer").get<std::string>();
    c.lr = j.at("lr").get<double>();
}

// Appends one line to a file shared by the node's workers (O_APPEND: whole lines, in order).
void append_line(const std::string& path, const std::string& line) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
        throw std::runtime_error("cannot append to " + path);
    ::close(fd);
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every collective, typed and raw, on the world, the node and the leaders, each result checked
// on every rank; DIST_TEST_DIR holds the files the local-rank-zero helpers share per node.
int collectives() {
    const auto& e = elastic::env();
    const int rank = e.rank;
    const int world = e.world_size;
    const int last = world - 1;
    const char* dir_env = std::getenv("DIST_TEST_DIR");
    if (!dir_env) return fail("DIST_TEST_DIR is not set");
    const std::string dir = dir_env;
    dist::initialize(std::chrono::seconds(60));
    if (!dist::is_initialized()) return fail("not initialized after initialize()");

    // A user type from the last rank; nlohmann types gathered; standard containers.
    const checkpoint mine{fmt::format("ckpt-{}", rank), {0.5 * rank, 1.0, -2.0}, 10 * rank};
    const auto got = dist::broadcast(mine, last);
    if (!(got == checkpoint{fmt::format("ckpt-{}", last), {0.5 * last, 1.0, -2.0}, 10 * last}))
        return fail("broadcast of a user type: " + got.name);
    const auto configs = dist::all_gather_object(config{fmt::format("opt{}", rank), 0.001 * rank});
    for (int r = 0; r < world; ++r)
        if (!(configs[static_cast<std::size_t>(r)] == config{fmt::format("opt{}", r), 0.001 * r}))
            return fail(fmt::format("all_gather_object of a JSON type, entry {}", r));
    using record = std::tuple<int, std::string, std::optional<std::map<std::string, int>>>;
    const auto records = dist::all_gather(record{rank, std::string(static_cast<std::size_t>(rank), 'r'),
                                                 rank % 2 ? std::nullopt
                                                          : std::optional(std::map<std::string, int>{{"r", rank}})});
    for (int r = 0; r < world; ++r) {
        const auto& [rr, text, m] = records[static_cast<std::size_t>(r)];
        if (rr != r || text.size() != static_cast<std::size_t>(r) || m.has_value() == (r % 2 == 1) ||
            (m && m->at("r") != r))
            return fail(fmt::format("all_gather of a tuple, entry {}", r));
    }
    std::vector<std::string> names{"a", "b"};
    if (rank == 0) names = {"x", "y", "z"};
    dist::broadcast_object_list(names, 0);
    if (names != std::vector<std::string>{"x", "y", "z"}) return fail("broadcast_object_list");

    // gather to the last rank, scatter from rank 0.
    const auto gathered = dist::gather(std::array<int, 2>{rank, -rank}, last);
    if (rank == last) {
        if (gathered.size() != static_cast<std::size_t>(world)) return fail("gather size on the root");
        for (int r = 0; r < world; ++r)
            if (gathered[static_cast<std::size_t>(r)] != std::array<int, 2>{r, -r}) return fail("gather entry");
    } else if (!gathered.empty()) {
        return fail("gather gave a non-root rank values");
    }
    std::vector<std::vector<int>> parts;
    if (rank == 0)
        for (int r = 0; r < world; ++r) parts.push_back(std::vector<int>(static_cast<std::size_t>(r) + 1, r));
    if (dist::scatter(parts, 0) != std::vector<int>(static_cast<std::size_t>(rank) + 1, rank)) return fail("scatter");

    // Payloads beyond the store's 16 MiB value limit and beyond one chunk.
    const auto big = pattern((std::size_t{17} << 20) + 3);
    if (dist::broadcast(rank == 0 ? big : std::string(), 0) != big) return fail("17 MiB broadcast");
    const auto five = pattern(std::size_t{5} << 20);
    const auto blobs = dist::all_gather(rank == 0 ? five : fmt::format("small {}", rank));
    if (blobs[0] != five) return fail("5 MiB all_gather entry");
    for (int r = 1; r < world; ++r)
        if (blobs[static_cast<std::size_t>(r)] != fmt::format("small {}", r)) return fail("all_gather entry");

    // all_reduce of arrays with every operation, in rank order.
    std::array<std::int32_t, 4> ints{rank + 1, -rank, 1 << rank % 8, 0x0f0f};
    const auto with = [&](dist::reduce_op op) {
        auto v = ints;
        dist::all_reduce(v, op);
        return v;
    };
    std::int32_t sum = 0, product = 1, band = ~0, bor = 0, bxor = 0;
    for (int r = 0; r < world; ++r) {
        sum += r + 1;
        product *= r + 1;
        band &= 1 << r % 8;
        bor |= 1 << r % 8;
        bxor ^= 1 << r % 8;
    }
    if (with(dist::reduce_op::sum)[0] != sum || with(dist::reduce_op::product)[0] != product ||
        with(dist::reduce_op::min)[1] != -last || with(dist::reduce_op::max)[1] != 0 ||
        with(dist::reduce_op::band)[2] != band || with(dist::reduce_op::bor)[2] != bor ||
        with(dist::reduce_op::bxor)[2] != bxor || with(dist::reduce_op::bxor)[3] != (world % 2 ? 0x0f0f : 0))
        return fail("all_reduce of an int32 array");
    std::vector<double> avg{1.0 * rank, 2.0};
    dist::all_reduce(avg, dist::reduce_op::avg);
    if (avg[0] != (world - 1) / 2.0 || avg[1] != 2.0) return fail(fmt::format("avg {} {}", avg[0], avg[1]));
    // Large enough for rank 0 to combine and send back (beyond 256 KiB), chunked (beyond 64 KiB).
    std::vector<double> large(100000);
    for (std::size_t i = 0; i < large.size(); ++i) large[i] = static_cast<double>(i % 1000) + rank;
    dist::all_reduce(std::span<double>(large), dist::reduce_op::sum);
    for (std::size_t i = 0; i < large.size(); ++i)
        if (large[i] != static_cast<double>(world) * static_cast<double>(i % 1000) + world * (world - 1) / 2)
            return fail(fmt::format("large all_reduce [{}] = {}", i, large[i]));
    if (dist::all_reduce(std::uint64_t{1} << rank, dist::reduce_op::bor) != (std::uint64_t{1} << world) - 1)
        return fail("all_reduce bor of a scalar");

    // The node's group and the node leaders.
    auto& local = dist::local_group();
    const auto locals = local.all_gather(e.local_rank);
    for (int l = 0; l < e.local_world_size; ++l)
        if (locals[static_cast<std::size_t>(l)] != l) return fail("local group all_gather");
    if (local.all_reduce(rank) != [&] {
            int s = 0;
            for (int l = 0; l < e.local_world_size; ++l) s += rank - e.local_rank + l;
            return s;
        }())
        return fail("local group all_reduce (ranks of a node are contiguous)");
    if (e.local_rank == 0) {
        const auto nodes = dist::leaders_group().all_gather(e.node_rank);
        for (int n = 0; n < e.node_count; ++n)
            if (nodes[static_cast<std::size_t>(n)] != n) return fail("leaders group all_gather");
    }

    // Local rank zero first: its line leads the node's file; f's value comes back.
    const auto order = fmt::format("{}/node_{}.order", dir, e.node_rank);
    const int value = dist::run_local_rank_zero_first([&] {
        append_line(order, fmt::format("local {}\n", e.local_rank));
        return 7;
    });
    if (value != 7) return fail("run_local_rank_zero_first's value");
    const auto data = fmt::format("{}/node_{}.data", dir, e.node_rank);
    if (e.local_rank == 0) {
        std::ofstream(data) << "downloaded by node " << e.node_rank;
    }
    dist::local_rank_zero_download_and_wait(data);
    if (read_file(data) != fmt::format("downloaded by node {}", e.node_rank)) return fail("downloaded file");
    dist::barrier();
    fmt::print("rank {} ok\n", rank);
    return 0;
}

// Only rooted collectives, with no full synchronisation among them: broadcasts (chunked), gathers
// and scatters from every root in turn. Their readers delete what they read, so the store is
// empty of them afterwards.
int rooted() {
    const int rank = dist::get_global_rank();
    const int world = dist::get_world_size();
    for (int i = 0; i < 30; ++i) {
        const int root = i % world;
        const auto expected = pattern(std::size_t{100} * 1024 + static_cast<std::size_t>(i));
        if (dist::broadcast(rank == root ? expected : std::string(), root) != expected) return fail("broadcast");
        const auto all = dist::gather(rank * 100 + i, root);
        if (rank == root)
            for (int r = 0; r < world; ++r)
                if (all[static_cast<std::size_t>(r)] != r * 100 + i) return fail("gather");
        std::vector<std::string> parts;
        if (rank == root)
            for (int r = 0; r < world; ++r) parts.push_back(fmt::format("{} for {}", i, r));
        if (dist::scatter(parts, root) != fmt::format("{} for {}", i, rank)) return fail("scatter");
    }
    fmt::print("rank {} rooted ok\n", rank);
    return 0;
}

// A value whose serialisation fails when asked to.
struct refuses {
    bool refuse = false;
    void serialize(dist::writer& w) const {
        if (refuse) throw std::runtime_error("this value refuses to travel");
        w(refuse);
    }
    static refuses deserialize(dist::reader& r) { return {r.read<bool>()}; }
};

// Ranks that disagree: a scatter with too few values, an all_reduce of different types, a value
// read as another type, a value that cannot be encoded on one rank, an operation one rank cannot
// do. Every rank reports each failure and goes on.
int mismatch() {
    const int rank = dist::get_global_rank();
    std::string out;
    try {
        std::vector<int> parts(rank == 0 ? 1 : 0, 5);
        (void)dist::scatter(parts, 0);
        out += "scatter passed;";
    } catch (const std::exception& e) {
        out += fmt::format("scatter: {};", e.what());
    }
    try {
        if (rank == 1) (void)dist::all_reduce(std::int64_t{1});
        else (void)dist::all_reduce(1.0);
        out += "reduce passed;";
    } catch (const std::exception& e) {
        out += fmt::format("reduce: {};", e.what());
    }
    try {
        if (rank == 0) (void)dist::broadcast(std::vector<int>{1, 2, 3}, 0);
        else (void)dist::broadcast(std::uint64_t{0}, 0);
        out += "typed passed;";
    } catch (const std::exception& e) {
        out += fmt::format("typed: {};", e.what());
    }
    try {
        (void)dist::all_gather(refuses{rank == 1});
        out += "gather passed;";
    } catch (const std::exception& e) {
        out += fmt::format("gather: {};", e.what());
    }
    try {
        if (rank == 2) (void)dist::all_reduce(3, dist::reduce_op::avg);
        else (void)dist::all_reduce(3.0, dist::reduce_op::avg);
        out += "avg passed;";
    } catch (const std::exception& e) {
        out += fmt::format("avg: {};", e.what());
    }
    try {
        // Large (3 x 320 KB): rank 0, which combines for the others, refuses; they hear it at once.
        if (rank == 0) {
            std::vector<std::int64_t> v(40000, 1);
            dist::all_reduce(v, dist::reduce_op::avg);
        } else {
            std::vector<double> v(40000, 1.0);
            dist::all_reduce(v, dist::reduce_op::avg);
        }
        out += "large avg passed;";
    } catch (const std::exception& e) {
        out += fmt::format("large avg: {};", e.what());
    }
    dist::barrier();  // the ranks still count the same collectives
    fmt::print("rank {}: {}\n", rank, out);
    return 0;
}

// One collective that some rank will not reach within `timeout`: a barrier; an all_reduce large
// enough for rank 0 to combine (the others wait for its result); or, in `dies`, an all_gather
// after a barrier that every rank passed and after which the last rank exits.
enum class once { barrier, large_reduce, dies };

// The ranks the test started (DIST_STARTED, "0,1") wait for each other through a client of their
// own, however slowly they start: the short timeout then counts from when all of them are up.
void sync_started() {
    const char* started = std::getenv("DIST_STARTED");
    if (!started) return;
    const auto& e = elastic::env();
    elastic::store_client_options o;
    o.host = *e.master_addr;
    o.port = *e.master_port;
    o.timeout = std::chrono::minutes(1);
    elastic::blocking_store_client up(o);
    up.set(fmt::format("started/{}", e.rank), "1");
    std::vector<std::string> keys;
    for (const auto rank : elastic::detail::split(started, ',')) keys.push_back(fmt::format("started/{}", rank));
    up.wait(keys, std::chrono::minutes(1));
}

int barrier_once(std::chrono::milliseconds timeout, once what = once::barrier) {
    sync_started();
    dist::set_timeout(timeout);
    try {
        if (what == once::large_reduce) {
            std::vector<double> v(12000, 1.0);  // 96 KB: chunked, and 3 ranks' beyond 256 KiB
            dist::all_reduce(v);
        } else if (what == once::dies) {
            dist::set_timeout(std::chrono::minutes(1));  // however slowly the ranks start
            dist::barrier();
            dist::set_timeout(timeout);
            if (dist::get_global_rank() == dist::get_world_size() - 1) {
                fmt::print("rank {} exits\n", dist::get_global_rank());
                std::fflush(stdout);
                std::_Exit(9);
            }
            (void)dist::all_gather(std::string("after"));
        } else {
            dist::barrier();
        }
    } catch (const elastic::dist_timeout& e) {
        std::string missing;
        for (const int r : e.missing_ranks()) missing += fmt::format(" {}", r);
        fmt::print("rank {} missing:{}\n{}\n", dist::get_global_rank(), missing, e.what());
        return 3;
    }
    fmt::print("rank {} passed\n", dist::get_global_rank());
    return 0;
}

// dist::initialize within `timeout`: prints "initialized" or the error.
int initialize(std::chrono::milliseconds timeout) {
    try {
        dist::initialize(timeout);
    } catch (const std::exception& e) {
        fmt::print("rank {} initialize failed: {}\n", dist::get_global_rank(), e.what());
        return dist::is_initialized() ? 3 : 4;
    }
    fmt::print("rank {} initialized: {}\n", dist::get_global_rank(), dist::is_initialized());
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
        std::fprintf(
            stderr,
            "usage: %s barriers|broadcast|gather|barrier-once|reduce-once|dies|single|collectives|mismatch|rooted|initialize [ms]\n",
            argv[0]);
        return 2;
    }
    const std::string scenario = argv[1];
    const auto timeout = std::chrono::milliseconds(argc > 2 ? std::stol(argv[2]) : 60000);
    try {
        if (scenario == "initialize") return initialize(timeout);
        if (scenario != "single") dist::set_timeout(timeout);
        if (scenario == "barriers") return barriers();
        if (scenario == "broadcast") return broadcast();
        if (scenario == "gather") return gather();
        if (scenario == "barrier-once") return barrier_once(timeout);
        if (scenario == "reduce-once") return barrier_once(timeout, once::large_reduce);
        if (scenario == "dies") return barrier_once(timeout, once::dies);
        if (scenario == "single") return single();
        if (scenario == "collectives") return collectives();
        if (scenario == "mismatch") return mismatch();
        if (scenario == "rooted") return rooted();
    } catch (const std::exception& e) {
        fmt::print("rank {} error: {}\n", dist::get_global_rank(), e.what());
        return 4;
    }
    return 2;
}
