// SPDX-License-Identifier: MIT
// spawn: start a worker program in its own process group, tied to the agent's life.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/path_search.hpp"
#include "elastic/process/cgroup.hpp"
#include "elastic/process/child.hpp"
#include "elastic/process/error.hpp"
#include "elastic/process/reaper.hpp"
#include "elastic/process/spawner.hpp"
#include "elastic/process/sys.hpp"
#include "elastic/process/watcher.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/posix/stream_descriptor.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace elastic::inline v0 {

/// Where one of a child's standard streams goes.
class stdio {
public:
    /// What the stream is connected to.
    enum class kind { inherit, pipe, null, descriptor };

    /// The agent's own stream (the default).
    static stdio inherit() noexcept { return stdio(kind::inherit, -1); }
    /// A pipe whose other end the caller takes from the child_process (take_stdout, ...).
    static stdio pipe() noexcept { return stdio(kind::pipe, -1); }
    /// /dev/null.
    static stdio null() noexcept { return stdio(kind::null, -1); }
    /// A descriptor of the caller's (a log file, say); the child gets a copy, the caller keeps
    /// its own.
    static stdio descriptor(int fd) noexcept { return stdio(kind::descriptor, fd); }

    [[nodiscard]] kind which() const noexcept { return kind_; }
    [[nodiscard]] int fd() const noexcept { return fd_; }

private:
    stdio(kind k, int fd) noexcept : kind_(k), fd_(fd) {}
    kind kind_;
    int fd_;
};

/// How a worker is separated from the agent's terminal job control.
enum class process_isolation {
    session,        ///< setsid: own session and group, no controlling terminal (torchrun's choice)
    process_group,  ///< setpgid: own group, same session and terminal
};

/// What to start and how.
struct spawn_options {
    /// A path, or a name searched in the child's PATH (as execvp and Python's subprocess do).
    std::string program;
    /// The arguments after argv[0]; argv[0] is `program` as given.
    std::vector<std::string> args;
    /// "NAME=value" entries; when empty (nullopt), a copy of the agent's environment.
    std::optional<std::vector<std::string>> env;
    /// The working directory; empty means the agent's.
    std::string cwd;
    stdio in = stdio::inherit();   ///< stdin
    stdio out = stdio::inherit();  ///< stdout
    stdio err = stdio::inherit();  ///< stderr
    process_isolation isolation = process_isolation::session;
    /// Whether the child gets a cgroup of its own (cgroup.hpp), so that whatever it starts —
    /// a daemon that left its process group included — is killed when it is reaped, and when
    /// the agent dies. Where the agent can make none, the agent adopts what the child leaves
    /// behind (it becomes the child subreaper) and kills it when the child is reaped, and the
    /// watcher follows the child's tree for the agent's death (docs/process.md).
    bool own_cgroup = true;
};

namespace detail::process {

/// The agent's environment as "NAME=value" entries (the caller must not race setenv).
ELASTIC_DECL std::vector<std::string> environ_entries();

/// The steps of the child's set-up, reported back with errno when one fails.
enum class child_step : std::int32_t { group = 1, pdeathsig, stdio, chdir, close_fds, exec, cgroup };

/// What the child writes to the close-on-exec error pipe before _exit(127).
struct child_failure {
    child_step step;
    std::int32_t error;
};

/// Everything the child needs, prepared before the fork so the child allocates nothing.
struct child_plan {
    const char* path;
    char* const* argv;
    char* const* envp;
    const char* cwd;   // nullptr: keep the agent's
    int stdio_fds[3];  // -1: inherit; else a descriptor above 2 to dup onto 0, 1, 2
    bool new_session;
    pid_t parent;
    int error_fd;        // above 2, close-on-exec
    int max_fd;          // for the close loop if close_range is missing
    rlim_t nofile_soft;  // the soft open-files limit to give the child; RLIM_INFINITY: keep
    int cgroup_procs;    // above 2, close-on-exec: the cgroup.procs to join; -1: stay where born
};

/// The child between vfork (or clone3) and exec. Only async-signal-safe calls: the agent is
/// multithreaded, so any lock (malloc's, stdio's) may be held by a thread that does not exist in
/// the child.
[[noreturn]] inline void child_main(const child_plan& plan) noexcept {
    const auto fail = [&plan](child_step step) {
        const child_failure failure{step, errno};
        [[maybe_unused]] const ssize_t n = ::write(plan.error_fd, &failure, sizeof failure);
        ::_exit(127);
    };
    // First the cgroup, before anything can start a descendant that would stay outside it.
    if (plan.cgroup_procs >= 0 && ::write(plan.cgroup_procs, "0", 1) != 1) fail(child_step::cgroup);
    // Every signal is blocked here (inherited from the spawner thread). Reset every disposition:
    // handled ones would reset at exec anyway, but ignored ones (the agent ignores SIGPIPE)
    // would be inherited by the worker.
    struct sigaction deflt {};
    deflt.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) {
        if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &deflt, nullptr);  // EINVAL ok
    }
    if (plan.new_session ? ::setsid() < 0 : ::setpgid(0, 0) != 0) fail(child_step::group);
    // Forked by the spawner thread, which lives as long as the agent: this fires when the
    // agent dies. If it died before the prctl, we were reparented already: give up now.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) fail(child_step::pdeathsig);
    if (::getppid() != plan.parent) ::_exit(127);
    for (int target = 0; target < 3; ++target) {
        // Sources are above 2 (see raise_above_stdio), so no dup2 clobbers a later source.
        if (plan.stdio_fds[target] >= 0 && ::dup2(plan.stdio_fds[target], target) < 0) {
            fail(child_step::stdio);
        }
    }
    if (plan.cwd != nullptr && ::chdir(plan.cwd) != 0) fail(child_step::chdir);
    // Asio opens sockets without SOCK_CLOEXEC: close everything above 2 but the error pipe
    // (close-on-exec, so execve closes it and the agent reads EOF: success).
    const auto e = static_cast<unsigned>(plan.error_fd);
    if ((e > 3 && ::close_range(3, e - 1, 0) != 0) || ::close_range(e + 1, ~0U, 0) != 0) {
        if (errno != ENOSYS && errno != EINVAL) fail(child_step::close_fds);
        for (int fd = 3; fd < plan.max_fd; ++fd) {  // kernels before 5.9
            if (fd != plan.error_fd) ::close(fd);
        }
    }
    // The agent raised its own open-files limit (raise_open_files_limit); the worker gets the
    // one its user set, as it would under any other launcher.
    if (plan.nofile_soft != RLIM_INFINITY) {
        rlimit limit{};
        if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && plan.nofile_soft < limit.rlim_cur) {
            limit.rlim_cur = plan.nofile_soft;
            ::setrlimit(RLIMIT_NOFILE, &limit);
        }
    }
    sigset_t none;
    ::sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(plan.path, plan.argv, plan.envp);
    fail(child_step::exec);
    ::_exit(127);  // not reached
}

/// Starts the child with vfork: it borrows the agent's memory until execve, so nothing is
/// copied — on this machine fork costs 3 to 5 ms (copying the page tables), vfork 0.1 ms — and
/// the spawner thread is suspended until the exec, which `spawn` waits for anyway. What makes
/// that safe is what glibc's posix_spawn relies on: every signal is blocked (the spawner thread
/// blocks them all) until the dispositions are back to SIG_DFL, so no handler of the agent ever
/// runs on the borrowed stack; the child writes no memory but its own frames below this one and
/// never returns into them; its descriptor table and signal dispositions are its own (no
/// CLONE_FILES, no CLONE_SIGHAND). (ThreadSanitizer turns vfork into fork; ASan supports it.)
/// noinline: the child's frames must lie below a frame that is not the caller's.
[[gnu::noinline]] inline pid_t vfork_child(const child_plan& plan) noexcept {
    const pid_t pid = ::vfork();
    if (pid == 0) child_main(plan);
    return pid;
}

// Born in its cgroup. Moving a process into a cgroup (a write to cgroup.procs) takes a lock whose
// writer waits for an RCU grace period when none was taken lately: on this kind of machine the
// first worker's move cost 11 to 14 ms, and later ones up to 6 ms each, while the spawner thread
// waited. clone3 with CLONE_INTO_CGROUP (Linux 5.7) makes the child in its cgroup, as any fork
// makes it in its parent's, for the cost of a fork. With CLONE_VM | CLONE_VFORK it is vfork with
// a stack of its own for the child (the kernel starts the child on it, so it cannot run on the
// spawner thread's frames as a vfork child does): the x86-64 entry below, in assembly since
// glibc 2.36 offers no clone3. Elsewhere, and under the sanitizers, the child moves itself with
// the write: they intercept vfork (ThreadSanitizer turns it into fork, AddressSanitizer guards its
// own locks around it) and know nothing of a child that borrows the agent's memory on a stack of
// its own (AddressSanitizer then warns of that stack and leaves a lock of its own held).
#if defined(__x86_64__) && !defined(__ILP32__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define ELASTIC_DETAIL_NO_CLONE3 1
#endif
#endif
#if !defined(ELASTIC_DETAIL_NO_CLONE3)
#define ELASTIC_DETAIL_CLONE3 1
#endif
#endif

/// The kernel's struct clone_args (linux/sched.h, version 2: Linux 5.7).
struct clone3_args {
    std::uint64_t flags;
    std::uint64_t pidfd;
    std::uint64_t child_tid;
    std::uint64_t parent_tid;
    std::uint64_t exit_signal;
    std::uint64_t stack;
    std::uint64_t stack_size;
    std::uint64_t tls;
    std::uint64_t set_tid;
    std::uint64_t set_tid_size;
    std::uint64_t cgroup;
};
inline constexpr std::uint64_t clone_into_cgroup = 0x200000000ULL;  // CLONE_INTO_CGROUP

/// What a refusal of clone3 into a cgroup means.
enum class clone3_refusal {
    fall_back,  ///< vfork and the child's own move, from now on
    resources,  ///< a process limit or memory: the fork failed
};

/// Sorts clone3's errno. EAGAIN (a process limit) and ENOMEM are a failed fork. Anything else
/// is not clone3's to judge: a kernel without clone3 (ENOSYS) or CLONE_INTO_CGROUP (EINVAL,
/// E2BIG), a seccomp filter that refuses what it does not know (ENOSYS, or EPERM in older
/// container runtimes), or a cgroup that takes no process (EACCES, EBUSY, EOPNOTSUPP, ENOENT,
/// ENODEV). vfork and the child's write to cgroup.procs then say which: the write fails on such
/// a cgroup too, and the agent goes on without cgroups (the child_step::cgroup report).
constexpr clone3_refusal classify_clone3_error(int error) noexcept {
    return error == EAGAIN || error == ENOMEM ? clone3_refusal::resources : clone3_refusal::fall_back;
}

/// Set once clone3 into a cgroup was refused for any reason but resources: every later child
/// is started with vfork (tests read it).
inline std::atomic<bool> clone3_fallen_back{false};

#if ELASTIC_DETAIL_CLONE3
/// The clone3 child's stack: one, as the spawner thread starts one child at a time and is
/// suspended until the child has exec'd or exited (CLONE_VFORK). Below it a guard page, so an
/// overflow faults instead of writing the agent's memory. Null when it cannot be mapped.
inline constexpr std::size_t clone3_stack_size = std::size_t{256} * 1024;
ELASTIC_DECL void* clone3_stack() noexcept;

/// Where the clone3 child starts, on its own stack.
[[noreturn]] inline void clone3_child_entry(const child_plan* plan) noexcept { child_main(*plan); }

/// clone3(args) on x86-64. The child, which the kernel starts on `args->stack` with the parent's
/// registers, calls clone3_child_entry(plan) and never comes back; rbx and rdx survive the
/// syscall, so they carry the entry and the plan to it. Returns the child's pid, or -errno.
[[gnu::noinline]] inline long clone3_child(clone3_args* args, const child_plan* plan) noexcept {
    long result = SYS_clone3;
    asm volatile("syscall\n\t"
                 "testq %%rax, %%rax\n\t"
                 "jnz 1f\n\t"
                 "xorl %%ebp, %%ebp\n\t"
                 "movq %%rdx, %%rdi\n\t"
                 "callq *%%rbx\n\t"
                 "ud2\n"
                 "1:"
                 : "+a"(result)
                 : "D"(args), "S"(sizeof(clone3_args)), "d"(plan), "b"(&clone3_child_entry)
                 : "rcx", "r11", "memory", "cc");
    return result;
}
#endif

/// How start_child went: the pid, or the errno of the failure.
struct started_child {
    pid_t pid = -1;
    int error = 0;
};

/// On the spawner thread: starts the child, in the cgroup `cgroup_dir` (-1: none) from birth
/// where the kernel can, else with vfork (and the child's own move, plan.cgroup_procs).
ELASTIC_DECL started_child start_child(const child_plan& plan, int cgroup_dir) noexcept;

/// The path execve will get: `program` itself if it has a slash, else the first executable
/// regular file named `program` in the PATH of the child's environment.
ELASTIC_DECL std::string find_executable(const std::string& program, const std::vector<std::string>& env);

ELASTIC_DECL std::string describe_failure(const child_failure& failure, const spawn_options& options,
                                          const std::string& path);

// One standard stream: the descriptor the child gets, and the caller's end of a pipe.
struct stdio_ends {
    owned_fd child;
    owned_fd parent;
};

ELASTIC_DECL stdio_ends open_stdio(const stdio& target, bool child_reads);

// Kills and reaps a child that exists but will not be handed to the caller.
ELASTIC_DECL void discard_child(pid_t pid, int pidfd) noexcept;

}  // namespace detail::process

/// Starts `options.program` and returns the running child, bound to `executor`.
///
/// The child leads its own session (or process group); its signal dispositions are reset to the
/// defaults and its signal mask emptied; every descriptor above 2 is closed; it gets SIGKILL when
/// the agent dies (PR_SET_PDEATHSIG, from the spawner thread, spawner.hpp), and its process group
/// gets SIGKILL from the watcher process (watcher.hpp) even if the agent was SIGKILLed. With
/// `options.own_cgroup`, where the agent can make one, it also runs in a cgroup of its own
/// (cgroup.hpp), killed with everything in it when the child is reaped or the agent dies.
///
/// Returns once the program has been executed. Throws spawn_error, with errno's text and value,
/// when it cannot be: a missing program, a file without execute permission, a bad working
/// directory — the caller never sees a child that silently exits 127.
///
/// Blocks the calling thread for the fork and the exec handshake (well under a millisecond for
/// a small agent), so it is a plain function, not a coroutine.
ELASTIC_DECL child_process spawn(const asio::any_io_executor& executor, const spawn_options& options);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::process {

ELASTIC_DECL std::vector<std::string> environ_entries() {
    std::vector<std::string> out;
    for (char** entry = ::environ; entry != nullptr && *entry != nullptr; ++entry) {
        out.emplace_back(*entry);
    }
    return out;
}

ELASTIC_DECL std::string find_executable(const std::string& program, const std::vector<std::string>& env) {
    if (program.find('/') != std::string::npos) return program;
    std::string path_var(default_search_path);  // execvp's, when the environment has no PATH
    for (const auto& entry : env) {
        if (entry.rfind("PATH=", 0) == 0) path_var = entry.substr(5);
    }
    if (auto result = search_path(program, path_var); !result.found.empty()) return std::move(result.found);
    throw spawn_error("cannot spawn '" + program + "': no executable file of that name in PATH=" + path_var +
                          " (give a path, or set PATH in the worker's environment)",
                      ENOENT, true);
}

ELASTIC_DECL std::string describe_failure(const child_failure& failure, const spawn_options& options,
                                          const std::string& path) {
    const char* name = ::strerrorname_np(failure.error);
    const std::string why = errno_string(failure.error) + " (" + (name != nullptr ? name : "errno") + ")";
    switch (failure.step) {
        case child_step::exec: {
            std::string text = "cannot execute '" + path + "'";
            if (path != options.program) text += " (found for '" + options.program + "')";
            text += ": " + why;
            if (failure.error == EACCES) text += "; it must be an executable file (chmod +x)";
            if (failure.error == ENOENT) text += "; check the path (or the #! interpreter)";
            if (failure.error == ENOEXEC) text += "; it is neither a binary nor a #! script";
            return text;
        }
        case child_step::chdir:
            return "cannot start '" + options.program + "' in working directory '" + options.cwd + "': " + why;
        case child_step::stdio: return "cannot connect the standard streams of '" + options.program + "': " + why;
        case child_step::group: return "cannot give '" + options.program + "' its own process group: " + why;
        case child_step::pdeathsig: return "cannot set the parent-death signal for '" + options.program + "': " + why;
        case child_step::close_fds: return "cannot close the agent's descriptors in '" + options.program + "': " + why;
        case child_step::cgroup: return "cannot move '" + options.program + "' into its own cgroup: " + why;
    }
    return "cannot start '" + options.program + "': " + why;
}

ELASTIC_DECL stdio_ends open_stdio(const stdio& target, bool child_reads) {
    stdio_ends ends;
    switch (target.which()) {
        case stdio::kind::inherit: break;
        case stdio::kind::pipe: {
            int fds[2];
            if (::pipe2(fds, O_CLOEXEC) != 0) {
                throw process_error("cannot create a pipe for a worker's standard stream: " + errno_string(errno) +
                                    " (raise the open-files limit)");
            }
            ends.child = owned_fd(child_reads ? fds[0] : fds[1]);
            ends.parent = owned_fd(child_reads ? fds[1] : fds[0]);
            break;
        }
        case stdio::kind::null:
            ends.child = owned_fd(::open("/dev/null", O_RDWR | O_CLOEXEC));
            if (!ends.child) throw process_error("cannot open /dev/null: " + errno_string(errno));
            break;
        case stdio::kind::descriptor:
            ends.child = owned_fd(::fcntl(target.fd(), F_DUPFD_CLOEXEC, 3));
            if (!ends.child) {
                throw process_error("cannot use descriptor " + std::to_string(target.fd()) +
                                    " for a worker's standard stream: " + errno_string(errno));
            }
            break;
    }
    ends.child = raise_above_stdio(std::move(ends.child));
    return ends;
}

#if ELASTIC_DETAIL_CLONE3
ELASTIC_DECL void* clone3_stack() noexcept {
    static void* const stack = []() noexcept -> void* {
        const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
        void* mapped = ::mmap(nullptr, clone3_stack_size + page, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (mapped == MAP_FAILED) return nullptr;
        if (::mprotect(mapped, page, PROT_NONE) != 0) {
            ::munmap(mapped, clone3_stack_size + page);
            return nullptr;
        }
        return static_cast<char*>(mapped) + page;
    }();
    return stack;
}
#endif

ELASTIC_DECL started_child start_child(const child_plan& plan, int cgroup_dir) noexcept {
#if ELASTIC_DETAIL_CLONE3
    // A stack that cannot be mapped (no memory) leaves this child to vfork.
    void* const stack = cgroup_dir >= 0 && !clone3_fallen_back.load(std::memory_order_relaxed) ? clone3_stack()
                                                                                               : nullptr;
    if (stack != nullptr) {
        child_plan born_in = plan;
        born_in.cgroup_procs = -1;
        clone3_args args{};
        args.flags = CLONE_VM | CLONE_VFORK | clone_into_cgroup;
        args.exit_signal = SIGCHLD;
        args.stack = reinterpret_cast<std::uintptr_t>(stack);
        args.stack_size = clone3_stack_size;
        args.cgroup = static_cast<std::uint64_t>(cgroup_dir);
        const long result = clone3_child(&args, &born_in);
        if (result > 0) return {static_cast<pid_t>(result), 0};
        const int error = static_cast<int>(-result);
        if (classify_clone3_error(error) == clone3_refusal::resources) return {-1, error};
        clone3_fallen_back.store(true, std::memory_order_relaxed);
    }
#else
    (void)cgroup_dir;
#endif
    const pid_t pid = vfork_child(plan);
    return {pid, pid < 0 ? errno : 0};
}

ELASTIC_DECL void discard_child(pid_t pid, int pidfd) noexcept {
    ::kill(pid, SIGKILL);
    watcher::instance().remove(pid);
    subreaper::instance().release(pid);
    if (pidfd >= 0) {
        siginfo_t info{};
        while (::waitid(p_pidfd, static_cast<id_t>(pidfd), &info, WEXITED) != 0 && errno == EINTR) {
        }
    } else {
        while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
    }
}

}  // namespace detail::process
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL child_process spawn(const asio::any_io_executor& executor, const spawn_options& options) {
    if (options.program.empty()) {
        throw spawn_error("cannot spawn a worker: the program is empty (give a path or a name)", EINVAL, true);
    }
    detail::process::prepare_agent_signals();
    const std::vector<std::string> env = options.env ? *options.env : detail::process::environ_entries();
    const std::string path = detail::process::find_executable(options.program, env);

    std::vector<std::string> arg_strings;
    arg_strings.reserve(options.args.size() + 1);
    arg_strings.push_back(options.program);
    arg_strings.insert(arg_strings.end(), options.args.begin(), options.args.end());
    std::vector<char*> argv;
    for (auto& arg : arg_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings = env;
    std::vector<char*> envp;
    for (auto& entry : env_strings) envp.push_back(entry.data());
    envp.push_back(nullptr);

    detail::process::stdio_ends in = detail::process::open_stdio(options.in, true);
    detail::process::stdio_ends out = detail::process::open_stdio(options.out, false);
    detail::process::stdio_ends err = detail::process::open_stdio(options.err, false);

    int error_pipe[2];
    if (::pipe2(error_pipe, O_CLOEXEC) != 0) {
        throw process_error("cannot create the exec-status pipe for '" + options.program +
                            "': " + detail::process::errno_string(errno) + " (raise the open-files limit)");
    }
    detail::process::owned_fd error_read(error_pipe[0]);
    detail::process::owned_fd error_write = detail::process::raise_above_stdio(
        detail::process::owned_fd(error_pipe[1]));

    detail::process::watcher::instance().ensure_started();  // before any worker can be orphaned
    detail::process::graveyard::instance().sweep();
    detail::process::subreaper::instance().sweep();
    std::optional<detail::process::worker_cgroup> cgroup;
    if (options.own_cgroup) cgroup = detail::process::cgroups::instance().make();
    // No cgroup: the agent adopts the orphans among its descendants (reaper.hpp), before the
    // child can leave any.
    const bool adopt_orphans = options.own_cgroup && !cgroup && detail::process::subreaper::instance().enable();
    // Whatever happens from here on, a cgroup no child_process took is removed.
    struct cgroup_guard {
        std::optional<detail::process::worker_cgroup>& cgroup;
        ~cgroup_guard() {
            if (cgroup) detail::process::cgroups::instance().retire(cgroup->path);
        }
    } cgroup_cleanup{cgroup};

    rlimit limit{};
    int max_fd = 1024;
    if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
        max_fd = static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 20));
    }
    const detail::process::child_plan plan{
        path.c_str(),
        argv.data(),
        envp.data(),
        options.cwd.empty() ? nullptr : options.cwd.c_str(),
        {in.child.get(), out.child.get(), err.child.get()},
        options.isolation == process_isolation::session,
        ::getpid(),
        error_write.get(),
        max_fd,
        detail::process::original_open_files_soft_limit(),
        cgroup ? cgroup->procs.get() : -1,
    };
    // Until the child is registered it is an unknown child of the agent: no sweep may take it
    // for an orphan meanwhile.
    auto registering = detail::process::subreaper::instance().registering();
    detail::process::started_child started;
    auto job = [&] { started = detail::process::start_child(plan, cgroup ? cgroup->dir.get() : -1); };
    detail::process::spawner::instance().run(job);
    const pid_t pid = started.pid;
    const int fork_errno = started.error;
    if (pid < 0) {
        throw spawn_error("cannot fork to start '" + options.program +
                              "': " + detail::process::errno_string(fork_errno) +
                              " (check the process limit, ulimit -u, and free memory)",
                          fork_errno);
    }
    in.child.reset();
    out.child.reset();
    err.child.reset();
    error_write.reset();

    // The child exists: from here on, any failure kills and reaps it.
    try {
        detail::process::watcher::instance().add(pid);
    } catch (...) {
        ::kill(pid, SIGKILL);
        while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
        }
        throw;
    }
    try {
        if (adopt_orphans) {
            detail::process::watcher::instance().contain(pid);
            detail::process::subreaper::instance().add(pid);
        } else if (!options.own_cgroup) {
            detail::process::watcher::instance().exempt(pid);
            detail::process::subreaper::instance().exempt(pid);
        }
    } catch (...) {
        detail::process::discard_child(pid, -1);
        throw;
    }
    registering.unlock();
    // Safe after fork: the pid is our unreaped child (SIGCHLD is not ignored, see
    // prepare_agent_signals), so it cannot have been recycled.
    detail::process::owned_fd pidfd(detail::process::pidfd_open(pid));
    if (!pidfd) {
        const int e = errno;
        detail::process::discard_child(pid, -1);
        throw spawn_error("cannot open a pidfd for pid " + std::to_string(pid) + ": " +
                              detail::process::errno_string(e) + " (needs Linux 5.3 or later)",
                          e);
    }

    detail::process::child_failure failure{};
    ssize_t n = 0;
    do {
        n = ::read(error_read.get(), &failure, sizeof failure);
    } while (n < 0 && errno == EINTR);
    if (n != 0) {
        const bool reported = n == static_cast<ssize_t>(sizeof failure);  // by the child, whole
        if (!reported) {
            failure = {detail::process::child_step::exec, n < 0 ? errno : EIO};
        }
        detail::process::discard_child(pid, pidfd.get());
        if (failure.step == detail::process::child_step::cgroup) {
            // The agent could make the cgroup but not move a process into it (a cgroup it
            // does not own, say). Containment by process group is what is left: go on with
            // that, for this worker and every later one; cgroups::reason() says why.
            detail::process::cgroups::instance().disable(detail::process::describe_failure(failure, options, path) +
                                                         " (" + cgroup->path + ")");
            return spawn(executor, options);
        }
        // execve's refusals that are the program's own (its path, its mode, its format, its #!
        // interpreter); any other errno (memory, descriptors, a busy text file, I/O, the
        // agent's own read of the report) is not.
        const int e = failure.error;
        const bool program_fault = reported && failure.step == detail::process::child_step::exec &&
                                   (e == ENOENT || e == EACCES || e == ENOEXEC || e == ENOTDIR || e == ELOOP ||
                                    e == ENAMETOOLONG || e == ELIBBAD || e == EISDIR);
        throw spawn_error(detail::process::describe_failure(failure, options, path), failure.error, program_fault);
    }

    // Hand the descriptors to Asio; assign() takes ownership only once it succeeds, so on
    // failure each one is still closed by its owned_fd, and the child is not left behind.
    const auto adopt = [&](detail::process::owned_fd& fd) -> std::optional<asio::posix::stream_descriptor> {
        if (!fd) return std::nullopt;
        asio::posix::stream_descriptor stream(executor);
        stream.assign(fd.get());
        fd.release();
        return stream;
    };
    try {
        auto in_pipe = adopt(in.parent);
        auto out_pipe = adopt(out.parent);
        auto err_pipe = adopt(err.parent);
        auto pid_stream = adopt(pidfd);
        std::string cgroup_path = cgroup ? std::move(cgroup->path) : std::string();
        cgroup.reset();
        return detail::process::child_process_factory::make(std::move(*pid_stream), pid, std::move(in_pipe),
                                                            std::move(out_pipe), std::move(err_pipe),
                                                            std::move(cgroup_path));
    } catch (...) {
        detail::process::discard_child(pid, pidfd ? pidfd.get() : -1);
        throw;
    }
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
