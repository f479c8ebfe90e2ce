// SPDX-License-Identifier: MIT
// agent_events: the agent's event log (--event-log-handler) — one event per agent step (round,
// worker started, worker exited, policy decision, restart, final worker status, shutdown) —
// and how an exception that ends the agent maps to elasticrun's exit code.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/host_name.hpp"
#include "elastic/agent/worker_environment.hpp"
#include "elastic/usage_error.hpp"
#include "elastic/agent/spec.hpp"
#include "elastic/rendezvous/parameters.hpp"
#include "elastic/policy/concepts.hpp"
#include "elastic/process/child.hpp"
#include "elastic/rendezvous/error.hpp"
#include "elastic/report/agent_error_file.hpp"
#include "elastic/report/event.hpp"
#include "elastic/report/event_sink.hpp"
#include "elastic/report/exit_codes.hpp"
#include "elastic/report/failure.hpp"
#include "elastic/process/signal_name.hpp"

#include "elastic/detail/format.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <vector>

#include <cxxabi.h>

namespace elastic::inline v0 {

namespace detail::agent {

/// What ends the agent when an exception escapes it: elasticrun's exit code, the error's type
/// as an error file names it, and its message.
struct agent_exception {
    int exit_code = exit_codes::internal;
    std::string type;
    std::string what;
};

ELASTIC_DECL std::string readable_type_name(const std::type_info& type);

/// usage_error: 2; rendezvous_error: exit_codes::rendezvous; anything else (agent_error, a
/// store or process error, std::bad_alloc, a non-std exception): exit_codes::internal.
ELASTIC_DECL agent_exception classify_exception(const std::exception_ptr& failure);

}  // namespace detail::agent

/// The agent's events, in the order they happen (docs/failure-report.md, "The event log"):
///
///   elastic.rendezvous.done       AGENT   each attempt's round (run id, restart count, ranks)
///   elastic.worker.started        WORKER  each worker (local and global rank, pid)
///   elastic.worker.exited         WORKER  each worker, in the order the agent observed the
///                                         exits, stamped with that observation
///   elastic.policy.decision       AGENT   after a failed attempt: restart or stop, and why
///   elastic.agent.restart         AGENT   the group is started again (the new restart count)
///   torchelastic.worker.status.*  WORKER  torch's per-worker status when the group ends for good
///                                         (FAILED/TERMINATED, or SUCCEEDED)
///   elastic.agent.shutdown        AGENT   the exit code and the reason
///
/// Every elastic.* event carries run_id, role and hostname (host_name(): no DNS lookup), plus
/// the sink's stamps. Metadata values are scalars (torch's EventMetadataValue); lists are
/// comma-separated text. With the null handler nothing is built.
class agent_events {
public:
    /// The null log.
    agent_events() = default;

    /// Opens `destination` for the job `rendezvous.run_id` of `workers`. Throws usage_error
    /// (nothing has started yet) when the file cannot be opened.
    agent_events(const worker_spec& workers, const rendezvous_parameters& rendezvous,
                 const event_destination& destination)
        : run_id_(rendezvous.run_id),
          role_(workers.role),
          entry_point_(workers.program.target),
          rdzv_backend_(to_string(rendezvous.backend)) {
        try {
            sink_ = event_sink(destination);
        } catch (const report_error& e) {
            throw usage_error{detail::format("--event-log-handler={}: {}", destination.to_string(), e.what())};
        }
        if (sink_.enabled()) hostname_ = host_name();
    }

    [[nodiscard]] bool enabled() const noexcept { return sink_.enabled(); }
    [[nodiscard]] event_sink& sink() noexcept { return sink_; }

    /// The attempt's round is settled: this node's rank among `group_world_size` nodes and the
    /// store its workers use. Also forgets the previous attempt's workers.
    ELASTIC_DECL void rendezvous_done(int restarts, const worker_assignment& node, std::string_view master_addr,
                                      std::uint16_t master_port) noexcept;

    /// A worker runs.
    ELASTIC_DECL void worker_started(int restarts, const worker_assignment& a, long pid) noexcept;

    /// The agent begins stopping the attempt's group (after a failure, or on a signal): exits
    /// observed from now on are the agent's doing. The first call of an attempt counts.
    void stopping_group() noexcept {
        if (stop_began_ == std::chrono::steady_clock::time_point::max()) stop_began_ = std::chrono::steady_clock::now();
    }

    /// Every observed exit of the attempt's workers, oldest first, each stamped with the moment
    /// the agent observed it. An exit observed before stopping_group() is the worker's own:
    /// SUCCEEDED or FAILED; a later one is TERMINATED (the agent ended it), as the failure
    /// summary counts them.
    ELASTIC_DECL void workers_exited(int restarts, std::span<const child_process> workers) noexcept;

    /// The restart policy answered after a failed attempt.
    ELASTIC_DECL void decision(const group_failure& failure, const restart_decision& decided) noexcept;

    /// The agent received `signal` while the policy was deciding: no decision.
    ELASTIC_DECL void decision_interrupted(int restarts, int signal) noexcept;

    /// The agent received `signal` and stops the group; the shutdown event says so.
    ELASTIC_DECL void received_signal(int signal) noexcept;

    /// The group starts again; `restarts` is the new restart count.
    ELASTIC_DECL void restart(int restarts) noexcept;

    /// torch's torchelastic.worker.status.<STATE> event for each failed or stopped worker when
    /// the group fails for good, stamped now (torch records them at the end of the run; its
    /// total_run_time counts whole seconds since the agent started).
    ELASTIC_DECL void final_status(const group_failure& failure) noexcept;

    /// torch's torchelastic.worker.status.SUCCEEDED event for each worker of the attempt when
    /// the group succeeded (torch 1.13 records one per worker, in local rank order, at the end
    /// of a successful run), stamped now. `host`: the node's fully qualified name, as the
    /// failure reports carry it (empty: the host name).
    ELASTIC_DECL void final_success(int restarts, std::string_view host) noexcept;

    /// The agent ends with `exit_code`.
    ELASTIC_DECL void shutdown(int exit_code) noexcept;

    /// The agent ends because `failure` escaped it (a rendezvous or internal error).
    ELASTIC_DECL void shutdown(const std::exception_ptr& failure) noexcept;

private:
    struct started_worker {
        long pid = 0;
        int local_rank = -1;
        int global_rank = -1;
    };

    // What every worker status event of this node says about the run.
    ELASTIC_DECL worker_event_context status_context(int restarts, std::string hostname) const;

    started_worker find_started(long pid) const {
        for (const auto& s : started_) {
            if (s.pid == pid) return s;
        }
        return {pid, -1, -1};
    }

    static ELASTIC_DECL std::string join(const std::vector<int>& values);

    ELASTIC_DECL event_metadata common() const;

    template <class Fill>
    void record_agent(std::string name, Fill fill) noexcept {
        record(std::move(name), event_source::agent, std::chrono::steady_clock::now(), std::chrono::system_clock::now(),
               fill);
    }

    template <class Fill>
    void record_worker(std::string name, std::chrono::steady_clock::time_point steady,
                       std::chrono::system_clock::time_point wall, Fill fill) noexcept {
        record(std::move(name), event_source::worker, steady, wall, fill);
    }

    template <class Fill>
    void record(std::string name, event_source source, std::chrono::steady_clock::time_point steady,
                std::chrono::system_clock::time_point wall, Fill& fill) noexcept {
        try {
            event e;
            e.name = std::move(name);
            e.source = source;
            e.metadata = common();
            fill(e.metadata);
            sink_.record(std::move(e), steady, wall);
        } catch (...) {
        }
    }

    event_sink sink_;
    std::string run_id_;
    std::string role_;
    std::string entry_point_;
    std::string rdzv_backend_;
    std::string hostname_;
    std::string pending_reason_ = "the agent stopped";
    std::vector<started_worker> started_;
    worker_assignment node_;
    std::chrono::steady_clock::time_point stop_began_ = std::chrono::steady_clock::time_point::max();
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {
namespace detail::agent {

ELASTIC_DECL std::string readable_type_name(const std::type_info& type) {
    int status = 0;
    char* readable = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
    std::string name = readable != nullptr ? readable : type.name();
    std::free(readable);
    // The versioned inline namespace is an implementation detail: elastic::agent_error.
    for (auto at = name.find("::v0::"); at != std::string::npos; at = name.find("::v0::")) {
        name.erase(at, 4);
    }
    return name;
}

ELASTIC_DECL agent_exception classify_exception(const std::exception_ptr& failure) {
    agent_exception out;
    try {
        std::rethrow_exception(failure);
    } catch (const usage_error& e) {
        out = {exit_codes::usage, "elastic::usage_error", e.what()};
    } catch (const rendezvous_error& e) {
        out = {exit_codes::rendezvous, readable_type_name(typeid(e)), e.what()};
    } catch (const std::exception& e) {
        out = {exit_codes::internal, readable_type_name(typeid(e)), e.what()};
    } catch (...) {
        out = {exit_codes::internal, "<unknown exception>",
               "an exception that is not a std::exception carries no message"};
    }
    return out;
}

}  // namespace detail::agent
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL void agent_events::rendezvous_done(int restarts, const worker_assignment& node,
                                                std::string_view master_addr, std::uint16_t master_port) noexcept {
    started_.clear();
    stop_began_ = std::chrono::steady_clock::time_point::max();
    node_ = node;
    if (!enabled()) return;
    record_agent("elastic.rendezvous.done", [&](event_metadata& m) {
        m["restart_count"] = restarts;
        m["group_rank"] = node.group_rank;
        m["group_world_size"] = node.group_world_size;
        m["local_world_size"] = node.local_world_size;
        m["world_size"] = node.world_size;
        m["rdzv_backend"] = rdzv_backend_;
        m["master_addr"] = std::string(master_addr);
        m["master_port"] = master_port;
    });
}

ELASTIC_DECL void agent_events::worker_started(int restarts, const worker_assignment& a, long pid) noexcept {
    try {
        started_.push_back({pid, a.local_rank, a.global_rank});
    } catch (...) {
        return;
    }
    if (!enabled()) return;
    record_worker("elastic.worker.started", std::chrono::steady_clock::now(), std::chrono::system_clock::now(),
                  [&](event_metadata& m) {
                      m["restart_count"] = restarts;
                      m["local_rank"] = a.local_rank;
                      m["global_rank"] = a.global_rank;
                      m["pid"] = pid;
                  });
}

ELASTIC_DECL void agent_events::workers_exited(int restarts, std::span<const child_process> workers) noexcept {
    if (!enabled()) return;
    const auto stop_began = stop_began_;
    try {
        std::vector<const child_process*> ended;
        for (const auto& w : workers) {
            if (w.status()) ended.push_back(&w);
        }
        std::stable_sort(ended.begin(), ended.end(), [](const child_process* a, const child_process* b) {
            return a->status()->steady_time < b->status()->steady_time;
        });
        for (const auto* w : ended) {
            const auto& observed = *w->status();
            const auto& s = observed.status;
            const auto who = find_started(static_cast<long>(w->pid()));
            const char* state = observed.steady_time >= stop_began ? "TERMINATED"
                                : s.success()                      ? "SUCCEEDED"
                                                                   : "FAILED";
            record_worker("elastic.worker.exited", observed.steady_time, observed.system_time, [&](event_metadata& m) {
                m["restart_count"] = restarts;
                m["local_rank"] = who.local_rank;
                m["global_rank"] = who.global_rank;
                m["pid"] = static_cast<long>(w->pid());
                m["state"] = state;
                m["exitcode"] = s.returncode();
                m["exit_status"] = s.shell_code();
                m["signal"] = s.signaled() ? event_value(signal_name(s.signal())) : event_value(nullptr);
                m["core_dumped"] = s.core_dumped;
            });
        }
    } catch (...) {
    }
}

ELASTIC_DECL void agent_events::decision(const group_failure& failure, const restart_decision& decided) noexcept {
    try {
        const auto* root = failure.root_cause();
        pending_reason_ = detail::format("the worker group failed ({}); the policy stopped: {}",
                                         root != nullptr ? failure_headline(*root) : "no worker failed on its own",
                                         decided.reason);
        if (!enabled()) return;
        record_agent("elastic.policy.decision", [&](event_metadata& m) {
            m["restart_count"] = failure.restarts;
            m["action"] = decided.restart() ? "restart" : "stop";
            m["reason"] = decided.reason;
            m["failed_global_ranks"] = join(failure.failed_global_ranks());
            m["healthy_for_ms"] = static_cast<std::int64_t>(
                std::chrono::duration_cast<std::chrono::milliseconds>(failure.healthy_for()).count());
            if (root != nullptr) {
                m["root_cause_global_rank"] = root->global_rank;
                m["root_cause_local_rank"] = root->local_rank;
                m["root_cause_pid"] = root->pid;
                m["root_cause_exitcode"] = root->status.returncode();
                m["root_cause"] = failure_headline(*root);
            } else {
                m["root_cause"] = nullptr;
            }
        });
    } catch (...) {
    }
}

ELASTIC_DECL void agent_events::decision_interrupted(int restarts, int signal) noexcept {
    received_signal(signal);
    if (!enabled()) return;
    record_agent("elastic.policy.decision", [&](event_metadata& m) {
        m["restart_count"] = restarts;
        m["action"] = "interrupted";
        m["reason"] = detail::format("received {} while deciding", signal_name(signal));
    });
}

ELASTIC_DECL void agent_events::received_signal(int signal) noexcept {
    stopping_group();
    try {
        pending_reason_ = detail::format("received {}", signal_name(signal));
    } catch (...) {
    }
}

ELASTIC_DECL void agent_events::restart(int restarts) noexcept {
    if (!enabled()) return;
    record_agent("elastic.agent.restart", [&](event_metadata& m) { m["restart_count"] = restarts; });
}

ELASTIC_DECL void agent_events::final_status(const group_failure& failure) noexcept {
    if (!enabled()) return;
    try {
        const auto ctx = status_context(failure.restarts,
                                        failure.workers.empty() ? hostname_ : failure.workers.front().host);
        for (const auto& f : failure.workers) sink_.record(worker_status_event(f, ctx));
    } catch (...) {
    }
}

ELASTIC_DECL void agent_events::final_success(int restarts, std::string_view host) noexcept {
    if (!enabled()) return;
    try {
        const auto ctx = status_context(restarts, host.empty() ? hostname_ : std::string(host));
        auto workers = started_;
        std::stable_sort(workers.begin(), workers.end(),
                         [](const started_worker& a, const started_worker& b) { return a.local_rank < b.local_rank; });
        const auto now = std::chrono::system_clock::now();
        for (const auto& w : workers) {
            sink_.record(worker_succeeded_event({w.pid, w.local_rank, w.global_rank, role_}, ctx, now));
        }
    } catch (...) {
    }
}

ELASTIC_DECL void agent_events::shutdown(int exit_code) noexcept {
    if (!enabled()) return;
    std::string reason;
    try {
        reason = exit_code == 0 ? std::string("every worker succeeded") : pending_reason_;
    } catch (...) {
    }
    record_agent("elastic.agent.shutdown", [&](event_metadata& m) {
        m["exit_code"] = exit_code;
        m["reason"] = reason;
    });
}

ELASTIC_DECL void agent_events::shutdown(const std::exception_ptr& failure) noexcept {
    if (!enabled()) return;
    try {
        const auto e = detail::agent::classify_exception(failure);
        record_agent("elastic.agent.shutdown", [&](event_metadata& m) {
            m["exit_code"] = e.exit_code;
            m["reason"] = e.exit_code == exit_codes::rendezvous ? "rendezvous error"
                          : e.exit_code == exit_codes::usage    ? "usage error"
                                                                : "internal error";
            m["error_type"] = e.type;
            m["message"] = e.what;
        });
    } catch (...) {
    }
}

ELASTIC_DECL worker_event_context agent_events::status_context(int restarts, std::string hostname) const {
    worker_event_context ctx;
    ctx.run_id = run_id_;
    ctx.entry_point = entry_point_;
    ctx.rdzv_backend = rdzv_backend_;
    ctx.agent_restarts = restarts;
    ctx.total_run_time =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - sink_.origin()).count();
    ctx.hostname = std::move(hostname);
    ctx.group_rank = node_.group_rank;
    ctx.group_world_size = node_.group_world_size;
    ctx.role_world_size = node_.role_world_size;
    ctx.role_rank_offset = node_.role_rank - node_.global_rank;
    return ctx;
}

ELASTIC_DECL std::string agent_events::join(const std::vector<int>& values) {
    std::string out;
    for (const int v : values) out += detail::format("{}{}", out.empty() ? "" : ",", v);
    return out;
}

ELASTIC_DECL event_metadata agent_events::common() const {
    event_metadata m;
    m["run_id"] = run_id_;
    m["role"] = role_;
    m["hostname"] = hostname_;
    return m;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
