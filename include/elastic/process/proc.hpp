// SPDX-License-Identifier: MIT
// Internals: async-signal-safe readers of /proc — a process's parent, session and start time,
// its children — for finding what a worker left behind where there is no cgroup (reaper.hpp).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

namespace elastic::inline v0::detail::process {

// Everything here runs in the watcher after fork (watcher.hpp) as well as in the agent: plain
// system calls, buffers on the stack, no allocation, no locale, no stdio.

/// What /proc/<pid>/stat says of one process: the fields the sweeps need.
struct proc_stat {
    char state = '?';              ///< 'Z' for a zombie
    pid_t ppid = 0;                ///< its parent (after an orphaning: the reaper that adopted it)
    pid_t pgrp = 0;                ///< its process group
    pid_t session = 0;             ///< its session id
    std::uint64_t start_time = 0;  ///< clock ticks after boot: with the pid, names one process
};

/// "<prefix><n><suffix>" into `out`, NUL-terminated; false if it does not fit.
inline bool proc_path(char* out, std::size_t size, const char* prefix, long n, const char* suffix) noexcept {
    std::size_t at = 0;
    const auto put = [&](char c) {
        if (at + 1 >= size) return false;
        out[at++] = c;
        return true;
    };
    for (const char* p = prefix; *p != '\0'; ++p) {
        if (!put(*p)) return false;
    }
    char digits[24];
    std::size_t count = 0;
    unsigned long value = n < 0 ? 0UL : static_cast<unsigned long>(n);
    do {
        digits[count++] = static_cast<char>('0' + value % 10);
        value /= 10;
    } while (value != 0 && count < sizeof digits);
    while (count > 0) {
        if (!put(digits[--count])) return false;
    }
    for (const char* p = suffix; *p != '\0'; ++p) {
        if (!put(*p)) return false;
    }
    out[at] = '\0';
    return true;
}

/// Reads /proc/<pid>/stat. False if the process is gone (or was reaped) or the file is unreadable.
inline bool read_proc_stat(pid_t pid, proc_stat& out) noexcept {
    char path[48];
    if (pid <= 0 || !proc_path(path, sizeof path, "/proc/", pid, "/stat")) return false;
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char text[1024];
    std::size_t have = 0;
    for (;;) {
        const ssize_t n = ::read(fd, text + have, sizeof text - 1 - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        have += static_cast<std::size_t>(n);
        if (have == sizeof text - 1) break;
    }
    ::close(fd);
    text[have] = '\0';
    // "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
    // stime cutime cstime priority nice threads itrealvalue starttime ...": comm may hold any
    // byte, ')' included, so the fields start after the last ')'.
    std::size_t close = have;
    for (std::size_t i = 0; i < have; ++i) {
        if (text[i] == ')') close = i;
    }
    if (close + 2 >= have) return false;
    // Fields from the state on (the 3rd), separated by one space each.
    std::size_t at = close + 2;
    out.state = text[at];
    for (int field = 4; field <= 22; ++field) {
        while (at < have && text[at] != ' ') ++at;
        if (at >= have) return false;
        ++at;
        if (field != 4 && field != 5 && field != 6 && field != 22) continue;
        std::uint64_t value = 0;
        for (; at < have && text[at] >= '0' && text[at] <= '9'; ++at) {
            value = value * 10 + static_cast<std::uint64_t>(text[at] - '0');
        }
        if (field == 4) out.ppid = static_cast<pid_t>(value);
        if (field == 5) out.pgrp = static_cast<pid_t>(value);
        if (field == 6) out.session = static_cast<pid_t>(value);
        if (field == 22) out.start_time = value;
    }
    return true;
}

/// Closes a descriptor when it goes out of scope (an exception of a callback included).
struct proc_fd {
    int fd;
    ~proc_fd() {
        if (fd >= 0) ::close(fd);
    }
};

/// Calls `f(pid)` for each decimal number in the file at `path` (space or newline separated).
/// False if the file cannot be opened.
template <class F>
bool for_each_number_in(const char* path, F&& f) noexcept(noexcept(f(pid_t{}))) {
    const proc_fd file{::open(path, O_RDONLY | O_CLOEXEC)};
    if (file.fd < 0) return false;
    const int fd = file.fd;
    char text[512];
    long value = 0;
    bool in_number = false;
    for (;;) {
        const ssize_t n = ::read(fd, text, sizeof text);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        for (ssize_t i = 0; i < n; ++i) {
            if (text[i] >= '0' && text[i] <= '9') {
                value = value * 10 + (text[i] - '0');
                in_number = true;
            } else {
                if (in_number) f(static_cast<pid_t>(value));
                value = 0;
                in_number = false;
            }
        }
    }
    if (in_number) f(static_cast<pid_t>(value));
    return true;
}

/// Calls `f(pid)` for each numeric entry of the directory at `path` (/proc, /proc/<pid>/task).
/// False if it cannot be opened.
template <class F>
bool for_each_numeric_entry(const char* path, F&& f) noexcept(noexcept(f(pid_t{}))) {
    const proc_fd dir{::open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
    if (dir.fd < 0) return false;
    const int fd = dir.fd;
    alignas(8) char buffer[4096];
    for (;;) {
        const long n = ::syscall(SYS_getdents64, fd, buffer, sizeof buffer);
        if (n <= 0) break;
        for (long at = 0; at < n;) {
            // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
            unsigned short reclen = 0;
            std::memcpy(&reclen, buffer + at + 16, sizeof reclen);
            const char* name = buffer + at + 19;
            at += reclen;
            long value = 0;
            bool numeric = *name != '\0';
            for (const char* p = name; *p != '\0'; ++p) {
                if (*p < '0' || *p > '9') {
                    numeric = false;
                    break;
                }
                value = value * 10 + (*p - '0');
            }
            if (numeric) f(static_cast<pid_t>(value));
        }
    }
    return true;
}

/// Calls `f(child)` for each child of `pid`, read from every thread's
/// /proc/<pid>/task/<tid>/children (a child's parent is one thread). Where the kernel has no
/// such files (built without CONFIG_PROC_CHILDREN), every process in /proc whose parent is `pid`.
/// Nothing when `pid` is gone. A snapshot: a child forked meanwhile may be missed, so callers
/// repeat until they find none. If `f` throws, the exception leaves (with the descriptors closed).
template <class F>
void for_each_child(pid_t pid, F&& f) noexcept(noexcept(f(pid_t{}))) {
    char task_dir[48];
    if (!proc_path(task_dir, sizeof task_dir, "/proc/", pid, "/task/")) return;
    bool any_file = false;
    const bool exists = for_each_numeric_entry(task_dir, [&](pid_t tid) {
        char children[96];
        if (proc_path(children, sizeof children, task_dir, tid, "/children") && for_each_number_in(children, f)) {
            any_file = true;
        }
    });
    if (!exists || any_file) return;
    for_each_numeric_entry("/proc", [&](pid_t candidate) {
        proc_stat stat;
        if (read_proc_stat(candidate, stat) && stat.ppid == pid) f(candidate);
    });
}

}  // namespace elastic::inline v0::detail::process
