// SPDX-License-Identifier: MIT
// What each worker runs: the program (executable, Python script or module), its resolution on
// PATH as execvp does, the command line, and torchrun's `${local_rank}` substitution.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/path_search.hpp"
#include "elastic/detail/text.hpp"
#include "elastic/usage_error.hpp"

#include "elastic/detail/format.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

namespace elastic::inline v0 {

/// How the program is run.
enum class program_kind {
    automatic,      ///< a `.py` file runs as a Python script, anything else as an executable
    executable,     ///< run directly (`--no-python`): `program args...`
    python_script,  ///< `$PYTHON_EXEC -u script args...` (also `--run-path`)
    python_module,  ///< `$PYTHON_EXEC -u -m module args...` (`-m` / `--module`)
};

/// The program each worker runs, as a custom launcher fills it in.
struct worker_program {
    program_kind kind = program_kind::automatic;
    std::string target;              ///< executable (path or name on PATH), script path, or module name
    std::vector<std::string> args;   ///< passed untouched, except `${local_rank}` (see substitute_local_rank)
    std::string python = "python3";  ///< interpreter for scripts and modules (`PYTHON_EXEC`; path or name on PATH)
};

/// A program resolved to something execv can run.
struct worker_command {
    program_kind kind = program_kind::executable;  ///< never automatic
    std::string path;                              ///< the file to execv: the executable or the interpreter, as found
    std::vector<std::string> argv;                 ///< argv[0] as the user wrote it, then the arguments

    /// argv for one worker: `${local_rank}` substituted in every argument after argv[0].
    [[nodiscard]] std::vector<std::string> argv_for(int local_rank) const;
};

/// torchrun's `${local_rank}` macro in one argument, with the semantics of Python's
/// `string.Template(arg).safe_substitute(local_rank=N)` that torchrun uses: `${local_rank}` and
/// `$local_rank` (not followed by an identifier character) become N, `$$` becomes `$`, anything
/// else (other names, `${LOCAL_RANK}`, a lone `$`) is left as it is.
[[nodiscard]] ELASTIC_DECL std::string substitute_local_rank(std::string_view arg, int local_rank);

/// Finds an executable as execvp(3) would: a name with a `/` is taken as it is; otherwise each
/// directory of `PATH` from `env` is tried in order (an empty entry is the current directory; no
/// `PATH` means glibc's default `/bin:/usr/bin`). `role` names the thing in errors ("program",
/// "PYTHON_EXEC"). Throws usage_error if it is missing, a directory, or not executable.
[[nodiscard]] ELASTIC_DECL std::string find_executable(std::string_view name, const environment& env,
                                                       std::string_view role);

/// The kind a program runs as: `automatic` becomes python_script for a `.py` target, else executable.
[[nodiscard]] ELASTIC_DECL program_kind effective_kind(const worker_program& program);

namespace detail::agent {

[[nodiscard]] ELASTIC_DECL bool valid_module_name(std::string_view name);

}  // namespace detail::agent

/// Resolves a program to the command the workers run, checking on the way that it can run: the
/// executable (or the interpreter) exists and is executable, a script exists and is readable, a
/// module name is a dotted Python name. Throws usage_error naming what is wrong.
[[nodiscard]] ELASTIC_DECL worker_command resolve_program(const worker_program& program, const environment& env);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL std::string substitute_local_rank(std::string_view arg, int local_rank) {
    const auto id_start = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_'; };
    const auto id_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; };
    const auto value = detail::format("{}", local_rank);
    std::string out;
    out.reserve(arg.size());
    std::size_t i = 0;
    while (i < arg.size()) {
        if (arg[i] != '$' || i + 1 == arg.size()) {
            out += arg[i++];
            continue;
        }
        const char next = arg[i + 1];
        if (next == '$') {
            out += '$';
            i += 2;
        } else if (id_start(next)) {
            auto end = i + 1;
            while (end < arg.size() && id_char(arg[end])) {
                ++end;
            }
            const auto name = arg.substr(i + 1, end - i - 1);
            out += name == "local_rank" ? std::string_view{value} : arg.substr(i, end - i);
            i = end;
        } else if (next == '{' && i + 2 < arg.size() && id_start(arg[i + 2])) {
            auto end = i + 2;
            while (end < arg.size() && id_char(arg[end])) {
                ++end;
            }
            if (end < arg.size() && arg[end] == '}') {
                const auto name = arg.substr(i + 2, end - i - 2);
                out += name == "local_rank" ? std::string_view{value} : arg.substr(i, end + 1 - i);
                i = end + 1;
            } else {
                out += '$';
                ++i;
            }
        } else {
            out += '$';
            ++i;
        }
    }
    return out;
}

ELASTIC_DECL std::vector<std::string> worker_command::argv_for(int local_rank) const {
    std::vector<std::string> out;
    out.reserve(argv.size());
    for (std::size_t i = 0; i < argv.size(); ++i) {
        out.push_back(i == 0 ? argv[i] : substitute_local_rank(argv[i], local_rank));
    }
    return out;
}

[[nodiscard]] ELASTIC_DECL std::string find_executable(std::string_view name, const environment& env,
                                                       std::string_view role) {
    if (name.empty()) {
        throw usage_error{detail::format("{}: the name is empty", role)};
    }
    const auto describe = [&](detail::file_check check, std::string_view path) {
        switch (check) {
            case detail::file_check::missing: return detail::format("{} {} does not exist", role, path);
            case detail::file_check::directory:
                return detail::format("{} {} is a directory, not a program", role, path);
            default:
                return detail::format("{} {} is not executable (chmod +x it, or run a script through its interpreter)",
                                      role, path);
        }
    };
    if (name.find('/') != std::string_view::npos) {
        const std::string path{name};
        const auto check = detail::check_file(path, X_OK);
        if (check != detail::file_check::ok) {
            throw usage_error{describe(check, path)};
        }
        return path;
    }
    const auto* path_variable = detail::find_variable(env, "PATH");
    const std::string search = path_variable != nullptr ? *path_variable : std::string(detail::default_search_path);
    auto [found, first_not_executable] = detail::search_path(name, search);
    if (!found.empty()) return found;
    if (!first_not_executable.empty()) {
        throw usage_error{describe(detail::file_check::not_executable, first_not_executable)};
    }
    throw usage_error{detail::format("{} {} not found on PATH ({})", role, name, search)};
}

[[nodiscard]] ELASTIC_DECL program_kind effective_kind(const worker_program& program) {
    if (program.kind != program_kind::automatic) {
        return program.kind;
    }
    const std::string_view target = program.target;
    return target.size() > 3 && target.substr(target.size() - 3) == ".py" ? program_kind::python_script
                                                                          : program_kind::executable;
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::agent {

[[nodiscard]] ELASTIC_DECL bool valid_module_name(std::string_view name) {
    for (const auto part : detail::split(name, '.')) {
        if (part.empty() || std::isdigit(static_cast<unsigned char>(part.front())) != 0 ||
            !std::all_of(part.begin(), part.end(),
                         [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; })) {
            return false;
        }
    }
    return true;
}

}  // namespace detail::agent
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL worker_command resolve_program(const worker_program& program, const environment& env) {
    worker_command command;
    command.kind = effective_kind(program);
    if (program.target.empty()) {
        throw usage_error{"no program to run (usage: elasticrun [options] program [args...])"};
    }
    switch (command.kind) {
        case program_kind::automatic:
        case program_kind::executable:
            command.kind = program_kind::executable;
            command.path = find_executable(program.target, env, "program");
            command.argv.push_back(program.target);
            break;
        case program_kind::python_script: {
            const auto check = detail::check_file(program.target, R_OK);
            if (check == detail::file_check::missing) {
                throw usage_error{detail::format("script {} does not exist", program.target)};
            }
            if (check == detail::file_check::directory) {
                throw usage_error{detail::format("script {} is a directory, not a script", program.target)};
            }
            if (check != detail::file_check::ok) {
                throw usage_error{detail::format("script {} is not readable", program.target)};
            }
            command.path = find_executable(program.python, env, "PYTHON_EXEC");
            command.argv = {program.python, "-u", program.target};
            break;
        }
        case program_kind::python_module:
            if (!detail::agent::valid_module_name(program.target)) {
                throw usage_error{
                    detail::format("-m {}: not a Python module name (want dotted identifiers such as pkg.train)",
                                   program.target)};
            }
            command.path = find_executable(program.python, env, "PYTHON_EXEC");
            command.argv = {program.python, "-u", "-m", program.target};
            break;
    }
    command.argv.insert(command.argv.end(), program.args.begin(), program.args.end());
    return command;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
