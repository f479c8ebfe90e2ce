// SPDX-License-Identifier: MIT
// Small text helpers for the parsers of every layer: trim, lower, split, a whole integer,
// `name=value` as error messages show it, and a duration in seconds.
#pragma once

#include "elastic/detail/config.hpp"

#include "elastic/detail/format.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace elastic::inline v0 {

namespace detail {

[[nodiscard]] inline std::string_view trim(std::string_view text) noexcept {
    const auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
    while (!text.empty() && is_space(text.front())) {
        text.remove_prefix(1);
    }
    while (!text.empty() && is_space(text.back())) {
        text.remove_suffix(1);
    }
    return text;
}

[[nodiscard]] inline std::string lower(std::string_view text) {
    std::string out{text};
    std::transform(out.begin(), out.end(), out.begin(),
                   [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
    return out;
}

/// `name=value` as error messages show it; a value that is empty or has spaces is quoted.
[[nodiscard]] inline std::string show(std::string_view name, std::string_view value) {
    const bool quote = value.empty() || value.find_first_of(" \t\n'") != std::string_view::npos;
    return quote ? detail::format("{}='{}'", name, value) : detail::format("{}={}", name, value);
}

/// Splits on `sep`; "" gives one empty piece.
[[nodiscard]] inline std::vector<std::string_view> split(std::string_view text, char sep) {
    std::vector<std::string_view> pieces;
    for (;;) {
        const auto at = text.find(sep);
        pieces.push_back(text.substr(0, at));
        if (at == std::string_view::npos) {
            return pieces;
        }
        text.remove_prefix(at + 1);
    }
}

/// A duration as a number of seconds, as the options take it: `30`, `0.5`.
[[nodiscard]] inline std::string seconds_text(std::chrono::milliseconds d) {
    return d.count() % 1000 == 0 ? detail::format("{}", d.count() / 1000)
                                 : detail::format("{}", static_cast<double>(d.count()) / 1000.0);
}

/// A whole decimal integer (surrounding spaces allowed, as Python's int()), or nothing.
[[nodiscard]] inline std::optional<long long> to_integer(std::string_view text) noexcept {
    text = trim(text);
    if (!text.empty() && text.front() == '+') {
        text.remove_prefix(1);
    }
    long long value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) {
        return std::nullopt;
    }
    return value;
}

}  // namespace detail

}  // namespace elastic::inline v0
