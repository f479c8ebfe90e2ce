// trainer: a small native trainer for elasticrun — reads its place in the job from
// elastic::env(), synchronises through elastic::dist over the store the agent hosts, and runs a
// few "steps" whose global loss every rank agrees on. Under elastic::record, any exception
// leaves torchelastic's error file for the agent's failure summary. Each step is a heartbeat
// (elastic::progress) and its collectives a section, so `elasticrun --watchdog=...` finds a rank
// that hangs, says where, and shows its stacks.
//
//     elasticrun --standalone --nproc-per-node=4 ./bin/trainer --steps=5
//
// TRAINER_FAIL=<rank>:<step> makes that rank throw at that step during the first attempt
// (TORCHELASTIC_RESTART_COUNT=0), to watch a restart with --max-restarts=1. TRAINER_HANG=<rank>:<step>
// makes that rank stop inside its "allreduce" section instead, to watch the watchdog:
//
//     TRAINER_HANG=1:3 elasticrun --standalone --nproc-per-node=2 --max-restarts=1
//         --watchdog=beat=1min,section:allreduce=5s ./bin/trainer   (one command line)
#include <elastic/dist.hpp>
#include <elastic/env.hpp>
#include <elastic/record.hpp>
#include <elastic/watchdog.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

namespace {

void say(const std::string& line) {
    std::fputs((line + "\n").c_str(), stdout);  // one line per call: ranks share the console
    std::fflush(stdout);
}

int train(int argc, char** argv) {
    int steps = 5;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg.rfind("--steps=", 0) == 0) steps = std::stoi(std::string(arg.substr(8)));
    }
    const elastic::worker_env& env = elastic::env();
    say(fmt::format("trainer rank {}/{} (local {}/{}, node {}/{}): attempt {}, store {}:{}", env.rank, env.world_size,
                    env.local_rank, env.local_world_size, env.node_rank, env.node_count, env.restart_count,
                    env.master_addr.value_or("-"), env.master_port ? std::to_string(*env.master_port) : "-"));

    int fail_rank = -1;
    int fail_step = -1;
    if (const char* spec = std::getenv("TRAINER_FAIL"); spec != nullptr && env.restart_count == 0) {
        std::sscanf(spec, "%d:%d", &fail_rank, &fail_step);
    }
    int hang_rank = -1;
    int hang_step = -1;
    if (const char* spec = std::getenv("TRAINER_HANG"); spec != nullptr && env.restart_count == 0) {
        std::sscanf(spec, "%d:%d", &hang_rank, &hang_step);
    }

    // Every rank starts from the same "model": rank 0's seed, broadcast.
    const auto seed = std::stoi(elastic::dist::broadcast(env.rank == 0 ? "42" : ""));
    double weight = seed / 10.0;
    for (int step = 1; step <= steps; ++step) {
        if (env.rank == fail_rank && step == fail_step) {
            throw std::runtime_error(fmt::format("rank {} fails at step {} (TRAINER_FAIL)", env.rank, step));
        }
        elastic::progress(static_cast<std::uint64_t>(step));  // a heartbeat that says how far it got
        // A rank's "gradient" depends on its data (its rank); the all_reduce averages them.
        const double gradient = (weight - (env.rank + 1)) * 0.5;
        double loss = 0;
        {
            const elastic::section collective("allreduce");
            if (env.rank == hang_rank && step == hang_step) {
                for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // TRAINER_HANG
            }
            const double mean = elastic::dist::all_reduce(gradient) / env.world_size;
            weight -= mean;
            loss = elastic::dist::all_reduce((weight - (env.rank + 1)) * (weight - (env.rank + 1)));
        }
        if (env.rank == 0) say(fmt::format("step {}: weight {:.6f} loss {:.6f}", step, weight, loss));
    }
    // Every rank ends with the same weight: all_gather proves it.
    const auto all = elastic::dist::all_gather(fmt::format("{:.12f}", weight));
    for (const auto& w : all) {
        if (w != all.front()) throw std::runtime_error("ranks disagree on the weight: " + w + " vs " + all.front());
    }
    elastic::dist::barrier();
    say(fmt::format("trainer rank {} done: weight {} agreed by {} ranks", env.rank, all.front(), all.size()));
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return elastic::record(train, argc, argv); }
