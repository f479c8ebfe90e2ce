// SPDX-License-Identifier: MIT
// What reading a torchelastic error file gives: error_file_format, error_file_status,
// error_file_content and error_file_read, and the limits the reader applies. Only the types:
// the reader itself (and the full JSON library) is in elastic/report/error_file.hpp.
#pragma once

#include "elastic/detail/config.hpp"

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace elastic::inline v0 {

/// Which of the two shapes PyTorch's ProcessFailure accepts a file has.
enum class error_file_format {
    /// What `@record` (ErrorHandler.record_exception) and elastic::record write:
    /// `{"message": {"message": "<Type>: <what>", "extraInfo": {"py_callstack": "...",
    /// "timestamp": "<unix seconds>"}}}`, and, after a parent copied it up, `"errorCode": <int>`
    /// inside the outer "message" object.
    nested,
    /// The "new format" the reader also accepts: `{"message": "<text>", "timestamp": <seconds>}`.
    flat,
};

/// What reading a worker's error file found.
enum class error_file_status {
    /// No path was given, or no file exists there: the worker wrote nothing (a signal, a native
    /// binary without elastic::record, a Python script without @record). torchrun shows "<N/A>".
    absent,
    /// A well-formed file in one of the two formats.
    parsed,
    /// Something is there but cannot be used; `problem` says why.
    malformed,
};

/// The content of a well-formed error file.
struct error_file_content {
    error_file_format format = error_file_format::nested;
    /// "ValueError: boom" (nested) or the flat message. Empty when a nested file has none.
    std::string message;
    /// extraInfo.py_callstack of a nested file (a Python traceback, or elastic::record's C++
    /// backtrace), when present.
    std::optional<std::string> traceback;
    /// When the worker recorded the error, when the file says so.
    std::optional<std::chrono::system_clock::time_point> timestamp;
    /// True when the timestamp was a whole number of seconds (what PyTorch writes): the error
    /// then happened somewhere in [timestamp, timestamp + 1 s).
    bool timestamp_whole_seconds = true;
    /// message.errorCode (nested) or a top-level errorCode, set by a launcher that copied a
    /// child's file up.
    std::optional<long long> error_code;
    /// The file as parsed, key order kept, for copying into a parent's error file (shared and
    /// read-only, so that this header needs only <nlohmann/json_fwd.hpp>; null when not parsed).
    std::shared_ptr<const nlohmann::ordered_json> document;
};

/// The outcome of reading one error file; never an exception.
struct error_file_read {
    error_file_status status = error_file_status::absent;
    /// The path that was read (empty when the worker had none).
    std::string path;
    /// Meaningful when status == parsed.
    error_file_content content;
    /// When status == malformed: what is wrong, as one line of valid UTF-8.
    std::string problem;

    bool parsed() const noexcept { return status == error_file_status::parsed; }
};

/// Files larger than this are reported as malformed instead of read: a Python traceback is a
/// few kilobytes (RecursionError's is folded by Python), so megabytes mean garbage.
inline constexpr std::size_t max_error_file_bytes = std::size_t{4} << 20;

/// Nesting deeper than this is malformed (the formats need three levels); checked before
/// parsing so hostile input cannot make the parser or the copy recurse deeply.
inline constexpr int max_error_file_depth = 32;

/// The latest timestamp an error file may carry (2200-01-01 UTC, in seconds since the epoch).
inline constexpr double max_error_file_timestamp = 7258118400.0;

}  // namespace elastic::inline v0
