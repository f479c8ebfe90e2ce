// Files for tests: a private temporary directory removed at scope exit, and whole-file reads.
// Shared by the layers' support headers, so each test helper is written once.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <string_view>

namespace test_files {

/// A directory of its own (mkdtemp) under $TMPDIR or /tmp, removed with everything in it at
/// scope exit. Every test case gets its own, so cases run side by side without sharing names.
class temp_dir {
public:
    explicit temp_dir(std::string_view tag = "test") {
        const char* base = std::getenv("TMPDIR");
        std::string pattern = std::string(base != nullptr && base[0] != '\0' ? base : "/tmp") + "/elastic-" +
                              std::string(tag) + "-XXXXXX";
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
    [[nodiscard]] std::string operator/(std::string_view name) const { return path_ + "/" + std::string(name); }

    /// Writes `name` with `content` and permission bits `mode`; returns its path.
    std::string write(std::string_view name, std::string_view content, ::mode_t mode = 0644) const {
        const auto path = *this / name;
        {
            std::ofstream out(path, std::ios::binary | std::ios::trunc);
            out.write(content.data(), static_cast<std::streamsize>(content.size()));
            if (!out) throw std::runtime_error("cannot write " + path);
        }
        if (::chmod(path.c_str(), mode) != 0) {
            throw std::runtime_error("chmod " + path + ": " + std::strerror(errno));
        }
        return path;
    }

private:
    std::string path_;
};

/// The whole file, bytes as they are; empty when it cannot be opened (tests that care whether a
/// file exists check that first).
inline std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace test_files
