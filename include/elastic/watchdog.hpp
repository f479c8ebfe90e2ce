// SPDX-License-Identifier: MIT
// The worker's side of the watchdog: heartbeat(), progress(step) and scoped sections, which
// the agent watches for hangs (elasticrun --watchdog). A heartbeat is one atomic add into a page
// shared with the agent: no system call, no lock; a section also takes an uncontended lock.
// Without --watchdog (or outside elasticrun) every call does nothing.
#pragma once

#include "elastic/detail/stack_dump.hpp"
#include "elastic/detail/watchdog_slot.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
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
    const auto me = static_cast<std::uint64_t>(::getpid());
    std::uint64_t owner = 0;
    if (p->magic != page_magic || p->version != page_version ||
        (!counter(p->attached).compare_exchange_strong(owner, me) && owner != me)) {
        ::munmap(mapped, page_size);
        return nullptr;
    }
    const auto number_of = [](const char* text) {
        long value = 0;
        if (text == nullptr) return value;
        const auto* end = text + std::strlen(text);
        if (std::from_chars(text, end, value).ptr != end) value = 0;
        return value;
    };
    const char* stacks = std::getenv(stacks_variable);
    const long sig = number_of(std::getenv(signal_variable));
    const long agent = number_of(std::getenv(agent_variable));
    // The handler first, then the page says it has one (the agent signals only then).
    if (stacks != nullptr && stacks[0] != '\0' && sig > 0 && sig < NSIG && agent > 0) {
        (void)install_stack_dump(static_cast<int>(sig), stacks, static_cast<pid_t>(agent), p);
    }
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
            stack_dump_storage.coordinator.store(-2, std::memory_order_relaxed);  // never dumps
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

namespace detail::watchdog {

/// The live sections of the process, newest last; the page shows the newest one still alive.
struct section_node {
    section_node* prev = nullptr;
    section_node* next = nullptr;
    char name[section_capacity] = {};
    std::size_t size = 0;
};

struct live_sections {
    std::mutex lock;
    section_node* newest = nullptr;
};

inline live_sections& sections() noexcept {
    static live_sections all;
    return all;
}

}  // namespace detail::watchdog

/// A named part of the work ("data", "forward", "allreduce", "checkpoint") while the object
/// lives. The agent reports the section a hung rank was in, and gives a section the time
/// limit `--watchdog section:NAME=...` (or `section=...` for every section) in place of the
/// heartbeat limit. The page shows one name per process: the section entered last among those
/// still alive, whatever the threads (leaving one shows the newest remaining one). Names longer
/// than 63 bytes are cut.
class section {
public:
    explicit section(std::string_view name) noexcept : page_(detail::watchdog::current()) {
        if (page_ == nullptr) return;
        node_.size = std::min(name.size(), sizeof(node_.name) - 1);
        if (node_.size != 0) std::memcpy(node_.name, name.data(), node_.size);
        auto& all = detail::watchdog::sections();
        const std::lock_guard<std::mutex> hold(all.lock);
        node_.prev = all.newest;
        if (all.newest != nullptr) all.newest->next = &node_;
        all.newest = &node_;
        detail::watchdog::write_section(*page_, std::string_view(node_.name, node_.size));
    }
    ~section() {
        // Nothing in a child forked after the attach: the page and the list are its parent's
        // (and the list's lock may have been held by a thread the child does not have).
        if (page_ == nullptr || detail::watchdog::current() != page_) return;
        auto& all = detail::watchdog::sections();
        const std::lock_guard<std::mutex> hold(all.lock);
        if (node_.prev != nullptr) node_.prev->next = node_.next;
        if (node_.next != nullptr) node_.next->prev = node_.prev;
        if (all.newest == &node_) all.newest = node_.prev;
        const auto* shown = all.newest;
        detail::watchdog::write_section(*page_, shown != nullptr ? std::string_view(shown->name, shown->size)
                                                                 : std::string_view());
    }
    section(const section&) = delete;
    section& operator=(const section&) = delete;

private:
    detail::watchdog::page* page_;
    detail::watchdog::section_node node_;
};

}  // namespace elastic::inline v0
