// test-tags: concurrent
// The watchdog's parts in one process: --watchdog parsed and checked; the agent's rule for
// "hung" on synthetic readings; mangled names; a page whose bytes a worker scribbled on; and
// writers racing the agent's reads of a real page file (never a name half old, half new).
#include "elastic/agent/watchdog.hpp"
#include "elastic/detail/watchdog_slot.hpp"
#include "elastic/usage_error.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace test_watchdog_page {

using namespace std::chrono_literals;
namespace wd = elastic::detail::watchdog;

TEST_CASE("watchdog: --watchdog's items parse, print back, and a bad item is named") {
    const auto w = elastic::parse_watchdog("first=5min, beat=30s,section=10min,section:save=1h,signal=usr1,dump=0",
                                           "--watchdog");
    CHECK(w.first == 5min);
    CHECK(w.beat == 30s);
    CHECK(w.section == 10min);
    REQUIRE(w.sections.count("save") == 1);
    CHECK(w.sections.at("save") == 1h);
    CHECK(w.signal == SIGUSR1);
    CHECK(w.dump == 0ms);
    CHECK(elastic::parse_watchdog(w.to_string(), "--watchdog") == w);
    CHECK(w.section_limit("save")->second == "section:save");
    CHECK(w.section_limit("other")->first == 10min);
    CHECK(w.shortest() == 0ms + 30s);

    const auto refused = [](const char* text) {
        try {
            (void)elastic::parse_watchdog(text, "--watchdog");
        } catch (const elastic::usage_error& e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    CHECK(refused("beat=30s,nap=1s").find("unknown key 'nap'") != std::string::npos);
    CHECK(refused("beat").find("'beat' has no '='") != std::string::npos);
    CHECK(refused("beat=soon").find("is not a duration") != std::string::npos);
    CHECK(refused("beat=0").find("is not a duration") != std::string::npos);
    CHECK(refused("signal=SIGKILL,beat=1s").find("is not a signal for stacks") != std::string::npos);
    CHECK(refused("signal=SIGTERM,beat=1s").find("is not a signal for stacks") != std::string::npos);
    CHECK(elastic::parse_watchdog("beat=1s,signal=SIGRTMIN+3", "x").signal == SIGRTMIN + 3);
    CHECK(refused("signal=SIGUSR2").find("sets no limit") != std::string::npos);
    CHECK(refused("beat=1s,,first=2s").find("is empty") != std::string::npos);
    CHECK(refused("").find("is empty") != std::string::npos);
    CHECK(refused("section:=1s").find("names no section") != std::string::npos);
}

TEST_CASE("watchdog: the rule for hung, on readings at chosen instants") {
    elastic::watchdog_settings w;
    w.first = 10s;
    w.beat = 2s;
    w.sections["save"] = 60s;
    const auto t0 = std::chrono::steady_clock::time_point{} + 1000s;
    elastic::detail::agent::rank_watch r;
    wd::page_snapshot s;

    // Silent since the start: only `first` applies.
    r.update(s, t0 + 5s);
    CHECK(!r.hung(w, t0, t0 + 9s));
    auto h = r.hung(w, t0, t0 + 11s);
    REQUIRE(h);
    CHECK(h->reason.find("no sign of life for 11 s since it started (--watchdog first=10s)") != std::string::npos);

    // A heartbeat: then `beat` applies from the reading that saw it.
    s.beats = 1;
    s.progress = 8;  // progress(7)
    r.update(s, t0 + 12s);
    CHECK(!r.hung(w, t0, t0 + 13s));
    h = r.hung(w, t0, t0 + 14500ms);
    REQUIRE(h);
    CHECK(h->reason == "no heartbeat for 2.5 s (--watchdog beat=2s)");
    CHECK(h->progress == 7u);
    CHECK(h->headline() == "hung: no heartbeat for 2.5 s (--watchdog beat=2s); progress 7");

    // Inside a section with a limit of its own: that limit replaces `beat`.
    s.section_seq = 2;
    s.section = "save";
    r.update(s, t0 + 15s);
    CHECK(!r.hung(w, t0, t0 + 70s));
    h = r.hung(w, t0, t0 + 76s);
    REQUIRE(h);
    CHECK(h->reason == "in section \"save\" for 61 s (--watchdog section:save=1min)");
    CHECK(h->section == "save");

    // A section without a limit: `beat` again.
    s.section_seq = 4;
    s.section = "data";
    r.update(s, t0 + 80s);
    CHECK(!r.hung(w, t0, t0 + 81s));
    CHECK(r.hung(w, t0, t0 + 83s));

    // A name being rewritten at every read keeps the previous name and its clock.
    wd::page_snapshot torn = s;
    torn.section_seq = 5;
    torn.torn = true;
    torn.section = "garbage";
    r.update(torn, t0 + 84s);
    CHECK(r.section == "data");
    // A writer stopped midway leaves the sequence odd: the same reading again is no sign of life.
    r.update(torn, t0 + 85s);
    r.update(torn, t0 + 90s);
    h = r.hung(w, t0, t0 + 90s);
    REQUIRE(h);
    CHECK(h->reason == "no heartbeat for 6 s (--watchdog beat=2s)");
}

TEST_CASE("watchdog: mangled names in a worker's stacks are made readable, anything else kept") {
    using elastic::detail::agent::demangle_frames;
    CHECK(demangle_frames("  #1 0x1 in _Z32agent_worker_stuck_in_collectivev+0x9 (/bin/w+0xabe3)\n") ==
          "  #1 0x1 in agent_worker_stuck_in_collective()+0x9 (/bin/w+0xabe3)\n");
    CHECK(demangle_frames("  #0 0x2 in pause+0x32 (libc)\n  #1 0x3 in _Zbogus\n") ==
          "  #0 0x2 in pause+0x32 (libc)\n  #1 0x3 in _Zbogus\n");
    CHECK(demangle_frames("tail in _Z") == "tail in _Z");
}

TEST_CASE("watchdog: a page a worker scribbled on reads as a valid snapshot") {
    alignas(wd::page) unsigned char bytes[wd::page_size];
    std::memset(bytes, 0xff, sizeof bytes);
    auto& p = *reinterpret_cast<wd::page*>(bytes);
    auto s = wd::read_page(p);
    CHECK(s.torn);  // the sequence is odd forever: the reader gave up, bounded
    CHECK(s.section == std::string(wd::section_capacity, '?'));
    CHECK(s.progress == ~std::uint64_t{0});

    std::memset(bytes, 0, sizeof bytes);
    wd::write_section(p, "allreduce\n\x01");
    s = wd::read_page(p);
    CHECK(!s.torn);
    CHECK(s.section == "allreduce??");
    CHECK(s.section_seq == 2);
    wd::write_section(p, std::string(100, 'x'));
    CHECK(wd::read_page(p).section == std::string(wd::section_capacity, 'x'));
}

TEST_CASE("watchdog: writers racing the agent's reads of a page file: counters grow, names are never mixed") {
    elastic::detail::agent::watchdog_pages pages(1);
    const int fd = ::open(pages.page_path(0).c_str(), O_RDWR | O_CLOEXEC);
    REQUIRE(fd >= 0);
    void* mapped = ::mmap(nullptr, wd::page_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    REQUIRE(mapped != MAP_FAILED);
    auto& page = *static_cast<wd::page*>(mapped);
    CHECK(page.magic == wd::page_magic);

    const std::vector<std::string> names{"data", "forward-and-backward", "allreduce", std::string(63, 'c')};
    std::atomic<bool> stop{false};
    std::vector<std::thread> writers;
    for (int w = 0; w < 2; ++w) {
        writers.emplace_back([&, w] {
            for (std::size_t i = 0; !stop.load(); ++i) {
                wd::counter(page.beats).fetch_add(1, std::memory_order_relaxed);
                if (w == 0) wd::write_section(page, names[i % names.size()]);
            }
        });
    }
    std::uint64_t beats = 0;
    int whole = 0;
    for (int i = 0; i < 20000; ++i) {
        const auto s = pages.read(0);
        REQUIRE(s);
        CHECK(s->beats >= beats);
        beats = s->beats;
        if (s->torn) continue;
        ++whole;
        const bool known = s->section.empty() || std::find(names.begin(), names.end(), s->section) != names.end();
        CHECK_MESSAGE(known, s->section);
    }
    stop = true;
    for (auto& t : writers) t.join();
    CHECK(whole > 0);
    ::munmap(mapped, wd::page_size);
}

}  // namespace test_watchdog_page
