// watchdog-bench: what the watchdog costs (docs/watchdog.md, "Costs").
//
//   watchdog-bench calls                 ns per heartbeat(), progress(), section, watched and not
//   watchdog-bench worker EVERY_US SECS  a worker for elasticrun --watchdog: a heartbeat every
//                                        EVERY_US microseconds for SECS seconds, then exit 0
//   watchdog-bench stall BEATS           a worker that sends BEATS heartbeats, prints
//                                        "stalled <CLOCK_REALTIME ns>" and stops forever
//
// bench/watchdog/bench_watchdog.py drives the last two under elasticrun (agent CPU, detection
// latency).
#include <elastic/agent/watchdog.hpp>
#include <elastic/watchdog.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <thread>

#include <unistd.h>

namespace {

template <class F>
double ns_per_call(F&& f) {
    using clock = std::chrono::steady_clock;
    constexpr long calls = 20'000'000;
    double best = 1e30;
    for (int run = 0; run < 5; ++run) {
        const auto start = clock::now();
        for (long i = 0; i < calls; ++i) f(i);
        const auto took = std::chrono::duration<double, std::nano>(clock::now() - start).count() / calls;
        if (took < best) best = took;
    }
    return best;
}

void measure(const char* label) {
    const double beat = ns_per_call([](long) { elastic::heartbeat(); });
    const double prog = ns_per_call([](long i) { elastic::progress(static_cast<std::uint64_t>(i)); });
    const double sect = ns_per_call([](long) { const elastic::section s("allreduce"); });
    std::printf("%-12s heartbeat %6.2f ns   progress %6.2f ns   section (enter+leave) %6.2f ns\n", label, beat, prog,
                sect);
}

int calls() {
    // A page as the agent makes it, named in the environment before the first call attaches.
    elastic::detail::agent::watchdog_pages pages(1);
    const bool watched = std::getenv("BENCH_NOT_WATCHED") == nullptr;
    if (watched) ::setenv(elastic::detail::watchdog::file_variable, pages.page_path(0).c_str(), 1);
    if (elastic::watched() != watched) {
        std::fprintf(stderr, "watchdog-bench: the page did not attach as expected\n");
        return 1;
    }
    measure(watched ? "watched" : "not watched");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "calls") return calls();
    if (mode == "worker" && argc == 4) {
        const auto every = std::chrono::microseconds(std::atol(argv[2]));
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(std::atol(argv[3]));
        auto next = std::chrono::steady_clock::now();
        for (std::uint64_t step = 0; std::chrono::steady_clock::now() < end; ++step) {
            elastic::progress(step);
            next += every;
            std::this_thread::sleep_until(next);
        }
        return 0;
    }
    if (mode == "stall" && argc == 3) {
        const long beats = std::atol(argv[2]);
        for (long i = 0; i < beats; ++i) {
            elastic::heartbeat();
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        timespec now{};
        ::clock_gettime(CLOCK_REALTIME, &now);
        std::printf("stalled %lld\n", static_cast<long long>(now.tv_sec) * 1'000'000'000LL + now.tv_nsec);
        std::fflush(stdout);
        for (;;) ::pause();
    }
    std::fprintf(stderr, "usage: watchdog-bench calls | worker EVERY_US SECS | stall BEATS\n");
    return 2;
}
