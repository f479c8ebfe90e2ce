// SPDX-License-Identifier: MIT
// Names of Linux signals (the one table), the signals an agent can forward, and torchrun's
// "Signal N (SIGNAME) received by PID p" message.
#pragma once

#include "elastic/detail/config.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <csignal>
#include <iterator>
#include <string>
#include <string_view>

#include "elastic/detail/format.hpp"

namespace elastic::inline v0 {

/// The name Python's `signal.Signals(n).name` gives signal `n` on Linux ("SIGKILL" for 9), so a
/// summary reads like torchrun's. Real-time signals Python does not name are spelled the way
/// glibc's `kill -l` does ("SIGRTMIN+3", "SIGRTMAX-2"). Numbers that are no signal (0, 32 and 33,
/// which glibc keeps for itself, negatives, anything past SIGRTMAX) give "<N/A>", torchrun's
/// placeholder, instead of failing.
namespace detail::process {
// Indexed by number; Linux x86-64/arm64 numbering (the only platform elastic supports).
inline constexpr std::string_view standard_signal_names[] = {
    "",          "SIGHUP",  "SIGINT",    "SIGQUIT", "SIGILL",   "SIGTRAP", "SIGABRT", "SIGBUS",
    "SIGFPE",    "SIGKILL", "SIGUSR1",   "SIGSEGV", "SIGUSR2",  "SIGPIPE", "SIGALRM", "SIGTERM",
    "SIGSTKFLT", "SIGCHLD", "SIGCONT",   "SIGSTOP", "SIGTSTP",  "SIGTTIN", "SIGTTOU", "SIGURG",
    "SIGXCPU",   "SIGXFSZ", "SIGVTALRM", "SIGPROF", "SIGWINCH", "SIGIO",   "SIGPWR",  "SIGSYS"};
}  // namespace detail::process

ELASTIC_DECL std::string signal_name(int signal_number);

/// The number of the signal that signal_name() spells `name`, in any case ("SIGTERM",
/// "sigrtmin+3"), or 0.
[[nodiscard]] ELASTIC_DECL int signal_number(std::string_view name);

/// Signals an agent can trap and forward to its workers (`--signals-to-handle`). SIGKILL and
/// SIGSTOP cannot be trapped, SIGCHLD is how the agent learns of exits, and fault signals (SEGV,
/// BUS, ...) are the agent's own.
inline constexpr std::array<int, 16> forwardable_signal_numbers{SIGHUP,  SIGINT,  SIGQUIT, SIGTERM,   SIGUSR1, SIGUSR2,
                                                                SIGALRM, SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF, SIGWINCH,
                                                                SIGURG,  SIGCONT, SIGTSTP, SIGPWR};

/// The name of a signal as `--signals-to-handle` writes it (`SIGTERM`), or its number.
[[nodiscard]] ELASTIC_DECL std::string signal_to_string(int number);

/// torchrun's message for a worker killed by a signal (its ProcessFailure's):
/// `Signal 9 (SIGKILL) received by PID 1234`.
ELASTIC_DECL std::string signal_message(int signal_number, long pid);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL std::string signal_name(int signal_number) {
    constexpr int standard_count = static_cast<int>(std::size(detail::process::standard_signal_names));
    if (signal_number >= 1 && signal_number < standard_count) {
        return std::string(detail::process::standard_signal_names[signal_number]);
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
        return detail::format("SIGRTMIN+{}", signal_number - rt_min);
    }
    return detail::format("SIGRTMAX-{}", rt_max - signal_number);
}

[[nodiscard]] ELASTIC_DECL int signal_number(std::string_view name) {
    const auto same = [](std::string_view a, std::string_view b) {
        return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
                   return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
               });
    };
    const int last = SIGRTMAX;
    for (int n = 1; n <= last; ++n) {
        if (same(signal_name(n), name)) return n;
    }
    return 0;
}

[[nodiscard]] ELASTIC_DECL std::string signal_to_string(int number) {
    for (const int s : forwardable_signal_numbers) {
        if (s == number) return signal_name(number);
    }
    return std::to_string(number);
}

ELASTIC_DECL std::string signal_message(int signal_number, long pid) {
    return detail::format("Signal {} ({}) received by PID {}", signal_number, signal_name(signal_number), pid);
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
