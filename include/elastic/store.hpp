// SPDX-License-Identifier: MIT
// The store layer: the store concepts, the in-memory and prefix models, the wire codec, the TCP
// server and the TCP client (PyTorch's TCPStore protocol, both dialects), and leases.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/store/blocking_client.hpp"
#include "elastic/store/client.hpp"
#include "elastic/store/client_connection.hpp"
#include "elastic/store/client_dialect.hpp"
#include "elastic/store/client_leases.hpp"
#include "elastic/store/concepts.hpp"
#include "elastic/store/engine.hpp"
#include "elastic/store/errors.hpp"
#include "elastic/store/lease.hpp"
#include "elastic/store/memory_store.hpp"
#include "elastic/store/prefix_store.hpp"
#include "elastic/store/server.hpp"
#include "elastic/store/server_accept.hpp"
#include "elastic/store/server_connection.hpp"
#include "elastic/store/server_core.hpp"
#include "elastic/store/server_leases.hpp"
#include "elastic/store/wire.hpp"

namespace elastic::inline v0 {

static_assert(store<prefix_store<memory_store>>);
static_assert(multi_key_store<prefix_store<memory_store>>);
static_assert(store<prefix_store<prefix_store<memory_store>>>);

}  // namespace elastic::inline v0
