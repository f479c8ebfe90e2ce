// SPDX-License-Identifier: MIT
// The agent's own error file: the root cause written into $TORCHELASTIC_ERROR_FILE with errorCode,
// as torchrun's @record-decorated main does, so an outer launcher or scheduler sees it.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/error.hpp"
#include "elastic/report/failure.hpp"
#include "elastic/report/text.hpp"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "elastic/detail/format.hpp"
#include <nlohmann/json_fwd.hpp>
#if ELASTIC_DETAIL_BODIES
#include <nlohmann/json.hpp>
#endif

namespace elastic::inline v0 {

/// Writing a report file failed (the message names the path and the system's reason).
class report_error : public error {
public:
    using error::error;
};

/// The JSON the agent writes for its root cause. As torchrun's @record on main
/// (ErrorHandler.dump_error_file): the worker's own error file, copied, with
/// `message.errorCode` set to the worker's exit code in torchrun's numbering (-N for signal N).
/// Two additions where torchrun writes nothing useful:
/// - a flat-format file ("message" is a string), where torchrun skips the errorCode, gets it as
///   a top-level "errorCode";
/// - a worker without a well-formed file (a signal, a native binary, a malformed file), where
///   torchrun writes no file at all, gets one in @record's nested format: message = the
///   failure's headline ("Signal 9 (SIGKILL) received by PID 1234"), py_callstack = what the
///   summary shows as its traceback (the stderr tail), timestamp = the failure's time.
ELASTIC_DECL nlohmann::ordered_json agent_error_document(const worker_failure& root);

/// The agent's error file when the agent itself failed and no worker's failure explains it (a
/// rendezvous error, an internal error): @record's nested format, as torch's @record on
/// torchrun's main writes it for an exception (`message` = "<type>: <what>", `py_callstack`,
/// `timestamp` in whole seconds), plus `errorCode` = elasticrun's exit code (torch's @record
/// sets none here; an outer launcher reads it as this process's code).
ELASTIC_DECL nlohmann::ordered_json agent_exception_document(
    std::string_view type, std::string_view what, int exit_code,
    std::chrono::system_clock::time_point when = std::chrono::system_clock::now());

/// Replace the file at `path` with `contents` atomically: a temporary file in the same directory,
/// written, flushed to disk and renamed over `path`, so a reader sees the old file or the whole
/// new one, never a part. Throws report_error naming the path and the reason.
/// The error file the agent writes for a worker its watchdog found hung: the hang's headline
/// as the message, and the headline followed by the worker's stacks as the callstack, stamped
/// `when` (the detection).
ELASTIC_DECL nlohmann::ordered_json hang_error_document(const hang_report& hang,
                                                        std::chrono::system_clock::time_point when);

ELASTIC_DECL void write_file_atomically(const std::string& path, std::string_view contents);

/// Write the root cause into the error file at `path` (agent_error_document, replacing any file
/// there atomically). Throws report_error when the file cannot be written.
ELASTIC_DECL void write_agent_error_file(const std::string& path, const worker_failure& root);

/// Write the root cause into $TORCHELASTIC_ERROR_FILE, as torchrun's own main does. Returns
/// false, writing nothing, when the variable is unset or empty (no outer launcher asked).
ELASTIC_DECL bool write_agent_error_file(const worker_failure& root);

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

ELASTIC_DECL nlohmann::ordered_json agent_error_document(const worker_failure& root) {
    using json = nlohmann::ordered_json;
    const int error_code = root.status.returncode();
    if (root.error_file.parsed()) {
        json doc = root.error_file.content.document ? *root.error_file.content.document : json();
        if (root.error_file.content.format == error_file_format::nested) {
            doc["message"]["errorCode"] = error_code;
        } else {
            doc["errorCode"] = error_code;
        }
        return doc;
    }
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(failure_display_time(root).time_since_epoch())
                             .count();
    json extra = json::object();
    extra["py_callstack"] = detail::report::valid_utf8(failure_traceback(root));
    extra["timestamp"] = std::to_string(seconds);
    json message = json::object();
    message["message"] = detail::report::valid_utf8(failure_headline(root));
    message["extraInfo"] = std::move(extra);
    message["errorCode"] = error_code;
    json doc = json::object();
    doc["message"] = std::move(message);
    return doc;
}

ELASTIC_DECL nlohmann::ordered_json agent_exception_document(std::string_view type, std::string_view what,
                                                             int exit_code,
                                                             std::chrono::system_clock::time_point when) {
    using json = nlohmann::ordered_json;
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(when.time_since_epoch()).count();
    const std::string message = detail::report::valid_utf8(detail::format("{}: {}", type, what));
    json extra = json::object();
    extra["py_callstack"] = message;
    extra["timestamp"] = std::to_string(seconds);
    json inner = json::object();
    inner["message"] = message;
    inner["extraInfo"] = std::move(extra);
    inner["errorCode"] = exit_code;
    json doc = json::object();
    doc["message"] = std::move(inner);
    return doc;
}

ELASTIC_DECL nlohmann::ordered_json hang_error_document(const hang_report& hang,
                                                        std::chrono::system_clock::time_point when) {
    using json = nlohmann::ordered_json;
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(when.time_since_epoch()).count();
    const std::string message = detail::report::valid_utf8(hang.headline());
    json extra = json::object();
    const char* none = hang.stacks_asked ? "\n(no stacks: the worker wrote none on the watchdog's signal)"
                                         : "\n(no stacks: a torch timer's expiry only sends the signal it asked for)";
    extra["py_callstack"] = hang.stacks.empty() ? message + none
                                                : message + "\n" + detail::report::valid_utf8(hang.stacks);
    extra["timestamp"] = std::to_string(seconds);
    json inner = json::object();
    inner["message"] = message;
    inner["extraInfo"] = std::move(extra);
    json doc = json::object();
    doc["message"] = std::move(inner);
    return doc;
}

ELASTIC_DECL void write_file_atomically(const std::string& path, std::string_view contents) {
    const auto slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? std::string(".") : path.substr(0, slash);
    const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
    if (base.empty()) {
        throw report_error(detail::format("cannot write the error file \"{}\": the path names a "
                                          "directory, not a file",
                                          path));
    }
    std::string temp = detail::format("{}/.{}.XXXXXX", dir, base);
    const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
    if (fd < 0) {
        throw report_error(detail::format("cannot write the error file \"{}\": creating a temporary "
                                          "file in \"{}\" failed: {}",
                                          path, dir, std::strerror(errno)));
    }
    const auto fail = [&](const char* step) {
        const int err = errno;
        ::close(fd);
        ::unlink(temp.c_str());
        throw report_error(detail::format("cannot write the error file \"{}\": {} \"{}\" failed: {}", path, step, temp,
                                          std::strerror(err)));
    };
    // mkstemp makes it 0600; an error file is read by whoever launched us, as torchrun's is.
    if (::fchmod(fd, 0644) != 0) {
        fail("setting the mode of");
    }
    std::string_view rest = contents;
    while (!rest.empty()) {
        const ssize_t n = ::write(fd, rest.data(), rest.size());
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            fail("writing");
        }
        rest.remove_prefix(static_cast<std::size_t>(n));
    }
    if (::fsync(fd) != 0) {
        fail("flushing");
    }
    if (::close(fd) != 0) {
        const int err = errno;
        ::unlink(temp.c_str());
        throw report_error(detail::format("cannot write the error file \"{}\": closing \"{}\" "
                                          "failed: {}",
                                          path, temp, std::strerror(err)));
    }
    if (::rename(temp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(temp.c_str());
        throw report_error(detail::format("cannot write the error file \"{}\": renaming \"{}\" to it "
                                          "failed: {}",
                                          path, temp, std::strerror(err)));
    }
}

ELASTIC_DECL void write_agent_error_file(const std::string& path, const worker_failure& root) {
    write_file_atomically(path, agent_error_document(root).dump());
}

ELASTIC_DECL bool write_agent_error_file(const worker_failure& root) {
    const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (path == nullptr || *path == '\0') {
        return false;
    }
    write_agent_error_file(std::string(path), root);
    return true;
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
