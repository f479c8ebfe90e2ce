// SPDX-License-Identifier: MIT
// The watchdog's shared page: what a worker publishes (heartbeats, its step, the section it is
// in, its stack dumps) and the agent reads, one page per worker, in a file both map. The
// layout is the contract between elastic/watchdog.hpp (and the Python module the agent puts on
// the workers' path) and the agent: fixed offsets, little-endian 64-bit counters.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace elastic::inline v0::detail::watchdog {

/// The variables elasticrun sets when --watchdog is given (docs/watchdog.md).
inline constexpr const char* file_variable = "ELASTIC_WATCHDOG_FILE";      ///< the worker's page
inline constexpr const char* stacks_variable = "ELASTIC_WATCHDOG_STACKS";  ///< where stacks go
inline constexpr const char* signal_variable = "ELASTIC_WATCHDOG_SIGNAL";  ///< the dump signal
inline constexpr const char* agent_variable = "ELASTIC_WATCHDOG_AGENT";    ///< the agent's pid

inline constexpr std::uint32_t page_magic = 0x44574c45;  // "ELWD" read as little-endian bytes
inline constexpr std::uint32_t page_version = 1;
inline constexpr std::size_t page_size = 4096;
inline constexpr std::size_t section_capacity = 64;  // bytes of a section's name, NUL-padded

/// The page. The agent writes magic and version when it creates the file; everything else is
/// the worker's. Counters only grow; `section_seq` is odd while the name is being written (a
/// sequence lock: the reader retries, and gives up on a writer that never finishes).
struct page {
    std::uint32_t magic;
    std::uint32_t version;
    std::uint64_t beats;                          ///< heartbeat() calls
    std::uint64_t progress;                       ///< the last progress value + 1; 0: never set
    std::uint64_t section_seq;                    ///< changes at every section entry and exit
    std::uint64_t dumps;                          ///< stack dumps completed (the agent awaits the next one)
    std::uint64_t attached;                       ///< the worker's pid once it mapped the page
    std::uint64_t section[section_capacity / 8];  ///< the name's bytes, NUL-padded
    /// The worker's handler of the dump signal: 0 none, 1 one that counts its dumps in `dumps`
    /// (native), 2 one that does not (Python's faulthandler).
    std::uint64_t counts_dumps;
};
static_assert(sizeof(page) <= page_size);
static_assert(offsetof(page, beats) == 8 && offsetof(page, progress) == 16 && offsetof(page, section_seq) == 24 &&
              offsetof(page, dumps) == 32 && offsetof(page, attached) == 40 && offsetof(page, section) == 48 &&
              offsetof(page, counts_dumps) == 112);
static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free);

/// A counter of the page, atomically (the page is shared with another process).
[[nodiscard]] inline std::atomic_ref<std::uint64_t> counter(std::uint64_t& field) noexcept {
    return std::atomic_ref<std::uint64_t>(field);
}

/// Writes the section name under the sequence lock (the worker side). Writers take the lock by
/// moving the sequence from even to odd, so two threads never interleave their bytes.
inline void write_section(page& p, std::string_view name) noexcept {
    auto seq = counter(p.section_seq);
    auto start = seq.load(std::memory_order_relaxed);
    for (int spins = 0;; ++spins) {
        if ((start & 1U) == 0 && seq.compare_exchange_weak(start, start | 1U, std::memory_order_acquire)) break;
        if ((start & 1U) != 0) {
            if (spins > 1'000'000) return;  // a writer that died midway (a fork): give up, bounded
            start = seq.load(std::memory_order_relaxed);
        }
    }
    std::atomic_thread_fence(std::memory_order_release);
    char bytes[section_capacity] = {};
    if (!name.empty()) std::memcpy(bytes, name.data(), std::min(name.size(), section_capacity));
    for (std::size_t w = 0; w < section_capacity / 8; ++w) {
        std::uint64_t word = 0;
        std::memcpy(&word, bytes + w * 8, 8);
        counter(p.section[w]).store(word, std::memory_order_relaxed);
    }
    seq.store((start | 1U) + 1, std::memory_order_release);
}

/// What the agent reads of a page at one instant.
struct page_snapshot {
    std::uint64_t beats = 0;
    std::uint64_t progress = 0;
    std::uint64_t section_seq = 0;
    std::uint64_t dumps = 0;
    std::uint64_t attached = 0;
    std::uint64_t handler = 0;  ///< counts_dumps: 0 none, 1 counting (native), 2 not (Python)
    std::string section;        ///< printable ASCII only; empty outside sections
    bool torn = false;          ///< the name was being rewritten at every try: `section` is stale
};

/// Reads a page the agent does not trust: any bytes at all are a valid snapshot; a name's
/// bytes outside printable ASCII become '?'.
[[nodiscard]] inline page_snapshot read_page(page& p) {
    page_snapshot s;
    s.beats = counter(p.beats).load(std::memory_order_relaxed);
    s.progress = counter(p.progress).load(std::memory_order_relaxed);
    s.dumps = counter(p.dumps).load(std::memory_order_acquire);
    s.attached = counter(p.attached).load(std::memory_order_relaxed);
    s.handler = counter(p.counts_dumps).load(std::memory_order_relaxed);
    char name[section_capacity];
    for (int attempt = 0; attempt < 8; ++attempt) {
        const auto before = counter(p.section_seq).load(std::memory_order_acquire);
        for (std::size_t w = 0; w < section_capacity / 8; ++w) {
            const auto word = counter(p.section[w]).load(std::memory_order_relaxed);
            std::memcpy(name + w * 8, &word, 8);
        }
        std::atomic_thread_fence(std::memory_order_acquire);
        const auto after = counter(p.section_seq).load(std::memory_order_relaxed);
        s.section_seq = after;
        s.torn = (before & 1U) != 0 || before != after;
        if (!s.torn) break;
    }
    std::size_t size = 0;
    while (size < section_capacity && name[size] != '\0') ++size;
    s.section.assign(name, size);
    for (auto& c : s.section) {
        if (c < 0x20 || c > 0x7e) c = '?';
    }
    return s;
}

}  // namespace elastic::inline v0::detail::watchdog
