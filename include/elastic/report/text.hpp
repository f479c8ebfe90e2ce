// SPDX-License-Identifier: MIT
// Text hygiene for what workers write: UTF-8 repair and display width, so reports and JSON never
// carry invalid bytes.
#pragma once

#include "elastic/detail/config.hpp"

#include <cstddef>
#include <string>
#include <string_view>

namespace elastic::inline v0::detail::report {

/// Length of the well-formed UTF-8 sequence at the start of `s` (1..4), or 0 when the first byte
/// does not begin one (stray continuation, overlong form, surrogate, past U+10FFFF, cut short).
ELASTIC_DECL std::size_t utf8_sequence_length(std::string_view s) noexcept;

/// `s` with every byte that is not part of well-formed UTF-8 replaced by U+FFFD (what Python's
/// errors="replace" does), so the text can go into JSON and onto a terminal unchanged otherwise.
ELASTIC_DECL std::string valid_utf8(std::string_view s);

/// The length of `s` in code points (Python's len() of the decoded text, which is how torchrun
/// measures the summary's width). Bytes outside well-formed UTF-8 count one each.
ELASTIC_DECL std::size_t code_points(std::string_view s) noexcept;

/// The longest prefix of `s` of at most `max_bytes` bytes that does not end inside a UTF-8
/// sequence (so truncating never manufactures an invalid byte).
ELASTIC_DECL std::string_view utf8_prefix(std::string_view s, std::size_t max_bytes) noexcept;

/// `s` without a UTF-8 sequence cut short at its end (what remains when a byte stream is cut at
/// an arbitrary byte); anything else, valid or not, is left alone.
ELASTIC_DECL std::string_view utf8_incomplete_tail_trimmed(std::string_view s) noexcept;

}  // namespace elastic::inline v0::detail::report

#if ELASTIC_DETAIL_BODIES

namespace elastic::inline v0::detail::report {

ELASTIC_DECL std::size_t utf8_sequence_length(std::string_view s) noexcept {
    if (s.empty()) {
        return 0;
    }
    const auto b0 = static_cast<unsigned char>(s[0]);
    if (b0 < 0x80) {
        return 1;
    }
    std::size_t n = 0;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;
    // Ranges of the second byte from the Unicode standard, table 3-7.
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        n = 2;
    } else if (b0 == 0xE0) {
        n = 3;
        lo = 0xA0;
    } else if (b0 >= 0xE1 && b0 <= 0xEC) {
        n = 3;
    } else if (b0 == 0xED) {
        n = 3;
        hi = 0x9F;
    } else if (b0 >= 0xEE && b0 <= 0xEF) {
        n = 3;
    } else if (b0 == 0xF0) {
        n = 4;
        lo = 0x90;
    } else if (b0 >= 0xF1 && b0 <= 0xF3) {
        n = 4;
    } else if (b0 == 0xF4) {
        n = 4;
        hi = 0x8F;
    } else {
        return 0;
    }
    if (s.size() < n) {
        return 0;
    }
    const auto b1 = static_cast<unsigned char>(s[1]);
    if (b1 < lo || b1 > hi) {
        return 0;
    }
    for (std::size_t i = 2; i < n; ++i) {
        const auto b = static_cast<unsigned char>(s[i]);
        if (b < 0x80 || b > 0xBF) {
            return 0;
        }
    }
    return n;
}

ELASTIC_DECL std::string valid_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    while (!s.empty()) {
        const std::size_t n = utf8_sequence_length(s);
        if (n == 0) {
            out += "\xEF\xBF\xBD";
            s.remove_prefix(1);
        } else {
            out.append(s.data(), n);
            s.remove_prefix(n);
        }
    }
    return out;
}

ELASTIC_DECL std::size_t code_points(std::string_view s) noexcept {
    std::size_t count = 0;
    while (!s.empty()) {
        const std::size_t n = utf8_sequence_length(s);
        s.remove_prefix(n == 0 ? 1 : n);
        ++count;
    }
    return count;
}

ELASTIC_DECL std::string_view utf8_prefix(std::string_view s, std::size_t max_bytes) noexcept {
    if (s.size() <= max_bytes) {
        return s;
    }
    std::size_t end = max_bytes;
    // Step back over continuation bytes to the start of the sequence that straddles the cut.
    std::size_t back = 0;
    while (end > 0 && back < 3 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) {
        --end;
        ++back;
    }
    return s.substr(0, end);
}

ELASTIC_DECL std::string_view utf8_incomplete_tail_trimmed(std::string_view s) noexcept {
    for (std::size_t i = 1; i <= 3 && i <= s.size(); ++i) {
        const auto b = static_cast<unsigned char>(s[s.size() - i]);
        if ((b & 0xC0) == 0x80) {
            continue;  // a continuation byte: keep looking for the lead byte
        }
        std::size_t expected = 1;
        if ((b & 0xE0) == 0xC0) {
            expected = 2;
        } else if ((b & 0xF0) == 0xE0) {
            expected = 3;
        } else if ((b & 0xF8) == 0xF0) {
            expected = 4;
        }
        return expected > i ? s.substr(0, s.size() - i) : s;
    }
    return s;
}

}  // namespace elastic::inline v0::detail::report

#endif  // ELASTIC_DETAIL_BODIES
