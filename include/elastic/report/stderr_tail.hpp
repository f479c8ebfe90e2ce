// SPDX-License-Identifier: MIT
// stderr_tail: the last lines a worker wrote to stderr, kept in a bounded ring for its failure
// report.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/report/text.hpp"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace elastic::inline v0 {

/// What a stderr_tail holds at one moment: the last lines, already valid UTF-8.
struct stderr_tail_snapshot {
    /// The last lines, oldest first, without their line terminators. A final unterminated line
    /// (the worker died mid-line) is included.
    std::vector<std::string> lines;
    /// Every line seen, including those the ring dropped (so a report can say "last 20 of 5000").
    std::uint64_t total_lines = 0;
    /// Every byte fed.
    std::uint64_t total_bytes = 0;

    bool empty() const noexcept { return lines.empty(); }
};

/// The last `max_lines` lines of a byte stream fed in arbitrary chunks (as they come off the
/// worker's stderr pipe: partial lines, several lines, any bytes).
///
/// Bounded memory whatever the worker writes: at most `max_lines` lines of at most
/// `max_line_bytes` bytes each are kept. A longer line keeps its beginning (where messages put
/// what matters) and ends in a marker saying how many bytes were cut. Lines end at "\n" or
/// "\r\n"; a lone "\r" (a progress bar redrawing itself) starts the line over, as a terminal
/// would show it. Bytes that are not well-formed UTF-8 become U+FFFD when a line is completed, so
/// every line can go into JSON. Not thread-safe: one reader (the agent's pipe coroutine) feeds it.
class stderr_tail {
public:
    /// 20 lines: enough for a C++ "terminate called ... what():" pair, a glog FATAL block or a
    /// short Python traceback, small enough that 64 failed workers stay readable.
    static constexpr std::size_t default_max_lines = 20;
    /// 2 KiB per line: any human-written message fits; a megabyte of base64 does not.
    static constexpr std::size_t default_max_line_bytes = 2048;

    explicit stderr_tail(std::size_t max_lines = default_max_lines, std::size_t max_line_bytes = default_max_line_bytes)
        : max_lines_(max_lines == 0 ? 1 : max_lines), max_line_bytes_(max_line_bytes < 16 ? 16 : max_line_bytes) {}

    /// Feed the next chunk of the stream.
    ELASTIC_DECL void feed(std::string_view chunk);

    /// The tail as it stands, including the line still being written.
    ELASTIC_DECL stderr_tail_snapshot snapshot() const;

    /// Forget everything (a new attempt of the same worker).
    ELASTIC_DECL void clear();

    std::size_t max_lines() const noexcept { return max_lines_; }
    std::size_t max_line_bytes() const noexcept { return max_line_bytes_; }

private:
    ELASTIC_DECL std::string finish(std::string_view line, std::uint64_t cut) const;

    ELASTIC_DECL void end_line();

    ELASTIC_DECL void restart_line();

    std::size_t max_lines_;
    std::size_t max_line_bytes_;
    std::deque<std::string> lines_;
    std::string current_;
    std::uint64_t cut_bytes_ = 0;
    bool pending_cr_ = false;
    std::uint64_t total_lines_ = 0;
    std::uint64_t total_bytes_ = 0;
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL void stderr_tail::feed(std::string_view chunk) {
    total_bytes_ += chunk.size();
    for (const char c : chunk) {
        if (pending_cr_) {
            pending_cr_ = false;
            if (c == '\n') {
                end_line();
                continue;
            }
            restart_line();
        }
        if (c == '\n') {
            end_line();
        } else if (c == '\r') {
            pending_cr_ = true;
        } else if (current_.size() < max_line_bytes_) {
            current_ += c;
        } else {
            ++cut_bytes_;
        }
    }
}

ELASTIC_DECL stderr_tail_snapshot stderr_tail::snapshot() const {
    stderr_tail_snapshot s;
    s.lines.assign(lines_.begin(), lines_.end());
    s.total_lines = total_lines_;
    s.total_bytes = total_bytes_;
    if (!current_.empty() || cut_bytes_ > 0) {
        s.lines.push_back(finish(current_, cut_bytes_));
        ++s.total_lines;
        if (s.lines.size() > max_lines_) {
            s.lines.erase(s.lines.begin());
        }
    }
    return s;
}

ELASTIC_DECL void stderr_tail::clear() {
    lines_.clear();
    current_.clear();
    cut_bytes_ = 0;
    pending_cr_ = false;
    total_lines_ = 0;
    total_bytes_ = 0;
}

ELASTIC_DECL std::string stderr_tail::finish(std::string_view line, std::uint64_t cut) const {
    // Cutting at max_line_bytes_ may have split a UTF-8 sequence: drop its first bytes too
    // rather than show them as U+FFFD.
    std::string_view kept = line;
    if (cut > 0) {
        const std::string_view whole = detail::report::utf8_incomplete_tail_trimmed(line);
        cut += kept.size() - whole.size();
        kept = whole;
    }
    std::string out = detail::report::valid_utf8(kept);
    if (cut > 0) {
        out += " [... ";
        out += std::to_string(cut);
        out += " more bytes]";
    }
    return out;
}

ELASTIC_DECL void stderr_tail::end_line() {
    std::string line = finish(current_, cut_bytes_);
    current_.clear();
    cut_bytes_ = 0;
    ++total_lines_;
    lines_.push_back(std::move(line));
    if (lines_.size() > max_lines_) {
        lines_.pop_front();
    }
}

ELASTIC_DECL void stderr_tail::restart_line() {
    current_.clear();
    cut_bytes_ = 0;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
