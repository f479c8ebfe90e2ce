// SPDX-License-Identifier: MIT
// worker_output: one worker's standard output and error for one attempt — its routes, its log
// files, its pipes, and the relays that copy them to the tail, the files and the console.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/agent/agent_log.hpp"
#include "elastic/agent/log_tree.hpp"
#include "elastic/agent/output.hpp"
#include "elastic/agent/spec.hpp"
#include "elastic/process/child.hpp"
#include "elastic/process/spawn.hpp"
#include "elastic/process/sys.hpp"
#include "elastic/report/stderr_tail.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include "elastic/detail/format.hpp"

#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace elastic::inline v0 {

/// An attempt's filtered_stdout.log and filtered_stderr.log (--duplicate-*-filters), shared by
/// its workers: the descriptors (-1: none) and the record of their lost writes.
struct filtered_logs {
    int out_fd = -1;
    int err_fd = -1;
    log_file_writes* out_writes = nullptr;
    log_file_writes* err_writes = nullptr;
};

/// One worker's output in one attempt (docs/logs.md). prepare() before the spawn decides, per
/// stream, what the child gets: stderr is always a pipe (the failure report's tail needs every
/// byte, whatever -r/-t say); stdout is the agent's own stdout when it goes to the console
/// unprefixed and to no file (the worker sees the terminal, as under torchrun), /dev/null when it
/// goes nowhere, and a pipe otherwise: every byte of a log file is written by the agent, which
/// so sees every write that fails. start() after the spawn runs one relay per pipe.
template <class Defer = void>
class basic_worker_output {
public:
    /// `index`: the worker's local rank (its slot, also under --virtual-local-rank); `rank_dir`:
    /// `attempt_<n>/<index>/`, empty when the tree is disabled. Opens the files; sets `how.out`
    /// and `how.err`. Throws log_error. `filtered`: the attempt's filtered logs, which get this
    /// worker's lines that match config's duplicate filters when it tees that stream; they must
    /// outlive the relays.
    void prepare(const worker_spec& config, int index, int global_rank, const std::filesystem::path& rank_dir,
                 spawn_options& how, const filtered_logs& filtered = {}) {
        routes_ = route_streams(config, index);
        prefix_ = format_log_prefix(config.log_line_prefix_template, config.role, index, global_rank);
        const auto tees = [&](std_streams which) {
            return (static_cast<unsigned>(config.tee.for_rank(index)) & static_cast<unsigned>(which)) != 0;
        };
        filtered_ = filtered;
        out_filters_ = filtered.out_fd >= 0 && tees(std_streams::out) ? config.duplicate_stdout_filters
                                                                      : std::vector<std::string>{};
        err_filters_ = filtered.err_fd >= 0 && tees(std_streams::err) ? config.duplicate_stderr_filters
                                                                      : std::vector<std::string>{};
        if (out_filters_.empty()) filtered_.out_fd = -1;
        if (err_filters_.empty()) filtered_.err_fd = -1;
        const auto open = [&](const char* stream, detail::process::owned_fd& fd, log_file_writes& writes) {
            const auto path = rank_dir / detail::format("{}.log", stream);
            fd = open_log_file(path);
            writes.name = detail::format("local_rank {}'s {} log file {}", index, stream, path.string());
        };
        if (routes_.out.file && !rank_dir.empty()) open("stdout", out_file_, out_writes_);
        if (routes_.err.file && !rank_dir.empty()) open("stderr", err_file_, err_writes_);
        if (routes_.out.console == console_copy::raw && !out_file_ && filtered_.out_fd < 0) {
            how.out = stdio::inherit();
        } else if (routes_.out.console == console_copy::none && !out_file_ && filtered_.out_fd < 0) {
            how.out = stdio::null();
        } else {
            how.out = stdio::pipe();
        }
        how.err = stdio::pipe();
    }

    /// Takes the pipes from `child` and starts their relays on `executor`, each counted by
    /// `relays` and holding `keep_alive` (which must own this object, `tail` and `relays`). The
    /// first failed write to a log file is a warning on `log` (a copy: the relays may outlive
    /// the agent's own).
    void start(child_process& child, const asio::any_io_executor& executor, detail::task_latch& relays,
               const std::shared_ptr<void>& keep_alive, stderr_tail& tail, const agent_log& log) {
        for (auto* writes : {&out_writes_, &err_writes_}) {
            writes->first_failure = [log](const log_file_writes& w) {
                log.warning(detail::format("cannot write {}: {}; what the worker writes to it from now on is lost "
                                           "until writes succeed again (the console copy and the failure report are "
                                           "not affected); free space on that file system, or move --log-dir",
                                           w.name, std::strerror(w.first_error)));
            };
        }
        out_pipe_ = child.take_stdout();
        err_pipe_ = child.take_stderr();
        const auto console_fd = [](const stream_route& r, int fd) { return r.console == console_copy::none ? -1 : fd; };
        const auto prefix = [this](const stream_route& r) {
            return r.console == console_copy::prefixed ? prefix_ : std::string();
        };
        if (out_pipe_) {
            run(executor, relays, keep_alive, *out_pipe_,
                stream_copies{nullptr, out_file_.get(), &out_writes_, console_fd(routes_.out, 1), prefix(routes_.out),
                              &relays, filtered_.out_fd, out_filters_, prefix_, filtered_.out_writes});
        }
        if (err_pipe_) {
            run(executor, relays, keep_alive, *err_pipe_,
                stream_copies{&tail, err_file_.get(), &err_writes_, console_fd(routes_.err, 2), prefix(routes_.err),
                              &relays, filtered_.err_fd, err_filters_, prefix_, filtered_.err_writes});
        }
    }

    /// Closes the pipes (a relay pending on one ends): for pipes a descendant of the worker holds
    /// open after the worker's group ended.
    void close() noexcept {
        std::error_code ignored;
        if (out_pipe_) out_pipe_->close(ignored);
        if (err_pipe_) err_pipe_->close(ignored);
    }

    [[nodiscard]] const worker_routes& routes() const noexcept { return routes_; }
    /// The writes to the stdout and stderr log files (lost_bytes 0: complete, or no file).
    [[nodiscard]] const log_file_writes& stdout_writes() const noexcept { return out_writes_; }
    [[nodiscard]] const log_file_writes& stderr_writes() const noexcept { return err_writes_; }
    [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }

private:
    static void run(const asio::any_io_executor& executor, detail::task_latch& relays,
                    const std::shared_ptr<void>& keep_alive, asio::posix::stream_descriptor& pipe,
                    stream_copies copies) {
        relays.add();
        asio::co_spawn(
            executor,
            [keep_alive, &pipe, copies = std::move(copies)]() mutable -> asio::awaitable<void> {
                co_await relay_stream(pipe, std::move(copies));
            },
            [keep_alive, &relays](std::exception_ptr) { relays.done(); });
    }

    worker_routes routes_;
    std::string prefix_;
    filtered_logs filtered_;
    std::vector<std::string> out_filters_;
    std::vector<std::string> err_filters_;
    detail::process::owned_fd out_file_;
    detail::process::owned_fd err_file_;
    log_file_writes out_writes_;
    log_file_writes err_writes_;
    std::optional<asio::posix::stream_descriptor> out_pipe_;
    std::optional<asio::posix::stream_descriptor> err_pipe_;
};
using worker_output = basic_worker_output<>;

}  // namespace elastic::inline v0
