// examples/libtorch_trainer.cpp under the real launcher: libtorch's c10d::ProcessGroupGloo
// formed over the store the agent hosts, an all-reduce of real tensors per step, and a restart
// that resumes from the checkpoint to the same model as a run that never failed. Built where the
// example is (libtorch and Gloo found, no sanitizer: tests/agent/tests.cmake); CI requires it in
// the g++ stage (ELASTIC_LIBTORCH_EXAMPLE=ON).
#include "agent_support.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#ifdef ELASTIC_TEST_LIBTORCH_TRAINER

namespace test_libtorch_trainer {

using agent_support::temp_dir;

/// Every "rank R of N: step S w W b B" line, sorted by rank.
std::vector<std::string> final_lines(const std::string& out) {
    static const std::regex line(R"(rank \d+ of \d+: step \d+ w -?\d+\.\d+ b -?\d+\.\d+)");
    std::vector<std::string> found;
    for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it) {
        found.push_back(it->str());
    }
    std::sort(found.begin(), found.end());
    return found;
}

TEST_CASE("libtorch example: ProcessGroupGloo over the agent's store, restarted from its checkpoint to the same "
          "model") {
    temp_dir dir;
    auto env = agent_support::clean_environment();
    env["OMP_NUM_THREADS"] = "1";
    const std::string trainer = ELASTIC_TEST_LIBTORCH_TRAINER;

    // Uninterrupted: two ranks, 12 steps.
    const auto clean_ckpt = (dir.path() / "clean.ckpt").string();
    auto clean = agent_support::run({"--standalone", "--nproc-per-node=2", trainer, "--steps=12",
                                     "--checkpoint=" + clean_ckpt},
                                    env);
    INFO(clean.err);
    REQUIRE(clean.code == 0);
    const auto expected = final_lines(clean.out);
    REQUIRE(expected.size() == 2);
    CHECK(expected[0].rfind("rank 0 of 2: step 12 w ", 0) == 0);
    // Both ranks agree, and the fit is on its way to y = 3x + 1.
    CHECK(expected[0].substr(expected[0].find(": ")) == expected[1].substr(expected[1].find(": ")));
    CHECK(clean.out.find("resumed") == std::string::npos);

    // Rank 1 fails at step 7 of the first attempt; the restart resumes from the checkpoint.
    const auto ckpt = (dir.path() / "failed.ckpt").string();
    auto restarted = agent_support::run({"--standalone", "--nproc-per-node=2", "--max-restarts=1", trainer,
                                         "--steps=12", "--checkpoint=" + ckpt, "--fail-at=7"},
                                        env);
    INFO(restarted.err);
    REQUIRE(restarted.code == 0);
    CHECK(restarted.err.find("rank 1 fails at step 7") != std::string::npos);  // the failure report's line
    CHECK(restarted.err.find("restarting the worker group") != std::string::npos);
    // Resumed after step 6 (or 5, should rank 0 have been stopped before it saved step 6).
    const std::regex resumed(R"(rank [01]: resumed after step ([56])\n)");
    std::smatch m;
    REQUIRE(std::regex_search(restarted.out, m, resumed));
    CHECK(final_lines(restarted.out) == expected);
}

}  // namespace test_libtorch_trainer

#endif  // ELASTIC_TEST_LIBTORCH_TRAINER
