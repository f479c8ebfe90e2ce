// A native worker that dies the ways real ones do, for the report tests: an uncaught exception
// (std::terminate, SIGABRT), a fatal signal, an exit code, or a flood of stderr before exiting.
// Usage: report-native-crash throw | signal <N> | exit <N> | flood <lines>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: %s throw | signal N | exit N | flood LINES\n", argv[0]);
        return 64;
    }
    const std::string mode = argv[1];
    const int n = argc > 2 ? std::atoi(argv[2]) : 0;
    std::fprintf(stderr, "worker starting (mode %s)\n", mode.c_str());
    std::fprintf(stderr, "loading shard 7 of 8\n");
    std::fflush(stderr);
    if (mode == "throw") {
        throw std::runtime_error("NCCL error: unhandled system error");
    }
    if (mode == "signal") {
        // Default disposition first: a sanitizer runtime may have installed its own handler.
        std::signal(n, SIG_DFL);
        std::raise(n);
        return 70;  // not reached for a fatal signal
    }
    if (mode == "exit") {
        std::fprintf(stderr, "fatal: checkpoint directory is not writable\n");
        return n;
    }
    if (mode == "flood") {
        for (int i = 1; i <= n; ++i) {
            std::fprintf(stderr, "step %d: loss=nan\n", i);
        }
        std::fprintf(stderr, "giving up after %d steps", n);  // no final newline
        return 3;
    }
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 64;
}
