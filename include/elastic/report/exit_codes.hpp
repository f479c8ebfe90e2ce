// SPDX-License-Identifier: MIT
// elasticrun's exit codes (docs/exit-codes.md): the root cause's code on a worker failure, and
// fixed codes for a usage error, a rendezvous error and the agent's own failure.
#pragma once

#include "elastic/detail/config.hpp"

namespace elastic::inline v0::exit_codes {

// Schedulers act on these (Kubernetes' podFailurePolicy onExitCodes, Slurm's job state), so they
// must be told apart from what a worker passes through: a worker's own code 1..255 and 128 + N
// for signal N (129..192, N <= SIGRTMAX = 64). The agent's codes stay clear of every convention
// a worker or a wrapper commonly produces: 1 (any error, Python's uncaught exception), 2
// (argparse, torchrun), 64..78 (sysexits.h, e.g. a worker's "requeue me" 75), 124..127
// (timeout(1), docker, the shell's "cannot execute" / "not found"), 129..192 (signals),
// 200..243 (systemd decodes these as its own set-up failures: `status=243/CREDENTIALS`), and 255
// (exit(-1)). A worker that exits 250 or 251 itself still collides: the agent's error file
// ($TORCHELASTIC_ERROR_FILE) and the failure summary say which it was.

/// Every worker succeeded.
inline constexpr int success = 0;
/// The command line or the launch_config is invalid, or asks for something not implemented;
/// nothing was started (argparse's and torchrun's 2).
inline constexpr int usage = 2;
/// A worker failed and was not restarted, but the root cause reads as success (it exited 0
/// though judged failed): never report a failure as 0.
inline constexpr int failure_without_code = 1;
/// The rendezvous failed (elastic::rendezvous_error): the nodes could not agree on a round
/// (a timeout, an unreachable or vanished store, a run owned by another launcher). Often worth
/// retrying the whole job: nothing is wrong with the program.
inline constexpr int rendezvous = 250;
/// The agent itself failed (elastic::agent_error, or any unexpected exception): a directory it
/// cannot create, a store it cannot host, a worker it cannot start after validation.
inline constexpr int internal = 251;
/// The agent received signal N (and forwarded it to the workers): 128 + N, the shell's code.
[[nodiscard]] constexpr int signal(int number) noexcept { return 128 + number; }

}  // namespace elastic::inline v0::exit_codes
