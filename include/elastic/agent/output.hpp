// SPDX-License-Identifier: MIT
// The agent's copies of a worker's streams: read from a pipe as chunks arrive, fed to the report's
// stderr_tail, written byte for byte to a log file, and to the console one whole line at a time,
// each line after the rank's prefix when asked.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/report/stderr_tail.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <poll.h>
#include <unistd.h>

namespace elastic::inline v0 {

namespace detail::agent {

/// What write_all could not write: the bytes left and the errno that stopped it (0 and 0: all
/// of it written).
struct write_shortfall {
    std::size_t unwritten = 0;
    int error = 0;
};

/// Writes all of `text` to `fd`, retrying short writes and EINTR, and waiting (poll) when the
/// descriptor is non-blocking and full, so nothing is lost; stops at any other error and says
/// what was left (a closed terminal must not stop the supervision of the workers, and a full
/// disk is the caller's to report).
inline write_shortfall write_all(int fd, std::string_view text) noexcept {
    while (!text.empty()) {
        const ssize_t n = ::write(fd, text.data(), text.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                pollfd p{fd, POLLOUT, 0};
                if (::poll(&p, 1, -1) < 0 && errno != EINTR) return {text.size(), errno};
                continue;
            }
            return {text.size(), errno};
        }
        text.remove_prefix(static_cast<std::size_t>(n));
    }
    return {};
}

}  // namespace detail::agent

/// The writes to one log file: what could not be written, and why (docs/logs.md, "When a log
/// file cannot be written"). The relay goes on writing after a failure (space may come back) and
/// counts each byte it could not write.
struct log_file_writes {
    std::string name;              ///< for messages: "local_rank 1's stdout log file /path"
    std::uint64_t lost_bytes = 0;  ///< bytes of the stream that are not in the file
    int first_error = 0;           ///< errno of the first failed write; 0: none failed
    std::function<void(const log_file_writes&)> first_failure;  ///< called once, at the first

    void lost(const detail::agent::write_shortfall& w) {
        if (w.unwritten == 0) return;
        lost_bytes += w.unwritten;
        if (first_error != 0) return;
        first_error = w.error != 0 ? w.error : EIO;
        if (first_failure) first_failure(*this);
    }
};

/// Line-buffered copy of one stream to a shared descriptor (the agent's stdout or stderr;
/// docs/logs.md, "The console"). Every complete line — ended by `\n`, `\r\n`, or a lone `\r`
/// (a progress bar redrawing itself) — is written after `prefix` (may be empty), and all the
/// complete lines of a chunk go out in one write(2). A partial line waits for its end; a line
/// longer than `max_line_bytes` is cut into pieces of that size, each ended with `\n`; at the
/// end of the stream a partial last line is written, ended with `\n`. The agent is the only writer
/// of every copied stream, so lines of different workers never interleave inside a line.
class line_relay {
public:
    /// 64 KiB: any line a person reads fits whole; a megabyte without a newline is cut.
    static constexpr std::size_t default_max_line_bytes = 64 * 1024;

    explicit line_relay(int out_fd, std::string prefix = {}, std::size_t max_line_bytes = default_max_line_bytes)
        : out_fd_(out_fd), prefix_(std::move(prefix)), max_line_bytes_(max_line_bytes == 0 ? 1 : max_line_bytes) {}

    /// Copy only the lines (or pieces of a cut line) that contain one of `filters`; none: every
    /// line (the default).
    void only_lines_with(std::vector<std::string> filters) { filters_ = std::move(filters); }
    /// Tell `writes` of every byte the descriptor did not take (a log file's; the console's are
    /// not counted). Must outlive the relay.
    void report_to(log_file_writes* writes) noexcept { writes_ = writes; }

    /// The next chunk of the stream.
    void feed(std::string_view chunk) {
        pending_.append(chunk);
        std::size_t start = 0;
        for (;;) {
            const auto at = pending_.find_first_of("\n\r", start);
            if (at == std::string::npos) break;
            std::size_t end = at + 1;
            if (pending_[at] == '\r') {
                if (end == pending_.size()) break;  // "\r\n" split across chunks: wait for the next byte
                if (pending_[end] == '\n') ++end;
            }
            add(std::string_view(pending_).substr(start, end - start), {});
            start = end;
        }
        while (pending_.size() - start >= max_line_bytes_) {
            add(std::string_view(pending_).substr(start, max_line_bytes_), "\n");
            start += max_line_bytes_;
        }
        pending_.erase(0, start);
        write_out();
    }

    /// Writes what is left (the stream ended mid-line), ended with `\n`.
    void flush() {
        if (pending_.empty()) return;
        add(pending_, "\n");
        pending_.clear();
        write_out();
    }

    [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }

private:
    /// One line (with its end, or `end` after it) into the pending write, if it passes the filters.
    void add(std::string_view line, std::string_view end) {
        if (!filters_.empty() && std::none_of(filters_.begin(), filters_.end(), [&](const std::string& f) {
                return line.find(f) != std::string_view::npos;
            })) {
            return;
        }
        out_ += prefix_;
        out_ += line;
        out_ += end;
    }

    void write_out() {
        if (out_.empty()) return;
        const auto shortfall = detail::agent::write_all(out_fd_, out_);
        if (writes_ != nullptr) writes_->lost(shortfall);
        out_.clear();
    }

    int out_fd_;
    std::string prefix_;
    std::size_t max_line_bytes_;
    std::vector<std::string> filters_;
    log_file_writes* writes_ = nullptr;
    std::string pending_;
    std::string out_;
};

/// Where the bytes of one worker stream are copied (any subset).
struct stream_copies {
    stderr_tail* tail = nullptr;             ///< fed every byte: the failure report's tail (stderr only)
    int file_fd = -1;                        ///< every byte as written: the stream's log file
    log_file_writes* file_writes = nullptr;  ///< told of every byte the file did not take
    int console_fd = -1;                     ///< whole lines after `prefix`: the agent's stdout or stderr
    std::string prefix;                      ///< the rank's console prefix; empty for a raw copy
    detail::task_latch* progress = nullptr;  ///< told of every chunk (detail::task_latch::progressed)
    /// The lines that contain one of `filters`, after `filtered_prefix`: the attempt's
    /// filtered_stdout.log or filtered_stderr.log, shared by the ranks (-1: no copy).
    int filtered_fd = -1;
    std::vector<std::string> filters;
    std::string filtered_prefix;
    log_file_writes* filtered_writes = nullptr;  ///< told of every byte that file did not take
};

/// Reads `pipe` until end of file (or until it is closed or the read is cancelled) and copies
/// every chunk as `copies` says. Always has a read pending, so a worker never blocks on a full
/// pipe while the agent is idle; writes to the file and the console are plain blocking writes,
/// so a slow console slows the worker (its pipe fills) and nothing is dropped.
template <class Defer = void>
asio::awaitable<void> relay_stream(asio::posix::stream_descriptor& pipe, stream_copies copies) {
    std::unique_ptr<line_relay> console;
    if (copies.console_fd >= 0) console = std::make_unique<line_relay>(copies.console_fd, std::move(copies.prefix));
    std::unique_ptr<line_relay> filtered;
    if (copies.filtered_fd >= 0 && !copies.filters.empty()) {
        filtered = std::make_unique<line_relay>(copies.filtered_fd, std::move(copies.filtered_prefix));
        filtered->only_lines_with(std::move(copies.filters));
        filtered->report_to(copies.filtered_writes);
    }
    // 64 KiB: a full pipe's worth in one read.
    auto buffer = std::make_unique<char[]>(65536);
    for (;;) {
        const auto [ec, n] = co_await pipe.async_read_some(asio::buffer(buffer.get(), 65536),
                                                           detail::as_tuple_awaitable<Defer>);
        if (n > 0) {
            const std::string_view chunk(buffer.get(), n);
            if (copies.tail != nullptr) copies.tail->feed(chunk);
            if (copies.file_fd >= 0) {
                const auto shortfall = detail::agent::write_all(copies.file_fd, chunk);
                if (copies.file_writes != nullptr) copies.file_writes->lost(shortfall);
            }
            if (console) console->feed(chunk);
            if (filtered) filtered->feed(chunk);
            if (copies.progress != nullptr) copies.progress->progressed();
        }
        if (ec) break;
    }
    if (console) console->flush();
    if (filtered) filtered->flush();
}

/// The stderr relay of before the log tree: `tail` fed, whole lines copied raw to `out_fd` (-1:
/// no copy).
template <class Defer = void>
asio::awaitable<void> relay_stream(asio::posix::stream_descriptor& pipe, stderr_tail& tail, int out_fd) {
    stream_copies copies;
    copies.tail = &tail;
    copies.console_fd = out_fd;
    co_await relay_stream(pipe, std::move(copies));
}

}  // namespace elastic::inline v0
