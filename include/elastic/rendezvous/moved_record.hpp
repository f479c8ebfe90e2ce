// SPDX-License-Identifier: MIT
// Internals: the record an agent keeps on its machine of where its job's rendezvous store may
// move (the last round's successors), for an agent started there later without a
// --rdzv-endpoint list: the lost store host's replacement looks at those stores before it
// hosts a fresh store at the first endpoint.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/random.hpp"
#include "elastic/detail/runtime_dir.hpp"
#include "elastic/rendezvous/concepts.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace elastic::inline v0::detail::rendezvous {
/// How many successors a record keeps: the first ones, where the store moves first.
inline constexpr std::size_t moved_record_limit = 8;

/// The largest record read (bytes): more is no record of ours.
inline constexpr std::size_t moved_record_max_size = 4096;

/// One entry of a record: a member's idle store.
struct moved_record_entry {
    std::string addr;
    std::uint16_t port = 0;
    friend bool operator==(const moved_record_entry&, const moved_record_entry&) = default;
};

/// The record's file name for the job `key` (the job and its first endpoint): a hash of it; the
/// key itself is the record's first line.
[[nodiscard]] ELASTIC_DECL std::string moved_record_name(std::string_view key);

/// The record's text: the key, then one "<port> <address>" line per successor (at most
/// moved_record_limit).
[[nodiscard]] ELASTIC_DECL std::string moved_record_text(std::string_view key,
                                                         const std::vector<store_successor>& successors);

/// The entries of a record's `text` for the job `key`: none when it is another job's, or not a
/// record; a malformed line is skipped.
[[nodiscard]] ELASTIC_DECL std::vector<moved_record_entry> parse_moved_record(std::string_view text,
                                                                              std::string_view key);

/// How old a record may grow before another write removes it, unless its writer still runs: a
/// job killed outright leaves its record behind (one that succeeds removes it).
inline constexpr long moved_record_max_age_s = 30L * 24 * 3600;

/// Removes the records in `dir` (a descriptor) not written for moved_record_max_age_s whose
/// writer is gone.
ELASTIC_DECL void sweep_moved_records(int dir) noexcept;

/// Writes the record for `key` in this user's private directory (made aside, then renamed in),
/// and removes other jobs' records older than moved_record_max_age_s. Empty, or why it could not.
[[nodiscard]] ELASTIC_DECL std::string write_moved_record(std::string_view key,
                                                          const std::vector<store_successor>& successors);

/// The record for `key` in this user's private directory: none when there is none, or it is
/// not a regular file of this user's, or not a record of this job.
[[nodiscard]] ELASTIC_DECL std::vector<moved_record_entry> read_moved_record(std::string_view key);

/// Removes the record for `key` (the job ended).
ELASTIC_DECL void remove_moved_record(std::string_view key) noexcept;

}  // namespace elastic::inline v0::detail::rendezvous

#if ELASTIC_DETAIL_BODIES

#include "elastic/detail/format.hpp"

#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace elastic::inline v0::detail::rendezvous {

ELASTIC_DECL std::string moved_record_name(std::string_view key) {
    std::uint64_t hash = 14695981039346656037ULL;  // FNV-1a
    for (const char c : key) {
        hash ^= static_cast<unsigned char>(c);
        hash *= 1099511628211ULL;
    }
    return detail::format("moved-store.{:016x}", hash);
}

ELASTIC_DECL std::vector<moved_record_entry> parse_moved_record(std::string_view text, std::string_view key) {
    std::vector<moved_record_entry> out;
    const auto next_line = [&text]() -> std::string_view {
        const auto end = text.find('\n');
        if (end == std::string_view::npos) {  // an unfinished last line is no line
            text = {};
            return {};
        }
        const auto line = text.substr(0, end);
        text.remove_prefix(end + 1);
        return line;
    };
    if (next_line() != "elastic moved-store record 1" || next_line() != key) return out;
    while (!text.empty() && out.size() < moved_record_limit) {
        const auto line = next_line();
        const auto space = line.find(' ');
        if (space == std::string_view::npos || space + 1 >= line.size()) continue;
        unsigned port = 0;
        const auto [end, error] = std::from_chars(line.data(), line.data() + space, port);
        if (error != std::errc{} || end != line.data() + space || port == 0 || port > 65535) continue;
        const auto addr = line.substr(space + 1);
        if (addr.size() > 255) continue;
        out.push_back({std::string(addr), static_cast<std::uint16_t>(port)});
    }
    return out;
}

// Whether the record `name` in `dir` names a writer (its "writer <pid>" line) that still runs.
inline bool moved_record_writer_alive(int dir, const char* name) noexcept {
    const int fd = ::openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return false;
    char text[moved_record_max_size + 1];
    const auto n = ::read(fd, text, moved_record_max_size);
    ::close(fd);
    if (n <= 0) return false;
    text[n] = '\0';
    const char* writer = std::strstr(text, "\nwriter ");
    if (writer == nullptr) return false;
    const long pid = std::strtol(writer + 8, nullptr, 10);
    return pid > 0 && pid <= 0x3fffffff && ::kill(static_cast<pid_t>(pid), 0) == 0;
}

ELASTIC_DECL void sweep_moved_records(int dir) noexcept {
    const int copy = ::fcntl(dir, F_DUPFD_CLOEXEC, 0);
    DIR* d = copy < 0 ? nullptr : ::fdopendir(copy);
    if (d == nullptr) {
        if (copy >= 0) ::close(copy);
        return;
    }
    const auto now = ::time(nullptr);
    while (const dirent* e = ::readdir(d)) {
        if (std::strncmp(e->d_name, "moved-store.", 12) != 0) continue;
        struct stat st {};
        if (::fstatat(dir, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || now - st.st_mtime <= moved_record_max_age_s) {
            continue;
        }
        if (!moved_record_writer_alive(dir, e->d_name)) ::unlinkat(dir, e->d_name, 0);
    }
    ::closedir(d);
}

ELASTIC_DECL std::vector<moved_record_entry> read_moved_record(std::string_view key) {
    std::string why;
    std::string dir_path;
    try {
        dir_path = runtime_directory().string();
    } catch (const std::exception&) {
        return {};
    }
    const int dir = open_private_directory(dir_path, false, why);
    if (dir < 0) return {};
    const int fd = ::openat(dir, moved_record_name(key).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    ::close(dir);
    if (fd < 0) return {};
    struct stat st {};
    std::string text;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
        st.st_size <= static_cast<off_t>(moved_record_max_size)) {
        text.resize(static_cast<std::size_t>(st.st_size));
        const auto n = ::read(fd, text.data(), text.size());
        text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    }
    ::close(fd);
    return parse_moved_record(text, key);
}

ELASTIC_DECL void remove_moved_record(std::string_view key) noexcept {
    try {
        std::string why;
        const int dir = open_private_directory(runtime_directory(), false, why);
        if (dir < 0) return;
        ::unlinkat(dir, moved_record_name(key).c_str(), 0);
        ::close(dir);
    } catch (...) {
        // No directory, or out of memory: nothing to remove.
    }
}

ELASTIC_DECL std::string moved_record_text(std::string_view key, const std::vector<store_successor>& successors) {
    // The writer's pid: the sweep keeps an old record whose writer still runs (a long job
    // without a new round). A reader skips the line (it names no port).
    std::string text = detail::format("elastic moved-store record 1\n{}\nwriter {}\n", key, ::getpid());
    std::size_t count = 0;
    for (const auto& s : successors) {
        if (count == moved_record_limit) break;
        if (s.port == 0 || s.addr.empty() || s.addr.find_first_of(" \n") != std::string::npos) continue;
        text += detail::format("{} {}\n", s.port, s.addr);
        ++count;
    }
    return text;
}

ELASTIC_DECL std::string write_moved_record(std::string_view key, const std::vector<store_successor>& successors) {
    std::string why;
    std::string dir_path;
    try {
        dir_path = runtime_directory().string();
    } catch (const std::exception& e) {
        return e.what();
    }
    const int dir = open_private_directory(dir_path, true, why);
    if (dir < 0) return why.empty() ? detail::format("cannot open {}", dir_path) : why;
    const auto name = moved_record_name(key);
    // Its own name: writers on one machine (a pid may repeat across pid namespaces) never share it.
    const auto aside = detail::format("{}.{:016x}.tmp", name, random_u64());
    const auto text = moved_record_text(key, successors);
    const int fd = ::openat(dir, aside.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        why = detail::format("cannot write {}/{}: {}", dir_path, aside, std::strerror(errno));
        ::close(dir);
        return why;
    }
    std::size_t done = 0;
    while (done < text.size()) {
        const auto n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += static_cast<std::size_t>(n);
    }
    const int error = errno;
    ::close(fd);
    if (done != text.size()) {
        why = detail::format("cannot write {}/{}: {}", dir_path, aside, std::strerror(error));
    } else if (::renameat(dir, aside.c_str(), dir, name.c_str()) != 0) {
        why = detail::format("cannot rename into {}/{}: {}", dir_path, name, std::strerror(errno));
    }
    if (!why.empty()) ::unlinkat(dir, aside.c_str(), 0);
    sweep_moved_records(dir);
    ::close(dir);
    return why;
}

}  // namespace elastic::inline v0::detail::rendezvous

#endif  // ELASTIC_DETAIL_BODIES
