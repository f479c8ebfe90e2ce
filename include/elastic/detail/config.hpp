// SPDX-License-Identifier: MIT
// Library version, feature macros and the configuration every elastic header starts from.
#pragma once

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

// ELASTIC_SEPARATE_COMPILATION (docs/building.md): defined in every file of a program, it leaves
// the heavy non-template definitions (elastic::run's agent, the command-line parser,
// elastic::dist::group's members) out of the headers; one file compiles them by defining
// ELASTIC_IMPL_SOURCE and including elastic/impl/src.hpp (or the single header). ELASTIC_DECL
// marks the functions concerned: inline when header-only, ordinary functions of that one file
// otherwise.
#if defined(ELASTIC_SEPARATE_COMPILATION)
#define ELASTIC_DECL
#else
#define ELASTIC_DECL inline
#endif
// ELASTIC_DETAIL_BODIES: 1 where those definitions are compiled (every file header-only, the one
// file of ELASTIC_IMPL_SOURCE otherwise); the headers guard them, and what only they include,
// with it.
#if !defined(ELASTIC_SEPARATE_COMPILATION) || defined(ELASTIC_IMPL_SOURCE)
#define ELASTIC_DETAIL_BODIES 1
#else
#define ELASTIC_DETAIL_BODIES 0
#endif
#if defined(ELASTIC_IMPL_SOURCE)
#define ELASTIC_DETAIL_IMPL_SOURCE_SEEN 1  // the definitions were not skipped (elastic/impl/src.hpp checks)
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
inline constexpr version_info version{ELASTIC_VERSION_MAJOR, ELASTIC_VERSION_MINOR, ELASTIC_VERSION_PATCH};

}  // namespace elastic::inline v0
