// SPDX-License-Identifier: MIT
// How a process ended (exit_status: its code or signal, its numbers and its description) and
// when the agent saw it end (process_exit: the status with the pid and two timestamps).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/process/signal_name.hpp"

#include <chrono>
#include <climits>
#include <csignal>
#include <string>

#include <sys/types.h>
#include <sys/wait.h>

namespace elastic::inline v0 {

/// How a process ended: it exited with a code, or a signal killed it (perhaps dumping core).
/// Every layer uses this one value: the process layer fills it from waitid, a failure report
/// prints it, a restart policy matches it against exit-code sets.
///
/// Its numbers, and the one rule for numbers that cannot be what they stand for:
///   - returncode(): Python's `Popen.returncode`, what torchrun's summary prints as "exitcode" and
///     an error file's errorCode holds: the code, or -N for signal N (INT_MAX for INT_MIN, whose
///     negation would overflow);
///   - shell_code(): the shell's convention, which elasticrun exits with: the code, or 128 + N
///     for signal N; 255 when N is no signal number a shell could report (N <= 0 or N >= 127), so
///     the sum can neither overflow nor read as an exit code.
struct exit_status {
    enum class kind { exited, signaled };

    kind how = kind::exited;
    /// The exit code (0..255) when `how == exited`, the signal number when `how == signaled`.
    int value = 0;
    /// The signal produced a core dump (only ever true when signaled).
    bool core_dumped = false;

    static constexpr exit_status from_exit_code(int code) noexcept { return {kind::exited, code, false}; }
    static constexpr exit_status from_signal(int signal_number, bool core_dumped = false) noexcept {
        return {kind::signaled, signal_number, core_dumped};
    }
    /// From a waitpid() status word.
    static exit_status from_wait_status(int status) noexcept {
        if (WIFSIGNALED(status)) return from_signal(WTERMSIG(status), WCOREDUMP(status) != 0);
        return from_exit_code(WIFEXITED(status) ? WEXITSTATUS(status) : status);
    }
    /// From waitid()'s siginfo (what a pidfd wait gives): si_code CLD_EXITED, or CLD_KILLED /
    /// CLD_DUMPED, and si_status.
    static constexpr exit_status from_siginfo(int code, int status_or_signal) noexcept {
        return code == CLD_EXITED ? from_exit_code(status_or_signal)
                                  : from_signal(status_or_signal, code == CLD_DUMPED);
    }
    static exit_status from_siginfo(const siginfo_t& info) noexcept {
        return from_siginfo(info.si_code, info.si_status);
    }

    /// The process called exit (or returned from main).
    [[nodiscard]] constexpr bool exited() const noexcept { return how == kind::exited; }
    /// A signal ended the process.
    [[nodiscard]] constexpr bool signaled() const noexcept { return how == kind::signaled; }
    /// Exited with code 0.
    [[nodiscard]] constexpr bool success() const noexcept { return how == kind::exited && value == 0; }
    /// The exit code, or -1 when a signal ended the process.
    [[nodiscard]] constexpr int code() const noexcept { return exited() ? value : -1; }
    /// The terminating signal, or 0 when the process exited.
    [[nodiscard]] constexpr int signal() const noexcept { return signaled() ? value : 0; }

    /// torchrun's number (Popen.returncode): the code, or -N for signal N.
    [[nodiscard]] constexpr int returncode() const noexcept {
        if (exited()) return value;
        return value == INT_MIN ? INT_MAX : -value;
    }
    /// The shell's number: the code, or 128 + N for signal N (255 for no signal number).
    [[nodiscard]] constexpr int shell_code() const noexcept {
        if (exited()) return value;
        return value <= 0 || value >= 127 ? 255 : 128 + value;
    }

    /// The one text for an ending, which every log line and message uses: "exited with code 3",
    /// "killed by signal 9 (SIGKILL)", "killed by signal 6 (SIGABRT), core dumped". (Failure
    /// reports in torchrun's layout keep torchrun's own wording: see report/failure.hpp.)
    [[nodiscard]] std::string describe() const {
        if (exited()) return "exited with code " + std::to_string(value);
        std::string text = "killed by signal " + std::to_string(value) + " (" + signal_name(value) + ")";
        if (core_dumped) text += ", core dumped";
        return text;
    }

    friend constexpr bool operator==(const exit_status&, const exit_status&) = default;
};

/// A process's end as the agent observed it: its pid, how it ended, and when the agent saw it
/// (its pidfd became readable), on both clocks: `steady_time` orders failures within one agent,
/// `system_time` is what a failure report prints and compares across hosts.
struct process_exit {
    pid_t pid = 0;                                        ///< the process id
    exit_status status;                                   ///< how it ended
    std::chrono::steady_clock::time_point steady_time{};  ///< when seen, monotonic
    std::chrono::system_clock::time_point system_time{};  ///< when seen, wall clock

    /// The exit waitid reported, stamped now.
    static process_exit from_siginfo(const siginfo_t& info) {
        process_exit observed;
        observed.pid = info.si_pid;
        observed.status = exit_status::from_siginfo(info);
        observed.steady_time = std::chrono::steady_clock::now();
        observed.system_time = std::chrono::system_clock::now();
        return observed;
    }
};

}  // namespace elastic::inline v0
