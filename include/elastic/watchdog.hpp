// SPDX-License-Identifier: MIT
// The worker's side of the watchdog: heartbeat(), progress(step) and scoped sections, which
// the agent watches for hangs (elasticrun --watchdog). One atomic add or store into a page
// shared with the agent per call: no system call, no lock. Without --watchdog (or outside
// elasticrun) every call does nothing.
#pragma once

#include "elastic/detail/stack_dump.hpp"
#include "elastic/detail/watchdog_slot.hpp"

#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace elastic::inline v0 {

namespace detail::watchdog {

/// Maps the page named by ELASTIC_WATCHDOG_FILE and installs the stack dump on
/// ELASTIC_WATCHDOG_SIGNAL; null when the variables are absent or the page is not one the
/// agent made (wrong size or magic): the calls then do nothing.
inline page* attach() noexcept {
    const char* file = std::getenv(file_variable);
    if (file == nullptr || file[0] == '\0') return nullptr;
    const int fd = ::open(file, O_RDWR | O_CLOEXEC);
    if (fd < 0) return nullptr;
    struct stat st {};
    void* mapped = MAP_FAILED;
    if (::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(page_size)) {
        mapped = ::mmap(nullptr, page_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    ::close(fd);
    if (mapped == MAP_FAILED) return nullptr;
    auto* p = static_cast<page*>(mapped);
    // The page is this process's alone: not one made by something else, not one another process
    // (a child started with the same environment) holds already.
    std::uint64_t owner = 0;
    if (p->magic != page_magic || p->version != page_version ||
        !counter(p->attached).compare_exchange_strong(owner, static_cast<std::uint64_t>(::getpid()))) {
        ::munmap(mapped, page_size);
        return nullptr;
    }
    const char* stacks = std::getenv(stacks_variable);
    const char* sig = std::getenv(signal_variable);
    int number = 0;
    if (stacks != nullptr && stacks[0] != '\0' && sig != nullptr) {
        const auto* end = sig + std::strlen(sig);
        if (std::from_chars(sig, end, number).ptr != end) number = 0;
    }
    if (number > 0) (void)install_stack_dump(number, stacks, p);
    return p;
}

inline std::atomic<page*> attached_page{nullptr};

/// The page, attached at the first call (thread-safe); null when not watched, and in a child
/// forked after the attach (its heartbeats must not keep a hung parent looking alive).
inline page* current() noexcept {
    static const bool once = [] {
        attached_page.store(attach(), std::memory_order_release);
        ::pthread_atfork(nullptr, nullptr, [] {
            attached_page.store(nullptr, std::memory_order_relaxed);
            stack_dump_storage.page.store(nullptr, std::memory_order_relaxed);
        });
        return true;
    }();
    (void)once;
    return attached_page.load(std::memory_order_acquire);
}

}  // namespace detail::watchdog

/// True when an agent watches this worker (elasticrun --watchdog).
[[nodiscard]] inline bool watched() noexcept { return detail::watchdog::current() != nullptr; }

/// A sign of life: the agent restarts its clock for "between heartbeats" (`--watchdog
/// beat=...`). Call it from the loop that must not stall, e.g. once per step. Any thread.
inline void heartbeat() noexcept {
    if (auto* p = detail::watchdog::current()) {
        detail::watchdog::counter(p->beats).fetch_add(1, std::memory_order_relaxed);
    }
}

/// The work done so far (a step, a sample count): shown by the agent when a rank hangs, and a
/// sign of life like heartbeat(). Values should grow; the agent keeps the largest.
inline void progress(std::uint64_t done) noexcept {
    if (auto* p = detail::watchdog::current()) {
        detail::watchdog::counter(p->progress).store(done + 1, std::memory_order_relaxed);
        detail::watchdog::counter(p->beats).fetch_add(1, std::memory_order_relaxed);
    }
}

/// A named part of the work ("data", "forward", "allreduce", "checkpoint") while the object
/// lives. The agent reports the section a hung rank was in, and gives a section the time
/// limit `--watchdog section:NAME=...` (or `section=...` for every section) in place of the
/// heartbeat limit. Sections nest: leaving one restores the name of the one around it. The
/// page holds one name per process, so a section entered by another thread replaces it until
/// one of them ends. Names longer than 63 bytes are cut.
class section {
public:
    explicit section(std::string_view name) noexcept : page_(detail::watchdog::current()) {
        if (page_ == nullptr) return;
        for (std::size_t i = 0; i < sizeof(outer_); ++i) {
            outer_[i] = std::atomic_ref<char>(page_->section[i]).load(std::memory_order_relaxed);
        }
        detail::watchdog::write_section(*page_, name);
    }
    ~section() {
        if (page_ == nullptr) return;
        std::size_t size = 0;
        while (size < sizeof(outer_) && outer_[size] != '\0') ++size;
        detail::watchdog::write_section(*page_, std::string_view(outer_, size));
    }
    section(const section&) = delete;
    section& operator=(const section&) = delete;

private:
    detail::watchdog::page* page_;
    char outer_[detail::watchdog::section_capacity] = {};
};

}  // namespace elastic::inline v0
