// SPDX-License-Identifier: MIT
// Internals: a cgroup (v2) per worker, so whatever a worker starts ends with it.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/random.hpp"
#include "elastic/process/proc.hpp"
#include "elastic/process/sys.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace elastic::inline v0::detail::process {

// Why cgroups: a worker's process group holds what the worker starts, until a descendant calls
// setsid or setpgid (a daemon, a double fork, some MPI and data-loading helpers). Such a process
// survives any signal sent to the group. A cgroup holds every descendant whatever it does, and
// writing "1" to its cgroup.kill (Linux 5.14) SIGKILLs all of them at once.
//
// The layout: the agent makes one directory in its own cgroup of the v2 hierarchy,
// "elastic.<agent pid>.<random>" (mkdir is exclusive: two agents with one pid in different pid
// namespaces never share one), and one per worker in it, "w<n>". The child is born in its cgroup
// (clone3 with CLONE_INTO_CGROUP, spawn.hpp) or, where the kernel cannot do that, moves itself
// into it between fork and exec (by writing "0" to the cgroup.procs opened for it): either way it
// has no descendant outside it. When the worker is reaped its cgroup is killed and removed: what the
// worker left running ends with it. When the agent dies, the watcher process kills and removes
// the agent's directory (watcher.hpp).
//
// When there is none — no cgroup2 mount, a cgroup the agent may not write (an unprivileged user
// without a delegated cgroup), a kernel without cgroup.kill — workers are contained by their
// process group alone, and `cgroups::reason()` says why.

/// The name of the cgroup.kill file, and what the kernel wants written to it.
inline constexpr const char* cgroup_kill_file = "cgroup.kill";

/// Async-signal-safe. SIGKILLs every process in the cgroup at `dir_fd` and its descendants.
inline bool cgroup_kill_at(int dir_fd) noexcept {
    const int fd = ::openat(dir_fd, cgroup_kill_file, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = ::write(fd, "1", 1) == 1;
    ::close(fd);
    return ok;
}

/// Async-signal-safe. Removes the cgroup `name` in the directory `parent_fd` and every cgroup
/// below it, deepest first (a cgroup directory is removed with rmdir, and only once it has no
/// child cgroup and no process). Returns false if one could not be removed yet (EBUSY: a
/// process is still exiting), true once `name` is gone.
inline bool cgroup_remove_tree(int parent_fd, const char* name, int depth) noexcept {
    if (::unlinkat(parent_fd, name, AT_REMOVEDIR) == 0 || errno == ENOENT) return true;
    if (depth <= 0 || (errno != EBUSY && errno != ENOTEMPTY)) return false;
    const int fd = ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT;
    alignas(8) char buffer[2048];
    for (;;) {
        const ssize_t n = ::getdents64(fd, buffer, sizeof buffer);
        if (n <= 0) break;
        for (ssize_t at = 0; at < n;) {
            const auto* entry = reinterpret_cast<const dirent64*>(buffer + at);
            at += entry->d_reclen;
            const char* child = entry->d_name;
            if (entry->d_type != DT_DIR || std::strcmp(child, ".") == 0 || std::strcmp(child, "..") == 0) continue;
            cgroup_remove_tree(fd, child, depth - 1);
        }
    }
    ::close(fd);
    return ::unlinkat(parent_fd, name, AT_REMOVEDIR) == 0 || errno == ENOENT;
}

/// How deep below a worker's cgroup `for_each_cgroup_process` looks (a worker may make cgroups of
/// its own in it).
inline constexpr int cgroup_nesting_limit = 8;

/// Calls `f(pid)` for each process in the cgroup directory `dir` and in the cgroups below it, at
/// most `depth` levels down. True when all were read (a directory gone meanwhile had no process
/// left: the kernel removes only empty cgroups); false when one could not be read or lies deeper.
template <class F>
bool for_each_cgroup_process(const std::string& dir, int depth, F&& f) {
    const proc_fd dir_fd{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
    if (dir_fd.fd < 0) return errno == ENOENT;
    const std::string procs = dir + "/cgroup.procs";
    if (!for_each_number_in(procs.c_str(), f)) return false;
    alignas(8) char buffer[2048];
    for (;;) {
        const ssize_t n = ::getdents64(dir_fd.fd, buffer, sizeof buffer);
        if (n < 0) return false;
        if (n == 0) return true;
        for (ssize_t at = 0; at < n;) {
            const auto* entry = reinterpret_cast<const dirent64*>(buffer + at);
            at += entry->d_reclen;
            const char* child = entry->d_name;
            if (entry->d_type != DT_DIR || std::strcmp(child, ".") == 0 || std::strcmp(child, "..") == 0) continue;
            if (depth <= 0 || !for_each_cgroup_process(dir + "/" + child, depth - 1, f)) return false;
        }
    }
}

/// One worker's cgroup, before the spawn hands it to its child_process.
struct worker_cgroup {
    std::string path;  ///< the directory
    owned_fd dir;      ///< the directory itself (O_PATH, close-on-exec), for clone3's CLONE_INTO_CGROUP
    owned_fd procs;    ///< its cgroup.procs, open for writing (above 2, close-on-exec)
};

/// The agent's cgroup directory and the workers' cgroups in it. Thread-safe.
class cgroups {
public:
    static ELASTIC_DECL cgroups& instance();

    /// The agent's directory ("…/elastic.<pid>.<random>"), made on first use; empty when there
    /// is none. It stays the agent's after disable(): workers made before still live in it.
    ELASTIC_DECL std::string root();

    /// Why the last worker got no cgroup of its own (empty while each one got one).
    ELASTIC_DECL std::string reason();

    /// The reason, the first time it is asked for after it was set; then empty (for a log line
    /// said once per agent).
    ELASTIC_DECL std::string reason_once();

    /// A new cgroup for one worker; nullopt when there is no root, cgroups were disabled, or
    /// it cannot be made (reason() says why).
    ELASTIC_DECL std::optional<worker_cgroup> make();

    /// Gives up on cgroups for the rest of the agent's life, with the reason (a child could
    /// not move itself into its cgroup).
    ELASTIC_DECL void disable(std::string why);

    /// Kills what is left in a worker's cgroup and removes it, now or, while its processes are
    /// still exiting, at a later sweep.
    ELASTIC_DECL void retire(const std::string& path) noexcept;

    /// Kills the retired cgroups again (idempotent) and removes those whose processes have
    /// exited since.
    ELASTIC_DECL void sweep() noexcept;

    cgroups(const cgroups&) = delete;
    cgroups& operator=(const cgroups&) = delete;

private:
    cgroups() = default;

    ELASTIC_DECL void probe_locked();
    ELASTIC_DECL void set_reason_locked(std::string why);
    ELASTIC_DECL void sweep_locked() noexcept;

    std::mutex mutex_;
    bool probed_ = false;
    bool enabled_ = false;
    std::string root_;
    std::string reason_;
    bool reported_ = false;
    std::uint64_t next_ = 0;
    std::vector<std::string> pending_;
};

/// A process's cgroup in the v2 hierarchy as a directory ("<cgroup2 mount><path>"), from the
/// texts of its /proc/<pid>/mountinfo and /proc/<pid>/cgroup: the cgroup2 mount whose root is
/// the cgroup or one of its ancestors (octal escapes such as \040 decoded). Empty, with `why`
/// set, when there is none — a root of "/.." (a cgroup namespace entered without a remount)
/// included.
ELASTIC_DECL std::string cgroup2_dir_from(std::string_view mountinfo, std::string_view proc_cgroup, std::string& why);

/// This process's cgroup directory (cgroup2_dir_from on its own files), checked: its
/// cgroup.procs lists this process. Empty, with `why` set, when there is none.
ELASTIC_DECL std::string own_cgroup2_dir(std::string& why);

}  // namespace elastic::inline v0::detail::process

#if ELASTIC_DETAIL_BODIES

#include <algorithm>
#include <fstream>
#include <sstream>

namespace elastic::inline v0::detail::process {

namespace cgroup_detail {

// mountinfo escapes space, tab, newline and backslash as \ooo.
inline std::string unescape(std::string_view field) {
    std::string out;
    for (std::size_t i = 0; i < field.size(); ++i) {
        if (field[i] == '\\' && i + 3 < field.size() && field[i + 1] >= '0' && field[i + 1] <= '3' &&
            field[i + 2] >= '0' && field[i + 2] <= '7' && field[i + 3] >= '0' && field[i + 3] <= '7') {
            out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 + (field[i + 3] - '0'));
            i += 3;
        } else {
            out += field[i];
        }
    }
    return out;
}

inline std::vector<std::string_view> words(std::string_view line) {
    std::vector<std::string_view> out;
    std::size_t at = 0;
    while (at < line.size()) {
        const auto end = line.find(' ', at);
        const auto stop = end == std::string_view::npos ? line.size() : end;
        if (stop > at) out.push_back(line.substr(at, stop - at));
        at = stop + 1;
    }
    return out;
}

}  // namespace cgroup_detail

ELASTIC_DECL std::string cgroup2_dir_from(std::string_view mountinfo, std::string_view proc_cgroup, std::string& why) {
    std::string path;
    for (std::size_t at = 0; at < proc_cgroup.size();) {
        const auto end = std::min(proc_cgroup.find('\n', at), proc_cgroup.size());
        const auto line = proc_cgroup.substr(at, end - at);
        if (line.substr(0, 3) == "0::") path = std::string(line.substr(3));
        at = end + 1;
    }
    if (path.empty() || path.front() != '/') {
        why = "this process has no cgroup in a v2 hierarchy (/proc/self/cgroup has no \"0::/\" line)";
        return {};
    }
    if (path.find("/..") != std::string::npos || path.find("(deleted)") != std::string::npos) {
        why = "this process's cgroup " + path + " lies outside what its cgroup namespace shows";
        return {};
    }
    bool mounted = false;
    for (std::size_t at = 0; at < mountinfo.size();) {
        const auto end = std::min(mountinfo.find('\n', at), mountinfo.size());
        const auto line = mountinfo.substr(at, end - at);
        at = end + 1;
        // "id parent major:minor root mount-point options [optional...] - fstype source options"
        const auto fields = cgroup_detail::words(line);
        const auto dash = std::find(fields.begin(), fields.end(), std::string_view("-"));
        if (fields.size() < 5 || dash == fields.end() || dash + 1 == fields.end() || *(dash + 1) != "cgroup2") {
            continue;
        }
        mounted = true;
        const std::string root = cgroup_detail::unescape(fields[3]);
        const std::string mount_point = cgroup_detail::unescape(fields[4]);
        std::string below;  // the cgroup's path under this mount's root
        if (root == "/") {
            below = path;
        } else if (path == root) {
            below = "/";
        } else if (path.size() > root.size() && path.compare(0, root.size(), root) == 0 && path[root.size()] == '/') {
            below = path.substr(root.size());
        } else {
            continue;  // a mount of another subtree (or of "/..")
        }
        return mount_point + (below == "/" ? std::string() : below);
    }
    why = mounted ? "no cgroup2 mount shows this process's cgroup " + path : "no cgroup2 file system is mounted";
    return {};
}

ELASTIC_DECL std::string own_cgroup2_dir(std::string& why) {
    const auto slurp = [](const char* name) {
        std::ifstream file(name);
        std::ostringstream text;
        text << file.rdbuf();
        return text.str();
    };
    const std::string dir = cgroup2_dir_from(slurp("/proc/self/mountinfo"), slurp("/proc/self/cgroup"), why);
    if (dir.empty()) return dir;
    std::ifstream procs(dir + "/cgroup.procs");
    const pid_t self = ::getpid();
    for (long pid = 0; procs >> pid;) {
        if (pid == self) return dir;
    }
    why = "the cgroup " + dir + " does not list this process (a cgroup namespace or a mount of another one?)";
    return {};
}

ELASTIC_DECL cgroups& cgroups::instance() {
    static cgroups* const self = new cgroups();  // leaked: used until the very end
    return *self;
}

ELASTIC_DECL void cgroups::probe_locked() {
    if (probed_) return;
    probed_ = true;
    std::string why;
    const std::string own = own_cgroup2_dir(why);
    if (own.empty()) {
        reason_ = why;
        return;
    }
    // Exclusive: another agent with this pid (in another pid namespace), or a dead one's
    // leftover, has its own directory.
    std::string dir;
    for (int attempt = 0;; ++attempt) {
        dir = own + "/elastic." + std::to_string(::getpid()) + "." + std::to_string(random_u64() % 1000000);
        if (::mkdir(dir.c_str(), 0755) == 0) break;
        const int e = errno;
        if (e == EEXIST && attempt < 16) continue;
        reason_ = "cannot make the cgroup " + dir + ": " + errno_string(e) +
                  (e == EROFS                  ? " (the cgroup file system is mounted read-only)"
                   : e == EACCES || e == EPERM ? " (the agent's cgroup is not delegated to this user)"
                                               : "");
        return;
    }
    // Asked of the new directory: the root cgroup has no cgroup.kill of its own.
    struct stat st {};
    if (::stat((dir + "/" + cgroup_kill_file).c_str(), &st) != 0) {
        reason_ = "the cgroup " + dir + " has no " + cgroup_kill_file + " (it needs Linux 5.14)";
        ::rmdir(dir.c_str());
        return;
    }
    root_ = std::move(dir);
    enabled_ = true;
}

ELASTIC_DECL std::string cgroups::root() {
    std::lock_guard lock(mutex_);
    probe_locked();
    return root_;
}

ELASTIC_DECL std::string cgroups::reason() {
    std::lock_guard lock(mutex_);
    return reason_;
}

ELASTIC_DECL void cgroups::set_reason_locked(std::string why) {
    if (why == reason_) return;
    reason_ = std::move(why);
    reported_ = false;  // a new reason is said again, once
}

ELASTIC_DECL std::string cgroups::reason_once() {
    std::lock_guard lock(mutex_);
    if (reason_.empty() || reported_) return {};
    reported_ = true;
    return reason_;
}

ELASTIC_DECL std::optional<worker_cgroup> cgroups::make() {
    std::lock_guard lock(mutex_);
    probe_locked();
    sweep_locked();
    if (!enabled_) return std::nullopt;
    worker_cgroup made;
    made.path = root_ + "/w" + std::to_string(next_++);
    if (::mkdir(made.path.c_str(), 0755) != 0) {
        set_reason_locked("cannot make the cgroup " + made.path + ": " + errno_string(errno));
        return std::nullopt;
    }
    made.dir = owned_fd(::open(made.path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (made.dir) made.procs = owned_fd(::open((made.path + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!made.procs) {
        set_reason_locked("cannot open " + made.path + (made.dir ? "/cgroup.procs" : "") + ": " + errno_string(errno));
        made.dir.reset();
        made.procs.reset();
        ::rmdir(made.path.c_str());
        return std::nullopt;
    }
    made.procs = raise_above_stdio(std::move(made.procs));
    return made;
}

ELASTIC_DECL void cgroups::disable(std::string why) {
    // The root stays: workers made before may live in it, and the watcher removes it at the end.
    std::lock_guard lock(mutex_);
    probed_ = true;  // before the first probe: none is made
    enabled_ = false;
    set_reason_locked(std::move(why));
}

ELASTIC_DECL void cgroups::retire(const std::string& path) noexcept {
    if (path.empty()) return;
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        cgroup_kill_at(fd);
        ::close(fd);
    }
    std::lock_guard lock(mutex_);
    try {
        pending_.push_back(path);
    } catch (...) {
        return;  // out of memory: the directory stays until the agent exits (the watcher)
    }
    sweep_locked();
}

ELASTIC_DECL void cgroups::sweep() noexcept {
    std::lock_guard lock(mutex_);
    sweep_locked();
}

ELASTIC_DECL void cgroups::sweep_locked() noexcept {
    for (auto it = pending_.begin(); it != pending_.end();) {
        // Killed again first: retire() may have failed to open it (out of descriptors, say).
        if (const int dir = ::open(it->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir >= 0) {
            cgroup_kill_at(dir);
            ::close(dir);
        }
        const auto slash = it->rfind('/');
        const std::string parent = it->substr(0, slash);
        const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        const bool gone = fd < 0 ? errno == ENOENT : cgroup_remove_tree(fd, it->c_str() + slash + 1, 8);
        if (fd >= 0) ::close(fd);
        it = gone ? pending_.erase(it) : it + 1;
    }
}

}  // namespace elastic::inline v0::detail::process

#endif  // ELASTIC_DETAIL_BODIES
