// SPDX-License-Identifier: MIT
// The store layer's exceptions: store_error, store_timeout and store_auth_error.
#pragma once

#include "elastic/detail/config.hpp"
#include "elastic/error.hpp"

#include <string>
#include <system_error>
#include <utility>

namespace elastic::inline v0 {

/// A store operation failed: bad input (ADD on a non-numeric value, mismatched sizes), a broken
/// connection, a server that cannot bind. The message names the key or address and the rule.
class store_error : public error {
public:
    using error::error;
};

/// A server cannot listen where it was told; `code()` says why, as Asio reported it
/// (`asio::error::address_in_use`: another program holds the port; `access_denied`: a port below
/// 1024 without the privilege; ...).
class store_listen_error : public store_error {
public:
    store_listen_error(const std::string& message, std::error_code code) : store_error(message), code_(code) {}
    [[nodiscard]] std::error_code code() const noexcept { return code_; }

private:
    std::error_code code_;
};

/// A `wait` (or a `get`, which waits for its key) did not see its keys before the deadline.
class store_timeout : public store_error {
public:
    using store_error::store_error;
};

/// The store and this client do not share a secret: the server refused the client's proof, or
/// the server could not prove it knows the client's secret (it has another, none, or it is not
/// the job's store). Retrying does not help; the message says which secret option to fix.
class store_auth_error : public store_error {
public:
    using store_error::store_error;
};

}  // namespace elastic::inline v0
