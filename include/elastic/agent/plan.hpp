// SPDX-License-Identifier: MIT
// What the agent settles before anything starts: the checks of its worker_spec and
// rendezvous_parameters (a usage_error naming what is wrong or not implemented yet), and where
// the workers' store goes (store_plan).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/agent/spec.hpp"
#include "elastic/rendezvous/parameters.hpp"
#include "elastic/rendezvous/tcp_rendezvous.hpp"
#include "elastic/usage_error.hpp"

#include "elastic/detail/format.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace elastic::inline v0::detail::agent {

/// How the agent hosts the workers' store: where it binds and what MASTER_ADDR says.
struct store_plan {
    std::string bind_host;
    std::uint16_t port = 0;  ///< 0: a port the kernel chooses, anew for each attempt
    std::string master_addr;
};

ELASTIC_DECL store_plan plan_store(const rendezvous_parameters& c);

ELASTIC_DECL std::string nnodes_text(const node_range& n);

/// Refuses, before anything starts, what this agent does not implement yet (a later issue
/// does): a usage_error (exit 2) saying so. Never parse-and-ignore.
ELASTIC_DECL void check_supported(const rendezvous_parameters& c);

/// A worker_spec filled in C++ (the command line's are validated already): a count of workers
/// and a grace the agent can use, else a usage_error naming the field.
ELASTIC_DECL void check_spec(const worker_spec& w);

}  // namespace elastic::inline v0::detail::agent

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::agent {

ELASTIC_DECL store_plan plan_store(const rendezvous_parameters& c) {
    const auto& endpoint = c.endpoint;
    store_plan plan;
    if (uses_node_rendezvous(c)) {
        // Several nodes: each hosts a fresh workers' store per attempt on a port the kernel picks
        // and advertises it; the round names group rank 0's as MASTER_ADDR:MASTER_PORT
        // (docs/rendezvous.md). The rendezvous endpoint's port is the rendezvous store's.
        const auto where = advertise(c);
        plan.bind_host = where.bind_host;
        plan.master_addr = where.addr;
        return plan;
    }
    // Static: only a port given explicitly (--master-port or --rdzv-endpoint) is bound; torchrun's
    // default 29500 would make two jobs on one host collide, and one node needs no agreed port.
    // c10d: the endpoint's port (0 under --standalone).
    plan.port = c.port_given ? endpoint.port.value_or(0) : 0;
    if (rendezvous::is_loopback(endpoint.host)) {
        // "localhost" may resolve to ::1 for one process and 127.0.0.1 for another: bind and
        // advertise the literal.
        plan.bind_host = rendezvous::is_ip_literal(endpoint.host) ? endpoint.host : std::string("127.0.0.1");
        plan.master_addr = plan.bind_host;
    } else {
        // A name or address of this host: listen where it resolves to on this node (a name
        // resolving to none of this node's addresses: every interface, as TCPStore does).
        plan.bind_host = rendezvous::bind_address_for(endpoint.host);
        plan.master_addr = endpoint.host;
    }
    if (c.local_addr) plan.master_addr = *c.local_addr;
    return plan;
}

ELASTIC_DECL std::string nnodes_text(const node_range& n) {
    return n.min == n.max ? detail::format("{}", n.min) : detail::format("{}:{}", n.min, n.max);
}

ELASTIC_DECL void check_supported(const rendezvous_parameters& c) {
    if (c.nnodes.min != c.nnodes.max && c.backend == rendezvous_backend::static_) {
        throw usage_error{detail::format("--nnodes={} with --rdzv-backend=static: the static rendezvous has fixed "
                                         "membership; use --rdzv-backend=c10d for MIN < MAX, or --nnodes={}",
                                         nnodes_text(c.nnodes), c.nnodes.max)};
    }
    if (c.backend == rendezvous_backend::c10d && c.settings.is_host && !*c.settings.is_host &&
        c.endpoint.port.value_or(0) == 0) {
        throw usage_error{detail::format("--rdzv-endpoint={} with --rdzv-conf is_host=false: port 0 names no store to "
                                         "join; give the port the hosting agent listens on",
                                         to_string(c.endpoint))};
    }
    if (c.run_id.empty()) {
        throw usage_error{"--rdzv-id: must not be empty (it names the job in the rendezvous store)"};
    }
    if (c.backend == rendezvous_backend::etcd_v3 && c.run_id.find('/') != std::string::npos) {
        // A job's keys are deleted by prefix in etcd when it ends: "team" would take "team/x"'s.
        throw usage_error{detail::format("--rdzv-id={}: with etcd-v3 the id must not hold '/' (a job's keys are a "
                                         "prefix of etcd's, cleared when it ends, and would hold another job's)",
                                         c.run_id)};
    }
    if (detail::format("/{}/", c.run_id).find("/__lease__/") != std::string::npos) {
        // The store keeps leases under <group>/__lease__/: an id with such a segment would put
        // the job's own keys where the store reads lease names.
        throw usage_error{detail::format("--rdzv-id={}: a path segment '__lease__' is reserved for the rendezvous "
                                         "store's leases; choose an id without one",
                                         c.run_id)};
    }
}

ELASTIC_DECL void check_spec(const worker_spec& w) {
    if (w.nproc_per_node < 1) {
        throw usage_error{detail::format("worker_spec.nproc_per_node={}: must be 1 or more", w.nproc_per_node)};
    }
    if (w.shutdown_timeout < std::chrono::milliseconds::zero()) {
        throw usage_error{
            detail::format("worker_spec.shutdown_timeout={} ms: must be 0 or more", w.shutdown_timeout.count())};
    }
}

}  // namespace elastic::inline v0::detail::agent

#endif  // ELASTIC_DETAIL_BODIES
