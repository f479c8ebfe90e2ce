// Test helpers for the worker-side layer (env, record): run a real child program with an exact
// environment and its output in files, and private temporary directories.
#pragma once

#include "test_files.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

namespace env_support {

using test_files::temp_dir;

using test_files::read_file;

/// How a child ended and what it printed.
struct child_result {
    bool exited = false;
    int exit_code = -1;  // when exited
    int signal = 0;      // when killed by a signal
    std::string out;
    std::string err;
};

/// Variables a child keeps from the test's own environment: the sanitizers' options and what
/// the dynamic loader and Python need. Everything else is exactly `variables`.
inline std::vector<std::string> child_environment(const std::map<std::string, std::string>& variables) {
    std::vector<std::string> entries;
    for (const char* keep : {"PATH", "HOME", "LANG", "LD_LIBRARY_PATH", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS",
                             "TSAN_OPTIONS", "TMPDIR"}) {
        if (variables.count(keep) != 0) continue;
        if (const char* value = std::getenv(keep)) entries.push_back(std::string(keep) + "=" + value);
    }
    for (const auto& [name, value] : variables) entries.push_back(name + "=" + value);
    return entries;
}

/// Runs `program` with `args` and exactly the environment `variables` (plus child_environment's
/// pass-through), stdout and stderr going to files in `dir`; waits for it.
inline child_result run_child(const std::string& program, const std::vector<std::string>& args,
                              const std::map<std::string, std::string>& variables, const std::string& dir) {
    static int serial = 0;
    const std::string stem = dir + "/child-" + std::to_string(++serial);
    const std::string out_path = stem + ".out";
    const std::string err_path = stem + ".err";

    std::vector<std::string> argv_strings{program};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_strings) argv.push_back(a.data());
    argv.push_back(nullptr);
    auto env_strings = child_environment(variables);
    std::vector<char*> envp;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = 0;
    const int rc = ::posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) throw std::runtime_error("posix_spawn " + program + ": " + std::strerror(rc));

    int status = 0;
    while (::waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
    }
    child_result result;
    if (WIFEXITED(status)) {
        result.exited = true;
        result.exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
        result.signal = WTERMSIG(status);
    }
    result.out = read_file(out_path);
    result.err = read_file(err_path);
    return result;
}

/// The files directly in `dir` whose names contain `part` (none when `dir` does not exist).
inline std::vector<std::string> files_containing(const std::string& dir, const std::string& part) {
    std::vector<std::string> names;
    if (!std::filesystem::is_directory(dir)) return names;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        const auto name = entry.path().filename().string();
        if (name.find(part) != std::string::npos) names.push_back(name);
    }
    return names;
}

}  // namespace env_support
