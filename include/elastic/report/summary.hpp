// SPDX-License-Identifier: MIT
// The failure summary elasticrun prints when a group fails, in torchrun's layout
// (ChildFailedError's message).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/report/failure.hpp"
#include "elastic/report/text.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <ctime>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "elastic/detail/format.hpp"

namespace elastic::inline v0 {

/// How a summary is rendered.
struct summary_options {
    /// Show times in UTC instead of local time (torchrun uses local time; tests use UTC).
    bool utc = false;
    /// torchrun caps the borders at 60 columns.
    std::size_t max_width = 60;
};

namespace detail::report {

/// "YYYY-MM-DD_HH:MM:SS", Python's datetime.fromtimestamp(t).isoformat(sep="_") for whole t.
ELASTIC_DECL std::string summary_time(std::chrono::system_clock::time_point t, bool utc);

/// `text` with every line after the first indented by two spaces, as torchrun indents a
/// traceback (a trailing newline therefore leaves a line of two spaces, as in torchrun).
ELASTIC_DECL std::string indent_continuation(std::string_view text);

ELASTIC_DECL std::string failure_block(std::size_t idx, const worker_failure& f, bool utc);

ELASTIC_DECL std::size_t widest_line(std::string_view text);

}  // namespace detail::report

/// The summary of a group's failure in torchrun's layout: for failures torchrun
/// can express, byte for byte its ChildFailedError message (docs/failure-report.md lists the
/// deliberate differences). It starts with a newline and has no trailing newline. `name` is the entrypoint's name (the title is "<name> FAILED").
///
/// Failed workers are listed in global-rank order, numbered by that order; the root cause
/// (root_cause()) is shown under "Root Cause (first observed failure):", the others under
/// "Failures:". One addition to torchrun's layout, present only when some worker was stopped by
/// the agent: a section "Stopped by the agent (not failures):" between those two, one line per
/// such worker (torchrun lists them nowhere, or, newest, as failures).
ELASTIC_DECL std::string format_summary(std::string_view name, std::span<const worker_failure> failures,
                                        const summary_options& options = {});

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::report {

ELASTIC_DECL std::string summary_time(std::chrono::system_clock::time_point t, bool utc) {
    const std::time_t secs = std::chrono::system_clock::to_time_t(std::chrono::floor<std::chrono::seconds>(t));
    std::tm tm{};
    if (utc) {
        ::gmtime_r(&secs, &tm);
    } else {
        ::localtime_r(&secs, &tm);
    }
    return detail::format("{:04}-{:02}-{:02}_{:02}:{:02}:{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                          tm.tm_hour, tm.tm_min, tm.tm_sec);
}

ELASTIC_DECL std::string indent_continuation(std::string_view text) {
    std::string out;
    out.reserve(text.size() + 16);
    for (const char c : text) {
        out += c;
        if (c == '\n') {
            out += "  ";
        }
    }
    return out;
}

ELASTIC_DECL std::string failure_block(std::size_t idx, const worker_failure& f, bool utc) {
    const std::string error_file = f.error_file.status == error_file_status::absent || f.error_file.path.empty()
                                       ? std::string("<N/A>")
                                       : valid_utf8(f.error_file.path);
    return detail::format("[{}]:\n"
                          "  time      : {}\n"
                          "  host      : {}\n"
                          "  rank      : {} (local_rank: {})\n"
                          "  exitcode  : {} (pid: {})\n"
                          "  error_file: {}\n"
                          "  traceback : {}",
                          idx, summary_time(failure_display_time(f), utc), valid_utf8(f.host), f.global_rank,
                          f.local_rank, f.status.returncode(), f.pid, error_file,
                          indent_continuation(valid_utf8(failure_traceback(f))));
}

ELASTIC_DECL std::size_t widest_line(std::string_view text) {
    std::size_t widest = 0;
    std::size_t start = 0;
    while (start <= text.size()) {
        auto end = text.find('\n', start);
        if (end == std::string_view::npos) {
            end = text.size();
        }
        widest = std::max(widest, code_points(text.substr(start, end - start)));
        start = end + 1;
    }
    return widest;
}

}  // namespace detail::report
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL std::string format_summary(std::string_view name, std::span<const worker_failure> failures,
                                        const summary_options& options) {
    const std::string title = detail::format("{} FAILED", detail::report::valid_utf8(name));
    std::vector<std::size_t> order(failures.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return failures[a].global_rank < failures[b].global_rank; });
    const auto root = root_cause(failures);

    std::size_t width = detail::report::code_points(title);
    std::string root_block;
    std::vector<std::string> other_blocks;
    std::vector<std::string> stopped_lines;
    std::size_t idx = 0;
    for (const std::size_t i : order) {
        const auto& f = failures[i];
        if (f.state == failure_state::stopped_by_agent) {
            std::string line = detail::format("  rank {} (local_rank: {}): exitcode {} (pid: {})", f.global_rank,
                                              f.local_rank, f.status.returncode(), f.pid);
            width = std::max(width, detail::report::code_points(line));
            stopped_lines.push_back(std::move(line));
            continue;
        }
        std::string block = detail::report::failure_block(idx++, f, options.utc);
        width = std::max(width, detail::report::widest_line(block));
        if (root && i == *root) {
            root_block = std::move(block);
        } else {
            other_blocks.push_back(std::move(block));
        }
    }
    width = std::min(width, options.max_width);
    const std::string border(width, '=');
    const std::string section(width, '-');

    std::string out = detail::format("\n{}\n{}\n{}\nFailures:\n", border, title, section);
    if (other_blocks.empty()) {
        out += "  <NO_OTHER_FAILURES>";
    }
    for (std::size_t k = 0; k < other_blocks.size(); ++k) {
        if (k > 0) {
            out += '\n';
        }
        out += other_blocks[k];
    }
    out += '\n';
    out += section;
    if (!stopped_lines.empty()) {
        out += "\nStopped by the agent (not failures):";
        for (const auto& line : stopped_lines) {
            out += '\n';
            out += line;
        }
        out += '\n';
        out += section;
    }
    out += "\nRoot Cause (first observed failure):\n";
    out += root ? root_block : std::string("  <NO_ROOT_CAUSE>");
    out += '\n';
    out += border;
    return out;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
