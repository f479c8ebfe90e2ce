// SPDX-License-Identifier: MIT
// elastic::rendezvous_error: the nodes of a job could not agree on a round (a timeout, a store
// that vanished, a rendezvous owned by another launcher). elasticrun exits with its own code.
// elastic::store_lost_error: the rendezvous store itself is gone (a store_error).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/error.hpp"
#include "elastic/store/errors.hpp"

#include <string>
#include <utility>

namespace elastic::inline v0 {

/// The rendezvous failed: the message names what was awaited (which nodes, which key, for how
/// long) and the remedy. No worker of the failed round was started.
class rendezvous_error : public error {
public:
    using error::error;
};

/// The job ended while this node waited as a standby (its round was full): not a failure;
/// elasticrun exits 0 with the message.
class rendezvous_closed : public rendezvous_error {
public:
    using rendezvous_error::rendezvous_error;
};

/// The rendezvous store is lost: the connection that held this node's lease ended (the store's
/// host died, or the network between them failed), so every operation of the rendezvous ends with
/// this error instead of waiting for its timeout. what() is "lost the rendezvous store: <reason>";
/// reason() is why the connection ended. The agent catches it by type: an elastic job moves its
/// rendezvous to a member's spare store, any other job ends with a rendezvous_error.
class store_lost_error : public store_error {
public:
    explicit store_lost_error(std::string reason)
        : store_error("lost the rendezvous store: " + reason), reason_(std::move(reason)) {}

    /// Why the lease connection ended, as the store client reported it.
    [[nodiscard]] const std::string& reason() const noexcept { return reason_; }

private:
    std::string reason_;
};

}  // namespace elastic::inline v0
