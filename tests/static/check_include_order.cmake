# SPDX-License-Identifier: Apache-2.0
# Includes flow one way (docs/design.md, "Folders"): every megamoe header under INCLUDE_DIR may
# include only headers of a lower level, or of its own folder at its own level or lower. Levels:
#   0 core/, version.hpp
#   1 policy/                                    the rule catalogue and how policies are written
#   2 */tags.hpp                                 each slot's policies (light)
#   3 config/                                    concepts, assembly, values, rules, describe
#   4 parallel/
#   5 router/, precision/, expert/, memory/      siblings: none includes another (tags aside)
#   6 dispatch/
#   7 model/
#   8 optim/, io/
#   9 train/
#  10 megamoe.hpp
function(megamoe_level header out_level out_folder)
  get_filename_component(folder ${header} DIRECTORY)
  get_filename_component(name ${header} NAME)
  if(header MATCHES "^(core/|version.hpp$)")
    set(level 0)
  elseif(folder STREQUAL "policy")
    set(level 1)
  elseif(name STREQUAL "tags.hpp")
    set(level 2)
  elseif(folder STREQUAL "config")
    set(level 3)
  elseif(folder STREQUAL "parallel")
    set(level 4)
  elseif(folder MATCHES "^(router|precision|expert|memory)$")
    set(level 5)
  elseif(folder STREQUAL "dispatch")
    set(level 6)
  elseif(folder STREQUAL "model")
    set(level 7)
  elseif(folder MATCHES "^(optim|io)$")
    set(level 8)
  elseif(folder STREQUAL "train")
    set(level 9)
  elseif(header STREQUAL "megamoe.hpp")
    set(level 10)
  else()
    message(FATAL_ERROR "no level for ${header}: add its folder to check_include_order.cmake")
  endif()
  set(${out_level} ${level} PARENT_SCOPE)
  set(${out_folder} "${folder}" PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE headers RELATIVE ${INCLUDE_DIR}/megamoe ${INCLUDE_DIR}/megamoe/*.hpp
     ${INCLUDE_DIR}/megamoe/*.ipp)
set(failed)
set(edges 0)
foreach(header IN LISTS headers)
  megamoe_level(${header} level folder)
  file(STRINGS ${INCLUDE_DIR}/megamoe/${header} lines REGEX "^#include <megamoe/")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^#include <megamoe/([^>]+)>.*" "\\1" included "${line}")
    megamoe_level(${included} included_level included_folder)
    math(EXPR edges "${edges} + 1")
    if(included_level LESS level)
      continue()
    endif()
    if(included_folder STREQUAL folder AND NOT included_level GREATER level)
      continue()
    endif()
    list(APPEND failed "${header} (level ${level}) includes ${included} (level ${included_level})")
  endforeach()
endforeach()
if(failed)
  list(JOIN failed "\n  " text)
  message(FATAL_ERROR "includes that run back up:\n  ${text}")
endif()
list(LENGTH headers count)
message(STATUS "${count} headers, ${edges} megamoe includes: every one flows down")
