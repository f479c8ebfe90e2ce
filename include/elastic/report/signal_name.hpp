// Names of Linux signals, and torchrun's "Signal N (SIGNAME) received by PID p" message.
#pragma once

#include "elastic/detail/config.hpp"

#include <csignal>
#include <iterator>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace elastic::inline v0 {

/// The name Python's `signal.Signals(n).name` gives signal `n` on Linux ("SIGKILL" for 9), so a
/// summary reads like torchrun's. Real-time signals Python does not name are spelled the way
/// glibc's `kill -l` does ("SIGRTMIN+3", "SIGRTMAX-2"). Numbers that are no signal (0, 32 and 33,
/// which glibc keeps for itself, negatives, anything past SIGRTMAX) give "<N/A>", torchrun's
/// placeholder, instead of failing.
inline std::string signal_name(int signal_number) {
    // Indexed by number; Linux x86-64/arm64 numbering (the only platform elastic supports).
    static constexpr std::string_view standard[] = {
        "",          "SIGHUP",  "SIGINT",    "SIGQUIT", "SIGILL",   "SIGTRAP", "SIGABRT", "SIGBUS",
        "SIGFPE",    "SIGKILL", "SIGUSR1",   "SIGSEGV", "SIGUSR2",  "SIGPIPE", "SIGALRM", "SIGTERM",
        "SIGSTKFLT", "SIGCHLD", "SIGCONT",   "SIGSTOP", "SIGTSTP",  "SIGTTIN", "SIGTTOU", "SIGURG",
        "SIGXCPU",   "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO",   "SIGPWR",  "SIGSYS"};
    constexpr int standard_count = static_cast<int>(std::size(standard));
    if (signal_number >= 1 && signal_number < standard_count) {
        return std::string(standard[signal_number]);
    }
    // SIGRTMIN/SIGRTMAX are glibc function calls (34 and 64 here: NPTL keeps 32 and 33).
    const int rt_min = SIGRTMIN;
    const int rt_max = SIGRTMAX;
    if (signal_number < rt_min || signal_number > rt_max) {
        return "<N/A>";
    }
    if (signal_number == rt_min) {
        return "SIGRTMIN";
    }
    if (signal_number == rt_max) {
        return "SIGRTMAX";
    }
    // kill -l's split: the lower half counts up from SIGRTMIN, the upper half down from SIGRTMAX.
    if (signal_number - rt_min <= (rt_max - rt_min) / 2) {
        return fmt::format("SIGRTMIN+{}", signal_number - rt_min);
    }
    return fmt::format("SIGRTMAX-{}", rt_max - signal_number);
}

/// torchrun's message for a worker killed by a signal (ProcessFailure, §6.3 of the inventory):
/// `Signal 9 (SIGKILL) received by PID 1234`.
inline std::string signal_message(int signal_number, long pid) {
    return fmt::format("Signal {} ({}) received by PID {}", signal_number,
                       signal_name(signal_number), pid);
}

}  // namespace elastic::inline v0
