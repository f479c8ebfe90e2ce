// A native worker under elastic::record, for the report tests: "throw" ends in an uncaught
// exception (error file, exit 1), "segv" in a real segmentation fault (error file, SIGSEGV).
// Usage: report-recorded-crash throw | segv
#include "elastic/record.hpp"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <sys/mman.h>

namespace {

[[gnu::noinline]] void report_recorded_crash_load_checkpoint() {
    throw std::runtime_error("checkpoint step_1200.pt is truncated");
}

[[gnu::noinline]] void report_recorded_crash_touch_protected_page() {
    // A page with no access rights: a real fault that no sanitizer check intercepts first.
    void* page = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) {
        std::abort();
    }
    *static_cast<volatile int*>(page) = 1;
}

int worker_main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    std::fprintf(stderr, "worker starting (mode %s)\n", mode.c_str());
    std::fflush(stderr);
    if (mode == "throw") {
        report_recorded_crash_load_checkpoint();
    } else if (mode == "segv") {
        report_recorded_crash_touch_protected_page();
    }
    return 64;
}

}  // namespace

int main(int argc, char** argv) { return elastic::record(worker_main, argc, argv); }
