// SPDX-License-Identifier: MIT
// Events in torchelastic's shape (torch.distributed.elastic.events.Event), the per-worker status
// event the agent records when a group ends, and an append-only JSON-lines event log.
#pragma once

#include "elastic/detail/backtrace.hpp"
#include "elastic/detail/config.hpp"
#include "elastic/report/agent_error_file.hpp"
#include "elastic/report/failure.hpp"

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <concepts>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "elastic/detail/format.hpp"
#if ELASTIC_DETAIL_BODIES
#include <nlohmann/json.hpp>
#endif

namespace elastic::inline v0 {

/// Who produced an event (torch's EventSource).
enum class event_source { agent, worker };

/// One metadata value of an event: null, a boolean, an integer, a floating-point number or a
/// string, what torch's Event metadata may hold. Made implicitly from any of them (an integer
/// of at most 64 bits that fits in std::int64_t), so `m["pid"] = 42` and `m["state"] = "FAILED"`
/// read as they would with a JSON object.
class event_value {
public:
    using storage = std::variant<std::nullptr_t, bool, std::int64_t, double, std::string>;

    event_value() noexcept = default;
    event_value(std::nullptr_t) noexcept {}
    event_value(bool b) noexcept : value_(b) {}
    // clang-format off
    template <std::integral I>
        requires(!std::same_as<I, bool> && (std::signed_integral<I> || sizeof(I) < sizeof(std::int64_t)))
    event_value(I i) noexcept : value_(static_cast<std::int64_t>(i)) {}
    // clang-format on
    event_value(double d) noexcept : value_(d) {}
    event_value(std::string s) noexcept : value_(std::move(s)) {}
    event_value(std::string_view s) : value_(std::string(s)) {}
    event_value(const char* s) : value_(std::string(s)) {}

    [[nodiscard]] bool is_null() const noexcept { return std::holds_alternative<std::nullptr_t>(value_); }
    [[nodiscard]] bool is_bool() const noexcept { return std::holds_alternative<bool>(value_); }
    [[nodiscard]] bool is_integer() const noexcept { return std::holds_alternative<std::int64_t>(value_); }
    [[nodiscard]] bool is_float() const noexcept { return std::holds_alternative<double>(value_); }
    [[nodiscard]] bool is_string() const noexcept { return std::holds_alternative<std::string>(value_); }

    /// The value as `T` (bool, std::int64_t, double or std::string); std::bad_variant_access
    /// when it holds another type.
    template <class T>
    [[nodiscard]] const T& get() const {
        return std::get<T>(value_);
    }
    [[nodiscard]] const storage& value() const noexcept { return value_; }

    /// Equal when both hold the same type and value (1 and 1.0 differ).
    friend bool operator==(const event_value&, const event_value&) = default;

private:
    storage value_;
};

/// An event's metadata: keys in the order they were first set, each with an event_value.
class event_metadata {
public:
    using entry = std::pair<std::string, event_value>;
    using const_iterator = std::vector<entry>::const_iterator;

    /// The value at `key`; a new null one, last, when there is none.
    event_value& operator[](std::string_view key) {
        for (auto& e : entries_) {
            if (e.first == key) return e.second;
        }
        return entries_.emplace_back(std::string(key), event_value{}).second;
    }
    /// The value at `key`; std::out_of_range when there is none.
    [[nodiscard]] const event_value& operator[](std::string_view key) const {
        if (const auto* v = find(key)) return *v;
        throw std::out_of_range("event metadata has no key \"" + std::string(key) + "\"");
    }
    /// The value at `key`, or null when there is none.
    [[nodiscard]] const event_value* find(std::string_view key) const noexcept {
        for (const auto& e : entries_) {
            if (e.first == key) return &e.second;
        }
        return nullptr;
    }
    [[nodiscard]] bool contains(std::string_view key) const noexcept { return find(key) != nullptr; }
    /// Removes `key`; whether it was there.
    bool erase(std::string_view key) noexcept {
        for (auto it = entries_.begin(); it != entries_.end(); ++it) {
            if (it->first == key) {
                entries_.erase(it);
                return true;
            }
        }
        return false;
    }
    [[nodiscard]] std::size_t size() const noexcept { return entries_.size(); }
    [[nodiscard]] bool empty() const noexcept { return entries_.empty(); }
    [[nodiscard]] const_iterator begin() const noexcept { return entries_.begin(); }
    [[nodiscard]] const_iterator end() const noexcept { return entries_.end(); }

    friend bool operator==(const event_metadata&, const event_metadata&) = default;

private:
    std::vector<entry> entries_;
};

/// One event, serialised as torch's Event.serialize() does:
/// `{"name": ..., "source": "AGENT"|"WORKER", "timestamp": <ms>, "metadata": {...}}`, so torch's
/// Event.deserialize() reads ours. Metadata values are strings, numbers, booleans or null.
struct event {
    std::string name;
    event_source source = event_source::agent;
    /// Milliseconds since the epoch (torch documents this and leaves it 0; we set it).
    std::int64_t timestamp = 0;
    event_metadata metadata;

    /// One line of JSON (no newline). Bytes that are not UTF-8 become U+FFFD, so this never
    /// throws on what a worker wrote. A floating-point value that is not finite is written null.
    ELASTIC_DECL std::string serialize() const;
};

/// What a worker status event says beyond the failure itself: the agent's view of the run.
struct worker_event_context {
    std::string run_id;
    int group_rank = 0;
    int group_world_size = 1;
    /// The world size of the worker's role (ROLE_WORLD_SIZE), and what its role rank adds to its
    /// global rank (ROLE_RANK - RANK: the same for every worker of a node).
    int role_world_size = 1;
    int role_rank_offset = 0;
    std::string entry_point;
    std::string rdzv_backend;
    /// Whole seconds since the agent started running workers (torch's total_run_time).
    std::int64_t total_run_time = 0;
    /// Restarts so far (torch: max_restarts - remaining_restarts).
    int agent_restarts = 0;
    std::string hostname;
};

/// torch's state string for a worker in a failure report: "FAILED", or "TERMINATED" for a worker
/// the agent stopped (torch's _get_worker_state uses the same word for them).
inline std::string_view worker_event_state(const worker_failure& f) noexcept {
    return f.state == failure_state::failed ? "FAILED" : "TERMINATED";
}

/// One worker as a status event names it.
struct worker_status_subject {
    long pid = 0;
    int local_rank = 0;
    int global_rank = 0;
    std::string role;
};

/// The `torchelastic.worker.status.<STATE>` event for one worker of a failed group, with torch
/// 1.13's metadata keys (agent/server/api.py, _construct_event): run_id, global_rank, group_rank,
/// worker_id (the pid, as a string), role, hostname, state, total_run_time, rdzv_backend,
/// raw_error (the error file as JSON text; `{"message": "<NONE>"}` without one and null for a
/// worker the agent stopped, as torch), a
/// JSON-text "metadata" (group_world_size, entry_point, and local_rank / role_rank /
/// role_world_size as one-element lists, which is what torch's trailing commas produce), and
/// agent_restarts. Both JSON texts are written byte for byte as torch's json.dumps writes them
/// (", " and ": ", \uXXXX escapes). Additions: "exitcode" (torch's numbering) and the event's timestamp, the
/// failure's time in milliseconds.
ELASTIC_DECL event worker_status_event(const worker_failure& f, const worker_event_context& ctx);

/// The `torchelastic.worker.status.SUCCEEDED` event for one worker of a group that succeeded
/// (torch records one per worker at the end of a successful run): the same keys, raw_error
/// null, exitcode 0, stamped `when` (the agent's end of the run).
ELASTIC_DECL event worker_succeeded_event(const worker_status_subject& w, const worker_event_context& ctx,
                                          std::chrono::system_clock::time_point when);

/// An append-only log of events, one JSON line each. Each line goes out in one write(2) on a file
/// opened with O_APPEND, so several agents sharing the file (one per node on a shared file
/// system that honours O_APPEND, or several on one host) never interleave inside a line.
/// Recording never throws: an event log must not take the agent down.
class event_log {
public:
    /// Append to the file at `path`, creating it (0644). Throws report_error when it cannot be
    /// opened.
    explicit event_log(const std::string& path)
        : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)), owned_(true) {
        if (fd_ < 0) {
            throw report_error(detail::format("cannot open the event log \"{}\": {}", path, std::strerror(errno)));
        }
    }

    /// Write to a descriptor the caller keeps open (e.g. 2 for a "console" log).
    static event_log to_descriptor(int fd) noexcept { return event_log(fd); }

    event_log(event_log&& other) noexcept
        : fd_(std::exchange(other.fd_, -1)), owned_(std::exchange(other.owned_, false)) {}
    ELASTIC_DECL event_log& operator=(event_log&& other) noexcept;
    event_log(const event_log&) = delete;
    event_log& operator=(const event_log&) = delete;
    ~event_log() { close(); }

    /// Append one event. Returns false (and loses only this event) when it cannot be written
    /// whole.
    ELASTIC_DECL bool record(const event& e) noexcept;

private:
    explicit event_log(int fd) noexcept : fd_(fd), owned_(false) {}

    ELASTIC_DECL void close() noexcept;

    int fd_ = -1;
    bool owned_ = false;
};

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

namespace detail::report {

struct string_sink {
    std::string& text;
    void put(char c) { text.push_back(c); }
};

// What Python's json.dumps(value) writes, byte for byte, for what torch builds its status events
// from: separators ", " and ": ", non-ASCII as \uXXXX (ensure_ascii), keys in their order.
// Numbers, booleans and null are spelt alike in both.
inline void python_json(std::string& out, const nlohmann::ordered_json& value) {
    string_sink sink{out};
    const auto quoted = [&](const std::string& text) {
        out.push_back('"');
        detail::json_escape(sink, text.data(), text.size());
        out.push_back('"');
    };
    if (value.is_object()) {
        out.push_back('{');
        bool first = true;
        for (auto it = value.begin(); it != value.end(); ++it) {
            if (!first) out += ", ";
            first = false;
            quoted(it.key());
            out += ": ";
            python_json(out, it.value());
        }
        out.push_back('}');
    } else if (value.is_array()) {
        out.push_back('[');
        for (std::size_t i = 0; i < value.size(); ++i) {
            if (i != 0) out += ", ";
            python_json(out, value[i]);
        }
        out.push_back(']');
    } else if (value.is_string()) {
        quoted(value.get_ref<const std::string&>());
    } else {
        out += value.dump();
    }
}

inline std::string python_json(const nlohmann::ordered_json& value) {
    std::string out;
    python_json(out, value);
    return out;
}

// torch 1.13's _construct_event for a worker, with our two additions (exitcode, timestamp).
inline event worker_status(std::string_view state, const worker_status_subject& w, event_value raw_error, int exitcode,
                           std::chrono::system_clock::time_point when, const worker_event_context& ctx) {
    using json = nlohmann::ordered_json;
    json md = json::object();
    md["group_world_size"] = ctx.group_world_size;
    md["entry_point"] = ctx.entry_point;
    md["local_rank"] = json::array({w.local_rank});
    md["role_rank"] = json::array({w.global_rank + ctx.role_rank_offset});
    md["role_world_size"] = json::array({ctx.role_world_size});

    event e;
    e.name = "torchelastic.worker.status." + std::string(state);
    e.source = event_source::worker;
    e.timestamp = std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count();
    auto& m = e.metadata;
    m["run_id"] = ctx.run_id;
    m["global_rank"] = w.global_rank;
    m["group_rank"] = ctx.group_rank;
    m["worker_id"] = std::to_string(w.pid);
    m["role"] = w.role;
    m["hostname"] = ctx.hostname;
    m["state"] = std::string(state);
    m["total_run_time"] = ctx.total_run_time;
    m["rdzv_backend"] = ctx.rdzv_backend;
    m["raw_error"] = std::move(raw_error);
    m["metadata"] = python_json(md);  // torch: json.dumps(md)
    m["agent_restarts"] = ctx.agent_restarts;
    m["exitcode"] = exitcode;
    return e;
}

// The metadata as a JSON object, in its order.
inline nlohmann::ordered_json to_json(const event_metadata& metadata) {
    auto out = nlohmann::ordered_json::object();
    for (const auto& entry : metadata) {
        std::visit([&out, &entry](const auto& v) { out[entry.first] = v; }, entry.second.value());
    }
    return out;
}

}  // namespace detail::report

ELASTIC_DECL std::string event::serialize() const {
    nlohmann::ordered_json j;
    j["name"] = name;
    j["source"] = source == event_source::agent ? "AGENT" : "WORKER";
    j["timestamp"] = timestamp;
    j["metadata"] = detail::report::to_json(metadata);
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

ELASTIC_DECL event worker_status_event(const worker_failure& f, const worker_event_context& ctx) {
    using json = nlohmann::ordered_json;
    // torch: json.dumps(failure.error_file_data) for a failure, None for a terminated worker.
    event_value raw_error;
    if (f.state == failure_state::stopped_by_agent) {
        raw_error = nullptr;
    } else if (f.error_file.parsed()) {
        raw_error = detail::report::python_json(f.error_file.content.document ? *f.error_file.content.document
                                                                              : json());
    } else if (f.error_file.status == error_file_status::malformed) {
        raw_error = detail::report::python_json(json{{"message", "Malformed error file: " + f.error_file.problem}});
    } else {
        raw_error = R"({"message": "<NONE>"})";
    }
    return detail::report::worker_status(worker_event_state(f), {f.pid, f.local_rank, f.global_rank, f.role},
                                         std::move(raw_error), f.status.returncode(), failure_display_time(f), ctx);
}

ELASTIC_DECL event worker_succeeded_event(const worker_status_subject& w, const worker_event_context& ctx,
                                          std::chrono::system_clock::time_point when) {
    return detail::report::worker_status("SUCCEEDED", w, nullptr, 0, when, ctx);
}

}  // namespace elastic::inline v0

namespace elastic::inline v0 {

ELASTIC_DECL event_log& event_log::operator=(event_log&& other) noexcept {
    if (this != &other) {
        close();
        fd_ = std::exchange(other.fd_, -1);
        owned_ = std::exchange(other.owned_, false);
    }
    return *this;
}

ELASTIC_DECL bool event_log::record(const event& e) noexcept {
    try {
        std::string line = e.serialize();
        line += '\n';
        std::string_view rest = line;
        while (!rest.empty()) {
            const ssize_t n = ::write(fd_, rest.data(), rest.size());
            if (n < 0) {
                if (errno == EINTR) {
                    continue;
                }
                return false;
            }
            rest.remove_prefix(static_cast<std::size_t>(n));
        }
        return true;
    } catch (...) {
        return false;
    }
}

ELASTIC_DECL void event_log::close() noexcept {
    if (owned_ && fd_ >= 0) {
        ::close(fd_);
    }
    fd_ = -1;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
