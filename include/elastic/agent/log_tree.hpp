// SPDX-License-Identifier: MIT
// log_tree: torchrun's per-rank log tree (<log_dir>/<run_id>_XXXXXX/attempt_<n>/<local_rank>/), the
// route of each worker stream (file, console with or without prefix, nowhere), and the prefix template.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/error.hpp"
#include "elastic/agent/spec.hpp"
#include "elastic/process/sys.hpp"
#include "elastic/usage_error.hpp"

#include "elastic/detail/format.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

namespace elastic::inline v0 {

/// A directory or file of the log tree could not be made (exit 1, nothing lost: no worker of the
/// attempt was started).
class log_error : public error {
public:
    using error::error;
};

/// How a worker stream reaches the agent's console.
enum class console_copy {
    none,      ///< not at all (redirected only, or a local rank outside --local-ranks-filter)
    raw,       ///< as the worker wrote it (no prefix): torchrun's behaviour without -r/-t
    prefixed,  ///< whole lines, each after the rank's prefix (`[default0]:`): -t/--tee
};

/// Where one standard stream of one worker goes (docs/logs.md, "Where each stream goes").
struct stream_route {
    bool file = false;                         ///< into attempt_<n>/<local_rank>/{stdout,stderr}.log
    console_copy console = console_copy::raw;  ///< the agent's stdout (for stdout) or stderr (for stderr)
    friend bool operator==(const stream_route&, const stream_route&) = default;
};

/// The routes of a worker's stdout and stderr.
struct worker_routes {
    stream_route out;
    stream_route err;
    friend bool operator==(const worker_routes&, const worker_routes&) = default;
};

/// torchrun's rules (DefaultLogsSpecs.reify, newest): tee implies redirect; a redirected stream
/// goes to its file; a tee'd one to its file and, prefixed, to the console; a stream of a local
/// rank outside `--local-ranks-filter` reaches the console in no case (files are unaffected). With
/// `--log-dir /dev/null` no stream has a file: a redirected-only stream then goes nowhere (torchrun
/// sends it to the console unprefixed instead), a tee'd one to the console only.
[[nodiscard]] ELASTIC_DECL worker_routes route_streams(const worker_spec& config, int local_rank);

/// Whether any stream of any local rank has a file (-r/-t name one; the tree is not /dev/null).
[[nodiscard]] ELASTIC_DECL bool writes_log_files(const worker_spec& config);

/// The console prefix of one worker: `TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE` (default
/// `[${role_name}${local_rank}]:`) with Python's `string.Template.safe_substitute` rules, as
/// torchrun applies it: `${name}` and `$name` for role_name, local_rank, rank; `$$` is one `$`;
/// anything else stays as written.
[[nodiscard]] ELASTIC_DECL std::string format_log_prefix(std::string_view templ, std::string_view role_name,
                                                         int local_rank, int rank);

namespace detail::agent {

/// Where the temporary log tree goes: $TMPDIR, $TEMP or $TMP (the first set), else /tmp.
ELASTIC_DECL std::string temp_base(const environment& env);

ELASTIC_DECL std::filesystem::path make_temp_dir(const std::filesystem::path& parent, std::string_view prefix);

}  // namespace detail::agent

/// One agent's log tree, torchrun's layout:
///
///     <base>/<run_id>_XXXXXX/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}
///
/// `<base>` is `--log-dir` (made if missing, never removed) or, without it, a new
/// `<TMPDIR>/torchelastic_XXXXXX`. The run directory is made once per agent, at the first
/// attempt. An attempt directory is never wiped: should `attempt_<n>` exist already (an attempt
/// number seen twice), the attempt gets `attempt_<n>.1`, `.2`, ... instead. With `--log-dir
/// /dev/null` the tree is disabled: nothing is ever created.
class log_tree {
public:
    /// `log_dir`: `--log-dir` (nullopt: a temporary base under `temp_parent`).
    log_tree(std::optional<std::filesystem::path> log_dir, std::string run_id, std::filesystem::path temp_parent)
        : log_dir_(std::move(log_dir)), run_id_(std::move(run_id)), temp_parent_(std::move(temp_parent)) {}

    [[nodiscard]] bool disabled() const noexcept { return log_dir_ && *log_dir_ == "/dev/null"; }
    /// Whether the base is a temporary directory this tree made (no --log-dir).
    [[nodiscard]] bool temporary() const noexcept { return !log_dir_; }
    /// The run directory (`<base>/<run_id>_XXXXXX`); empty before the first attempt or when disabled.
    [[nodiscard]] const std::filesystem::path& run_dir() const noexcept { return run_dir_; }
    /// The base directory; empty before the first attempt or when disabled.
    [[nodiscard]] const std::filesystem::path& base() const noexcept { return base_; }

    /// Makes `attempt_<attempt>/` with one directory per local rank and returns its path (empty
    /// when disabled). `attempt` is the restart count the workers see (TORCHELASTIC_RESTART_COUNT).
    /// Throws log_error.
    ELASTIC_DECL std::filesystem::path make_attempt(int attempt, int local_world_size);

    /// Removes the temporary base with everything in it (nothing when --log-dir was given).
    ELASTIC_DECL void remove_temporary() noexcept;

private:
    std::optional<std::filesystem::path> log_dir_;
    std::string run_id_;
    std::filesystem::path temp_parent_;
    std::filesystem::path base_;
    std::filesystem::path run_dir_;
};

/// Opens (creates, truncates) one log file of the tree for the agent's writes. Throws log_error.
[[nodiscard]] ELASTIC_DECL detail::process::owned_fd open_log_file(const std::filesystem::path& path);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL worker_routes route_streams(const worker_spec& config, int local_rank) {
    const auto bits = [](std_streams s) { return static_cast<unsigned>(s); };
    const unsigned tee = bits(config.tee.for_rank(local_rank));
    const unsigned redirected = bits(config.redirects.for_rank(local_rank)) | tee;
    const bool shown = config.local_ranks_filter.empty() || config.local_ranks_filter.count(local_rank) != 0;
    const auto route = [&](std_streams which) {
        const unsigned bit = bits(which);
        stream_route r;
        r.file = (redirected & bit) != 0 && !config.logs_disabled();
        if (!shown) {
            r.console = console_copy::none;
        } else if ((tee & bit) != 0) {
            r.console = console_copy::prefixed;
        } else if ((redirected & bit) != 0) {
            r.console = console_copy::none;
        } else {
            r.console = console_copy::raw;
        }
        return r;
    };
    return {route(std_streams::out), route(std_streams::err)};
}

[[nodiscard]] ELASTIC_DECL bool writes_log_files(const worker_spec& config) {
    for (int i = 0; i < config.nproc_per_node; ++i) {
        const auto r = route_streams(config, i);
        if (r.out.file || r.err.file) return true;
    }
    return false;
}

[[nodiscard]] ELASTIC_DECL std::string format_log_prefix(std::string_view templ, std::string_view role_name,
                                                         int local_rank, int rank) {
    const auto value = [&](std::string_view name) -> std::optional<std::string> {
        if (name == "role_name") return std::string(role_name);
        if (name == "local_rank") return detail::format("{}", local_rank);
        if (name == "rank") return detail::format("{}", rank);
        return std::nullopt;
    };
    // Python's identifier pattern for templates: [_a-z][_a-z0-9]* without regard to case.
    const auto starts_id = [](char c) { return c == '_' || std::isalpha(static_cast<unsigned char>(c)) != 0; };
    const auto in_id = [](char c) { return c == '_' || std::isalnum(static_cast<unsigned char>(c)) != 0; };
    std::string out;
    std::size_t i = 0;
    while (i < templ.size()) {
        const char c = templ[i];
        if (c != '$' || i + 1 >= templ.size()) {
            out += c;
            ++i;
            continue;
        }
        if (templ[i + 1] == '$') {
            out += '$';
            i += 2;
            continue;
        }
        if (templ[i + 1] == '{') {
            const auto close = templ.find('}', i + 2);
            const auto name = close == std::string_view::npos ? std::string_view{} : templ.substr(i + 2, close - i - 2);
            const bool identifier = !name.empty() && starts_id(name.front()) &&
                                    std::all_of(name.begin(), name.end(), in_id);
            if (identifier) {
                if (const auto v = value(name)) {
                    out += *v;
                    i = close + 1;
                    continue;
                }
            }
            out += c;
            ++i;
            continue;
        }
        if (starts_id(templ[i + 1])) {
            std::size_t end = i + 2;
            while (end < templ.size() && in_id(templ[end])) ++end;
            if (const auto v = value(templ.substr(i + 1, end - i - 1))) {
                out += *v;
                i = end;
                continue;
            }
        }
        out += c;
        ++i;
    }
    return out;
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {
namespace detail::agent {

ELASTIC_DECL std::string temp_base(const environment& env) {
    for (const char* name : {"TMPDIR", "TEMP", "TMP"}) {
        if (const auto it = env.find(name); it != env.end() && !it->second.empty()) return it->second;
    }
    return "/tmp";
}

ELASTIC_DECL std::filesystem::path make_temp_dir(const std::filesystem::path& parent, std::string_view prefix) {
    std::string pattern = (parent / detail::format("{}XXXXXX", prefix)).string();
    if (::mkdtemp(pattern.data()) == nullptr) {
        throw log_error(detail::format("cannot create a directory like {}: {} (set {} to a writable directory)",
                                       pattern, std::generic_category().message(errno),
                                       prefix == "torchelastic_" ? "TMPDIR" : "--log-dir"));
    }
    return pattern;
}

}  // namespace detail::agent
}  // namespace elastic::inline v0

namespace elastic::inline v0 {

[[nodiscard]] ELASTIC_DECL detail::process::owned_fd open_log_file(const std::filesystem::path& path) {
    detail::process::owned_fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0666));
    if (!fd) {
        throw log_error(detail::format("cannot open {}: {}", path.string(), std::generic_category().message(errno)));
    }
    return fd;
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL std::filesystem::path log_tree::make_attempt(int attempt, int local_world_size) {
    if (disabled()) return {};
    if (run_dir_.empty()) {
        if (log_dir_) {
            std::error_code ec;
            std::filesystem::create_directories(*log_dir_, ec);
            if (ec || !std::filesystem::is_directory(*log_dir_)) {
                throw log_error(detail::format("--log-dir={}: cannot create the directory: {}", log_dir_->string(),
                                               ec ? ec.message() : std::string("not a directory")));
            }
            base_ = *log_dir_;
        } else {
            base_ = detail::agent::make_temp_dir(temp_parent_, "torchelastic_");
        }
        run_dir_ = detail::agent::make_temp_dir(base_, run_id_ + "_");
    }
    const auto name = detail::format("attempt_{}", attempt);
    std::filesystem::path dir = run_dir_ / name;
    // mkdir(2) is the test and the claim at once: an existing directory is never reused.
    for (int k = 1; ::mkdir(dir.c_str(), 0777) != 0; ++k) {
        if (errno != EEXIST) {
            throw log_error(detail::format("cannot create {}: {}", dir.string(),
                                           std::generic_category().message(errno)));
        }
        dir = run_dir_ / detail::format("{}.{}", name, k);
    }
    for (int i = 0; i < local_world_size; ++i) {
        const auto rank_dir = dir / detail::format("{}", i);
        if (::mkdir(rank_dir.c_str(), 0777) != 0) {
            throw log_error(detail::format("cannot create {}: {}", rank_dir.string(),
                                           std::generic_category().message(errno)));
        }
    }
    return dir;
}

ELASTIC_DECL void log_tree::remove_temporary() noexcept {
    if (!temporary() || base_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(base_, ignored);
    base_.clear();
    run_dir_.clear();
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
