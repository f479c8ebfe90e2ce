// SPDX-License-Identifier: MIT
// etcd_rendezvous: the etcd-v3 backend — the job's rounds (store_rendezvous, c10d's semantics)
// over an etcd cluster, each agent's liveness an etcd lease, every wait a watch.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/random.hpp"
#include "elastic/rendezvous/concepts.hpp"
#include "elastic/rendezvous/error.hpp"
#include "elastic/rendezvous/parameters.hpp"
#include "elastic/rendezvous/store_rendezvous.hpp"
#include "elastic/store/errors.hpp"
#include "elastic/store/etcd_client.hpp"
#include "elastic/store/etcd_store.hpp"
#include "elastic/store/lease.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include "elastic/detail/format.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// The etcd client options of an etcd-v3 rendezvous: --rdzv-endpoint's members (the port
/// defaulting to 2379), protocol, cacert, cert, key and read_timeout from --rdzv-conf.
[[nodiscard]] ELASTIC_DECL etcd_options etcd_options_for(const rendezvous_parameters& p);

/// The etcd-v3 backend (docs/rendezvous.md, "etcd"). Every agent is a client of the etcd
/// cluster at --rdzv-endpoint (a list of its members); no agent hosts the rendezvous. The job's
/// keys live under `/elastic/elastic.rendezvous.<run id>/` in etcd, and its rounds follow c10d's
/// rules (store_rendezvous over an etcd_store). Each agent holds an etcd lease of
/// keep_alive_interval x keep_alive_max_attempt: when the agent dies or is cut off from etcd,
/// etcd expires it and the others go on without the node. The workers' store stays a TCP store
/// that group rank 0's agent hosts each round, as with c10d.
template <class Defer = void>
class basic_etcd_rendezvous {
public:
    using log_function = std::function<void(std::string_view)>;
    /// The prefix of every key of the rendezvous in etcd.
    static constexpr std::string_view key_prefix = "/elastic/";

    basic_etcd_rendezvous(asio::any_io_executor executor, rendezvous_parameters parameters, log_function log = {})
        : executor_(std::move(executor)), params_(std::move(parameters)), log_(std::move(log)) {}

    basic_etcd_rendezvous(const basic_etcd_rendezvous&) = delete;
    basic_etcd_rendezvous& operator=(const basic_etcd_rendezvous&) = delete;

    /// Reaches the cluster (one member that answers is enough) and checks it speaks the v3 API;
    /// a job id left behind by agents that all died is cleared. rendezvous_error when no member
    /// answers, the credentials are refused, or the server is no etcd 3.4 or later.
    asio::awaitable<void> start() {
        client_ = std::make_shared<etcd_client>(executor_, etcd_options_for(params_));
        std::string failed;
        try {
            (void)co_await client_->server_version();
            co_await clear_abandoned();
        } catch (const store_error& e) {
            failed = e.what();
        }
        if (!failed.empty()) {
            throw rendezvous_error(detail::format("cannot use the etcd cluster at {}: {}", client_->describe(),
                                                  failed));
        }
        store_ = make_store();
        watcher_ = make_store();
        store_rendezvous_options o;
        o.run_id = params_.run_id;
        o.nnodes = params_.nnodes.max;
        o.min_nodes = params_.nnodes.min;
        o.join_timeout = params_.settings.join_timeout;
        o.last_call_timeout = params_.settings.last_call_timeout;
        o.close_timeout = params_.settings.close_timeout;
        o.hosts_store = false;
        // The keys live under elastic's own prefix in etcd: no torchrun agent writes there.
        o.torchrun_guard = false;
        o.split_guard = false;  // etcd is a quorum of its own: a part cut off from it stops
        o.log = log_;
        o.loss_cause = "etcd ended its agent's lease: the agent died, left, or could not renew it in time";
        rdzv_.emplace(*store_, *watcher_, std::move(o));
    }

    /// Holds this node's lease and counts it as registered; `me` describes the node (its id is
    /// made here). After start().
    asio::awaitable<void> start_liveness(node_info me) {
        const auto failed = co_await hold_new_lease(std::move(me));
        if (!failed.empty()) {
            throw rendezvous_error(detail::format("cannot hold this node's lease in the etcd cluster at {}: {}",
                                                  client_->describe(), failed));
        }
    }

    /// How long an agent may stay silent before etcd expires its lease.
    [[nodiscard]] std::chrono::milliseconds keep_alive_deadline() const {
        return params_.settings.keep_alive_interval * params_.settings.keep_alive_max_attempt;
    }

    // ---- agent_rendezvous: what the agent's loop calls ----

    /// start(), then start_liveness(me).
    asio::awaitable<void> join(node_info me) {
        co_await start();
        co_await start_liveness(std::move(me));
    }

    asio::awaitable<void> keep_membership() { co_await rdzv_->keep_membership(); }

    /// Publishes this node's status (docs/status.md) under `<job>/status/<i>`, as over c10d.
    asio::awaitable<void> publish_status(std::string json) {
        if (!client_ || !rdzv_ || stopped_) co_return;
        if (!status_) status_ = make_store();
        if (!status_index_) status_index_ = co_await status_->add(rdzv_->job_key("status/count"), 1) - 1;
        co_await status_->set(rdzv_->job_key(detail::format("status/{}", *status_index_)), std::move(json));
    }

    asio::awaitable<rendezvous_round> next_round(node_info me) {
        me.id = node_id_;
        co_return co_await rdzv_->next_round(std::move(me));
    }
    asio::awaitable<abort_notice> wait_for_abort() { co_return co_await rdzv_->wait_for_abort(); }
    asio::awaitable<bool> abort(abort_notice notice) { co_return co_await rdzv_->abort(std::move(notice)); }
    asio::awaitable<job_decision> decide(job_decision decision) {
        co_return co_await rdzv_->decide(std::move(decision));
    }
    asio::awaitable<job_decision> await_decision() { co_return co_await rdzv_->await_decision(); }
    asio::awaitable<barrier_result> finish(std::chrono::milliseconds timeout) {
        co_return co_await rdzv_->finish(timeout);
    }

    /// Leaves the job: the rounds' leave, then this node's lease is revoked (the others see it
    /// go at once). The last node to leave clears the job's keys, so that the id may be used
    /// again. Errors of the last two steps are logged: the job's result stands.
    asio::awaitable<void> leave() {
        // No status after this: the last node's clear below must be the last word on the job.
        stopped_ = true;
        co_await rdzv_->leave();
        std::string failed;
        try {
            if (lease_) (void)co_await lease_->release_lease();
            co_await clear_abandoned();
        } catch (const store_error& e) {
            failed = e.what();
        }
        if (!failed.empty() && log_) {
            log_(detail::format("leaving the etcd rendezvous of run '{}': {} (etcd expires this node's lease within "
                                "{} s, and the next job with this id clears what is left)",
                                params_.run_id, failed,
                                std::chrono::duration_cast<std::chrono::seconds>(keep_alive_deadline()).count()));
        }
    }

    [[nodiscard]] int restart_count() const noexcept { return rdzv_ ? rdzv_->restart_count() : 0; }

    /// This node's lease was lost (`reason`; its workers are stopped already). An error of one
    /// request alone, with the lease still held, throws rendezvous_error(reason). Else the node
    /// takes a new lease under a new name and rejoins the job at its next round (the others
    /// re-formed without it); rendezvous_error when the cluster does not grant one.
    asio::awaitable<std::string> recover(std::string reason, node_info me) {
        if (!rdzv_) throw rendezvous_error(std::move(reason));
        if (!co_await rdzv_->confirm_store_lost(keep_alive_deadline())) {
            throw rendezvous_error(detail::rendezvous::request_failed_alone(reason, keep_alive_deadline(), "etcd"));
        }
        // The old lease goes at once when etcd answers (the others see the node go now, not
        // after its TTL); it expires by itself when etcd does not.
        if (lease_) {
            lease_->close();
            const auto old = lease_->lease_id();
            try {
                if (old != 0) co_await client_->lease_revoke(old);
            } catch (const store_error&) {
            }
        }
        // The stores of the generation before the last are done with: what used them has ended.
        retired_.clear();
        retired_.push_back(std::move(lease_));
        if (watcher_) watcher_->close();
        retired_.push_back(std::move(watcher_));
        retired_.push_back(std::move(store_));
        store_ = make_store();
        watcher_ = make_store();
        rdzv_->reconnected(*store_, *watcher_);
        const auto failed = co_await hold_new_lease(std::move(me));
        if (!failed.empty()) {
            throw rendezvous_error(detail::format("{}; the etcd cluster at {} grants this node no new lease: {}",
                                                  reason, client_->describe(), failed));
        }
        co_return detail::format(
            "{}; the etcd cluster at {} answers again: this node holds a new lease and rejoins the "
            "job",
            reason, client_->describe());
    }

    /// This node's lease name ("host:pid:tag"), after start_liveness().
    [[nodiscard]] const std::string& node_id() const noexcept { return node_id_; }
    /// The rounds (after start()).
    store_rendezvous<etcd_store>& rendezvous() { return *rdzv_; }
    /// The client of the etcd cluster (after start()).
    [[nodiscard]] etcd_client& client() { return *client_; }

    /// Stops renewing the lease and closes the connections (after leave()).
    void stop() noexcept {
        stopped_ = true;
        for (auto* s : {status_.get(), lease_.get(), watcher_.get(), store_.get()}) {
            if (s) s->close();
        }
        for (auto& s : retired_) {
            if (s) s->close();
        }
        if (client_) client_->close();
    }

private:
    // A new name and a new lease store, its lease held and the node counted as registered:
    // nothing, or why not.
    asio::awaitable<std::string> hold_new_lease(node_info me) {
        me.id = node_id_ = make_node_id(me.host, me.pid);
        lease_ = make_store();
        std::string failed;
        try {
            co_await rdzv_->start_liveness(*lease_, me);
        } catch (const store_error& e) {
            failed = e.what();
        } catch (const rendezvous_error& e) {
            failed = e.what();
        }
        co_return failed;
    }

    std::unique_ptr<etcd_store> make_store() const {
        etcd_store_options o;
        o.prefix = std::string(key_prefix);
        o.timeout = params_.settings.join_timeout;
        o.keep_alive_interval = params_.settings.keep_alive_interval;
        o.keep_alive_max_attempt = params_.settings.keep_alive_max_attempt;
        return std::make_unique<etcd_store>(client_, std::move(o));
    }

    // The job's keys when no node of it holds a lease: agents that all died left them (or the
    // last one left), and a new job with the id starts clean. One transaction compares "no
    // lease" over the lease names and deletes: a node whose lease exists keeps them.
    asio::awaitable<void> clear_abandoned() {
        const auto job = std::string(key_prefix) + store_rendezvous<etcd_store>::job_key(params_.run_id, "");
        const auto space = std::string(key_prefix) +
                           lease_key(store_rendezvous<etcd_store>::job_key(params_.run_id, "nodes"), "");
        // Lease names never start with "__" (the store's own keys do): [space, space"__") and
        // [space"_`", end) hold every name.
        std::vector<etcd_compare> none{
            {space, etcd_compare::target::version_count, etcd_compare::result::equal, 0, {}, space + "__"},
            {space + "_`",
             etcd_compare::target::version_count,
             etcd_compare::result::equal,
             0,
             {},
             etcd_prefix_end(space)}};
        std::vector<etcd_request> clear{etcd_request::erase(job, etcd_prefix_end(job))};
        // Compare and delete: the same again is harmless, so a lost answer is asked again.
        for (int attempt = 0;; ++attempt) {
            bool lost_answer = false;
            try {
                (void)co_await client_->txn(none, clear);
            } catch (const etcd_error& e) {
                if (!e.ambiguous() || attempt == 4) throw;
                lost_answer = true;
            }
            if (!lost_answer) break;
        }
    }

    static std::string make_node_id(const std::string& host, long pid) {
        return detail::format("{}:{}:{:04x}", host.empty() ? std::string("node") : host, pid,
                              detail::random_u64() & 0xffffu);
    }

    asio::any_io_executor executor_;
    rendezvous_parameters params_;
    log_function log_;
    std::shared_ptr<etcd_client> client_;
    std::unique_ptr<etcd_store> store_;
    std::unique_ptr<etcd_store> watcher_;
    std::unique_ptr<etcd_store> lease_;
    std::unique_ptr<etcd_store> status_;
    std::vector<std::unique_ptr<etcd_store>> retired_;
    std::optional<store_rendezvous<etcd_store>> rdzv_;
    std::optional<std::int64_t> status_index_;
    std::string node_id_;
    bool stopped_ = false;
};
using etcd_rendezvous = basic_etcd_rendezvous<>;

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL etcd_options etcd_options_for(const rendezvous_parameters& p) {
    etcd_options o;
    const auto port = [](const host_port& e) {
        return e.port.value_or(default_rendezvous_port(rendezvous_backend::etcd_v3));
    };
    o.endpoints.push_back({p.endpoint.host, port(p.endpoint)});
    for (const auto& next : p.successor_endpoints) o.endpoints.push_back({next.host, port(next)});
    o.tls = p.settings.tls;
    o.cacert = p.settings.cacert.value_or("");
    o.cert = p.settings.cert.value_or("");
    o.key = p.settings.key.value_or("");
    o.request_timeout = p.settings.read_timeout;
    // A member that does not take a connection within a heartbeat's budget is left for the next.
    o.connect_timeout = std::min<std::chrono::milliseconds>(
        p.settings.read_timeout,
        std::max<std::chrono::milliseconds>(std::chrono::seconds(1), p.settings.keep_alive_interval * 2));
    return o;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
