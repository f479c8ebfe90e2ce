// Internals: a cgroup (v2) per worker, so whatever a worker starts ends with it.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/process/sys.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
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
// "elastic.<agent pid>", and one per worker in it, "w<n>". The child moves itself into its
// cgroup between fork and exec (by writing "0" to the cgroup.procs opened for it), so it has no
// descendant outside it. When the worker is reaped its cgroup is killed and removed: what the
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

/// One worker's cgroup, before the spawn hands it to its child_process.
struct worker_cgroup {
    std::string path;  ///< the directory
    owned_fd procs;    ///< its cgroup.procs, open for writing (above 2, close-on-exec)
};

/// The agent's cgroup directory and the workers' cgroups in it. Thread-safe.
class cgroups {
public:
    static ELASTIC_DECL cgroups& instance();

    /// The agent's directory ("…/elastic.<pid>"), made on first use; empty when there is none.
    ELASTIC_DECL std::string root();

    /// Why there is no root (empty while there is one, or before the first use).
    ELASTIC_DECL std::string reason();

    /// The reason, the first time it is asked for after it was set; then empty (for a log line
    /// said once per agent).
    ELASTIC_DECL std::string reason_once();

    /// A new cgroup for one worker; nullopt when there is no root, or it cannot be made.
    ELASTIC_DECL std::optional<worker_cgroup> make();

    /// Gives up on cgroups for the rest of the agent's life, with the reason (a child could
    /// not move itself into its cgroup).
    ELASTIC_DECL void disable(std::string why);

    /// Kills what is left in a worker's cgroup and removes it, now or, while its processes are
    /// still exiting, at a later sweep.
    ELASTIC_DECL void retire(const std::string& path) noexcept;

    /// Removes the retired cgroups whose processes have exited since.
    ELASTIC_DECL void sweep() noexcept;

    cgroups(const cgroups&) = delete;
    cgroups& operator=(const cgroups&) = delete;

private:
    cgroups() = default;

    ELASTIC_DECL void probe_locked();
    ELASTIC_DECL void sweep_locked() noexcept;

    std::mutex mutex_;
    bool probed_ = false;
    std::string root_;
    std::string reason_;
    bool reported_ = false;
    std::uint64_t next_ = 0;
    std::vector<std::string> pending_;
};

/// This process's cgroup in the v2 hierarchy as a directory ("<cgroup2 mount><path>"), read
/// from /proc/self/mountinfo and /proc/self/cgroup; empty, with `why` set, when there is none.
ELASTIC_DECL std::string own_cgroup2_dir(std::string& why);

}  // namespace elastic::inline v0::detail::process

#if ELASTIC_DETAIL_BODIES

#include <fstream>
#include <sstream>

namespace elastic::inline v0::detail::process {

ELASTIC_DECL std::string own_cgroup2_dir(std::string& why) {
    std::string relative;
    {
        std::ifstream file("/proc/self/cgroup");
        std::string line;
        while (std::getline(file, line)) {
            if (line.rfind("0::", 0) == 0) relative = line.substr(3);
        }
    }
    if (relative.empty() || relative.front() != '/') {
        why = "this process has no cgroup in a v2 hierarchy (/proc/self/cgroup has no \"0::\" line)";
        return {};
    }
    // mountinfo: "id parent major:minor root mount-point options... - fstype source options".
    std::ifstream file("/proc/self/mountinfo");
    std::string line;
    while (std::getline(file, line)) {
        const auto dash = line.find(" - ");
        if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
        std::istringstream fields(line.substr(0, dash));
        std::string id, parent, device, root, mount_point;
        if (!(fields >> id >> parent >> device >> root >> mount_point)) continue;
        // A mount of a subtree (a container's namespace shows "/" for its own cgroup) sees
        // the paths below its root.
        if (root != "/" && relative.rfind(root, 0) == 0) relative = relative.substr(root.size());
        if (relative.empty()) relative = "/";
        return mount_point + (relative == "/" ? "" : relative);
    }
    why = "no cgroup2 file system is mounted";
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
    std::string dir = own + "/elastic." + std::to_string(::getpid());
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        reason_ = "cannot make the cgroup " + dir + ": " + errno_string(errno) +
                  (errno == EACCES || errno == EPERM || errno == EROFS
                       ? " (the agent's cgroup is not delegated to this user)"
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
    if (root_.empty()) return std::nullopt;
    worker_cgroup made;
    made.path = root_ + "/w" + std::to_string(next_++);
    if (::mkdir(made.path.c_str(), 0755) != 0) {
        reason_ = "cannot make the cgroup " + made.path + ": " + errno_string(errno);
        return std::nullopt;
    }
    made.procs = owned_fd(::open((made.path + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!made.procs) {
        reason_ = "cannot open " + made.path + "/cgroup.procs: " + errno_string(errno);
        ::rmdir(made.path.c_str());
        return std::nullopt;
    }
    made.procs = raise_above_stdio(std::move(made.procs));
    return made;
}

ELASTIC_DECL void cgroups::disable(std::string why) {
    std::lock_guard lock(mutex_);
    if (root_.empty()) return;
    reason_ = std::move(why);
    pending_.push_back(std::move(root_));
    root_.clear();
    sweep_locked();
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
