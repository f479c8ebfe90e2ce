// SPDX-License-Identifier: MIT
// Internals: the watcher process that SIGKILLs every worker process group when the agent dies.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/process/cgroup.hpp"
#include "elastic/process/error.hpp"
#include "elastic/process/spawner.hpp"
#include "elastic/process/sys.hpp"

#include <algorithm>
#include <array>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

namespace elastic::inline v0::detail::process {

// Why a watcher process: PR_SET_PDEATHSIG kills the worker when the agent dies, but it is not
// inherited, so a worker's own children (wrapper scripts, data-loader processes) would survive an
// agent killed with SIGKILL; cgroup.kill is not available here, and a subreaper dies with the
// agent. So the first spawn forks a tiny process that holds one end of a Unix socket pair whose
// other end only the agent holds (close-on-exec, and every child closes descriptors above 2).
// The agent sends "add pgid" / "remove pgid" records on it; when the agent dies — however — the
// kernel closes its end, the watcher reads EOF, sends SIGKILL to every process group still
// registered and exits. It then dies with the agent by construction. (A socket rather than a
// pipe: send(MSG_NOSIGNAL) reports a dead watcher as EPIPE whatever the agent's SIGPIPE
// disposition is.)
//
// Where the agent has a cgroup directory (cgroup.hpp), the watcher also kills it and everything
// below it on EOF, and removes the directories: that reaches the descendants that left their
// worker's process group (setsid, setpgid). Without one, those are out of reach.
//
// Limits, on purpose: a group id is removed before the agent reaps the group's leader (whose zombie
// keeps the id reserved until then), so the watcher never holds an id that the kernel may hand
// to an unrelated process — except in the instant between the agent's death and the watcher's
// kill, when init may reap a leader whose number then has to be reused at once, a full wrap of
// pid_max (4 Mi on 64-bit) within microseconds.

/// One record on the watcher socket: 8 bytes, each sent whole by one send.
struct watcher_record {
    std::int32_t op;    ///< watcher_add or watcher_remove
    std::int32_t pgid;  ///< the process group
};
inline constexpr std::int32_t watcher_add = 1;
inline constexpr std::int32_t watcher_remove = 2;

/// How many worker process groups may be registered at once.
inline constexpr std::size_t watcher_capacity = 8192;

/// The watcher's whole life, in the forked child. Only async-signal-safe calls: the agent is
/// multithreaded, so after fork any lock (malloc's included) may be held by a thread that no
/// longer exists here. `table` and `buffer` were allocated by the parent before the fork.
/// `cgroup_parent` and `cgroup_name` name the agent's cgroup directory (nullptr: none).
[[noreturn]] inline void watcher_main(int read_end, pid_t* table, std::size_t capacity, unsigned char* buffer,
                                      std::size_t buffer_size, int max_fd, const char* cgroup_parent,
                                      const char* cgroup_name) noexcept {
    // Own session: a Ctrl-C or a kill aimed at the agent's process group must not end the
    // watcher before it has done its job, and no terminal hangup reaches it.
    ::setsid();
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM, SIGTSTP, SIGTTIN, SIGTTOU}) {
        ::sigaction(sig, &ignore, nullptr);
    }
    ::prctl(PR_SET_NAME, "elastic-watch", 0, 0, 0);
    if (::chdir("/") != 0) { /* keep going: only a mount point stays pinned */
    }
    // Keep nothing but the socket: not the agent's sockets (a port would stay bound), not its
    // stdout (a reader of the agent's output would never see EOF).
    if (::close_range(0, static_cast<unsigned>(read_end - 1), 0) != 0 ||
        ::close_range(static_cast<unsigned>(read_end + 1), ~0U, 0) != 0) {
        for (int fd = 0; fd < max_fd; ++fd) {
            if (fd != read_end) ::close(fd);
        }
    }
    std::size_t have = 0;
    for (;;) {
        const ssize_t n = ::read(read_end, buffer + have, buffer_size - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // EOF: the agent is gone (or the socket broke, same verdict)
        have += static_cast<std::size_t>(n);
        std::size_t used = 0;
        for (; have - used >= sizeof(watcher_record); used += sizeof(watcher_record)) {
            watcher_record record;
            std::memcpy(&record, buffer + used, sizeof record);
            if (record.op == watcher_add) {
                for (std::size_t i = 0; i < capacity; ++i) {
                    if (table[i] == 0) {
                        table[i] = record.pgid;
                        break;
                    }
                }
            } else if (record.op == watcher_remove) {
                for (std::size_t i = 0; i < capacity; ++i) {
                    if (table[i] == record.pgid) {
                        table[i] = 0;
                        break;
                    }
                }
            }
        }
        std::memmove(buffer, buffer + used, have - used);
        have -= used;
    }
    for (std::size_t i = 0; i < capacity; ++i) {
        if (table[i] > 0) ::kill(-table[i], SIGKILL);
    }
    const int parent = cgroup_parent == nullptr ? -1 : ::open(cgroup_parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent >= 0) {
        const int dir = ::openat(parent, cgroup_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir >= 0) {
            cgroup_kill_at(dir);
            ::close(dir);
        }
        // The killed processes leave their cgroups within microseconds, unless one sleeps
        // uninterruptibly (a device driver finishing a DMA, a dead network file system): try
        // every 10 ms for a second, then every second for 10 minutes — the watcher has nothing
        // else to do — then leave the directories to the system.
        for (int attempt = 0; attempt < 700 && !cgroup_remove_tree(parent, cgroup_name, 8); ++attempt) {
            const timespec pause{attempt < 100 ? 0 : 1, attempt < 100 ? 10'000'000 : 0};
            ::nanosleep(&pause, nullptr);
        }
    }
    ::_exit(0);
}

/// The agent's side of the watcher: starts it on first use, registers and retires groups,
/// restarts it (re-registering every live group) if someone killed it.
class watcher {
public:
    static ELASTIC_DECL watcher& instance();

    /// Starts the watcher if it is not running; returns its pid.
    ELASTIC_DECL pid_t ensure_started();

    /// Registers a worker's process group: it is SIGKILLed if the agent dies.
    ELASTIC_DECL void add(pid_t pgid);

    /// Retires a group. Call it before reaping the group's leader, whose zombie keeps the id
    /// reserved until then.
    ELASTIC_DECL void remove(pid_t pgid) noexcept;

    watcher(const watcher&) = delete;
    watcher& operator=(const watcher&) = delete;

private:
    watcher() = default;

    ELASTIC_DECL void start_locked();

    // Returns false if the watcher is gone (EPIPE). MSG_NOSIGNAL: no SIGPIPE, whatever the
    // agent's disposition.
    ELASTIC_DECL bool write_locked(std::int32_t op, pid_t pgid);

    ELASTIC_DECL void send_locked(std::int32_t op, pid_t pgid);

    std::mutex mutex_;
    owned_fd write_end_;
    pid_t pid_ = -1;
    std::vector<pid_t> groups_;
};

}  // namespace elastic::inline v0::detail::process

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::process {

ELASTIC_DECL watcher& watcher::instance() {
    static watcher* const self = new watcher();  // leaked: used until the very end
    return *self;
}

ELASTIC_DECL pid_t watcher::ensure_started() {
    std::lock_guard lock(mutex_);
    if (pid_ <= 0) start_locked();
    return pid_;
}

ELASTIC_DECL void watcher::add(pid_t pgid) {
    std::lock_guard lock(mutex_);
    if (groups_.size() >= watcher_capacity) {
        throw process_error("cannot watch process group " + std::to_string(pgid) + ": " +
                            std::to_string(watcher_capacity) +
                            " worker process groups are already registered (stop some first)");
    }
    groups_.push_back(pgid);
    try {
        send_locked(watcher_add, pgid);
    } catch (...) {
        groups_.pop_back();  // the caller kills and reaps the child: forget its id now
        throw;
    }
}

ELASTIC_DECL void watcher::remove(pid_t pgid) noexcept {
    std::lock_guard lock(mutex_);
    const auto it = std::find(groups_.begin(), groups_.end(), pgid);
    if (it == groups_.end()) return;
    groups_.erase(it);
    try {
        send_locked(watcher_remove, pgid);
    } catch (...) {
        // The watcher cannot be told; keeping a stale id is the lesser harm, because the
        // group's leader is still unreaped when this is called.
    }
}

ELASTIC_DECL void watcher::start_locked() {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
        throw process_error("cannot create the watcher socket: " + errno_string(errno) +
                            " (raise the open-files limit)");
    }
    owned_fd read_end = raise_above_stdio(owned_fd(fds[0]));
    owned_fd write_end(fds[1]);
    // Everything the child touches is allocated here, before the fork.
    std::vector<pid_t> table(watcher_capacity, 0);
    std::vector<unsigned char> buffer(sizeof(watcher_record) * 512);
    const std::string cgroup = cgroups::instance().root();
    const std::string cgroup_parent = cgroup.substr(0, cgroup.rfind('/'));
    const std::string cgroup_name = cgroup.substr(cgroup.rfind('/') + 1);
    rlimit limit{};
    int max_fd = 1024;
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
        max_fd = static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 20));
    }
    pid_t pid = -1;
    int fork_errno = 0;
    const int rfd = read_end.get();
    auto job = [&] {
        pid = ::fork();
        if (pid == 0) {
            watcher_main(rfd, table.data(), table.size(), buffer.data(), buffer.size(), max_fd,
                         cgroup.empty() ? nullptr : cgroup_parent.c_str(), cgroup_name.c_str());
        }
        if (pid < 0) fork_errno = errno;
    };
    spawner::instance().run(job);
    if (pid < 0) {
        throw process_error("cannot fork the watcher process: " + errno_string(fork_errno) +
                            " (check the process limit, ulimit -u)");
    }
    pid_ = pid;
    write_end_ = std::move(write_end);
    for (pid_t group : groups_) write_locked(watcher_add, group);
}

ELASTIC_DECL bool watcher::write_locked(std::int32_t op, pid_t pgid) {
    const watcher_record record{op, static_cast<std::int32_t>(pgid)};
    for (;;) {
        const ssize_t n = ::send(write_end_.get(), &record, sizeof record, MSG_NOSIGNAL);
        if (n == static_cast<ssize_t>(sizeof record)) return true;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return false;
        throw process_error("cannot write to the watcher socket: " + errno_string(n < 0 ? errno : EIO));
    }
}

ELASTIC_DECL void watcher::send_locked(std::int32_t op, pid_t pgid) {
    if (pid_ <= 0) start_locked();  // start_locked registers groups_, op already applied
    else if (!write_locked(op, pgid)) {
        // Someone killed the watcher: reap it and start another, which learns every live
        // group. (Only the next record notices; the restart re-sends every group.)
        write_end_.reset();
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        start_locked();
    }
}

}  // namespace elastic::inline v0::detail::process

#endif  // ELASTIC_DETAIL_BODIES
