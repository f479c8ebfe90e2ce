// SPDX-License-Identifier: MIT
// Internals: the watcher process that SIGKILLs every worker process group when the agent dies.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/process/cgroup.hpp"
#include "elastic/process/error.hpp"
#include "elastic/process/proc.hpp"
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
#include <poll.h>
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
// worker's process group (setsid, setpgid). Where it has none, the agent is the child subreaper
// of its workers (reaper.hpp) and tells the watcher which workers to follow: every 100 ms the
// watcher walks their trees and the agent's adopted children, and remembers each process that
// left its worker's session (pid and start time); on EOF it kills those, and every process in a
// followed worker's session or a remembered one's. What leaves a session and is orphaned within
// one walk of the agent's death is not seen.
//
// Limits, on purpose: a group id is removed before the agent reaps the group's leader (whose zombie
// keeps the id reserved until then), so the watcher never holds an id that the kernel may hand
// to an unrelated process — except in the instant between the agent's death and the watcher's
// kill, when init may reap a leader whose number then has to be reused at once, a full wrap of
// pid_max (4 Mi on 64-bit) within microseconds.

/// One record on the watcher socket: 8 bytes, each sent whole by one send.
struct watcher_record {
    std::int32_t op;    ///< watcher_add, watcher_remove, watcher_contain or watcher_sync
    std::int32_t pgid;  ///< the process group (a worker's pid)
};
inline constexpr std::int32_t watcher_add = 1;
inline constexpr std::int32_t watcher_remove = 2;  ///< of the group, and of the session if contained
/// A worker without a cgroup whose descendants the watcher follows (reaper.hpp): its session
/// (its pid) and whatever in its tree leaves it.
inline constexpr std::int32_t watcher_contain = 3;
/// Follow now, then answer with the record's number (in `pgid`): what the agent's descendants
/// are now is known.
inline constexpr std::int32_t watcher_sync = 4;
/// A worker spawned with own_cgroup = false: what it leaves in its session is left alone.
inline constexpr std::int32_t watcher_exempt = 5;

/// How many worker process groups may be registered at once.
inline constexpr std::size_t watcher_capacity = 8192;

/// How many processes that left a contained worker's session the watcher remembers.
inline constexpr std::size_t watcher_stray_capacity = 4096;

/// How often the watcher follows contained workers' trees, while there are any.
inline constexpr int watcher_follow_ms = 100;

/// A process that left a contained worker's session: its pid and start time (together, one
/// process, whatever happens to the number later).
struct watcher_stray {
    pid_t pid;
    std::uint64_t start_time;
};

/// Everything the watcher works with, allocated by the agent before the fork.
struct watcher_plan {
    int read_end;
    pid_t* groups;          ///< watcher_capacity entries, 0 = free
    pid_t* sessions;        ///< watcher_capacity entries, the first `session_count` used
    watcher_stray* strays;  ///< watcher_stray_capacity entries
    pid_t* queue;           ///< watcher_capacity entries, for walking trees
    pid_t* exempt;          ///< watcher_stray_capacity entries, a ring
    unsigned char* buffer;  ///< for records
    std::size_t buffer_size;
    int max_fd;
    pid_t agent;                ///< the agent's pid
    pid_t agent_session;        ///< the agent's session: its own children, not a worker's
    const char* cgroup_parent;  ///< nullptr: no cgroup directory
    const char* cgroup_name;
};

/// The watcher's record of what contained workers left or may leave behind (all async-signal-safe).
struct watcher_follow {
    const watcher_plan& plan;
    std::size_t session_count = 0;
    std::size_t stray_count = 0;
    std::size_t exempt_next = 0;
    bool any_exempt = false;  // then a process that started its own session is not ours to guess

    [[nodiscard]] bool contained(pid_t session) const noexcept {
        for (std::size_t i = 0; i < session_count; ++i) {
            if (plan.sessions[i] == session) return true;
        }
        return false;
    }
    [[nodiscard]] bool group(pid_t pgid) const noexcept {
        for (std::size_t i = 0; i < watcher_capacity; ++i) {
            if (plan.groups[i] == pgid) return true;
        }
        return false;
    }
    [[nodiscard]] bool stray(pid_t pid) const noexcept {
        for (std::size_t i = 0; i < stray_count; ++i) {
            if (plan.strays[i].pid == pid) return true;
        }
        return false;
    }
    [[nodiscard]] bool exempted(pid_t session) const noexcept {
        for (std::size_t i = 0; i < watcher_stray_capacity; ++i) {
            if (plan.exempt[i] == session) return true;
        }
        return false;
    }
    void exempt(pid_t session) noexcept {
        any_exempt = true;
        plan.exempt[exempt_next] = session;
        exempt_next = (exempt_next + 1) % watcher_stray_capacity;
    }
    /// A worker just registered was, for a walk, an unknown child of the agent: not a stray.
    void forget(pid_t pid) noexcept {
        for (std::size_t i = 0; i < stray_count; ++i) {
            if (plan.strays[i].pid == pid) {
                plan.strays[i] = plan.strays[--stray_count];
                return;
            }
        }
    }
    void contain(pid_t session) noexcept {
        if (!contained(session) && session_count < watcher_capacity) plan.sessions[session_count++] = session;
    }
    void release(pid_t session) noexcept {
        for (std::size_t i = 0; i < session_count; ++i) {
            if (plan.sessions[i] == session) {
                plan.sessions[i] = plan.sessions[--session_count];
                return;
            }
        }
    }

    /// Walks every contained worker's tree, and the trees of the agent's adopted children (what
    /// a worker left when its parent died), and records each process outside a contained
    /// session: those are out of reach of the session sweep below. Forgets strays that ended.
    void scan(bool agent_alive) noexcept {
        std::size_t kept = 0;
        for (std::size_t i = 0; i < stray_count; ++i) {
            proc_stat now;
            if (read_proc_stat(plan.strays[i].pid, now) && now.start_time == plan.strays[i].start_time) {
                plan.strays[kept++] = plan.strays[i];
            }
        }
        stray_count = kept;
        if (session_count == 0) return;
        std::size_t queued = 0;
        for (std::size_t i = 0; i < session_count && queued < watcher_capacity; ++i) {
            plan.queue[queued++] = plan.sessions[i];
        }
        const pid_t self = ::getpid();
        if (agent_alive)
            for_each_child(plan.agent, [&](pid_t child) {
                proc_stat stat;
                if (child == self || group(child) || !read_proc_stat(child, stat)) return;
                // The agent's own children, and an uncontained worker's orphans, are not ours; nor,
                // once there are such workers, a process that started a session of its own.
                if (stat.session == plan.agent_session || exempted(stat.session)) return;
                if (any_exempt && !contained(stat.session)) return;
                if (queued < watcher_capacity) plan.queue[queued++] = child;
            });
        for (std::size_t at = 0; at < queued; ++at) {
            for_each_child(plan.queue[at], [&](pid_t child) {
                if (queued < watcher_capacity) plan.queue[queued++] = child;
            });
        }
        for (std::size_t at = 0; at < queued; ++at) {
            const pid_t pid = plan.queue[at];
            proc_stat stat;
            if (contained(pid) || stray(pid) || !read_proc_stat(pid, stat) || contained(stat.session)) continue;
            if (stray_count < watcher_stray_capacity) plan.strays[stray_count++] = {pid, stat.start_time};
        }
    }

    /// SIGKILLs every stray still the same process, then every process in a contained session
    /// or a stray's (twice: a process forking while the first pass ran).
    void kill_all() noexcept {
        for (std::size_t i = 0; i < stray_count; ++i) {
            // Through a pidfd opened before the start time is checked: the process checked is
            // the one signalled, even if the number is reused meanwhile.
            const int pidfd = pidfd_open(plan.strays[i].pid);
            if (pidfd < 0) continue;
            proc_stat now;
            if (read_proc_stat(plan.strays[i].pid, now) && now.start_time == plan.strays[i].start_time) {
                pidfd_send_signal(pidfd, SIGKILL);
            }
            ::close(pidfd);
        }
        if (session_count == 0 && stray_count == 0) return;
        for (int pass = 0; pass < 2; ++pass) {
            for_each_numeric_entry("/proc", [&](pid_t pid) {
                proc_stat stat;
                if (read_proc_stat(pid, stat) && (contained(stat.session) || stray(stat.session))) {
                    ::kill(pid, SIGKILL);
                }
            });
        }
    }
};

/// The watcher's whole life, in the forked child. Only async-signal-safe calls: the agent is
/// multithreaded, so after fork any lock (malloc's included) may be held by a thread that no
/// longer exists here. Everything in `plan` was allocated by the parent before the fork.
[[noreturn]] inline void watcher_main(const watcher_plan& plan) noexcept {
    const int read_end = plan.read_end;
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
        for (int fd = 0; fd < plan.max_fd; ++fd) {
            if (fd != read_end) ::close(fd);
        }
    }
    watcher_follow follow{plan};
    std::size_t have = 0;
    std::int64_t last_walk = monotonic_ms();
    for (;;) {
        if (follow.session_count > 0) {
            // Contained workers without cgroups: follow their trees every watcher_follow_ms,
            // however often records arrive.
            const std::int64_t left = last_walk + watcher_follow_ms - monotonic_ms();
            if (left <= 0) {
                follow.scan(true);
                last_walk = monotonic_ms();
                continue;
            }
            pollfd ready{read_end, POLLIN, 0};
            const int n = ::poll(&ready, 1, static_cast<int>(left));
            if (n < 0 && errno == EINTR) continue;
            if (n == 0) continue;
        }
        const ssize_t n = ::read(read_end, plan.buffer + have, plan.buffer_size - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // EOF: the agent is gone (or the socket broke, same verdict)
        have += static_cast<std::size_t>(n);
        std::size_t used = 0;
        for (; have - used >= sizeof(watcher_record); used += sizeof(watcher_record)) {
            watcher_record record;
            std::memcpy(&record, plan.buffer + used, sizeof record);
            if (record.op == watcher_add) {
                for (std::size_t i = 0; i < watcher_capacity; ++i) {
                    if (plan.groups[i] == 0) {
                        plan.groups[i] = record.pgid;
                        break;
                    }
                }
                follow.forget(record.pgid);
            } else if (record.op == watcher_remove) {
                for (std::size_t i = 0; i < watcher_capacity; ++i) {
                    if (plan.groups[i] == record.pgid) {
                        plan.groups[i] = 0;
                        break;
                    }
                }
                follow.release(record.pgid);
            } else if (record.op == watcher_contain) {
                follow.contain(record.pgid);
            } else if (record.op == watcher_exempt) {
                follow.exempt(record.pgid);
                follow.forget(record.pgid);
            } else if (record.op == watcher_sync) {
                follow.scan(true);
                last_walk = monotonic_ms();
                ::send(read_end, &record.pgid, sizeof record.pgid, MSG_NOSIGNAL);
            }
        }
        std::memmove(plan.buffer, plan.buffer + used, have - used);
        have -= used;
    }
    // Strays first, while the workers' trees still hold them: killing the groups orphans them.
    // (Not the agent's children: its pid may name another process once it is reaped.)
    follow.scan(false);
    for (std::size_t i = 0; i < watcher_capacity; ++i) {
        if (plan.groups[i] > 0) ::kill(-plan.groups[i], SIGKILL);
    }
    follow.kill_all();
    const int parent = plan.cgroup_parent == nullptr ? -1
                                                     : ::open(plan.cgroup_parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent >= 0) {
        const int dir = ::openat(parent, plan.cgroup_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir >= 0) {
            cgroup_kill_at(dir);
            ::close(dir);
        }
        // The killed processes leave their cgroups within microseconds, unless one sleeps
        // uninterruptibly (a device driver finishing a DMA, a dead network file system): try
        // every 10 ms for a second, then every second for 10 minutes — the watcher has nothing
        // else to do — then leave the directories to the system.
        for (int attempt = 0; attempt < 700 && !cgroup_remove_tree(parent, plan.cgroup_name, 8); ++attempt) {
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

    /// Follows a registered worker that has no cgroup (reaper.hpp): when the agent dies, every
    /// process in its session, and every one seen in its tree outside it, is SIGKILLed too.
    ELASTIC_DECL void contain(pid_t pgid);

    /// A registered worker spawned with own_cgroup = false: what it leaves in its session is
    /// not followed (the last watcher_stray_capacity such workers).
    ELASTIC_DECL void exempt(pid_t pgid);

    /// Has the watcher walk the contained workers' trees now, and waits (up to `timeout_ms`)
    /// until it has. False if it did not answer in time.
    ELASTIC_DECL bool sync(int timeout_ms);

    /// Whether `pid` is a registered group (a spawned child not yet reaped), or the watcher.
    ELASTIC_DECL bool watching(pid_t pid);

    watcher(const watcher&) = delete;
    watcher& operator=(const watcher&) = delete;

private:
    watcher() = default;

    ELASTIC_DECL void start_locked();
    ELASTIC_DECL void restart_locked();

    // Returns false if the watcher is gone (EPIPE). MSG_NOSIGNAL: no SIGPIPE, whatever the
    // agent's disposition.
    ELASTIC_DECL bool write_locked(std::int32_t op, pid_t pgid);

    ELASTIC_DECL void send_locked(std::int32_t op, pid_t pgid);

    std::mutex mutex_;
    owned_fd write_end_;
    pid_t pid_ = -1;
    std::vector<pid_t> groups_;
    std::vector<pid_t> contained_;  // a subset of groups_
    std::vector<pid_t> exempt_;     // the newest last, at most watcher_stray_capacity
    std::uint32_t syncs_ = 0;
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
    std::erase(contained_, pgid);
    try {
        send_locked(watcher_remove, pgid);
    } catch (...) {
        // The watcher cannot be told; keeping a stale id is the lesser harm, because the
        // group's leader is still unreaped when this is called.
    }
}

ELASTIC_DECL void watcher::contain(pid_t pgid) {
    std::lock_guard lock(mutex_);
    if (std::find(groups_.begin(), groups_.end(), pgid) == groups_.end()) return;
    contained_.push_back(pgid);
    send_locked(watcher_contain, pgid);
}

ELASTIC_DECL void watcher::exempt(pid_t pgid) {
    std::lock_guard lock(mutex_);
    if (exempt_.size() >= watcher_stray_capacity) exempt_.erase(exempt_.begin());
    exempt_.push_back(pgid);
    send_locked(watcher_exempt, pgid);
}

ELASTIC_DECL bool watcher::sync(int timeout_ms) {
    std::lock_guard lock(mutex_);
    if (pid_ <= 0) start_locked();
    const auto number = static_cast<std::int32_t>(++syncs_ & 0x7fffffffU);
    if (!write_locked(watcher_sync, number)) {
        restart_locked();
        if (!write_locked(watcher_sync, number)) return false;
    }
    // Answers come in order; one to an earlier sync that timed out is read and skipped.
    const std::int64_t deadline = monotonic_ms() + timeout_ms;
    for (;;) {
        if (!readable_by(write_end_.get(), deadline)) return false;
        std::int32_t answer = 0;
        if (::recv(write_end_.get(), &answer, sizeof answer, MSG_WAITALL) != static_cast<ssize_t>(sizeof answer)) {
            return false;
        }
        if (answer == number) return true;
    }
}

ELASTIC_DECL bool watcher::watching(pid_t pid) {
    std::lock_guard lock(mutex_);
    return pid == pid_ || std::find(groups_.begin(), groups_.end(), pid) != groups_.end();
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
    std::vector<pid_t> groups(watcher_capacity, 0);
    std::vector<pid_t> sessions(watcher_capacity, 0);
    std::vector<watcher_stray> strays(watcher_stray_capacity, watcher_stray{0, 0});
    std::vector<pid_t> queue(watcher_capacity, 0);
    std::vector<pid_t> exempt(watcher_stray_capacity, 0);
    std::vector<unsigned char> buffer(sizeof(watcher_record) * 512);
    const std::string cgroup = cgroups::instance().root();
    const std::string cgroup_parent = cgroup.substr(0, cgroup.rfind('/'));
    const std::string cgroup_name = cgroup.substr(cgroup.rfind('/') + 1);
    rlimit limit{};
    int max_fd = 1024;
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
        max_fd = static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 20));
    }
    const watcher_plan plan{read_end.get(),     groups.data(), sessions.data(),
                            strays.data(),      queue.data(),  exempt.data(),
                            buffer.data(),      buffer.size(), max_fd,
                            ::getpid(),         ::getsid(0),   cgroup.empty() ? nullptr : cgroup_parent.c_str(),
                            cgroup_name.c_str()};
    pid_t pid = -1;
    int fork_errno = 0;
    auto job = [&] {
        pid = ::fork();
        if (pid == 0) watcher_main(plan);
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
    for (pid_t group : contained_) write_locked(watcher_contain, group);
    for (pid_t group : exempt_) write_locked(watcher_exempt, group);
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
        restart_locked();  // only the next record notices; the restart re-sends every group
    }
}

ELASTIC_DECL void watcher::restart_locked() {
    // Someone killed the watcher: reap it and start another, which learns every live group.
    write_end_.reset();
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    start_locked();
}

}  // namespace elastic::inline v0::detail::process

#endif  // ELASTIC_DETAIL_BODIES
