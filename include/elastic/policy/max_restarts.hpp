// SPDX-License-Identifier: MIT
// max_restarts(n): the default restart policy, torchrun's --max-restarts budget.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/policy/concepts.hpp"
#include "elastic/policy/spec.hpp"

#include <asio/awaitable.hpp>
#include "elastic/detail/format.hpp"

#include <stdexcept>
#include <string>

namespace elastic::inline v0 {

/// torchrun's restart budget: restart the group at once while fewer than `n` restarts have
/// been made in the job, then stop. `--max-restarts` builds it (default 0: never restart).
///
/// It counts with `group_failure::restarts` (the job's count, which the agent keeps) rather
/// than a counter of its own, so a copy of the policy, or one built again after a membership
/// change, answers the same.
class max_restarts : public named_policy {
public:
    /// `n` >= 0 restarts allowed in the job.
    explicit max_restarts(int n) : budget_(n) {
        if (n < 0) {
            throw std::invalid_argument(detail::format("max_restarts({}): the budget must be 0 or more", n));
        }
    }

    /// The budget.
    [[nodiscard]] int budget() const noexcept { return budget_; }

    template <class Defer = void>  // a template: compiled only where it is called
    asio::awaitable<restart_decision> operator()(const group_failure& failure) const {
        const auto named = cite(detail::format("max_restarts({})", budget_),
                                detail::format("--max-restarts={}", budget_));
        if (failure.restarts < budget_) {
            co_return restart_decision::restart_because(detail::format("restart {} of {} ({})", failure.restarts + 1,
                                                                       budget_, named));
        }
        co_return restart_decision::stop_because(
            budget_ == 0 ? detail::format("no restarts allowed ({})", named)
                         : detail::format("the restart budget is spent: {} of {} restarts made ({})", failure.restarts,
                                          budget_, named));
    }

private:
    int budget_;
};

static_assert(restart_policy<max_restarts>);

}  // namespace elastic::inline v0
