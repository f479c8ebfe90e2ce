// SPDX-License-Identifier: MIT
// The rendezvous layer: how the agents of a job agree on a round (docs/rendezvous.md).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/rendezvous/codec.hpp"
#include "elastic/rendezvous/concepts.hpp"
#include "elastic/rendezvous/error.hpp"
#include "elastic/rendezvous/membership.hpp"
#include "elastic/rendezvous/parameters.hpp"
#include "elastic/rendezvous/planner.hpp"
#include "elastic/rendezvous/single_node.hpp"
#include "elastic/rendezvous/store_rendezvous.hpp"
#include "elastic/rendezvous/tcp_rendezvous.hpp"
