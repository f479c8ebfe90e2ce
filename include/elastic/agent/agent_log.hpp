// SPDX-License-Identifier: MIT
// agent_log: the agent's own messages, one format with a level and a time (torchrun's newest
// layout), filtered by LOGLEVEL.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/agent/output.hpp"
#include "elastic/agent/spec.hpp"

#include "elastic/detail/format.hpp"

#include <chrono>
#include <ctime>
#include <string>
#include <string_view>
#include <utility>

#include <unistd.h>

namespace elastic::inline v0 {

/// What the agent writes for people, and how much (LOGLEVEL, torchrun's levels; WARNING by
/// default, so a healthy run prints nothing of the agent's own). Every line of a message is
/// written in torchrun's newest layout (PyTorch's log formatter), the launcher's name standing
/// where torchrun names its source file:
///
///     W1122 12:45:07.123456 4242 elasticrun] [default] worker group failed (...); restarting
///
/// level letter (D, I, W, E, C), month and day, local time with microseconds, the agent's pid.
/// A multi-line message gets the prefix on every line. The whole message is one write(2).
class agent_log {
public:
    agent_log(std::string name, log_level level, int fd = 2)
        : name_(std::move(name)), level_(level), fd_(fd), pid_(static_cast<long>(::getpid())) {}

    [[nodiscard]] bool enabled(log_level level) const noexcept { return level >= level_; }
    [[nodiscard]] log_level level() const noexcept { return level_; }

    void operator()(log_level level, std::string_view text) const {
        if (!enabled(level)) return;
        const auto now = std::chrono::system_clock::now();
        const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
        std::tm local{};
        ::localtime_r(&seconds, &local);
        const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
                            1000000;
        detail::agent::write_all(fd_, format(level, local, static_cast<int>(micros), pid_, name_, text));
    }
    void debug(std::string_view text) const { (*this)(log_level::debug, text); }
    void info(std::string_view text) const { (*this)(log_level::info, text); }
    void warning(std::string_view text) const { (*this)(log_level::warning, text); }
    void error(std::string_view text) const { (*this)(log_level::error, text); }
    void critical(std::string_view text) const { (*this)(log_level::critical, text); }
    /// Text shown whatever the level and without the prefix (the failure summary, as torchrun
    /// prints its exception).
    void always(std::string_view text) const { detail::agent::write_all(fd_, detail::format("{}\n", text)); }

    [[nodiscard]] const std::string& name() const noexcept { return name_; }

    /// The text written for one message: every line (newlines leading and trailing `text` are dropped)
    /// as `<L><mmdd> <hh:mm:ss>.<micros> <pid> <name>] <line>\n`.
    [[nodiscard]] static std::string format(log_level level, const std::tm& local, int micros, long pid,
                                            std::string_view name, std::string_view text) {
        static constexpr char letters[] = {'D', 'I', 'W', 'E', 'C'};
        const auto prefix = detail::format("{}{:02}{:02} {:02}:{:02}:{:02}.{:06} {} {}] ",
                                           letters[static_cast<int>(level)], local.tm_mon + 1, local.tm_mday,
                                           local.tm_hour, local.tm_min, local.tm_sec, micros, pid, name);
        while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
        while (!text.empty() && text.front() == '\n') text.remove_prefix(1);
        std::string out;
        for (;;) {
            const auto nl = text.find('\n');
            out += prefix;
            out += text.substr(0, nl);
            out += '\n';
            if (nl == std::string_view::npos) break;
            text.remove_prefix(nl + 1);
        }
        return out;
    }

private:
    std::string name_;
    log_level level_;
    int fd_;
    long pid_;
};

}  // namespace elastic::inline v0
