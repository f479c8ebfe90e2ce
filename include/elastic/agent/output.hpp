// The agent's copy of a worker's stderr: read from a pipe as chunks arrive, fed to the report's
// stderr_tail, and written through to the agent's stderr one whole line at a time.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/report/stderr_tail.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <array>
#include <cerrno>
#include <cstddef>
#include <string>
#include <string_view>

#include <unistd.h>

namespace elastic::inline v0 {

namespace detail::agent {

/// Writes all of `text` to `fd`, retrying short writes and EINTR; gives up silently on other
/// errors (a closed terminal must not stop the supervision of the workers).
inline void write_all(int fd, std::string_view text) noexcept {
    while (!text.empty()) {
        const ssize_t n = ::write(fd, text.data(), text.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            return;
        }
        text.remove_prefix(static_cast<std::size_t>(n));
    }
}

}  // namespace detail::agent

/// Line-buffered pass-through of one stream (docs/failure-report.md, "The worker's stderr"):
/// each complete line (ended by `\n`, or `\r` for progress bars) is written in the same write(2)
/// as the other complete lines of its chunk; a partial line waits for its end, for
/// `max_line_bytes`, or for end of file. The agent is the only writer of every worker's copied
/// stream, so lines of different workers never interleave inside a line.
class line_relay {
public:
    explicit line_relay(int out_fd, std::size_t max_line_bytes = stderr_tail::default_max_line_bytes)
        : out_fd_(out_fd), max_line_bytes_(max_line_bytes) {}

    /// The next chunk of the stream.
    void feed(std::string_view chunk) {
        pending_.append(chunk);
        const auto end = pending_.find_last_of("\n\r");
        if (end != std::string::npos) {
            detail::agent::write_all(out_fd_, std::string_view(pending_).substr(0, end + 1));
            pending_.erase(0, end + 1);
        }
        if (pending_.size() >= max_line_bytes_) {
            flush();
        }
    }

    /// Writes what is left (the stream ended mid-line).
    void flush() {
        if (!pending_.empty()) {
            detail::agent::write_all(out_fd_, pending_);
            pending_.clear();
        }
    }

private:
    int out_fd_;
    std::size_t max_line_bytes_;
    std::string pending_;
};

/// Reads `pipe` until end of file (or until it is closed or the read is cancelled), feeding
/// every chunk to `tail` and to a line_relay on `out_fd` (-1: no copy). Always has a read pending,
/// so a worker never blocks on a full pipe while the agent is idle.
inline asio::awaitable<void> relay_stream(asio::posix::stream_descriptor& pipe, stderr_tail& tail, int out_fd) {
    line_relay relay(out_fd < 0 ? 2 : out_fd);
    std::array<char, 16384> buffer{};
    for (;;) {
        const auto [ec, n] =
            co_await pipe.async_read_some(asio::buffer(buffer), asio::experimental::as_tuple(asio::use_awaitable));
        if (n > 0) {
            const std::string_view chunk(buffer.data(), n);
            tail.feed(chunk);
            if (out_fd >= 0) relay.feed(chunk);
        }
        if (ec) break;
    }
    if (out_fd >= 0) relay.flush();
}

/// Counts running tasks and lets one coroutine await the moment none is left (an event: the
/// last `done()` cancels the timer the waiter sleeps on; nothing polls). Used once.
class task_latch {
public:
    explicit task_latch(const asio::any_io_executor& executor) : timer_(executor) {
        timer_.expires_at(asio::steady_timer::time_point::max());
    }
    void add() noexcept { ++count_; }
    void done() noexcept {
        if (--count_ == 0) timer_.cancel();
    }
    [[nodiscard]] std::size_t count() const noexcept { return count_; }

    /// Returns once count() is 0, or when the await is cancelled. One use: the latch of one
    /// attempt's streams.
    asio::awaitable<void> wait() {
        if (count_ == 0) co_return;
        co_await timer_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    }

private:
    asio::steady_timer timer_;
    std::size_t count_ = 0;
};

}  // namespace elastic::inline v0
