// SPDX-License-Identifier: MIT
// no_progress: a job whose restarts no longer move it forward is stopped — N failed attempts in
// a row that did not take the workers' progress (elastic::progress, read by --watchdog) past the
// best any earlier attempt reached (--restart-no-progress=N).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/policy/combinators.hpp"
#include "elastic/policy/concepts.hpp"
#include "elastic/policy/spec.hpp"

#include <asio/awaitable.hpp>
#include "elastic/detail/format.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace elastic::inline v0 {

/// Stops the job at the `n`-th failed attempt in a row whose progress (group_failure::progress:
/// the largest elastic::progress() value this node's workers reported) is not above the best of
/// every earlier attempt. An attempt that reported none made none. An attempt that went further
/// restarts and clears the count.
class no_progress : public named_policy {
public:
    explicit no_progress(int n) : n_(n) {
        if (n_ < 1) throw std::invalid_argument(detail::format("no_progress({}): want N >= 1", n_));
    }

    [[nodiscard]] int limit() const noexcept { return n_; }

    ELASTIC_DECL restart_plan plan(const group_failure& failure);
    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<void> wait(std::chrono::steady_clock::duration) {
        co_return;
    }
    void commit(const group_failure&) {
        stalled_ = pending_;
        best_ = pending_best_;
    }

    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<restart_decision> operator()(const group_failure& failure) {
        return detail::policy::run_planned(*this, failure);
    }

private:
    [[nodiscard]] ELASTIC_DECL std::string named() const;

    int n_;
    int stalled_ = 0;
    int pending_ = 0;
    std::optional<std::uint64_t> best_;
    std::optional<std::uint64_t> pending_best_;
};

static_assert(planned_restart_policy<no_progress>);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL restart_plan no_progress::plan(const group_failure& failure) {
    const auto& got = failure.progress;
    const bool advanced = got && (!best_ || *got > *best_);
    pending_best_ = advanced ? got : best_;
    pending_ = advanced ? 0 : stalled_ + 1;
    const auto reached = got ? detail::format("progress {}", *got) : std::string("no progress reported");
    const auto best = best_ ? detail::format("the best so far is {}", *best_) : std::string("none reported before");
    if (advanced) {
        return {restart_decision::restart_because(detail::format("{}, past {} ({})", reached,
                                                                 best_ ? detail::format("{}", *best_) : "nothing",
                                                                 named())),
                {}};
    }
    if (pending_ >= n_) {
        return {restart_decision::stop_because(detail::format("{} ({}): {} failed attempt{} in a row made no progress, "
                                                              "stopping ({})",
                                                              reached, best, pending_, pending_ == 1 ? "" : "s",
                                                              named())),
                {}};
    }
    return {restart_decision::restart_because(detail::format("{} ({}): {} of {} attempts in a row without progress "
                                                             "allowed ({})",
                                                             reached, best, pending_, n_ - 1, named())),
            {}};
}

ELASTIC_DECL std::string no_progress::named() const {
    return cite(detail::format("no_progress({})", n_), detail::format("--restart-no-progress={}", n_));
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
