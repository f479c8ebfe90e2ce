// SPDX-License-Identifier: MIT
// The watchdog's stack dump: on a chosen signal, a worker writes the backtrace of every one of
// its threads to a file, then counts the dump in its watchdog page, so the agent that found it
// hung knows what it was doing before stopping it. Async-signal-safe throughout.
#pragma once

#include "elastic/detail/backtrace.hpp"
#include "elastic/detail/watchdog_slot.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace elastic::inline v0::detail {

inline constexpr int stack_dump_max_frames = 96;
inline constexpr int stack_dump_max_threads = 512;

// Set once by install_stack_dump, read by the handler. A process dumps at most once (the agent
// asks a hung worker once, then stops it): a thread that answers a request late can never start
// a second dump over the first.
struct stack_dump_state {
    std::atomic<bool> installed{false};
    int signal = 0;
    pid_t agent = 0;               // the only sender that starts a dump
    struct sigaction previous {};  // the program's own action for the signal, for other senders
    long long deadline_ms = 0;     // the dump's end (CLOCK_MONOTONIC, ms)
    char path[4096] = {};
    std::atomic<watchdog::page*> page{nullptr};  // where dumps are counted; null: not counted
    std::atomic<long> coordinator{0};            // the thread that dumps; never reset
    // The thread asked to add its stack: its tid while asked, -1 once it has claimed the
    // request (it then writes), 0 when none is asked.
    std::atomic<long> target{0};
    std::atomic<bool> target_done{false};
    int fd = -1;
    char buffer[32 * 1024] = {};  // the answering thread's text (one at a time)
    char heading[512] = {};       // the coordinator's own lines
};

inline stack_dump_state stack_dump_storage{};

inline long current_tid() noexcept { return ::syscall(SYS_gettid); }

inline void write_all(int fd, const char* data, std::size_t size) noexcept {
    while (size > 0) {
        const ssize_t n = ::write(fd, data, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        data += n;
        size -= static_cast<std::size_t>(n);
    }
}

// Reads /proc/self/task/<tid>/<leaf> into `out` (at most size-1 bytes, NUL-terminated);
// returns the length, 0 on any failure.
inline std::size_t read_task_file(long tid, const char* leaf, char* out, std::size_t size) noexcept {
    char path[96];
    fixed_writer p(path, sizeof(path));
    p.put("/proc/self/task/");
    p.put_unsigned(static_cast<std::uintmax_t>(tid));
    p.put('/');
    p.put(leaf);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    std::size_t length = 0;
    while (length + 1 < size) {
        const ssize_t n = ::read(fd, out + length, size - 1 - length);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        length += static_cast<std::size_t>(n);
    }
    ::close(fd);
    out[length] = '\0';
    return length;
}

// "Thread 4242 (name)" followed by ":\n" or a reason.
inline void put_thread_heading(fixed_writer& out, long tid) noexcept {
    char name[32];
    auto length = read_task_file(tid, "comm", name, sizeof(name));
    while (length > 0 && (name[length - 1] == '\n' || name[length - 1] == '\0')) name[--length] = '\0';
    out.put("Thread ");
    out.put_unsigned(static_cast<std::uintmax_t>(tid));
    if (length > 0) {
        out.put(" (");
        out.put(name, length);
        out.put(')');
    }
}

// Whether thread `tid` blocks `sig` (its SigBlk mask): asking it would be in vain.
inline bool thread_blocks(long tid, int sig) noexcept {
    char status[4096];
    const auto length = read_task_file(tid, "status", status, sizeof(status));
    const char* line = nullptr;
    for (std::size_t i = 0; i + 7 < length; ++i) {
        if ((i == 0 || status[i - 1] == '\n') && std::strncmp(status + i, "SigBlk:", 7) == 0) {
            line = status + i + 7;
            break;
        }
    }
    if (line == nullptr) return false;
    while (*line == ' ' || *line == '\t') ++line;
    std::uint64_t mask = 0;
    for (; *line != '\0' && *line != '\n'; ++line) {
        const char c = *line;
        const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (digit < 0) return false;
        mask = (mask << 4) | static_cast<std::uint64_t>(digit);  // the low 64 signals are enough
    }
    return sig >= 1 && sig <= 64 && ((mask >> (sig - 1)) & 1U) != 0;
}

// The calling thread's stack, from inside the handler, appended to the dump.
inline void dump_this_thread(void* context) noexcept {
    auto& state = stack_dump_storage;
    void* frames[stack_dump_max_frames];
    const int count = capture_backtrace(frames, stack_dump_max_frames);
    const int interrupted = interrupted_frame(frames, count, context);
    const int first = interrupted >= 0 ? interrupted : 0;
    fixed_writer out(state.buffer, sizeof(state.buffer));
    put_thread_heading(out, current_tid());
    out.put(":\n");
    for (int i = first; i < count; ++i) {
        const auto pc = reinterpret_cast<std::uintptr_t>(frames[i]);
        const auto lookup = i == interrupted || pc == 0 ? pc : pc - 1;
        put_frame(out, i - first, pc, symbolize(pc, lookup), false);
    }
    if (out.truncated()) out.put("  ... (truncated)\n");
    out.put('\n');
    write_all(state.fd, out.data(), out.size());
}

inline long long monotonic_ms() noexcept {
    struct timespec now {};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    return static_cast<long long>(now.tv_sec) * 1000 + now.tv_nsec / 1000000;
}

// Waits up to `ms` (never past the dump's deadline) for the asked thread to finish its stack.
inline bool await_target(int ms) noexcept {
    auto& state = stack_dump_storage;
    const long long end = std::min(monotonic_ms() + ms, state.deadline_ms);
    const struct timespec tenth = {0, 100000};
    while (monotonic_ms() < end) {
        if (state.target_done.load(std::memory_order_acquire)) return true;
        ::nanosleep(&tenth, nullptr);
    }
    return state.target_done.load(std::memory_order_acquire);
}

// Whether thread `tid` sleeps in the kernel uninterruptibly (state D): it cannot answer.
inline bool thread_in_d_state(long tid) noexcept {
    char stat[512];
    const auto length = read_task_file(tid, "stat", stat, sizeof(stat));
    // "tid (comm) S ...": the state follows the last ')'.
    std::size_t close = 0;
    for (std::size_t i = 0; i < length; ++i) {
        if (stat[i] == ')') close = i;
    }
    return close != 0 && close + 2 < length && stat[close + 2] == 'D';
}

inline void put_coordinator_line(long tid, const char* what) noexcept {
    auto& state = stack_dump_storage;
    fixed_writer line(state.heading, sizeof(state.heading));
    put_thread_heading(line, tid);
    line.put(what);
    write_all(state.fd, line.data(), line.size());
}

// Asks thread `tid` for its stack and waits for it. False when the dump must end here: the
// thread claimed the request and did not finish, so it may still write.
inline bool ask_thread(long tid, int sig) noexcept {
    auto& state = stack_dump_storage;
    if (thread_blocks(tid, sig)) {
        put_coordinator_line(tid, ": blocks the signal, no stack\n\n");
        return true;
    }
    if (thread_in_d_state(tid)) {
        put_coordinator_line(tid, ": in uninterruptible sleep (state D, in the kernel), no stack\n\n");
        return true;
    }
    if (monotonic_ms() >= state.deadline_ms) {
        put_coordinator_line(tid, ": and the threads after it: the dump's 3 s are spent, no stacks\n");
        return false;
    }
    state.target_done.store(false, std::memory_order_relaxed);
    state.target.store(tid, std::memory_order_release);
    if (::syscall(SYS_tgkill, ::getpid(), tid, sig) != 0) {
        state.target.store(0, std::memory_order_relaxed);
        return true;  // it ended meanwhile
    }
    if (await_target(300)) return true;
    long asked = tid;
    if (state.target.compare_exchange_strong(asked, 0)) {
        // Never claimed: when the signal reaches it at last, it finds itself not asked.
        put_coordinator_line(tid, ": did not answer within 0.3 s, no stack\n\n");
        return true;
    }
    // Claimed and writing: give it more time, else stop the dump (it would race the next one).
    if (await_target(1000)) return true;
    put_coordinator_line(tid, ": still writing its stack; the dump ends here\n");
    return false;
}

inline void on_dump_signal(int sig, siginfo_t* info, void* context) noexcept {
    const int saved_errno = errno;
    auto& state = stack_dump_storage;
    const long me = current_tid();
    long asked = me;
    // Only the agent starts a dump; any other sender gets the program's own action.
    const bool from_agent = info != nullptr && info->si_code == SI_USER && info->si_pid == state.agent;
    const bool from_us = info != nullptr && info->si_code == SI_TKILL && info->si_pid == ::getpid();
    long none = 0;
    if (!from_agent && !from_us) {
        const auto& old = state.previous;
        if ((old.sa_flags & SA_SIGINFO) != 0 && old.sa_sigaction != nullptr) {
            old.sa_sigaction(sig, info, context);
        } else if (old.sa_handler == SIG_DFL) {
            // As without this handler: the default action (SIGUSR1/2 end the process).
            ::sigaction(sig, &old, nullptr);
            ::raise(sig);
        } else if (old.sa_handler != SIG_IGN && old.sa_handler != nullptr) {
            old.sa_handler(sig);
        }
    } else if (state.target.compare_exchange_strong(asked, -1)) {
        // Asked by the coordinator, and still asked: add this thread's stack.
        dump_this_thread(context);
        state.target.store(0, std::memory_order_relaxed);
        state.target_done.store(true, std::memory_order_release);
    } else if (from_agent && state.coordinator.compare_exchange_strong(none, me)) {
        // The agent's request: this thread writes the dump, within 3 s.
        state.deadline_ms = monotonic_ms() + 3000;
        state.fd = ::open(state.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        bool whole = true;
        if (state.fd >= 0) {
            {
                fixed_writer head(state.heading, sizeof(state.heading));
                head.put("Stacks of process ");
                head.put_unsigned(static_cast<std::uintmax_t>(::getpid()));
                head.put(", every thread, the one that took the signal first (most recent call first):\n\n");
                write_all(state.fd, head.data(), head.size());
            }
            dump_this_thread(context);
            // Then every other thread, one at a time: a thread the signal reaches adds its own.
            const int dir = ::open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            alignas(8) char entries[4096];
            int threads = 0;
            while (whole && dir >= 0) {
                const long n = ::syscall(SYS_getdents64, dir, entries, sizeof(entries));
                if (n <= 0) break;
                for (long at = 0; at < n && whole;) {
                    struct linux_dirent64 {
                        std::uint64_t d_ino;
                        std::int64_t d_off;
                        unsigned short d_reclen;
                        unsigned char d_type;
                        char d_name[1];
                    };
                    const auto* e = reinterpret_cast<const linux_dirent64*>(entries + at);
                    at += e->d_reclen;
                    const long tid = std::atol(e->d_name);
                    if (tid <= 0 || tid == me) continue;
                    if (++threads > stack_dump_max_threads) {
                        put_coordinator_line(tid, ": and the threads after it: too many, no stacks\n");
                        whole = false;
                        break;
                    }
                    if (!ask_thread(tid, sig)) whole = false;
                }
            }
            if (dir >= 0) ::close(dir);
            // A thread still writing keeps the descriptor: closing it could hand its number to
            // another file while that thread writes. One descriptor, once per process.
            if (whole) ::close(state.fd);
        }
        if (auto* page = state.page.load(std::memory_order_acquire); page != nullptr) {
            watchdog::counter(page->dumps).fetch_add(1, std::memory_order_release);
        }
    }
    errno = saved_errno;
}

/// Installs the stack dump: on `sig` sent by process `agent`, every thread's backtrace goes to
/// `path` (replaced), once per process, and the page says so (`counts_dumps` 1) and counts the
/// dump. The program's own action for `sig` is kept for every other sender. Later calls do
/// nothing. False when the path does not fit or the handler cannot be set.
inline bool install_stack_dump(int sig, const char* path, pid_t agent, watchdog::page* page) noexcept {
    auto& state = stack_dump_storage;
    if (sig <= 0 || sig >= NSIG || path == nullptr || std::strlen(path) >= sizeof(state.path)) return false;
    if (state.installed.exchange(true)) return state.signal == sig;
    std::strcpy(state.path, path);
    state.signal = sig;
    state.agent = agent;
    struct sigaction action {};
    action.sa_sigaction = on_dump_signal;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (::sigaction(sig, &action, &state.previous) != 0) return false;
    if (page != nullptr) {
        state.page.store(page, std::memory_order_release);
        watchdog::counter(page->counts_dumps).store(1, std::memory_order_release);
    }
    return true;
}

}  // namespace elastic::inline v0::detail
