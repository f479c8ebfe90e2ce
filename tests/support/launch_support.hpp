// Test helpers for the launch layer: private temporary directories with real files (programs,
// scripts, fake nvidia-smi), and one-call wrappers around parse_launch_config.
#pragma once

#include "test_files.hpp"

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

using test_files::temp_dir;

using test_files::read_file;

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
