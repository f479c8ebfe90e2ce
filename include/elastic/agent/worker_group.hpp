// SPDX-License-Identifier: MIT
// worker_group: one attempt's workers on one node — started together with torchrun's
// environment and their output routed, watched for the first failure, stopped (a signal, then
// SIGKILL after the grace), their output drained, and their failure collected for the policy.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/coro.hpp"
#include "elastic/agent/agent_events.hpp"
#include "elastic/agent/agent_log.hpp"
#include "elastic/agent/file_timer.hpp"
#include "elastic/agent/output.hpp"
#include "elastic/agent/program.hpp"
#include "elastic/agent/spec.hpp"
#include "elastic/agent/status.hpp"
#include "elastic/agent/watchdog.hpp"
#include "elastic/agent/worker_environment.hpp"
#include "elastic/agent/worker_output.hpp"
#include "elastic/error.hpp"
#include "elastic/policy/concepts.hpp"
#include "elastic/process/cgroup.hpp"
#include "elastic/process/child.hpp"
#include "elastic/process/group.hpp"
#include "elastic/process/reaper.hpp"
#include "elastic/process/spawn.hpp"
#include "elastic/report/agent_error_file.hpp"
#include "elastic/report/error_file.hpp"
#include "elastic/report/failure.hpp"
#include "elastic/report/stderr_tail.hpp"
#include "elastic/usage_error.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include "elastic/detail/format.hpp"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// The agent could not do its own work (a directory, a port, a worker that cannot be started
/// after validation). elasticrun exits with exit_codes::internal (251) and the message.
class agent_error : public error {
public:
    using error::error;
};

/// What the workers of one attempt are told, and where their files go.
struct group_attempt {
    /// What every worker is told; start() sets each one's error_file under `dir`.
    attempt_settings told;
    /// attempt_<n>/ of the log tree (each worker's files under <local_rank>/); empty: no files.
    std::filesystem::path dir;
    /// The ranks of each local worker, one per worker (assign_worker() on one node).
    std::vector<worker_assignment> ranks;
};

namespace detail::agent {

/// One worker of the attempt.
struct worker_slot {
    worker_assignment assignment;
    std::string error_file;
    stderr_tail tail;
    worker_output output;  ///< its stdout and stderr: routes, log files, pipes, relays
};

/// What the attempt's stream relays share with the group; they may outlive it.
struct attempt_state {
    attempt_state(const asio::any_io_executor& executor, std::size_t workers) : slots(workers), relays(executor) {}
    std::vector<worker_slot> slots;
    detail::task_latch relays;
    /// The attempt's filtered_stdout.log and filtered_stderr.log (--duplicate-*-filters), which
    /// every rank's relays write: held here, with the relays.
    detail::process::owned_fd filtered_out;
    detail::process::owned_fd filtered_err;
    log_file_writes filtered_out_writes;
    log_file_writes filtered_err_writes;
};

}  // namespace detail::agent

/// One attempt's workers. start() them, await watch() (the first failure, or all succeeded),
/// stop() them when the attempt must end early, then close() (the event log's exits, the output
/// drained) before the next attempt; failure() is what the restart policy is given. Dropping the
/// group kills whatever still runs (SIGKILL to each worker's process group), so no path — an
/// exception included — leaves a worker behind. Use from the executor's thread.
template <class Defer = void>
class basic_worker_group {
public:
    /// `spec`, `command`, `events` and `log` must outlive the group.
    basic_worker_group(asio::any_io_executor executor, const worker_spec& spec, const worker_command& command,
                       agent_events& events, const agent_log& log)
        : executor_(std::move(executor)),
          spec_(&spec),
          command_(&command),
          events_(&events),
          log_(&log),
          state_(std::make_shared<detail::agent::attempt_state>(executor_, attempt_size(spec))) {}

    basic_worker_group(const basic_worker_group&) = delete;
    basic_worker_group& operator=(const basic_worker_group&) = delete;

    /// Serves torch's file timer for this group's workers while watch() runs (they are told
    /// its FIFO in TORCHELASTIC_TIMER_FILE): call before start(); `server` must outlive the group.
    void serve_file_timers(basic_file_timer_server<Defer>& server) noexcept { timers_ = &server; }

    /// `changed` is notified whenever a worker ends while watch() runs (its rank_statuses()
    /// changed): what shows the status waits for it instead of looking again and again.
    void notify_changes(detail::basic_async_signal<Defer>& changed) noexcept { changed_ = &changed; }

    /// Starts every worker of `attempt` with `env` (the agent's environment) under torchrun's
    /// contract. A worker that cannot be started stops the ones started and throws: usage_error
    /// when its program cannot run (not executable, neither a binary nor a #! script, a missing
    /// #! interpreter), agent_error otherwise.
    asio::awaitable<void> start(const group_attempt& attempt, const environment& env) {
        restarts_ = attempt.told.restart_count;
        auto& slots = state_->slots;
        workers_.reserve(slots.size());
        std::optional<std::string> spawn_failure;
        bool program_fault = false;
        if (!attempt.dir.empty()) {
            // Opened whenever filters are given, as torchrun does: an empty file says that no
            // line matched (or that no rank tees the stream; the launcher warns of that).
            const auto open = [&](const char* name, detail::process::owned_fd& fd, log_file_writes& writes) {
                const auto path = attempt.dir / name;
                fd = open_log_file(path);
                writes.name = detail::format("the filtered log file {}", path.string());
                writes.first_failure = [log = *log_](const log_file_writes& w) {
                    log.warning(detail::format("cannot write {}: {}; matching lines are lost from it until writes "
                                               "succeed again (the workers' own log files and the console are not "
                                               "affected); free space on that file system, or move --log-dir",
                                               w.name, std::strerror(w.first_error)));
                };
            };
            if (!spec_->duplicate_stdout_filters.empty()) {
                open("filtered_stdout.log", state_->filtered_out, state_->filtered_out_writes);
            }
            if (!spec_->duplicate_stderr_filters.empty()) {
                open("filtered_stderr.log", state_->filtered_err, state_->filtered_err_writes);
            }
        }
        timer_hits_.assign(slots.size(), std::nullopt);
        if (spec_->watchdog.enabled()) {
            try {
                pages_ = std::make_unique<detail::agent::watchdog_pages>(slots.size());
            } catch (const std::system_error& e) {
                throw agent_error(detail::format("cannot set up --watchdog: {}; free space in /dev/shm (or the "
                                                 "temporary directory), or run without --watchdog",
                                                 e.what()));
            }
            watches_.assign(slots.size(), {});
        }
        const filtered_logs filtered{state_->filtered_out.get(), state_->filtered_err.get(),
                                     &state_->filtered_out_writes, &state_->filtered_err_writes};
        for (std::size_t i = 0; i < slots.size(); ++i) {
            const int local_rank = static_cast<int>(i);
            auto& slot = slots[i];
            slot.assignment = i < attempt.ranks.size() ? attempt.ranks[i]
                                                       : assign_worker(local_rank, spec_->nproc_per_node);
            const auto rank_dir = attempt.dir.empty() ? attempt.dir : attempt.dir / detail::format("{}", i);
            slot.error_file = rank_dir.empty() ? std::string() : (rank_dir / "error.json").string();
            auto told = attempt.told;
            told.error_file = slot.error_file;
            spawn_options how;
            how.program = command_->path;
            auto argv = command_->argv_for(local_rank);
            how.args.assign(argv.begin() + 1, argv.end());
            auto worker_env = worker_environment(*spec_, env, slot.assignment, told);
            if (pages_) pages_->tell(i, spec_->watchdog.signal, worker_env);
            if (timers_) worker_env.insert_or_assign("TORCHELASTIC_TIMER_FILE", timers_->path().string());
            how.env = environment_entries(worker_env);
            try {
                slot.output.prepare(*spec_, local_rank, slot.assignment.global_rank, rank_dir, how, filtered);
                workers_.push_back(elastic::spawn(executor_, how));
                events_->worker_started(restarts_, slot.assignment, static_cast<long>(workers_.back().pid()));
            } catch (const spawn_error& e) {
                spawn_failure = detail::format("cannot start local_rank {}: {}", i, e.what());
                program_fault = e.program_fault();
                break;
            } catch (const std::exception& e) {
                spawn_failure = detail::format("cannot start local_rank {}: {}", i, e.what());
                break;
            }
            slot.output.start(workers_.back(), executor_, state_->relays, state_, slot.tail, *log_);
        }
        started_ = std::chrono::steady_clock::now();
        if (const auto why = detail::process::cgroups::instance().reason_once(); !why.empty()) {
            if (detail::process::subreaper::instance().enabled()) {
                log_->info(detail::format("workers get no cgroup of their own: {}; this agent adopts what they leave "
                                          "behind (child subreaper) and ends it with them",
                                          why));
            } else {
                log_->info(detail::format("workers get no cgroup of their own, only their process groups contain them: "
                                          "{}; a daemon a worker starts can outlive it",
                                          why));
            }
        }
        if (spawn_failure) {
            co_await stop(SIGTERM);
            co_await close();
            // A program that cannot run is the command line's to fix: a usage error (exit 2).
            if (program_fault) throw usage_error(*spawn_failure);
            throw agent_error(*spawn_failure);
        }
    }

    /// The index of the first worker that fails, or size() once every worker exited 0. With
    /// --watchdog, workers found hung count as failing: every worker hung at that reading (a
    /// rank stuck in a collective holds the others in it too); the index is the one silent
    /// longest, and they are still running: await capture_stacks() before stop(). With
    /// serve_file_timers(), torch's file timer is served meanwhile.
    asio::awaitable<std::size_t> watch() {
        using namespace asio::experimental::awaitable_operators;
        if (timers_ == nullptr) co_return co_await supervise();
        // Settled: `||` waits for one side to succeed, so a supervision error must not wait for
        // the timer server, which never ends on its own.
        auto first = co_await (detail::settle(supervise()) || serve_timers());
        co_return std::get<0>(first).take();
    }

    /// The workers found hung, and what the watchdog saw of each, once watch() found them.
    [[nodiscard]] std::vector<std::pair<std::size_t, hang_report>> hangs() const {
        std::vector<std::pair<std::size_t, hang_report>> out;
        for (const auto& h : hung_) out.emplace_back(h.index, h.report);
        return out;
    }

    /// Worker `i`'s failure in one line for the other nodes ("exited with code 3", "hung: ...").
    [[nodiscard]] std::string describe_failure(std::size_t i) const {
        if (const auto* h = hung(i)) return h->report.headline();
        if (const auto t = timer_hang(i)) return t->headline();
        const auto& status = workers_.at(i).status();
        return status ? status->status.describe() : std::string("is still running");
    }

    /// Stops every worker: `sig` to each process group, SIGKILL after spec.shutdown_timeout.
    /// Processes that outlive SIGKILL are logged. The first call also notes which workers had
    /// ended on their own before it (failure() reports the others as stopped by the agent).
    asio::awaitable<stop_result> stop(int sig) {
        if (exited_before_.empty()) {
            exited_before_.resize(workers_.size());
            for (std::size_t i = 0; i < workers_.size(); ++i) exited_before_[i] = workers_[i].check_exit();
        }
        auto result = co_await elastic::stop(std::span<child_process>(workers_),
                                             {sig, spec_->shutdown_timeout, std::chrono::seconds(10)});
        if (!hung_.empty() && !hang_recorded_) record_hangs();
        record_timer_hangs();
        if (!result.unkillable.empty()) {
            std::string pids;
            for (const auto pid : result.unkillable) pids += detail::format("{}{}", pids.empty() ? "" : " ", pid);
            log_->error(detail::format("processes still present after SIGKILL (uninterruptible sleep?): {}", pids));
        }
        co_return result;
    }

    /// After the workers ended (or were stopped): records their exits in the event log and
    /// awaits the end of their relayed output. A descendant that left its worker's process
    /// group may hold a pipe open forever: after the workers are gone, the pipes get 2 s without
    /// any byte arriving to reach end of file, then they are closed. Output still flowing is read
    /// on (what the pipes held when the workers ended takes milliseconds), for at most 30 s.
    asio::awaitable<void> close() {
        using namespace asio::experimental::awaitable_operators;
        events_->workers_exited(restarts_, workers_);
        auto& relays = state_->relays;
        asio::steady_timer bound(executor_);
        for (int round = 0; relays.count() != 0; ++round) {
            const auto seen = relays.progress();
            bound.expires_after(std::chrono::seconds(2));
            auto which = co_await (relays.wait() || bound.async_wait(detail::as_tuple_awaitable<Defer>));
            if (which.index() == 0 || (relays.progress() != seen && round < 15)) continue;
            log_->warning(
                detail::format("a worker's output pipe stayed open after its process group ended (a descendant "
                               "that left the group?); {}; closing it",
                               relays.progress() != seen ? "still written to after 30 s" : "nothing written for 2 s"));
            for (auto& slot : state_->slots) slot.output.close();
            co_await relays.wait();
        }
        for (const auto& line : incomplete_logs())
            log_->error(detail::format("{} is incomplete: {}", line.first, line.second));
    }

    /// After close(): each log file of the attempt that misses bytes of its stream, with how
    /// many and why ({"local_rank 1's stdout log file PATH", "9437184 bytes not written (No
    /// space left on device)"}); the filtered files last.
    [[nodiscard]] std::vector<std::pair<std::string, std::string>> incomplete_logs() const {
        std::vector<std::pair<std::string, std::string>> out;
        const auto add = [&out](const log_file_writes& w) {
            if (w.lost_bytes == 0) return;
            out.emplace_back(w.name,
                             detail::format("{} bytes not written ({})", w.lost_bytes, std::strerror(w.first_error)));
        };
        for (const auto& slot : state_->slots) {
            add(slot.output.stdout_writes());
            add(slot.output.stderr_writes());
        }
        add(state_->filtered_out_writes);
        add(state_->filtered_err_writes);
        return out;
    }

    /// The group's failure for the restart policy, after stop(): every worker that did not
    /// exit 0 on its own — `first` (watch()'s answer) and the others that failed before the
    /// stop as failed, the rest as stopped by the agent — with its error file and stderr tail.
    [[nodiscard]] group_failure failure(std::size_t first, const std::string& host) const {
        group_failure failure;
        failure.restarts = restarts_;
        failure.started = started_;
        failure.failed = first < workers_.size() && workers_[first].status() ? workers_[first].status()->steady_time
                                                                             : started_;
        if (!hung_.empty()) failure.failed = hang_found_;
        for (std::size_t i = 0; pages_ && i < pages_->size(); ++i) {
            // The last reading, and the page as the worker left it.
            auto reached = watches_[i].progress;
            const auto now = pages_->read(i);
            if (now && now->progress != 0) reached = std::max(reached.value_or(0), now->progress - 1);
            if (reached) failure.progress = std::max(failure.progress.value_or(0), *reached);
        }
        for (std::size_t i = 0; i < workers_.size(); ++i) {
            const auto& status = workers_[i].status();
            const bool before = i < exited_before_.size() && exited_before_[i];
            if (!status && hung(i) == nullptr) continue;
            if (status && before && status->status.success() && hung(i) == nullptr) continue;
            const auto& slot = state_->slots[i];
            worker_failure f;
            f.local_rank = slot.assignment.local_rank;
            f.global_rank = slot.assignment.global_rank;
            f.role = spec_->role;
            f.pid = static_cast<long>(workers_[i].pid());
            f.host = host;
            // A hung worker still present after SIGKILL (stuck in the kernel) has no exit: it is
            // reported as SIGKILL's, the signal it got.
            f.status = status ? status->status : exit_status::from_signal(SIGKILL);
            if (status) {
                f.observed_steady = status->steady_time;
                f.observed_system = status->system_time;
            }
            f.error_file = read_error_file(slot.error_file);
            f.stderr_tail = slot.tail.snapshot();
            // Failed: exited unsuccessfully before the agent sent the stop signal. Anything
            // that ended after it was ended by the agent, whatever its exit code.
            f.state = (before && !f.status.success()) ? failure_state::failed : failure_state::stopped_by_agent;
            if (const auto* h = hung(i)) {
                // Hung: the failure is the hang, dated from when the worker went silent (or
                // entered its section), so the one silent longest is the root cause.
                f.state = failure_state::failed;
                f.hang = h->report;
                f.observed_steady = h->since;
                f.observed_system = hang_found_system_ - (hang_found_ - h->since);
            } else if (auto t = timer_hang(i)) {
                // Ended by the signal its own expired torch timer asked for: a hang too.
                f.state = failure_state::failed;
                f.hang = std::move(t);
            }
            failure.workers.push_back(std::move(f));
        }
        return failure;
    }

    /// Each worker as last seen, for the agent's status: running or how it ended, and with
    /// --watchdog its last sign of life, section and progress as the last reading found them.
    [[nodiscard]] std::vector<rank_status> rank_statuses() const {
        std::vector<rank_status> out;
        const auto now = std::chrono::steady_clock::now();
        for (std::size_t i = 0; i < workers_.size(); ++i) {
            rank_status r;
            const auto& a = assignment(i);
            r.local_rank = a.local_rank;
            r.global_rank = a.global_rank;
            r.pid = static_cast<long>(workers_[i].pid());
            const auto& status = workers_[i].status();
            const bool before = i < exited_before_.size() && exited_before_[i];
            if (hung(i) != nullptr) {
                r.state = "hung";
            } else if (!status) {
                r.state = "running";
            } else if (status->status.success()) {
                r.state = "succeeded";
            } else {
                r.state = exited_before_.empty() || before ? "failed" : "stopped";
            }
            if (status) r.ended = status->status.describe();
            if (i < watches_.size()) {
                const auto& w = watches_[i];
                // Only while it runs: a finished worker's silence means nothing.
                if (w.alive && !status) r.heartbeat_age = std::chrono::duration<double>(now - w.last_sign).count();
                r.section = w.section;
                r.progress = w.progress;
            }
            out.push_back(std::move(r));
        }
        return out;
    }

    /// How many torch timer scopes of this group's workers expired.
    [[nodiscard]] std::size_t timer_expiries() const noexcept { return timer_expiries_; }

    /// The workers, in local-rank order (fewer than spec.nproc_per_node only while starting).
    [[nodiscard]] std::span<child_process> workers() noexcept { return workers_; }
    [[nodiscard]] std::size_t size() const noexcept { return workers_.size(); }
    /// The ranks of local worker `i`.
    [[nodiscard]] const worker_assignment& assignment(std::size_t i) const { return state_->slots.at(i).assignment; }
    /// When every worker had been started.
    [[nodiscard]] std::chrono::steady_clock::time_point started() const noexcept { return started_; }

private:
    asio::awaitable<std::size_t> supervise() {
        using namespace asio::experimental::awaitable_operators;
        if (!pages_) co_return co_await watch_exits();
        const auto first = co_await (watch_exits() || watch_hangs());
        co_return first.index() == 0 ? std::get<0>(first) : std::get<1>(first);
    }

    /// Serves torch's file timer until watch() ends (it never ends first: when the server
    /// fails, it says so and waits to be cancelled, and supervision goes on).
    asio::awaitable<void> serve_timers() {
        const auto why = co_await timers_->serve([this](long pid) { return timer_sender(pid); },
                                                 [this](const file_timer_expiry& e) { timer_expired(e); }, *log_);
        log_->error(detail::format("torch's file timer stopped: {}; its scopes are no longer enforced for the rest of "
                                   "this attempt",
                                   why));
        asio::steady_timer never(executor_, asio::steady_timer::time_point::max());
        co_await never.async_wait(detail::use_awaitable<Defer>);
    }

    [[nodiscard]] file_timer_sender timer_sender(long pid) const {
        if (timer_owner(pid)) return file_timer_sender::worker;
        for (const auto& worker : workers_) {
            if (static_cast<long>(worker.pid()) == pid) return file_timer_sender::ended_worker;
        }
        return file_timer_sender::stranger;
    }

    /// The running worker that `pid` is, or whose process group it is in.
    [[nodiscard]] std::optional<std::size_t> timer_owner(long pid) const {
        if (pid <= 0 || pid == static_cast<long>(::getpid())) return std::nullopt;
        const long group = static_cast<long>(::getpgid(static_cast<pid_t>(pid)));
        for (std::size_t i = 0; i < workers_.size(); ++i) {
            const auto worker = static_cast<long>(workers_[i].pid());
            if (!workers_[i].status() && (pid == worker || group == worker)) return i;
        }
        return std::nullopt;
    }

    /// A scope expired: the signal it asked for goes to the process that asked (torchrun's
    /// FileTimerServer does the same); a worker it ends fails with the expiry as its hang.
    void timer_expired(const file_timer_expiry& e) {
        const auto i = timer_owner(e.pid);
        const auto scope = detail::agent::quoted_excerpt(e.scope);
        if (!i) {
            log_->info(detail::format("torch timer scope '{}' of pid {} expired, but that pid is no longer a worker "
                                      "here; nothing sent",
                                      scope, e.pid));
            return;
        }
        const auto& a = assignment(*i);
        const bool worker = e.pid == static_cast<long>(workers_[*i].pid());
        const auto who = worker ? detail::format("local_rank {} (rank {}, pid {})", a.local_rank, a.global_rank, e.pid)
                                : detail::format("pid {} (in local_rank {}'s process group, rank {})", e.pid,
                                                 a.local_rank, a.global_rank);
        const auto after = detail::agent::measured_words(e.after);
        if (e.signal <= 0) {
            log_->warning(detail::format("{}: torch timer scope '{}' expired ({} after the agent received it); the "
                                         "request asked for no signal, so nothing is sent",
                                         who, scope, after));
            return;
        }
        log_->warning(detail::format("{}: torch timer scope '{}' expired ({} after the agent received it); sending "
                                     "{}, the signal the request named (FileTimerClient)",
                                     who, scope, after, signal_name(e.signal)));
        ++timer_expiries_;
        if (worker) {
            timer_hits_[*i] = e;
            (void)workers_[*i].signal(e.signal);  // by pidfd: never a recycled pid
            return;
        }
        // A member of its process group: signalled through a pidfd taken, then checked still in
        // the group, so a pid recycled meanwhile is never hit.
        const int pidfd = detail::process::pidfd_open(static_cast<pid_t>(e.pid));
        if (pidfd < 0) return;  // gone already
        if (::getpgid(static_cast<pid_t>(e.pid)) == workers_[*i].pid()) {
            (void)detail::process::pidfd_send_signal(pidfd, e.signal);
        }
        ::close(pidfd);
    }

    /// Worker `i`'s expired torch timer as its hang, once the signal sent for it ended it: it
    /// died of that signal (or exited 128+signal) before the agent began to stop the group.
    [[nodiscard]] std::optional<hang_report> timer_hang(std::size_t i) const {
        if (i >= timer_hits_.size() || !timer_hits_[i] || i >= workers_.size()) return std::nullopt;
        const auto& status = workers_[i].status();
        const auto& e = *timer_hits_[i];
        if (!status) return std::nullopt;
        const auto& how = status->status;
        const bool by_it = how.signaled() ? how.signal() == e.signal : how.code() == 128 + e.signal;
        const bool before_stop = exited_before_.empty() || (i < exited_before_.size() && exited_before_[i]);
        if (!by_it || !before_stop) return std::nullopt;
        hang_report r;
        r.reason = detail::format("torch timer scope '{}' expired ({} after the agent received it; FileTimerClient) "
                                  "and the agent sent {}",
                                  detail::agent::quoted_excerpt(e.scope), detail::agent::measured_words(e.after),
                                  signal_name(e.signal));
        if (i < watches_.size()) r.progress = watches_[i].progress;
        r.silent = e.after;
        r.stacks_asked = false;
        return r;
    }

    /// A worker its expired torch timer ended gets the expiry in its error file, unless it
    /// wrote one of its own.
    void record_timer_hangs() {
        for (std::size_t i = 0; i < timer_hits_.size(); ++i) {
            const auto& slot = state_->slots[i];
            const auto t = timer_hang(i);
            if (!t || hung(i) != nullptr || slot.error_file.empty() || std::filesystem::exists(slot.error_file)) {
                continue;
            }
            const auto& status = workers_[i].status();
            try {
                write_file_atomically(slot.error_file, hang_error_document(*t, status->system_time).dump(4));
            } catch (const std::exception& e) {
                log_->warning(
                    detail::format("cannot write the error file of local_rank {} (its torch timer expired): {}",
                                   slot.assignment.local_rank, e.what()));
            }
        }
    }

    asio::awaitable<std::size_t> watch_exits() {
        for (;;) {
            const std::size_t i = co_await wait_any(std::span<child_process>(workers_));
            if (changed_ != nullptr) changed_->notify();
            if (i >= workers_.size()) co_return workers_.size();
            if (!workers_[i].status()->status.success()) co_return i;
        }
    }

    /// Reads the pages every watchdog_interval until a worker is hung.
    asio::awaitable<std::size_t> watch_hangs() {
        const auto& w = spec_->watchdog;
        asio::steady_timer timer(executor_);
        const auto interval = detail::agent::watchdog_interval(w);
        for (;;) {
            timer.expires_after(interval);
            co_await timer.async_wait(detail::use_awaitable<Defer>);
            const auto now = std::chrono::steady_clock::now();
            for (std::size_t i = 0; i < workers_.size(); ++i) {
                if (workers_[i].status()) continue;
                auto& watch = watches_[i];
                if (const auto page = pages_->read(i)) watch.update(*page, now);
                auto found = watch.hung(w, started_, now);
                // An exit not yet seen by the other watch is that watch's to report.
                if (!found || workers_[i].check_exit()) continue;
                const auto since = now - found->silent;
                hung_.push_back({i, std::move(*found), since});
            }
            if (hung_.empty()) continue;
            hang_found_ = now;
            hang_found_system_ = std::chrono::system_clock::now();
            const auto longest = std::min_element(hung_.begin(), hung_.end(),
                                                  [](const auto& a, const auto& b) { return a.since < b.since; });
            co_return longest->index;
        }
    }

    struct hung_worker {
        std::size_t index = 0;
        hang_report report;
        std::chrono::steady_clock::time_point since{};  ///< silent (or in its section) since
    };

    [[nodiscard]] const hung_worker* hung(std::size_t i) const noexcept {
        for (const auto& h : hung_) {
            if (h.index == i) return &h;
        }
        return nullptr;
    }

public:
    /// After watch() found workers hung (else nothing): asks each for its stacks and waits up to the watchdog's `dump` for them: a
    /// worker that counts its dumps (elastic/watchdog.hpp) says when it is done; otherwise
    /// (Python's faulthandler) its stacks file is done once it stops growing for 100 ms.
    asio::awaitable<void> capture_stacks() {
        const auto& w = spec_->watchdog;
        const bool ask = w.dump.count() > 0;
        struct asked {
            std::size_t index;
            std::uint64_t dumps;
            long long size = -1;
            int still = 0;
            bool done = false;
        };
        std::vector<asked> waiting;
        for (const auto& h : hung_) {
            const auto& a = state_->slots[h.index].assignment;
            auto& worker = workers_[h.index];
            const auto page = pages_->read(h.index);
            // The process that attached the page is the one with a handler: the worker itself,
            // or a process of its group it started (a wrapper script's program). One that never
            // attached has none: the signal would only end it.
            const auto holder = page ? static_cast<pid_t>(page->attached) : pid_t{0};
            const bool own = holder == worker.pid();
            const bool in_group = holder > 0 && !own && ::getpgid(holder) == worker.pid();
            const bool handles = page && (page->handler == 1 || page->handler == 2);
            std::string plan = "; stopping the group (dump=0: no stacks)";
            if (ask && (own || in_group) && handles) {
                plan = detail::format("; asking {} for its stacks ({}, up to {}), then stopping the group",
                                      own ? std::string("it") : detail::format("pid {} of its process group", holder),
                                      signal_name(w.signal), duration_words(w.dump));
            } else if (ask && !page) {
                plan = "; its watchdog page was cut short (by the worker?), so whether it can give its stacks is "
                       "unknown: stopping the group";
            } else if (ask && (own || in_group)) {
                plan = "; it has no handler for the watchdog's signal (it was not set, or could not be), so it "
                       "has no stacks to give: stopping the group";
            } else if (ask && holder > 0) {
                plan = detail::format("; its watchdog page is held by pid {}, outside its process group: no stacks "
                                      "asked for; stopping the group",
                                      holder);
            } else if (ask) {
                plan = "; it never attached its watchdog page (no elastic::record, elastic/watchdog.hpp or "
                       "elastic_watchdog), so it has no stacks to give: stopping the group";
            }
            log_->error(detail::format("local_rank {} (rank {}, pid {}) {}{}", a.local_rank, a.global_rank,
                                       worker.pid(), h.report.headline(), plan));
            if (!ask || !(own || in_group) || !handles) continue;
            try {
                const bool sent = own ? worker.signal(w.signal) : ::kill(holder, w.signal) == 0;
                if (sent) waiting.push_back({h.index, page->dumps});
            } catch (const std::exception& e) {
                log_->warning(detail::format("cannot ask local_rank {} for its stacks: {}", a.local_rank, e.what()));
            }
        }
        asio::steady_timer timer(executor_);
        const auto deadline = std::chrono::steady_clock::now() + w.dump;
        const auto pending = [&waiting] {
            return std::any_of(waiting.begin(), waiting.end(), [](const asked& x) { return !x.done; });
        };
        while (pending() && std::chrono::steady_clock::now() < deadline) {
            timer.expires_after(std::chrono::milliseconds(20));
            co_await timer.async_wait(detail::use_awaitable<Defer>);
            for (auto& x : waiting) {
                if (x.done) continue;
                const auto page = pages_->read(x.index);
                const bool counts = page && page->handler == 1;
                if (workers_[x.index].check_exit() || (counts && page->dumps != x.dumps)) {
                    x.done = true;
                    continue;
                }
                if (counts) continue;
                const auto grown = pages_->stacks_size(x.index);
                x.still = grown > 0 && grown == x.size ? x.still + 1 : 0;
                x.size = grown;
                x.done = x.still >= 5;
            }
        }
        for (const auto& x : waiting) {
            if (x.done) continue;
            log_->warning(detail::format("local_rank {} wrote no complete stacks within {} (a native worker needs "
                                         "elastic::record or elastic/watchdog.hpp, a Python one `import "
                                         "elastic_watchdog`)",
                                         state_->slots[x.index].assignment.local_rank, duration_words(w.dump)));
        }
    }

private:
    /// After the stop: the hung workers' stacks are read, and each one's error file written with
    /// its hang (over anything it wrote while being stopped: the hang is why it was stopped).
    void record_hangs() {
        hang_recorded_ = true;
        for (auto& h : hung_) {
            h.report.stacks = pages_->stacks(h.index);
            const auto& slot = state_->slots[h.index];
            // One that failed on its own meanwhile (a collective's timeout) keeps its error file.
            const auto& status = workers_[h.index].status();
            const bool failed_alone = status && !status->status.success() && status->steady_time < hang_found_;
            if (slot.error_file.empty() || failed_alone) continue;
            try {
                write_file_atomically(slot.error_file, hang_error_document(h.report, hang_found_system_).dump(4));
            } catch (const std::exception& e) {
                log_->warning(detail::format("cannot write the error file of hung local_rank {}: {}",
                                             slot.assignment.local_rank, e.what()));
            }
        }
    }

    static std::size_t attempt_size(const worker_spec& spec) {
        return spec.nproc_per_node > 0 ? static_cast<std::size_t>(spec.nproc_per_node) : 0;
    }

    asio::any_io_executor executor_;
    const worker_spec* spec_;
    const worker_command* command_;
    agent_events* events_;
    const agent_log* log_;
    // Shared with the stream relays, which may outlive the group if its owner unwinds.
    std::shared_ptr<detail::agent::attempt_state> state_;
    std::unique_ptr<detail::agent::watchdog_pages> pages_;  // --watchdog; outlives the workers
    std::vector<detail::agent::rank_watch> watches_;
    std::vector<hung_worker> hung_;
    detail::basic_async_signal<Defer>* changed_ = nullptr;  ///< notify_changes()
    std::chrono::steady_clock::time_point hang_found_{};
    std::chrono::system_clock::time_point hang_found_system_{};
    bool hang_recorded_ = false;
    basic_file_timer_server<Defer>* timers_ = nullptr;          ///< serve_file_timers()
    std::size_t timer_expiries_ = 0;                            ///< scopes that expired with a signal
    std::vector<std::optional<file_timer_expiry>> timer_hits_;  ///< per worker: the expiry sent to it
    std::vector<child_process> workers_;                        // after state_: destroyed (killed) first
    std::vector<bool> exited_before_;
    std::chrono::steady_clock::time_point started_{};
    int restarts_ = 0;
};
using worker_group = basic_worker_group<>;

}  // namespace elastic::inline v0
