// chaos-worker: the worker of the chaos harness (tests/chaos/chaos.py). Its group trains in
// steps that need every rank, as collectives do: a step is an all_gather over elastic::dist and
// counts only once every rank of the world answered. After each step it appends one line, in one
// write(2), to the file $CHAOS_LOG:
//   step <group> <world> <rank> <step> <CLOCK_MONOTONIC ns> <pid>
// <group> names this worker group: rank 0's pid and clock at its start, broadcast to the others.
// Two groups whose steps interleave in time are two groups training the same job at once.
// Each rank gathers "<group>:<step>:<rank>"; a gather in which an entry names another group or
// step, or slot r another rank, appends "bad <group> <rank> <what>" and exits 1. A collective
// that times out (a peer gone, CHAOS_TIMEOUT_MS, default 20000) exits 3, as a trainer ends when
// its collective library times out; another error appends "error <rank> <what>" and exits 5.
// CHAOS_STEP_MS (default 100) apart; CHAOS_STEPS steps (default: no end), then exit 0.
#include <elastic/dist.hpp>
#include <elastic/env.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <string>
#include <string_view>
#include <thread>

#include <fcntl.h>
#include <unistd.h>

namespace {

namespace dist = elastic::dist;

long long number(const char* name, long long fallback) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return fallback;
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (*end != '\0' || n < 0) {
        std::fprintf(stderr, "chaos-worker: %s='%s' is no count\n", name, v);
        std::exit(2);
    }
    return n;
}

long long now_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<long long>(ts.tv_sec) * 1'000'000'000LL + ts.tv_nsec;
}

void append(int fd, const std::string& line) {
    // O_APPEND and one write: lines of concurrent workers never mix.
    if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
        std::perror("chaos-worker: write to CHAOS_LOG");
        std::exit(4);
    }
}

}  // namespace

int main() {
    const char* log_path = std::getenv("CHAOS_LOG");
    if (log_path == nullptr) {
        std::fprintf(stderr, "chaos-worker: CHAOS_LOG names no file\n");
        return 2;
    }
    const int fd = ::open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        std::perror("chaos-worker: open CHAOS_LOG");
        return 2;
    }
    const auto steps = number("CHAOS_STEPS", -1);
    const auto step_ms = number("CHAOS_STEP_MS", 100);
    const auto timeout_ms = number("CHAOS_TIMEOUT_MS", 20000);
    int rank = -1;
    try {
        dist::set_timeout(std::chrono::milliseconds(timeout_ms));
        rank = dist::get_global_rank();
        const int world = dist::get_world_size();
        const auto group = dist::broadcast(rank == 0 ? fmt::format("{}.{}", ::getpid(), now_ns()) : std::string(), 0);
        for (long long step = 0; steps < 0 || step < steps; ++step) {
            const auto got = dist::all_gather(fmt::format("{}:{}:{}", group, step, rank));
            std::string wrong;
            if (static_cast<int>(got.size()) != world) {
                wrong = fmt::format("{} entries in a world of {}", got.size(), world);
            }
            for (int r = 0; wrong.empty() && r < world; ++r) {
                const auto& entry = got[static_cast<std::size_t>(r)];
                if (entry != fmt::format("{}:{}:{}", group, step, r))
                    wrong = fmt::format("slot {} holds '{}'", r, entry);
            }
            if (!wrong.empty()) {
                append(fd, fmt::format("bad {} {} {}\n", group, rank, wrong));
                return 1;
            }
            append(fd, fmt::format("step {} {} {} {} {} {}\n", group, world, rank, step, now_ns(), ::getpid()));
            std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
        }
    } catch (const elastic::dist_timeout& e) {
        std::fprintf(stderr, "chaos-worker: %s\n", e.what());
        return 3;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "chaos-worker: %s\n", e.what());
        std::string what = e.what();
        for (auto& c : what) {
            if (c == '\n') c = ' ';
        }
        append(fd, fmt::format("error {} {}\n", rank, what));
        return 5;
    }
    return 0;
}
