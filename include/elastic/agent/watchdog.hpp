// SPDX-License-Identifier: MIT
// The agent's watchdog: the time limits of --watchdog (before the first sign of life, between
// heartbeats, inside sections), the shared pages the workers write, and the rule that finds a
// worker hung. worker_group runs it beside the watch for exits.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/random.hpp"
#include "elastic/detail/text.hpp"
#include "elastic/detail/watchdog_slot.hpp"
#include "elastic/policy/spec.hpp"
#include "elastic/process/signal_name.hpp"
#include "elastic/report/failure.hpp"
#include "elastic/usage_error.hpp"

#include "elastic/detail/format.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <cxxabi.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace elastic::inline v0 {

/// --watchdog: how long a worker may show no sign of life (heartbeat(), progress(), entering
/// or leaving a section) before the agent takes it for hung, captures its stacks and stops the
/// group (docs/watchdog.md). Unset limits are not watched; no limit at all: no watchdog.
struct watchdog_settings {
    /// From the worker's start to its first sign of life (`first=`).
    std::optional<std::chrono::milliseconds> first;
    /// Between signs of life, outside sections that have a limit of their own (`beat=`).
    std::optional<std::chrono::milliseconds> beat;
    /// Inside any section without a limit of its own (`section=`).
    std::optional<std::chrono::milliseconds> section;
    /// Inside the section of that name (`section:NAME=`).
    std::map<std::string, std::chrono::milliseconds, std::less<>> sections;
    /// The signal that asks a hung worker for its stacks (`signal=`): SIGUSR1, SIGUSR2 or a
    /// real-time signal, and not one of --signals-to-handle.
    int signal = SIGUSR2;
    /// How long the agent waits for the stacks before stopping the group (`dump=`).
    std::chrono::milliseconds dump = std::chrono::seconds(5);

    [[nodiscard]] bool enabled() const noexcept { return first || beat || section || !sections.empty(); }

    /// The limit inside section `name`, and the key that sets it ("section:save", "section").
    [[nodiscard]] ELASTIC_DECL std::optional<std::pair<std::chrono::milliseconds, std::string>> section_limit(
        std::string_view name) const;

    /// The shortest limit (the agent looks at the pages several times within it).
    [[nodiscard]] ELASTIC_DECL std::optional<std::chrono::milliseconds> shortest() const;

    /// The option's text, parse_watchdog() reads it back: "first=5min,beat=30s,section:save=10min".
    [[nodiscard]] ELASTIC_DECL std::string to_string() const;
    friend bool operator==(const watchdog_settings&, const watchdog_settings&) = default;
};

/// Parses --watchdog's KEY=VALUE list (`first=5min,beat=30s,section=10min,section:save=1h,
/// signal=SIGUSR2,dump=5s`); throws usage_error naming `name` and the item.
[[nodiscard]] ELASTIC_DECL watchdog_settings parse_watchdog(std::string_view text, std::string_view name);

namespace detail::agent {

/// The source of the Python module the agent puts on its workers' PYTHONPATH
/// (`import elastic_watchdog`): the same page and signal as elastic/watchdog.hpp.
inline constexpr std::string_view python_watchdog_module =
    R"py("""elastic_watchdog: heartbeats, progress and sections for elasticrun --watchdog.

Outside elasticrun --watchdog every call does nothing. See docs/watchdog.md.
"""
import faulthandler as _faulthandler
import mmap as _mmap
import os as _os
import struct as _struct

_page = None
_beats = 0
_stacks = None


def _attach():
    global _page, _stacks
    path = _os.environ.get("ELASTIC_WATCHDOG_FILE")
    if not path:
        return
    try:
        fd = _os.open(path, _os.O_RDWR)
        try:
            page = _mmap.mmap(fd, 4096)
        finally:
            _os.close(fd)
    except (OSError, ValueError):
        return
    if _struct.unpack_from("<II", page, 0) != (0x44574C45, 1):
        return
    if _struct.unpack_from("<Q", page, 40)[0] not in (0, _os.getpid()):
        return  # another process (the worker this one was started by) holds the page
    _struct.pack_into("<Q", page, 40, _os.getpid())
    _page = page
    _os.register_at_fork(after_in_child=_detach)
    stacks = _os.environ.get("ELASTIC_WATCHDOG_STACKS")
    sig = _os.environ.get("ELASTIC_WATCHDOG_SIGNAL", "")
    if stacks and sig.isdigit():
        try:
            _stacks = open(stacks, "w")
            _faulthandler.register(int(sig), file=_stacks, all_threads=True)
            _struct.pack_into("<Q", page, 112, 2)  # a handler that does not count its dumps
        except (OSError, ValueError, RuntimeError):
            _stacks = None


def _detach():
    global _page
    _page = None


def watched():
    """True when an agent watches this worker."""
    return _page is not None


def heartbeat():
    """A sign of life."""
    global _beats
    if _page is not None:
        _beats += 1
        _struct.pack_into("<Q", _page, 8, _beats)


def progress(done):
    """The work done so far (a step): reported with a hang; also a sign of life."""
    if _page is not None:
        _struct.pack_into("<Q", _page, 16, (int(done) + 1) & 0xFFFFFFFFFFFFFFFF)
        heartbeat()


def _write_section(name):
    seq = _struct.unpack_from("<Q", _page, 24)[0]
    _struct.pack_into("<Q", _page, 24, seq | 1)
    _page[48:112] = name[:63].ljust(64, b"\0")
    _struct.pack_into("<Q", _page, 24, (seq | 1) + 1)


class section:
    """`with elastic_watchdog.section("allreduce"):` names what the worker is doing."""

    def __init__(self, name):
        self._name = str(name).encode("utf-8", "replace")
        self._outer = b""

    def __enter__(self):
        if _page is not None:
            self._outer = bytes(_page[48:112]).split(b"\0", 1)[0]
            _write_section(self._name)
        return self

    def __exit__(self, *exc):
        if _page is not None:
            _write_section(self._outer)
        return False


_attach()
)py";

/// The stacks a worker wrote from its signal handler, where nothing may allocate, name C++
/// functions by their mangled names: "in _Z32agent_stepv+0x9" becomes "in agent_step()+0x9".
[[nodiscard]] ELASTIC_DECL std::string demangle_frames(std::string_view text);

/// One attempt's pages: a private directory (mode 0700) under /dev/shm (else the temporary
/// directory) holding each worker's page file, where its stacks go, and the Python module.
/// Removed, with everything in it, when the object goes. The agent reads the pages with
/// pread(2), never through a mapping: a worker that truncates its file cannot fault the agent.
class watchdog_pages {
public:
    /// Throws std::system_error naming the path that could not be made.
    ELASTIC_DECL explicit watchdog_pages(std::size_t workers);
    ~watchdog_pages() { release(); }
    watchdog_pages(const watchdog_pages&) = delete;
    watchdog_pages& operator=(const watchdog_pages&) = delete;

    [[nodiscard]] std::size_t size() const noexcept { return fds_.size(); }

    /// Worker `i`'s page as it is now: two reads that agree (the name and its sequence), or the
    /// last one marked torn after a few tries; nullopt when the file no longer holds a page.
    [[nodiscard]] ELASTIC_DECL std::optional<detail::watchdog::page_snapshot> read(std::size_t i) const;
    [[nodiscard]] ELASTIC_DECL std::filesystem::path page_path(std::size_t i) const;
    [[nodiscard]] ELASTIC_DECL std::filesystem::path stacks_path(std::size_t i) const;

    /// What worker `i` is told, added to (or, for PYTHONPATH, put in front of) `env`.
    ELASTIC_DECL void tell(std::size_t i, int signal, std::map<std::string, std::string, std::less<>>& env) const;

    /// The stacks worker `i` wrote, at most `limit` bytes (the rest cut with a note); empty
    /// when it wrote none.
    [[nodiscard]] ELASTIC_DECL std::string stacks(std::size_t i, std::size_t limit = 256 * 1024) const;

    /// The size of worker `i`'s stacks file (-1: none yet).
    [[nodiscard]] ELASTIC_DECL long long stacks_size(std::size_t i) const;

private:
    ELASTIC_DECL static int create_page(const std::filesystem::path& path);

    static bool read_into(int fd, detail::watchdog::page& p) noexcept {
        return ::pread(fd, &p, sizeof p, 0) == static_cast<ssize_t>(sizeof p);
    }

    ELASTIC_DECL void release() noexcept;

    std::filesystem::path dir_;
    std::vector<int> fds_;
};

/// A measured duration as a hang's reason shows it: to the tenth of a second (cut, not
/// rounded up) from 1 s on, to the millisecond below ("31.2 s", "302 ms").
[[nodiscard]] ELASTIC_DECL std::string measured_words(std::chrono::steady_clock::duration d);

/// What the agent knows of one worker's page over time.
struct rank_watch {
    detail::watchdog::page_snapshot seen;  ///< the last reading, as read (torn or not)
    std::string section;                   ///< the last name read whole; empty: none
    std::uint64_t section_seq = 0;         ///< the sequence that name was read at
    bool alive = false;                    ///< a sign of life was seen
    std::chrono::steady_clock::time_point last_sign{};
    std::chrono::steady_clock::time_point section_since{};
    std::optional<std::uint64_t> progress;  ///< the largest progress value seen

    /// Takes a new reading at `now`: a change of any counter, the section's sequence included,
    /// is a sign of life; a sequence that stays where it is (even odd, a writer stopped midway)
    /// is none.
    ELASTIC_DECL void update(const detail::watchdog::page_snapshot& s, std::chrono::steady_clock::time_point now);

    /// Why the worker counts as hung at `now` (it started at `started`), or nullopt.
    [[nodiscard]] ELASTIC_DECL std::optional<hang_report> hung(const watchdog_settings& w,
                                                               std::chrono::steady_clock::time_point started,
                                                               std::chrono::steady_clock::time_point now) const;
};

/// How often the agent reads the pages: a tenth of the shortest limit, within [10 ms, 1 s].
[[nodiscard]] ELASTIC_DECL std::chrono::milliseconds watchdog_interval(const watchdog_settings& w);

}  // namespace detail::agent

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL std::optional<std::pair<std::chrono::milliseconds, std::string>> watchdog_settings::section_limit(
    std::string_view name) const {
    if (const auto it = sections.find(name); it != sections.end()) {
        return std::pair{it->second, detail::format("section:{}", name)};
    }
    if (section) return std::pair{*section, std::string("section")};
    return std::nullopt;
}

ELASTIC_DECL std::optional<std::chrono::milliseconds> watchdog_settings::shortest() const {
    std::optional<std::chrono::milliseconds> out;
    const auto take = [&out](std::chrono::milliseconds d) { out = out ? std::min(*out, d) : d; };
    if (first) take(*first);
    if (beat) take(*beat);
    if (section) take(*section);
    for (const auto& [name, d] : sections) take(d);
    return out;
}

ELASTIC_DECL std::string watchdog_settings::to_string() const {
    std::string out;
    const auto add = [&out](const std::string& item) { out += (out.empty() ? "" : ",") + item; };
    if (first) add("first=" + duration_flag_text(*first));
    if (beat) add("beat=" + duration_flag_text(*beat));
    if (section) add("section=" + duration_flag_text(*section));
    for (const auto& [name, d] : sections) add(detail::format("section:{}={}", name, duration_flag_text(d)));
    if (signal != SIGUSR2) add("signal=" + signal_name(signal));
    if (dump != std::chrono::seconds(5)) add("dump=" + duration_flag_text(dump));
    return out;
}

ELASTIC_DECL std::string detail::agent::demangle_frames(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (;;) {
        const auto at = text.find(" in _Z");
        if (at == std::string_view::npos) break;
        out.append(text.substr(0, at + 4));
        text.remove_prefix(at + 4);
        const auto end = std::min(text.find_first_of("+ \n"), text.size());
        const std::string mangled(text.substr(0, end));
        int status = 0;
        char* readable = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
        out += readable != nullptr && status == 0 ? readable : mangled;
        std::free(readable);
        text.remove_prefix(end);
    }
    out.append(text);
    return out;
}

ELASTIC_DECL detail::agent::watchdog_pages::watchdog_pages(std::size_t workers) {
    std::error_code ec;
    auto base = std::filesystem::path("/dev/shm");
    if (!std::filesystem::is_directory(base, ec) || ::access(base.c_str(), W_OK) != 0) {
        base = std::filesystem::temp_directory_path();
    }
    for (int attempt = 0;; ++attempt) {
        dir_ = base / detail::format("elastic-watchdog-{}-{:08x}", ::getpid(), detail::random_u64() & 0xffffffffu);
        if (std::filesystem::create_directory(dir_, ec)) break;
        if (ec || attempt == 8) {
            throw std::system_error(ec ? ec : std::make_error_code(std::errc::file_exists),
                                    "cannot create " + dir_.string());
        }
    }
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all, ec);
    try {
        for (std::size_t i = 0; i < workers; ++i) fds_.push_back(create_page(page_path(i)));
        std::filesystem::create_directory(dir_ / "python");
        const auto module = dir_ / "python" / "elastic_watchdog.py";
        const int fd = ::open(module.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot create " + module.string());
        const auto n = ::write(fd, python_watchdog_module.data(), python_watchdog_module.size());
        const int error = errno;
        ::close(fd);
        if (n != static_cast<ssize_t>(python_watchdog_module.size())) {
            throw std::system_error(n < 0 ? error : ENOSPC, std::generic_category(), "cannot write " + module.string());
        }
    } catch (...) {
        release();
        throw;
    }
}

ELASTIC_DECL std::optional<detail::watchdog::page_snapshot> detail::agent::watchdog_pages::read(std::size_t i) const {
    detail::watchdog::page a{};
    detail::watchdog::page b{};
    for (int attempt = 0; attempt < 4; ++attempt) {
        if (!read_into(fds_[i], a) || !read_into(fds_[i], b)) return std::nullopt;
        if (a.section_seq == b.section_seq && std::memcmp(a.section, b.section, sizeof a.section) == 0) break;
    }
    auto s = detail::watchdog::read_page(b);
    if (a.section_seq != b.section_seq || std::memcmp(a.section, b.section, sizeof a.section) != 0) s.torn = true;
    return s;
}

ELASTIC_DECL std::filesystem::path detail::agent::watchdog_pages::page_path(std::size_t i) const {
    return dir_ / detail::format("{}.page", i);
}

ELASTIC_DECL std::filesystem::path detail::agent::watchdog_pages::stacks_path(std::size_t i) const {
    return dir_ / detail::format("{}.stacks", i);
}

ELASTIC_DECL void detail::agent::watchdog_pages::tell(std::size_t i, int signal,
                                                      std::map<std::string, std::string, std::less<>>& env) const {
    env[detail::watchdog::file_variable] = page_path(i).string();
    env[detail::watchdog::stacks_variable] = stacks_path(i).string();
    env[detail::watchdog::signal_variable] = detail::format("{}", signal);
    env[detail::watchdog::agent_variable] = detail::format("{}", ::getpid());
    const auto python = (dir_ / "python").string();
    auto& path = env["PYTHONPATH"];
    path = path.empty() ? python : python + ":" + path;
}

ELASTIC_DECL std::string detail::agent::watchdog_pages::stacks(std::size_t i, std::size_t limit) const {
    std::string out;
    // The worker made the file: not a link, and nothing (a FIFO) that could block a read.
    const int fd = ::open(stacks_path(i).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return out;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return out;
    }
    out.resize(limit);
    std::size_t got = 0;
    while (got < limit) {
        const auto n = ::read(fd, out.data() + got, limit - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += static_cast<std::size_t>(n);
    }
    char more = 0;
    const bool cut = got == limit && ::read(fd, &more, 1) == 1;
    ::close(fd);
    out.resize(got);
    if (cut) out += detail::format("\n... (cut at {} KiB)\n", limit / 1024);
    return demangle_frames(out);
}

ELASTIC_DECL long long detail::agent::watchdog_pages::stacks_size(std::size_t i) const {
    std::error_code ec;
    const auto size = std::filesystem::file_size(stacks_path(i), ec);
    return ec ? -1 : static_cast<long long>(size);
}

ELASTIC_DECL int detail::agent::watchdog_pages::create_page(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot create " + path.string());
    alignas(detail::watchdog::page) char bytes[detail::watchdog::page_size] = {};
    detail::watchdog::page header{};
    header.magic = detail::watchdog::page_magic;
    header.version = detail::watchdog::page_version;
    std::memcpy(bytes, &header, sizeof header);
    if (::pwrite(fd, bytes, sizeof bytes, 0) != static_cast<ssize_t>(sizeof bytes)) {
        const int error = errno != 0 ? errno : ENOSPC;
        ::close(fd);
        throw std::system_error(error, std::generic_category(), "cannot write " + path.string());
    }
    return fd;
}

ELASTIC_DECL void detail::agent::watchdog_pages::release() noexcept {
    for (const int fd : fds_) ::close(fd);
    fds_.clear();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

ELASTIC_DECL std::string detail::agent::measured_words(std::chrono::steady_clock::duration d) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
    if (ms < 1000) return duration_words(std::chrono::milliseconds(ms));
    return duration_words(std::chrono::milliseconds(ms / 100 * 100));
}

ELASTIC_DECL void detail::agent::rank_watch::update(const detail::watchdog::page_snapshot& s,
                                                    std::chrono::steady_clock::time_point now) {
    if (s.beats != seen.beats || s.progress != seen.progress || s.section_seq != seen.section_seq) {
        alive = true;
        last_sign = now;
    }
    if (!s.torn && s.section_seq != section_seq) {
        section_seq = s.section_seq;
        section = s.section;
        section_since = now;
    }
    if (s.progress != 0) progress = std::max(progress.value_or(0), s.progress - 1);
    seen = s;
}

ELASTIC_DECL std::optional<hang_report> detail::agent::rank_watch::hung(
    const watchdog_settings& w, std::chrono::steady_clock::time_point started,
    std::chrono::steady_clock::time_point now) const {
    using std::chrono::duration_cast;
    using std::chrono::milliseconds;
    const auto report = [&](std::string reason, std::chrono::steady_clock::duration silent) {
        hang_report r;
        r.reason = std::move(reason);
        r.section = section;
        r.progress = progress;
        r.silent = duration_cast<milliseconds>(silent);
        return r;
    };
    if (!alive) {
        if (w.first && now - started > *w.first) {
            return report(detail::format("no sign of life for {} since it started (--watchdog first={})",
                                         measured_words(now - started), duration_flag_text(*w.first)),
                          now - started);
        }
        return std::nullopt;
    }
    if (!section.empty()) {
        if (const auto limit = w.section_limit(section)) {
            if (now - section_since > limit->first) {
                return report(detail::format("in section \"{}\" for {} (--watchdog {}={})", section,
                                             measured_words(now - section_since), limit->second,
                                             duration_flag_text(limit->first)),
                              now - section_since);
            }
            return std::nullopt;
        }
    }
    if (w.beat && now - last_sign > *w.beat) {
        return report(detail::format("no heartbeat for {} (--watchdog beat={})", measured_words(now - last_sign),
                                     duration_flag_text(*w.beat)),
                      now - last_sign);
    }
    return std::nullopt;
}

ELASTIC_DECL std::chrono::milliseconds detail::agent::watchdog_interval(const watchdog_settings& w) {
    const auto shortest = w.shortest().value_or(std::chrono::seconds(10));
    return std::clamp<std::chrono::milliseconds>(shortest / 10, std::chrono::milliseconds(10), std::chrono::seconds(1));
}

[[nodiscard]] ELASTIC_DECL watchdog_settings parse_watchdog(std::string_view text, std::string_view name) {
    watchdog_settings w;
    const auto bad = [&](std::string_view item, const std::string& why) {
        return usage_error(detail::format("{}={}: '{}' {} (want KEY=VALUE items: first=5min, beat=30s, section=10min, "
                                          "section:NAME=1h, signal=SIGUSR2, dump=5s)",
                                          name, text, item, why));
    };
    std::string_view rest = text;
    bool any = false;
    while (!rest.empty() || !any) {
        const auto comma = rest.find(',');
        const auto item = detail::trim(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
        any = true;
        if (item.empty()) throw bad(item, "is empty");
        const auto eq = item.find('=');
        if (eq == std::string_view::npos) throw bad(item, "has no '='");
        const auto key = detail::trim(item.substr(0, eq));
        const auto value = detail::trim(item.substr(eq + 1));
        const auto duration = [&] {
            try {
                return parse_duration(value, detail::format("{} {}", name, key), key == "dump");
            } catch (const usage_error& e) {
                throw bad(item, detail::format("is not a duration ({})", e.what()));
            }
        };
        if (key == "first") {
            w.first = duration();
        } else if (key == "beat") {
            w.beat = duration();
        } else if (key == "section") {
            w.section = duration();
        } else if (key.rfind("section:", 0) == 0) {
            const auto section = key.substr(8);
            if (section.empty() || section.size() >= detail::watchdog::section_capacity) {
                throw bad(item, detail::format("names no section, or one longer than {} bytes",
                                               detail::watchdog::section_capacity - 1));
            }
            w.sections[std::string(section)] = duration();
        } else if (key == "signal") {
            std::string word(value);
            for (auto& c : word) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
            if (word.rfind("SIG", 0) != 0) word = "SIG" + word;
            const int number = signal_number(word);
            // One with no other meaning: not a stop signal, not one the kernel or a terminal sends.
            if (number != SIGUSR1 && number != SIGUSR2 && !(number >= SIGRTMIN && number <= SIGRTMAX)) {
                throw bad(item, "is not a signal for stacks: want SIGUSR1, SIGUSR2 or a real-time signal "
                                "(SIGRTMIN+N)");
            }
            w.signal = number;
        } else if (key == "dump") {
            w.dump = duration();
        } else {
            throw bad(item, detail::format("has an unknown key '{}'", key));
        }
    }
    if (!w.enabled()) throw bad(text, "sets no limit (give first=, beat=, section= or section:NAME=)");
    return w;
}

}  // namespace elastic::inline v0

#endif
