// SPDX-License-Identifier: MIT
// tcp_rendezvous: the static and c10d backends — who hosts the rendezvous store (torchrun's
// is_host rule, bind-or-join), the clients that reach it, and the store_rendezvous over them.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/detail/host_name.hpp"
#include "elastic/detail/random.hpp"
#include "elastic/detail/text.hpp"
#include "elastic/rendezvous/codec.hpp"
#include "elastic/rendezvous/moved_record.hpp"
#include "elastic/rendezvous/parameters.hpp"
#include "elastic/usage_error.hpp"
#include "elastic/rendezvous/error.hpp"
#include "elastic/rendezvous/store_rendezvous.hpp"
#include "elastic/store/client.hpp"
#include "elastic/store/errors.hpp"
#include "elastic/store/server.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>
#include "elastic/detail/format.hpp"
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace elastic::inline v0 {

namespace detail::rendezvous {

ELASTIC_DECL bool is_loopback(std::string_view host);

ELASTIC_DECL bool is_ip_literal(std::string_view host);

/// torchrun's is_host heuristic, widened to every address of every local
/// interface (torchrun misses secondary NICs): `host` is localhost, a loopback address, this
/// host's name or canonical name, or an address one of its interfaces holds.
inline bool interface_holds(const asio::ip::address& wanted);

/// The address in a socket address (getifaddrs, getaddrinfo), or none for another family.
ELASTIC_DECL std::optional<asio::ip::address> address_of(const sockaddr* sa);

ELASTIC_DECL bool is_this_host(std::string_view host);

/// Whether one of this host's interfaces holds `wanted`.
ELASTIC_DECL bool interface_holds(const asio::ip::address& wanted);

/// The literal addresses of this host's interfaces that another node's traffic may come from:
/// no loopback, no link-local IPv6 (it needs a zone to mean anything), each once, at most
/// max_addrs. Published in the node's arrival info (node_info::addrs).
ELASTIC_DECL std::vector<std::string> interface_addresses();

/// "localhost" may resolve to ::1 for one process and 127.0.0.1 for another: use the literal.
ELASTIC_DECL std::string literal_for(std::string_view host);

/// The address a server named `host` binds on this node: an IP literal as given (a loopback
/// name: 127.0.0.1); a name: the first address it resolves to, in the resolver's order
/// (getaddrinfo, RFC 6724 as /etc/gai.conf tunes it), that this node owns — a loopback address
/// or one an interface holds; IPv6 link-local addresses are passed over (they need a scope).
/// Empty when the name resolves to no address of this node.
ELASTIC_DECL std::string owned_address(std::string_view host);

/// Every address `host` names (an IP literal: itself; a name: what getaddrinfo gives), IPv4
/// addresses mapped into IPv6 given as IPv4. Empty when it resolves to nothing.
ELASTIC_DECL std::vector<asio::ip::address> resolve_all(std::string_view host);

/// Which peers the workers' store of a round accepts: loopback (this node's workers), and the
/// addresses of the round's members (filled once the round is known; empty before).
struct peer_list {
    std::vector<asio::ip::address> allowed;

    /// Adds `a` (an IPv4 address mapped into IPv6 as IPv4), once.
    void allow(asio::ip::address a) {
        if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
        if (std::find(allowed.begin(), allowed.end(), a) == allowed.end()) allowed.push_back(a);
    }

    [[nodiscard]] bool accepts(asio::ip::address a) const {
        if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
        if (a.is_loopback()) return true;
        return std::find(allowed.begin(), allowed.end(), a) != allowed.end();
    }
};

/// Where a server for `host` listens: owned_address(host), else every interface ("0.0.0.0"),
/// which only a name that resolves to no address of this node comes to.
ELASTIC_DECL std::string bind_address_for(std::string_view host);

}  // namespace detail::rendezvous

/// The environment variable that hands an agent the job's secret itself (for schedulers that
/// inject secrets as variables); `--rdzv-conf secret_file=PATH` names a file instead.
inline constexpr std::string_view rendezvous_secret_variable = "ELASTIC_RDZV_SECRET";

/// Fills `conf.secret` (unless a custom launcher set it) from `secret_file` (its
/// contents, trailing line breaks stripped) or else ELASTIC_RDZV_SECRET, and removes that
/// variable from `env` either way, so workers (which inherit `env`) never see the secret.
/// usage_error for an unreadable file or an empty secret; `warn` hears about a file that its
/// group or others may read.
ELASTIC_DECL void load_rendezvous_secret(rendezvous_settings& conf, environment& env,
                                         const std::function<void(std::string_view)>& warn);

/// Whether the agent runs the multi-node rendezvous (tcp_rendezvous) rather than the
/// single-node path: more than one node, or a c10d store another agent hosts.
[[nodiscard]] ELASTIC_DECL bool uses_node_rendezvous(const rendezvous_parameters& p);

/// Where this node's workers' store listens and what the other nodes are told (MASTER_ADDR):
/// --local-addr when given; 127.0.0.1 when the rendezvous endpoint is a loopback address
/// (every node is on this machine); otherwise this host's fully qualified name.
struct advertised_address {
    std::string bind_host;
    std::string addr;
};

[[nodiscard]] ELASTIC_DECL advertised_address advertise(const rendezvous_parameters& p);

/// The static and c10d backends over TCP. `start()` hosts the rendezvous store or connects to
/// it; then `rendezvous()` is the store_rendezvous every round goes through.
///
/// static: node rank 0 (--node-rank, default 0) hosts at --master-addr:--master-port; the
/// others connect (retrying until the `timeout` key, 900 s). c10d: the agent whose endpoint is
/// this host (is_host rule, or --rdzv-conf is_host) hosts at the endpoint (port 29400 by
/// default); if binding fails under the heuristic (another agent here hosts already), it
/// connects instead, as torchrun does, and while nothing accepts connections there it binds
/// again until the join timeout (a port held by a program that does not listen).
template <class Defer = void>
class basic_tcp_rendezvous {
public:
    using log_function = std::function<void(std::string_view)>;

    basic_tcp_rendezvous(asio::any_io_executor executor, rendezvous_parameters parameters, log_function log = {})
        : executor_(std::move(executor)), params_(std::move(parameters)), log_(std::move(log)) {}

    basic_tcp_rendezvous(const basic_tcp_rendezvous&) = delete;
    basic_tcp_rendezvous& operator=(const basic_tcp_rendezvous&) = delete;

    /// Hosts or connects. rendezvous_error when the store can be neither hosted nor reached.
    asio::awaitable<void> start() {
        const auto endpoint = params_.endpoint;
        const auto host = detail::rendezvous::literal_for(endpoint.host);
        const std::uint16_t port = endpoint.port.value_or(0);
        const bool is_static = params_.backend == rendezvous_backend::static_;
        const auto join_timeout = is_static ? params_.settings.timeout : params_.settings.join_timeout;

        bool want_host = false;
        bool explicit_host = false;
        if (is_static) {
            want_host = params_.node_rank.value_or(0) == 0;
            explicit_host = true;
        } else if (params_.settings.is_host) {
            want_host = *params_.settings.is_host;
            explicit_host = true;
        } else {
            want_host = detail::rendezvous::is_this_host(endpoint.host);
        }
        std::string connect_host = host;
        std::optional<found_store> moved;
        if (elastic_membership()) moved = co_await find_moved_store(join_timeout);
        // Taken after the search: a wait there for a move in progress leaves the host its time.
        const auto deadline = std::chrono::steady_clock::now() + join_timeout;
        if (moved) {
            want_host = false;  // the job lives on elsewhere: a store here would split it
        }
        if (want_host) {
            // A name: the address it resolves to on this node, not every interface.
            const auto bind_host = detail::rendezvous::bind_address_for(host);
            // Reach it where it listens (the name may resolve to another address first).
            const auto listening = bind_host == "0.0.0.0" ? std::string("127.0.0.1") : bind_host;
            const auto refused = try_host(bind_host, port);
            if (!refused) {
                connect_host = listening;
            } else if (explicit_host) {
                throw rendezvous_error(detail::format(
                    "cannot host the rendezvous store at {}: {}{}", to_string(endpoint), refused->why,
                    is_static ? " (is another job on this port, or do two nodes have --node-rank=0?)"
                              : " (--rdzv-conf is_host=true forbids joining another agent's store instead)"));
            } else if (!refused->port_taken) {
                if (log_) {
                    log_(detail::format("cannot host the rendezvous store at {} ({}); joining the agent that does",
                                        to_string(endpoint), refused->why));
                }
            } else if (co_await host_or_join(bind_host, probe_address(host, listening), port, deadline, refused->why)) {
                connect_host = listening;
            }
        }
        if (moved) {
            adopt(std::move(moved->client), moved->options);
        } else {
            current_host_ = connect_host;
            current_port_ = server_ ? server_->port() : port;
            const auto options = client_options(current_host_, current_port_, join_timeout);
            client_ = std::make_unique<tcp_store_client>(executor_, options);
            watcher_ = std::make_unique<tcp_store_client>(executor_, options);
            lease_ = std::make_unique<tcp_store_client>(executor_, options);
        }
        try {
            co_await client_->connect();
        } catch (const store_auth_error& e) {
            throw rendezvous_error(secret_refused(to_string(endpoint), e));
        } catch (const store_error& e) {
            throw rendezvous_error(
                detail::format("cannot reach the rendezvous store at {} within {} s: {}", to_string(endpoint),
                               std::chrono::duration_cast<std::chrono::seconds>(join_timeout).count(), e.what()));
        }
        store_rendezvous_options o;
        o.run_id = params_.run_id;
        o.nnodes = params_.nnodes.max;
        o.min_nodes = params_.nnodes.min;
        o.join_timeout = join_timeout;
        o.last_call_timeout = params_.settings.last_call_timeout;
        o.close_timeout = params_.settings.close_timeout;
        o.hosts_store = server_ != nullptr;
        o.log = log_;
        if (elastic_membership()) o.origin_answers = [this] { return origin_answers(); };
        rdzv_.emplace(*client_, *watcher_, std::move(o));
        try {
            instance_ = co_await instance_of(*client_);
        } catch (const store_error& e) {
            throw rendezvous_error(detail::format("the rendezvous store at {}:{} does not answer: {}", current_host_,
                                                  current_port_, e.what()));
        }
        co_await agree_keep_alive(join_timeout);
        // c10d, elastic membership: an idle store server of this node's own, where the job's
        // rendezvous moves should the store's host be lost (docs/rendezvous.md). Made after the
        // keep-alive is agreed: it drops silent leases by the job's rule, not this node's.
        if (elastic_membership() && !server_) start_backup();
        if (!params_.settings.secret && log_) {
            log_(detail::format(
                "the rendezvous store at {} (port {}{}) accepts any client: whoever reaches it can read "
                "and steer this job; give every agent the job's secret (--rdzv-conf "
                "secret_file=PATH, or {}; docs/rendezvous.md, \"Security\")",
                moved ? detail::format("{}:{}", current_host_, current_port_) : to_string(endpoint), current_port_,
                backup_ ? detail::format(", and this node's idle store on port {}", backup_->port()) : std::string(),
                rendezvous_secret_variable));
        }
    }

    /// Holds this node's lease (its liveness in the job) on a connection of its own and counts
    /// it as registered; `me` describes the node (its id is made here). After start().
    asio::awaitable<void> start_liveness(node_info me) {
        me.id = node_id_ = make_node_id(me.host, me.pid);
        name_idle_store_owner();
        try {
            co_await rdzv_->start_liveness(*lease_, me);
        } catch (const store_error& e) {
            throw rendezvous_error(detail::format("cannot hold this node's lease on the rendezvous store: {}",
                                                  e.what()));
        } catch (const rendezvous_error& e) {  // a store that is no elastic store
            throw rendezvous_error(detail::format("the rendezvous store at {}: {}",
                                                  to_string(host_port{current_host_, current_port_}), e.what()));
        }
    }

    /// How long silence lasts before a node or the store counts as lost:
    /// keep_alive_interval x keep_alive_max_attempt.
    [[nodiscard]] std::chrono::milliseconds keep_alive_deadline() const {
        return params_.settings.keep_alive_interval * params_.settings.keep_alive_max_attempt;
    }

    /// The port of this node's idle store server (0: none), where the job may move.
    [[nodiscard]] std::uint16_t backup_port() const noexcept { return backup_ ? backup_->port() : std::uint16_t{0}; }

    /// The rendezvous store was lost: moves the job to the first of `successors` that answers
    /// (this node's own idle server when it is that one), holds this node's lease there, and
    /// returns where it went (and which successors it passed over, and why). A successor answers
    /// only if its idle store names it (owner_key). rendezvous_error when none answers.
    asio::awaitable<std::string> relocate(std::vector<store_successor> successors, node_info me) {
        if (successors.empty()) {
            throw rendezvous_error("the job's last round named no member that could host the rendezvous store");
        }
        // A successor answers within the time the store's own loss took to notice (keep alive).
        const auto patience = keep_alive_deadline();
        // The lost store's own address is no successor: the job moved there and lost it again
        // before a round formed (the successors are still the round's before it). What answers
        // there now, if anything, is another store (rejoin_store).
        const auto lost_host = current_host_;
        const auto lost_port = current_port_;
        std::string tried;
        const auto passed = [&tried](const store_successor& at, std::string_view why) {
            tried += detail::format("{}{}:{} ({})", tried.empty() ? "" : ", ", at.addr, at.port, why);
        };
        for (const auto& next : successors) {
            if (next.port == lost_port && detail::rendezvous::literal_for(next.addr) == lost_host) {
                passed(next, "the lost store's address");
                continue;
            }
            auto options = client_options(detail::rendezvous::literal_for(next.addr), next.port, patience);
            auto client = std::make_unique<tcp_store_client>(executor_, options);
            try {
                co_await client->connect();
            } catch (const store_error& e) {
                passed(next, e.what());
                continue;
            }
            std::string instance;
            std::string owners;
            try {
                instance = co_await instance_of(*client);
                owners = co_await value_of(*client, owner_key());
            } catch (const store_error& e) {
                passed(next, e.what());
                continue;
            }
            // What answers at a successor's address is that member's idle store only if it names
            // the member: the member may be gone, and another agent's store have taken its port.
            // A --rdzv-endpoint list's entry is where the job looks whoever's idle store listens
            // there (an agent restarted on that machine, say).
            const auto names = detail::split(owners, '\n');
            const auto named = [&names](std::string_view id) { return std::ranges::find(names, id) != names.end(); };
            if (!named(next.id) && !named(listed_owner)) {
                passed(next, detail::format("what answers there is not the idle store of {} (another store took its "
                                            "address since)",
                                            next.id));
                continue;
            }
            // This node's own idle store, whichever of its names the round listed.
            const bool mine = backup_ && std::ranges::any_of(owner_ids_, named);
            instance_ = std::move(instance);
            adopt(std::move(client), options);
            if (mine) server_ = std::move(backup_);
            rdzv_->move_to(*client_, *watcher_, mine);
            me.id = node_id_;
            try {
                co_await rdzv_->start_liveness(*lease_, me);
            } catch (const store_auth_error& e) {
                throw rendezvous_error(secret_refused(detail::format("{}:{}", next.addr, next.port), e));
            } catch (const store_error& e) {
                throw rendezvous_error(
                    detail::format("cannot hold this node's lease on the moved rendezvous store at {}:{}: {}",
                                   next.addr, next.port, e.what()));
            } catch (const rendezvous_error& e) {  // no elastic store there (the port was taken): the next one
                if (mine) backup_ = std::move(server_);
                passed(next, e.what());
                continue;
            }
            co_return detail::format("{}:{}{}, the first member's idle store that answered{}", next.addr, next.port,
                                     mine ? " (this node)" : "", tried.empty() ? "" : ", passing over " + tried);
        }
        throw rendezvous_error(detail::format("none of the store's successors answered: {}", tried));
    }

    /// This node's lease connection ended, but the store may live on and have dropped this node
    /// (it heard no heartbeat in time: a stalled or overloaded agent). If the store answers a
    /// new connection, this node reconnects, holds a new lease and returns "" (it rejoins the
    /// job at its next round); else why not, when the store does not answer, or (elastic
    /// membership) another store answers at its address: the job's store is lost.
    /// rendezvous_error when the store answers but refuses this node's secret: the store lives,
    /// and moving the job elsewhere would not make this node's secret right.
    asio::awaitable<std::string> rejoin_store(node_info me) {
        const auto endpoint = detail::format("{}:{}", current_host_, current_port_);
        auto options = client_options(current_host_, current_port_, keep_alive_deadline());
        auto client = std::make_unique<tcp_store_client>(executor_, options);
        try {
            co_await client->connect();
        } catch (const store_auth_error& e) {
            throw rendezvous_error(secret_refused(endpoint, e));
        } catch (const store_error& e) {
            co_return detail::format("reconnecting to it within {} ms (keep_alive_interval x keep_alive_max_attempt) "
                                     "failed: {}",
                                     options.connect_timeout.count(), e.what());
        }
        std::string instance;
        try {
            instance = co_await instance_of(*client);
        } catch (const store_error& e) {
            co_return detail::format("it accepts a connection again, but its first reply failed: {}", e.what());
        }
        // Another store at the same address (the job's host was lost, and another agent's store
        // took its port since) holds none of the job's rounds: rounds formed there would be a
        // second job beside the one that moved on. Only a job that can move checks: a fixed
        // job's store lives only there, and a restarted one is where the job goes on.
        if (elastic_membership() && !instance_.empty() && instance != instance_) {
            co_return detail::format("what answers at {} now is another store than the job's (another instance, "
                                     "started since at that address): the job's store there is lost",
                                     endpoint);
        }
        adopt(std::move(client), options);
        instance_ = std::move(instance);
        rdzv_->reconnected(*client_, *watcher_);
        if (const auto not_elastic = co_await hold_new_lease(std::move(me), endpoint)) {
            // What answers there now is no elastic store: the job's store is lost.
            co_return detail::format("what answers there now is not the job's store: {}", *not_elastic);
        }
        co_return std::string();
    }

    // Holds a new lease at the store this node is connected to now (`endpoint`, for messages),
    // under a new name: the old one is on the job's list of lost nodes, which rounds leave out.
    // Why not when what answers there is no elastic store; rendezvous_error when the store
    // refuses this node's secret or the lease.
    asio::awaitable<std::optional<std::string>> hold_new_lease(node_info me, const std::string& endpoint) {
        me.id = node_id_ = make_node_id(me.host, me.pid);
        name_idle_store_owner();
        try {
            co_await rdzv_->start_liveness(*lease_, me);
        } catch (const store_auth_error& e) {
            throw rendezvous_error(secret_refused(endpoint, e));
        } catch (const store_error& e) {
            throw rendezvous_error(detail::format(
                "cannot hold this node's lease again on the rendezvous store at {}: {}", endpoint, e.what()));
        } catch (const rendezvous_error& e) {
            co_return std::string(e.what());
        }
        co_return std::nullopt;
    }

    // ---- agent_rendezvous: what the agent's loop calls ----

    /// start(), then start_liveness(me).
    asio::awaitable<void> join(node_info me) {
        co_await start();
        co_await start_liveness(std::move(me));
    }

    asio::awaitable<void> keep_membership() { co_await rdzv_->keep_membership(); }

    /// Publishes this node's status (an agent_status as JSON, docs/status.md) in the job's
    /// store, where `elasticrun status --rdzv-endpoint` reads it: on a connection of its own
    /// (a round's long wait never holds it), under `<job>/status/<i>`, `i` taken once per store
    /// from the counter `<job>/status/count`. Nothing before join(). store_error when the
    /// store cannot be reached (the rounds learn of a lost store by themselves).
    asio::awaitable<void> publish_status(std::string json) {
        if (!client_ || !rdzv_ || stopped_) co_return;
        if (!status_client_ || status_host_ != current_host_ || status_port_ != current_port_) {
            if (status_client_) status_client_->close();
            status_client_ = std::make_unique<tcp_store_client>(executor_, client_options(current_host_, current_port_,
                                                                                          std::chrono::seconds(5)));
            status_host_ = current_host_;
            status_port_ = current_port_;
            status_index_.reset();
        }
        if (!status_index_) status_index_ = co_await status_client_->add(rdzv_->job_key("status/count"), 1) - 1;
        co_await status_client_->set(rdzv_->job_key(detail::format("status/{}", *status_index_)), std::move(json));
    }

    /// Joins the next round as `me`, with this node's lease name and idle store's port.
    asio::awaitable<rendezvous_round> next_round(node_info me) {
        me.id = node_id_;
        me.backup_port = backup_port();
        me.backup_listed = backup_ && backup_listed_;
        auto round = co_await rdzv_->next_round(std::move(me));
        // Marks this node's idle store as a formed round's member's: an agent that starts while
        // the job's store is lost and not moved yet finds the mark and waits for the move
        // (find_moved_store) instead of hosting a fresh store at the first endpoint.
        if (backup_)
            backup_->engine().set(store_client_options{}.key_prefix + mark_key(), std::to_string(round.number));
        record_successors();
        if (elastic_membership()) {
            origin_ = origin_store{current_host_, current_port_, instance_, round.number};
            stop_looking();
        }
        co_return round;
    }

    /// The round's abort. Cancelled (the workers ended first), its connection is left
    /// mid-request: it is dropped, and the next use reconnects.
    asio::awaitable<abort_notice> wait_for_abort() {
        struct drop_unless_answered {
            basic_tcp_rendezvous* self;
            bool answered = false;
            ~drop_unless_answered() {
                if (!answered) self->reset_watcher();
            }
        } guard{this};
        auto notice = co_await rdzv_->wait_for_abort();
        guard.answered = true;
        co_return notice;
    }

    asio::awaitable<bool> abort(abort_notice notice) { co_return co_await rdzv_->abort(std::move(notice)); }
    asio::awaitable<job_decision> decide(job_decision decision) {
        co_return co_await rdzv_->decide(std::move(decision));
    }
    asio::awaitable<job_decision> await_decision() { co_return co_await rdzv_->await_decision(); }
    asio::awaitable<barrier_result> finish(std::chrono::milliseconds timeout) {
        auto result = co_await rdzv_->finish(timeout);
        // The job ended (an aborted barrier goes on to another round): nothing to find where its
        // store might have moved.
        if (elastic_membership() && result.how != barrier_result::kind::aborted) {
            detail::rendezvous::remove_moved_record(mark_key());
        }
        co_return result;
    }
    asio::awaitable<void> leave() { co_await rdzv_->leave(); }
    [[nodiscard]] int restart_count() const noexcept { return rdzv_ ? rdzv_->restart_count() : 0; }

    /// The rendezvous store was lost (`reason`; this node's workers are stopped already). Only the
    /// end of the lease connection is the store's loss: an error on one request alone throws
    /// rendezvous_error(reason). Over c10d, a store that still answers dropped this node (no
    /// heartbeat in time), which rejoins it, whatever --nnodes says: the others re-form and
    /// wait for it. With elastic membership, a store that does not answer moves to the first
    /// successor that does, and the next round needs a majority of the last. Returns one line
    /// saying which; rendezvous_error when the job cannot go on.
    asio::awaitable<std::string> recover(std::string reason, node_info me) {
        const bool is_static = params_.backend == rendezvous_backend::static_;
        if (is_static || !rdzv_) throw rendezvous_error(std::move(reason));
        if (rdzv_->take_left_for_origin()) {
            const auto moved = store_endpoint();
            std::string why_not;
            if (auto back = co_await go_to_origin(me, why_not)) {
                co_return detail::format("no round formed at the store the job moved to ({}), and too few nodes were "
                                         "there for one; {}",
                                         moved, *back);
            }
            if (!rdzv_->store_lost()) {
                // The moved store lives: this node arrives again at its round (the wait's join
                // timeout goes on).
                rdzv_->reconnected(*client_, *watcher_);
                co_return detail::format("{}: this node waits on at the store the job moved to ({})", why_not, moved);
            }
            reason = detail::format("{}; meanwhile the store the job moved to ({}) was lost: {}", why_not, moved,
                                    *rdzv_->store_lost());
        }
        if (!co_await rdzv_->confirm_store_lost(keep_alive_deadline())) {
            throw rendezvous_error(detail::rendezvous::request_failed_alone(reason, keep_alive_deadline(),
                                                                            "the store"));
        }
        // Only a store that does not answer moves (so an overloaded node never splits the job).
        const auto why_not = co_await rejoin_store(me);
        if (why_not.empty()) {
            // Either side may have ended it: the store heard no heartbeat from this agent (stopped
            // or starved of CPU), or this agent heard none from the store (its host was stopped).
            co_return detail::format(
                "this node's lease connection to the rendezvous store at {} ended (the store heard "
                "no heartbeat from this agent within keep_alive_interval x keep_alive_max_attempt, "
                "or this agent none from the store: one of them was stopped or starved of CPU), "
                "and the store answers again: reconnected, rejoining the job",
                store_endpoint());
        }
        if (!elastic_membership()) throw rendezvous_error(detail::format("{}; {}", reason, why_not));
        // A store the job moved to, lost before a round formed there: the store where the last
        // round formed comes first, if it answers again (nothing was lost there but this node's
        // way to it).
        std::string origin_silent;
        if (away_from_origin()) {
            if (auto back = co_await go_to_origin(me, origin_silent)) {
                co_return detail::format("{}; {}; {}", reason, why_not, *back);
            }
        }
        const int before = rdzv_->last_round_size();
        std::string where;
        try {
            where = co_await relocate(rdzv_->successors(), std::move(me));
        } catch (const std::exception& e) {
            throw rendezvous_error(detail::format("{}; the job cannot move it: {}", reason, e.what()));
        }
        // Should no round form here, the node goes back where the last one formed once that
        // store answers: the looks start now.
        moved_at_ = std::chrono::steady_clock::now();
        stop_looking();
        start_looking();
        co_return detail::format("{}; {}; {}the job's rendezvous moves to {}; "
                                 "the next round needs {} of the last round's {} nodes (a majority)",
                                 reason, why_not, origin_silent.empty() ? "" : origin_silent + "; ", where,
                                 before / 2 + 1, before);
    }

    /// Where this node reaches the rendezvous store now ("host:port").
    [[nodiscard]] std::string store_endpoint() const { return detail::format("{}:{}", current_host_, current_port_); }

    /// This node's lease name ("host:pid:tag"), after start_liveness().
    [[nodiscard]] const std::string& node_id() const noexcept { return node_id_; }

    /// The rounds (after start()).
    store_rendezvous<tcp_store_client>& rendezvous() { return *rdzv_; }
    /// Whether this agent hosts the rendezvous store.
    [[nodiscard]] bool hosts_store() const noexcept { return server_ != nullptr; }
    /// The port of the hosted store (0 when a client).
    [[nodiscard]] std::uint16_t hosted_port() const { return server_ ? server_->port() : std::uint16_t{0}; }
    /// Drops the watcher's connection; the next use reconnects.
    void reset_watcher() noexcept {
        if (watcher_) watcher_->close();
    }

    /// Stops serving (after leave()).
    void stop() noexcept {
        stopped_ = true;
        if (status_client_) status_client_->close();
        if (lease_) lease_->close();
        if (watcher_) watcher_->close();
        if (client_) client_->close();
        for (auto& c : retired_) {
            if (c) c->close();
        }
        if (server_) server_->stop();
        if (backup_) backup_->stop();
        stop_looking();
    }

private:
    asio::any_io_executor executor_;
    rendezvous_parameters params_;
    log_function log_;
    std::unique_ptr<tcp_store_server> server_;
    std::unique_ptr<tcp_store_client> client_;
    std::unique_ptr<tcp_store_client> watcher_;
    std::unique_ptr<tcp_store_client> lease_;                 ///< holds this node's lease; observes losses
    std::unique_ptr<tcp_store_server> backup_;                ///< idle until the job's store moves here
    std::vector<std::unique_ptr<tcp_store_client>> retired_;  ///< a lost store's clients (pending waits end first)
    std::vector<std::unique_ptr<tcp_store_server>> retired_servers_;  ///< moved stores this node left, stopped
    bool backup_listed_ = false;       ///< backup_ listens at a --rdzv-endpoint list's entry
    bool record_failed_ = false;       ///< the last record_successors() could not write
    std::vector<host_port> recorded_;  ///< the search's entries from this machine's record
    std::map<std::string, std::vector<asio::ip::address>> resolved_;  ///< names looked up by this search

    // The first --rdzv-endpoint list entry (after the first endpoint) that names an address of
    // this node where it advertises itself: its idle store listens there.
    [[nodiscard]] std::optional<host_port> listed_endpoint() const {
        const auto bind = advertise(params_).bind_host;
        for (const auto& next : params_.successor_endpoints) {
            const auto owned = detail::rendezvous::owned_address(next.host);
            if (!owned.empty() && owned == bind) return next;
        }
        return std::nullopt;
    }

    // This node's idle store server, where the job's store may move: at its --rdzv-endpoint list
    // entry when it has one (where a newcomer looks), else on a free port. It holds the job's
    // keep-alive, which a newcomer reads should the job's store move here.
    void start_backup() {
        backup_listed_ = false;
        const auto bind = advertise(params_).bind_host;
        if (const auto listed = listed_endpoint()) {
            try {
                backup_ = serve_job(bind, *with_port(*listed).port);
                backup_listed_ = true;
                return;
            } catch (const store_error& e) {
                if (log_) {
                    log_(
                        detail::format("this node's idle store cannot listen at {} from the --rdzv-endpoint list ({}): "
                                       "it takes a free port, where an agent started later does not look for the job",
                                       to_string(*listed), e.what()));
                }
            }
        }
        backup_ = serve_job(bind, 0);
    }

    // A started store server at bind_host:port that holds the job's keep-alive before anyone can
    // connect (an agent that read it a moment too early would heartbeat by its own values:
    // agree_keep_alive). store_error when it cannot listen.
    std::unique_ptr<tcp_store_server> serve_job(const std::string& bind_host, std::uint16_t port) {
        auto server = std::make_unique<tcp_store_server>(executor_, server_options(bind_host, port));
        server->engine().set(store_client_options{}.key_prefix + keep_alive_key(), keep_alive_text());
        server->engine().set(store_client_options{}.key_prefix + instance_key(),
                             detail::format("{:016x}", detail::random_u64()));
        server->start();
        return server;
    }

    [[nodiscard]] bool elastic_membership() const noexcept {
        return params_.backend != rendezvous_backend::static_ && params_.nnodes.min < params_.nnodes.max;
    }

    // Keeps this machine's record of where the job's store is (as this node reaches it) and of
    // the round's successors (moved_record.hpp): an agent started here later without a
    // --rdzv-endpoint list looks there before it hosts a fresh store at the first endpoint. A
    // record that cannot be written is said once; the job goes on without it.
    void record_successors() noexcept {
        if (!elastic_membership() || !rdzv_) return;
        std::string why;
        try {
            // The store where this node hosts it at the first endpoint is no entry: that is where
            // an agent looks first anyway.
            std::vector<store_successor> where;
            if (!(server_ && server_->port() == *with_port(params_.endpoint).port)) {
                where.push_back({"", current_host_, current_port_});
            }
            const auto& successors = rdzv_->successors();
            where.insert(where.end(), successors.begin(), successors.end());
            why = detail::rendezvous::write_moved_record(mark_key(), where);
            if (!why.empty() && !record_failed_ && log_) {
                log_(detail::format("cannot keep this machine's record of where the job's store may move ({}): an "
                                    "agent started here later without a --rdzv-endpoint list cannot find a moved store",
                                    why));
            }
        } catch (...) {
            why = "out of memory";  // the round formed: it goes on without the record
        }
        record_failed_ = !why.empty();
    }

    // Where a search for the moved store looks after the first endpoint: the --rdzv-endpoint
    // list's later entries, then this machine's record of the last round's successors (read once
    // per search), each once.
    [[nodiscard]] std::vector<host_port> search_entries() {
        std::vector<host_port> out;
        recorded_.clear();
        const auto same = [&](const host_port& a, const host_port& b) {
            return detail::lower(a.host) == detail::lower(b.host) && with_port(a).port == with_port(b).port;
        };
        const auto add = [&](const host_port& at) {
            if (same(at, params_.endpoint)) return false;
            if (std::any_of(out.begin(), out.end(), [&](const host_port& o) { return same(o, at); })) return false;
            out.push_back(at);
            return true;
        };
        for (const auto& next : params_.successor_endpoints) add(next);
        for (const auto& entry : detail::rendezvous::read_moved_record(mark_key())) {
            const host_port at{entry.addr, entry.port};
            if (add(at)) recorded_.push_back(at);
        }
        return out;
    }

    // Whether `at` came from this machine's record (not from the --rdzv-endpoint list).
    [[nodiscard]] bool recorded(const host_port& at) const {
        return std::find(recorded_.begin(), recorded_.end(), at) != recorded_.end();
    }

    // Where `at` came from, for the log.
    [[nodiscard]] std::string origin(const host_port& at) const {
        return recorded(at) ? "from this machine's record of the job's successors" : "from the --rdzv-endpoint list";
    }

    // A store found at a --rdzv-endpoint list's entry that holds the job, connected.
    struct found_store {
        std::unique_ptr<tcp_store_client> client;
        store_client_options options;
    };

    // Whether something accepts a connection at `next` (each address a name resolves to; a name
    // is resolved once per search: the search may look many times).
    asio::awaitable<bool> anything_at(const host_port& next) {
        const auto address = detail::rendezvous::literal_for(next.host);
        if (detail::rendezvous::is_ip_literal(address)) co_return co_await accepts(address, next.port.value_or(0));
        auto known = resolved_.find(address);
        if (known == resolved_.end()) {
            auto addresses = detail::rendezvous::resolve_all(address);
            if (addresses.empty()) co_return false;  // not kept: the next look asks again
            known = resolved_.emplace(address, std::move(addresses)).first;
        }
        for (const auto& a : known->second) {
            if (co_await accepts(a.to_string(), next.port.value_or(0))) co_return true;
        }
        co_return false;
    }

    // What a look at one --rdzv-endpoint entry found.
    struct look_result {
        enum class what { nothing, store, unusable } answer = what::nothing;  // unusable: accepts, no store reply
        bool marked = false;               // a store marked as a formed round's member's idle one (mark_key)
        std::optional<found_store> found;  // a store holding the job's registrations, connected
    };

    // The mark a member leaves in its idle store once a round formed: it names the job and the
    // first endpoint as this node spells it (in lower case), so another job's idle store
    // (another endpoint, or the same run id by default) never looks like this one's.
    [[nodiscard]] std::string mark_key() const {
        return job_key("formed@" + detail::lower(to_string(with_port(params_.endpoint))));
    }

    // `entry` with the backend's default port when it names none.
    [[nodiscard]] host_port with_port(host_port entry) const {
        entry.port = entry.port.value_or(default_rendezvous_port(params_.backend));
        return entry;
    }

    // Looks at `next`: whether anything answers there, and as what. Every step is bounded by the
    // keep-alive; a store refusing this node's secret ends the start.
    asio::awaitable<look_result> probe_at(const host_port& next, bool quiet) {
        look_result result;
        const auto where = with_port(next);  // (g++ 12: no braced temporary inside a co_await expression)
        const auto port = *where.port;
        if (!co_await anything_at(where)) co_return result;
        result.answer = look_result::what::unusable;
        auto options = client_options(detail::rendezvous::literal_for(next.host), port, keep_alive_deadline());
        options.timeout = keep_alive_deadline();
        auto client = std::make_unique<tcp_store_client>(executor_, options);
        try {
            co_await client->connect();
            std::vector<std::string> mark{mark_key()};
            result.marked = co_await client->check(std::move(mark));
            result.answer = look_result::what::store;
            std::vector<std::string> keys{job_key("registered")};
            if (co_await client->check(std::move(keys))) {
                result.found = found_store{std::move(client), options};
                co_return result;
            }
        } catch (const store_auth_error& e) {
            // A recorded entry's port may serve another store by now (the record outlives a job
            // that failed or was killed): no store of this job, not a wrong secret.
            if (!recorded(next)) throw rendezvous_error(secret_refused(to_string(where), e));
            if (log_ && !quiet) {
                log_(detail::format("{} {} refuses this node's secret ({}): another job's store by now",
                                    to_string(where), origin(next), e.what()));
            }
            result = look_result{};
        } catch (const store_error& e) {
            if (log_ && !quiet) {
                log_(detail::format("{} {} answers but is no store this node can use ({})", to_string(where),
                                    origin(next), e.what()));
            }
        }
        client->close();
        co_return result;
    }

    // The job's store may have moved to a member's idle server (its host was lost). A store at
    // the first endpoint that holds the job's registrations is the job's: nothing to find. Else
    // a listed store that holds the job is joined (search_list). When none does but a listed
    // member's idle store is marked as a formed round's (the job ran, its store at the first
    // endpoint is lost or silent, and the members are moving it: they, too, call a store that
    // gives no answer within the keep-alive lost), this node looks again, a pass over the list
    // and 200 ms, until the join timeout has passed, rather than host a fresh store there (or
    // dial one that may soon be) and start a second group of the job. Once a mark was seen, the
    // search never ends in a fresh store: a listed store that stops answering, or loses its
    // mark, may be where the job moves next.
    asio::awaitable<std::optional<found_store>> find_moved_store(std::chrono::milliseconds join_timeout) {
        resolved_.clear();
        const auto give_up = std::chrono::steady_clock::now() + join_timeout;
        bool ran = false;  // a mark seen in this search
        for (bool quiet = false;; quiet = true) {
            auto first = co_await probe_at(params_.endpoint, quiet);
            if (first.found) {
                first.found->client->close();
                co_return std::nullopt;
            }
            std::vector<std::string> pending;
            const auto entries = search_entries();
            if (auto found = co_await search_list(entries, pending, ran, quiet, give_up)) co_return found;
            if (!ran) co_return std::nullopt;
            const auto seen = detail::format(
                "the job ran (a member's idle store, listed or in this machine's record, is marked as a formed round's) with "
                "its rendezvous store at {}, where {}; no listed or recorded store holds the job's registrations and a "
                "round "
                "({})",
                to_string(params_.endpoint),
                first.answer == look_result::what::store ? "a store without the job answers"
                : first.answer == look_result::what::unusable
                    ? "nothing gives a store's answer in time (a host down or stopped)"
                    : "nothing answers",
                pending.empty() ? std::string("none is marked or silent now")
                                : detail::format("{}", fmt::join(pending, "; ")));
            if (!quiet && log_) {
                log_(detail::format("{}: the store's host was likely lost and the members are moving the store; this "
                                    "node looks again until the join timeout ({} s) has passed",
                                    seen, seconds(join_timeout)));
            }
            if (std::chrono::steady_clock::now() >= give_up) {
                throw rendezvous_error(detail::format(
                    "{}, still after the join timeout ({} s): the job did not move to a listed or recorded member's "
                    "store that a new node can join (its members may have ended, moved it to an unlisted store, or moved without "
                    "a majority of the last round); start this agent with --rdzv-endpoint naming a live member's "
                    "store, or restart the job",
                    seen, seconds(join_timeout)));
            }
            asio::steady_timer pause(executor_, std::chrono::milliseconds(200));
            co_await pause.async_wait(detail::as_tuple_awaitable<Defer>);
        }
    }

    // The first of the list's later entries whose store holds the job's registrations and a
    // round formed there (the moved members' first round there, awaited for the time they take
    // to notice the loss and form it, within the search's `give_up`), connected. Registrations
    // without a round past that time (a minority that moved and could not form one, or a
    // majority still moving) or a store that ends meanwhile: the next. `ran` turns true at a
    // marked store; `pending` gets the entries that may hold the job soon: marked stores
    // without a formed round, and those that give no store's answer in time.
    asio::awaitable<std::optional<found_store>> search_list(const std::vector<host_port>& entries,
                                                            std::vector<std::string>& pending, bool& ran, bool quiet,
                                                            std::chrono::steady_clock::time_point give_up) {
        const auto slice = keep_alive_deadline();
        for (const auto& next : entries) {
            auto look = co_await probe_at(next, quiet);
            ran = ran || look.marked;
            auto& found = look.found;
            if (!found) {
                const auto at = to_string(with_port(next));
                if (look.marked) pending.push_back(detail::format("{}: a marked idle store", at));
                if (look.answer == look_result::what::unusable) {
                    pending.push_back(detail::format("{}: no store's answer in time", at));
                }
                continue;
            }
            const auto where = to_string(host_port{next.host, found->options.port});
            if (recorded(next) && !look.marked) {
                // Registrations under this run id, but no mark of this job and first endpoint: a
                // port of the record that another job with the same run id holds by now.
                if (log_ && !quiet) {
                    log_(detail::format("{} {} holds registrations under this run id but is not this job's store "
                                        "(another job's, started with the same run id): looking on",
                                        where, origin(next)));
                }
                found->client->close();
                continue;
            }
            auto& client = *found->client;
            const auto deadline = std::min(give_up, std::chrono::steady_clock::now() +
                                                        params_.settings.last_call_timeout + slice);
            bool formed = false;
            try {
                for (bool told = false;;) {
                    std::vector<std::string> keys{job_key("last_round")};
                    if (co_await client.check(keys)) {
                        formed = true;
                        break;
                    }
                    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now());
                    if (left.count() <= 0) break;
                    if (!told && !quiet && log_) {
                        told = true;
                        log_(detail::format("the job's nodes registered at {} {}: this node waits up to {} s for them "
                                            "to form a round there",
                                            where, origin(next), seconds(left)));
                    }
                    try {
                        co_await client.wait(std::move(keys), std::min(left, slice));
                    } catch (const store_timeout&) {
                    }
                }
            } catch (const store_error& e) {
                if (log_ && !quiet) {
                    log_(detail::format("the job's rendezvous store at {} ended before this node found a round there "
                                        "({}); looking on",
                                        where, e.what()));
                }
                client.close();
                continue;
            }
            if (!formed) {
                if (look.marked) pending.push_back(detail::format("{}: registrations without a round", where));
                if (log_ && !quiet) {
                    log_(detail::format("{} holds registrations of the job but no round it formed (nodes that moved "
                                        "there without a majority): looking on",
                                        where));
                }
                client.close();
                continue;
            }
            if (log_) {
                log_(detail::format("the job's rendezvous store moved to {} {}: this node joins it there instead of "
                                    "at {}",
                                    where, origin(next), to_string(params_.endpoint)));
            }
            client.set_timeout(params_.settings.read_timeout);
            found->options.timeout = params_.settings.read_timeout;
            co_return std::move(found);
        }
        co_return std::nullopt;
    }

    [[nodiscard]] std::string job_key(std::string_view name) const {
        return store_rendezvous<tcp_store_client>::job_key(params_.run_id, name);
    }

    // ---- going back where the last round formed ----

    // The store where this node's last round formed (elastic membership). After the job's store
    // moved and no round formed where it went, the node goes back there if it answers again as
    // the same store (instance).
    struct origin_store {
        std::string host;
        std::uint16_t port = 0;
        std::string instance;
        int round = -1;
    };

    // A look at the origin running in the background while this node waits at a moved store
    // (look_at_origin): one connection attempt per keep-alive interval until the store answers.
    struct origin_look {
        bool answered = false;
        bool stopped = false;                 ///< a round formed, the node went back, or the rendezvous stopped
        tcp_store_client* client = nullptr;   ///< the look's connection, while it connects or reads
        asio::steady_timer* pause = nullptr;  ///< the wait before the next look, while it waits

        // Ends the looks at once (the look's frame owns what the pointers name).
        void stop() noexcept {
            stopped = true;
            if (client) client->close();
            if (pause) pause->cancel();
        }
    };

    std::optional<origin_store> origin_;  ///< where the last round formed
    std::shared_ptr<origin_look> look_;   ///< the looks there, while away

    void start_looking() {
        if (look_ || !away_from_origin() || stopped_) return;
        look_ = std::make_shared<origin_look>();
        asio::co_spawn(executor_,
                       look_at_origin(look_, executor_,
                                      client_options(origin_->host, origin_->port,
                                                     params_.settings.keep_alive_interval),
                                      instance_key(), origin_->instance, params_.settings.keep_alive_interval),
                       detail::detached<Defer>);
    }

    void stop_looking() noexcept {
        if (look_) look_->stop();
        look_.reset();
    }

    std::chrono::steady_clock::time_point moved_at_{};  ///< when this node last moved the job's store

    // Whether this node is at another store than where its last round formed, and knows of no
    // round formed since (a standby that saw rounds form where the job moved follows the job).
    [[nodiscard]] bool away_from_origin() const noexcept {
        return origin_ && !origin_->instance.empty() && rdzv_ && rdzv_->known_round() <= origin_->round &&
               (origin_->host != current_host_ || origin_->port != current_port_);
    }

    // store_rendezvous_options::origin_answers: the last look's answer; the first call away
    // from the origin starts the looks. Not before 2 K after the move: the other movers notice
    // the loss up to K apart, and may try a successor that does not answer first (K more).
    std::optional<std::string> origin_answers() {
        if (!away_from_origin() || stopped_) return std::nullopt;
        if (!look_) {
            start_looking();
            return std::nullopt;
        }
        if (!look_->answered || std::chrono::steady_clock::now() - moved_at_ < 2 * keep_alive_deadline()) {
            return std::nullopt;
        }
        return detail::format("the store at {}:{}, where round {} formed, answers again", origin_->host, origin_->port,
                              origin_->round);
    }

    // Connects to the origin every `every` until it answers as the same store (its instance),
    // or the look is stopped. Owns what it uses: the rendezvous may end first.
    static asio::awaitable<void> look_at_origin(std::shared_ptr<origin_look> look, asio::any_io_executor executor,
                                                store_client_options options, std::string key, std::string instance,
                                                std::chrono::milliseconds every) {
        // The frame may be destroyed while suspended (its executor's context goes first): the
        // look then names nothing of it.
        struct forget {
            origin_look& look;
            ~forget() {
                look.client = nullptr;
                look.pause = nullptr;
            }
        } guard{*look};
        while (!look->stopped && !look->answered) {
            const auto started = std::chrono::steady_clock::now();
            {
                tcp_store_client client(executor, options);
                look->client = &client;
                try {
                    co_await client.connect();
                    const auto answer = co_await value_of(client, key);
                    look->answered = answer == instance;
                } catch (const std::exception&) {
                    // not yet: the next look
                }
                look->client = nullptr;
            }
            if (look->answered || look->stopped) break;
            asio::steady_timer pause(executor, started + every);
            look->pause = &pause;
            co_await pause.async_wait(detail::as_tuple_awaitable<Defer>);
            look->pause = nullptr;
        }
    }

    // Goes back to the origin when it answers as the same store: new connections there, a new
    // lease (the old name is on its list of lost nodes), this node's idle store afresh (when it
    // hosted the moved store, that store stops: a node still there finds the origin the same
    // way). The line to log; nullopt and why_not when the origin does not answer.
    asio::awaitable<std::optional<std::string>> go_to_origin(node_info me, std::string& why_not) {
        const auto origin = *origin_;
        stop_looking();  // whatever comes of it, a next look starts afresh
        const auto endpoint = detail::format("{}:{}", origin.host, origin.port);
        auto options = client_options(origin.host, origin.port, keep_alive_deadline());
        auto client = std::make_unique<tcp_store_client>(executor_, options);
        std::string instance;
        try {
            co_await client->connect();
            instance = co_await instance_of(*client);
        } catch (const store_error& e) {
            why_not = detail::format("the store where the job's last round formed ({}) does not answer: {}", endpoint,
                                     e.what());
            co_return std::nullopt;
        }
        if (instance != origin.instance) {
            why_not = detail::format("what answers at {}, where the job's last round formed, is another store now",
                                     endpoint);
            co_return std::nullopt;
        }
        // This node's own server is the store it leaves: a round may have formed there while it
        // looked at the origin (read at once, with nothing awaited before the server stops).
        const bool hosted = server_ != nullptr && rdzv_->hosts_store();
        if (hosted) {
            const std::vector<std::string> formed(1, store_client_options{}.key_prefix + job_key("last_round"));
            if (server_->engine().check(formed)) {
                why_not = "a round formed meanwhile at the store the job moved to, which this node hosts";
                co_return std::nullopt;
            }
        }
        const auto left = store_endpoint();
        adopt(std::move(client), options);
        instance_ = std::move(instance);
        // Back at its own store (it had lost its own connection to it): it hosts it again.
        rdzv_->went_back(*client_, *watcher_, !hosted && server_ != nullptr);
        std::string idle;
        if (hosted) {
            server_->stop();
            retired_servers_.push_back(std::move(server_));
            try {
                start_backup();
            } catch (const store_error& e) {
                idle = detail::format(" (this node has no idle store now: {})", e.what());
            }
        }
        if (const auto not_elastic = co_await hold_new_lease(std::move(me), endpoint)) {
            throw rendezvous_error(detail::format("the rendezvous store at {}: {}", endpoint, *not_elastic));
        }
        co_return detail::format("the store at {}, where the job's last round (round {}) formed, answers again: this "
                                 "node goes back there from {}{}{} and rejoins the job",
                                 endpoint, origin.round, left,
                                 hosted ? " (which it hosted and stops: a node still waiting there goes back too)" : "",
                                 idle);
    }

    // Replaces this node's connections with `client` (connected) and two more like it; the old
    // ones are closed but kept until the end (a coroutine may still be unwinding from them).
    void adopt(std::unique_ptr<tcp_store_client> client, const store_client_options& options) {
        for (auto* old : {&client_, &watcher_, &lease_}) {
            if (*old) (*old)->close();
            retired_.push_back(std::move(*old));
        }
        client_ = std::move(client);
        watcher_ = std::make_unique<tcp_store_client>(executor_, options);
        lease_ = std::make_unique<tcp_store_client>(executor_, options);
        current_host_ = options.host;
        current_port_ = options.port;
    }

    // The store's host drops a lease by its own keep-alive, whatever the holder was told: the
    // host publishes its keep_alive_interval and keep_alive_max_attempt, and an agent that was
    // given other values says so and heartbeats by the host's (one mismatched agent would
    // otherwise be dropped and rejoin over and over, or be noticed late when it dies).
    asio::awaitable<void> agree_keep_alive(std::chrono::milliseconds patience) {
        if (server_) co_return;  // written into the server before it started
        const auto k = keep_alive_key();
        auto& mine = params_.settings;
        const auto text = keep_alive_text();
        std::vector<std::string> keys{k};
        if (!co_await client_->check(std::move(keys))) co_return;  // not an elastic agent's store
        const std::string theirs = co_await client_->get(k);
        long long interval_ms = 0;
        int attempts = 0;
        if (std::sscanf(theirs.c_str(), "%lld %d", &interval_ms, &attempts) != 2 || interval_ms <= 0 || attempts <= 0) {
            throw rendezvous_error(
                detail::format("the rendezvous store's key '{}' holds '{}', not "
                               "'<keep_alive_interval ms> <keep_alive_max_attempt>': another program "
                               "uses --rdzv-id '{}' on this store",
                               k, theirs, params_.run_id));
        }
        if (text == theirs) co_return;
        if (log_) {
            log_(detail::format("keep-alive: this node was given keep_alive_interval={} s, keep_alive_max_attempt={}, "
                                "but the rendezvous store's host uses {} s x {} (it drops silent nodes by its own "
                                "values): this node heartbeats by the host's",
                                seconds(mine.keep_alive_interval), mine.keep_alive_max_attempt,
                                seconds(std::chrono::milliseconds(interval_ms)), attempts));
        }
        mine.keep_alive_interval = std::chrono::milliseconds(interval_ms);
        mine.keep_alive_max_attempt = attempts;
        // Only the lease connection heartbeats; it is not connected yet.
        lease_ = std::make_unique<tcp_store_client>(executor_, client_options(current_host_, current_port_, patience));
    }

    [[nodiscard]] std::string keep_alive_key() const { return job_key("keep_alive"); }
    [[nodiscard]] std::string keep_alive_text() const {
        return detail::format("{} {}", params_.settings.keep_alive_interval.count(),
                              params_.settings.keep_alive_max_attempt);
    }

    // Names one store server (serve_job: a random value it holds from its start), so that a
    // node reconnecting to its store's address can tell that store from another one started
    // there since.
    [[nodiscard]] std::string instance_key() const { return job_key("instance"); }

    // The instance `store` names (instance_key), "" for a store that names none (no agent's).
    // store_error when it does not answer.
    asio::awaitable<std::string> instance_of(tcp_store_client& store) {
        co_return co_await value_of(store, instance_key());
    }

    // The value of `key` in `store`, "" when it holds none. store_error when it does not answer.
    static asio::awaitable<std::string> value_of(tcp_store_client& store, std::string key) {
        std::vector<std::string> keys{key};
        if (!co_await store.check(std::move(keys))) co_return std::string();
        co_return co_await store.get(std::move(key));
    }

    // Names the owner of this node's idle store, one per line: "listed" when it listens at a
    // --rdzv-endpoint list's entry, then the lease names this node has held, set before the
    // newest can be in any round's successors. A node moving the job to a successor's address
    // checks that what answers there names that successor (relocate). A name this node held
    // before a rejoin may still be in the last round's successors, so the older ones stay: the
    // newest max_owner_ids, and any the last round this node knows lists.
    [[nodiscard]] std::string owner_key() const { return job_key("owner"); }
    static constexpr std::size_t max_owner_ids = 16;
    static constexpr std::string_view listed_owner = "listed";  // no lease name: those have colons
    void name_idle_store_owner() {
        if (!backup_) return;
        owner_ids_.push_back(node_id_);
        if (owner_ids_.size() > max_owner_ids) {
            const auto& listed = rdzv_->successors();
            const auto old = std::find_if(owner_ids_.begin(), owner_ids_.end() - 1, [&](const std::string& id) {
                return std::none_of(listed.begin(), listed.end(),
                                    [&](const store_successor& at) { return at.id == id; });
            });
            if (old != owner_ids_.end() - 1) owner_ids_.erase(old);
        }
        std::string owners(backup_listed_ ? listed_owner : std::string_view());
        for (const auto& id : owner_ids_) owners += (owners.empty() ? "" : "\n") + id;
        backup_->engine().set(store_client_options{}.key_prefix + owner_key(), owners);
    }

    // Why this agent could not host the store: the server's message, and whether the port is
    // taken (then normally another agent here hosts; see host_or_join).
    struct host_refusal {
        std::string why;
        bool port_taken = false;
    };

    // Hosts the store at bind_host:port (nullopt), or says why not.
    std::optional<host_refusal> try_host(const std::string& bind_host, std::uint16_t port) {
        try {
            server_ = serve_job(bind_host, port);
            return std::nullopt;
        } catch (const store_listen_error& e) {
            server_.reset();
            // Asio's own system category: compare with its code, not std::errc.
            return host_refusal{e.what(), e.code() == asio::error::address_in_use};
        } catch (const store_error& e) {
            server_.reset();
            return host_refusal{e.what(), false};
        }
    }

    // The address a joining agent dials, to probe whether anything accepts there: the endpoint's
    // host when it is an address, else where this agent would have listened.
    static std::string probe_address(const std::string& host, const std::string& listening) {
        std::error_code ec;
        (void)asio::ip::make_address(host, ec);
        return ec ? listening : host;
    }

    // The endpoint is this host's but its port is taken: normally another agent here hosts the
    // store, and this one joins it. A port held by something that does not listen (a client's
    // connection that drew it as its local port) would leave every agent here dialling nothing
    // until join_timeout: so while nothing accepts a connection at `probe`, this one binds
    // again, every 100 ms, until one of the two works. True when it hosts. Whatever accepts is
    // joined and judged by the client (a foreign program, a store that does not answer: their
    // errors).
    asio::awaitable<bool> host_or_join(const std::string& bind_host, const std::string& probe, std::uint16_t port,
                                       std::chrono::steady_clock::time_point deadline, std::string refused) {
        const auto endpoint = to_string(params_.endpoint);
        for (bool told = false;;) {
            if (co_await accepts(probe, port)) {
                if (log_) {
                    log_(detail::format("the rendezvous store at {} is hosted by another agent on this host ({}); "
                                        "joining it",
                                        endpoint, refused));
                }
                co_return false;
            }
            if (auto again = try_host(bind_host, port); !again) {
                if (log_) log_(detail::format("the rendezvous store at {}: this agent hosts it after all", endpoint));
                co_return true;
            } else if (!again->port_taken) {
                throw rendezvous_error(detail::format("cannot host the rendezvous store at {}: {}", endpoint,
                                                      again->why));
            } else {
                refused = std::move(again->why);
            }
            if (std::chrono::steady_clock::now() >= deadline) {
                throw rendezvous_error(detail::format(
                    "cannot host the rendezvous store at {} ({}), and nothing accepts connections there within the "
                    "join timeout: a program on this host holds port {} without listening on it (`ss -tanp 'sport = "
                    ":{}'` names it); stop it or choose another --rdzv-endpoint port",
                    endpoint, refused, port, port));
            }
            if (log_ && !told) {
                told = true;
                log_(detail::format("cannot host the rendezvous store at {} ({}), and nothing accepts connections "
                                    "there: this agent binds it again every 100 ms until it hosts or another agent "
                                    "does, for at most the join timeout",
                                    endpoint, refused));
            }
            asio::steady_timer pause(executor_, std::chrono::milliseconds(100));
            co_await pause.async_wait(detail::as_tuple_awaitable<Defer>);
        }
    }

    // Whether something accepts a TCP connection at address:port (this host's: refused at once
    // when nothing listens; a full backlog that answers nothing within 1 s counts as a
    // listener). A connection to itself (its local port drawn equal to `port`: TCP's
    // simultaneous open) is nothing accepting.
    asio::awaitable<bool> accepts(const std::string& address, std::uint16_t port) {
        using namespace asio::experimental::awaitable_operators;
        std::error_code ec;
        const auto ip = asio::ip::make_address(address, ec);
        if (ec) co_return true;  // not a literal: the client resolves and judges it
        asio::ip::tcp::socket socket(executor_);
        asio::steady_timer limit(executor_, std::chrono::seconds(1));
        auto which = co_await (socket.async_connect({ip, port}, detail::as_tuple_awaitable<Defer>) ||
                               limit.async_wait(detail::as_tuple_awaitable<Defer>));
        if (which.index() == 1) co_return true;
        const auto [connect_error] = std::get<0>(which);
        if (connect_error) co_return false;
        std::error_code local_error;
        std::error_code remote_error;
        const auto local = socket.local_endpoint(local_error);
        const auto remote = socket.remote_endpoint(remote_error);
        co_return local_error || remote_error || local != remote;
    }

    // An agent whose secret the store refuses cannot take part: say which endpoint and option.
    static std::string secret_refused(const std::string& endpoint, const store_auth_error& e) {
        return detail::format("the rendezvous store at {} and this node do not share the job's secret: {}; give every "
                              "agent the same secret (--rdzv-conf secret_file=PATH, or {})",
                              endpoint, e.what(), rendezvous_secret_variable);
    }

    static std::string seconds(std::chrono::milliseconds d) {
        return detail::format("{:g}", static_cast<double>(d.count()) / 1000.0);
    }

    store_server_options server_options(std::string bind_host, std::uint16_t port) {
        store_server_options options;
        options.host = std::move(bind_host);
        options.port = port;
        options.log = [this](std::string_view line) {
            // A lost lease is the agents' business: each says what it does about it.
            if (line.find("lease '") != std::string_view::npos) return;
            if (log_) log_(detail::format("rendezvous store: {}", line));
        };
        // Liveness: every agent's lease heartbeats at keep_alive_interval; the store counts an
        // agent lost after keep_alive_max_attempt silent intervals (or at once when its
        // connection closes).
        options.lease_heartbeat_interval = params_.settings.keep_alive_interval;
        options.lease_missed_heartbeats = static_cast<unsigned>(params_.settings.keep_alive_max_attempt);
        // Every connection, the agents' own included, authenticates when the job has a secret.
        options.secret = params_.settings.secret;
        // Three connections per agent of the largest round (requests, waits, lease).
        options.make_room_for(3 * static_cast<std::size_t>(std::max(1, params_.nnodes.max)));
        return options;
    }

    store_client_options client_options(std::string host, std::uint16_t port,
                                        std::chrono::milliseconds connect_timeout) const {
        store_client_options options;
        options.host = std::move(host);
        options.port = port;
        // detect: a torchrun 1.13 agent's store (legacy dialect) is reached too, so the torchrun
        // guard can name it instead of failing on the handshake.
        options.dialect = client_dialect::detect;
        options.timeout = params_.settings.read_timeout;
        options.connect_timeout = connect_timeout;
        options.lease_heartbeat_interval = params_.settings.keep_alive_interval;
        options.lease_missed_heartbeats = static_cast<unsigned>(params_.settings.keep_alive_max_attempt);
        options.secret = params_.settings.secret;
        return options;
    }
    std::optional<store_rendezvous<tcp_store_client>> rdzv_;
    std::string node_id_;
    std::string current_host_;            ///< where the rendezvous store is reached now
    std::string instance_;                ///< the instance of the store at current_host_ (instance_key)
    std::vector<std::string> owner_ids_;  ///< this node's lease names, newest last (owner_key)
    std::uint16_t current_port_ = 0;
    std::unique_ptr<tcp_store_client> status_client_;  ///< publish_status()'s own connection
    std::string status_host_;                          ///< the store status_client_ reaches
    std::uint16_t status_port_ = 0;
    std::optional<std::int64_t> status_index_;  ///< this node's status key there, once taken
    bool stopped_ = false;                      ///< stop() ran: nothing is published any more

    static std::string make_node_id(const std::string& host, long pid) {
        return detail::format("{}:{}:{:04x}", host.empty() ? std::string("node") : host, pid,
                              detail::random_u64() & 0xffffu);
    }
};
using tcp_rendezvous = basic_tcp_rendezvous<>;

static_assert(agent_rendezvous<tcp_rendezvous>);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::rendezvous {

ELASTIC_DECL bool is_loopback(std::string_view host) {
    if (host == "localhost" || host == "localhost.localdomain" || host == "ip6-localhost") return true;
    std::error_code ec;
    const auto address = asio::ip::make_address(std::string(host), ec);
    return !ec && address.is_loopback();
}

ELASTIC_DECL bool is_ip_literal(std::string_view host) {
    std::error_code ec;
    (void)asio::ip::make_address(std::string(host), ec);
    return !ec;
}

ELASTIC_DECL std::optional<asio::ip::address> address_of(const sockaddr* sa) {
    if (sa == nullptr) return std::nullopt;
    if (sa->sa_family == AF_INET) {
        const auto* v4 = reinterpret_cast<const sockaddr_in*>(sa);
        return asio::ip::address(asio::ip::address_v4(ntohl(v4->sin_addr.s_addr)));
    }
    if (sa->sa_family == AF_INET6) {
        const auto* v6 = reinterpret_cast<const sockaddr_in6*>(sa);
        asio::ip::address_v6::bytes_type bytes;
        std::copy(std::begin(v6->sin6_addr.s6_addr), std::end(v6->sin6_addr.s6_addr), bytes.begin());
        return asio::ip::address(asio::ip::address_v6(bytes));
    }
    return std::nullopt;
}

ELASTIC_DECL bool is_this_host(std::string_view host) {
    if (is_loopback(host)) return true;
    if (host == host_name()) return true;
    if (host == host_fqdn()) return true;
    std::error_code ec;
    const auto wanted = asio::ip::make_address(std::string(host), ec);
    if (ec) return false;
    return interface_holds(wanted);
}

ELASTIC_DECL bool interface_holds(const asio::ip::address& wanted) {
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return false;
    bool found = false;
    for (auto* i = list; i != nullptr && !found; i = i->ifa_next) found = address_of(i->ifa_addr) == wanted;
    ::freeifaddrs(list);
    return found;
}

ELASTIC_DECL std::vector<std::string> interface_addresses() {
    std::vector<std::string> out;
    ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) return out;
    for (auto* i = list; i != nullptr && out.size() < max_addrs; i = i->ifa_next) {
        if (i->ifa_addr == nullptr) continue;
        const auto found = address_of(i->ifa_addr);
        if (!found || (found->is_v6() && found->to_v6().is_link_local())) continue;
        const auto& a = *found;
        if (a.is_loopback() || a.is_unspecified()) continue;
        auto text = a.to_string();
        if (std::find(out.begin(), out.end(), text) == out.end()) out.push_back(std::move(text));
    }
    ::freeifaddrs(list);
    return out;
}

ELASTIC_DECL std::string literal_for(std::string_view host) {
    if (is_loopback(host) && !is_ip_literal(host)) return "127.0.0.1";
    return std::string(host);
}

ELASTIC_DECL std::string owned_address(std::string_view host) {
    const auto literal = literal_for(host);
    if (is_ip_literal(literal)) return literal;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    if (::getaddrinfo(literal.c_str(), nullptr, &hints, &list) != 0) return {};
    std::string chosen;
    for (auto* i = list; i != nullptr && chosen.empty(); i = i->ai_next) {
        const auto found = address_of(i->ai_addr);
        if (!found || (found->is_v6() && found->to_v6().is_link_local())) continue;
        if (found->is_loopback() || interface_holds(*found)) chosen = found->to_string();
    }
    ::freeaddrinfo(list);
    return chosen;
}

ELASTIC_DECL std::vector<asio::ip::address> resolve_all(std::string_view host) {
    std::vector<asio::ip::address> out;
    std::error_code ec;
    auto literal = asio::ip::make_address(std::string(host), ec);
    if (!ec) {
        out.push_back(literal);
    } else {
        addrinfo hints{};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo* list = nullptr;
        if (::getaddrinfo(std::string(host).c_str(), nullptr, &hints, &list) != 0) return out;
        for (auto* i = list; i != nullptr; i = i->ai_next)
            if (const auto a = address_of(i->ai_addr)) out.push_back(*a);
        ::freeaddrinfo(list);
    }
    for (auto& a : out) {
        if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
    }
    return out;
}

ELASTIC_DECL std::string bind_address_for(std::string_view host) {
    auto owned = owned_address(host);
    return owned.empty() ? std::string("0.0.0.0") : owned;
}

}  // namespace detail::rendezvous
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL void load_rendezvous_secret(rendezvous_settings& conf, environment& env,
                                         const std::function<void(std::string_view)>& warn) {
    std::optional<std::string> from_env;
    if (const auto it = env.find(rendezvous_secret_variable); it != env.end()) {
        from_env = it->second;
        env.erase(it);
    }
    if (conf.secret) return;
    if (conf.secret_file) {
        const auto& path = *conf.secret_file;
        std::ifstream in(path, std::ios::binary);
        if (!in)
            throw usage_error{detail::format("--rdzv-conf secret_file={}: cannot read it ({}); give a "
                                             "file holding the job's secret",
                                             path, std::error_code(errno, std::generic_category()).message())};
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
        if (text.empty())
            throw usage_error{detail::format("--rdzv-conf secret_file={}: the file is empty; write the job's "
                                             "secret into it (head -c 32 /dev/urandom | base64 > {})",
                                             path, path)};
        struct stat st {};
        if (warn && ::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
            warn(detail::format("--rdzv-conf secret_file={}: the file is readable by its group or others "
                                "(mode {:04o}); chmod 600 it",
                                path, static_cast<unsigned>(st.st_mode & 07777)));
        conf.secret = std::move(text);
        return;
    }
    if (from_env) {
        if (from_env->empty())
            throw usage_error{detail::format("{} is set but empty; give it the job's secret, or unset it",
                                             rendezvous_secret_variable)};
        conf.secret = std::move(*from_env);
    }
}

[[nodiscard]] ELASTIC_DECL bool uses_node_rendezvous(const rendezvous_parameters& p) {
    if (p.nnodes.max > 1 || p.backend == rendezvous_backend::etcd_v3) return true;
    if (p.backend != rendezvous_backend::c10d) return false;
    if (p.settings.is_host) return !*p.settings.is_host;
    return !detail::rendezvous::is_this_host(p.endpoint.host);
}

[[nodiscard]] ELASTIC_DECL advertised_address advertise(const rendezvous_parameters& p) {
    if (p.local_addr) {
        const auto lit = detail::rendezvous::literal_for(*p.local_addr);
        return {detail::rendezvous::bind_address_for(lit), lit};
    }
    if (detail::rendezvous::is_loopback(p.endpoint.host)) return {"127.0.0.1", "127.0.0.1"};
    const auto fqdn = host_fqdn();
    return {detail::rendezvous::bind_address_for(fqdn), fqdn};
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
