// logs-flood: a worker for the log tests (tests/logs/test_logs.cpp). Its first argument chooses:
//   flood N     N numbered lines on stdout and N on stderr, as fast as write(2) goes, in chunks
//               that cut lines anywhere, both streams interleaved; then one last line without
//               its newline on each ("out <rank> end", "err <rank> end")
//   say         "hello from <rank>" and "second line" on stdout, "warning from <rank>" on stderr,
//               then "partial <rank>" on stdout without a newline
//   attempts K  "attempt <a> rank <r> out" on stdout, "... err" on stderr; while the attempt
//               (TORCHELASTIC_RESTART_COUNT) is below K, rank 0 then exits 1 once every rank has
//               written; else every rank exits 0
//   errfile     writes TORCHELASTIC_ERROR_FILE's value (possibly empty) on stdout as "errfile=<v>"
#include "elastic/store/blocking_client.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <unistd.h>

namespace {

int var(const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr ? std::atoi(v) : 0;
}

void put(int fd, std::string_view text) {
    while (!text.empty()) {
        const ssize_t n = ::write(fd, text.data(), text.size());
        if (n <= 0) std::_Exit(3);
        text.remove_prefix(static_cast<std::size_t>(n));
    }
}

std::string numbered(const char* stream, int rank, int count) {
    std::string text;
    text.reserve(static_cast<std::size_t>(count) * 48);
    char line[64];
    for (int i = 0; i < count; ++i) {
        // Fixed width, so the reader can check every line and its order.
        const int len = std::snprintf(line, sizeof line, "%s %d %06d abcdefghijklmnopqrstuvwxyz\n", stream, rank, i);
        text.append(line, static_cast<std::size_t>(len));
    }
    text += std::string(stream) + " " + std::to_string(rank) + " end";
    return text;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string_view mode = argc > 1 ? argv[1] : "";
    const int rank = var("RANK");
    const int attempt = var("TORCHELASTIC_RESTART_COUNT");
    if (mode == "flood" && argc > 2) {
        const std::string out = numbered("out", rank, std::atoi(argv[2]));
        const std::string err = numbered("err", rank, std::atoi(argv[2]));
        // 4093 bytes (a prime): chunks end mid-line almost always.
        constexpr std::size_t chunk = 4093;
        for (std::size_t at = 0; at < out.size() || at < err.size(); at += chunk) {
            if (at < out.size()) put(1, std::string_view(out).substr(at, chunk));
            if (at < err.size()) put(2, std::string_view(err).substr(at, chunk));
        }
        return 0;
    }
    if (mode == "say") {
        put(1, "hello from " + std::to_string(rank) + "\n");
        put(1, "second line\n");
        put(2, "warning from " + std::to_string(rank) + "\n");
        put(1, "partial " + std::to_string(rank));
        return 0;
    }
    if (mode == "attempts" && argc > 2) {
        put(1, "attempt " + std::to_string(attempt) + " rank " + std::to_string(rank) + " out\n");
        put(2, "attempt " + std::to_string(attempt) + " rank " + std::to_string(rank) + " err\n");
        if (attempt >= std::atoi(argv[2])) return 0;
        // Rank 0 fails once every rank has written (a key each in the attempt's store), so the
        // agent stops no rank before its lines exist.
        elastic::store_client_options options;
        options.host = std::getenv("MASTER_ADDR");
        options.port = static_cast<std::uint16_t>(var("MASTER_PORT"));
        elastic::blocking_store_client client(options);
        client.set("written/" + std::to_string(rank), "1");
        if (rank != 0) return 0;
        for (int r = 0; r < var("WORLD_SIZE"); ++r) client.wait({"written/" + std::to_string(r)});
        return 1;
    }
    if (mode == "errfile") {
        const char* v = std::getenv("TORCHELASTIC_ERROR_FILE");
        put(1, std::string("errfile=") + (v != nullptr ? v : "(unset)") + "\n");
        return 0;
    }
    put(2, "logs-flood: unknown mode\n");
    return 2;
}
