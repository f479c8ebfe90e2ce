// A libtorch c10d::TCPStore client (Debian's libtorch-dev 1.13) driven from the command line:
// `libtorch-store-client <port> <op> [args]...`; prints one line per operation. Built once,
// without our warning and sanitizer flags (tests/store_client/tests.cmake).
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace {

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

}  // namespace

// Operations: set K V | get K | add K N | compare_set K EXPECTED DESIRED | check K |
// wait K | num_keys | delete K
int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s <port> <op> [args]...\n", argv[0]);
        return 2;
    }
    try {
        c10d::TCPStoreOptions options;
        options.port = static_cast<std::uint16_t>(std::stoi(argv[1]));
        options.isServer = false;
        options.waitWorkers = false;
        options.timeout = std::chrono::seconds(60);
        c10d::TCPStore store("127.0.0.1", options);
        for (int i = 2; i < argc;) {
            const std::string op = argv[i++];
            const auto arg = [&]() -> std::string {
                if (i >= argc) throw std::runtime_error("missing argument for " + op);
                return argv[i++];
            };
            if (op == "set") {
                const auto k = arg();
                store.set(k, bytes(arg()));
                std::printf("set %s\n", k.c_str());
            } else if (op == "get") {
                const auto k = arg();
                std::printf("get %s = %s\n", k.c_str(), text(store.get(k)).c_str());
            } else if (op == "add") {
                const auto k = arg();
                const auto n = std::stoll(arg());
                std::printf("add %s = %lld\n", k.c_str(), static_cast<long long>(store.add(k, n)));
            } else if (op == "compare_set") {
                const auto k = arg();
                const auto e = arg();
                const auto d = arg();
                std::printf("compare_set %s = %s\n", k.c_str(), text(store.compareSet(k, bytes(e), bytes(d))).c_str());
            } else if (op == "check") {
                const auto k = arg();
                std::printf("check %s = %d\n", k.c_str(), store.check({k}) ? 1 : 0);
            } else if (op == "wait") {
                const auto k = arg();
                store.wait({k});
                std::printf("wait %s\n", k.c_str());
            } else if (op == "num_keys") {
                std::printf("num_keys = %lld\n", static_cast<long long>(store.getNumKeys()));
            } else if (op == "delete") {
                const auto k = arg();
                std::printf("delete %s = %d\n", k.c_str(), store.deleteKey(k) ? 1 : 0);
            } else {
                std::fprintf(stderr, "unknown operation %s\n", op.c_str());
                return 2;
            }
            std::fflush(stdout);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "libtorch-store-client: %s\n", e.what());
        return 1;
    }
    return 0;
}
