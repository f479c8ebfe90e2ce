// SPDX-License-Identifier: MIT
// Internals: random bits for seeds, unique names and tokens.
#pragma once

#include "elastic/detail/config.hpp"

#include <cstdint>
#include <random>

#include <sys/random.h>

namespace elastic::inline v0::detail {

/// 64 random bits from the kernel (getrandom(2), which never blocks once its pool is ready at
/// boot). std::random_device where that fails (a seccomp filter that forbids the call): it costs
/// about 11 µs to make on a virtual machine, where its probe of the CPU traps to the hypervisor,
/// against well under 1 µs for the system call — and an agent makes several at start.
[[nodiscard]] inline std::uint64_t random_u64() {
    std::uint64_t value = 0;
    if (::getrandom(&value, sizeof value, GRND_NONBLOCK) == static_cast<ssize_t>(sizeof value)) return value;
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) | device();
}

}  // namespace elastic::inline v0::detail
