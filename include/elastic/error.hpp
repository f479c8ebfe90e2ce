// SPDX-License-Identifier: MIT
// elastic::error, the base of every exception the library throws.
#pragma once

#include "elastic/detail/config.hpp"

#include <stdexcept>
#include <string>

namespace elastic::inline v0 {

/// Base of every exception elastic throws. Each layer derives its own (env_error, store_error,
/// process_error, ...); the message always names the thing, the value and the rule or remedy.
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

}  // namespace elastic::inline v0
