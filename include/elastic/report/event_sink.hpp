// SPDX-License-Identifier: MIT
// Where the agent's events go (--event-log-handler: null, console, or file:PATH) and
// event_sink, which stamps each event with the agent's clocks and writes it as one JSON line.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/report/event.hpp"
#include "elastic/report/event_destination.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace elastic::inline v0 {

/// Records events where an event_destination says. Each recorded event is stamped with three
/// clocks, all for the same instant (the moment the event happened as the agent knows it; for
/// a worker's exit, when the agent observed it):
/// - `timestamp` (torch's field): wall clock, milliseconds since the epoch;
/// - metadata `monotonic_ns`: the raw steady clock (CLOCK_MONOTONIC on Linux, comparable with
///   what other processes on the host read from it), nanoseconds;
/// - metadata `since_start_ns`: nanoseconds since the sink was made (the agent's start).
/// The wall clock may step (NTP); the monotonic stamps order a log.
///
/// Recording never throws and never blocks on anything but the write itself: an event log must
/// not take the agent down. A line is written with one write(2) (O_APPEND for a file), so lines
/// of several agents sharing a file never mix.
class event_sink {
public:
    /// The null sink: records nothing.
    event_sink() = default;

    /// A sink for `destination`. A file is opened (created, appended) now: throws report_error
    /// naming the path and the reason when it cannot be. `console_fd` is where `console` writes
    /// (stderr, as torch's StreamHandler).
    explicit event_sink(event_destination destination, int console_fd = 2) : destination_(std::move(destination)) {
        switch (destination_.what) {
            case event_destination::kind::console: log_.emplace(event_log::to_descriptor(console_fd)); break;
            case event_destination::kind::file: log_.emplace(event_log(destination_.path)); break;
            case event_destination::kind::null: break;
        }
    }

    /// False for the null sink: callers may skip building events.
    [[nodiscard]] bool enabled() const noexcept { return log_.has_value(); }
    [[nodiscard]] const event_destination& destination() const noexcept { return destination_; }
    /// The steady instant `since_start_ns` counts from.
    [[nodiscard]] std::chrono::steady_clock::time_point origin() const noexcept { return origin_; }

    /// Stamps `e` with the instant (`steady`, `wall`) and writes it. Returns false when nothing
    /// was written (null sink, or a failed write that loses this event only).
    ELASTIC_DECL bool record(event e, std::chrono::steady_clock::time_point steady,
                             std::chrono::system_clock::time_point wall) noexcept;

    /// Stamps `e` with now and writes it.
    bool record(event e) noexcept {
        return record(std::move(e), std::chrono::steady_clock::now(), std::chrono::system_clock::now());
    }

private:
    event_destination destination_;
    std::optional<event_log> log_;
    std::chrono::steady_clock::time_point origin_ = std::chrono::steady_clock::now();
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL bool event_sink::record(event e, std::chrono::steady_clock::time_point steady,
                                     std::chrono::system_clock::time_point wall) noexcept {
    if (!log_) return false;
    try {
        using namespace std::chrono;
        e.timestamp = duration_cast<milliseconds>(wall.time_since_epoch()).count();
        e.metadata["monotonic_ns"] = static_cast<std::int64_t>(
            duration_cast<nanoseconds>(steady.time_since_epoch()).count());
        e.metadata["since_start_ns"] = static_cast<std::int64_t>(duration_cast<nanoseconds>(steady - origin_).count());
        return log_->record(e);
    } catch (...) {
        return false;
    }
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
