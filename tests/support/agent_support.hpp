// Helpers for the agent's tests: a private temporary directory, and elasticrun run as a real
// child process with its stdout and stderr captured (read as events with poll, never timed).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern "C" char** environ;

namespace agent_support {

/// The launcher under test: src/elasticrun.cpp built with the tests (agent-elasticrun).
/// A port that was free a moment ago, drawn below the kernel's ephemeral range: agents that
/// must not host, or a store restarted on the same port, need a real port number, and a port
/// from the ephemeral range (what binding port 0 gives) can be drawn meanwhile as the local
/// port of any test's outgoing connection, which keeps it from the agent that should host.
/// Where the ephemeral range leaves no room below it, the kernel's choice (port 0) it is.
inline int free_port() {
    int ephemeral_low = 32768;
    if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> ephemeral_low;
    const int low = 10000;
    const bool below = ephemeral_low > low + 1000;
    static std::minstd_rand rng{static_cast<std::minstd_rand::result_type>(
        std::random_device{}() ^ static_cast<unsigned>(::getpid()) ^
        static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()))};
    std::uniform_int_distribution<int> pick(low, std::max(low, ephemeral_low - 1));
    for (int attempt = 0; attempt < 1000; ++attempt) {
        const int port = below ? pick(rng) : 0;
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd >= 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(static_cast<std::uint16_t>(port));
        const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
        socklen_t len = sizeof a;
        const bool named = bound && ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
        ::close(fd);
        if (named) return ntohs(a.sin_port);
    }
    FAIL("no free port below " << ephemeral_low << " in 1000 draws");
    return 0;
}

inline std::string elasticrun() { return ELASTIC_TEST_PROGRAM_DIR "/agent-elasticrun"; }
/// The worker whose behaviour AGENT_WORKER_DO chooses (tests/programs/agent_worker.cpp).
inline std::string worker() { return ELASTIC_TEST_PROGRAM_DIR "/agent-worker"; }

/// A fresh directory (mkdtemp), removed with its contents at the end of the scope.
class temp_dir {
public:
    temp_dir() {
        std::string pattern = (std::filesystem::temp_directory_path() / "elastic-agent-test-XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
        path_ = pattern;
    }
    ~temp_dir() {
        std::error_code ignored;
        std::filesystem::remove_all(path_, ignored);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    [[nodiscard]] const std::filesystem::path& path() const { return path_; }
    [[nodiscard]] std::string str() const { return path_.string(); }

private:
    std::filesystem::path path_;
};

/// The test's environment without anything a launcher reads or sets (PET_*, TORCHELASTIC_*,
/// the contract's names), so the case controls exactly what elasticrun sees.
inline std::map<std::string, std::string> clean_environment() {
    static const std::vector<std::string> contract{"RANK",
                                                   "WORLD_SIZE",
                                                   "LOCAL_RANK",
                                                   "LOCAL_WORLD_SIZE",
                                                   "GROUP_RANK",
                                                   "GROUP_WORLD_SIZE",
                                                   "ROLE_RANK",
                                                   "ROLE_WORLD_SIZE",
                                                   "ROLE_NAME",
                                                   "MASTER_ADDR",
                                                   "MASTER_PORT",
                                                   "OMP_NUM_THREADS",
                                                   "NODE_RANK",
                                                   "CUDA_VISIBLE_DEVICES",
                                                   "NCCL_ASYNC_ERROR_HANDLING",
                                                   "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                                   "PYTHON_EXEC",
                                                   "LOGLEVEL"};
    std::map<std::string, std::string> env;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
        const std::string entry(*e);
        const auto eq = entry.find('=');
        if (eq == std::string::npos) continue;
        const auto name = entry.substr(0, eq);
        if (name.rfind("PET_", 0) == 0 || name.rfind("TORCHELASTIC_", 0) == 0 || name.rfind("TORCH_ELASTIC_", 0) == 0 ||
            name.rfind("AGENT_WORKER", 0) == 0 || std::find(contract.begin(), contract.end(), name) != contract.end()) {
            continue;
        }
        env.emplace(name, entry.substr(eq + 1));
    }
    return env;
}

/// elasticrun (or another program) running as a child with stdout and stderr on pipes.
class launched {
public:
    launched(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
             const std::string& program = elasticrun()) {
        int out[2];
        int err[2];
        REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
        REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_adddup2(&actions, out[1], 1);
        posix_spawn_file_actions_adddup2(&actions, err[1], 2);
        std::vector<std::string> argv_strings{program};
        argv_strings.insert(argv_strings.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (auto& a : argv_strings) argv.push_back(a.data());
        argv.push_back(nullptr);
        std::vector<std::string> env_strings;
        for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
        std::vector<char*> envp;
        for (auto& e : env_strings) envp.push_back(e.data());
        envp.push_back(nullptr);
        const int rc = ::posix_spawn(&pid_, program.c_str(), &actions, nullptr, argv.data(), envp.data());
        posix_spawn_file_actions_destroy(&actions);
        ::close(out[1]);
        ::close(err[1]);
        out_fd_ = out[0];
        err_fd_ = err[0];
        REQUIRE_MESSAGE(rc == 0, "posix_spawn " << program << ": " << std::strerror(rc));
    }
    launched(const launched&) = delete;
    launched& operator=(const launched&) = delete;
    ~launched() {
        if (pid_ > 0 && !reaped_) {
            ::kill(pid_, SIGKILL);
            int status = 0;
            ::waitpid(pid_, &status, 0);
        }
        if (out_fd_ >= 0) ::close(out_fd_);
        if (err_fd_ >= 0) ::close(err_fd_);
    }

    [[nodiscard]] pid_t pid() const { return pid_; }

    /// Reads both pipes (blocking on poll: an event, not a timer) until `done(stdout so far)`
    /// holds or both pipes end. Returns whether `done` held.
    bool read_until(const std::function<bool(const std::string&)>& done) {
        while (!done(out_)) {
            if (!pump()) return done(out_);
        }
        return true;
    }

    /// Reads both pipes until `done(stderr so far)` holds or both pipes end.
    bool read_err_until(const std::function<bool(const std::string&)>& done) {
        while (!done(err_)) {
            if (!pump()) return done(err_);
        }
        return true;
    }

    /// Reads until stdout has `count` lines starting with `prefix`.
    bool read_lines(const std::string& prefix, int count) {
        return read_until([&](const std::string& text) { return count_lines(text, prefix) >= count; });
    }

    /// Reads everything, reaps, and returns the shell's exit code (128+N for signal N).
    int wait() {
        while (pump()) {
        }
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        reaped_ = true;
        return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    }

    void signal(int sig) const { ::kill(pid_, sig); }

    [[nodiscard]] const std::string& out() const { return out_; }
    [[nodiscard]] const std::string& err() const { return err_; }

    static int count_lines(const std::string& text, const std::string& prefix) {
        int n = 0;
        std::istringstream in(text);
        for (std::string line; std::getline(in, line);) {
            if (line.rfind(prefix, 0) == 0) ++n;
        }
        return n;
    }

private:
    // One poll round; false when both pipes have ended.
    bool pump() {
        pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
        if (out_fd_ < 0 && err_fd_ < 0) return false;
        if (::poll(fds, 2, -1) < 0) return errno == EINTR;
        char buffer[8192];
        for (int i = 0; i < 2; ++i) {
            int& fd = i == 0 ? out_fd_ : err_fd_;
            if (fd < 0 || fds[i].revents == 0) continue;
            const ssize_t n = ::read(fd, buffer, sizeof buffer);
            if (n > 0) {
                (i == 0 ? out_ : err_).append(buffer, static_cast<std::size_t>(n));
            } else if (n == 0 || errno != EINTR) {
                ::close(fd);
                fd = -1;
            }
        }
        return true;
    }

    pid_t pid_ = -1;
    bool reaped_ = false;
    int out_fd_ = -1;
    int err_fd_ = -1;
    std::string out_;
    std::string err_;
};

/// Runs to the end: {exit code, stdout, stderr}.
struct result {
    int code = -1;
    std::string out;
    std::string err;
};

inline result run(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                  const std::string& program = elasticrun()) {
    launched l(args, env, program);
    result r;
    r.code = l.wait();
    r.out = l.out();
    r.err = l.err();
    return r;
}

/// NAME=value lines of a file the worker wrote, as a map; empty when the file is absent.
inline std::map<std::string, std::string> read_env_file(const std::filesystem::path& path) {
    std::map<std::string, std::string> env;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
        const auto eq = line.find('=');
        if (eq != std::string::npos) env.emplace(line.substr(0, eq), line.substr(eq + 1));
    }
    return env;
}

inline std::vector<std::string> read_lines_of(const std::filesystem::path& path) {
    std::vector<std::string> lines;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

/// The environment of an agent-worker run: a clean environment, the directory the workers write
/// into and the rules (AGENT_WORKER_DO) that choose what each does.
inline std::map<std::string, std::string> worker_env(const temp_dir& dir, const std::string& rules) {
    auto env = clean_environment();
    env["AGENT_WORKER_DIR"] = dir.str();
    env["AGENT_WORKER_DO"] = rules;
    return env;
}

/// The launcher's arguments followed by agent-worker and the worker's own arguments.
inline std::vector<std::string> with_worker(std::vector<std::string> args,
                                            const std::vector<std::string>& worker_args = {}) {
    args.push_back(worker());
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    return args;
}

/// How many files in DIR have a name starting with PREFIX.
inline int count_files(const std::filesystem::path& dir, const std::string& prefix) {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
    }
    return n;
}

}  // namespace agent_support
