// SPDX-License-Identifier: MIT
// backoff: wait before each restart, exponentially longer for failures in a row, capped, with
// jitter, and starting over after a healthy period (--restart-backoff=INITIAL:CAP[:RESET]).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/random.hpp"
#include "elastic/policy/clock.hpp"
#include "elastic/policy/combinators.hpp"
#include "elastic/policy/concepts.hpp"
#include "elastic/policy/spec.hpp"

#include <asio/awaitable.hpp>
#include "elastic/detail/format.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace elastic::inline v0 {

/// A source of numbers uniform in [0, 1) for jitter; tests pass a fixed one.
using uniform_source = std::function<double()>;

/// A uniform_source over std::mt19937_64 seeded from the kernel's random bits.
[[nodiscard]] ELASTIC_DECL uniform_source random_uniform_source();

/// Exponential backoff. Before the k-th restart in a row (k = 0, 1, ...) it waits
///     min(cap, initial * factor^k) * (1 - jitter * u),   u uniform in [0, 1),
/// so jitter only shortens a delay and the cap holds. A failure after the group ran healthy for
/// `reset_after` or longer starts over at k = 0. It always answers restart: pair it with a
/// budget (`max_restarts(5) | backoff(1s, 1min)`).
template <policy_clock Clock = steady_policy_clock>
class basic_backoff : public named_policy {
public:
    explicit basic_backoff(backoff_spec spec, Clock clock = Clock{}, uniform_source uniform = random_uniform_source())
        : spec_(spec), clock_(std::move(clock)), uniform_(std::move(uniform)) {
        if (spec_.initial <= spec_.initial.zero() || spec_.cap < spec_.initial) {
            throw std::invalid_argument(detail::format("backoff({}, {}): want 0 < initial <= cap",
                                                       duration_flag_text(spec_.initial),
                                                       duration_flag_text(spec_.cap)));
        }
        if (!(spec_.factor >= 1.0) || !std::isfinite(spec_.factor) || !(spec_.jitter >= 0.0 && spec_.jitter < 1.0) ||
            spec_.reset_after < spec_.reset_after.zero()) {
            throw std::invalid_argument(
                detail::format("backoff: want factor >= 1 (got {}), 0 <= jitter < 1 (got {}), reset_after >= 0",
                               spec_.factor, spec_.jitter));
        }
        if (!uniform_) uniform_ = random_uniform_source();
    }
    /// backoff(1s, 1min): the default factor 2, jitter 10 % and reset after 10 min.
    basic_backoff(std::chrono::milliseconds initial, std::chrono::milliseconds cap, Clock clock = Clock{})
        : basic_backoff(backoff_spec{initial, cap}, std::move(clock)) {}

    [[nodiscard]] const backoff_spec& spec() const noexcept { return spec_; }
    /// Restarts counted in the current run of failures (0 after a reset).
    [[nodiscard]] int in_a_row() const noexcept { return in_a_row_; }

    restart_plan plan(const group_failure& failure) {
        const bool reset = failure.healthy_for() >= spec_.reset_after;
        const int k = reset ? 0 : in_a_row_;
        const double initial_s = std::chrono::duration<double>(spec_.initial).count();
        const double cap_s = std::chrono::duration<double>(spec_.cap).count();
        // pow can overflow to inf for large k: min() with the cap handles it.
        const double base = std::min(cap_s, initial_s * std::pow(spec_.factor, k));
        const double u = std::clamp(uniform_(), 0.0, 1.0);
        const double seconds = base * (1.0 - spec_.jitter * u);
        const auto delay = std::chrono::round<std::chrono::milliseconds>(std::chrono::duration<double>(seconds));
        pending_ = k + 1;
        std::string why = detail::format("after {} backoff (failure {} in a row", duration_words(delay), k + 1);
        if (reset && in_a_row_ > 0) why += detail::format(", after {} healthy", duration_words(failure.healthy_for()));
        why += detail::format("; {})", named());
        return {restart_decision::restart_because(std::move(why)), delay};
    }
    asio::awaitable<void> wait(std::chrono::steady_clock::duration d) { return clock_.sleep(d); }
    void commit(const group_failure&) { in_a_row_ = pending_; }

    asio::awaitable<restart_decision> operator()(const group_failure& failure) {
        return detail::policy::run_planned(*this, failure);
    }

private:
    /// How reasons cite this policy (named_policy).
    [[nodiscard]] std::string named() const { return this->cite(spec_.code(), spec_.flag()); }

    backoff_spec spec_;
    Clock clock_;
    uniform_source uniform_;
    int in_a_row_ = 0;
    int pending_ = 0;
};

/// The production backoff (steady clock, random jitter).
using backoff = basic_backoff<>;

static_assert(planned_restart_policy<backoff>);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL uniform_source random_uniform_source() {
    return [engine = std::mt19937_64{detail::random_u64()}]() mutable {
        return std::uniform_real_distribution<double>(0.0, 1.0)(engine);
    };
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
