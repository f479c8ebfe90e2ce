// process_exit: how and when a worker process ended, as the agent saw it.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/process/signal_name.hpp"

#include <chrono>
#include <csignal>
#include <cstring>
#include <string>

#include <sys/types.h>
#include <sys/wait.h>

namespace elastic::inline v0 {

/// How a process ended and when the agent saw it end.
///
/// (report/failure.hpp's `exit_status` is the report's view of the same fact, without pid or
/// times: `signaled() ? exit_status::from_signal(signal) : exit_status::from_exit_code(code)`.)
///
/// Exactly one of `code` (normal exit) and `signal` (killed by a signal) is meaningful:
/// `signal == 0` means the process called exit, and then `code` is its 0..255 exit code; otherwise
/// `code` is -1. The times are taken when the agent observed the exit (its pidfd became readable),
/// on both clocks: `steady_time` orders failures within one agent, `system_time` is what a failure
/// report prints and compares across hosts.
struct process_exit {
    pid_t pid = 0;            ///< the process id
    int code = -1;            ///< exit code when `signal == 0`, else -1
    int signal = 0;           ///< terminating signal number, 0 when the process exited
    bool core_dumped = false; ///< the signal produced a core dump
    std::chrono::steady_clock::time_point steady_time{};  ///< when seen, monotonic
    std::chrono::system_clock::time_point system_time{};  ///< when seen, wall clock

    /// The process called exit (or returned from main).
    [[nodiscard]] bool exited() const noexcept { return signal == 0; }
    /// The process was ended by a signal.
    [[nodiscard]] bool signaled() const noexcept { return signal != 0; }
    /// Exited with code 0.
    [[nodiscard]] bool success() const noexcept { return signal == 0 && code == 0; }
    /// Python's `Popen.returncode` (what torchrun's summary prints as "exitcode"): the exit code,
    /// or minus the signal number.
    [[nodiscard]] int returncode() const noexcept { return signal != 0 ? -signal : code; }
    /// The shell's convention, which elasticrun exits with: the exit code, or 128 + signal.
    [[nodiscard]] int shell_code() const noexcept { return signal != 0 ? 128 + signal : code; }

    /// "exited with code 3" or "killed by signal 9 (SIGKILL)".
    [[nodiscard]] std::string describe() const {
        if (signal == 0) return "exited with code " + std::to_string(code);
        std::string text = "killed by signal " + std::to_string(signal) + " (" +
                           signal_name(signal) + ")";
        if (core_dumped) text += ", core dumped";
        return text;
    }

    /// Builds the status from what waitid reported, stamped now.
    static process_exit from_siginfo(const siginfo_t& info) {
        process_exit status;
        status.pid = info.si_pid;
        if (info.si_code == CLD_EXITED) {
            status.code = info.si_status;
        } else {
            status.signal = info.si_status;
            status.core_dumped = info.si_code == CLD_DUMPED;
        }
        status.steady_time = std::chrono::steady_clock::now();
        status.system_time = std::chrono::system_clock::now();
        return status;
    }
};

}  // namespace elastic::inline v0
