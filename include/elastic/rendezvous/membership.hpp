// SPDX-License-Identifier: MIT
// What a node learns of the job's membership from its lease connection: the lease losses in
// order, and whether the store itself was lost (docs/rendezvous.md, "Elastic membership").
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/error.hpp>
#include <asio/this_coro.hpp>
#include "elastic/detail/format.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

namespace detail::rendezvous {

/// A lease name as a person reads it: "host (pid N)" from "host:pid:tag".
ELASTIC_DECL std::string describe_node_id(std::string_view id);

/// What the node's lease connection learnt of the job's membership (docs/rendezvous.md,
/// "Elastic membership"), shared by the monitor and whoever waits for a change.
template <class Defer = void>
struct basic_membership_log {
    explicit basic_membership_log(const asio::any_io_executor& executor) : wake(executor) {}
    std::vector<std::pair<std::int64_t, std::string>> lost;  ///< (epoch, lease name), in order
    std::int64_t epoch = 0;                                  ///< the last loss seen (the group's __epoch)
    std::optional<std::string> store_lost;                   ///< why the lease connection ended
    async_signal wake;                                       ///< notified at each change: wakes every waiter

    void changed() { wake.notify(); }
    /// Completes at the next change; throws operation_aborted once cancelled (so no loop
    /// over it can spin on a cancelled wait).
    asio::awaitable<void> next() {
        co_await wake.wait();
        const auto state = co_await asio::this_coro::cancellation_state;
        if (state.cancelled() != asio::cancellation_type::none) {
            throw std::system_error(asio::error::operation_aborted, "membership wait cancelled");
        }
    }
    /// Completes when the store is lost, with why.
    asio::awaitable<std::string> until_store_lost() {
        while (!store_lost) co_await next();
        co_return *store_lost;
    }
};
using membership_log = basic_membership_log<>;

}  // namespace detail::rendezvous

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::rendezvous {

ELASTIC_DECL std::string describe_node_id(std::string_view id) {
    const auto last = id.rfind(':');
    if (last == std::string_view::npos || last == 0) return std::string(id);
    const auto mid = id.rfind(':', last - 1);
    if (mid == std::string_view::npos) return std::string(id);
    return detail::format("{} (pid {})", id.substr(0, mid), id.substr(mid + 1, last - mid - 1));
}

}  // namespace detail::rendezvous
}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
