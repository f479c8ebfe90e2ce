// SPDX-License-Identifier: MIT
// Groups of workers: await the first exit among many, and stop them all (signal, grace, SIGKILL).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/process/child.hpp"
#include "elastic/process/error.hpp"
#include "elastic/process/exit.hpp"
#include "elastic/process/sys.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

namespace elastic::inline v0 {

namespace detail::process {

/// Many pidfds awaited as one event source: a private epoll instance (level-triggered) holding
/// them, itself awaited as one descriptor by Asio. Each exit is seen when it happens, not when
/// a sequential wait reaches it, so exit times stay exact.
class exit_set {
public:
    explicit exit_set(const asio::any_io_executor& executor) : epoll_(executor) {
        const int fd = ::epoll_create1(EPOLL_CLOEXEC);
        if (fd < 0) throw process_error("cannot create an epoll instance: " + errno_string(errno));
        epoll_.assign(fd);
    }

    /// Watches `pidfd` (borrowed: it must outlive the watch); `token` names it in `next`.
    ELASTIC_DECL void add(int pidfd, std::size_t token);

    /// How many watched processes have not been reported by `next` yet.
    [[nodiscard]] std::size_t size() const noexcept { return tokens_.size(); }

    /// The token of one process that exited (removed from the set). Cancellable.
    template <class Defer = void>
    asio::awaitable<std::size_t> next() {
        for (;;) {
            epoll_event event{};
            const int n = ::epoll_wait(epoll_.native_handle(), &event, 1, 0);
            if (n == 1) {
                const std::size_t token = event.data.u64;
                const auto it = std::find_if(tokens_.begin(), tokens_.end(),
                                             [token](const entry& e) { return e.token == token; });
                if (it != tokens_.end()) {
                    ::epoll_ctl(epoll_.native_handle(), EPOLL_CTL_DEL, it->fd, nullptr);
                    tokens_.erase(it);
                }
                co_return token;
            }
            if (n < 0 && errno != EINTR) {
                throw process_error("cannot wait on an epoll instance: " + errno_string(errno));
            }
            co_await epoll_.async_wait(asio::posix::descriptor_base::wait_read, detail::use_awaitable<Defer>);
        }
    }

    /// The tokens not reported yet.
    [[nodiscard]] ELASTIC_DECL std::vector<std::size_t> pending() const;

private:
    struct entry {
        std::size_t token;
        int fd;
    };
    asio::posix::stream_descriptor epoll_;
    std::vector<entry> tokens_;
};

/// The process-group id in /proc/<pid>/stat; -1 if the process is gone. A zombie keeps its group:
/// /proc shows a process as a zombie as soon as its main thread has ended, while its other
/// threads may still be exiting (a sanitizer's background thread, say); its pidfd tells whether
/// it is dead.
ELASTIC_DECL pid_t read_pgid(pid_t pid);

/// A process found in a group, held by a pidfd so its number cannot be recycled under us.
struct group_member {
    pid_t pid;
    owned_fd pidfd;
};

/// Every process in the groups `pgids`, except `skip` (the leaders), at stop time (not a polling
/// loop), that has not ended (one whose every thread has exited, a zombie awaiting its reaper,
/// is not listed). Each is held by a pidfd, then its group is checked again, so a pid recycled
/// between the search and pidfd_open is not mistaken for a member. Where `cgroups` names the worker
/// cgroup of every group (one entry per pgid), only the processes of those cgroups and the ones
/// below them are candidates: what a worker starts is born there. Otherwise, or where a cgroup
/// cannot be read, one scan of /proc: every process of the host. (A member that left the
/// cgroup is missed here; `stop` finds it after the reap.)
ELASTIC_DECL std::vector<group_member> group_members(const std::vector<pid_t>& pgids, const std::vector<pid_t>& skip,
                                                     const std::vector<std::string>& cgroups = {});

/// Pointers to each of `children`, for the overloads that take workers by value.
ELASTIC_DECL std::vector<child_process*> addresses(std::span<child_process> children);

}  // namespace detail::process

/// Waits until one of `children` that has not exited yet exits, and returns its index (its
/// status() is then set). Returns `children.size()` at once if none is left running. Exit
/// times are exact for all of them: the waits run side by side. Cancellable.
template <class Defer = void>
asio::awaitable<std::size_t> wait_any(std::span<child_process* const> children) {
    detail::process::exit_set set(co_await asio::this_coro::executor);
    for (std::size_t i = 0; i < children.size(); ++i) {
        if (children[i]->reaped() || children[i]->status()) continue;
        if (children[i]->check_exit()) co_return i;
        set.add(children[i]->native_pidfd(), i);
    }
    if (set.size() == 0) co_return children.size();
    for (;;) {
        const std::size_t i = co_await set.next();
        if (children[i]->check_exit()) co_return i;
    }
}

/// `wait_any` for workers held by value (a std::vector<child_process>, say).
template <class Defer = void>
asio::awaitable<std::size_t> wait_any(std::span<child_process> children) {
    const auto pointers = detail::process::addresses(children);
    co_return co_await wait_any(std::span<child_process* const>(pointers));
}

/// How one worker ended during `stop`.
enum class stop_outcome {
    already_exited,  ///< it had exited before the stop signal was sent
    exited,          ///< it exited during the grace period, not by the stop signal (it handled it)
    signaled,        ///< the stop signal ended it during the grace period
    killed,          ///< it was still running after the grace period and SIGKILL ended it
    unkillable,      ///< still not gone after SIGKILL and the kill timeout (uninterruptible sleep)
};

/// "exited", "killed", ... for logs.
inline const char* to_string(stop_outcome outcome) noexcept {
    switch (outcome) {
        case stop_outcome::already_exited: return "already exited";
        case stop_outcome::exited: return "exited";
        case stop_outcome::signaled: return "ended by the stop signal";
        case stop_outcome::killed: return "killed after the grace period";
        case stop_outcome::unkillable: return "not reaped after SIGKILL";
    }
    return "unknown";
}

/// One worker in a stop_result.
struct stopped_worker {
    pid_t pid = 0;
    stop_outcome outcome = stop_outcome::already_exited;
    std::optional<process_exit> status;  ///< absent only when unkillable
};

/// What `stop` did.
struct stop_result {
    std::vector<stopped_worker> workers;  ///< one per child, in the order given
    /// Other members of the groups (a worker's children) still running after the grace period,
    /// which got SIGKILL with the group.
    std::vector<pid_t> killed_descendants;
    /// Processes (workers or descendants) still not gone when the kill timeout expired: in
    /// uninterruptible sleep, typically. A worker among them is left unreaped and registered
    /// with the watcher; calling `stop` again retries.
    std::vector<pid_t> unkillable;

    /// Nothing was left behind.
    [[nodiscard]] bool clean() const noexcept { return unkillable.empty(); }
};

/// The time limits of `stop`.
struct stop_options {
    int signal = SIGTERM;                     ///< sent first to each group (torchrun: SIGTERM, or the signal it got)
    std::chrono::milliseconds grace{30'000};  ///< --shutdown-timeout: one deadline for all groups
    std::chrono::milliseconds kill_timeout{10'000};  ///< how long to await deaths after SIGKILL
};

namespace detail::process {

// Awaits every process in `set`; each child's exit is recorded the moment it is seen.
template <class Defer = void>
asio::awaitable<void> await_exits(exit_set& set, std::span<child_process* const> children) {
    while (set.size() > 0) {
        const std::size_t token = co_await set.next();
        if (token < children.size()) children[token]->check_exit();
    }
}

template <class Defer = void>
asio::awaitable<void> await_exits_or_timeout(exit_set& set, std::span<child_process* const> children,
                                             std::chrono::milliseconds timeout) {
    using namespace asio::experimental::awaitable_operators;
    if (set.size() == 0) co_return;
    asio::steady_timer timer(co_await asio::this_coro::executor, timeout);
    co_await (await_exits(set, children) || timer.async_wait(detail::use_awaitable<Defer>));
}

}  // namespace detail::process

/// Stops a group of workers as torchrun's `PContext.close` does, without its faults:
///   1. sends `options.signal` to every worker's process group (its descendants included);
///   2. awaits, against one shared deadline `options.grace`, every worker and every other process
///      that was in their groups then;
///   3. sends SIGKILL to every group (what is left: a worker that ignored the signal, a child
///      that outlived its worker), awaits those deaths for at most `options.kill_timeout`, and
///      reaps the workers. A process still there is reported in `unkillable`, not waited on
///      forever;
///   4. should a group still have a member then (one that left its worker's cgroup, or joined
///      the group from elsewhere in the agent's session), finds it by a scan of /proc, sends it
///      SIGKILL and awaits it for at most `options.kill_timeout` too.
/// Every wait is an event (pidfds in an epoll set) raced against a timer with `||`.
/// Workers already reaped are reported `already_exited` and not signalled (their group id is
/// no longer reserved).
template <class Defer = void>
asio::awaitable<stop_result> stop(std::span<child_process* const> children, stop_options options = {}) {
    auto executor = co_await asio::this_coro::executor;
    stop_result result;
    result.workers.resize(children.size());
    std::vector<bool> exited_before(children.size(), false);
    std::vector<bool> outlived_grace(children.size(), false);
    std::vector<pid_t> pgids;
    std::vector<pid_t> leaders;
    std::vector<std::string> cgroups;  // each group's worker cgroup, where members are sought
    // Descendants still there when the grace ran out, held by the pidfds taken at stop time.
    std::vector<detail::process::group_member> outlived;

    // 1. The stop signal, to every group whose leader is still unreaped (so its id is ours).
    for (std::size_t i = 0; i < children.size(); ++i) {
        auto& child = *children[i];
        result.workers[i].pid = child.pid();
        if (child.pid() <= 0) continue;
        leaders.push_back(child.pid());
        if (child.reaped()) {
            exited_before[i] = true;
            continue;
        }
        exited_before[i] = child.check_exit();
        child.signal_group(options.signal);
        pgids.push_back(child.pgid());
        cgroups.push_back(child.cgroup());  // it stays until the reap below
    }

    // 2. The grace period: workers and the other members of their groups, one deadline.
    {
        detail::process::exit_set set(executor);
        for (std::size_t i = 0; i < children.size(); ++i) {
            if (!children[i]->reaped() && !children[i]->check_exit()) {
                set.add(children[i]->native_pidfd(), i);
            }
        }
        auto members = detail::process::group_members(pgids, leaders, cgroups);
        for (std::size_t m = 0; m < members.size(); ++m) {
            set.add(members[m].pidfd.get(), children.size() + m);
        }
        co_await detail::process::await_exits_or_timeout(set, children, options.grace);
        for (std::size_t token : set.pending()) {
            if (token < children.size()) {
                outlived_grace[token] = true;
            } else {
                auto& member = members[token - children.size()];
                result.killed_descendants.push_back(member.pid);
                outlived.push_back(std::move(member));
            }
        }
    }

    // 3. SIGKILL to every group; await the deaths, bounded; reap.
    for (child_process* child : children) {
        if (!child->reaped()) child->signal_group(SIGKILL);
    }
    {
        detail::process::exit_set set(executor);
        for (std::size_t i = 0; i < children.size(); ++i) {
            if (!children[i]->reaped() && !children[i]->check_exit()) {
                set.add(children[i]->native_pidfd(), i);
            }
        }
        // Members again: a process forked during the grace period is found here. The ones that
        // outlived the grace are awaited by the pidfds held since, even if the scan no longer
        // finds them (one that moved to another group or cgroup meanwhile).
        auto members = detail::process::group_members(pgids, leaders, cgroups);
        for (auto& held : outlived) {
            if (std::none_of(members.begin(), members.end(),
                             [&](const detail::process::group_member& m) { return m.pid == held.pid; })) {
                members.push_back(std::move(held));
            }
        }
        for (std::size_t m = 0; m < members.size(); ++m) {
            set.add(members[m].pidfd.get(), children.size() + m);
            auto& killed = result.killed_descendants;
            if (std::find(killed.begin(), killed.end(), members[m].pid) == killed.end()) {
                killed.push_back(members[m].pid);
            }
        }
        co_await detail::process::await_exits_or_timeout(set, children, options.kill_timeout);
        for (std::size_t token : set.pending()) {
            result.unkillable.push_back(token < children.size() ? children[token]->pid()
                                                                : members[token - children.size()].pid);
        }
    }

    for (std::size_t i = 0; i < children.size(); ++i) {
        auto& child = *children[i];
        auto& worker = result.workers[i];
        if (child.pid() <= 0) continue;
        worker.status = child.status();
        if (!child.status()) {
            worker.outcome = stop_outcome::unkillable;
            continue;
        }
        if (exited_before[i]) {
            worker.outcome = stop_outcome::already_exited;
        } else if (outlived_grace[i] && child.status()->status.signal() == SIGKILL) {
            worker.outcome = stop_outcome::killed;
        } else if (child.status()->status.signal() == options.signal) {
            worker.outcome = stop_outcome::signaled;
        } else {
            worker.outcome = stop_outcome::exited;
        }
        child.reap();
    }

    // 4. A process still in a group after the reap was not seen above: one that left its
    //    worker's cgroup (moved by hand) or joined the group from outside it (another process of
    //    the agent's session, where workers share it). The group ids stay reserved while such a
    //    process lives, so this probe cannot hit an unrelated group. Found by a scan of /proc,
    //    sent SIGKILL, and awaited for at most kill_timeout.
    std::vector<pid_t> remaining;
    for (pid_t pgid : pgids) {
        if (::kill(-pgid, 0) == 0) remaining.push_back(pgid);
    }
    if (!remaining.empty()) {
        detail::process::exit_set set(executor);
        // Not the workers: one left unreaped above is in `unkillable` already.
        auto members = detail::process::group_members(remaining, leaders);
        for (pid_t pgid : remaining) ::kill(-pgid, SIGKILL);
        for (std::size_t m = 0; m < members.size(); ++m) {
            set.add(members[m].pidfd.get(), m);
            auto& killed = result.killed_descendants;
            if (std::find(killed.begin(), killed.end(), members[m].pid) == killed.end()) {
                killed.push_back(members[m].pid);
            }
        }
        co_await detail::process::await_exits_or_timeout(set, std::span<child_process* const>{}, options.kill_timeout);
        for (std::size_t token : set.pending()) result.unkillable.push_back(members[token].pid);
    }
    co_return result;
}

/// `stop` for workers held by value (a std::vector<child_process>, say).
template <class Defer = void>
asio::awaitable<stop_result> stop(std::span<child_process> children, stop_options options = {}) {
    const auto pointers = detail::process::addresses(children);
    co_return co_await stop(std::span<child_process* const>(pointers), options);
}

/// `stop` for one worker.
template <class Defer = void>
asio::awaitable<stop_result> stop(child_process& child, stop_options options = {}) {
    child_process* const one[] = {&child};
    co_return co_await stop(std::span<child_process* const>(one), options);
}

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::process {

ELASTIC_DECL pid_t read_pgid(pid_t pid) {
    const std::string path = "/proc/" + std::to_string(pid) + "/stat";
    owned_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return -1;
    char buffer[1024];
    const ssize_t n = ::read(fd.get(), buffer, sizeof buffer - 1);
    if (n <= 0) return -1;
    buffer[n] = '\0';
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, skip to the last ')'.
    const char* p = std::strrchr(buffer, ')');
    if (p == nullptr) return -1;
    char state = 0;
    long ppid = 0;
    long pgrp = 0;
    if (std::sscanf(p + 1, " %c %ld %ld", &state, &ppid, &pgrp) != 3) return -1;
    if (state == 'X') return -1;
    return static_cast<pid_t>(pgrp);
}

ELASTIC_DECL std::vector<group_member> group_members(const std::vector<pid_t>& pgids, const std::vector<pid_t>& skip,
                                                     const std::vector<std::string>& cgroups) {
    std::vector<group_member> out;
    if (pgids.empty()) return out;
    const auto consider = [&](pid_t pid) {
        if (pid <= 0 || std::find(skip.begin(), skip.end(), pid) != skip.end()) return;
        const pid_t pgid = read_pgid(pid);
        if (std::find(pgids.begin(), pgids.end(), pgid) == pgids.end()) return;
        owned_fd pidfd(pidfd_open(pid));
        if (!pidfd || read_pgid(pid) != pgid) return;
        if (has_ended(pidfd.get())) return;  // dead, awaiting its reaper: not a member to await
        out.push_back({pid, std::move(pidfd)});
    };
    // A worker's own cgroup lives as long as its unreaped leader: one missing is a wrong path.
    if (cgroups.size() == pgids.size() && std::all_of(cgroups.begin(), cgroups.end(), [](const std::string& dir) {
            return !dir.empty() && ::access(dir.c_str(), F_OK) == 0;
        })) {
        std::vector<pid_t> candidates;
        const bool read = std::all_of(cgroups.begin(), cgroups.end(), [&](const std::string& dir) {
            return for_each_cgroup_process(dir, cgroup_nesting_limit, [&](pid_t pid) { candidates.push_back(pid); });
        });
        if (read) {
            // One moving between two cgroups as they are read may be listed twice.
            std::sort(candidates.begin(), candidates.end());
            candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
            for (pid_t pid : candidates) consider(pid);
            return out;
        }
    }
    for_each_numeric_entry("/proc", consider);
    return out;
}

ELASTIC_DECL std::vector<child_process*> addresses(std::span<child_process> children) {
    std::vector<child_process*> out;
    out.reserve(children.size());
    for (auto& child : children) out.push_back(&child);
    return out;
}

}  // namespace detail::process
}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::process {

ELASTIC_DECL void exit_set::add(int pidfd, std::size_t token) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = token;
    if (::epoll_ctl(epoll_.native_handle(), EPOLL_CTL_ADD, pidfd, &event) != 0) {
        throw process_error("cannot watch pidfd " + std::to_string(pidfd) + ": " + errno_string(errno));
    }
    tokens_.push_back({token, pidfd});
}

ELASTIC_DECL std::vector<std::size_t> exit_set::pending() const {
    std::vector<std::size_t> out;
    for (const auto& e : tokens_) out.push_back(e.token);
    return out;
}

}  // namespace detail::process
}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
