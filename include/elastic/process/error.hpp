// SPDX-License-Identifier: MIT
// The process layer's exceptions: process_error, and spawn_error with the errno of a failed spawn.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/error.hpp"

#include <string>

namespace elastic::inline v0 {

/// A failure of the process layer (a system call the agent needed failed, a misuse of a child).
class process_error : public error {
public:
    using error::error;
};

/// A program could not be started. `code()` is the errno of the step that failed (for example
/// ENOENT or EACCES from execve, reported by the child through a close-on-exec pipe), so the
/// caller sees why, not a child that exits 127.
class spawn_error : public process_error {
public:
    spawn_error(const std::string& message, int code, bool program_fault = false)
        : process_error(message), code_(code), program_fault_(program_fault) {}

    /// The errno value of the failed step.
    [[nodiscard]] int code() const noexcept { return code_; }

    /// The program itself cannot run: not found, not executable, neither a binary nor a #!
    /// script, a #! interpreter that does not exist. The user's to fix, not the machine's
    /// (false for a failure of fork, descriptors, memory or cgroups).
    [[nodiscard]] bool program_fault() const noexcept { return program_fault_; }

private:
    int code_;
    bool program_fault_;
};

}  // namespace elastic::inline v0
