// SPDX-License-Identifier: MIT
// What a rendezvous takes: the backend, the endpoint, the job's id, how many nodes, and the
// settings of `--rdzv-conf` (rendezvous_parameters). The launch layer makes one from the command
// line (launch_config::rendezvous()); a custom launcher may fill one itself.
#pragma once

#include "elastic/detail/config.hpp"

#include "elastic/detail/format.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace elastic::inline v0 {

using namespace std::chrono_literals;

/// `--nnodes`: how many nodes (agents) the job has, fixed (`N`, min == max) or elastic (`MIN:MAX`).
struct node_range {
    int min = 1;  ///< the job starts once this many nodes have joined
    int max = 1;  ///< nodes beyond this wait as standbys
    friend bool operator==(const node_range&, const node_range&) = default;
};

/// A `host[:port]` endpoint; an IPv6 host is written in brackets (`[::1]:29400`) and held without.
struct host_port {
    std::string host;
    std::optional<std::uint16_t> port;  ///< absent: the backend's default port
    friend bool operator==(const host_port&, const host_port&) = default;
};

/// The rendezvous implementation (`--rdzv-backend`).
enum class rendezvous_backend {
    static_,  ///< "static": fixed membership; node 0 hosts a store at --master-addr:--master-port
    c10d,     ///< "c10d": dynamic membership over a TCP store hosted by one agent
    etcd_v3,  ///< "etcd-v3": dynamic membership over an etcd server's v3 API
};

/// The name of a backend as written on the command line.
[[nodiscard]] constexpr std::string_view to_string(rendezvous_backend backend) noexcept {
    switch (backend) {
        case rendezvous_backend::static_: return "static";
        case rendezvous_backend::c10d: return "c10d";
        case rendezvous_backend::etcd_v3: return "etcd-v3";
    }
    return "?";
}

/// The default port of a backend's endpoint (torchrun's: 29400 for c10d, 2379 for etcd; the
/// static backend's endpoint is --master-addr:--master-port).
[[nodiscard]] constexpr std::uint16_t default_rendezvous_port(rendezvous_backend backend) noexcept {
    switch (backend) {
        case rendezvous_backend::static_: return 29500;
        case rendezvous_backend::c10d: return 29400;
        case rendezvous_backend::etcd_v3: return 2379;
    }
    return 0;
}

/// Settings of the rendezvous from `--rdzv-conf key=value,...`, with torchrun's defaults. Which
/// keys a backend reads is in docs/cli.md; a key the chosen backend does not read is an error.
struct rendezvous_settings {
    std::chrono::milliseconds join_timeout = 600s;      ///< c10d, etcd-v3: a round must form within
    std::chrono::milliseconds last_call_timeout = 30s;  ///< c10d, etcd-v3: wait for more after min
    std::chrono::milliseconds close_timeout = 30s;      ///< c10d, etcd-v3: closing the rendezvous
    std::chrono::milliseconds read_timeout = 60s;       ///< c10d, etcd-v3: connect and each request
    std::chrono::milliseconds timeout = 900s;           ///< static: all nodes must arrive within
    std::optional<bool> is_host;  ///< c10d: host the store here; unset: when the endpoint is this host
    /// elastic's own key (torchrun hard-codes 300 s): how long a node whose workers succeeded
    /// waits for the other nodes; unset: 300 s (torchrun's fixed value).
    std::optional<std::chrono::milliseconds> exit_barrier_timeout;
    /// c10d, etcd-v3: how often an agent proves to the rendezvous store that it lives (its
    /// lease's heartbeat, or its etcd lease's renewal); torchrun's name, elastic's default (torchrun: 5 s).
    std::chrono::milliseconds keep_alive_interval = 1s;
    /// c10d, etcd-v3: heartbeats missed in a row before an agent counts as lost (the store's
    /// verdict; etcd: its lease's TTL is interval x attempts) or an agent counts its store as
    /// lost; torchrun's name, elastic's default (torchrun: 3).
    int keep_alive_max_attempt = 5;
    /// static, c10d: the file holding the job's secret, which authenticates every connection
    /// to the rendezvous store (docs/rendezvous.md, "Security"); elastic's own key.
    std::optional<std::string> secret_file;
    /// The job's secret itself: read from `secret_file` or ELASTIC_RDZV_SECRET by the agent
    /// (load_rendezvous_secret), never from the command line. Unset: no authentication.
    std::optional<std::string> secret;
    /// c10d: `workers_store_peers=any`: group rank 0's workers' store accepts every peer, not
    /// only the round's members' addresses (for NAT between the nodes); elastic's own key.
    bool workers_store_any_peer = false;
    /// etcd-v3: `protocol=https`, TLS to every member (torchrun's key).
    bool tls = false;
    /// etcd-v3: `cacert`, `cert`, `key` (torchrun's keys): the PEM files of the CAs that sign the
    /// members' certificates (unset: the system's), of this agent's client certificate, and of its key.
    std::optional<std::string> cacert;
    std::optional<std::string> cert;
    std::optional<std::string> key;
    friend bool operator==(const rendezvous_settings&, const rendezvous_settings&) = default;
};

/// `host:port` as it would be written again (IPv6 in brackets).
[[nodiscard]] ELASTIC_DECL std::string to_string(const host_port& endpoint);

/// Everything a rendezvous over TCP (tcp_rendezvous) takes, defaults applied.
struct rendezvous_parameters {
    rendezvous_backend backend = rendezvous_backend::static_;  ///< --rdzv-backend
    /// Where the rendezvous store is, defaults applied (launch_config::rendezvous_endpoint()):
    /// --rdzv-endpoint, else for static --master-addr:--master-port; host `localhost` and the
    /// backend's default port (default_rendezvous_port) when absent.
    host_port endpoint{"127.0.0.1", std::uint16_t{29500}};
    /// The endpoint's port was given (--rdzv-endpoint, --master-port) rather than defaulted. A
    /// single node binds the workers' store there only when it was given: two one-node jobs on
    /// a host would otherwise collide on the static backend's 29500.
    bool port_given = false;
    /// c10d: the endpoints after the first in a --rdzv-endpoint list, ports defaulted: members'
    /// hosts whose idle store servers listen there, where the job's store may move and where a
    /// newcomer looks for it before it hosts or dials `endpoint` (docs/rendezvous.md).
    std::vector<host_port> successor_endpoints;
    std::string run_id = "none";            ///< --rdzv-id: the job id, namespaces store keys
    node_range nnodes;                      ///< --nnodes
    std::optional<int> node_rank;           ///< --node-rank; static: rank 0 hosts the store
    std::optional<std::string> local_addr;  ///< --local-addr: the address this node advertises
    rendezvous_settings settings;           ///< --rdzv-conf
    friend bool operator==(const rendezvous_parameters&, const rendezvous_parameters&) = default;
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL std::string to_string(const host_port& endpoint) {
    const bool v6 = endpoint.host.find(':') != std::string::npos;
    auto out = v6 ? detail::format("[{}]", endpoint.host) : endpoint.host;
    if (endpoint.port) {
        out += detail::format(":{}", *endpoint.port);
    }
    return out;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
