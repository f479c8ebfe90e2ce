// SPDX-License-Identifier: MIT
// elastic::usage_error (bad input from a user: exit status 2) and the environment map that the
// layers which read variables take instead of the process environment.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/error.hpp"

#include <functional>
#include <map>
#include <string>
#include <string_view>

extern "C" char** environ;  // POSIX: declared by <unistd.h> only with _GNU_SOURCE; declare it ourselves.

namespace elastic::inline v0 {

/// Bad input to a launcher: an unknown option, a malformed or out-of-range value, a program that
/// cannot run. The message is one line naming the option (or variable), the value and the rule;
/// a launcher prints it and exits with exit_code() without starting any worker.
class usage_error : public error {
public:
    /// `message` is kept on one line: control characters (a newline in a value read from the
    /// environment, say) are written as escapes such as `\n` and `\x1b`.
    explicit usage_error(std::string_view message) : error(one_line(message)) {}

    /// The exit status for this error: 2, as argparse (and so torchrun) uses for usage errors.
    [[nodiscard]] static constexpr int exit_code() noexcept { return 2; }

private:
    static std::string one_line(std::string_view message) {
        static constexpr char hex[] = "0123456789abcdef";
        std::string out;
        out.reserve(message.size());
        for (const char c : message) {
            const auto byte = static_cast<unsigned char>(c);
            if (c == '\n') {
                out += "\\n";
            } else if (c == '\t') {
                out += "\\t";
            } else if (c == '\r') {
                out += "\\r";
            } else if (byte < 0x20 || byte == 0x7f) {
                out += "\\x";
                out += hex[byte >> 4];
                out += hex[byte & 0xf];
            } else {
                out += c;
            }
        }
        return out;
    }
};

/// A set of environment variables, name to value. The launch layer (and the rendezvous, for its
/// secret) reads its variables (PET_*,
/// PYTHON_EXEC, PATH, CUDA_VISIBLE_DEVICES, ...) from one of these rather than from the process
/// environment, so a custom launcher or a test controls exactly what is seen.
using environment = std::map<std::string, std::string, std::less<>>;

/// The process environment (`environ`) as an environment map. The first definition of a name
/// wins, as getenv(3) does.
[[nodiscard]] inline environment current_environment() {
    environment env;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
        const std::string_view text{*entry};
        const auto equals = text.find('=');
        if (equals == std::string_view::npos || equals == 0) {
            continue;
        }
        env.emplace(std::string{text.substr(0, equals)}, std::string{text.substr(equals + 1)});
    }
    return env;
}

namespace detail {

/// The value of `name` in `env`, or nullptr.
[[nodiscard]] inline const std::string* find_variable(const environment& env, std::string_view name) {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : &it->second;
}

}  // namespace detail
}  // namespace elastic::inline v0
