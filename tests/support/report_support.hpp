// Helpers for the report layer's tests: temporary directories, whole-file I/O, running a child
// process with its output captured, and building worker_failure records tersely.
#pragma once

#include "test_files.hpp"

#include "elastic/report/failure.hpp"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace report_support {

using test_files::temp_dir;

inline void write_file(const std::string& path, std::string_view contents) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    if (!out) {
        throw std::runtime_error("cannot write " + path);
    }
}

using test_files::read_file;

inline bool file_exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

/// The names in a directory (without . and ..), sorted.
inline std::vector<std::string> list_dir(const std::string& path) {
    std::vector<std::string> names;
    const std::string cmd = "ls -A '" + path + "'";
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) {
        return names;
    }
    char line[4096];
    while (std::fgets(line, sizeof line, p) != nullptr) {
        std::string s = line;
        if (!s.empty() && s.back() == '\n') {
            s.pop_back();
        }
        names.push_back(s);
    }
    ::pclose(p);
    return names;
}

/// What a finished child process left.
struct run_result {
    int wait_status = 0;
    long pid = 0;
    std::string out;
    std::string err;
};

/// Run `argv` with `env_overrides` added to this process's environment, capture stdout and
/// stderr; `on_err_chunk`, when given, sees stderr chunk by chunk as it arrives (the way the
/// agent's pipe reader will). Waits for the child's exit.
inline run_result run(const std::vector<std::string>& argv,
                      const std::map<std::string, std::string>& env_overrides = {},
                      const std::function<void(std::string_view)>& on_err_chunk = {}) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) {
        const std::string_view kv = *e;
        const auto eq = kv.find('=');
        if (eq != std::string_view::npos && env_overrides.count(std::string(kv.substr(0, eq)))) {
            continue;
        }
        env_strings.emplace_back(kv);
    }
    for (const auto& [k, v] : env_overrides) {
        env_strings.push_back(k + "=" + v);
    }
    std::vector<char*> envp;
    for (auto& s : env_strings) {
        envp.push_back(s.data());
    }
    envp.push_back(nullptr);
    std::vector<std::string> args = argv;
    std::vector<char*> argp;
    for (auto& s : args) {
        argp.push_back(s.data());
    }
    argp.push_back(nullptr);

    int out_pipe[2];
    int err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
        throw std::runtime_error("pipe2 failed");
    }
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
    ::posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, argp[0], &actions, nullptr, argp.data(), envp.data());
    ::posix_spawn_file_actions_destroy(&actions);
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    if (rc != 0) {
        ::close(out_pipe[0]);
        ::close(err_pipe[0]);
        throw std::runtime_error("posix_spawn " + argv.at(0) + ": " + std::strerror(rc));
    }
    run_result r;
    r.pid = pid;
    pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    int open_count = 2;
    char buffer[4096];
    while (open_count > 0) {
        if (::poll(fds, 2, -1) < 0) {
            if (errno == EINTR) {
                continue;
            }
            throw std::runtime_error("poll failed");
        }
        for (int k = 0; k < 2; ++k) {
            if (fds[k].fd < 0 || fds[k].revents == 0) {
                continue;
            }
            const ssize_t n = ::read(fds[k].fd, buffer, sizeof buffer);
            if (n > 0) {
                const std::string_view chunk(buffer, static_cast<std::size_t>(n));
                (k == 0 ? r.out : r.err).append(chunk);
                if (k == 1 && on_err_chunk) {
                    on_err_chunk(chunk);
                }
            } else if (n == 0 || errno != EINTR) {
                ::close(fds[k].fd);
                fds[k].fd = -1;
                --open_count;
            }
        }
    }
    while (::waitpid(pid, &r.wait_status, 0) < 0 && errno == EINTR) {
    }
    return r;
}

/// A failure observed at `at` after a common origin; system and steady clocks share the origin
/// so tests can reason about both.
inline elastic::worker_failure failure(int global_rank, elastic::exit_status status, std::chrono::milliseconds at,
                                       long pid = 0, int local_rank = -1) {
    using namespace std::chrono;
    elastic::worker_failure f;
    f.global_rank = global_rank;
    f.local_rank = local_rank < 0 ? global_rank : local_rank;
    f.pid = pid != 0 ? pid : 4200 + global_rank;
    f.host = "node0.example.com";
    f.status = status;
    // 2026-11-22 03:00:00 UTC, the hour jobs die.
    const system_clock::time_point origin{seconds(1795316400)};
    f.observed_system = origin + at;
    f.observed_steady = steady_clock::time_point{} + hours(1000) + at;
    return f;
}

}  // namespace report_support
