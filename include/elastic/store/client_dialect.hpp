// SPDX-License-Identifier: MIT
// client_dialect: which wire dialect a TCP store client speaks, apart from the client itself so
// that options naming it (elastic::dist::group_options) need not parse the client.
#pragma once

#include "elastic/detail/config.hpp"

#include <cstdint>

namespace elastic::inline v0 {

/// Which wire dialect a client speaks: the current one (PyTorch >= 2.2) or the legacy one (1.13 to
/// 2.1); docs/store-client.md explains why a stall during detection means legacy.
enum class client_dialect : std::uint8_t {
    /// Try the current handshake (VALIDATE + PING); a reset, an EOF or a stall (no PING echo
    /// within `detect_timeout`) means a PyTorch <= 2.1 server: reconnect in the legacy dialect.
    /// The answer is kept for reconnections.
    detect,
    current,  ///< PyTorch >= 2.2 servers (and ours): VALIDATE + PING first; no fallback
    legacy,   ///< PyTorch 1.13 servers (and ours): no handshake, SET = 0
};

}  // namespace elastic::inline v0
