// SPDX-License-Identifier: MIT
// Internals: this user's private directory for what agents on this machine leave for each other
// (status files, the record of where a job's store may have moved).
#pragma once

#include "elastic/detail/config.hpp"

#include <filesystem>
#include <string>

namespace elastic::inline v0::detail {

/// `$XDG_RUNTIME_DIR/elastic` when XDG_RUNTIME_DIR is an absolute path, else
/// `<temporary directory>/elastic-<uid>`; std::filesystem::filesystem_error when TMPDIR names no
/// directory.
[[nodiscard]] ELASTIC_DECL std::filesystem::path runtime_directory();

/// Opens `dir` (made, mode 0700, when `create` and missing) and checks that it is a directory of
/// this user's, not a link, that nobody else may write: its descriptor, or -1 with `why` set
/// (ENOENT: it does not exist, with `why` empty).
[[nodiscard]] ELASTIC_DECL int open_private_directory(const std::filesystem::path& dir, bool create, std::string& why);

}  // namespace elastic::inline v0::detail

#if ELASTIC_DETAIL_BODIES

#include "elastic/detail/format.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace elastic::inline v0::detail {

ELASTIC_DECL std::filesystem::path runtime_directory() {
    if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime != nullptr && *runtime == '/') {
        return std::filesystem::path(runtime) / "elastic";
    }
    return std::filesystem::temp_directory_path() / detail::format("elastic-{}", ::geteuid());
}

ELASTIC_DECL int open_private_directory(const std::filesystem::path& dir, bool create, std::string& why) {
    why.clear();
    if (create && ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
        why = detail::format("cannot make {}: {}", dir.string(), std::strerror(errno));
        return -1;
    }
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) why = detail::format("cannot open {}: {}", dir.string(), std::strerror(errno));
        return -1;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
        ::close(fd);
        why = detail::format("{} is not a directory of this user's that only it may write (another user's?); "
                             "remove it",
                             dir.string());
        return -1;
    }
    return fd;
}

}  // namespace elastic::inline v0::detail

#endif  // ELASTIC_DETAIL_BODIES
