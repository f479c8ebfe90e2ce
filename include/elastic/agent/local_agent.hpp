// SPDX-License-Identifier: MIT
// local_agent: one node's agent — hosts the workers' store, runs the worker group with
// torchrun's environment contract, supervises it by events, stops it on a failure or a signal,
// asks the restart policy, and ends with torchrun's failure summary and the root cause's code.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/agent/agent_log.hpp"
#include "elastic/agent/log_tree.hpp"
#include "elastic/agent/agent_events.hpp"
#include "elastic/agent/http_endpoint.hpp"
#include "elastic/agent/status.hpp"
#include "elastic/agent/output.hpp"
#include "elastic/agent/plan.hpp"
#include "elastic/agent/worker_output.hpp"
#include "elastic/agent/worker_environment.hpp"
#include "elastic/agent/worker_group.hpp"
#include "elastic/error.hpp"
#include "elastic/agent/program.hpp"
#include "elastic/agent/spec.hpp"
#include "elastic/usage_error.hpp"
#include "elastic/detail/text.hpp"
#include "elastic/rendezvous/parameters.hpp"
#include "elastic/policy/concepts.hpp"
#include "elastic/policy/spec.hpp"
#include "elastic/process/child.hpp"
#include "elastic/process/error.hpp"
#include "elastic/process/group.hpp"
#include "elastic/process/signals.hpp"
#include "elastic/process/spawn.hpp"
#include "elastic/rendezvous/concepts.hpp"
#include "elastic/rendezvous/single_node.hpp"
#include "elastic/rendezvous/tcp_rendezvous.hpp"
#include "elastic/report/agent_error_file.hpp"
#include "elastic/report/error_file.hpp"
#include "elastic/report/failure.hpp"
#include "elastic/report/stderr_tail.hpp"
#include "elastic/report/summary.hpp"
#include "elastic/store/errors.hpp"
#include "elastic/store/server.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/ip/address.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/signal_set.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include "elastic/detail/format.hpp"

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

#include <unistd.h>

namespace elastic::inline v0 {

// The etcd-v3 backend (rendezvous/etcd_rendezvous.hpp), declared only: its client is large, so
// it is complete where the agent's loop is instantiated (the launcher, launch/run.hpp), and a
// file that includes the agent without running one (a worker) does not compile it.
template <class Defer>
class basic_etcd_rendezvous;
using etcd_rendezvous = basic_etcd_rendezvous<void>;

namespace detail::agent {

/// `T`, named through `Of` so that it is complete only where a template using it is instantiated.
template <class Of, class T>
struct dependent_on {
    using type = T;
};

/// How an attempt ended.
struct attempt_outcome {
    enum class kind { succeeded, failed, signaled, aborted };  ///< aborted: by another node
    kind how = kind::succeeded;
    int signal = 0;         ///< for signaled
    group_failure failure;  ///< for failed
};

/// The rendezvous store was lost while the workers ran (instead of an abort notice): the agent
/// stops the workers, then moves the store or ends with a rendezvous_error saying `reason`.
struct store_lost {
    std::string reason;
};

/// The signals the agent handles, raced with its other waits (`||`) without losing one. A
/// signal_set wait that completes with a signal in the same turn as the other side of a race
/// is dropped by the race with its result; here the signal is kept when it arrives and only
/// take() consumes it, so the next wait completes with it at once.
template <class Defer = void>
class signal_inbox {
public:
    explicit signal_inbox(const asio::any_io_executor& executor) : set_(executor) {}

    void add(int sig) { set_.add(sig); }

    /// The next signal (one received before and not taken: at once). It stays received until
    /// take().
    asio::awaitable<int> next() {
        if (!received_) received_ = co_await set_.async_wait(detail::use_awaitable<Defer>);
        co_return *received_;
    }

    /// The received signal, consumed: call it once next() won its race.
    int take() noexcept { return std::exchange(received_, std::nullopt).value_or(0); }

private:
    asio::signal_set set_;
    std::optional<int> received_;
};

/// A loop over the job `Job` (local_agent::run_loop; the agent_loop concept is every model).
template <class Loop, class Job>
concept loop_over = requires(Loop& loop, Job& job) {
    { loop(job) } -> std::same_as<asio::awaitable<int>>;
};

}  // namespace detail::agent

/// One node's agent, in a job of one node or many: for each attempt it hosts a fresh store for
/// the workers on a port of its own (so no key of an earlier attempt is ever visible), joins the
/// round, starts `--nproc-per-node` workers with torchrun's environment, and awaits — as events,
/// with no polling — the first failure, the end of all workers, the round's abort, or a signal.
/// A failure stops the group (its signal, then SIGKILL after `--shutdown-timeout`) and the node
/// that reported it first decides with its restart policy. A signal is forwarded to the group,
/// the grace is awaited, and run() returns 128 + N.
///
/// Use it from one thread (the io_context's); run() once.
template <class Defer = void>
class basic_local_agent {
public:
    /// `workers`: what runs on this node; `rendezvous`: how this node meets the others (one
    /// node: nnodes 1, and the endpoint's port is the workers' store's when given); `options`:
    /// the agent's log level and event log; `env`: the agent's environment, which every worker
    /// inherits. Throws usage_error for what is not implemented yet and for a program that
    /// cannot run. launch_config gives all three: `local_agent(ex, c.workers(), c.rendezvous(),
    /// c.agent(), env)`.
    basic_local_agent(asio::any_io_executor executor, worker_spec workers, rendezvous_parameters rendezvous,
                      const agent_options& options, environment env, std::string name = "elasticrun")
        : executor_(std::move(executor)),
          spec_(std::move(workers)),
          params_(std::move(rendezvous)),
          env_(std::move(env)),
          log_(std::move(name), options.agent_log_level) {
        shown_ = options;
        detail::agent::check_spec(spec_);
        detail::agent::check_supported(params_);
        // Before anything reads env_: the workers inherit it, and must not inherit the secret.
        load_rendezvous_secret(params_.settings, env_, [this](std::string_view line) { log_.warning(line); });
        command_ = resolve_program(spec_.program, env_);
        store_ = detail::agent::plan_store(params_);
        several_ = uses_node_rendezvous(params_);
        // Opens --event-log-handler=file:PATH (usage_error if it cannot).
        events_ = agent_events(spec_, params_, options.event_log_handler);
    }

    /// What one attempt came to; each kind names the job<R> step that concludes it.
    struct step {
        enum class kind {
            succeeded,  ///< this node's workers all succeeded: finish()
            failed,     ///< a worker here failed first, and this node decides for the job: decide()
            follows,    ///< another node reported a failure first: follow() its decision
            signaled,   ///< this agent received `signal` (its workers are stopped): interrupted()
            again,      ///< the membership changed, or the rendezvous store was recovered: attempt() again
        };
        kind how = kind::again;
        int signal = 0;                ///< signaled
        group_failure failure;         ///< failed; follows, when a worker of this node failed too
        bool own_failure = false;      ///< `failure` holds this node's failed group
        std::uint64_t attempt_id = 0;  ///< set by job::attempt(); the conclusions check it

        /// The kind in one word ("succeeded", "failed", "follows", "signaled", "again").
        [[nodiscard]] static std::string_view name(kind k) noexcept {
            constexpr std::string_view names[] = {"succeeded", "failed", "follows", "signaled", "again"};
            return names[static_cast<int>(k)];
        }
    };

    /// One node's part in a running job, over the rendezvous `R`: the steps a loop is made of.
    /// Each awaits the agent's signals too (a signal ends the step early, as the step says).
    /// `R` is an agent_rendezvous (run_loop's constraint; clang 14 crashes on a constrained
    /// member template named in another member's requires-clause).
    template <class R>
    class job {
    public:
        /// Joins the next round, starts the workers, supervises them to the first failure, the
        /// end of every worker, the round's abort or a signal, and stops and closes the group.
        /// A failure here is reported to every node (failed: this node's report came first).
        /// The step must be concluded (unless it is `again`) before the next attempt().
        asio::awaitable<step> attempt() {
            if (open_) {
                throw agent_error(
                    detail::format("job::attempt() while attempt {}'s step is not concluded: finish, "
                                   "decide, follow or interrupted comes first (the agent's loop is wrong)",
                                   attempts_));
            }
            auto s = co_await agent_.attempt_step(rdzv_, signals_);
            s.attempt_id = ++attempts_;
            open_ = s.how != step::kind::again;
            open_how_ = s.how;
            co_return s;
        }

        /// succeeded: the exit barrier. The job's exit code (0, or 128 + N for a signal
        /// meanwhile), or — when the round was aborted after all — what follow() returns.
        asio::awaitable<std::optional<int>> finish(step& s) {
            conclude(s, "finish");
            co_return co_await agent_.finish_step(rdzv_, signals_, s);
        }

        /// failed: asks `policy` (raced with the signals) and publishes its answer as the job's.
        /// The exit code when the job stops (the root cause's; 128 + N for a signal meanwhile),
        /// nullopt when it restarts.
        template <restart_policy P>
        asio::awaitable<std::optional<int>> decide(step& s, P& policy) {
            conclude(s, "decide");
            co_return co_await agent_.decide_step(rdzv_, signals_, s, policy);
        }

        /// follows: the deciding node's answer, as decide() returns it.
        asio::awaitable<std::optional<int>> follow(step& s) {
            conclude(s, "follow");
            co_return co_await agent_.follow_step(rdzv_, signals_, s);
        }

        /// signaled: tells the other nodes (the job stops, or re-forms without this node under
        /// elastic membership) and returns 128 + N.
        asio::awaitable<int> interrupted(const step& s) {
            conclude(s, "interrupted");
            co_return co_await agent_.interrupted_step(rdzv_, s);
        }

        /// Job-wide restarts so far (the workers' TORCHELASTIC_RESTART_COUNT).
        [[nodiscard]] int restart_count() const { return rdzv_.restart_count(); }
        [[nodiscard]] basic_local_agent& agent() noexcept { return agent_; }
        [[nodiscard]] R& rendezvous() noexcept { return rdzv_; }

    private:
        friend class basic_local_agent;
        job(basic_local_agent& agent, R& rdzv, detail::agent::signal_inbox<Defer>& signals)
            : agent_(agent), rdzv_(rdzv), signals_(signals) {}

        // Each attempt is concluded once, by the step its kind names (checked by the agent).
        void conclude(const step& s, std::string_view call) {
            if (!open_ || s.attempt_id != attempts_) {
                throw agent_error(detail::format("job::{}() on a step that is not the open one (attempt {} of {}{}): "
                                                 "each attempt is concluded once (the agent's loop is wrong)",
                                                 call, s.attempt_id, attempts_, open_ ? "" : ", none open"));
            }
            open_ = false;
        }

        basic_local_agent& agent_;
        R& rdzv_;
        detail::agent::signal_inbox<Defer>& signals_;
        std::uint64_t attempts_ = 0;                        ///< attempt() calls so far
        bool open_ = false;                                 ///< the last attempt's step awaits its conclusion
        typename step::kind open_how_ = step::kind::again;  ///< that step's kind
    };

    /// Runs the job to its end and returns elasticrun's exit code: 0 when every worker
    /// succeeded; the root cause's code (128 + N for signal N) when the policy stops after a
    /// failure; 128 + N when the agent received signal N. Throws agent_error when the agent
    /// itself cannot go on (workers are stopped first). The loop is policy_loop(job, policy)
    /// over a single_node_rendezvous for one node, a tcp_rendezvous (static or c10d) for several,
    /// an etcd_rendezvous for etcd-v3.
    template <restart_policy Policy>
    asio::awaitable<int> run(Policy& policy) {
        auto loop = [&policy]<agent_rendezvous R>(job<R>& j) { return policy_loop(j, policy); };
        co_return co_await run_loop(loop);
    }

    /// The same with a loop of the caller's (an agent_loop): `loop(job)` is awaited once, with
    /// the job joined, and returns the exit code; it goes through the job with job<R>'s steps
    /// (see policy_loop, the loop run() uses, and examples/custom_agent.cpp). It is called with
    /// every rendezvous model, so its call is a template whose return type is written out,
    /// `asio::awaitable<int>` (not deduced). `loop` must outlive the awaitable. A loop that
    /// returns with an attempt's step not concluded gets agent_error.
    // clang-format off
    template <class Loop>
        requires detail::agent::loop_over<Loop, job<single_node_rendezvous>> &&
                 detail::agent::loop_over<Loop, job<tcp_rendezvous>> &&
                 detail::agent::loop_over<Loop, job<etcd_rendezvous>>
    asio::awaitable<int> run_loop(Loop& loop) {
        // clang-format on
        if (params_.backend == rendezvous_backend::etcd_v3) {
            // Complete only where the loop is instantiated (the launcher includes it).
            typename detail::agent::dependent_on<Loop, etcd_rendezvous>::type rdzv(executor_, params_,
                                                                                   [this](std::string_view line) {
                                                                                       log_.warning(line);
                                                                                   });
            co_return co_await run_loop(loop, rdzv);
        }
        if (several_) {
            tcp_rendezvous rdzv(executor_, params_, [this](std::string_view line) { log_.warning(line); });
            co_return co_await run_loop(loop, rdzv);
        }
        single_node_rendezvous rdzv;
        co_return co_await run_loop(loop, rdzv);
    }

    /// The same over a rendezvous of the caller's. The constructor's rendezvous_parameters still
    /// decide what the agent does as one node or several (the log lines, the workers' store's
    /// address and allow-list, the node's name), so they must describe the same job: one node
    /// for single_node_rendezvous, several (uses_node_rendezvous) for any other model. It joins
    /// `rdzv`, keeps its membership for as long as `loop` runs, and stops it before returning.
    // clang-format off
    template <class Loop, agent_rendezvous R>
        requires detail::agent::loop_over<Loop, job<R>>
    asio::awaitable<int> run_loop(Loop& loop, R& rdzv) {
        // clang-format on
        using namespace asio::experimental::awaitable_operators;
        // What the agent shows while it runs (the status file, --metrics-port, the health
        // check) runs beside the loop, from before the first round until the end.
        open_status();
        auto ran = co_await (detail::settle(run_loop_inner(loop, rdzv)) || show_status(rdzv));
        close_status();
        if (ran.index() == 1) throw agent_error("the status publisher ended on its own");
        co_return std::get<0>(ran).take();
    }

private:
    // clang-format off
    template <class Loop, agent_rendezvous R>
        requires detail::agent::loop_over<Loop, job<R>>
    asio::awaitable<int> run_loop_inner(Loop& loop, R& rdzv) {
        // clang-format on
        using namespace asio::experimental::awaitable_operators;
        // Installed first: a signal during start-up or a restart is handled like any other.
        detail::agent::signal_inbox<Defer> signals(executor_);
        prepare_agent_signals();
        // The stores this agent hosts hold a descriptor per client; workers get the old limit
        // back when they are spawned.
        detail::process::raise_open_files_limit();
        for (const int s : spec_.signals_to_handle) signals.add(s);
        if (sets_omp_num_threads(spec_, env_)) log_.warning(omp_warning());
        if (spec_.file_timer && !file_timers_) {
            try {
                file_timers_ = std::make_unique<file_timer_server>(executor_, spec_.file_timer_path);
            } catch (const std::system_error& e) {
                throw agent_error(
                    detail::format("cannot serve torch's file timer (TORCHELASTIC_ENABLE_FILE_TIMER=1): {}", e.what()));
            }
            log_.info(detail::format("serving torch's file timer at {} (TORCHELASTIC_TIMER_FILE)",
                                     file_timers_->path().string()));
        }

        // Hosts or reaches the job's store, then holds this node's liveness there.
        const auto me = this_node();
        auto joined = co_await (detail::settle(rdzv.join(me)) || signals.next());
        if (joined.index() == 1) {
            rdzv.stop();
            co_return 128 + signals.take();
        }
        try {
            (void)std::get<0>(joined).take();
        } catch (...) {
            rdzv.stop();
            throw;
        }
        // The loop, beside the observer of the job's membership (lost nodes), which runs for as
        // long as this node is in the job.
        job<R> j(*this, rdzv, signals);
        auto both = co_await (detail::settle(loop(j)) || rdzv.keep_membership());
        rdzv.stop();
        round_store_.reset();
        report_incomplete_logs();  // however the loop ended
        if (both.index() == 1) throw agent_error("the membership observer ended on its own");
        auto& rounds = std::get<0>(both);
        if (const auto lost = store_loss(rounds.error)) throw rendezvous_error(*lost);
        try {
            const int code = rounds.take();
            if (j.open_) {
                throw agent_error(detail::format("the agent's loop returned {} with attempt {}'s step ({}) not "
                                                 "concluded: finish, decide, follow or interrupted comes first "
                                                 "(the agent's loop is wrong)",
                                                 code, j.attempts_, step::name(j.open_how_)));
            }
            co_return code;
        } catch (const rendezvous_closed& e) {
            log_.warning(detail::format("[{}] {}; exiting 0", spec_.role, e.what()));
            co_return 0;
        }
    }

public:
    /// The loop run(policy) runs: attempts until the job succeeds, stops or this agent is
    /// signalled; a failure here that reached the others first is decided by `policy`.
    template <agent_rendezvous R, restart_policy P>
    static asio::awaitable<int> policy_loop(job<R>& j, P& policy) {
        for (;;) {
            auto s = co_await j.attempt();
            std::optional<int> code;
            switch (s.how) {
                case step::kind::again: continue;
                case step::kind::signaled: co_return co_await j.interrupted(s);
                case step::kind::succeeded: code = co_await j.finish(s); break;
                case step::kind::failed: code = co_await j.decide(s, policy); break;
                case step::kind::follows: code = co_await j.follow(s); break;
            }
            if (code) co_return *code;
        }
    }

    /// Where the workers' store of the current (or last) attempt listens: MASTER_ADDR, MASTER_PORT.
    [[nodiscard]] const std::string& master_addr() const noexcept { return store_.master_addr; }
    [[nodiscard]] std::uint16_t master_port() const noexcept { return master_port_; }
    /// The event log (--event-log-handler); elastic::run records the shutdown through it.
    [[nodiscard]] agent_events& events() noexcept { return events_; }
    /// The agent's log (LOGLEVEL); elastic::run prints the launch configuration through it.
    [[nodiscard]] const agent_log& log() const noexcept { return log_; }

private:
    using attempt_outcome = detail::agent::attempt_outcome;
    using kind = attempt_outcome::kind;

    /// job<R>::attempt().
    template <agent_rendezvous R>
    asio::awaitable<step> attempt_step(R& rdzv, detail::agent::signal_inbox<Defer>& signals) {
        abort_won_ = false;
        last_abort_.reset();
        store_lost_.reset();
        step s;
        auto attempt = co_await detail::settle(run_attempt(rdzv, signals));
        if (const auto why = store_loss(attempt.error)) {
            co_await recover(rdzv, *why);
            co_return s;
        }
        auto outcome = attempt.take();
        if (outcome.how == kind::aborted && store_lost_) {
            co_await recover(rdzv, store_lost_->reason);
            co_return s;
        }
        if (outcome.how == kind::aborted && membership_changed()) {
            log_membership_restart(rdzv.restart_count());
            co_return s;
        }
        if (outcome.how == kind::signaled) {
            s.how = step::kind::signaled;
            s.signal = outcome.signal;
            co_return s;
        }
        if (outcome.how == kind::succeeded) {
            s.how = step::kind::succeeded;
            co_return s;
        }
        if (outcome.how == kind::failed) {
            for (const auto* f : outcome.failure.failures()) log_.error(failure_log_line(*f, spec_.program.target));
            s.failure = std::move(outcome.failure);
            s.own_failure = true;
        }
        if (membership_changed()) {
            // A membership change ended the round first: no decision, nothing counted.
            log_membership_restart(rdzv.restart_count());
            co_return s;
        }
        s.how = outcome.how == kind::failed && abort_won_ ? step::kind::failed : step::kind::follows;
        co_return s;
    }

    /// job<R>::finish(): the exit barrier.
    template <agent_rendezvous R>
    asio::awaitable<std::optional<int>> finish_step(R& rdzv, detail::agent::signal_inbox<Defer>& signals, step& s) {
        using namespace asio::experimental::awaitable_operators;
        expect(s, step::kind::succeeded, "finish");
        auto barrier = co_await (detail::settle(rdzv.finish(exit_barrier_timeout())) || signals.next());
        if (barrier.index() == 1) {
            const int sig = signals.take();
            co_await abort_for_signal(rdzv, sig);
            co_return 128 + sig;
        }
        if (const auto why = store_loss(std::get<0>(barrier).error)) {
            co_await recover(rdzv, *why);
            co_return std::nullopt;
        }
        auto result = std::get<0>(barrier).take();
        if (result.how != barrier_result::kind::aborted) {
            if (result.how == barrier_result::kind::timed_out) log_barrier_timeout(result);
            round_store_.reset();  // every node is done: no worker needs group rank 0's store
            events_.final_success(rdzv.restart_count(), host_);
            // The store's host may stay for nodes still working, for as long as they are: a
            // signal ends that.
            auto left = co_await (detail::settle(rdzv.leave()) || signals.next());
            remove_run_dir();
            if (left.index() == 1) {
                const int sig = signals.take();
                log_.warning(
                    detail::format("[{}] this node's workers succeeded; {} received while leaving the job (the "
                                   "rendezvous store hosted here may still serve other nodes): stopping",
                                   spec_.role, signal_to_string(sig)));
                co_return 128 + sig;
            }
            std::get<0>(left).take();
            co_return 0;
        }
        last_abort_ = result.abort;
        if (membership_changed()) {
            log_membership_restart(rdzv.restart_count());
            co_return std::nullopt;
        }
        log_.warning(detail::format("[{}] this node's workers succeeded, but the job's round was aborted: {}",
                                    spec_.role, describe_abort()));
        co_return co_await await_decision(rdzv, signals, s);
    }

    /// job<R>::decide().
    template <agent_rendezvous R, restart_policy P>
    asio::awaitable<std::optional<int>> decide_step(R& rdzv, detail::agent::signal_inbox<Defer>& signals, step& s,
                                                    P& policy) {
        using namespace asio::experimental::awaitable_operators;
        expect(s, step::kind::failed, "decide");
        s.failure.restarts = rdzv.restart_count();
        // A policy about to wait before its restart (a backoff) says so first: the restart line
        // is logged as the wait starts, "restarting ... in 1.8 s", and not again after it.
        std::optional<std::string> announced;  // the reason announced
        s.failure.before_delay = [&](const restart_decision& d, std::chrono::steady_clock::duration delay) {
            announced = d.reason;
            // Several nodes: the restart this decision makes is the job's next one.
            log_.warning(detail::format("[{}] {}; {}: {}", spec_.role, failed_what(s), d.reason,
                                        restarting(rdzv.restart_count() + 1, delay)));
        };
        auto decided = co_await (detail::settle(policy(s.failure)) || signals.next());
        s.failure.before_delay = nullptr;
        if (decided.index() == 1) {
            const int sig = signals.take();
            events_.decision_interrupted(rdzv.restart_count(), sig);
            log_.warning(detail::format("received {} while deciding on a restart; the workers are stopped already; "
                                        "exiting with {}",
                                        signal_to_string(sig), 128 + sig));
            // Named: g++ 12 destroys a prvalue argument of a co_awaited call twice.
            const job_decision stop_now{false, 128 + sig,
                                        detail::format("the deciding node received {}", signal_to_string(sig))};
            (void)co_await rdzv.decide(stop_now);  // this node exits on the signal whatever stands
            co_return 128 + sig;
        }
        const auto d = std::get<0>(decided).take();
        const auto* root = s.failure.root_cause();
        const job_decision decision{d.restart(), root ? launcher_exit_code(*root) : 1, d.reason};
        // What stands: this decision, or another node's regroup when this one was taken for lost.
        const auto standing = co_await rdzv.decide(decision);
        if (!standing.regroup) events_.decision(s.failure, d);
        // Announced already, unless what stands says something else (another node's decision, or
        // a policy that announced a restart and then answered otherwise).
        const bool said = announced && standing.restart && !standing.regroup && *announced == standing.reason;
        co_return co_await conclude(rdzv, s, standing, said);
    }

    /// job<R>::follow().
    template <agent_rendezvous R>
    asio::awaitable<std::optional<int>> follow_step(R& rdzv, detail::agent::signal_inbox<Defer>& signals, step& s) {
        expect(s, step::kind::follows, "follow");
        co_return co_await await_decision(rdzv, signals, s);
    }

    /// job<R>::interrupted().
    template <agent_rendezvous R>
    asio::awaitable<int> interrupted_step(R& rdzv, const step& s) {
        expect(s, step::kind::signaled, "interrupted");
        co_await abort_for_signal(rdzv, s.signal);
        co_return 128 + s.signal;
    }

    /// Another node decides the aborted round: its decision, awaited with the signals.
    template <agent_rendezvous R>
    asio::awaitable<std::optional<int>> await_decision(R& rdzv, detail::agent::signal_inbox<Defer>& signals, step& s) {
        using namespace asio::experimental::awaitable_operators;
        auto followed = co_await (detail::settle(rdzv.await_decision()) || signals.next());
        if (followed.index() == 1) co_return 128 + signals.take();
        if (const auto why = store_loss(std::get<0>(followed).error)) {
            co_await recover(rdzv, *why);
            co_return std::nullopt;
        }
        const auto decision = std::get<0>(followed).take();
        co_return co_await conclude(rdzv, s, decision);
    }

    /// The job's decision for the aborted round, acted on: a restart (nullopt), or a stop with
    /// this node's failure report (when its workers failed) and the job's exit code.
    /// `announced`: the restart line was logged already, as the policy's wait began.
    template <agent_rendezvous R>
    asio::awaitable<std::optional<int>> conclude(R& rdzv, const step& s, const job_decision& decision,
                                                 bool announced = false) {
        const auto what = failed_what(s);
        if (decision.regroup) {
            log_.warning(detail::format("[{}] {}; {}: restarting every node's worker group (a membership restart: "
                                        "TORCHELASTIC_RESTART_COUNT stays {}, --max-restarts is not spent)",
                                        spec_.role, what, decision.reason, rdzv.restart_count()));
            ++status_.restarts_total;
            co_return std::nullopt;
        }
        if (decision.restart) {
            if (announced) {
                events_.restart(rdzv.restart_count());
                ++status_.restarts_total;
                co_return std::nullopt;
            }
            log_.warning(detail::format("[{}] {}; {}: {}", spec_.role, what, decision.reason,
                                        restarting(rdzv.restart_count())));
            events_.restart(rdzv.restart_count());
            ++status_.restarts_total;
            co_return std::nullopt;
        }
        log_.warning(detail::format("[{}] {}; {}: {}", spec_.role, what, decision.reason,
                                    several_ ? "stopping the job" : "stopping"));
        if (s.own_failure) (void)finish_failed(s.failure);
        co_await rdzv.leave();
        co_return decision.exit_code;
    }

    /// The restart line's action: "restarting the worker group", or on several nodes "restarting
    /// every node's worker group (job-wide restart N)"; with `delay`, "... in 1.8 s" before N.
    std::string restarting(int job_restart, std::optional<std::chrono::steady_clock::duration> delay = {}) const {
        std::string out = several_ ? "restarting every node's worker group" : "restarting the worker group";
        if (delay) out += " in " + duration_words(*delay);
        if (several_) out += detail::format(" (job-wide restart {})", job_restart);
        return out;
    }

    /// A job<R> step called on a step of another kind: the caller's loop is wrong.
    static void expect(const step& s, typename step::kind want, std::string_view call) {
        if (s.how == want) return;
        throw agent_error(detail::format("job::{}() is for a step that {}, and this one {}: the agent's loop is wrong",
                                         call, step::name(want), step::name(s.how)));
    }

    /// What ended the round, for the restart or stop line: one node names its first failure;
    /// several name the node that reported (or this node's workers).
    std::string failed_what(const step& s) const {
        if (!several_) return detail::format("worker group failed ({})", headline(s.failure));
        return last_abort_ ? describe_abort() : std::string("this node's workers failed");
    }

    std::string headline(const group_failure& failure) const {
        const auto* root = failure.root_cause();
        if (root == nullptr) return "no worker failed on its own";
        if (root->hang) return detail::format("local_rank {} {}", root->local_rank, root->hang->headline());
        return detail::format("local_rank {} {}", root->local_rank, root->status.describe());
    }

    /// A Python worker that failed on a missing module most often ran under another Python than
    /// the one the user installed it for: says which interpreter ran and how to choose one.
    std::optional<std::string> python_module_hint(const group_failure& failure) const {
        if (command_.kind != program_kind::python_script && command_.kind != program_kind::python_module) {
            return std::nullopt;
        }
        static constexpr std::string_view marker = "ModuleNotFoundError: No module named ";
        for (const auto& w : failure.workers) {
            for (const auto& line : w.stderr_tail.lines) {
                const auto at = line.find(marker);
                if (at == std::string::npos) continue;
                const auto python_exec = env_.find("PYTHON_EXEC");
                const bool chosen = python_exec != env_.end() && !python_exec->second.empty();
                return detail::format("the workers ran with {} ({}) and it has no module {}: set PYTHON_EXEC to the "
                                      "Python that has it (such as /usr/bin/python3 for Debian's packages)",
                                      command_.path,
                                      chosen ? "PYTHON_EXEC" : "PYTHON_EXEC unset: the first python3 on PATH",
                                      line.substr(at + marker.size()));
            }
        }
        return std::nullopt;
    }

    int finish_failed(const group_failure& failure) {
        events_.final_status(failure);
        log_.always(format_summary(spec_.program.target, failure.workers));
        if (const auto hint = python_module_hint(failure)) log_.warning(*hint);
        if (const auto* root = failure.root_cause()) {
            if (const auto it = env_.find("TORCHELASTIC_ERROR_FILE"); it != env_.end() && !it->second.empty()) {
                try {
                    write_agent_error_file(it->second, *root);
                } catch (const std::exception& e) {
                    log_.error(e.what());
                }
            }
            return launcher_exit_code(*root);
        }
        return 1;
    }

    /// At the end of the agent's loop, however it ended (after the failure summary): the log
    /// files that miss bytes (docs/logs.md, "When a log file cannot be written").
    void report_incomplete_logs() const {
        if (incomplete_logs_.empty()) return;
        std::string lines;
        for (const auto& line : incomplete_logs_) lines += "\n  " + line;
        log_.error(detail::format("{} of this node's log files {} incomplete (writes to them failed; the exit code is "
                                  "the workers' all the same):{}",
                                  incomplete_logs_.size(), incomplete_logs_.size() == 1 ? "is" : "are", lines));
    }

    void log_barrier_timeout(const barrier_result& result) {
        std::string missing;
        for (std::size_t i = 0; i < result.missing.size(); ++i) {
            missing += detail::format("{}group_rank {} ({})", i ? ", " : "", result.missing[i],
                                      result.missing_hosts[i]);
        }
        log_.error(detail::format("exit barrier: this node's workers succeeded, but {} did not finish within {} s "
                                  "(--rdzv-conf exit_barrier_timeout); exiting anyway",
                                  missing, detail::seconds_text(exit_barrier_timeout())));
    }

    /// After a success: the temporary tree goes (torchrun leaks it) unless it holds logs the
    /// user asked for with -r/-t; a --log-dir tree always stays.
    void remove_run_dir() noexcept {
        if (logs_ && !writes_log_files(spec_)) logs_->remove_temporary();
    }

    /// The attempt's directory of the log tree (docs/logs.md), torchrun's layout
    /// <log_dir or tmp>/<run_id>_XXXXXX/attempt_<n>/<local_rank>/; an earlier attempt's
    /// directory is never wiped. Empty with --log-dir=/dev/null. `attempt`: the restart count the
    /// workers see.
    std::filesystem::path attempt_dir(int attempt) {
        if (!logs_) logs_.emplace(spec_.log_dir, params_.run_id, detail::agent::temp_base(env_));
        const bool first = logs_->run_dir().empty();
        auto dir = logs_->make_attempt(attempt, spec_.nproc_per_node);
        if (first && !logs_->run_dir().empty())
            log_.info(detail::format("log directory set to: {}", logs_->run_dir().string()));
        return dir;
    }

    /// One attempt: a fresh workers' store, the round joined with it, the group started and
    /// supervised until the first failure, the end of every worker, the round's abort or a
    /// signal, then the group stopped and closed.
    template <agent_rendezvous R>
    asio::awaitable<attempt_outcome> run_attempt(R& rdzv, detail::agent::signal_inbox<Defer>& signals) {
        using namespace asio::experimental::awaitable_operators;
        const int n = spec_.nproc_per_node;

        // A fresh store for this attempt: a dead worker's last requests, still in flight on its
        // old connection, can never land in the new attempt's key space (PyTorch 1.13 keys by
        // restart count, newer PyTorch and native workers do not key by attempt at all).
        store_server_options options;
        options.host = store_.bind_host;
        options.port = store_.port;
        options.log = [this](std::string_view line) { log_.warning(detail::format("store: {}", line)); };
        options.on_request = [count = store_requests_](wire::op) { count->fetch_add(1, std::memory_order_relaxed); };
        // Every node's agent and workers, in the largest round: two connections per worker (a
        // PyTorch 1.13 TCPStore opens a second one for watch_key), and at least eight workers
        // per node, as other nodes may run more than this one.
        options.make_room_for(static_cast<std::size_t>(std::max(1, params_.nnodes.max)) *
                              (2 * static_cast<std::size_t>(std::max(8, n)) + 1));
        if (several_ && !params_.settings.workers_store_any_peer) {
            // PyTorch workers cannot authenticate: the store accepts this node's loopback and,
            // once the round is known, its members' addresses (join_round fills the list).
            auto peers = std::make_shared<detail::rendezvous::peer_list>();
            workers_peers_ = peers;
            options.accept_peer = [peers](const asio::ip::address& a) { return peers->accepts(a); };
        }
        // A fixed port: the previous round's workers' store (group rank 0) goes first, as it
        // holds the port. Else it goes after the new one is bound, so the new one never gets
        // the old port back (a late worker of the old round would reach the new store).
        if (store_.port != 0) round_store_.reset();
        std::unique_ptr<tcp_store_server> server;
        try {
            server = std::make_unique<tcp_store_server>(executor_, std::move(options));
            server->start();
        } catch (const store_error& e) {
            throw agent_error(detail::format("cannot host the workers' store: {}", e.what()));
        }
        master_port_ = server->port();
        round_store_.reset();
        show_state("joining");
        if (const auto sig = co_await join_round(rdzv, *server, signals)) {
            server->stop();
            attempt_outcome interrupted;
            interrupted.how = kind::signaled;
            interrupted.signal = *sig;
            co_return interrupted;
        }
        const int restarts = round_->restart_count;
        ++status_.rounds_total;
        status_.round = round_->number;
        status_.group_rank = round_->group_rank;
        status_.group_world_size = round_->group_world_size;
        status_.world_size = round_->world_size;
        status_.restarts = restarts;
        status_.store = detail::format("{}:{}", store_.master_addr, master_port_);
        status_changed_.notify();
        events_.rendezvous_done(restarts, node_worker(0, n), store_.master_addr, master_port_);
        auto& server_ref = *server;
        // Group rank 0's store serves every node's workers until the round ends (all nodes done,
        // or an abort), not only while this node's own workers run.
        if (round_->group_rank == 0) round_store_ = std::move(server);

        group_attempt attempt;
        attempt.told = attempt_settings{restarts, store_.master_addr, master_port_, {}, params_.run_id};
        attempt.dir = attempt_dir(restarts);
        for (int i = 0; i < n; ++i) attempt.ranks.push_back(node_worker(i, n));
        worker_group group(executor_, spec_, command_, events_, log_);
        if (file_timers_) group.serve_file_timers(*file_timers_);
        group.notify_changes(status_changed_);
        // A worker that cannot be started: the group has stopped the others already.
        // The status reads the group while it lives (shown_group is cleared however this ends).
        shown_group_ = &group;
        struct unshow {
            const worker_group** group;
            ~unshow() { *group = nullptr; }
        } unshow_group{&shown_group_};
        try {
            co_await group.start(attempt, env_);
        } catch (...) {
            server_ref.stop();
            throw;
        }
        show_state("running");

        // The first failure, the end of every worker, another node's abort, or a signal.
        attempt_outcome outcome;
        std::optional<std::size_t> first_failure;
        log_.info(detail::format("[{}] started {} workers (attempt {}; store at {}:{})", spec_.role, n, restarts,
                                 store_.master_addr, master_port_));
        if (host_.empty()) host_ = host_fqdn();  // once, while the workers run (it may ask DNS)
        // Settled: `||` waits for one side to succeed, so a supervision error must not wait for a
        // signal; it is rethrown here (the group, dropped, kills what still runs).
        auto first = co_await (detail::settle(watch_job(rdzv, group)) || signals.next());
        if (first.index() == 1) {
            outcome.how = kind::signaled;
            outcome.signal = signals.take();
        } else if (const auto i = std::get<0>(first).take(); i == aborted_by_job) {
            outcome.how = kind::aborted;
        } else if (i < group.size()) {
            outcome.how = kind::failed;
            first_failure = i;
        }

        switch (outcome.how) {
            case kind::succeeded: break;
            case kind::signaled:
                show_state("stopping");
                co_await stop_on_signal(group, outcome.signal);
                break;
            case kind::aborted:  // another node's failure
                show_state("stopping");
                (void)co_await group.stop(SIGTERM);
                break;
            case kind::failed: {
                show_state("stopping");
                status_.hangs_total += group.hangs().size();
                // Abort the round for every node, then stop the others (the signal the agent would
                // send, SIGTERM), racing the signals the agent handles — one arriving now is
                // forwarded and wins.
                // Hung workers first give their stacks (bounded by --watchdog dump=).
                co_await group.capture_stacks();
                // Named: g++ 12 destroys a prvalue argument of a co_awaited call twice.
                const auto what = group.describe_failure(*first_failure);
                co_await report_failure(rdzv, what, group.assignment(*first_failure));
                events_.stopping_group();
                auto stopped = co_await (group.stop(SIGTERM) || signals.next());
                if (stopped.index() == 1) {
                    outcome.how = kind::signaled;
                    outcome.signal = signals.take();
                    co_await stop_on_signal(group, outcome.signal);
                } else {
                    outcome.failure = group.failure(*first_failure, host_);
                }
                break;
            }
        }
        co_await group.close();
        timer_expiries_ended_ += group.timer_expiries();
        status_.ranks = group.rank_statuses();  // as they ended, until the next attempt starts
        show_state(outcome.how == kind::succeeded  ? "finishing"
                   : outcome.how == kind::signaled ? "stopping"
                                                   : "deciding");
        for (const auto& [file, why] : group.incomplete_logs()) incomplete_logs_.push_back(file + ": " + why);
        // After a success, group rank 0's store keeps serving the other nodes' workers.
        if (outcome.how != kind::succeeded) server_ref.stop();
        co_return outcome;
    }

    asio::awaitable<void> stop_on_signal(worker_group& group, int sig) {
        events_.received_signal(sig);
        log_.warning(detail::format("received {}: forwarding it to the worker group (grace {} s, then SIGKILL)",
                                    signal_to_string(sig), detail::seconds_text(spec_.shutdown_timeout)));
        (void)co_await group.stop(sig);
        log_.warning(detail::format("worker group stopped; exiting with {}", 128 + sig));
    }

    // ---- the rendezvous (docs/rendezvous.md; include/elastic/rendezvous/) ----

    /// watch_job()'s answer when another node aborted the round.
    static constexpr std::size_t aborted_by_job = static_cast<std::size_t>(-1);

    /// This node as the job sees it before a round: its name (several nodes only: one node
    /// needs none, and getfqdn() may ask DNS before the first worker starts), workers and pid.
    node_info this_node() {
        node_info me;
        if (several_) me.host = node_host();
        me.nproc = spec_.nproc_per_node;
        me.role = spec_.role;
        me.pid = static_cast<long>(::getpid());
        return me;
    }

    /// This node's name for the others: --local-addr, else the host name (getfqdn() may ask
    /// DNS: not when every node is on this machine, a loopback endpoint).
    const std::string& node_host() {
        if (host_.empty()) {
            if (params_.local_addr) {
                host_ = *params_.local_addr;
            } else if (detail::rendezvous::is_loopback(params_.endpoint.host)) {
                host_ = host_name();
            } else {
                host_ = host_fqdn();
            }
        }
        return host_;
    }

    /// --rdzv-conf exit_barrier_timeout, else 300 s (torchrun's fixed value).
    [[nodiscard]] std::chrono::milliseconds exit_barrier_timeout() const {
        return params_.settings.exit_barrier_timeout.value_or(std::chrono::seconds(300));
    }

    /// The message of `error` when the rendezvous store is lost: a store_lost_error (the lease
    /// connection ended), or another store_error (a request to the store failed), which the agent
    /// treats alike; nullopt for any other error.
    static std::optional<std::string> store_loss(const std::exception_ptr& error) {
        if (!error) return std::nullopt;
        try {
            std::rethrow_exception(error);
        } catch (const store_lost_error& e) {
            return std::string(e.what());
        } catch (const store_error& e) {
            return detail::format("lost the rendezvous store: {}", e.what());
        } catch (...) {
        }
        return std::nullopt;
    }

    /// The rendezvous store was lost (`why`, workers stopped already): the rendezvous rejoins
    /// it or moves the job, and this node goes on at the next round; rendezvous_error when the
    /// job cannot go on.
    template <agent_rendezvous R>
    asio::awaitable<void> recover(R& rdzv, std::string why) {
        const auto me = this_node();
        const auto done = co_await rdzv.recover(std::move(why), me);
        log_.warning(detail::format("[{}] {}", spec_.role, done));
    }

    [[nodiscard]] bool membership_changed() const {
        return last_abort_ && last_abort_->what == abort_notice::kind::membership;
    }

    void log_membership_restart(int restarts) {
        log_.warning(detail::format("[{}] membership changed: {}; restarting every node's worker group (a membership "
                                    "restart: TORCHELASTIC_RESTART_COUNT stays {}, --max-restarts is not spent)",
                                    spec_.role, last_abort_ ? last_abort_->reason : std::string("?"), restarts));
    }

    std::string describe_abort() const {
        if (!last_abort_) return "the round was aborted";
        return detail::format("group_rank {} ({}) reported: {}", last_abort_->group_rank, last_abort_->host,
                              last_abort_->reason);
    }

    /// Lets the round's members connect to this node's workers' store: each peer an address
    /// literal (what every member publishes), else a name (a member that published no
    /// addresses), resolved without blocking the agent's event loop. A name that resolves to
    /// nothing is logged; the workers of that member may then be refused.
    asio::awaitable<void> allow_peers(detail::rendezvous::peer_list& list, const std::vector<std::string>& peers) {
        std::error_code ec;
        for (const auto& peer : peers) {
            const auto literal = asio::ip::make_address(peer, ec);
            if (!ec) list.allow(literal);
        }
        for (const auto& peer : peers) {
            (void)asio::ip::make_address(peer, ec);
            if (!ec) continue;
            asio::ip::tcp::resolver resolver(executor_);
            auto [error, found] = co_await resolver.async_resolve(peer, "", detail::as_tuple_awaitable<Defer>);
            if (error) {
                log_.warning(detail::format("[{}] cannot resolve member '{}' for the workers' store's allow-list ({}); "
                                            "its workers may be refused (--rdzv-conf workers_store_peers=any admits "
                                            "every peer)",
                                            spec_.role, peer, error.message()));
                continue;
            }
            for (const auto& entry : found) list.allow(entry.endpoint().address());
        }
    }

    /// Joins this attempt's round with the fresh workers' store `server`; sets the workers'
    /// MASTER_ADDR/PORT and this node's ranks. Returns a signal received meanwhile.
    template <agent_rendezvous R>
    asio::awaitable<std::optional<int>> join_round(R& rdzv, tcp_store_server& server,
                                                   detail::agent::signal_inbox<Defer>& signals) {
        using namespace asio::experimental::awaitable_operators;
        node_info me = this_node();
        if (!advertised_addr_) advertised_addr_ = store_.master_addr;
        me.store_addr = *advertised_addr_;
        me.store_port = server.port();
        me.node_rank = params_.node_rank;
        if (round_) me.previous_rank = round_->group_rank;
        if (several_) me.addrs = detail::rendezvous::interface_addresses();
        auto joined = co_await (detail::settle(rdzv.next_round(std::move(me))) || signals.next());
        if (joined.index() == 1) co_return signals.take();
        round_ = std::get<0>(joined).take();
        // This node's ranks must lie inside the round's worlds: an assignment that says
        // otherwise was not written by an agent of this job (elastic::env() would refuse the
        // workers' RANK or ROLE_RANK).
        const int role_base = round_->role_base();
        const int role_size = round_->role_size();
        if (static_cast<long long>(round_->rank_base) + spec_.nproc_per_node > round_->world_size ||
            static_cast<long long>(role_base) + spec_.nproc_per_node > role_size || role_size > round_->world_size) {
            throw rendezvous_error(detail::format(
                "rendezvous round {}: the assignment gives this node's {} workers ranks {}.. of {} and role ranks "
                "{}.. of {}, beyond the round: a client that is no agent of this job writes into the rendezvous "
                "store; give the job a store of its own",
                round_->number, spec_.nproc_per_node, round_->rank_base, round_->world_size, role_base, role_size));
        }
        store_.master_addr = round_->master_addr;
        master_port_ = round_->master_port;
        // Only group rank 0's store serves the workers; the others' close at once.
        if (round_->group_rank != 0) server.stop();
        if (round_->group_rank == 0 && workers_peers_) co_await allow_peers(*workers_peers_, round_->peers);
        if (several_) {
            log_.info(detail::format("[{}] rendezvous round {} complete: group_rank {} of {}, ranks {}..{} of {}",
                                     spec_.role, round_->number, round_->group_rank, round_->group_world_size,
                                     round_->rank_base, round_->rank_base + spec_.nproc_per_node - 1,
                                     round_->world_size));
        }
        co_return std::nullopt;
    }

    /// Local worker `i` of `n`: its ranks in the current round.
    [[nodiscard]] worker_assignment node_worker(int i, int n) const {
        auto a = assign_worker(i, n);
        if (!round_) return a;
        a.group_rank = round_->group_rank;
        a.group_world_size = round_->group_world_size;
        a.global_rank = round_->rank_base + i;
        a.role_rank = round_->role_base() + i;
        a.world_size = round_->world_size;
        a.role_world_size = round_->role_size();
        return a;
    }

    /// The first failing local worker, all succeeding, or aborted_by_job (the round's abort, or
    /// the loss of the rendezvous store).
    template <agent_rendezvous R>
    asio::awaitable<std::size_t> watch_job(R& rdzv, worker_group& group) {
        using namespace asio::experimental::awaitable_operators;
        auto first = co_await (detail::settle(group.watch()) || watch_abort(rdzv));
        if (first.index() == 0) co_return std::get<0>(first).take();
        auto ended = std::get<1>(std::move(first));
        if (auto* notice = std::get_if<abort_notice>(&ended)) {
            last_abort_ = std::move(*notice);
        } else {
            store_lost_ = std::get<detail::agent::store_lost>(std::move(ended));
        }
        co_return aborted_by_job;
    }

    /// The round's abort, or the loss of the rendezvous store (a store_lost_error, or a failed
    /// request to it): run_rounds then moves the store or throws rendezvous_error once the
    /// workers are stopped.
    template <agent_rendezvous R>
    asio::awaitable<std::variant<abort_notice, detail::agent::store_lost>> watch_abort(R& rdzv) {
        std::string why;
        try {
            co_return co_await rdzv.wait_for_abort();
        } catch (const store_lost_error& e) {
            why = e.reason();
        } catch (const store_error& e) {
            why = e.what();
        }
        co_return detail::agent::store_lost{detail::format("lost the rendezvous store while the workers ran: {}", why)};
    }

    /// A local worker failed: abort the round for every node (first reporter wins).
    template <agent_rendezvous R>
    asio::awaitable<void> report_failure(R& rdzv, const std::string& what, const worker_assignment& a) {
        abort_notice notice;
        notice.group_rank = round_ ? round_->group_rank : -1;
        notice.host = host_;
        notice.reason = detail::format("local_rank {} (rank {}) {}", a.local_rank, a.global_rank, what);
        abort_won_ = co_await rdzv.abort(notice);
        // Lost: another node reported first (its notice is there already); this one follows.
        if (abort_won_) {
            last_abort_ = notice;
        } else {
            last_abort_ = co_await rdzv.wait_for_abort();
        }
    }

    /// This agent received `sig` (its workers are stopped already). Elastic membership
    /// (MIN < MAX): it leaves the job; the others are told at once (a membership abort of the
    /// round) and re-form without it. Fixed membership: the job cannot go on without it, so
    /// the round is aborted with decision stop and every node exits 128+N.
    template <agent_rendezvous R>
    asio::awaitable<void> abort_for_signal(R& rdzv, int sig) {
        if (!round_) co_return;
        try {
            if (params_.nnodes.min < params_.nnodes.max) {
                abort_notice notice{round_->group_rank, host_,
                                    detail::format("node {} (pid {}) left: its agent received {}", host_,
                                                   static_cast<long>(::getpid()), signal_to_string(sig))};
                notice.what = abort_notice::kind::membership;
                (void)co_await rdzv.abort(notice);
                co_return;
            }
            abort_notice notice{round_->group_rank, host_,
                                detail::format("its agent received {}", signal_to_string(sig))};
            if (co_await rdzv.abort(notice)) {
                const job_decision stop_now{false, 128 + sig,
                                            detail::format("group_rank {} ({}) received {}", round_->group_rank, host_,
                                                           signal_to_string(sig))};
                (void)co_await rdzv.decide(stop_now);
            }
        } catch (const store_error&) {
            // The store is gone already: nobody is left to tell.
        }
    }

    /// Fills the status's identity, makes the status file's directory and opens the endpoints
    /// (a port that cannot be had is the command line's to fix: usage_error).
    void open_status() {
        status_.run_id = params_.run_id;
        status_.role = spec_.role;
        status_.pid = static_cast<long>(::getpid());
        status_.host = host_name();
        status_.node = several_ ? detail::format("{}:{}", node_host(), status_.pid)
                                : detail::format("{}:{}", status_.host, status_.pid);
        status_.max_restarts = spec_.max_restarts;
        status_.started_ms = detail::agent::unix_ms();
        status_.start_ticks = detail::agent::process_start_ticks(status_.pid);
        if (shown_.status_file) {
            try {
                status_file_ = std::make_unique<detail::agent::status_file>(status_.pid);
            } catch (const std::exception& e) {
                log_.warning(detail::format("no status file for `elasticrun status`: {}", e.what()));
            }
        }
        const auto open = [this](std::unique_ptr<http_endpoint>& endpoint, const std::string& host, std::uint16_t port,
                                 bool health_only) {
            endpoint = std::make_unique<http_endpoint>(executor_, host, port,
                                                       [this, health_only](std::string_view path) {
                                                           return answer(path, health_only);
                                                       });
        };
        if (shown_.metrics_port) {
            try {
                open(metrics_, shown_.metrics_host, *shown_.metrics_port, false);
            } catch (const std::system_error& e) {
                throw usage_error{detail::format("--metrics-port: cannot listen on {}:{}: {}; choose another port",
                                                 shown_.metrics_host, *shown_.metrics_port, e.code().message())};
            }
            // Port 0 asked for any port: the one taken must be seen whatever the log level.
            const auto line = detail::format("--metrics-port: serving /metrics, /status and /health on {}:{}",
                                             shown_.metrics_host, metrics_->port());
            if (*shown_.metrics_port == 0) {
                log_.warning(line);
            } else {
                log_.info(line);
            }
        }
        if (shown_.health_check_port) {
            // torch's variable, inherited by every agent of a machine: a port another agent holds
            // costs this one its health check, not its job.
            try {
                open(health_, "0.0.0.0", *shown_.health_check_port, true);
                log_.info(detail::format("TORCHELASTIC_HEALTH_CHECK_PORT: serving on 0.0.0.0:{}", health_->port()));
            } catch (const std::system_error& e) {
                log_.warning(detail::format("TORCHELASTIC_HEALTH_CHECK_PORT={}: cannot listen there ({}); this agent "
                                            "answers no health check",
                                            *shown_.health_check_port, e.code().message()));
            }
        }
    }

    void close_status() noexcept {
        metrics_.reset();
        health_.reset();
        status_file_.reset();
    }

    /// The agent's state for the status; what shows it looks again at once.
    void show_state(const char* state) {
        status_.state = state;
        status_changed_.notify();
    }

    /// The status as of now.
    const agent_status& refresh_status() {
        if (shown_group_ != nullptr) status_.ranks = shown_group_->rank_statuses();
        status_.timer_expiries_total = timer_expiries_ended_ +
                                       (shown_group_ != nullptr ? shown_group_->timer_expiries() : 0);
        status_.store_requests_total = store_requests_->load(std::memory_order_relaxed);
        status_.updated_ms = detail::agent::unix_ms();
        return status_;
    }

    /// Keeps the status file and the status published in the job's store (a rendezvous that
    /// can) up to date, and serves the endpoints, until cancelled.
    template <class R>
    asio::awaitable<void> show_status(R& rdzv) {
        using namespace asio::experimental::awaitable_operators;
        co_await (write_status() || serve(metrics_.get()) || serve(health_.get()) || publish_status(rdzv));
    }

    /// This node's status into the job's store, for `elasticrun status --rdzv-endpoint`: when
    /// it changed (2 s apart at least) and every 10 s at least. A store that cannot be reached
    /// costs one line at INFO (the rounds report a lost store themselves).
    template <class R>
    asio::awaitable<void> publish_status(R& rdzv) {
        asio::steady_timer tick(executor_);
        if constexpr (requires(R & r, std::string json) { r.publish_status(std::move(json)); }) {
            bool told = false;
            detail::agent::status_pacer paced(status_refresh);
            for (;;) {
                // At most every 2 s: every node of a job changes state at once (a restart).
                tick.expires_after(std::chrono::seconds(2));
                co_await tick.async_wait(detail::use_awaitable<Defer>);
                for (;;) {
                    if constexpr (requires(const R& r) { r.node_id(); }) status_.lease = rdzv.node_id();
                    if (paced.due(refresh_status(), std::chrono::steady_clock::now())) break;
                    co_await status_change(tick, paced);
                }
                try {
                    auto json = status_json(status_);
                    co_await rdzv.publish_status(std::move(json));
                    told = false;
                } catch (const asio::system_error& e) {
                    paced.forget();
                    if (e.code() == asio::error::operation_aborted) throw;  // cancelled: the agent ends
                    if (!told)
                        log_.info(detail::format("cannot publish this node's status in the job's store: {}", e.what()));
                    told = true;
                } catch (const std::exception& e) {
                    paced.forget();
                    // Any failure costs the published status only (never the job): said once.
                    if (!told)
                        log_.info(detail::format("cannot publish this node's status in the job's store: {}", e.what()));
                    told = true;
                }
            }
        } else {
            tick.expires_at(asio::steady_timer::time_point::max());
            co_await tick.async_wait(detail::use_awaitable<Defer>);
        }
    }

    /// The status file: written when the status changed, and every 10 s at least.
    asio::awaitable<void> write_status() {
        asio::steady_timer tick(executor_);
        bool warned = false;
        detail::agent::status_pacer paced(status_refresh);
        if (!status_file_) {
            tick.expires_at(asio::steady_timer::time_point::max());
            co_await tick.async_wait(detail::use_awaitable<Defer>);
        }
        for (bool first = true;; first = false) {
            if (!first) co_await status_change(tick, paced);
            if (status_file_ && paced.due(refresh_status(), std::chrono::steady_clock::now())) {
                try {
                    status_file_->write(status_json(status_));
                    warned = false;
                } catch (const std::exception& e) {
                    paced.forget();
                    if (!warned) log_.warning(detail::format("cannot write the status file: {}", e.what()));
                    warned = true;
                }
            }
        }
    }

    /// How often a status that did not change is written again (its time says the agent lives).
    static constexpr std::chrono::seconds status_refresh{10};

    /// Until the status may have changed: the agent's state or a worker's end (status_changed_),
    /// the refresh of an unchanged one, a second with --watchdog (the heartbeat ages change all
    /// the time, and the counters may), a second after a write that failed. An idle agent so
    /// wakes every 10 s, not every second.
    asio::awaitable<void> status_change(asio::steady_timer& tick, const detail::agent::status_pacer& paced) {
        using namespace asio::experimental::awaitable_operators;
        const bool often = spec_.watchdog.enabled() || !paced.holds();
        tick.expires_after(often ? std::chrono::seconds(1) : status_refresh);
        (void)co_await (status_changed_.wait() || tick.async_wait(detail::as_tuple_awaitable<Defer>));
    }

    asio::awaitable<void> serve(http_endpoint* endpoint) {
        if (endpoint != nullptr) co_return co_await endpoint->serve();
        asio::steady_timer never(executor_, asio::steady_timer::time_point::max());
        co_await never.async_wait(detail::use_awaitable<Defer>);
    }

    /// One GET: /metrics, /status, /health (the health check port answers every path with it).
    http_response answer(std::string_view path, bool health_only) {
        const auto& s = refresh_status();
        if (health_only || path == "/health") {
            return {200, "application/json", detail::format("{{\"status\": \"ok\", \"state\": \"{}\"}}\n", s.state)};
        }
        if (path == "/metrics") return {200, "text/plain; version=0.0.4; charset=utf-8", prometheus_text(s)};
        if (path == "/status") return {200, "application/json", status_json(s) + "\n"};
        if (path == "/") return {200, "text/plain; charset=utf-8", "elastic agent: /metrics /status /health\n"};
        return {404, "text/plain; charset=utf-8", "not found: try /metrics, /status or /health\n"};
    }

    bool several_ = false;                                     ///< a job of several nodes (uses_node_rendezvous)
    agent_options shown_;                                      ///< what the agent shows while it runs
    agent_status status_;                                      ///< what it shows of itself
    const worker_group* shown_group_ = nullptr;                ///< the attempt's group, while it lives
    std::unique_ptr<detail::agent::status_file> status_file_;  ///< none: no status file
    std::uint64_t timer_expiries_ended_ = 0;                   ///< of the attempts that ended
    std::unique_ptr<http_endpoint> metrics_;                   ///< --metrics-port
    std::unique_ptr<http_endpoint> health_;                    ///< TORCHELASTIC_HEALTH_CHECK_PORT
    /// Requests the workers' stores this agent hosted served (shared with those stores).
    std::shared_ptr<std::atomic<std::uint64_t>> store_requests_ = std::make_shared<std::atomic<std::uint64_t>>(0);
    std::unique_ptr<file_timer_server> file_timers_;                ///< TORCHELASTIC_ENABLE_FILE_TIMER=1
    std::unique_ptr<tcp_store_server> round_store_;                 ///< group rank 0: the round's workers' store
    std::shared_ptr<detail::rendezvous::peer_list> workers_peers_;  ///< who the attempt's workers' store accepts
    std::optional<rendezvous_round> round_;                         ///< the current round
    std::optional<std::string> advertised_addr_;                    ///< what this node's info says of its store
    std::optional<detail::agent::store_lost> store_lost_;           ///< the store was lost while the workers ran
    std::optional<abort_notice> last_abort_;                        ///< why the current round was aborted
    bool abort_won_ = false;                                        ///< this node's abort() was the first
    std::vector<std::string> incomplete_logs_;                      ///< log files that miss bytes, and why

    asio::any_io_executor executor_;
    /// Notified when the status changed (the agent's state, a worker's end): its file and its
    /// published copy are written again then, not by looking every second.
    detail::basic_async_signal<Defer> status_changed_{executor_};
    worker_spec spec_;
    rendezvous_parameters params_;
    environment env_;
    agent_log log_;
    worker_command command_;
    detail::agent::store_plan store_;
    std::uint16_t master_port_ = 0;
    std::string host_;
    agent_events events_;           ///< --event-log-handler
    std::optional<log_tree> logs_;  ///< made at the first attempt
};
using local_agent = basic_local_agent<>;

/*
 * agent_loop: a loop of the caller's over a running job (local_agent::run_loop).
 *   asio::awaitable<int> operator()(local_agent::job<R>& job);
 * for every rendezvous model the agent may choose (a template call whose return type is written
 * out, e.g. `template <class Job> asio::awaitable<int> operator()(Job& job)`): it is
 * awaited once, with the job joined, and returns the agent's exit code.
 */
template <class L>
concept agent_loop = std::move_constructible<L> &&
    detail::agent::loop_over<L, local_agent::job<single_node_rendezvous>> &&
    detail::agent::loop_over<L, local_agent::job<tcp_rendezvous>> &&
    detail::agent::loop_over<L, local_agent::job<etcd_rendezvous>>;

}  // namespace elastic::inline v0
