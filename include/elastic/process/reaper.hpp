// SPDX-License-Identifier: MIT
// Internals: where no cgroup contains a worker, the agent adopts what it leaves behind (child
// subreaper) and kills it when the worker is reaped.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/process/proc.hpp"
#include "elastic/process/watcher.hpp"

#include <mutex>
#include <string>
#include <vector>

#include <sys/types.h>

namespace elastic::inline v0::detail::process {

// Why: a descendant that calls setsid or setpgid leaves its worker's process group, and without
// a cgroup (cgroup.hpp) nothing the agent signals reaches it. As child subreaper
// (PR_SET_CHILD_SUBREAPER), the agent becomes the parent of every orphan among its descendants
// instead of init: the daemon whose parent exited, the children of a worker that exited. Those
// are the agent's children, so the agent can find them (/proc/<agent>/task/*/children), and their
// pids cannot be reused until the agent reaps them.
//
// Which worker an adopted process came from: the one whose session or process group it is in (a
// worker leads a session, or with process_isolation::process_group a group, whose id is its pid).
// One that started a session of its own cannot be told apart: it is taken for a contained
// worker's and killed when the last contained worker is reaped — unless the agent has also
// spawned workers with own_cgroup = false, whose daemons it might be: then it is left alone.
// Adopted processes of the agent's own session and group, and of an own_cgroup = false worker's
// session or group (the last 4096 such workers), are left alone too: the first are children the
// agent's own code started (and are never reaped here), the others not ours to end (though
// reaped here once they exit: nobody else can).
//
// When the agent dies, the subreaper dies with it; the watcher (watcher.hpp) follows the same
// workers from outside.

/// The agent's adoption of orphans, for workers without a cgroup. Thread-safe.
class subreaper {
public:
    static ELASTIC_DECL subreaper& instance();

    /// Makes this process the child subreaper (once). False, with reason() set, where the
    /// kernel refuses (it cannot: the call exists since Linux 3.4 and needs no privilege).
    ELASTIC_DECL bool enable() noexcept;

    /// Whether this process adopts orphans.
    ELASTIC_DECL bool enabled() noexcept;

    /// Why enable() failed; empty otherwise.
    ELASTIC_DECL std::string reason();

    /// Held by spawn from before the fork until the child is registered (add, exempt, or the
    /// watcher's table): meanwhile the new child is nobody's, and no sweep may touch it.
    [[nodiscard]] ELASTIC_DECL std::unique_lock<std::recursive_mutex> registering();

    /// A worker this process contains without a cgroup: what it leaves behind is killed when
    /// it is reaped.
    ELASTIC_DECL void add(pid_t worker);

    /// A worker spawned with own_cgroup = false: what it leaves in its session or group is not
    /// ours to kill.
    ELASTIC_DECL void exempt(pid_t worker);

    /// The worker is being reaped (its process group was killed): SIGKILLs every adopted process
    /// of its session or group, with its descendants, and, when it was the last contained worker,
    /// every adopted process that names no worker (above); waits (up to a second) for the adopted
    /// ones to end and reaps them. Nothing for a worker not added.
    ELASTIC_DECL void release(pid_t worker) noexcept;

    /// Reaps adopted processes that have exited (a daemon that ended on its own is a zombie
    /// until then).
    ELASTIC_DECL void sweep() noexcept;

    subreaper(const subreaper&) = delete;
    subreaper& operator=(const subreaper&) = delete;

private:
    subreaper() = default;

    enum class owner { agent, live, exempt, released, target, unknown };
    ELASTIC_DECL owner owner_of_locked(const proc_stat& stat, pid_t own_session, pid_t own_group, pid_t target) const;

    // One pass: kills the adopted processes `release` names (none when `target` is 0 and
    // `everything` is false) and their trees, awaits and reaps them and the adopted zombies;
    // returns how many live ones it found to kill.
    ELASTIC_DECL std::size_t pass_locked(pid_t target, bool everything) noexcept;

    std::recursive_mutex mutex_;  // recursive: spawn holds it and may discard a child (release)
    bool tried_ = false;
    bool enabled_ = false;
    std::string reason_;
    std::vector<pid_t> live_;      // contained workers not yet released
    std::vector<pid_t> released_;  // contained workers released, the newest last
    std::vector<pid_t> exempt_;    // uncontained workers, the newest last
};

/// How many released and uncontained workers are remembered, each.
inline constexpr std::size_t subreaper_memory = 4096;

/// How many processes one pass walks below the adopted ones it kills.
inline constexpr std::size_t subreaper_tree_limit = 65536;

}  // namespace elastic::inline v0::detail::process

#if ELASTIC_DETAIL_BODIES

#include <algorithm>
#include <csignal>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace elastic::inline v0::detail::process {

ELASTIC_DECL subreaper& subreaper::instance() {
    static subreaper* const self = new subreaper();  // leaked: used until the very end
    return *self;
}

ELASTIC_DECL bool subreaper::enable() noexcept {
    std::lock_guard lock(mutex_);
    if (tried_) return enabled_;
    tried_ = true;
    if (::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0) {
        enabled_ = true;
    } else {
        try {
            reason_ = "cannot become the child subreaper: " + errno_string(errno);
        } catch (...) {
        }
    }
    return enabled_;
}

ELASTIC_DECL bool subreaper::enabled() noexcept {
    std::lock_guard lock(mutex_);
    return enabled_;
}

ELASTIC_DECL std::string subreaper::reason() {
    std::lock_guard lock(mutex_);
    return reason_;
}

ELASTIC_DECL std::unique_lock<std::recursive_mutex> subreaper::registering() {
    return std::unique_lock<std::recursive_mutex>(mutex_);
}

ELASTIC_DECL void subreaper::add(pid_t worker) {
    std::lock_guard lock(mutex_);
    if (enabled_) live_.push_back(worker);
}

ELASTIC_DECL void subreaper::exempt(pid_t worker) {
    std::lock_guard lock(mutex_);
    if (exempt_.size() >= subreaper_memory) exempt_.erase(exempt_.begin());
    exempt_.push_back(worker);
}

ELASTIC_DECL void subreaper::release(pid_t worker) noexcept {
    std::lock_guard lock(mutex_);
    const auto it = std::find(live_.begin(), live_.end(), worker);
    if (it == live_.end()) return;
    live_.erase(it);
    try {
        if (released_.size() >= subreaper_memory) released_.erase(released_.begin());
        released_.push_back(worker);
    } catch (...) {
        // Out of memory: its stragglers name no worker now, and go with the last one.
    }
    const bool everything = live_.empty();
    // Repeated until a pass finds nothing to kill: a process may fork while a pass reads the
    // tree, and what a killed process leaves is adopted in turn. Bounded: a fork bomb outruns
    // any sweep (the watcher's session sweep and the system's limits are left for it).
    for (int pass = 0; pass < 16 && pass_locked(worker, everything) > 0; ++pass) {
    }
}

ELASTIC_DECL void subreaper::sweep() noexcept {
    std::lock_guard lock(mutex_);
    if (enabled_) pass_locked(0, false);
}

ELASTIC_DECL subreaper::owner subreaper::owner_of_locked(const proc_stat& stat, pid_t own_session, pid_t own_group,
                                                         pid_t target) const {
    const auto in = [&](const std::vector<pid_t>& workers) {
        return std::find(workers.begin(), workers.end(), stat.session) != workers.end() ||
               std::find(workers.begin(), workers.end(), stat.pgrp) != workers.end();
    };
    if (target > 0 && (stat.session == target || stat.pgrp == target)) return owner::target;
    if (in(live_)) return owner::live;
    if (in(exempt_)) return owner::exempt;
    if (in(released_)) return owner::released;
    if (stat.session == own_session || stat.pgrp == own_group) return owner::agent;
    if (watcher::instance().watching(stat.session) || watcher::instance().watching(stat.pgrp)) {
        return owner::live;  // a spawned child's, registered a moment ago
    }
    return owner::unknown;
}

ELASTIC_DECL std::size_t subreaper::pass_locked(pid_t target, bool everything) noexcept {
    const pid_t self = ::getpid();
    const pid_t own_session = ::getsid(0);
    const pid_t own_group = ::getpgrp();
    auto& spawned = watcher::instance();
    std::vector<pid_t> roots;  // adopted, to kill: our children, so their numbers stay theirs
    std::vector<pid_t> tree;
    std::vector<pid_t> zombies;
    try {
        for_each_child(self, [&](pid_t child) {
            proc_stat stat;
            if (!read_proc_stat(child, stat) || spawned.watching(child)) return;
            const owner who = owner_of_locked(stat, own_session, own_group, target);
            const bool ours = who == owner::target || who == owner::released ||
                              (who == owner::unknown && everything && exempt_.empty());
            if (stat.state == 'Z' && !threads_left(child)) {
                // Nobody else can reap an adopted process; the agent's own code reaps its own.
                if (who != owner::agent && (who != owner::unknown || exempt_.empty())) zombies.push_back(child);
            } else if (ours) {
                roots.push_back(child);
            }
        });
        // Each one is sent SIGSTOP before its children are read, so that most cannot fork or
        // reap meanwhile (the stop takes effect a moment later; the next pass finds what a
        // fork in that moment made).
        tree = roots;
        for (std::size_t at = 0; at < tree.size(); ++at) {
            ::kill(tree[at], SIGSTOP);
            if (tree.size() < subreaper_tree_limit) {
                for_each_child(tree[at], [&](pid_t child) { tree.push_back(child); });
            }
        }
    } catch (...) {
        // Out of memory: kill what was found; the next pass or the watcher does the rest.
    }
    for (pid_t pid : tree) ::kill(pid, SIGKILL);
    // The roots are our children: await their deaths (a second at most in all: one in
    // uninterruptible sleep is reaped by a later pass), then reap them with the zombies.
    const std::int64_t deadline = monotonic_ms() + 1000;
    for (pid_t pid : roots) {
        const int pidfd = pidfd_open(pid);
        if (pidfd < 0) continue;
        (void)readable_by(pidfd, deadline);
        ::close(pidfd);
        ::waitpid(pid, nullptr, WNOHANG);
    }
    for (pid_t pid : zombies) ::waitpid(pid, nullptr, WNOHANG);
    return roots.size();
}

}  // namespace elastic::inline v0::detail::process

#endif  // ELASTIC_DETAIL_BODIES
