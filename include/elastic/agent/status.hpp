// SPDX-License-Identifier: MIT
// What a running agent says of itself: agent_status (its job, round, workers and counters), as
// JSON (the status file `elasticrun status` reads, and /status), as a table for people, and as
// Prometheus text (/metrics).
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/detail/random.hpp"
#include "elastic/detail/runtime_dir.hpp"
#include "elastic/report/text.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace elastic::inline v0 {

/// One worker of the node, as the agent last saw it.
struct rank_status {
    int local_rank = 0;
    int global_rank = 0;
    long pid = 0;
    /// "running", "succeeded", "failed", "stopped" (by the agent) or "hung".
    std::string state;
    /// How it ended ("exit 3", "SIGKILL"); empty while it runs.
    std::string ended;
    /// Seconds since its last sign of life (--watchdog; nullopt without, or before the first).
    std::optional<double> heartbeat_age;
    /// The section it is in (--watchdog); empty: none.
    std::string section;
    /// The largest value it passed to progress() (--watchdog).
    std::optional<std::uint64_t> progress;

    friend bool operator==(const rank_status&, const rank_status&) = default;
};

/// One agent: its job, its place in the current round, its workers and its counters.
struct agent_status {
    std::string run_id;
    std::string node;  ///< this node's name in the rendezvous (host:pid when none is given)
    std::string host;
    std::string role = "default";
    long pid = 0;
    /// "joining" (waiting for its round), "running", "stopping" (its group), "deciding" (after
    /// a failed attempt: the restart policy, a backoff included, or the decision of the node that
    /// decides), "finishing" (its workers succeeded: the exit barrier, then leaving); read from a
    /// store, also "gone" (its lease is lost).
    std::string state = "joining";
    int round = -1;  ///< -1: none yet
    int group_rank = -1;
    int group_world_size = 0;  ///< nodes in the round
    int world_size = 0;        ///< workers in the round
    int restarts = 0;          ///< TORCHELASTIC_RESTART_COUNT of the current attempt
    int max_restarts = 0;
    std::string store;  ///< the workers' store, host:port
    /// This node's lease name in the rendezvous store (multi-node jobs; empty otherwise): a
    /// reader of the store tells a live agent from a gone one by it.
    std::string lease;
    /// The agent process's start, in clock ticks after boot (/proc/<pid>/stat): a reader tells
    /// the agent from a later process that got its pid. 0: unknown.
    std::uint64_t start_ticks = 0;
    std::vector<rank_status> ranks;
    // Counters over the agent's life.
    std::uint64_t rounds_total = 0;          ///< rounds joined
    std::uint64_t restarts_total = 0;        ///< groups started again
    std::uint64_t hangs_total = 0;           ///< workers the watchdog found hung
    std::uint64_t timer_expiries_total = 0;  ///< torch file timer scopes that expired
    std::uint64_t store_requests_total = 0;  ///< requests the stores this agent hosts served
    std::int64_t started_ms = 0;             ///< when the agent started, ms since the epoch
    std::int64_t updated_ms = 0;             ///< when this was written, ms since the epoch

    friend bool operator==(const agent_status&, const agent_status&) = default;
};

/// The status as one JSON object (version 1).
[[nodiscard]] ELASTIC_DECL std::string status_json(const agent_status& s);

/// Reads status_json()'s text back; nullopt when it is not one (a torn or foreign file).
[[nodiscard]] ELASTIC_DECL std::optional<agent_status> parse_status_json(std::string_view text);

/// A table for people: one block per agent (its job, round and state), a line per worker.
/// `now_ms`: the reader's clock, for the age of each status.
[[nodiscard]] ELASTIC_DECL std::string status_table(const std::vector<agent_status>& agents, std::int64_t now_ms);

/// The status in Prometheus' text exposition format (version 0.0.4).
[[nodiscard]] ELASTIC_DECL std::string prometheus_text(const agent_status& s);

/// Where agents of this user on this machine keep their status files:
/// $XDG_RUNTIME_DIR/elastic when that is set, else <temporary directory>/elastic-<uid>.
[[nodiscard]] ELASTIC_DECL std::filesystem::path status_directory();

/// Where `elasticrun status` looks: status_directory() and the other place an agent started
/// with another environment would have used (an ssh login has XDG_RUNTIME_DIR, a batch job often
/// not), each once.
[[nodiscard]] ELASTIC_DECL std::vector<std::filesystem::path> status_directories();

/// The status of every agent of this user on this machine that still runs (their files in
/// `dirs`), oldest agent first. Files of agents that are gone, and files that are not status, are
/// skipped; a directory that is not this user's alone is not read, and `notes` (when given) says
/// so.
[[nodiscard]] ELASTIC_DECL std::vector<agent_status> read_statuses(const std::vector<std::filesystem::path>& dirs,
                                                                   std::vector<std::string>* notes = nullptr);

namespace detail::agent {

/// Process `pid`'s start in clock ticks after boot (field 22 of /proc/<pid>/stat), or 0.
[[nodiscard]] ELASTIC_DECL std::uint64_t process_start_ticks(long pid);

/// Whether a status is worth writing out again: when anything in it but its time changed, or
/// `every` after the last one went out (its time then says the agent's loop still turns). An idle
/// agent so writes nothing most seconds instead of the same thing every second.
class status_pacer {
public:
    explicit status_pacer(std::chrono::steady_clock::duration every) : every_(every) {}

    /// Whether `s` goes out at `now`; when it does, it counts as the last one out.
    [[nodiscard]] bool due(const agent_status& s, std::chrono::steady_clock::time_point now) {
        if (last_ && now - at_ < every_) {
            last_->updated_ms = s.updated_ms;  // the time alone is no change
            if (*last_ == s) return false;
        }
        last_ = s;
        at_ = now;
        return true;
    }

    /// The last one did not go out after all (a failed write): the next due() is true.
    void forget() noexcept { last_.reset(); }

    /// Whether one went out (and was not forgotten).
    [[nodiscard]] bool holds() const noexcept { return last_.has_value(); }

private:
    std::chrono::steady_clock::duration every_;
    std::optional<agent_status> last_;
    std::chrono::steady_clock::time_point at_{};
};

[[nodiscard]] inline std::int64_t unix_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

/// How many other agents' status files one opening checks for a dead agent's.
inline constexpr std::size_t status_sweep_sample = 32;

/// This agent's status file, `<status_directory()>/<pid>.json`. Its directory is opened once and
/// checked, and every write goes through that descriptor (made aside, then swapped in), so a
/// directory swapped in under the same path is never written into; no fsync (a write must never
/// stall the agent's thread, and a lost one is replaced a second later). Files of agents that
/// are gone are removed when it opens (of `status_sweep_sample` others picked at random); its
/// own, and the directory if it is then empty, when it closes.
class status_file {
public:
    /// Throws std::runtime_error saying what is wrong with the directory.
    ELASTIC_DECL explicit status_file(long pid);
    ELASTIC_DECL ~status_file();
    status_file(const status_file&) = delete;
    status_file& operator=(const status_file&) = delete;

    /// Replaces the file's content; throws std::runtime_error. A directory removed meanwhile (by
    /// the last agent that used it) is made again.
    ELASTIC_DECL void write(std::string_view text);

private:
    ELASTIC_DECL void open_directory();

    std::filesystem::path dir_;
    std::string name_;
    int fd_ = -1;
};

}  // namespace detail::agent

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

#include "elastic/detail/format.hpp"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace elastic::inline v0 {

ELASTIC_DECL std::string status_json(const agent_status& s) {
    using json = nlohmann::ordered_json;
    json ranks = json::array();
    for (const auto& r : s.ranks) {
        json o = json::object();
        o["local_rank"] = r.local_rank;
        o["rank"] = r.global_rank;
        o["pid"] = r.pid;
        o["state"] = r.state;
        o["ended"] = r.ended;
        o["heartbeat_age"] = r.heartbeat_age ? json(*r.heartbeat_age) : json(nullptr);
        o["section"] = r.section;
        o["progress"] = r.progress ? json(*r.progress) : json(nullptr);
        ranks.push_back(std::move(o));
    }
    json o = json::object();
    o["version"] = 1;
    o["run_id"] = s.run_id;
    o["node"] = s.node;
    o["host"] = s.host;
    o["role"] = s.role;
    o["pid"] = s.pid;
    o["state"] = s.state;
    o["round"] = s.round;
    o["group_rank"] = s.group_rank;
    o["group_world_size"] = s.group_world_size;
    o["world_size"] = s.world_size;
    o["restarts"] = s.restarts;
    o["max_restarts"] = s.max_restarts;
    o["store"] = s.store;
    o["lease"] = s.lease;
    o["start_ticks"] = s.start_ticks;
    o["ranks"] = std::move(ranks);
    o["rounds_total"] = s.rounds_total;
    o["restarts_total"] = s.restarts_total;
    o["hangs_total"] = s.hangs_total;
    o["timer_expiries_total"] = s.timer_expiries_total;
    o["store_requests_total"] = s.store_requests_total;
    o["started_ms"] = s.started_ms;
    o["updated_ms"] = s.updated_ms;
    // Invalid UTF-8 in a name (a run id is the user's) is replaced, never a throw.
    return o.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

ELASTIC_DECL std::optional<agent_status> parse_status_json(std::string_view text) {
    const auto o = nlohmann::json::parse(text, nullptr, false);
    if (o.is_discarded() || !o.is_object()) return std::nullopt;
    try {
        if (o.at("version").get<int>() != 1) return std::nullopt;
        agent_status s;
        s.run_id = o.at("run_id").get<std::string>();
        s.node = o.at("node").get<std::string>();
        s.host = o.at("host").get<std::string>();
        s.role = o.at("role").get<std::string>();
        s.pid = o.at("pid").get<long>();
        s.state = o.at("state").get<std::string>();
        s.round = o.at("round").get<int>();
        s.group_rank = o.at("group_rank").get<int>();
        s.group_world_size = o.at("group_world_size").get<int>();
        s.world_size = o.at("world_size").get<int>();
        s.restarts = o.at("restarts").get<int>();
        s.max_restarts = o.at("max_restarts").get<int>();
        s.store = o.at("store").get<std::string>();
        s.lease = o.at("lease").get<std::string>();
        s.start_ticks = o.at("start_ticks").get<std::uint64_t>();
        for (const auto& r : o.at("ranks")) {
            rank_status x;
            x.local_rank = r.at("local_rank").get<int>();
            x.global_rank = r.at("rank").get<int>();
            x.pid = r.at("pid").get<long>();
            x.state = r.at("state").get<std::string>();
            x.ended = r.at("ended").get<std::string>();
            if (!r.at("heartbeat_age").is_null()) x.heartbeat_age = r.at("heartbeat_age").get<double>();
            x.section = r.at("section").get<std::string>();
            if (!r.at("progress").is_null()) x.progress = r.at("progress").get<std::uint64_t>();
            s.ranks.push_back(std::move(x));
        }
        s.rounds_total = o.at("rounds_total").get<std::uint64_t>();
        s.restarts_total = o.at("restarts_total").get<std::uint64_t>();
        s.hangs_total = o.at("hangs_total").get<std::uint64_t>();
        s.timer_expiries_total = o.at("timer_expiries_total").get<std::uint64_t>();
        s.store_requests_total = o.at("store_requests_total").get<std::uint64_t>();
        s.started_ms = o.at("started_ms").get<std::int64_t>();
        s.updated_ms = o.at("updated_ms").get<std::int64_t>();
        return s;
    } catch (const nlohmann::json::exception&) {
        return std::nullopt;
    }
}

namespace detail::agent {

/// "3.2s", "45s", "12m05s", "2h03m": an age for the table.
inline std::string age_text(double seconds) {
    if (seconds < 0) seconds = 0;
    if (seconds < 10) return detail::format("{:.1f}s", seconds);
    const auto s = static_cast<long long>(seconds);
    if (s < 60) return detail::format("{}s", s);
    if (s < 3600) return detail::format("{}m{:02}s", s / 60, s % 60);
    return detail::format("{}h{:02}m", s / 3600, s % 3600 / 60);
}

/// A Prometheus label value: valid UTF-8, backslash, double quote and newline escaped.
inline std::string label(std::string_view raw) {
    const auto value = detail::report::valid_utf8(raw);
    std::string out;
    for (const char c : value) {
        if (c == '\\') {
            out += "\\\\";
        } else if (c == '"') {
            out += "\\\"";
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out += c;
        }
    }
    return out;
}

}  // namespace detail::agent

ELASTIC_DECL std::string status_table(const std::vector<agent_status>& raw, std::int64_t now_ms) {
    // Names come from files and stores others may write: no control character reaches a terminal.
    const auto clean = [](std::string text) {
        for (auto& c : text) {
            if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
        }
        return text;
    };
    std::vector<agent_status> agents = raw;
    for (auto& a : agents) {
        for (auto* text : {&a.run_id, &a.node, &a.host, &a.state, &a.store}) *text = clean(*text);
        for (auto& r : a.ranks) {
            for (auto* text : {&r.state, &r.ended, &r.section}) *text = clean(*text);
        }
    }
    std::string out;
    for (const auto& a : agents) {
        if (!out.empty()) out += "\n";
        out += detail::format("run {}  node {} (pid {}, host {})  {}", a.run_id, a.node, a.pid, a.host, a.state);
        if (a.round >= 0) {
            out += detail::format("  round {}: node {} of {}, world {}", a.round, a.group_rank, a.group_world_size,
                                  a.world_size);
        }
        out += detail::format("  restarts {}/{}", a.restarts, a.max_restarts);
        out += detail::format("  (as of {} ago)\n",
                              detail::agent::age_text(static_cast<double>(now_ms - a.updated_ms) / 1000.0));
        if (a.ranks.empty()) continue;
        out += detail::format("  {:>5} {:>5} {:>8}  {:<10} {:>9} {:>10}  {}\n", "local", "rank", "pid", "state",
                              "heartbeat", "progress", "section");
        for (const auto& r : a.ranks) {
            const auto state = r.ended.empty() ? r.state : detail::format("{} ({})", r.state, r.ended);
            out += detail::format("  {:>5} {:>5} {:>8}  {:<10} {:>9} {:>10}  {}\n", r.local_rank, r.global_rank, r.pid,
                                  state, r.heartbeat_age ? detail::agent::age_text(*r.heartbeat_age) + " ago" : "-",
                                  r.progress ? detail::format("{}", *r.progress) : "-",
                                  r.section.empty() ? "-" : r.section);
        }
    }
    return out;
}

ELASTIC_DECL std::string prometheus_text(const agent_status& s) {
    using detail::agent::label;
    std::string out;
    const auto agent_labels = detail::format("run_id=\"{}\",node=\"{}\",role=\"{}\"", label(s.run_id), label(s.node),
                                             label(s.role));
    const auto family = [&out](std::string_view name, std::string_view type, std::string_view help) {
        out += detail::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    };
    family("elastic_agent_info", "gauge", "The agent: its job, node, role and state (always 1).");
    out += detail::format("elastic_agent_info{{{},state=\"{}\",host=\"{}\"}} 1\n", agent_labels, label(s.state),
                          label(s.host));
    struct one {
        std::string_view name;
        std::string_view type;
        std::string_view help;
        long long value;
    };
    const auto count = [](std::uint64_t n) { return static_cast<long long>(n); };
    const one agent_metrics[] = {
        {"elastic_agent_round", "gauge", "The rendezvous round this node is in (-1: none yet).", s.round},
        {"elastic_agent_members", "gauge", "Nodes in the current round.", s.group_world_size},
        {"elastic_agent_world_size", "gauge", "Workers in the current round.", s.world_size},
        {"elastic_agent_restart_count", "gauge", "The current attempt's restart count.", s.restarts},
        {"elastic_agent_rounds_total", "counter", "Rendezvous rounds this agent joined.", count(s.rounds_total)},
        {"elastic_agent_restarts_total", "counter", "Times this agent started its worker group again.",
         count(s.restarts_total)},
        {"elastic_agent_hangs_total", "counter", "Workers the watchdog found hung.", count(s.hangs_total)},
        {"elastic_agent_timer_expiries_total", "counter", "torch file timer scopes that expired.",
         count(s.timer_expiries_total)},
        {"elastic_store_requests_total", "counter", "Requests served by the stores this agent hosts.",
         count(s.store_requests_total)},
    };
    for (const auto& m : agent_metrics) {
        family(m.name, m.type, m.help);
        out += detail::format("{}{{{}}} {}\n", m.name, agent_labels, m.value);
    }
    const auto per_rank = [&](std::string_view name, std::string_view type, std::string_view help, auto value) {
        family(name, type, help);
        for (const auto& r : s.ranks) {
            if (const auto v = value(r)) {
                out += detail::format("{}{{{},local_rank=\"{}\",rank=\"{}\"}} {}\n", name, agent_labels, r.local_rank,
                                      r.global_rank, *v);
            }
        }
    };
    per_rank("elastic_worker_up", "gauge", "1 while the worker's process runs (hung or not), else 0.",
             [](const rank_status& r) -> std::optional<int> { return r.state == "running" || r.state == "hung"; });
    per_rank("elastic_worker_heartbeat_age_seconds", "gauge",
             "Seconds since the worker's last sign of life (--watchdog).",
             [](const rank_status& r) { return r.heartbeat_age; });
    per_rank("elastic_worker_progress", "gauge", "The largest value the worker passed to progress() (--watchdog).",
             [](const rank_status& r) { return r.progress; });
    return out;
}

ELASTIC_DECL std::filesystem::path status_directory() { return detail::runtime_directory(); }

namespace detail::agent {

/// The pid a status file is named after ("4242.json"; with `tmp`, also its leftover
/// "4242.json.tmp"), or 0.
inline long status_file_pid(std::string_view name, bool tmp = false) {
    if (tmp && name.size() > 4 && name.substr(name.size() - 4) == ".tmp") name.remove_suffix(4);
    if (name.size() < 6 || name.size() > 15 || name.substr(name.size() - 5) != ".json") return 0;
    long pid = 0;
    for (const char c : name.substr(0, name.size() - 5)) {
        if (c < '0' || c > '9') return 0;
        pid = pid * 10 + (c - '0');
    }
    return pid <= 0x3fffffff ? pid : 0;
}

/// Gone, or not this user's: a pid of another user (EPERM) is no agent of ours.
inline bool process_gone(long pid) { return ::kill(static_cast<pid_t>(pid), 0) != 0; }

ELASTIC_DECL std::uint64_t process_start_ticks(long pid) {
    std::ifstream stat(detail::format("/proc/{}/stat", pid));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const auto close = text.rfind(')');  // the command name may hold spaces, parentheses, newlines
    if (close == std::string::npos || close + 2 > text.size()) return 0;
    std::istringstream fields(text.substr(close + 2));
    std::string field;
    for (int i = 3; i < 22 && fields >> field; ++i) {
    }
    std::uint64_t ticks = 0;
    return fields >> ticks ? ticks : 0;
}

/// A status whose agent is not the process that now has its pid (the agent died and the pid
/// was reused): the two started at different moments.
inline bool pid_reused(const agent_status& s) {
    if (s.start_ticks == 0) return false;
    const auto now = process_start_ticks(s.pid);
    return now != 0 && now != s.start_ticks;
}

}  // namespace detail::agent

ELASTIC_DECL detail::agent::status_file::status_file(long pid)
    : dir_(status_directory()), name_(detail::format("{}.json", pid)) {
    open_directory();
    // Files of agents that died without removing theirs (SIGKILL), and their leftovers: a
    // random sample of the others' files is checked, so that each of a thousand agents starting
    // on one host does not ask about every other one; a file left out is checked at a later open.
    std::uint64_t state = detail::random_u64() | 1;
    const int copy = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
    DIR* d = copy < 0 ? nullptr : ::fdopendir(copy);
    if (d == nullptr) {
        if (copy >= 0) ::close(copy);
        return;
    }
    std::vector<std::string> sample;  // reservoir sampling over the directory
    std::size_t seen = 0;
    try {
        while (const dirent* e = ::readdir(d)) {
            const long other = status_file_pid(e->d_name, true);
            if (other <= 0 || other == pid) continue;
            ++seen;
            if (sample.size() < status_sweep_sample) {
                sample.emplace_back(e->d_name);
                continue;
            }
            state ^= state << 13;  // xorshift64
            state ^= state >> 7;
            state ^= state << 17;
            if (const std::size_t slot = state % seen; slot < status_sweep_sample) sample[slot] = e->d_name;
        }
    } catch (...) {
        // Out of memory: what was sampled is checked; the rest waits for another open.
    }
    ::closedir(d);
    for (const auto& name : sample) {
        const long other = status_file_pid(name, true);
        if (!process_gone(other)) continue;
        const auto file = detail::format("{}.json", other);  // both of a dead agent's files
        ::unlinkat(fd_, file.c_str(), 0);
        ::unlinkat(fd_, (file + ".tmp").c_str(), 0);
    }
}

ELASTIC_DECL void detail::agent::status_file::open_directory() {
    std::string why;
    int fd = -1;
    // Another agent may remove the directory (its last file gone) between the mkdir and the open.
    for (int attempt = 0; attempt < 5 && fd < 0; ++attempt) {
        fd = detail::open_private_directory(dir_, true, why);
        if (fd < 0 && !why.empty()) break;
    }
    if (fd < 0) throw std::runtime_error(why.empty() ? detail::format("cannot open {}", dir_.string()) : why);
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
}

ELASTIC_DECL detail::agent::status_file::~status_file() {
    if (fd_ < 0) return;
    ::unlinkat(fd_, name_.c_str(), 0);
    ::unlinkat(fd_, (name_ + ".tmp").c_str(), 0);
    // The directory too when this was the last agent's file; only if the path is still it.
    struct stat mine {};
    struct stat there {};
    if (::fstat(fd_, &mine) == 0 && ::lstat(dir_.c_str(), &there) == 0 && mine.st_ino == there.st_ino &&
        mine.st_dev == there.st_dev) {
        ::rmdir(dir_.c_str());
    }
    ::close(fd_);
}

ELASTIC_DECL void detail::agent::status_file::write(std::string_view text) {
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || st.st_nlink == 0) open_directory();  // removed under us
    const auto tmp = name_ + ".tmp";
    // The aside file is rewritten in place (not truncated to nothing) and then swapped with the
    // status file, not renamed over it: no file's blocks are freed on a write. On ext4 mounted
    // with `discard`, freeing them makes the system call wait for the device: 140 µs a write on
    // an idle disk here, against 12 µs swapped, and longer behind a checkpoint's writes.
    int fd = ::openat(fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno == ENOENT) {  // removed, on a file system that keeps its link count
        open_directory();
        fd = ::openat(fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    }
    if (fd < 0)
        throw std::runtime_error(detail::format("cannot write {}: {}", (dir_ / tmp).string(), std::strerror(errno)));
    std::size_t done = 0;
    while (done < text.size()) {
        const auto n = ::pwrite(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += static_cast<std::size_t>(n);
    }
    int error = errno;
    if (done == text.size() && ::ftruncate(fd, static_cast<off_t>(done)) != 0) {
        error = errno;
        done = 0;
    }
    ::close(fd);
    if (done != text.size()) {
        ::unlinkat(fd_, tmp.c_str(), 0);
        throw std::runtime_error(detail::format("cannot write {}: {}", (dir_ / tmp).string(), std::strerror(error)));
    }
    // The first write has nothing to swap with (ENOENT); a file system without the exchange
    // (EINVAL) gets a plain rename.
    if (::renameat2(fd_, tmp.c_str(), fd_, name_.c_str(), RENAME_EXCHANGE) == 0) return;
    if ((errno != ENOENT && errno != EINVAL) || ::renameat(fd_, tmp.c_str(), fd_, name_.c_str()) != 0) {
        throw std::runtime_error(detail::format("cannot rename into {}: {}", (dir_ / name_).string(),
                                                std::strerror(errno)));
    }
}

ELASTIC_DECL std::vector<std::filesystem::path> status_directories() {
    std::vector<std::filesystem::path> out;
    std::error_code ec;
    // A TMPDIR that is no directory costs its place only.
    const auto tmp = std::filesystem::temp_directory_path(ec);
    if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime != nullptr && *runtime == '/') {
        out.push_back(std::filesystem::path(runtime) / "elastic");
    }
    if (!ec) {
        const auto other = tmp / detail::format("elastic-{}", ::geteuid());
        if (out.empty() || other != out.front()) out.push_back(other);
    }
    return out;
}

ELASTIC_DECL std::vector<agent_status> read_statuses(const std::vector<std::filesystem::path>& dirs,
                                                     std::vector<std::string>* notes) {
    std::vector<agent_status> out;
    for (const auto& dir : dirs) {
        std::string why;
        const int dfd = detail::open_private_directory(dir, false, why);
        if (dfd < 0) {
            if (!why.empty() && notes != nullptr) notes->push_back(detail::format("not read: {}", why));
            continue;
        }
        DIR* d = ::fdopendir(dfd);
        if (d == nullptr) {
            ::close(dfd);
            continue;
        }
        while (const dirent* e = ::readdir(d)) {
            const long pid = detail::agent::status_file_pid(e->d_name);
            if (pid <= 0 || detail::agent::process_gone(pid)) continue;
            if (std::any_of(out.begin(), out.end(), [pid](const agent_status& a) { return a.pid == pid; })) continue;
            // Opened without following a link or waiting on a FIFO; a regular file of this user's,
            // read up to 1 MiB. The agent rewrites the file it swapped out: one opened just before
            // the swap may be rewritten while it is read, and is read again under its name.
            std::optional<agent_status> s;
            for (int attempt = 0; attempt < 3 && !s; ++attempt) {
                const int fd = ::openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
                if (fd < 0) break;
                struct stat st {};
                std::string text;
                if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
                    st.st_size <= (1 << 20)) {
                    text.resize(static_cast<std::size_t>(st.st_size));
                    const auto n = ::read(fd, text.data(), text.size());
                    text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
                }
                ::close(fd);
                s = parse_status_json(text);
            }
            if (s && s->pid == pid && !detail::agent::pid_reused(*s)) out.push_back(std::move(*s));
        }
        ::closedir(d);
    }
    std::sort(out.begin(), out.end(), [](const agent_status& a, const agent_status& b) {
        return a.started_ms != b.started_ms ? a.started_ms < b.started_ms : a.pid < b.pid;
    });
    return out;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
