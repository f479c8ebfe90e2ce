// Test helpers for the launch layer: private temporary directories with real files (programs,
// scripts, fake nvidia-smi), and one-call wrappers around parse_launch_config.
#pragma once

#include "elastic/launch.hpp"

#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace launch_support {

/// A directory of its own under $TMPDIR (or /tmp), removed with everything in it at scope exit.
class temp_dir {
public:
    temp_dir() {
        const char* base = std::getenv("TMPDIR");
        std::string pattern = std::string(base != nullptr && base[0] != '\0' ? base : "/tmp") +
                              "/elastic-launch-test-XXXXXX";
        if (::mkdtemp(pattern.data()) == nullptr) {
            throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
        }
        path_ = pattern;
    }
    ~temp_dir() {
        std::error_code ignored;
        std::filesystem::remove_all(path_, ignored);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;

    [[nodiscard]] const std::string& path() const { return path_; }
    [[nodiscard]] std::string operator/(const std::string& name) const { return path_ + "/" + name; }

    /// Writes `name` with `content` and permission bits `mode`; returns its path.
    std::string write(const std::string& name, const std::string& content, ::mode_t mode) const {
        const auto path = *this / name;
        {
            std::ofstream out(path, std::ios::binary | std::ios::trunc);
            out << content;
        }
        if (::chmod(path.c_str(), mode) != 0) {
            throw std::runtime_error("chmod " + path + ": " + std::strerror(errno));
        }
        return path;
    }

private:
    std::string path_;
};

inline std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

/// A shell script that does nothing, executable.
inline std::string write_program(const temp_dir& dir, const std::string& name) {
    return dir.write(name, "#!/bin/sh\nexit 0\n", 0755);
}

/// Parses and expects a configuration (fails the test case on a usage error or help).
inline elastic::launch_config parse(const std::vector<std::string>& args, const elastic::environment& env) {
    try {
        auto result = elastic::parse_launch_config(args, env);
        auto* config = std::get_if<elastic::launch_config>(&result);
        REQUIRE_MESSAGE(config != nullptr, "expected a configuration, got a help text");
        return std::move(*config);
    } catch (const elastic::usage_error& e) {
        FAIL("unexpected usage error: " << std::string{e.what()});
        throw;
    }
}

/// Parses and expects a usage error; returns its message.
inline std::string usage_error_of(const std::vector<std::string>& args, const elastic::environment& env) {
    try {
        (void)elastic::parse_launch_config(args, env);
    } catch (const elastic::usage_error& e) {
        CHECK(e.exit_code() == 2);
        const std::string message = e.what();
        CHECK_MESSAGE(message.find('\n') == std::string::npos, "usage errors are one line: " << message);
        return message;
    }
    FAIL("expected a usage error");
    return {};
}

}  // namespace launch_support
