// SPDX-License-Identifier: MIT
// The settings of the built-in restart policies as values: durations in words, backoff_spec,
// window_spec, exit_code_set and crash_guard_spec, with the parsers of their command-line forms
// (--restart-backoff, --restart-window, --restart-on-exit, --restart-crash-guard), and
// restart_settings, all of them together (what make_default_policy takes).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/text.hpp"
#include "elastic/process/exit.hpp"
#include "elastic/process/signal_name.hpp"
#include "elastic/usage_error.hpp"

#include "elastic/detail/format.hpp"

#include <bitset>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace elastic::inline v0 {

namespace detail::policy {

/// "1.5" from 1500 (thousandths), trailing zeros dropped.
[[nodiscard]] ELASTIC_DECL std::string thousandths(long long value);

[[nodiscard]] ELASTIC_DECL std::string duration_text(std::chrono::nanoseconds d, bool spaced);

}  // namespace detail::policy

/// A duration as the restart flags write it, without a space: "500ms", "1.5s", "2min", "1h".
/// parse_duration() reads it back exactly (to the millisecond).
[[nodiscard]] ELASTIC_DECL std::string duration_flag_text(std::chrono::nanoseconds d);

/// A duration as reasons write it: "500 ms", "1.5 s", "2 min", "1 h" (to the millisecond).
[[nodiscard]] ELASTIC_DECL std::string duration_words(std::chrono::nanoseconds d);

/// A duration: a number (decimals allowed) and a unit, ms, s, m or min, h; a bare number is
/// seconds, as torchrun's options count. At most 1e9 seconds; held to the millisecond. `name`
/// names the option or variable in the usage_error.
[[nodiscard]] ELASTIC_DECL std::chrono::milliseconds parse_duration(std::string_view text, std::string_view name,
                                                                    bool allow_zero = false);

/// How a built-in policy cites itself in its reasons: as the C++ call that made it (the
/// default: "max_restarts(3)", for a launcher whose policy is set in its code), or as the
/// command-line option (the policy elasticrun builds from its options: "--max-restarts=3"). So
/// a log line never names an option nobody passed.
enum class policy_naming { code, command_line };

/// The naming a built-in policy carries (its base class).
class named_policy {
public:
    [[nodiscard]] policy_naming naming() const noexcept { return naming_; }
    /// Cite the command-line option instead of the C++ call (make_default_policy does).
    void name_by(policy_naming naming) noexcept { naming_ = naming; }

protected:
    [[nodiscard]] std::string cite(std::string code, std::string flag) const {
        return naming_ == policy_naming::code ? std::move(code) : std::move(flag);
    }

private:
    policy_naming naming_ = policy_naming::code;
};

/// --restart-backoff=INITIAL:CAP[:RESET]: wait INITIAL before the first restart, doubling for
/// each failure in a row up to CAP; a group that ran healthy for RESET starts over at INITIAL.
struct backoff_spec {
    std::chrono::milliseconds initial{1000};
    std::chrono::milliseconds cap{60000};
    /// Kubernetes' CrashLoopBackOff forgets its backoff after 10 minutes of healthy running.
    std::chrono::milliseconds reset_after{std::chrono::minutes(10)};
    /// Each delay grows by this factor (> 1 ... or exactly 1 for a constant delay).
    double factor = 2.0;
    /// Each delay is shortened by up to this fraction, at random (0 <= jitter < 1), so that the
    /// nodes of a job do not all come back at the same instant.
    double jitter = 0.1;

    /// The command-line form, as reasons cite it: "--restart-backoff=1s:1min" (":RESET" when
    /// not the default).
    [[nodiscard]] std::string flag() const {
        std::string out = detail::format("--restart-backoff={}:{}", duration_flag_text(initial),
                                         duration_flag_text(cap));
        if (reset_after != backoff_spec{}.reset_after) out += ":" + duration_flag_text(reset_after);
        return out;
    }
    /// The C++ form: "backoff(1s, 1min)", or the spec when it is not the defaults but for the
    /// two durations ("backoff(backoff_spec{1s, 1min, 30min, 1.5, 0.1})").
    [[nodiscard]] std::string code() const {
        const backoff_spec plain{initial, cap};
        if (*this == plain)
            return detail::format("backoff({}, {})", duration_flag_text(initial), duration_flag_text(cap));
        return detail::format("backoff(backoff_spec{{{}, {}, {}, {}, {}}})", duration_flag_text(initial),
                              duration_flag_text(cap), duration_flag_text(reset_after), factor, jitter);
    }
    friend bool operator==(const backoff_spec&, const backoff_spec&) = default;
};

/// Parses INITIAL:CAP[:RESET] (durations as parse_duration reads them; INITIAL <= CAP).
[[nodiscard]] ELASTIC_DECL backoff_spec parse_backoff_spec(std::string_view text, std::string_view name);

/// --restart-window=N/PERIOD: at most N restarts within any PERIOD (a sliding window).
struct window_spec {
    int restarts = 1;
    std::chrono::milliseconds period{std::chrono::hours(1)};

    [[nodiscard]] std::string flag() const {
        return detail::format("--restart-window={}/{}", restarts, duration_flag_text(period));
    }
    [[nodiscard]] std::string code() const {
        return detail::format("restart_window({}, {})", restarts, duration_flag_text(period));
    }
    friend bool operator==(const window_spec&, const window_spec&) = default;
};

/// Parses N/PERIOD (N >= 1).
[[nodiscard]] ELASTIC_DECL window_spec parse_window_spec(std::string_view text, std::string_view name);

/// A class of worker endings: exit codes, and deaths by signal. `signals` (any signal) and a
/// named signal also match the exit code 128+N a shell reports for a child killed by signal N,
/// since workers are often started by a wrapper script.
struct exit_code_set {
    std::bitset<256> codes;   ///< exit codes 0..255
    bool any_signal = false;  ///< every death by signal
    std::bitset<65> signals;  ///< signals 1..64 by number
    /// A worker the watchdog found hung (--watchdog), or that the signal of its own expired torch
    /// file timer ended, however it then ended: `hang`.
    bool hang = false;

    [[nodiscard]] bool contains(const exit_status& status) const noexcept {
        if (status.signaled())
            return any_signal ||
                   (status.value >= 1 && status.value <= 64 && signals.test(static_cast<std::size_t>(status.value)));
        if (status.value < 0 || status.value > 255) return false;
        if (codes.test(static_cast<std::size_t>(status.value))) return true;
        const int n = status.value - 128;
        return n >= 1 && n <= 64 && (any_signal || signals.test(static_cast<std::size_t>(n)));
    }

    /// The canonical text: codes and ranges ascending, then "signals" or the signal names
    /// ("1,3-5,signals"); parse_exit_code_set() reads it back.
    [[nodiscard]] std::string to_string() const {
        std::string out;
        const auto add = [&](const std::string& item) { out += (out.empty() ? "" : ",") + item; };
        for (std::size_t c = 0; c < 256; ++c) {
            if (!codes.test(c)) continue;
            std::size_t last = c;
            while (last + 1 < 256 && codes.test(last + 1)) ++last;
            add(last == c ? detail::format("{}", c) : detail::format("{}-{}", c, last));
            c = last;
        }
        if (hang) add("hang");
        if (any_signal) {
            add("signals");
        } else {
            for (int s = 1; s <= 64; ++s) {
                if (signals.test(static_cast<std::size_t>(s))) add(signal_name(s));
            }
        }
        return out;
    }
    friend bool operator==(const exit_code_set&, const exit_code_set&) = default;
};

/// Parses a comma-separated set: exit codes (`3`), ranges (`3-5`), `signals` (any death by a
/// signal, or exit code 129-192) and signal names (`SIGKILL`, case-insensitive; also 128+9=137).
[[nodiscard]] ELASTIC_DECL exit_code_set parse_exit_code_set(std::string_view text, std::string_view name);

/// --restart-crash-guard=T[:N]: a group that fails within T of its start is not restarted (with
/// N, only the N-th such start in a row stops the job).
struct crash_guard_spec {
    std::chrono::milliseconds within{10000};
    int in_a_row = 1;

    [[nodiscard]] std::string flag() const {
        return in_a_row == 1 ? detail::format("--restart-crash-guard={}", duration_flag_text(within))
                             : detail::format("--restart-crash-guard={}:{}", duration_flag_text(within), in_a_row);
    }
    [[nodiscard]] std::string code() const {
        return in_a_row == 1 ? detail::format("crash_loop_guard({})", duration_flag_text(within))
                             : detail::format("crash_loop_guard({}, {})", duration_flag_text(within), in_a_row);
    }
    friend bool operator==(const crash_guard_spec&, const crash_guard_spec&) = default;
};

/// Parses T or T:N (N >= 1).
[[nodiscard]] ELASTIC_DECL crash_guard_spec parse_crash_guard_spec(std::string_view text, std::string_view name);

/// The restart settings of a job, as `--max-restarts` and the `--restart-*` options give them:
/// what make_default_policy builds the default policy from (launch_config::restarts()).
struct restart_settings {
    int max_restarts = 0;                         ///< --max-restarts
    std::optional<backoff_spec> backoff;          ///< --restart-backoff
    std::optional<window_spec> window;            ///< --restart-window
    std::optional<exit_code_set> on_exit;         ///< --restart-on-exit
    std::optional<crash_guard_spec> crash_guard;  ///< --restart-crash-guard
    std::optional<int> no_progress;               ///< --restart-no-progress
    friend bool operator==(const restart_settings&, const restart_settings&) = default;
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::policy {

[[nodiscard]] ELASTIC_DECL std::string thousandths(long long value) {
    std::string out = detail::format("{}.{:03}", value / 1000, value % 1000);
    while (out.back() == '0') out.pop_back();
    if (out.back() == '.') out.pop_back();
    return out;
}

[[nodiscard]] ELASTIC_DECL std::string duration_text(std::chrono::nanoseconds d, bool spaced) {
    using namespace std::chrono;
    const char* space = spaced ? " " : "";
    const auto ms = duration_cast<milliseconds>(d).count();
    if (ms < 0) return "-" + duration_text(-d, spaced);
    if (ms == 0 && d.count() != 0)
        return detail::format("{}{}ms", thousandths(duration_cast<microseconds>(d).count()), space);
    if (ms != 0 && ms % 3'600'000 == 0) return detail::format("{}{}h", ms / 3'600'000, space);
    if (ms != 0 && ms % 60'000 == 0) return detail::format("{}{}min", ms / 60'000, space);
    if (ms < 1000 && ms != 0) return detail::format("{}{}ms", ms, space);
    return detail::format("{}{}s", thousandths(ms), space);
}

}  // namespace detail::policy
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL std::string duration_flag_text(std::chrono::nanoseconds d) {
    return detail::policy::duration_text(d, false);
}

[[nodiscard]] ELASTIC_DECL std::string duration_words(std::chrono::nanoseconds d) {
    return detail::policy::duration_text(d, true);
}

[[nodiscard]] ELASTIC_DECL std::chrono::milliseconds parse_duration(std::string_view text, std::string_view name,
                                                                    bool allow_zero) {
    const auto word = detail::trim(text);
    std::size_t unit_at = 0;
    while (unit_at < word.size() &&
           (std::isdigit(static_cast<unsigned char>(word[unit_at])) != 0 || word[unit_at] == '.')) {
        ++unit_at;
    }
    const auto number = word.substr(0, unit_at);
    const auto unit = detail::lower(detail::trim(word.substr(unit_at)));
    double value = -1;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value,
                                           std::chars_format::fixed);
    double scale = 0;
    if (unit.empty() || unit == "s") scale = 1;
    else if (unit == "ms") scale = 0.001;
    else if (unit == "m" || unit == "min") scale = 60;
    else if (unit == "h") scale = 3600;
    const double seconds = value * scale;
    // Above 0 is judged after rounding to the millisecond: "0.1ms" would be a zero delay.
    const bool ok = !number.empty() && ec == std::errc{} && end == number.data() + number.size() && scale > 0 &&
                    std::isfinite(seconds) && seconds <= 1e9 && seconds >= 0 &&
                    (allow_zero || std::llround(seconds * 1000.0) > 0);
    if (!ok) {
        throw usage_error{detail::format("{}: want a duration {}such as 500ms, 1.5s, 10min or 1h (a bare number "
                                         "counts seconds)",
                                         detail::show(name, text), allow_zero ? "" : "above 0 ")};
    }
    return std::chrono::milliseconds{std::llround(seconds * 1000.0)};
}

[[nodiscard]] ELASTIC_DECL backoff_spec parse_backoff_spec(std::string_view text, std::string_view name) {
    const auto parts = detail::split(text, ':');
    if (parts.size() < 2 || parts.size() > 3) {
        throw usage_error{detail::format("{}: want INITIAL:CAP or INITIAL:CAP:RESET, such as 1s:1min or 1s:1min:10min",
                                         detail::show(name, text))};
    }
    backoff_spec spec;
    spec.initial = parse_duration(parts[0], name);
    spec.cap = parse_duration(parts[1], name);
    if (parts.size() == 3) spec.reset_after = parse_duration(parts[2], name, true);
    if (spec.cap < spec.initial) {
        throw usage_error{detail::format("{}: the cap ({}) is below the initial delay ({})", detail::show(name, text),
                                         duration_flag_text(spec.cap), duration_flag_text(spec.initial))};
    }
    return spec;
}

[[nodiscard]] ELASTIC_DECL window_spec parse_window_spec(std::string_view text, std::string_view name) {
    const auto parts = detail::split(text, '/');
    if (parts.size() != 2) {
        throw usage_error{detail::format("{}: want N/PERIOD, such as 5/1h (at most 5 restarts in any hour)",
                                         detail::show(name, text))};
    }
    const auto n = detail::to_integer(detail::trim(parts[0]));
    if (!n || *n < 1 || *n > 1'000'000) {
        throw usage_error{detail::format("{}: the number of restarts before '/' must be an integer from 1 to 1000000",
                                         detail::show(name, text))};
    }
    return window_spec{static_cast<int>(*n), parse_duration(parts[1], name)};
}

[[nodiscard]] ELASTIC_DECL exit_code_set parse_exit_code_set(std::string_view text, std::string_view name) {
    exit_code_set set;
    for (const auto raw : detail::split(text, ',')) {
        const auto item = detail::trim(raw);
        const auto word = detail::lower(item);
        if (word == "signals" || word == "signal") {
            set.any_signal = true;
            continue;
        }
        if (word == "hang" || word == "hangs") {
            set.hang = true;
            continue;
        }
        if (word.rfind("sig", 0) == 0) {
            const int found = signal_number(word);
            if (found == 0 || found > 64) {
                throw usage_error{detail::format("{}: '{}' is not a signal name (such as SIGKILL or SIGSEGV)",
                                                 detail::show(name, text), item)};
            }
            set.signals.set(static_cast<std::size_t>(found));
            continue;
        }
        const auto dash = item.find('-', 1);
        const auto first = detail::to_integer(detail::trim(item.substr(0, dash)));
        const auto last = dash == std::string_view::npos ? first
                                                         : detail::to_integer(detail::trim(item.substr(dash + 1)));
        if (!first || !last || *first < 1 || *last > 255 || *first > *last) {
            throw usage_error{detail::format("{}: '{}' is not an exit code 1-255, a range such as 3-5, 'signals', "
                                             "a signal name or 'hang'",
                                             detail::show(name, text), item)};
        }
        for (auto c = *first; c <= *last; ++c) set.codes.set(static_cast<std::size_t>(c));
    }
    return set;
}

[[nodiscard]] ELASTIC_DECL crash_guard_spec parse_crash_guard_spec(std::string_view text, std::string_view name) {
    const auto parts = detail::split(text, ':');
    if (parts.size() > 2) {
        throw usage_error{detail::format("{}: want T or T:N, such as 30s or 30s:3", detail::show(name, text))};
    }
    crash_guard_spec spec;
    spec.within = parse_duration(parts[0], name);
    if (parts.size() == 2) {
        const auto n = detail::to_integer(detail::trim(parts[1]));
        if (!n || *n < 1 || *n > 1'000'000) {
            throw usage_error{
                detail::format("{}: N after ':' must be an integer from 1 to 1000000", detail::show(name, text))};
        }
        spec.in_a_row = static_cast<int>(*n);
    }
    return spec;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
