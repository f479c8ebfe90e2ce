// SPDX-License-Identifier: MIT
// torch's file timer, served by the agent (TORCHELASTIC_ENABLE_FILE_TIMER=1): workers that use
// torch.distributed.elastic.timer.FileTimerClient write one JSON line per request into a FIFO
// (TORCHELASTIC_TIMER_FILE); the agent keeps the timers and sends a worker the signal it asked
// for when one of its scopes expires. The requests are checked (a line that is not a request, a
// pid that is not one of this node's workers, a table grown past its bound is reported and
// ignored) and deadlines run on the steady clock from the moment a request arrives.
#pragma once

#include "elastic/agent/agent_log.hpp"
#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/detail/random.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/error.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/this_coro.hpp>
#include <asio/steady_timer.hpp>
#include <asio/system_error.hpp>

#include "elastic/detail/format.hpp"

#include <array>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace elastic::inline v0 {

/// One request of torch's FileTimerClient, one JSON line in the FIFO:
/// {"version": 1, "pid": 4242, "scope_id": "train.py#31", "expiration_time": 1.7e9, "signal": 9}.
struct file_timer_request {
    long pid = 0;
    std::string scope;
    /// Seconds since the epoch (time.time()); negative: the scope is released.
    double expiration_time = 0;
    /// The signal to send when it expires; 0 or less: none (the expiry is only reported).
    int signal = 0;
};

/// Reads one request line (without its newline): the request, or what is wrong with it.
[[nodiscard]] ELASTIC_DECL std::variant<file_timer_request, std::string> parse_file_timer_request(
    std::string_view line);

/// Who sent a request, as the agent knows its workers.
enum class file_timer_sender {
    worker,        ///< a running worker, or a process of its process group
    ended_worker,  ///< a worker that has ended (it wrote before its exit, the agent read after)
    stranger,      ///< none of this node's workers
};

/// A scope that expired, and the signal it asked for (0: none).
struct file_timer_expiry {
    long pid = 0;
    std::string scope;
    int signal = 0;
    /// From the request's arrival to its expiry.
    std::chrono::milliseconds after{};
};

namespace detail::agent {

/// The timers, keyed by (pid, scope) as torch keys them. Deadlines are steady: a request's
/// expiration_time becomes "now + what was left" when it arrives, so a later jump of the wall
/// clock neither fires nor delays it.
class file_timer_table {
public:
    using clock = std::chrono::steady_clock;
    static constexpr std::size_t max_timers = 16384;
    static constexpr std::size_t max_per_pid = 1024;

    /// Sets or releases a timer; the reason when it is refused (the table is full).
    ELASTIC_DECL std::optional<std::string> apply(const file_timer_request& r, clock::time_point now,
                                                  std::chrono::system_clock::time_point wall_now);

    /// The earliest deadline, if any.
    [[nodiscard]] ELASTIC_DECL std::optional<clock::time_point> next() const;

    /// What expired by `now`. A pid with an expired scope that asks for a signal: its earliest
    /// such scope, and the pid loses all its timers (torch clears a reaped worker's). Else each
    /// expired scope of the pid (signal 0) is reported and removed, and its other timers stay
    /// (torch drops them too, though it sends nothing).
    ELASTIC_DECL std::vector<file_timer_expiry> expire(clock::time_point now);

    /// Drops the timers of every pid `keep` refuses (workers of an earlier attempt).
    ELASTIC_DECL void retain(const std::function<bool(long)>& keep);

    [[nodiscard]] std::size_t size() const noexcept { return timers_.size(); }

private:
    struct entry {
        clock::time_point deadline;
        clock::time_point arrived;
        int signal = 0;
    };
    std::map<std::pair<long, std::string>, entry, std::less<>> timers_;
};

/// Splits the FIFO's bytes into lines. A line longer than max_line (PIPE_BUF: a client's write
/// is atomic up to it, so longer ones may interleave with other clients') is cut there and
/// flagged, and the rest of it skipped to the next newline: memory stays bounded.
class fifo_lines {
public:
    static constexpr std::size_t max_line = 4096;
    struct line {
        std::string text;
        bool overlong = false;
    };
    [[nodiscard]] ELASTIC_DECL std::vector<line> add(std::string_view bytes);

private:
    std::string partial_;
    bool skipping_ = false;
};

/// The FIFO made and opened for reading (non-blocking), and a writer held on it.
struct opened_fifo {
    int reader = -1;
    int writer = -1;
    std::filesystem::path path;
    unsigned long long inode = 0;
    unsigned long long device = 0;
};

/// Makes and opens the FIFO (see basic_file_timer_server); throws std::system_error.
[[nodiscard]] ELASTIC_DECL opened_fifo open_timer_fifo(const std::filesystem::path& path);

/// Closes the writer and removes the FIFO, if it is still the one made (same inode).
ELASTIC_DECL void close_timer_fifo(const opened_fifo& fifo) noexcept;

/// At most 120 bytes of a client's text, bytes outside printable ASCII as \xNN.
[[nodiscard]] ELASTIC_DECL std::string quoted_excerpt(std::string_view text);

}  // namespace detail::agent

/// The FIFO and the timers behind it. It lives as long as the agent (a client whose FIFO has no
/// reader fails its request), while serve() runs during each attempt's supervision.
template <class Defer = void>
class basic_file_timer_server {
public:
    /// Makes the FIFO (mode 0600) at `path`, or, when empty, at a fresh
    /// `<temporary directory>/watchdog_timer_<random>` (torchrun's name), and opens it. An
    /// existing FIFO of this user at `path` (a stale one) is replaced; anything else there is
    /// refused. Throws std::system_error naming the path.
    basic_file_timer_server(asio::any_io_executor executor, const std::filesystem::path& path)
        : fifo_(executor), timer_(executor) {
        made_ = detail::agent::open_timer_fifo(path);
        try {
            fifo_.assign(made_.reader);
        } catch (...) {
            ::close(made_.reader);
            detail::agent::close_timer_fifo(made_);
            throw;
        }
    }
    ~basic_file_timer_server() {
        asio::error_code ignored;
        fifo_.close(ignored);
        detail::agent::close_timer_fifo(made_);
    }
    basic_file_timer_server(const basic_file_timer_server&) = delete;
    basic_file_timer_server& operator=(const basic_file_timer_server&) = delete;

    /// The FIFO the workers are told (TORCHELASTIC_TIMER_FILE).
    [[nodiscard]] const std::filesystem::path& path() const noexcept { return made_.path; }
    /// The timers kept now.
    [[nodiscard]] std::size_t timers() const noexcept { return table_.size(); }

    /// Reads requests and fires expiries until cancelled, for one attempt's workers: the timers
    /// of earlier attempts are dropped. `sender(pid)`: who sent a request; only a running
    /// worker's (or its process group's) is kept, an ended worker's is ignored quietly, any other
    /// is reported and ignored; a release is always applied. `expired(e)`: a scope expired (the
    /// caller sends the signal). Returns only when the FIFO cannot be read, or expiries cannot be
    /// handled, with why.
    asio::awaitable<std::string> serve(std::function<file_timer_sender(long)> sender,
                                       std::function<void(const file_timer_expiry&)> expired, const agent_log& log) {
        using namespace asio::experimental::awaitable_operators;
        table_ = {};
        armed_.reset();
        reports_ = 0;
        sender_ = std::move(sender);
        expired_ = std::move(expired);
        log_ = &log;
        const auto ended = co_await (read_requests() || fire_expiries());
        co_return ended.index() == 0 ? std::get<0>(ended) : std::get<1>(ended);
    }

private:
    asio::awaitable<std::string> read_requests() {
        std::array<char, 4096> chunk{};
        for (;;) {
            const auto [ec, n] = co_await fifo_.async_read_some(asio::buffer(chunk), detail::as_tuple_awaitable<Defer>);
            // Aborted: the serve was cancelled (its watch() ended), not a fault of the FIFO.
            if (ec == asio::error::operation_aborted) throw asio::system_error(ec);
            if (ec) co_return detail::format("cannot read {}: {}", made_.path.string(), ec.message());
            for (const auto& line : lines_.add(std::string_view(chunk.data(), n))) take(line);
            // Woken only when the earliest deadline came nearer (a flood of far-off timers costs
            // no wake-ups).
            if (const auto next = table_.next(); next && (!armed_ || *next < *armed_)) timer_.cancel();
        }
    }

    /// Returns only when an expiry could not be handled, with why.
    asio::awaitable<std::string> fire_expiries() {
        for (;;) {
            armed_ = table_.next();
            timer_.expires_at(armed_.value_or(std::chrono::steady_clock::time_point::max()));
            const auto [ec] = co_await timer_.async_wait(detail::as_tuple_awaitable<Defer>);
            if (ec == asio::error::operation_aborted) {
                const asio::cancellation_state state = co_await asio::this_coro::cancellation_state;
                // The serve ends; a cancel() of our own only re-arms.
                if (state.cancelled() != asio::cancellation_type::none) throw asio::system_error(ec);
            }
            try {
                for (const auto& e : table_.expire(std::chrono::steady_clock::now())) expired_(e);
            } catch (const std::exception& e) {
                co_return detail::format("an expiry could not be handled: {}", e.what());
            }
        }
    }

    void take(const detail::agent::fifo_lines::line& line) {
        if (line.overlong) {
            report(detail::format("a request longer than {} bytes (FileTimerClient writes at most PIPE_BUF): {}",
                                  detail::agent::fifo_lines::max_line, detail::agent::quoted_excerpt(line.text)));
            return;
        }
        auto parsed = parse_file_timer_request(line.text);
        if (const auto* why = std::get_if<std::string>(&parsed)) {
            report(*why);
            return;
        }
        const auto& r = std::get<file_timer_request>(parsed);
        if (r.expiration_time < 0) {
            // A release can only remove a timer: applied whoever sent it (a worker that released
            // its scope and exited before the agent read the FIFO, typically).
            (void)table_.apply(r, std::chrono::steady_clock::now(), std::chrono::system_clock::now());
            return;
        }
        if (const auto who = sender_(r.pid); who != file_timer_sender::worker) {
            if (who == file_timer_sender::ended_worker || known_.count(r.pid) != 0) {
                log_->debug(detail::format("torch file timer {}: ignored scope '{}' of pid {}, a worker no longer "
                                           "running",
                                           made_.path.string(), detail::agent::quoted_excerpt(r.scope), r.pid));
            } else {
                report(detail::format("a request for pid {} (scope '{}'), which is none of this node's workers nor "
                                      "in a worker's process group",
                                      r.pid, detail::agent::quoted_excerpt(r.scope)));
            }
            return;
        }
        if (known_.size() < 65536) known_.insert(r.pid);
        if (const auto refused = table_.apply(r, std::chrono::steady_clock::now(), std::chrono::system_clock::now())) {
            report(*refused);
        }
    }

    /// The first reports are logged; past that they are counted, not logged (a flooding client
    /// must not flood the agent's log).
    void report(const std::string& what) {
        ++reports_;
        if (reports_ <= 20) {
            log_->warning(detail::format("torch file timer {}: ignored {}{}", made_.path.string(), what,
                                         reports_ == 20 ? " (further ignored requests are not logged)" : ""));
        }
    }

    asio::posix::stream_descriptor fifo_;
    asio::steady_timer timer_;
    detail::agent::opened_fifo made_;  ///< its writer is held so the reader never sees end of file
    detail::agent::fifo_lines lines_;
    detail::agent::file_timer_table table_;
    std::optional<std::chrono::steady_clock::time_point> armed_;  ///< the deadline the timer waits for
    std::set<long> known_;  ///< pids whose requests were accepted (bounded): later ones are not news
    std::function<file_timer_sender(long)> sender_;
    std::function<void(const file_timer_expiry&)> expired_;
    const agent_log* log_ = nullptr;
    std::size_t reports_ = 0;
};

using file_timer_server = basic_file_timer_server<>;

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace elastic::inline v0 {

ELASTIC_DECL std::variant<file_timer_request, std::string> parse_file_timer_request(std::string_view line) {
    const auto bad = [line](std::string_view why) {
        return detail::format("a request that {}: {}", why, detail::agent::quoted_excerpt(line));
    };
    const auto json = nlohmann::json::parse(line, nullptr, false);
    if (json.is_discarded() || !json.is_object()) return bad("is not a JSON object");
    const auto field = [&json](const char* name) -> const nlohmann::json* {
        const auto it = json.find(name);
        return it == json.end() ? nullptr : &*it;
    };
    const auto* pid = field("pid");
    const auto* scope = field("scope_id");
    const auto* expiration = field("expiration_time");
    const auto* signal = field("signal");
    if (pid == nullptr || scope == nullptr || expiration == nullptr || signal == nullptr) {
        return bad("lacks one of pid, scope_id, expiration_time and signal");
    }
    file_timer_request r;
    if (!pid->is_number_integer() || pid->get<long long>() <= 0 || pid->get<long long>() > 0x3fffffff) {
        return bad("has no process id in pid");
    }
    r.pid = static_cast<long>(pid->get<long long>());
    if (!scope->is_string()) return bad("has a scope_id that is not a string");
    r.scope = scope->get<std::string>();
    if (!expiration->is_number() || !std::isfinite(expiration->get<double>())) {
        return bad("has an expiration_time that is not a number of seconds");
    }
    r.expiration_time = expiration->get<double>();
    if (!signal->is_number_integer() || signal->get<long long>() > SIGRTMAX) {
        return bad(detail::format("has a signal that is not a signal number (at most {})", SIGRTMAX));
    }
    r.signal = static_cast<int>(std::max<long long>(signal->get<long long>(), 0));
    return r;
}

ELASTIC_DECL std::optional<std::string> detail::agent::file_timer_table::apply(
    const file_timer_request& r, clock::time_point now, std::chrono::system_clock::time_point wall_now) {
    auto key = std::make_pair(r.pid, r.scope);
    if (r.expiration_time < 0) {
        timers_.erase(key);
        return std::nullopt;
    }
    const auto it = timers_.find(key);
    if (it == timers_.end()) {
        if (timers_.size() >= max_timers) {
            return detail::format("scope '{}' of pid {}: {} timers are kept already (the most this agent keeps)",
                                  quoted_excerpt(r.scope), r.pid, max_timers);
        }
        const auto first = timers_.lower_bound(std::make_pair(r.pid, std::string()));
        std::size_t of_pid = 0;
        for (auto i = first; i != timers_.end() && i->first.first == r.pid && of_pid < max_per_pid; ++i) ++of_pid;
        if (of_pid >= max_per_pid) {
            return detail::format("scope '{}' of pid {}: that pid holds {} timers already (the most one process may)",
                                  quoted_excerpt(r.scope), r.pid, max_per_pid);
        }
    }
    // What was left when it arrived, capped at a year (a far-off deadline must not overflow).
    const double wall = std::chrono::duration<double>(wall_now.time_since_epoch()).count();
    const double left = std::clamp(r.expiration_time - wall, 0.0, 365.0 * 86400.0);
    entry e;
    e.arrived = now;
    e.deadline = now + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(left));
    e.signal = r.signal;
    timers_.insert_or_assign(std::move(key), e);
    return std::nullopt;
}

ELASTIC_DECL std::optional<std::chrono::steady_clock::time_point> detail::agent::file_timer_table::next() const {
    std::optional<clock::time_point> out;
    for (const auto& [key, e] : timers_) out = out ? std::min(*out, e.deadline) : e.deadline;
    return out;
}

ELASTIC_DECL std::vector<file_timer_expiry> detail::agent::file_timer_table::expire(clock::time_point now) {
    std::vector<file_timer_expiry> out;
    auto it = timers_.begin();
    while (it != timers_.end()) {
        const long pid = it->first.first;
        auto end = it;
        const decltype(it) none = timers_.end();
        auto chosen = none;  // the earliest expired with a signal, else the earliest expired
        for (; end != timers_.end() && end->first.first == pid; ++end) {
            const auto& e = end->second;
            if (e.deadline > now) continue;
            const bool better = chosen == none || (e.signal > 0 && chosen->second.signal <= 0) ||
                                ((e.signal > 0) == (chosen->second.signal > 0) && e.deadline < chosen->second.deadline);
            if (better) chosen = end;
        }
        if (chosen == none) {
            it = end;
            continue;
        }
        const auto report = [&out, pid](const auto& timer) {
            file_timer_expiry x;
            x.pid = pid;
            x.scope = timer.first;
            x.signal = timer.second.signal;
            x.after = std::chrono::duration_cast<std::chrono::milliseconds>(timer.second.deadline -
                                                                            timer.second.arrived);
            out.push_back(std::move(x));
        };
        const bool reaped = chosen->second.signal > 0;
        if (reaped) report(std::make_pair(chosen->first.second, chosen->second));
        while (it != end) {
            if (reaped || it->second.deadline <= now) {
                if (!reaped) report(std::make_pair(it->first.second, it->second));
                it = timers_.erase(it);
            } else {
                ++it;
            }
        }
    }
    return out;
}

ELASTIC_DECL void detail::agent::file_timer_table::retain(const std::function<bool(long)>& keep) {
    std::erase_if(timers_, [&keep](const auto& kv) { return !keep(kv.first.first); });
}

ELASTIC_DECL std::vector<detail::agent::fifo_lines::line> detail::agent::fifo_lines::add(std::string_view bytes) {
    std::vector<line> out;
    while (!bytes.empty()) {
        const auto nl = bytes.find('\n');
        const auto piece = bytes.substr(0, nl);
        if (!skipping_) {
            const auto room = max_line - partial_.size();
            partial_.append(piece.substr(0, room));
            if (piece.size() > room) {
                out.push_back({std::move(partial_), true});
                partial_.clear();
                skipping_ = true;
            }
        }
        if (nl == std::string_view::npos) break;
        if (!skipping_ && !partial_.empty()) out.push_back({std::move(partial_), false});
        partial_.clear();
        skipping_ = false;
        bytes.remove_prefix(nl + 1);
    }
    return out;
}

ELASTIC_DECL detail::agent::opened_fifo detail::agent::open_timer_fifo(const std::filesystem::path& path) {
    const auto fail = [](int error, const std::string& what) {
        throw std::system_error(error, std::generic_category(), what);
    };
    opened_fifo f;
    if (path.empty()) {
        const auto dir = std::filesystem::temp_directory_path();
        for (int attempt = 0;; ++attempt) {
            f.path = dir / detail::format("watchdog_timer_{:016x}", detail::random_u64());
            if (::mkfifo(f.path.c_str(), 0600) == 0) break;
            if (errno != EEXIST || attempt == 8) fail(errno, "cannot make the FIFO " + f.path.string());
        }
    } else {
        f.path = path;
        struct stat st {};
        if (::lstat(path.c_str(), &st) == 0) {
            if (!S_ISFIFO(st.st_mode) || st.st_uid != ::geteuid()) {
                fail(EEXIST, detail::format("{} exists and is not a FIFO of this user; remove it, or name another "
                                            "path in TORCHELASTIC_TIMER_FILE",
                                            path.string()));
            }
            // A FIFO someone reads is another agent's, live: taking it would end that agent's timers.
            if (const int probe = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW); probe >= 0) {
                ::close(probe);
                fail(EBUSY, detail::format("{} is the FIFO of another agent that serves it now; give each agent its "
                                           "own TORCHELASTIC_TIMER_FILE",
                                           path.string()));
            }
            ::unlink(path.c_str());  // a stale FIFO, as torchrun replaces it
        }
        if (::mkfifo(path.c_str(), 0600) != 0) fail(errno, "cannot make the FIFO " + path.string());
    }
    f.reader = ::open(f.path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
    struct stat st {};
    if (f.reader < 0 || ::fstat(f.reader, &st) != 0 || !S_ISFIFO(st.st_mode) || st.st_uid != ::geteuid()) {
        const int error = f.reader < 0 ? errno : EINVAL;
        if (f.reader >= 0) ::close(f.reader);
        ::unlink(f.path.c_str());
        fail(error, "cannot open the FIFO " + f.path.string());
    }
    f.inode = static_cast<unsigned long long>(st.st_ino);
    f.device = static_cast<unsigned long long>(st.st_dev);
    f.writer = ::open(f.path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
    if (f.writer < 0) {
        const int error = errno;
        ::close(f.reader);
        ::unlink(f.path.c_str());
        fail(error, "cannot open the FIFO " + f.path.string() + " for writing");
    }
    return f;
}

ELASTIC_DECL void detail::agent::close_timer_fifo(const opened_fifo& fifo) noexcept {
    if (fifo.writer >= 0) ::close(fifo.writer);
    struct stat st {};
    if (!fifo.path.empty() && ::lstat(fifo.path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode) &&
        static_cast<unsigned long long>(st.st_ino) == fifo.inode &&
        static_cast<unsigned long long>(st.st_dev) == fifo.device) {
        ::unlink(fifo.path.c_str());
    }
}

ELASTIC_DECL std::string detail::agent::quoted_excerpt(std::string_view text) {
    std::string out;
    for (const char c : text.substr(0, 120)) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u < 0x7f) {
            out += c;
        } else {
            out += detail::format("\\x{:02x}", u);
        }
    }
    if (text.size() > 120) out += "...";
    return out;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
