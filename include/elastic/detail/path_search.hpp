// SPDX-License-Identifier: MIT
// The one PATH search of the library (execvp's rules), shared by the process layer's spawn and
// the launcher's program validation; each wraps the result in its own error.
#pragma once

#include "elastic/detail/config.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <string_view>

namespace elastic::inline v0::detail {

/// What stat(2)/access(2) say of a path the launcher wants to run or read.
enum class file_check { ok, missing, directory, not_executable, not_readable };

[[nodiscard]] ELASTIC_DECL file_check check_file(const std::string& path, int access_mode);

/// execvp's search path when PATH is unset (glibc >= 2.24: the current directory is no longer in it).
inline constexpr std::string_view default_search_path = "/bin:/usr/bin";

/// The outcome of a search: `found` is the path to execute (empty: none); `first_not_executable`
/// the first match that exists but may not be executed (for a better message than "not found").
struct path_search_result {
    std::string found;
    std::string first_not_executable;
};

/// Searches each directory of `search_path` in order, as execvp(3) does; an empty entry is the
/// current directory (returned as `./name`). `name` must not contain a slash.
[[nodiscard]] ELASTIC_DECL path_search_result search_path(std::string_view name, std::string_view search_path);

}  // namespace elastic::inline v0::detail

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail {

[[nodiscard]] ELASTIC_DECL file_check check_file(const std::string& path, int access_mode) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        return file_check::missing;
    }
    if (S_ISDIR(st.st_mode)) {
        return file_check::directory;
    }
    if (::access(path.c_str(), access_mode) != 0) {
        return access_mode == X_OK ? file_check::not_executable : file_check::not_readable;
    }
    return file_check::ok;
}

[[nodiscard]] ELASTIC_DECL path_search_result search_path(std::string_view name, std::string_view search_path) {
    path_search_result result;
    for (;;) {
        const auto colon = search_path.find(':');
        const auto dir = search_path.substr(0, colon);
        std::string candidate = dir.empty() ? "./" : std::string(dir) + "/";
        candidate += name;
        const auto check = check_file(candidate, X_OK);
        if (check == file_check::ok) {
            result.found = std::move(candidate);
            return result;
        }
        if (check == file_check::not_executable && result.first_not_executable.empty()) {
            result.first_not_executable = std::move(candidate);
        }
        if (colon == std::string_view::npos) return result;
        search_path.remove_prefix(colon + 1);
    }
}

}  // namespace elastic::inline v0::detail

#endif  // ELASTIC_DETAIL_BODIES
