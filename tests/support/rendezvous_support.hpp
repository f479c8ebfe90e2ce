// Helpers for the rendezvous tests: a node's info as the tests make it.
#pragma once

#include <elastic/rendezvous/concepts.hpp>

#include <cstdint>
#include <string>

namespace rendezvous_support {

/// Node `i`: host "node<i>", its workers' store at 10.0.0.<i>:<1000 + i>, pid 100 + i.
inline elastic::node_info test_node(int i, int nproc = 1) {
    elastic::node_info n;
    n.host = "node" + std::to_string(i);
    n.store_addr = "10.0.0." + std::to_string(i);
    n.store_port = static_cast<std::uint16_t>(1000 + i);
    n.nproc = nproc;
    n.pid = 100 + i;
    return n;
}

}  // namespace rendezvous_support
