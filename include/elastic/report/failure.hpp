// SPDX-License-Identifier: MIT
// worker_failure: one worker's end as the agent saw it, what a report says about it, the root
// cause of a group's failure (the earliest), and elasticrun's exit code.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/host_name.hpp"
#include "elastic/process/exit.hpp"
#include "elastic/report/error_file_content.hpp"
#include "elastic/process/signal_name.hpp"
#include "elastic/report/stderr_tail.hpp"
#include "elastic/report/text.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "elastic/detail/format.hpp"

namespace elastic::inline v0 {

/// Why a worker is in a failure report.
enum class failure_state {
    /// It ended unsuccessfully on its own: a candidate for root cause.
    failed,
    /// The agent ended it while stopping the group after another worker failed (or on a signal
    /// to the agent): listed, never a root cause.
    stopped_by_agent,
};

/// What the agent's watchdog saw of a worker it found hung (and then stopped).
struct hang_report {
    /// Why, in words: "no heartbeat for 31.2 s (--watchdog beat=30s)".
    std::string reason;
    /// The section it was in ("allreduce"); empty when none.
    std::string section;
    /// The last value it passed to progress(); nullopt when it never did.
    std::optional<std::uint64_t> progress;
    /// How long it had shown no sign of life (or, for a section's limit, had been in the
    /// section) when the watchdog fired.
    std::chrono::milliseconds silent{};
    /// Its threads' stacks as it wrote them on the dump signal; empty when it wrote none.
    std::string stacks;
    /// Whether the agent asked it for its stacks (the watchdog's hangs; not a torch timer's
    /// expiry, which only sends the signal the worker asked for).
    bool stacks_asked = true;

    /// The failure's one-line description: "hung: <reason>; in section "x"; at step 12".
    [[nodiscard]] ELASTIC_DECL std::string headline() const;
};

/// One worker's end, as the agent observed it: everything a failure report says about it.
struct worker_failure {
    int local_rank = 0;
    int global_rank = 0;
    std::string role = "default";
    long pid = 0;
    /// The agent's host name, fully qualified (torchrun prints socket.getfqdn()); see host_fqdn().
    std::string host;
    exit_status status;
    /// When the agent saw the exit: steady for ordering, system for display (taken together).
    std::chrono::steady_clock::time_point observed_steady{};
    std::chrono::system_clock::time_point observed_system{};
    /// The worker's error file as read after its exit (its path is error_file.path).
    error_file_read error_file;
    /// The last lines of the worker's stderr (empty when it was not captured).
    stderr_tail_snapshot stderr_tail;
    failure_state state = failure_state::failed;
    /// Set when the agent's watchdog found it hung and stopped it (a failure of kind "hang"):
    /// then state is failed, the observation stamps are the detection's, and its status is how
    /// it ended when stopped.
    std::optional<hang_report> hang;

    /// Stamp both observation clocks with "now"; the agent calls it when the exit arrives.
    void observe_now() noexcept {
        observed_steady = std::chrono::steady_clock::now();
        observed_system = std::chrono::system_clock::now();
    }
};

/// torchrun's message for a failure without an error file and without a signal.
inline constexpr const char* no_traceback_hint =
    "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";

/// The one-line description of a failure: the error file's message when it has one, else
/// "Signal 9 (SIGKILL) received by PID 1234", else
/// "Process 1234 (rank: 3, local_rank: 1) exited with code 3".
ELASTIC_DECL std::string failure_headline(const worker_failure& f);

/// The stderr tail as a report shows it: a heading line, then the lines indented by two.
ELASTIC_DECL std::string stderr_tail_text(const stderr_tail_snapshot& tail);

/// What the summary prints after "traceback :" (multi-line; the summary indents continuation
/// lines). With a well-formed error file: torchrun's choice (py_callstack, else the message, else
/// "<N/A>"), with the message put first when the callstack does not contain it (a C++ backtrace
/// from elastic::record; a Python traceback always ends with it). Without one, what torchrun would
/// print (the signal message, or its hint) improved by the tail of the worker's stderr when there
/// is one. A malformed file is named as such first.
ELASTIC_DECL std::string failure_traceback(const worker_failure& f);

/// The instant used to order failures, on the agent's steady clock (see docs/failure-report.md):
/// the agent's observation of the exit, unless the worker's error file proves the error happened
/// earlier. A whole-second file timestamp t stands for [t, t+1), so it counts as the last instant
/// of that second (t+1 s minus one clock tick): it moves a failure earlier only when that second
/// ended before the agent saw the exit. The file's wall-clock time is related to the steady
/// clock through the same failure's pair of observation stamps (the worker runs on the agent's
/// host, so both read the same wall clock).
ELASTIC_DECL std::chrono::steady_clock::time_point failure_time(const worker_failure& f) noexcept;

/// The wall-clock time a report shows for a failure: the error file's timestamp when it has one
/// (as torchrun shows), else when the agent observed the exit.
ELASTIC_DECL std::chrono::system_clock::time_point failure_display_time(const worker_failure& f) noexcept;

/// The index of the root cause among `failures`: the earliest failure_time() among those in
/// state failed, the lowest global rank on a tie. Workers stopped by the agent are never chosen;
/// nullopt when there is no failed worker.
ELASTIC_DECL std::optional<std::size_t> root_cause(std::span<const worker_failure> failures) noexcept;

/// The exit code elasticrun ends with for a failure: the worker's own code, 128+N when signal N
/// killed it (the shell's convention), and at least 1 (a failure never reads as success).
constexpr int launcher_exit_code(const worker_failure& f) noexcept {
    const int code = f.status.shell_code();
    return code == 0 ? 1 : code;
}

/// The exit code for a group's failures: the root cause's (see the overload); nullopt when no
/// worker failed (the caller decides, e.g. 0, or 128+N for a signal the agent itself received).
ELASTIC_DECL std::optional<int> launcher_exit_code(std::span<const worker_failure> failures) noexcept;

/// torchrun's log line when a group fails (multiprocessing/api.py, logged at error level for the
/// first failure): `failed (exitcode: -9) local_rank: 1 (pid: 4201) of binary: train.py`.
ELASTIC_DECL std::string failure_log_line(const worker_failure& f, std::string_view entrypoint);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL std::string hang_report::headline() const {
    auto out = detail::format("hung: {}", reason);
    if (!section.empty() && reason.rfind("in section ", 0) != 0) out += detail::format("; in section \"{}\"", section);
    if (progress) out += detail::format("; progress {}", *progress);
    return out;
}

ELASTIC_DECL std::string failure_headline(const worker_failure& f) {
    if (f.hang) return f.hang->headline();
    if (f.error_file.parsed() && !f.error_file.content.message.empty()) {
        return f.error_file.content.message;
    }
    if (f.status.signaled()) {
        return signal_message(f.status.signal(), f.pid);
    }
    return detail::format("Process {} (rank: {}, local_rank: {}) exited with code {}", f.pid, f.global_rank,
                          f.local_rank, f.status.code());
}

ELASTIC_DECL std::string stderr_tail_text(const stderr_tail_snapshot& tail) {
    std::string out;
    if (tail.total_lines == tail.lines.size()) {
        out = detail::format("stderr ({} line{}):", tail.lines.size(), tail.lines.size() == 1 ? "" : "s");
    } else {
        out = detail::format("stderr (last {} of {} lines):", tail.lines.size(), tail.total_lines);
    }
    for (const auto& line : tail.lines) {
        out += "\n  ";
        out += line;
    }
    return out;
}

ELASTIC_DECL std::string failure_traceback(const worker_failure& f) {
    const auto& ef = f.error_file;
    if (f.hang && !ef.parsed()) {
        // No error file (no log directory): the stacks the agent kept, else the stderr tail.
        if (!f.hang->stacks.empty()) return f.hang->headline() + "\n" + f.hang->stacks;
        if (!f.stderr_tail.empty()) return f.hang->headline() + "\n" + stderr_tail_text(f.stderr_tail);
        return f.hang->headline();
    }
    if (ef.parsed()) {
        const auto& c = ef.content;
        if (c.format == error_file_format::flat) {
            return c.message;
        }
        if (c.traceback) {
            // A Python traceback ends with the message; elastic::record's C++ backtrace does not,
            // and torchrun's rule would then never show what the exception said.
            if (!c.message.empty() && c.traceback->find(c.message) == std::string::npos) {
                return c.message + "\n" + *c.traceback;
            }
            return *c.traceback;
        }
        return c.message.empty() ? std::string("<N/A>") : c.message;
    }
    std::string out;
    if (ef.status == error_file_status::malformed) {
        out = detail::format("Malformed error file: {}", ef.problem);
    }
    if (f.status.signaled()) {
        if (!out.empty()) {
            out += '\n';
        }
        out += signal_message(f.status.signal(), f.pid);
    }
    if (!f.stderr_tail.empty()) {
        if (!out.empty()) {
            out += '\n';
        }
        out += stderr_tail_text(f.stderr_tail);
    }
    if (out.empty()) {
        out = no_traceback_hint;
    }
    return out;
}

ELASTIC_DECL std::chrono::steady_clock::time_point failure_time(const worker_failure& f) noexcept {
    if (f.error_file.parsed() && f.error_file.content.timestamp) {
        auto latest = *f.error_file.content.timestamp;
        if (f.error_file.content.timestamp_whole_seconds) {
            latest += std::chrono::seconds(1) - std::chrono::system_clock::duration(1);
        }
        if (latest < f.observed_system) {
            const auto earlier_by = f.observed_system - latest;
            return f.observed_steady - std::chrono::duration_cast<std::chrono::steady_clock::duration>(earlier_by);
        }
    }
    return f.observed_steady;
}

ELASTIC_DECL std::chrono::system_clock::time_point failure_display_time(const worker_failure& f) noexcept {
    if (f.error_file.parsed() && f.error_file.content.timestamp) {
        return *f.error_file.content.timestamp;
    }
    return f.observed_system;
}

ELASTIC_DECL std::optional<std::size_t> root_cause(std::span<const worker_failure> failures) noexcept {
    std::optional<std::size_t> best;
    for (std::size_t i = 0; i < failures.size(); ++i) {
        const auto& f = failures[i];
        if (f.state != failure_state::failed) {
            continue;
        }
        if (!best) {
            best = i;
            continue;
        }
        const auto& b = failures[*best];
        const auto ft = failure_time(f);
        const auto bt = failure_time(b);
        if (ft < bt || (ft == bt && f.global_rank < b.global_rank)) {
            best = i;
        }
    }
    return best;
}

ELASTIC_DECL std::optional<int> launcher_exit_code(std::span<const worker_failure> failures) noexcept {
    if (const auto root = root_cause(failures)) {
        return launcher_exit_code(failures[*root]);
    }
    return std::nullopt;
}

ELASTIC_DECL std::string failure_log_line(const worker_failure& f, std::string_view entrypoint) {
    if (f.hang) {
        return detail::format("failed ({}; then exitcode: {}) local_rank: {} (pid: {}) of binary: {}",
                              detail::report::valid_utf8(f.hang->headline()), f.status.returncode(), f.local_rank,
                              f.pid, detail::report::valid_utf8(entrypoint));
    }
    return detail::format("failed (exitcode: {}) local_rank: {} (pid: {}) of binary: {}", f.status.returncode(),
                          f.local_rank, f.pid, detail::report::valid_utf8(entrypoint));
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
