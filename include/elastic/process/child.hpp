// SPDX-License-Identifier: MIT
// child_process: one spawned worker — its pidfd, its exit as an awaitable event, its pipes.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/process/cgroup.hpp"
#include "elastic/process/error.hpp"
#include "elastic/process/exit.hpp"
#include "elastic/process/reaper.hpp"
#include "elastic/process/sys.hpp"
#include "elastic/process/watcher.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/use_awaitable.hpp>

#include <csignal>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include <signal.h>
#include <sys/types.h>

namespace elastic::inline v0 {

namespace detail::process {

/// Children whose child_process was destroyed while they still ran: they were sent SIGKILL and
/// are reaped here, without blocking anyone, at the next spawn or destruction.
class graveyard {
public:
    static ELASTIC_DECL graveyard& instance();

    ELASTIC_DECL void bury(pid_t pid, owned_fd pidfd);

    ELASTIC_DECL void sweep();

private:
    struct grave {
        pid_t pid;
        owned_fd pidfd;
    };

    ELASTIC_DECL void sweep_locked() noexcept;

    std::mutex mutex_;
    std::list<grave> graves_;
};

class child_process_factory;

}  // namespace detail::process

/// One worker process started by `spawn` (spawn.hpp): the leader of its own process group (and by
/// default its own session), whose exit is an awaitable event on its pidfd.
///
/// Lifetime of the pid: the exit is observed without reaping (`waitid(WNOWAIT)`): the leader
/// stays a zombie, which keeps its pid — the group's id — from being reused, so signalling the
/// group stays safe until `reap()` (or `stop()`, group.hpp, or the destructor) releases it.
///
/// Destroying a child_process that has not been reaped sends SIGKILL to its group: nothing is
/// orphaned by forgetting a worker. A still-running one is then reaped later, without blocking.
///
/// Not thread-safe: use one child_process from one strand. Move-only.
class child_process {
public:
    child_process(child_process&& other) noexcept
        : pid_(std::exchange(other.pid_, -1)),
          reaped_(std::exchange(other.reaped_, true)),
          pidfd_(std::move(other.pidfd_)),
          status_(std::move(other.status_)),
          stdin_(std::move(other.stdin_)),
          stdout_(std::move(other.stdout_)),
          stderr_(std::move(other.stderr_)),
          cgroup_(std::move(other.cgroup_)) {}

    ELASTIC_DECL child_process& operator=(child_process&& other) noexcept;

    child_process(const child_process&) = delete;
    child_process& operator=(const child_process&) = delete;

    ~child_process() { abandon(); }

    /// The process id.
    [[nodiscard]] pid_t pid() const noexcept { return pid_; }
    /// Its process-group id: the worker leads its own group, so this is its pid.
    [[nodiscard]] pid_t pgid() const noexcept { return pid_; }

    /// The exit, once observed (by `wait`, `check_exit`, `wait_any` or `stop`).
    [[nodiscard]] const std::optional<process_exit>& status() const noexcept { return status_; }
    /// Whether the leader has been reaped: its pid is free, the group can no longer be signalled.
    [[nodiscard]] bool reaped() const noexcept { return reaped_; }

    /// The worker's own cgroup directory (spawn_options::own_cgroup), killed and removed when it
    /// is reaped; empty when its process group alone contains it.
    [[nodiscard]] const std::string& cgroup() const noexcept { return cgroup_; }

    /// Without waiting: records the exit if it has happened. Returns whether it has.
    ELASTIC_DECL bool check_exit();

    /// Awaits the exit (an event on the pidfd: no polling, no SIGCHLD handler) and returns it.
    /// Returns at once if it was already observed. Cancellable (Asio per-operation cancellation).
    template <class Defer = void>
    asio::awaitable<process_exit> wait() {
        if (pid_ <= 0) throw process_error("cannot wait for a moved-from child_process");
        while (!check_exit()) {
            if (reaped_)
                throw process_error("cannot wait for pid " + std::to_string(pid_) +
                                    ": it was reaped before its exit was observed");
            co_await pidfd_.async_wait(asio::posix::descriptor_base::wait_read, detail::use_awaitable<Defer>);
        }
        co_return *status_;
    }

    /// Sends `sig` to the leader only, through its pidfd (never a recycled pid). Returns false if
    /// it has already exited (a zombie would accept the signal and ignore it).
    ELASTIC_DECL bool signal(int sig);

    /// Sends `sig` to the whole process group (the worker and the descendants that stayed in
    /// it). Safe against pid reuse because the leader is not reaped yet. Returns false if no
    /// process is left in the group, or the leader was already reaped.
    ELASTIC_DECL bool signal_group(int sig);

    /// Releases an exited worker: SIGKILLs whatever is left in its group and its cgroup (the
    /// worker is over, and so is what it started), retires the group from the watcher, and reaps
    /// the leader. Throws if it is still running.
    ELASTIC_DECL void reap();

    /// The write end of the worker's stdin pipe, when spawned with `stdio::pipe()` for stdin.
    std::optional<asio::posix::stream_descriptor> take_stdin() { return take(stdin_); }
    /// The read end of the worker's stdout pipe, when spawned with `stdio::pipe()` for stdout.
    std::optional<asio::posix::stream_descriptor> take_stdout() { return take(stdout_); }
    /// The read end of the worker's stderr pipe, when spawned with `stdio::pipe()` for stderr.
    std::optional<asio::posix::stream_descriptor> take_stderr() { return take(stderr_); }

    /// The pidfd, for composing waits (it becomes readable when the process exits).
    [[nodiscard]] int native_pidfd() noexcept { return pidfd_.native_handle(); }

    /// The executor the child's descriptors are bound to.
    [[nodiscard]] asio::any_io_executor get_executor() noexcept { return pidfd_.get_executor(); }

private:
    friend class detail::process::child_process_factory;

    child_process(asio::posix::stream_descriptor pidfd, pid_t pid, std::optional<asio::posix::stream_descriptor> in,
                  std::optional<asio::posix::stream_descriptor> out, std::optional<asio::posix::stream_descriptor> err,
                  std::string cgroup) noexcept
        : pid_(pid),
          reaped_(false),
          pidfd_(std::move(pidfd)),
          stdin_(std::move(in)),
          stdout_(std::move(out)),
          stderr_(std::move(err)),
          cgroup_(std::move(cgroup)) {}

    static ELASTIC_DECL std::optional<asio::posix::stream_descriptor> take(
        std::optional<asio::posix::stream_descriptor>& slot);

    ELASTIC_DECL void abandon() noexcept;

    pid_t pid_ = -1;
    bool reaped_ = true;
    asio::posix::stream_descriptor pidfd_;
    std::optional<process_exit> status_;
    std::optional<asio::posix::stream_descriptor> stdin_;
    std::optional<asio::posix::stream_descriptor> stdout_;
    std::optional<asio::posix::stream_descriptor> stderr_;
    std::string cgroup_;
};

namespace detail::process {

/// The one place that builds child_process objects (spawn.hpp).
class child_process_factory {
public:
    static child_process make(asio::posix::stream_descriptor pidfd, pid_t pid,
                              std::optional<asio::posix::stream_descriptor> in,
                              std::optional<asio::posix::stream_descriptor> out,
                              std::optional<asio::posix::stream_descriptor> err, std::string cgroup) {
        return child_process(std::move(pidfd), pid, std::move(in), std::move(out), std::move(err), std::move(cgroup));
    }
};

}  // namespace detail::process

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL child_process& child_process::operator=(child_process&& other) noexcept {
    if (this != &other) {
        abandon();
        pid_ = std::exchange(other.pid_, -1);
        reaped_ = std::exchange(other.reaped_, true);
        pidfd_ = std::move(other.pidfd_);
        status_ = std::move(other.status_);
        stdin_ = std::move(other.stdin_);
        stdout_ = std::move(other.stdout_);
        stderr_ = std::move(other.stderr_);
        cgroup_ = std::move(other.cgroup_);
    }
    return *this;
}

ELASTIC_DECL bool child_process::check_exit() {
    if (status_) return true;
    if (pid_ <= 0 || reaped_) return false;
    siginfo_t info;
    if (!detail::process::peek_exit(pidfd_.native_handle(), info)) return false;
    status_ = process_exit::from_siginfo(info);
    return true;
}

ELASTIC_DECL bool child_process::signal(int sig) {
    if (pid_ <= 0 || reaped_ || check_exit()) return false;
    if (detail::process::pidfd_send_signal(pidfd_.native_handle(), sig) == 0) return true;
    if (errno == ESRCH) return false;
    throw process_error("cannot send " + signal_name(sig) + " to pid " + std::to_string(pid_) + ": " +
                        detail::process::errno_string(errno));
}

ELASTIC_DECL bool child_process::signal_group(int sig) {
    if (pid_ <= 0 || reaped_) return false;
    if (::kill(-pid_, sig) == 0) return true;
    if (errno == ESRCH) return false;
    throw process_error("cannot send " + signal_name(sig) + " to process group " + std::to_string(pid_) + ": " +
                        detail::process::errno_string(errno));
}

ELASTIC_DECL void child_process::reap() {
    if (pid_ <= 0 || reaped_) return;
    if (!check_exit()) {
        throw process_error("cannot reap pid " + std::to_string(pid_) +
                            ": it is still running (await wait() or stop() it first)");
    }
    ::kill(-pid_, SIGKILL);
    detail::process::cgroups::instance().retire(std::exchange(cgroup_, {}));
    detail::process::watcher::instance().remove(pid_);     // before the reap frees the group id
    detail::process::subreaper::instance().release(pid_);  // what it left (no cgroup)
    detail::process::reap_now(pidfd_.native_handle());
    reaped_ = true;
    asio::error_code ignored;
    pidfd_.close(ignored);
}

ELASTIC_DECL std::optional<asio::posix::stream_descriptor> child_process::take(
    std::optional<asio::posix::stream_descriptor>& slot) {
    std::optional<asio::posix::stream_descriptor> out;
    out.swap(slot);
    return out;
}

ELASTIC_DECL void child_process::abandon() noexcept {
    if (pid_ <= 0 || reaped_) return;
    try {
        if (check_exit()) {
            reap();
        } else {
            ::kill(-pid_, SIGKILL);  // the leader is unreaped: the group id is still ours
            detail::process::cgroups::instance().retire(std::exchange(cgroup_, {}));
            detail::process::graveyard::instance().bury(pid_, detail::process::owned_fd(pidfd_.release()));
        }
    } catch (...) {
        // Out of memory in the graveyard: the zombie stays, the group is already killed.
    }
    reaped_ = true;
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::process {

ELASTIC_DECL graveyard& graveyard::instance() {
    static graveyard* const self = new graveyard();  // leaked: see spawner
    return *self;
}

ELASTIC_DECL void graveyard::bury(pid_t pid, owned_fd pidfd) {
    std::lock_guard lock(mutex_);
    graves_.push_back({pid, std::move(pidfd)});
    sweep_locked();
}

ELASTIC_DECL void graveyard::sweep() {
    std::lock_guard lock(mutex_);
    sweep_locked();
}

ELASTIC_DECL void graveyard::sweep_locked() noexcept {
    for (auto it = graves_.begin(); it != graves_.end();) {
        siginfo_t info;
        if (peek_exit(it->pidfd.get(), info)) {
            watcher::instance().remove(it->pid);  // before the reap, which frees the pgid
            subreaper::instance().release(it->pid);
            reap_now(it->pidfd.get());
            it = graves_.erase(it);
        } else {
            ++it;
        }
    }
}

}  // namespace detail::process
}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
