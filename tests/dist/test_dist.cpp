// elastic::dist across real worker processes over our store: 100 barriers in a row, a 1 MiB
// broadcast, all_gather order and all_reduce, every typed collective and group, ranks that
// disagree, a rank that never arrives, attempts that do not see each other's keys, and the
// single-rank no-ops; in-process, the codec's round trips and refusals, and the sampler against
// PyTorch's DistributedSampler.
#include <elastic/dist.hpp>
#include <elastic/dist/json.hpp>
#include <elastic/store/server.hpp>

#include <doctest/doctest.h>

#include "agent_support.hpp"
#include "client_support.hpp"
#include "store_support.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace test_dist {

struct outcome {
    std::string output;
    int code = -1;
};

// Our store in this process and `ranks` of a `world` of dist-worker processes as its clients.
class job {
public:
    job() {
        elastic::store_server_options o;
        o.host = "127.0.0.1";
        server_.emplace(ctx_.get_executor(), o);
        server_->start();
    }

    // Runs the given ranks of a world (all of them when `ranks` is empty) to their exit.
    std::map<int, outcome> run(const std::string& scenario, int world, std::vector<int> ranks = {}, int attempt = 0,
                               const std::string& timeout_ms = "60000") {
        if (ranks.empty())
            for (int r = 0; r < world; ++r) ranks.push_back(r);
        std::string started;  // the ranks started, for scenarios that sync them first
        for (const int r : ranks) started += (started.empty() ? "" : ",") + std::to_string(r);
        std::map<int, outcome> results;
        run_until_done([&]() -> asio::awaitable<void> {
            std::vector<std::pair<int, client_support::child>> children;
            for (const int r : ranks)
                children.emplace_back(r, client_support::spawn({ELASTIC_TEST_PROGRAM_DIR "/dist-worker", scenario,
                                                                timeout_ms},
                                                               {{"RANK", std::to_string(r)},
                                                                {"LOCAL_RANK", std::to_string(r)},
                                                                {"WORLD_SIZE", std::to_string(world)},
                                                                {"LOCAL_WORLD_SIZE", std::to_string(world)},
                                                                {"GROUP_RANK", "0"},
                                                                {"MASTER_ADDR", "127.0.0.1"},
                                                                {"MASTER_PORT", std::to_string(server_->port())},
                                                                {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)},
                                                                {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                                {"DIST_TEST_DIR", dir_.str()},
                                                                {"DIST_STARTED", started}}));
            for (auto& [r, c] : children) {
                const auto [out, status] = co_await store_support::collect(c.output());
                results[r] = {out, client_support::exit_code(status)};
            }
        }());
        return results;
    }

    elastic::tcp_store_server& server() { return *server_; }
    const agent_support::temp_dir& dir() const { return dir_; }

private:
    // Runs the loop until `body` ends; the server keeps serving between runs.
    void run_until_done(asio::awaitable<void> body) {
        std::exception_ptr error;
        asio::co_spawn(ctx_, std::move(body), [&](std::exception_ptr e) {
            error = e;
            ctx_.stop();
        });
        ctx_.restart();
        ctx_.run();
        if (error) std::rethrow_exception(error);
    }

    asio::io_context ctx_;
    std::optional<elastic::tcp_store_server> server_;
    agent_support::temp_dir dir_;  // files the workers share (DIST_TEST_DIR)
};

// Every rank of `results` (`count` of them) exited 0 and printed exactly `expected(rank)`.
template <class F>
void expect_outputs(const std::map<int, outcome>& results, std::size_t count, F expected) {
    REQUIRE(results.size() == count);
    for (const auto& entry : results) {
        CAPTURE(entry.second.output);
        CHECK(entry.second.code == 0);
        CHECK(entry.second.output == expected(entry.first));
    }
}

TEST_CASE("dist: 100 barriers in a row across 4 processes") {
    job j;
    expect_outputs(j.run("barriers", 4), 4,
                   [](int rank) { return fmt::format("rank {} passed 100 barriers\n", rank); });
    // Finished collectives' keys were deleted as the run went on: at most the last barrier's
    // key of each rank is left under the namespace.
    std::size_t left = 0;
    j.server().engine().for_each([&](std::string_view key, std::string_view) {
        if (key.starts_with("/elastic.dist/attempt_0/")) ++left;
    });
    CHECK(left <= 4);
}

TEST_CASE("dist: a 1 MiB broadcast and a broadcast from the last rank") {
    job j;
    expect_outputs(j.run("broadcast", 3), 3,
                   [](int rank) { return fmt::format("rank {} got 1048576 bytes and 'from rank 2'\n", rank); });
}

TEST_CASE("dist: all_gather is ordered by rank, all_reduce sums, mins and maxes") {
    job j;
    // sum of rank+1 = 10; min of 10-rank = 7; max of rank*1000 = 3000; sum of rank/2 = 3
    expect_outputs(j.run("gather", 4), 4, [](int rank) {
        return fmt::format("rank {} gathered 4 in order; sum 10 min 7 max 3000 fsum 3\n", rank);
    });
}

TEST_CASE("dist: a rank that never arrives fails the others with its rank named") {
    // A barrier; a large all_reduce, where rank 1 waits for rank 0's result and names the rank
    // whose array rank 0 waits for.
    for (const auto& c :
         std::vector<std::pair<std::string, std::string>>{{"barrier-once", "barrier"}, {"reduce-once", "all_reduce"}}) {
        const auto& scenario = c.first;  // not a structured binding: clang 14 cannot capture one
        const auto& what = c.second;
        CAPTURE(scenario);
        job j;
        const auto results = j.run(scenario, 3, {0, 1}, 0, "300");
        REQUIRE(results.size() == 2);
        for (const auto& entry : results) {
            const int rank = entry.first;  // not a structured binding: clang 14 cannot capture one
            const auto& r = entry.second;
            CAPTURE(r.output);
            CHECK(r.code == 3);
            CHECK(r.output.starts_with(fmt::format("rank {} missing: 2\n", rank)));
            CHECK(r.output.find(fmt::format("elastic::dist::{} #0 on rank {} of 3: rank 2 did not arrive within 300 ms",
                                            what, rank)) != std::string::npos);
        }
    }
}

TEST_CASE("dist: a rank that dies after a collective fails the others' next one with its rank named") {
    job j;
    const auto results = j.run("dies", 3, {}, 0, "300");
    REQUIRE(results.size() == 3);
    CHECK(results.at(2).code == 9);
    CHECK(results.at(2).output == "rank 2 exits\n");
    for (const int rank : {0, 1}) {
        const auto& r = results.at(rank);
        CAPTURE(r.output);
        CHECK(r.code == 3);
        CHECK(r.output.starts_with(fmt::format("rank {} missing: 2\n", rank)));
        CHECK(r.output.find(fmt::format("elastic::dist::all_gather #1 on rank {} of 3: rank 2 did not arrive within "
                                        "300 ms",
                                        rank)) != std::string::npos);
    }
}

TEST_CASE("dist: initialize joins every rank, and names MASTER_ADDR:MASTER_PORT when the store is not there") {
    job j;
    expect_outputs(j.run("initialize", 2, {}, 0, "60000"), 2,
                   [](int rank) { return fmt::format("rank {} initialized: true\n", rank); });
    // Nothing listens on the port: the connection is refused until initialize's timeout.
    asio::io_context ctx;
    const int port = agent_support::free_port();
    auto c = client_support::spawn({ELASTIC_TEST_PROGRAM_DIR "/dist-worker", "initialize", "300"},
                                   {{"RANK", "0"},
                                    {"LOCAL_RANK", "0"},
                                    {"WORLD_SIZE", "2"},
                                    {"LOCAL_WORLD_SIZE", "2"},
                                    {"MASTER_ADDR", "127.0.0.1"},
                                    {"MASTER_PORT", std::to_string(port)}});
    const auto result = store_support::run(ctx, store_support::collect(c.output()));
    CAPTURE(result.first);
    CHECK(client_support::exit_code(result.second) == 4);  // failed, and not initialized
    CHECK(result.first.starts_with(fmt::format("rank 0 initialize failed: elastic::dist::initialize: cannot reach the "
                                               "job's store at MASTER_ADDR:MASTER_PORT = 127.0.0.1:{} within 300 ms (",
                                               port)));
}

TEST_CASE("dist: a new attempt never sees the keys an earlier attempt left") {
    job j;
    // Attempt 0: only rank 1 reaches the barrier and leaves its key behind.
    auto first = j.run("barrier-once", 2, {1}, 0, "200");
    CHECK(first[1].code == 3);
    CHECK(first[1].output.starts_with("rank 1 missing: 0\n"));
    // Attempt 1: rank 0 alone must not take attempt 0's key for rank 1's arrival.
    auto second = j.run("barrier-once", 2, {0}, 1, "200");
    CHECK(second[0].code == 3);
    CHECK(second[0].output.starts_with("rank 0 missing: 1\n"));
    // Attempt 2 with both ranks passes.
    expect_outputs(j.run("barrier-once", 2, {}, 2), 2, [](int rank) { return fmt::format("rank {} passed\n", rank); });
}

TEST_CASE("dist: a single-rank run needs no store and every collective is local") {
    asio::io_context ctx;
    // No launcher variables at all: the single-rank default.
    auto c = client_support::spawn({ELASTIC_TEST_PROGRAM_DIR "/dist-worker", "single"},
                                   {{"RANK", ""}, {"WORLD_SIZE", ""}});
    const auto result = store_support::run(ctx, store_support::collect(c.output()));
    const auto& out = result.first;
    const int status = result.second;
    CAPTURE(out);
    CHECK(client_support::exit_code(status) == 0);
    CHECK(out == "alone me 42 0 of 1\n");

    // The same through a group made from a test environment.
    const auto e = elastic::worker_env::from(std::map<std::string, std::string>{});
    elastic::dist::group g(elastic::dist::options_from(e));
    g.barrier();
    CHECK(g.broadcast("x") == "x");
    CHECK(g.all_gather("y") == std::vector<std::string>{"y"});
    CHECK(g.all_reduce(2.5, elastic::dist::reduce_op::max) == 2.5);
    CHECK(g.options().key_namespace == "elastic.dist/attempt_0");
    CHECK_THROWS_AS(g.broadcast("x", 1), std::invalid_argument);
}

TEST_CASE("dist: options from the environment: namespace per restart, MASTER_* required") {
    const auto e = elastic::worker_env::from(std::map<std::string, std::string>{{"RANK", "1"},
                                                                                {"WORLD_SIZE", "2"},
                                                                                {"LOCAL_RANK", "1"},
                                                                                {"LOCAL_WORLD_SIZE", "2"},
                                                                                {"MASTER_ADDR", "10.0.0.5"},
                                                                                {"MASTER_PORT", "29511"},
                                                                                {"TORCHELASTIC_RESTART_COUNT", "3"}});
    const auto o = elastic::dist::options_from(e);
    CHECK(o.rank == 1);
    CHECK(o.world_size == 2);
    CHECK(o.host == "10.0.0.5");
    CHECK(o.port == 29511);
    CHECK(o.key_namespace == "elastic.dist/attempt_3");

    const auto no_master = elastic::worker_env::from(std::map<std::string, std::string>{
        {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}});
    try {
        (void)elastic::dist::options_from(no_master);
        FAIL("expected env_error");
    } catch (const elastic::env_error& err) {
        CHECK(std::string(err.what()).find("MASTER_ADDR is not set") != std::string::npos);
    }
}

TEST_CASE("dist: every typed collective, the node and leader groups and the local-rank-zero helpers, 3 processes") {
    job j;
    expect_outputs(j.run("collectives", 3), 3, [](int rank) { return fmt::format("rank {} ok\n", rank); });
    // Local rank 0 ran first; the others after it, in any order.
    const auto lines = agent_support::read_lines_of(j.dir().path() / "node_0.order");
    REQUIRE(lines.size() == 3);
    CHECK(lines[0] == "local 0");
    // The chunked payloads' keys went with the collectives that used them.
    std::size_t left = 0;
    j.server().engine().for_each([&](std::string_view key, std::string_view) {
        if (key.starts_with("/elastic.dist/attempt_0/")) ++left;
    });
    // The world's last barrier (a key per rank), the node group's last full synchronisation (its
    // all_reduce, a key per rank) and its members' claims; the leaders' group of one uses no store.
    CHECK(left <= 3 * 3);
}

TEST_CASE("dist: broadcasts, gathers and scatters alone leave nothing in the store: their readers delete it") {
    job j;
    expect_outputs(j.run("rooted", 3), 3, [](int rank) { return fmt::format("rank {} rooted ok\n", rank); });
    std::vector<std::string> left;
    j.server().engine().for_each([&](std::string_view key, std::string_view) {
        if (key.starts_with("/elastic.dist/")) left.emplace_back(key);
    });
    CAPTURE(left.size());
    CHECK(left.empty());
}

TEST_CASE("dist: ranks that disagree on a collective fail with a message naming the difference") {
    job j;
    const auto results = j.run("mismatch", 3, {}, 0, "20000");
    REQUIRE(results.size() == 3);
    const std::string scatter = "root 0 has 1 values for 3 ranks (it needs one per rank)";
    for (const auto& entry : results) {
        const int rank = entry.first;  // not a structured binding: clang 14 cannot capture one
        const auto& r = entry.second;
        CAPTURE(r.output);
        CHECK(r.code == 0);  // and so the last barrier passed: the ranks still count alike
        std::string expected = fmt::format("rank {}: ", rank);
        // The root refuses, and tells the others at once.
        expected += rank == 0 ? "scatter: elastic::dist::scatter: " + scatter + ";"
                              : "scatter: elastic::dist::scatter #0: rank 0 could not take part: " + scatter + ";";
        // Every rank sees the other's header.
        expected += fmt::format(
            "reduce: elastic::dist::all_reduce #1: rank {} reduces 1 values of a {} 64-bit type with "
            "sum, rank {} 1 values of a {} 64-bit type with sum: every rank must reduce as many "
            "values of the same type with the same operation;",
            rank == 1 ? 0 : 1, rank == 1 ? "floating" : "signed", rank, rank == 1 ? "signed" : "floating");
        // Read as another type: only the readers notice.
        expected += rank == 0
                        ? "typed passed;"
                        : "typed: elastic::dist: cannot decode the end of a value (bytes left over) with 12 bytes "
                          "left: the bytes were written for another type (every rank must pass the same type to "
                          "a collective);";
        // Rank 1's value cannot be encoded: it fails with its own exception, the others with its message.
        expected += rank == 1 ? "gather: this value refuses to travel;"
                              : "gather: elastic::dist::all_gather #3: rank 1 could not take part: this value refuses "
                                "to travel;";
        // Rank 2 asks for an integer average.
        const std::string avg = "elastic::dist::all_reduce: avg takes floating-point types only (for integers, reduce "
                                "with sum and divide as you need)";
        expected += rank == 2 ? "avg: " + avg + ";"
                              : "avg: elastic::dist::all_reduce #4: rank 2 could not take part: " + avg + ";";
        // Rank 0, which combines a large reduce, asks for an integer average.
        expected += rank == 0 ? "large avg: " + avg + ";"
                              : "large avg: elastic::dist::all_reduce #5: rank 0 could not take part: " + avg + ";";
        CHECK(r.output == expected + "\n");
    }
}

namespace codec_cases {
struct user {
    std::string name;
    std::vector<std::int32_t> values;
    void serialize(elastic::dist::writer& w) const {
        w(name);
        w(values);
    }
    static user deserialize(elastic::dist::reader& r) {
        user u;
        u.name = r.read<std::string>();
        u.values = r.read<std::vector<std::int32_t>>();
        return u;
    }
    bool operator==(const user&) const = default;
};
struct pod {
    std::int32_t a;
    double b;
    bool operator==(const pod&) const = default;
};
struct with_json {
    std::string s;
    bool operator==(const with_json&) const = default;
};
void to_json(nlohmann::json& j, const with_json& v) { j = nlohmann::json{{"s", v.s}}; }
void from_json(const nlohmann::json& j, with_json& v) { v.s = j.at("s").get<std::string>(); }
// A type the user cannot change, given a codec specialisation.
struct foreign {
    int x;
};
}  // namespace codec_cases
}  // namespace test_dist

template <>
struct elastic::dist::codec<test_dist::codec_cases::foreign> {
    static void encode(writer& w, const test_dist::codec_cases::foreign& f) { w(std::to_string(f.x)); }
    static test_dist::codec_cases::foreign decode(reader& r) { return {std::stoi(r.read<std::string>())}; }
};

namespace test_dist {

template <class T>
void round_trip(const T& value) {
    CHECK(elastic::dist::decode<T>(elastic::dist::encode(value)) == value);
}

TEST_CASE("dist codec: every kind of value comes back equal, and pointers and views are not serializable") {
    using namespace codec_cases;
    namespace d = elastic::dist;
    static_assert(d::serializable<pod> && d::serializable<user> && d::serializable<with_json>);
    static_assert(d::serializable<std::map<std::string, std::vector<user>>>);
    static_assert(!d::serializable<int*> && !d::serializable<std::string_view> && !d::serializable<char[4]>);
    static_assert(!d::serializable<std::span<int>> && !d::serializable<std::vector<int*>>);
    round_trip(42);
    round_trip(pod{-3, 2.5});
    round_trip(std::string("text with \\0 \0 inside", 21));
    round_trip(std::u32string(U"wide"));
    round_trip(std::vector<double>{1.5, -0.0, 1e300});
    round_trip(std::vector<std::string>{"", "a", std::string(100000, 'z')});
    round_trip(std::array<std::string, 2>{"x", "y"});
    round_trip(std::pair<int, std::string>{1, "one"});
    round_trip(std::tuple<int, std::optional<std::string>, std::optional<int>>{7, "seven", std::nullopt});
    round_trip(std::map<std::string, std::vector<user>>{{"k", {user{"u", {1, 2}}}}, {"", {}}});
    // A map's pair<const K, V> may be trivially copyable; its padding must not travel.
    round_trip(std::map<std::int32_t, double>{{1, 2.0}, {-3, 0.5}});
    CHECK(d::encode(std::map<std::int32_t, double>{{1, 2.0}}).size() == 8 + 4 + 8);
    round_trip(std::optional<std::int32_t>(7));
    round_trip(std::array<bool, 3>{true, false, true});
    round_trip(std::array<std::int32_t, 0>{});
    round_trip(std::tuple<std::array<std::int32_t, 0>, std::int32_t>(std::array<std::int32_t, 0>{}, 5));
    round_trip(user{"name", {3, 4, 5}});
    round_trip(with_json{"through CBOR"});
    round_trip(std::vector<with_json>{{"a"}, {"b"}});
    round_trip(nlohmann::json{{"nested", {1, 2.5, "x"}}});
    const auto f = d::decode<foreign>(d::encode(foreign{12}));
    CHECK(f.x == 12);
    CHECK(d::encode(foreign{12}) == d::encode(std::string("12")));  // the specialisation's own bytes
}

TEST_CASE("dist codec: short, long and forged bytes are a store_error naming the problem, never a huge allocation") {
    namespace d = elastic::dist;
    const auto bytes = d::encode(std::vector<std::int64_t>{1, 2, 3});
    CHECK_THROWS_WITH_AS(d::decode<std::vector<std::int64_t>>(bytes.substr(0, bytes.size() - 1)),
                         doctest::Contains("cannot decode a count of 3 elements of at least 8 bytes each with 23 "
                                           "bytes left"),
                         elastic::store_error);
    CHECK_THROWS_WITH_AS(d::decode<std::vector<std::int64_t>>(bytes + "x"),
                         doctest::Contains("the end of a value (bytes left over) with 1 bytes left"),
                         elastic::store_error);
    // A count of 2^60 strings in 8 bytes: refused before any allocation.
    std::string forged(8, '\0');
    forged[7] = 0x10;
    CHECK_THROWS_WITH_AS(d::decode<std::vector<std::string>>(forged),
                         doctest::Contains("a count of 1152921504606846976 elements"), elastic::store_error);
    CHECK_THROWS_WITH_AS(d::decode<std::optional<int>>(std::string(1, '\2') + std::string(4, '\0')),
                         doctest::Contains("an optional's flag (a byte other than 0 or 1)"), elastic::store_error);
    CHECK_THROWS_WITH_AS(d::decode<bool>(std::string(1, '\2')), doctest::Contains("a bool (a byte other than 0 or 1)"),
                         elastic::store_error);
    CHECK_THROWS_AS(d::decode<codec_cases::with_json>(d::encode(std::string("not cbor"))), elastic::store_error);
    CHECK_THROWS_AS(d::decode<int>(""), elastic::store_error);
}

TEST_CASE("dist sampler: the same indices as PyTorch's DistributedSampler for the same arguments") {
    struct sampler_case {
        std::int64_t size;
        int replicas;
        std::uint64_t seed;
        std::uint64_t epoch;
        bool shuffle;
        bool drop_last;
    };
    const std::vector<sampler_case> cases{{10, 3, 0, 0, true, false},
                                          {10, 3, 0, 1, true, true},
                                          {10, 3, 5, 2, false, false},
                                          {10, 3, 5, 2, false, true},
                                          {2, 5, 1, 0, true, false},
                                          {2, 5, 1, 0, true, true},
                                          {0, 2, 0, 0, true, false},
                                          {1, 1, 9, 3, true, false},
                                          {1000, 7, 42, 4, true, false},
                                          {1000, 7, 42, 4, true, true},
                                          {4096, 8, (std::uint64_t{1} << 33) + 7, 0, true, false},
                                          {100003, 16, 1234, 9, true, true}};
    // One interpreter for every case: each line is "<case> <rank> <index> <index> ...".
    std::string script = "import torch, sys\nfrom torch.utils.data.distributed import DistributedSampler\n"
                         "cases = [\n";
    for (const auto& c : cases)
        script += fmt::format("  ({}, {}, {}, {}, {}, {}),\n", c.size, c.replicas, c.seed, c.epoch,
                              c.shuffle ? "True" : "False", c.drop_last ? "True" : "False");
    script += "]\nfor i, (n, r, seed, epoch, shuffle, drop) in enumerate(cases):\n"
              "  for rank in range(r):\n"
              "    s = DistributedSampler(range(n), num_replicas=r, rank=rank, shuffle=shuffle, seed=seed, "
              "drop_last=drop)\n"
              "    s.set_epoch(epoch)\n"
              "    sys.stdout.write(' '.join([str(i), str(rank)] + [str(x) for x in s]) + '\\n')\n";
    auto env = agent_support::clean_environment();
    const auto r = agent_support::run({"-c", script}, env, ELASTIC_TORCH_PYTHON);
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    std::istringstream lines(r.out);
    int compared = 0;
    for (std::string line; std::getline(lines, line);) {
        std::istringstream in(line);
        std::size_t i = 0;
        int rank = 0;
        in >> i >> rank;
        REQUIRE(i < cases.size());
        std::vector<std::int64_t> torch_indices;
        for (std::int64_t x = 0; in >> x;) torch_indices.push_back(x);
        const auto& c = cases[i];
        elastic::dist::sampler s(
            c.size,
            {.num_replicas = c.replicas, .rank = rank, .shuffle = c.shuffle, .seed = c.seed, .drop_last = c.drop_last});
        s.set_epoch(c.epoch);
        CAPTURE(i);
        CAPTURE(rank);
        CHECK(s.indices() == torch_indices);
        CHECK(s.num_samples() == static_cast<std::int64_t>(torch_indices.size()));
        ++compared;
    }
    int expected = 0;
    for (const auto& c : cases) expected += c.replicas;
    CHECK(compared == expected);
}

TEST_CASE("dist sampler: arguments torch refuses are refused, and replicas and rank default to the environment") {
    using elastic::dist::sampler;
    CHECK_THROWS_WITH_AS(sampler(10, {.num_replicas = 2, .rank = 2}),
                         "elastic::dist::sampler: invalid rank 2, rank should be in the interval [0, 1]",
                         std::invalid_argument);
    CHECK_THROWS_AS(sampler(-1, {.num_replicas = 1, .rank = 0}), std::invalid_argument);
    CHECK_THROWS_AS(sampler(10, {.num_replicas = 0, .rank = 0}), std::invalid_argument);
    // In this test process no launcher variables are set: a world of one.
    const sampler alone(5, {.shuffle = false});
    CHECK(alone.num_replicas() == 1);
    CHECK(alone.indices() == std::vector<std::int64_t>{0, 1, 2, 3, 4});
}

// The `collectives` scenario under real elasticrun agents: `nprocs` holds each agent's
// --nproc-per-node (one agent: --standalone; more: c10d on loopback). Every rank must say ok and
// every node's local rank 0 must have run first.
void collectives_under_elasticrun(const std::vector<int>& nprocs) {
    int world = 0;
    for (const int n : nprocs) world += n;
    CAPTURE(world);
    CAPTURE(nprocs.size());
    agent_support::temp_dir dir;
    auto env = agent_support::clean_environment();
    env["DIST_TEST_DIR"] = dir.str();
    const int port = agent_support::free_port();
    std::vector<std::unique_ptr<agent_support::launched>> agents;
    for (const int nproc : nprocs) {
        std::vector<std::string> args;
        if (nprocs.size() == 1) args.push_back("--standalone");
        else
            args.insert(args.end(), {"--rdzv-backend=c10d", fmt::format("--rdzv-endpoint=127.0.0.1:{}", port),
                                     "--rdzv-id=dist", fmt::format("--nnodes={}", nprocs.size())});
        args.insert(args.end(), {fmt::format("--nproc-per-node={}", nproc), ELASTIC_TEST_PROGRAM_DIR "/dist-worker",
                                 "collectives"});
        agents.push_back(std::make_unique<agent_support::launched>(args, env));
    }
    std::string out;
    for (auto& a : agents) {
        const int code = a->wait();
        INFO(a->err());
        CHECK(code == 0);
        out += a->out();
    }
    CAPTURE(out);
    for (int r = 0; r < world; ++r) CHECK(out.find(fmt::format("rank {} ok\n", r)) != std::string::npos);
    CHECK(agent_support::launched::count_lines(out, "rank ") == world);
    // Each node's file has one line per worker of that node (which agent got which group rank is
    // the rendezvous's choice), local rank 0's first.
    std::multiset<int> sizes;
    for (std::size_t node = 0; node < nprocs.size(); ++node) {
        const auto lines = agent_support::read_lines_of(dir.path() / fmt::format("node_{}.order", node));
        sizes.insert(static_cast<int>(lines.size()));
        REQUIRE(!lines.empty());
        CHECK(lines[0] == "local 0");
    }
    CHECK(sizes == std::multiset<int>(nprocs.begin(), nprocs.end()));
}

TEST_CASE("dist: every collective under elasticrun, world sizes 1, 2 and 5 on one agent") {
    for (const int world : {1, 2, 5}) collectives_under_elasticrun({world});
}

TEST_CASE("dist: every collective under elasticrun, worlds of 2 (1+1) and 5 (2+3) on two agents") {
    collectives_under_elasticrun({1, 1});
    collectives_under_elasticrun({2, 3});
}

}  // namespace test_dist
