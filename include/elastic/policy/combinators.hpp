// SPDX-License-Identifier: MIT
// Composing restart policies: `a | b` (policy_chain), the planned_restart_policy protocol of the
// built-in models (decide, then wait, then count), optional_policy and any_restart_policy.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/policy/concepts.hpp"

#include <asio/awaitable.hpp>

#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace elastic::inline v0 {

/// What a planned policy would answer, before anything is awaited or counted.
struct restart_plan {
    restart_decision decision;
    /// Awaited (through the policy's wait()) before the restart; zero for none.
    std::chrono::steady_clock::duration delay{};
};

/*
 * planned_restart_policy: a restart_policy split in three steps, so that a chain can ask every
 * part before any of them waits or counts.
 *
 *   restart_plan plan(const group_failure&);          // decide; no waiting, no state change
 *   asio::awaitable<void> wait(steady_clock::duration);  // the delay, on the policy's clock
 *   void commit(const group_failure&);                 // the restart is happening: count it
 *
 * Calling the policy alone is plan(), then on restart wait(delay) and commit(): every built-in
 * model (backoff, restart_window, exit_code_policy, crash_loop_guard) is one.
 */
// clang-format off
template <class P>
concept planned_restart_policy =
    restart_policy<P> && requires(P& p, const group_failure& f, std::chrono::steady_clock::duration d) {
        { p.plan(f) } -> std::same_as<restart_plan>;
        { p.wait(d) } -> std::same_as<asio::awaitable<void>>;
        p.commit(f);
    };
// clang-format on

namespace detail::policy {

/// A planned policy called alone: plan, wait, count. A cancelled wait counts nothing.
template <class P>
asio::awaitable<restart_decision> run_planned(P& policy, const group_failure& failure) {
    auto plan = policy.plan(failure);
    if (plan.decision.restart()) {
        if (plan.delay > std::chrono::steady_clock::duration::zero()) {
            if (failure.before_delay) failure.before_delay(plan.decision, plan.delay);
            co_await policy.wait(plan.delay);
        }
        policy.commit(failure);
    }
    co_return std::move(plan.decision);
}

}  // namespace detail::policy

/// `a | b | c`: every part is consulted in order; the first to answer stop decides (its reason,
/// and nothing after it is asked); when all answer restart the delays add up and the reasons are
/// joined with "; ". Planned parts (the built-in models) only plan while the chain asks: their
/// delays are awaited after the last part has said restart (announced first, once, through
/// group_failure::before_delay), then every planned part counts the restart. So a later stop
/// never costs an earlier backoff, and a budget counts only restarts that happen. Any other part
/// is awaited in its turn (it may wait for whatever it likes).
template <class... Parts>
class policy_chain {
    static_assert(sizeof...(Parts) > 0, "a policy_chain needs a part");

public:
    explicit policy_chain(Parts... parts) : parts_(std::move(parts)...) {}
    explicit policy_chain(std::tuple<Parts...> parts) : parts_(std::move(parts)) {}

    asio::awaitable<restart_decision> operator()(const group_failure& failure) {
        progress p;
        auto stop = co_await consult<0>(failure, p);
        if (stop) co_return std::move(*stop);
        auto decision = restart_decision::restart_because(std::move(p.reason));
        std::chrono::steady_clock::duration total{};
        for (const auto d : p.delays) total += d;
        if (total > total.zero() && failure.before_delay) failure.before_delay(decision, total);
        co_await wait_all<0>(p);
        commit_all<0>(failure);
        co_return decision;
    }

    /// The parts, for inspection (a test's, or a launcher's log).
    [[nodiscard]] std::tuple<Parts...>& parts() noexcept { return parts_; }
    [[nodiscard]] const std::tuple<Parts...>& parts() const noexcept { return parts_; }
    [[nodiscard]] std::tuple<Parts...> release() && { return std::move(parts_); }

private:
    struct progress {
        std::array<std::chrono::steady_clock::duration, sizeof...(Parts)> delays{};
        std::string reason;

        void add(const std::string& why) {
            if (why.empty()) return;
            if (!reason.empty()) reason += "; ";
            reason += why;
        }
    };

    template <std::size_t I>
    asio::awaitable<std::optional<restart_decision>> consult(const group_failure& failure, progress& p) {
        if constexpr (I == sizeof...(Parts)) {
            co_return std::nullopt;
        } else {
            auto& part = std::get<I>(parts_);
            if constexpr (planned_restart_policy<std::tuple_element_t<I, std::tuple<Parts...>>>) {
                auto plan = part.plan(failure);
                if (!plan.decision.restart()) co_return std::move(plan.decision);
                p.delays[I] = plan.delay;
                p.add(plan.decision.reason);
            } else {
                // The chain announces the restart, once, with every part's reason: a part is
                // not to announce one of its own (a chain inside an any_restart_policy would).
                // Named: g++ 12 destroys a prvalue argument of a co_awaited call twice.
                const group_failure quiet = unannounced(failure);
                auto decision = co_await part(quiet);
                if (!decision.restart()) co_return std::move(decision);
                p.add(decision.reason);
            }
            co_return co_await consult<I + 1>(failure, p);
        }
    }

    /// `failure` without its before_delay, for a part that is not planned.
    static group_failure unannounced(const group_failure& failure) {
        group_failure copy = failure;
        copy.before_delay = nullptr;
        return copy;
    }

    template <std::size_t I>
    asio::awaitable<void> wait_all(const progress& p) {
        if constexpr (I < sizeof...(Parts)) {
            if constexpr (planned_restart_policy<std::tuple_element_t<I, std::tuple<Parts...>>>) {
                if (p.delays[I] > std::chrono::steady_clock::duration::zero()) {
                    co_await std::get<I>(parts_).wait(p.delays[I]);
                }
            }
            co_await wait_all<I + 1>(p);
        }
        co_return;
    }

    template <std::size_t I>
    void commit_all(const group_failure& failure) {
        if constexpr (I < sizeof...(Parts)) {
            if constexpr (planned_restart_policy<std::tuple_element_t<I, std::tuple<Parts...>>>) {
                std::get<I>(parts_).commit(failure);
            }
            commit_all<I + 1>(failure);
        }
    }

    std::tuple<Parts...> parts_;
};

namespace detail::policy {

template <class T>
struct is_chain : std::false_type {};
template <class... Ps>
struct is_chain<policy_chain<Ps...>> : std::true_type {};

template <class P>
auto parts_of(P&& p) {
    using D = std::remove_cvref_t<P>;
    if constexpr (is_chain<D>::value) {
        if constexpr (std::is_lvalue_reference_v<P>) {
            return p.parts();
        } else {
            return std::move(p).release();
        }
    } else {
        return std::tuple<D>(std::forward<P>(p));
    }
}

template <class... Ps>
policy_chain<Ps...> chain_of_tuple(std::tuple<Ps...>&& parts) {
    return policy_chain<Ps...>(std::move(parts));
}

}  // namespace detail::policy

/// A chain of the given policies, flattened (a chain given as a part contributes its parts).
// clang-format off
template <class... Ps>
    requires(sizeof...(Ps) > 0 && (restart_policy<std::remove_cvref_t<Ps>> && ...))
auto chain(Ps&&... policies) {
    // clang-format on
    return detail::policy::chain_of_tuple(std::tuple_cat(detail::policy::parts_of(std::forward<Ps>(policies))...));
}

/// `a | b`: chain(a, b) (see policy_chain). Found by argument-dependent lookup when either side
/// is an elastic type; for two policies of your own write `elastic::chain(a, b)` or
/// `using elastic::operator|;`.
// clang-format off
template <class A, class B>
    requires restart_policy<std::remove_cvref_t<A>> && restart_policy<std::remove_cvref_t<B>>
auto operator|(A&& a, B&& b) {
    return chain(std::forward<A>(a), std::forward<B>(b));
}
// clang-format on

/// A planned policy that may be absent (a flag not given): absent, it answers restart with no
/// reason, no delay and nothing to count.
// clang-format off
template <class P>
    requires planned_restart_policy<P>
class optional_policy {
    // clang-format on
public:
    optional_policy() = default;
    explicit optional_policy(std::optional<P> policy) : policy_(std::move(policy)) {}

    [[nodiscard]] bool has_value() const noexcept { return policy_.has_value(); }
    [[nodiscard]] P* get() noexcept { return policy_ ? &*policy_ : nullptr; }

    restart_plan plan(const group_failure& failure) {
        if (!policy_) return {restart_decision::restart_because({}), {}};
        return policy_->plan(failure);
    }
    asio::awaitable<void> wait(std::chrono::steady_clock::duration d) {
        if (policy_) co_await policy_->wait(d);
    }
    void commit(const group_failure& failure) {
        if (policy_) policy_->commit(failure);
    }
    asio::awaitable<restart_decision> operator()(const group_failure& failure) {
        return detail::policy::run_planned(*this, failure);
    }

private:
    std::optional<P> policy_;
};

/// Any restart policy behind one type (one allocation), for a policy chosen at run time.
/// Calls forward to the held policy, whose awaitable it returns as is.
class any_restart_policy {
public:
    // clang-format off
    template <class P>
        // The same_as test first: it short-cuts the check of restart_policy<any_restart_policy>,
        // which would ask for this very constructor again (clang recurses).
        requires(!std::same_as<std::remove_cvref_t<P>, any_restart_policy>) && restart_policy<std::remove_cvref_t<P>>
    any_restart_policy(P&& policy)  // NOLINT(google-explicit-constructor): a policy is one
        : impl_(std::make_unique<model<std::remove_cvref_t<P>>>(std::forward<P>(policy))) {}
    // clang-format on

    asio::awaitable<restart_decision> operator()(const group_failure& failure) { return impl_->call(failure); }

private:
    struct base {
        virtual ~base() = default;
        virtual asio::awaitable<restart_decision> call(const group_failure& failure) = 0;
    };
    template <class P>
    struct model final : base {
        explicit model(P p) : policy(std::move(p)) {}
        asio::awaitable<restart_decision> call(const group_failure& failure) override { return policy(failure); }
        P policy;
    };
    std::unique_ptr<base> impl_;
};

static_assert(restart_policy<any_restart_policy>);

}  // namespace elastic::inline v0
