// SPDX-License-Identifier: MIT
// detail::format: fmt::format for elastic's own messages, with the compile-time check of their
// format strings where elastic's own build compiles them and without it in a user's file.
#pragma once

#include "elastic/detail/config.hpp"

#include <fmt/format.h>

#include <string>

// fmt checks every literal format string at compile time (a consteval parse per call). Those
// checks of elastic's 800-odd messages cost about a sixth of a file that includes the single
// header in separate compilation mode, in every file of every user, and find nothing there: the
// strings are elastic's, and elastic's own build (the CMake option ELASTIC_CHECK_FORMATS, on
// with its tests) checks each of them, as fmt::format does, in every flavour. A user's file
// formats them at run time with the same fmt code; an argument fmt cannot format is still a
// compile error there. docs/building.md, "Compile time".
namespace elastic::inline v0::detail {

#if defined(ELASTIC_CHECK_FORMATS)
template <class... Args>
[[nodiscard]] std::string format(fmt::format_string<Args...> text, Args&&... args) {
    return fmt::vformat(text, fmt::make_format_args(args...));
}
#else
template <class... Args>
[[nodiscard]] std::string format(fmt::string_view text, Args&&... args) {
    return fmt::vformat(text, fmt::make_format_args(args...));
}
#endif

}  // namespace elastic::inline v0::detail
