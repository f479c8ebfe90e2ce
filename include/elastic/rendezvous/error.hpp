// elastic::rendezvous_error: the nodes of a job could not agree on a round (a timeout, a store
// that vanished, a rendezvous owned by another launcher). elasticrun exits with its own code.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/error.hpp"

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

}  // namespace elastic::inline v0
