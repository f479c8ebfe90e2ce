// SPDX-License-Identifier: MIT
// This host's name: host_name() as gethostname() gives it (no DNS), host_fqdn() fully qualified
// as Python's socket.getfqdn() finds it (may ask DNS).
#pragma once

#include "elastic/detail/config.hpp"

#include <string>

#include <netdb.h>
#include <unistd.h>

namespace elastic::inline v0 {

/// This host's name as gethostname() gives it, without asking DNS; "localhost" when it fails.
/// What the event log's `hostname` shows, and this node's name when every node is on this machine.
[[nodiscard]] inline std::string host_name() {
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
    return name;
}

/// This host's fully qualified name, as Python's socket.getfqdn() finds it (the canonical name
/// from the resolver when it has a dot, else host_name()). It may ask DNS: call it once, at agent
/// start, not when a failure arrives.
[[nodiscard]] inline std::string host_fqdn() {
    std::string host = host_name();
    addrinfo hints{};
    hints.ai_flags = AI_CANONNAME;
    hints.ai_family = AF_UNSPEC;
    addrinfo* result = nullptr;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &result) == 0 && result != nullptr) {
        std::string canonical = result->ai_canonname ? result->ai_canonname : "";
        ::freeaddrinfo(result);
        if (canonical.find('.') != std::string::npos) return canonical;
    }
    return host;
}

}  // namespace elastic::inline v0
