// How much CPU a process spends while it should be idle, measured to the nanosecond.
//
// The idle checks once compared utime + stime from /proc/<pid>/stat, which the kernel reports in
// whole clock ticks (10 ms): a few microseconds of legitimate work that happened to cross a tick
// boundary read as a whole tick, and a "0 ticks" check failed about once in a hundred runs under
// ASan. The scheduler's own counter (/proc/<pid>/task/<tid>/schedstat, first field: time on CPU
// in ns) has no such rounding, so the checks can ask the question they mean: did the process
// poll, or did it sleep until something happened?
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace idle_cpu {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool thread_sanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool thread_sanitizer = true;
#else
inline constexpr bool thread_sanitizer = false;
#endif
#else
inline constexpr bool thread_sanitizer = false;
#endif

/// What an idle window of 2 s may cost: 1 % of it. A process that sleeps in epoll until a timer,
/// a socket or a child wakes it spends tens of microseconds there; anything that polls (even a
/// 100 Hz loop under a sanitizer) spends far more.
inline constexpr std::chrono::milliseconds budget{20};

/// Time on CPU of one thread (`/proc/<pid>/task/<tid>/schedstat`), or -1 ns if it is gone.
inline std::chrono::nanoseconds thread_time(pid_t pid, const std::string& tid) {
    const auto path = "/proc/" + std::to_string(pid) + "/task/" + tid + "/schedstat";
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) return std::chrono::nanoseconds(-1);
    long long ns = -1;
    if (std::fscanf(f, "%lld", &ns) != 1) ns = -1;
    std::fclose(f);
    return std::chrono::nanoseconds(ns);
}

/// Time on CPU of a process, summed over its threads. Under ThreadSanitizer only the main
/// thread's, where the code under test runs: TSan's runtime wakes its own background thread
/// every 100 ms whatever the process does.
inline std::chrono::nanoseconds cpu_time(pid_t pid) {
    if (thread_sanitizer) return thread_time(pid, std::to_string(pid));
    const auto dir_path = "/proc/" + std::to_string(pid) + "/task";
    DIR* dir = ::opendir(dir_path.c_str());
    if (dir == nullptr) return std::chrono::nanoseconds(-1);
    std::chrono::nanoseconds total{0};
    while (const dirent* entry = ::readdir(dir)) {
        if (entry->d_name[0] == '.') continue;
        const auto t = thread_time(pid, entry->d_name);
        if (t.count() > 0) total += t;  // a thread that ended meanwhile counts nothing
    }
    ::closedir(dir);
    return total;
}

/// Milliseconds, for INFO messages.
inline double ms(std::chrono::nanoseconds d) { return static_cast<double>(d.count()) / 1e6; }

}  // namespace idle_cpu
