// elastic 0.1.0 — single-header distribution.
// GENERATED FILE — DO NOT EDIT. Made by tools/amalgamate.py from include/elastic.hpp;
// edit the headers under include/ and run the tool again.
// Needs C++20, standalone Asio, fmt and nlohmann/json on the include path.
#pragma once
#define ELASTIC_AMALGAMATED 1
// ---- begin elastic.hpp ----
// elastic — a header-only C++20 launcher framework: rendezvous, worker supervision, fault
// tolerance and elasticity for native distributed trainers. This umbrella header includes every
// public header; single_include/elastic.hpp is generated from it by tools/amalgamate.py.

// ---- begin elastic/detail/config.hpp ----
// Library version, feature macros and the configuration every elastic header starts from.

#define ELASTIC_VERSION_MAJOR 0
#define ELASTIC_VERSION_MINOR 1
#define ELASTIC_VERSION_PATCH 0
#define ELASTIC_VERSION_STRING "0.1.0"

// Standalone Asio, not Boost.Asio. clang 14 does not announce coroutine support to Asio 1.22, so
// asio::awaitable would be missing; the CMake target sets both too, this covers users who vendor
// single_include/elastic.hpp without our CMake. It must come before the first Asio include.
#ifndef ASIO_STANDALONE
#define ASIO_STANDALONE 1
#endif
#if defined(__clang__) && !defined(ASIO_HAS_CO_AWAIT)
#define ASIO_HAS_CO_AWAIT 1
#endif

#if !defined(__cplusplus) || __cplusplus < 202002L
#error "elastic needs C++20 (-std=c++20)"
#endif

#if !defined(__linux__)
#error "elastic supports Linux only (it relies on pidfd, prctl and /proc)"
#endif

namespace elastic::inline v0 {

/// The library's version, as "major.minor.patch".
inline constexpr const char* version_string = ELASTIC_VERSION_STRING;

/// The library's version as numbers.
struct version_info {
    int major;
    int minor;
    int patch;
};
inline constexpr version_info version{ELASTIC_VERSION_MAJOR, ELASTIC_VERSION_MINOR,
                                      ELASTIC_VERSION_PATCH};

}  // namespace elastic::inline v0
// ---- end elastic/detail/config.hpp ----
// ---- begin elastic/error.hpp ----
// elastic::error, the base of every exception the library throws.


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
// ---- end elastic/error.hpp ----
// ---- begin elastic/version.hpp ----
// The library's version: elastic::version and elastic::version_string.

// ---- end elastic/version.hpp ----

// Worker side.
// ---- begin elastic/env.hpp ----
// elastic::env(): the worker's typed, validated view of the environment contract.

// ---- end elastic/env.hpp ----
// ---- begin elastic/record.hpp ----
// elastic::record(main): torchelastic error files for uncaught exceptions and fatal signals.

// ---- end elastic/record.hpp ----

// Layers (each of these includes the public headers of its folder).
// ---- begin elastic/store.hpp ----
// The store layer — the store: the store concept, the in-memory and prefix models, the TCP server (PyTorch's TCPStore protocol).

// ---- end elastic/store.hpp ----
// ---- begin elastic/process.hpp ----
// The process layer — worker processes: spawn, await exits through pidfds, signal and stop groups.

// ---- end elastic/process.hpp ----
// ---- begin elastic/launch.hpp ----
// The launch layer — launch configuration: torchrun's command line and PET_* variables.

// ---- end elastic/launch.hpp ----
// ---- end elastic.hpp ----
