// elastic::dist across real worker processes over our store: 100 barriers in a row, a 1 MiB
// broadcast, all_gather order and all_reduce, a rank that never arrives, attempts that do not
// see each other's keys, and the single-rank no-ops.
#include <elastic/dist.hpp>
#include <elastic/store/server.hpp>

#include <doctest/doctest.h>

#include "client_support.hpp"
#include "store_support.hpp"

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include <exception>
#include <optional>

#include <map>
#include <string>
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
                                                                {"TORCHELASTIC_USE_AGENT_STORE", "True"}}));
            for (auto& [r, c] : children) {
                const auto [out, status] = co_await store_support::collect(c.output());
                results[r] = {out, client_support::exit_code(status)};
            }
        }());
        return results;
    }

    elastic::tcp_store_server& server() { return *server_; }

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
};

TEST_CASE("dist: 100 barriers in a row across 4 processes") {
    job j;
    const auto results = j.run("barriers", 4);
    for (const auto& entry : results) {
        const int rank = entry.first;  // not a structured binding: clang 14 cannot capture one
        const auto& r = entry.second;
        CAPTURE(r.output);
        CHECK(r.code == 0);
        CHECK(r.output == fmt::format("rank {} passed 100 barriers\n", rank));
    }
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
    const auto results = j.run("broadcast", 3);
    REQUIRE(results.size() == 3);
    for (const auto& entry : results) {
        const int rank = entry.first;  // not a structured binding: clang 14 cannot capture one
        const auto& r = entry.second;
        CAPTURE(r.output);
        CHECK(r.code == 0);
        CHECK(r.output == fmt::format("rank {} got 1048576 bytes and 'from rank 2'\n", rank));
    }
}

TEST_CASE("dist: all_gather is ordered by rank, all_reduce sums, mins and maxes") {
    job j;
    const auto results = j.run("gather", 4);
    REQUIRE(results.size() == 4);
    for (const auto& entry : results) {
        const int rank = entry.first;  // not a structured binding: clang 14 cannot capture one
        const auto& r = entry.second;
        CAPTURE(r.output);
        CHECK(r.code == 0);
        // sum of rank+1 = 10; min of 10-rank = 7; max of rank*1000 = 3000; sum of rank/2 = 3
        CHECK(r.output == fmt::format("rank {} gathered 4 in order; sum 10 min 7 max 3000 fsum 3\n", rank));
    }
}

TEST_CASE("dist: a rank that never arrives fails the others with its rank named") {
    job j;
    const auto results = j.run("barrier-once", 3, {0, 1}, 0, "300");
    REQUIRE(results.size() == 2);
    for (const auto& entry : results) {
        const int rank = entry.first;  // not a structured binding: clang 14 cannot capture one
        const auto& r = entry.second;
        CAPTURE(r.output);
        CHECK(r.code == 3);
        CHECK(r.output.starts_with(fmt::format("rank {} missing: 2\n", rank)));
        CHECK(r.output.find(fmt::format("elastic::dist::barrier #0 on rank {} of 3: rank 2 did not "
                                        "arrive within 300 ms",
                                        rank)) != std::string::npos);
    }
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
    const auto third = j.run("barrier-once", 2, {}, 2);
    for (const auto& entry : third) {
        const int rank = entry.first;  // not a structured binding: clang 14 cannot capture one
        const auto& r = entry.second;
        CAPTURE(r.output);
        CHECK(r.code == 0);
        CHECK(r.output == fmt::format("rank {} passed\n", rank));
    }
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

}  // namespace test_dist
