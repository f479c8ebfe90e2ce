// libtorch-trainer: a native trainer on libtorch under elasticrun. Its ranks form a
// c10d::ProcessGroupGloo over the store the agent hosts (MASTER_ADDR:MASTER_PORT, read through
// elastic::env()), fit a line y = 3x + 1 to data split across the ranks with an all-reduce of
// real tensors per step, and checkpoint after every step, so that a restarted group resumes where
// the failed one stopped and ends with the same model as a run that never failed.
//
//     elasticrun --standalone --nproc-per-node=2 --max-restarts=1 ./bin/libtorch-trainer
//                --steps=20 --checkpoint=/tmp/line.ckpt --fail-at=7
//
// --fail-at=S makes rank 1 throw at step S during the first attempt (TORCHELASTIC_RESTART_COUNT
// 0): elastic::record leaves the error file, the agent restarts the group, and the new attempt
// resumes from the checkpoint of step S-1. Built when CMake finds Torch and Gloo's headers
// (Debian: libtorch-dev, libgloo-dev); docs/worker-guide.md, "A libtorch trainer".
#include <elastic/env.hpp>
#include <elastic/record.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct options {
    int steps = 20;
    std::string checkpoint;  // empty: no checkpoint
    int fail_at = -1;
};

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        const auto value = [&](std::string_view name) -> std::string { return std::string(arg.substr(name.size())); };
        if (arg.rfind("--steps=", 0) == 0) {
            o.steps = std::stoi(value("--steps="));
        } else if (arg.rfind("--checkpoint=", 0) == 0) {
            o.checkpoint = value("--checkpoint=");
        } else if (arg.rfind("--fail-at=", 0) == 0) {
            o.fail_at = std::stoi(value("--fail-at="));
        } else {
            throw std::invalid_argument("unknown argument '" + std::string(arg) +
                                        "' (want --steps=N, "
                                        "--checkpoint=PATH, --fail-at=S)");
        }
    }
    return o;
}

/// The model and how far training got: "step w b", written whole or not at all.
struct state {
    int step = 0;  // steps done
    double w = 0.0;
    double b = 0.0;
};

state load(const std::string& path) {
    state s;
    if (path.empty() || !std::filesystem::exists(path)) return s;
    std::ifstream in(path);
    if (!(in >> s.step >> s.w >> s.b)) throw std::runtime_error("checkpoint " + path + " is unreadable");
    return s;
}

void save(const std::string& path, const state& s) {
    const std::string temporary = path + ".tmp";
    {
        std::ofstream out(temporary, std::ios::trunc);
        out.precision(17);
        out << s.step << ' ' << s.w << ' ' << s.b << '\n';
        if (!out.flush()) throw std::runtime_error("cannot write checkpoint " + temporary);
    }
    std::filesystem::rename(temporary, path);  // atomic: a reader sees the old one or the new one
}

int train(int argc, char** argv) {
    const options opt = parse(argc, argv);
    const elastic::worker_env& env = elastic::env();
    if (!env.master_addr || !env.master_port) throw std::runtime_error("MASTER_ADDR and MASTER_PORT are not set");

    // The agent's store for this attempt: a client of it, as torchrun's workers are.
    c10d::TCPStoreOptions store_options;
    store_options.port = *env.master_port;
    store_options.isServer = false;
    store_options.waitWorkers = false;
    auto store = c10::make_intrusive<c10d::TCPStore>(*env.master_addr, store_options);
    auto gloo = c10d::ProcessGroupGloo::Options::create();
    gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    c10d::ProcessGroupGloo group(c10::make_intrusive<c10d::PrefixStore>("libtorch-trainer", store), env.rank,
                                 env.world_size, gloo);

    // This rank's shard of the data: 8 points of y = 3x + 1.
    const auto x = at::arange(8, at::kDouble) / 8.0 + env.rank;
    const auto y = x * 3.0 + 1.0;

    state s = load(opt.checkpoint);
    if (s.step > 0) std::printf("rank %d: resumed after step %d\n", env.rank, s.step);
    const double lr = 0.05;
    for (int step = s.step + 1; step <= opt.steps; ++step) {
        if (env.rank == 1 && step == opt.fail_at && env.restart_count == 0) {
            throw std::runtime_error("rank 1 fails at step " + std::to_string(step) + " (--fail-at)");
        }
        const auto error = x * s.w + s.b - y;
        // The gradient of the mean squared error over this shard, summed over every rank.
        std::vector<at::Tensor> gradient{at::stack({(error * x).mean() * 2.0, error.mean() * 2.0})};
        group.allreduce(gradient)->wait();
        const auto mean = gradient[0] / static_cast<double>(env.world_size);
        s.w -= lr * mean[0].item<double>();
        s.b -= lr * mean[1].item<double>();
        s.step = step;
        if (env.rank == 0 && !opt.checkpoint.empty()) save(opt.checkpoint, s);
    }
    // Every rank holds the same model: an all-reduce of it equals world_size copies.
    std::vector<at::Tensor> model{at::tensor({s.w, s.b}, at::kDouble)};
    group.allreduce(model)->wait();
    if (!at::allclose(model[0] / static_cast<double>(env.world_size), at::tensor({s.w, s.b}, at::kDouble))) {
        throw std::runtime_error("the ranks disagree on the model");
    }
    std::printf("rank %d of %d: step %d w %.12f b %.12f\n", env.rank, env.world_size, s.step, s.w, s.b);
    std::fflush(stdout);
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return elastic::record(train, argc, argv); }
