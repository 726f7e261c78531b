// SPDX-License-Identifier: Apache-2.0
// megamoe/version.hpp — the library's version (CMake reads it from here).
#pragma once

#include <string>
#include <string_view>

#define MEGAMOE_VERSION_MAJOR 0
#define MEGAMOE_VERSION_MINOR 1
#define MEGAMOE_VERSION_PATCH 0
#define MEGAMOE_VERSION_TEXT_(major, minor, patch) #major "." #minor "." #patch
#define MEGAMOE_VERSION_TEXT(major, minor, patch) MEGAMOE_VERSION_TEXT_(major, minor, patch)

namespace megamoe {
inline constexpr int version_major = MEGAMOE_VERSION_MAJOR;
inline constexpr int version_minor = MEGAMOE_VERSION_MINOR;
inline constexpr int version_patch = MEGAMOE_VERSION_PATCH;
/// "major.minor.patch", as --version prints it.
inline constexpr char const* version_text =
    MEGAMOE_VERSION_TEXT(MEGAMOE_VERSION_MAJOR, MEGAMOE_VERSION_MINOR, MEGAMOE_VERSION_PATCH);
/// The line every megamoe program prints for --version: "program (megamoe major.minor.patch)".
inline std::string version_line(std::string_view program) {
  return std::string(program) + " (megamoe " + version_text + ")";
}
}  // namespace megamoe
