// A worker under elastic::record that fails the way argv[1] says, from functions with known names,
// so tests can check the error file and the backtrace: throw, throw-int, thread-throw, segv,
// overflow (the stack), terminate, abort, return (exits 3 without failing).
#include <elastic/record.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>

#include <sys/mman.h>

// The names the tests look for in the backtrace. noinline: each must be a frame of its own.
[[gnu::noinline]] void record_child_throwing_function(int depth) {
    if (depth > 0) {
        // Not a tail call: the frame of this function stays on the stack.
        record_child_throwing_function(depth - 1);
        std::printf("unreachable\n");
        return;
    }
    throw std::runtime_error("disk on fire: \"quoted\", tab\t, newline\n, caf\xc3\xa9, \xf0\x9f\x94\xa5");
}

[[gnu::noinline]] void record_child_int_throwing_function() { throw 42; }

[[gnu::noinline]] void record_child_thread_throwing_function() { throw std::logic_error("thread failed"); }

[[gnu::noinline]] void record_child_segfaulting_function() {
    // A page with no access rights: a real fault that no sanitizer check intercepts first.
    void* page = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) std::abort();
    *static_cast<volatile int*>(page) = 1;
    std::printf("unreachable\n");
}

// Recursion without end (the limit is never set): the handler must run on the alternate stack.
volatile int record_child_depth_limit = 0;
[[gnu::noinline]] int record_child_overflowing_function(int depth) {
    volatile char frame[512];
    frame[0] = static_cast<char>(depth);
    if (record_child_depth_limit != 0 && depth >= record_child_depth_limit) return 0;
    return record_child_overflowing_function(depth + 1) + frame[0];
}

[[gnu::noinline]] void record_child_terminating_function() { std::terminate(); }

[[gnu::noinline]] void record_child_aborting_function() { std::abort(); }

int worker_main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "";
    std::printf("working in mode %s\n", mode.c_str());  // left in stdio's buffer: must be flushed
    if (mode == "throw") record_child_throwing_function(2);
    if (mode == "throw-int") record_child_int_throwing_function();
    if (mode == "thread-throw") {
        std::thread thread(record_child_thread_throwing_function);
        thread.join();
    }
    if (mode == "segv") record_child_segfaulting_function();
    if (mode == "overflow") std::printf("%d\n", record_child_overflowing_function(0));
    if (mode == "terminate") record_child_terminating_function();
    if (mode == "abort") record_child_aborting_function();
    if (mode == "return") return 3;
    std::fprintf(stderr, "record_child: unknown mode '%s'\n", mode.c_str());
    return 2;
}

int main(int argc, char** argv) { return elastic::record(worker_main, argc, argv); }
