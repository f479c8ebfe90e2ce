// SPDX-License-Identifier: MIT
// Reading torchelastic error files: both JSON shapes PyTorch reads (and elastic::record writes),
// with every way a file can be broken reported as "malformed", never thrown.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/report/error_file_content.hpp"
#include "elastic/report/text.hpp"

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "elastic/detail/format.hpp"
#if ELASTIC_DETAIL_BODIES
#include <nlohmann/json.hpp>
#endif

namespace elastic::inline v0 {

/// Parse the bytes of an error file (`path` is only recorded in the result). Never throws: every
/// defect, including running out of memory, comes back as status malformed with the reason.
ELASTIC_DECL error_file_read parse_error_file(std::string_view bytes, std::string path = {}) noexcept;

/// Read the error file at `path` (what the agent set as the worker's TORCHELASTIC_ERROR_FILE).
/// An empty path or no file there gives status absent. Anything that is not a readable regular
/// file of at most max_error_file_bytes holding one of the two formats gives status malformed
/// with the reason. Never throws and never blocks: a FIFO is opened non-blocking and rejected.
ELASTIC_DECL error_file_read read_error_file(const std::string& path) noexcept;

}  // namespace elastic::inline v0

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0 {

namespace detail::report {

/// Deepest [ / { nesting of a JSON text, strings skipped; stops counting past `limit`.
inline int json_depth(std::string_view text, int limit) noexcept {
    int depth = 0;
    int deepest = 0;
    bool in_string = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (c == '\\') {
                ++i;
            } else if (c == '"') {
                in_string = false;
            }
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > deepest) {
                deepest = depth;
                if (deepest > limit) {
                    return deepest;
                }
            }
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return deepest;
}

inline int hex_digit(char c) noexcept {
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/// The code unit of a "\uXXXX" escape starting at text[i] (the backslash), or -1.
inline long json_u_escape(std::string_view text, std::size_t i) noexcept {
    if (i + 6 > text.size() || text[i] != '\\' || text[i + 1] != 'u') {
        return -1;
    }
    long v = 0;
    for (std::size_t k = 2; k < 6; ++k) {
        const int d = hex_digit(text[i + k]);
        if (d < 0) {
            return -1;
        }
        v = v * 16 + d;
    }
    return v;
}

/// `text` with every unpaired UTF-16 surrogate escape ("\udc80") replaced by "\ufffd". Python's
/// json.dump writes those for undecodable bytes in a traceback (surrogateescape) and json.load
/// accepts them; nlohmann rejects them, so a reader that wants to agree with PyTorch repairs them.
inline std::string repair_lone_surrogates(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    bool in_string = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (!in_string) {
            in_string = c == '"';
            out += c;
            continue;
        }
        if (c == '"') {
            in_string = false;
            out += c;
            continue;
        }
        if (c != '\\' || i + 1 >= text.size()) {
            out += c;
            continue;
        }
        const long unit = json_u_escape(text, i);
        if (unit < 0) {
            out += c;
            out += text[++i];  // any other escape, copied whole so "\\u" is not misread
            continue;
        }
        if (unit >= 0xD800 && unit <= 0xDBFF) {
            const long next = json_u_escape(text, i + 6);
            if (next >= 0xDC00 && next <= 0xDFFF) {
                out.append(text.substr(i, 12));
                i += 11;
                continue;
            }
            out += "\\ufffd";
            i += 5;
            continue;
        }
        if (unit >= 0xDC00 && unit <= 0xDFFF) {
            out += "\\ufffd";
        } else {
            out.append(text.substr(i, 6));
        }
        i += 5;
    }
    return out;
}

/// nlohmann's exception text without its "[json.exception.parse_error.101] " prefix.
inline std::string json_error_text(const char* what) {
    std::string_view s = what;
    if (!s.empty() && s.front() == '[') {
        const auto close = s.find("] ");
        if (close != std::string_view::npos) {
            s.remove_prefix(close + 2);
        }
    }
    return valid_utf8(s);
}

/// A seconds-since-epoch value as JSON holds it: a number or a string of one (PyTorch writes
/// str(int(time.time()))). Returns nullopt when it is neither or out of any sane range.
inline std::optional<std::pair<std::chrono::system_clock::time_point, bool>> parse_epoch_seconds(
    const nlohmann::ordered_json& v) {
    double seconds = 0;
    bool whole = true;
    if (v.is_number_integer()) {
        seconds = v.is_number_unsigned() ? static_cast<double>(v.get<std::uint64_t>())
                                         : static_cast<double>(v.get<std::int64_t>());
    } else if (v.is_number_float()) {
        seconds = v.get<double>();
        whole = std::floor(seconds) == seconds;
    } else if (v.is_string()) {
        const auto& s = v.get_ref<const std::string&>();
        if (s.empty() || s.size() > 32) {
            return std::nullopt;
        }
        // from_chars, not stod: independent of the C locale's decimal point. Only plain
        // decimal numbers: "1700000000" or "1700000000.25", no "inf", "0x10", "1e9".
        for (const char c : s) {
            if (!((c >= '0' && c <= '9') || c == '.' || c == '-')) {
                return std::nullopt;
            }
        }
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), seconds);
        if (ec != std::errc{} || end != s.data() + s.size()) {
            return std::nullopt;
        }
        whole = s.find('.') == std::string::npos || std::floor(seconds) == seconds;
    } else {
        return std::nullopt;
    }
    // 1970 .. 2200: anything else is garbage. The bound matters: system_clock counts int64
    // nanoseconds, which end in 2262 (found by the fuzzer: a stamp in 2280 overflowed).
    if (!std::isfinite(seconds) || seconds < 0 || seconds > max_error_file_timestamp) {
        return std::nullopt;
    }
    // A double holds about 0.2 us at today's epoch values: round to whole microseconds.
    const auto since_epoch = std::chrono::duration_cast<std::chrono::system_clock::duration>(
        std::chrono::round<std::chrono::microseconds>(std::chrono::duration<double>(seconds)));
    return std::pair{std::chrono::system_clock::time_point(since_epoch), whole};
}

inline std::optional<long long> parse_error_code(const nlohmann::ordered_json& v) {
    if (v.is_number_integer()) {
        if (v.is_number_unsigned()) {
            const auto u = v.get<std::uint64_t>();
            if (u > static_cast<std::uint64_t>(INT64_MAX)) {
                return std::nullopt;
            }
            return static_cast<long long>(u);
        }
        return static_cast<long long>(v.get<std::int64_t>());
    }
    return std::nullopt;
}

inline error_file_read malformed(std::string path, std::string problem) {
    error_file_read r;
    r.status = error_file_status::malformed;
    r.path = std::move(path);
    r.problem = valid_utf8(problem);
    return r;
}

inline error_file_read parse_error_document(nlohmann::ordered_json doc, std::string path) {
    using json = nlohmann::ordered_json;
    if (!doc.is_object()) {
        return malformed(std::move(path), detail::format("the top level is a JSON {}, not an object", doc.type_name()));
    }
    const auto message_it = doc.find("message");
    if (message_it == doc.end()) {
        return malformed(std::move(path), "no \"message\" key at the top level");
    }
    error_file_content c;
    const json& message = *message_it;
    if (message.is_string()) {
        c.format = error_file_format::flat;
        c.message = message.get<std::string>();
        if (const auto ts = doc.find("timestamp"); ts != doc.end() && !ts->is_null()) {
            const auto parsed = parse_epoch_seconds(*ts);
            if (!parsed) {
                return malformed(std::move(path), detail::format("\"timestamp\" {} is not a number of seconds since "
                                                                 "the epoch",
                                                                 valid_utf8(ts->dump().substr(0, 64))));
            }
            c.timestamp = parsed->first;
            c.timestamp_whole_seconds = parsed->second;
        }
    } else if (message.is_object()) {
        c.format = error_file_format::nested;
        if (const auto m = message.find("message"); m != message.end()) {
            if (!m->is_string()) {
                return malformed(std::move(path),
                                 detail::format("\"message.message\" is a JSON {}, not a string", m->type_name()));
            }
            c.message = m->get<std::string>();
        }
        if (const auto extra = message.find("extraInfo"); extra != message.end()) {
            if (!extra->is_object()) {
                return malformed(std::move(path), detail::format("\"message.extraInfo\" is a JSON {}, not an object",
                                                                 extra->type_name()));
            }
            if (const auto cs = extra->find("py_callstack"); cs != extra->end()) {
                if (!cs->is_string()) {
                    return malformed(std::move(path),
                                     detail::format("\"message.extraInfo.py_callstack\" is a JSON {}, not a "
                                                    "string",
                                                    cs->type_name()));
                }
                c.traceback = cs->get<std::string>();
            }
            if (const auto ts = extra->find("timestamp"); ts != extra->end() && !ts->is_null()) {
                const auto parsed = parse_epoch_seconds(*ts);
                if (!parsed) {
                    return malformed(std::move(path),
                                     detail::format("\"message.extraInfo.timestamp\" {} is not a number of "
                                                    "seconds since the epoch",
                                                    valid_utf8(ts->dump().substr(0, 64))));
                }
                c.timestamp = parsed->first;
                c.timestamp_whole_seconds = parsed->second;
            }
        }
        if (const auto code = message.find("errorCode"); code != message.end()) {
            c.error_code = parse_error_code(*code);
            if (!c.error_code) {
                return malformed(std::move(path), detail::format("\"message.errorCode\" {} is not an integer",
                                                                 valid_utf8(code->dump().substr(0, 64))));
            }
        }
    } else {
        return malformed(std::move(path), detail::format("\"message\" is a JSON {}, neither a string nor an object",
                                                         message.type_name()));
    }
    if (!c.error_code) {
        if (const auto code = doc.find("errorCode"); code != doc.end()) {
            c.error_code = parse_error_code(*code);
        }
    }
    c.document = std::make_shared<const nlohmann::ordered_json>(std::move(doc));
    error_file_read r;
    r.status = error_file_status::parsed;
    r.path = std::move(path);
    r.content = std::move(c);
    return r;
}

inline error_file_read parse_error_text(std::string_view bytes, std::string path) {
    using json = nlohmann::ordered_json;
    if (bytes.size() > max_error_file_bytes) {
        return malformed(std::move(path), detail::format("{} bytes, more than the {} bytes an error "
                                                         "file may have",
                                                         bytes.size(), max_error_file_bytes));
    }
    std::size_t first = 0;
    while (first < bytes.size() &&
           (bytes[first] == ' ' || bytes[first] == '\n' || bytes[first] == '\r' || bytes[first] == '\t')) {
        ++first;
    }
    if (first == bytes.size()) {
        return malformed(std::move(path), bytes.empty() ? "the file is empty" : "the file holds only white space");
    }
    if (json_depth(bytes, max_error_file_depth) > max_error_file_depth) {
        return malformed(std::move(path), detail::format("JSON nested deeper than {} levels", max_error_file_depth));
    }
    json doc;
    try {
        doc = json::parse(bytes);
    } catch (const json::exception& first_error) {
        // Retry once with Python's lone-surrogate escapes repaired (see repair_lone_surrogates).
        try {
            doc = json::parse(repair_lone_surrogates(bytes));
        } catch (const json::exception&) {
            return malformed(std::move(path),
                             detail::format("not valid JSON: {}", json_error_text(first_error.what())));
        }
    }
    return parse_error_document(std::move(doc), std::move(path));
}

}  // namespace detail::report

ELASTIC_DECL error_file_read parse_error_file(std::string_view bytes, std::string path) noexcept {
    try {
        return detail::report::parse_error_text(bytes, std::move(path));
    } catch (const std::exception& e) {
        try {
            return detail::report::malformed({}, detail::format("could not be read: {}", e.what()));
        } catch (...) {
        }
    } catch (...) {
    }
    error_file_read r;
    r.status = error_file_status::malformed;
    return r;
}

ELASTIC_DECL error_file_read read_error_file(const std::string& path) noexcept {
    try {
        error_file_read r;
        r.path = path;
        if (path.empty()) {
            return r;
        }
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
        if (fd < 0) {
            const int err = errno;
            if (err == ENOENT || err == ENOTDIR) {
                return r;
            }
            return detail::report::malformed(path, detail::format("cannot be opened: {}", std::strerror(err)));
        }
        struct closer {
            int fd;
            ~closer() { ::close(fd); }
        } close_on_exit{fd};
        struct stat st {};
        if (::fstat(fd, &st) != 0) {
            return detail::report::malformed(path, detail::format("cannot be examined: {}", std::strerror(errno)));
        }
        if (!S_ISREG(st.st_mode)) {
            return detail::report::malformed(path, "not a regular file");
        }
        if (static_cast<unsigned long long>(st.st_size) > max_error_file_bytes) {
            return detail::report::malformed(path, detail::format("{} bytes, more than the {} bytes an "
                                                                  "error file may have",
                                                                  st.st_size, max_error_file_bytes));
        }
        // Read to EOF rather than trust st_size: the file may still be growing.
        std::string bytes;
        char buffer[16384];
        for (;;) {
            const ssize_t n = ::read(fd, buffer, sizeof buffer);
            if (n < 0) {
                if (errno == EINTR) {
                    continue;
                }
                return detail::report::malformed(path, detail::format("cannot be read: {}", std::strerror(errno)));
            }
            if (n == 0) {
                break;
            }
            bytes.append(buffer, static_cast<std::size_t>(n));
            if (bytes.size() > max_error_file_bytes) {
                return detail::report::malformed(path, detail::format("more than the {} bytes an error "
                                                                      "file may have",
                                                                      max_error_file_bytes));
            }
        }
        return parse_error_file(bytes, path);
    } catch (...) {
        // Out of memory (the only thing left that throws). A short literal stays in the
        // string's own buffer, so building this result allocates nothing.
        error_file_read r;
        r.status = error_file_status::malformed;
        r.problem = "out of memory";
        return r;
    }
}

}  // namespace elastic::inline v0

#endif  // ELASTIC_DETAIL_BODIES
