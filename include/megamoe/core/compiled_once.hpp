// SPDX-License-Identifier: Apache-2.0
// megamoe/core/compiled_once.hpp — where the code that depends on no configuration is compiled.
//
// megamoe's configuration-independent functions (the command line, checkpoint and safetensors
// files, process groups, describe, the corpus, metrics) are declared in their headers with
// MEGAMOE_DECL and defined in a `.ipp` file beside each header. Two ways to build them:
//   header-only (the default): each header includes its `.ipp`, MEGAMOE_DECL is `inline`, and
//     every translation unit compiles what it uses;
//   MEGAMOE_SEPARATE_COMPILATION (what the CMake target megamoe::megamoe sets): the headers only
//     declare them, and one translation unit per program, <megamoe/compiled_once.cpp>, compiles
//     them all, so a user's configuration unit compiles only what its types decide.
// Modules typed only by their element type (norms, attention, the output layer, the experts'
// FFN, the all-to-all dispatcher) go further under MEGAMOE_SEPARATE_COMPILATION: their headers
// declare the float and double instances `extern template`, and a second unit,
// <megamoe/compiled_once_modules.cpp>, instantiates them once.
// megamoe::headers is the header-only target.
#pragma once

#if defined(MEGAMOE_SEPARATE_COMPILATION)
#define MEGAMOE_HEADER_ONLY 0
#define MEGAMOE_DECL
#else
#define MEGAMOE_HEADER_ONLY 1
#define MEGAMOE_DECL inline
#endif
