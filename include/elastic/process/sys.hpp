// SPDX-License-Identifier: MIT
// Internals of the process layer: an owning descriptor and the Linux calls glibc 2.36 lacks.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/process/error.hpp"

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

namespace elastic::inline v0::detail::process {

/// Async-signal-safe: the monotonic clock, in milliseconds.
inline std::int64_t monotonic_ms() noexcept {
    timespec t{};
    ::clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<std::int64_t>(t.tv_sec) * 1000 + t.tv_nsec / 1'000'000;
}

/// Async-signal-safe: waits until `fd` is readable (a pidfd: its process ended) or the
/// monotonic_ms() `deadline` passes, through EINTR. True when it is readable.
inline bool readable_by(int fd, std::int64_t deadline) noexcept {
    for (;;) {
        const std::int64_t left = deadline - monotonic_ms();
        if (left <= 0) return false;
        pollfd ready{fd, POLLIN, 0};
        const int n = ::poll(&ready, 1, static_cast<int>(left));
        if (n < 0 && errno == EINTR) continue;
        return n > 0;
    }
}

/// Async-signal-safe: whether the process held by `pidfd` has ended, every thread of it (a zombie
/// has; one whose main thread alone has ended, which /proc already shows as a zombie, has not).
inline bool has_ended(int pidfd) noexcept {
    pollfd ended{pidfd, POLLIN, 0};
    return ::poll(&ended, 1, 0) == 1;
}

/// Owns one file descriptor; closes it on destruction. Move-only.
class owned_fd {
public:
    owned_fd() noexcept = default;
    explicit owned_fd(int fd) noexcept : fd_(fd) {}
    owned_fd(owned_fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    owned_fd& operator=(owned_fd&& other) noexcept {
        if (this != &other) reset(std::exchange(other.fd_, -1));
        return *this;
    }
    owned_fd(const owned_fd&) = delete;
    owned_fd& operator=(const owned_fd&) = delete;
    ~owned_fd() { reset(); }

    [[nodiscard]] int get() const noexcept { return fd_; }
    [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
    int release() noexcept { return std::exchange(fd_, -1); }
    void reset(int fd = -1) noexcept {
        if (fd_ >= 0) ::close(fd_);
        fd_ = fd;
    }

private:
    int fd_ = -1;
};

/// `strerror` text for an errno value, thread-safe.
ELASTIC_DECL std::string errno_string(int err);

/// A pidfd for `pid` (always close-on-exec). glibc 2.36's <sys/pidfd.h> has no extern "C" guard
/// for C++, hence the raw system call.
ELASTIC_DECL int pidfd_open(pid_t pid) noexcept;

/// Signals the process behind a pidfd: unlike kill(pid), it cannot hit a recycled pid.
ELASTIC_DECL int pidfd_send_signal(int pidfd, int sig) noexcept;

/// waitid's P_PIDFD (Linux 5.4); glibc 2.36's idtype_t does not name it.
inline constexpr idtype_t p_pidfd = static_cast<idtype_t>(3);

/// Whether the process behind `pidfd` (our child) has exited, leaving it a zombie (WNOWAIT) so its
/// pid, and so its process-group id, cannot be reused while we may still signal the group.
/// Returns true and fills `info` when it has.
ELASTIC_DECL bool peek_exit(int pidfd, siginfo_t& info) noexcept;

/// Reaps our exited child behind `pidfd`; returns false if it has not exited yet.
ELASTIC_DECL bool reap_now(int pidfd) noexcept;

/// Whether `pid` still has a thread running: what tells a process whose main thread alone has
/// ended (/proc shows it a zombie, waitpid cannot reap it) from a dead one. False when gone;
/// true when it cannot tell (no descriptor left), the safe answer for a caller that kills.
ELASTIC_DECL bool threads_left(pid_t pid) noexcept;

/// What every agent that spawns needs from its process-wide signal dispositions (idempotent):
/// SIGPIPE ignored, so writing to a pipe whose reader died (a worker's stdin, the watcher) is an
/// EPIPE error instead of the agent's death; and SIGCHLD not ignored, because with SIGCHLD set to
/// SIG_IGN the kernel reaps children itself and their exit status is lost to waitid.
ELASTIC_DECL void prepare_agent_signals() noexcept;

/// The soft open-files limit the process had before raise_open_files_limit (RLIM_INFINITY
/// until it is called): what a worker gets back, so it sees the limit its user set.
ELASTIC_DECL rlim_t& original_open_files_soft_limit() noexcept;

/// Raises the soft RLIMIT_NOFILE to the hard limit: a store host holds one descriptor per
/// client, and a job of many nodes and workers passes a default soft limit of 1024 long before
/// the hard one. Idempotent; returns the soft limit now in force.
ELASTIC_DECL rlim_t raise_open_files_limit() noexcept;

/// Moves `fd` to a number above 2 (close-on-exec), so a child's dup2 onto 0, 1, 2 cannot clobber
/// a descriptor it still needs when the agent runs with one of its standard streams closed.
ELASTIC_DECL owned_fd raise_above_stdio(owned_fd fd);

}  // namespace elastic::inline v0::detail::process

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::process {

ELASTIC_DECL std::string errno_string(int err) { return std::system_category().message(err); }

ELASTIC_DECL int pidfd_open(pid_t pid) noexcept { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0U)); }

ELASTIC_DECL int pidfd_send_signal(int pidfd, int sig) noexcept {
    return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0U));
}

ELASTIC_DECL bool peek_exit(int pidfd, siginfo_t& info) noexcept {
    info = siginfo_t{};
    for (;;) {
        const int rc = ::waitid(p_pidfd, static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG | WNOWAIT);
        if (rc == 0) return info.si_pid != 0;
        if (errno != EINTR) return false;
    }
}

ELASTIC_DECL bool reap_now(int pidfd) noexcept {
    siginfo_t info{};
    for (;;) {
        const int rc = ::waitid(p_pidfd, static_cast<id_t>(pidfd), &info, WEXITED | WNOHANG);
        if (rc == 0) return info.si_pid != 0;
        if (errno != EINTR) return errno == ECHILD;  // already reaped: nothing left to do
    }
}

ELASTIC_DECL bool threads_left(pid_t pid) noexcept {
    const int pidfd = pidfd_open(pid);
    if (pidfd < 0) return errno != ESRCH;  // out of descriptors, say: taken as running, to be killed
    const bool running = !has_ended(pidfd);
    ::close(pidfd);
    return running;
}

ELASTIC_DECL void prepare_agent_signals() noexcept {
    struct sigaction current {};
    // SIGPIPE: a dead worker's pipe is EPIPE. SIGXFSZ: a log file past `ulimit -f` is EFBIG,
    // reported as a failed log write, not the agent's death.
    for (const int sig : {SIGPIPE, SIGXFSZ}) {
        if (::sigaction(sig, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
            (current.sa_flags & SA_SIGINFO) == 0) {
            struct sigaction ignore {};
            ignore.sa_handler = SIG_IGN;
            ::sigaction(sig, &ignore, nullptr);
        }
    }
    if (::sigaction(SIGCHLD, nullptr, &current) == 0 &&
        ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_IGN)) {
        struct sigaction deflt {};
        deflt.sa_handler = SIG_DFL;
        ::sigaction(SIGCHLD, &deflt, nullptr);
    }
    if (::sigaction(SIGCHLD, nullptr, &current) == 0 && (current.sa_flags & SA_NOCLDWAIT) != 0) {
        current.sa_flags &= ~SA_NOCLDWAIT;  // same effect as SIG_IGN on our children's status
        ::sigaction(SIGCHLD, &current, nullptr);
    }
}

ELASTIC_DECL rlim_t& original_open_files_soft_limit() noexcept {
    static rlim_t soft = RLIM_INFINITY;
    return soft;
}

ELASTIC_DECL rlim_t raise_open_files_limit() noexcept {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
    if (original_open_files_soft_limit() == RLIM_INFINITY) original_open_files_soft_limit() = limit.rlim_cur;
    if (limit.rlim_cur < limit.rlim_max) {
        const rlim_t before = limit.rlim_cur;
        limit.rlim_cur = limit.rlim_max;
        if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return before;
    }
    return limit.rlim_cur;
}

ELASTIC_DECL owned_fd raise_above_stdio(owned_fd fd) {
    if (!fd || fd.get() > 2) return fd;
    const int moved = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 3);
    if (moved < 0) {
        throw process_error("cannot move descriptor " + std::to_string(fd.get()) +
                            " above 2 for a child: " + errno_string(errno) + " (raise the open-files limit)");
    }
    return owned_fd(moved);
}

}  // namespace elastic::inline v0::detail::process

#endif  // ELASTIC_DETAIL_BODIES
