# SPDX-License-Identifier: Apache-2.0
# Configures, builds and runs one consumer project of megamoe from scratch in WORK_DIR.
#   MODE subdir:  the consumer calls add_subdirectory(SOURCE_DIR)
#   MODE install: `cmake --install BINARY_DIR --prefix WORK_DIR/prefix`, then find_package(megamoe)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "$ ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
# Release at -O1: the test checks that the package configures, builds, links and runs, not its
# speed, and -O1 builds the compiled-once units in two thirds of -O3's time.
set(configure ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" -DCMAKE_CXX_COMPILER=${CXX})
if(MODE STREQUAL "subdir")
  run(${configure} -DMEGAMOE_SOURCE_DIR=${SOURCE_DIR})
elseif(MODE STREQUAL "install")
  run(${CMAKE_COMMAND} --install ${BINARY_DIR} --prefix ${WORK_DIR}/prefix)
  run(${configure} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
      -DMY_MODEL_SOURCE=${SOURCE_DIR}/examples/my_model.cpp)
else()
  message(FATAL_ERROR "MODE must be subdir or install")
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build -j 2)
run(${WORK_DIR}/build/consumer)
if(NOT last_output MATCHES "consumer ok")
  message(FATAL_ERROR "the consumer did not report success")
endif()
if(MODE STREQUAL "install")
  # The installed tool runs from the prefix and prints the reference's groups.
  run(${WORK_DIR}/prefix/bin/megamoe-layout --world 8 --tp 2 --etp 1 --ep 4 --json)
  if(NOT last_output MATCHES "\"ep\":\\[\\[0,1,2,3\\],\\[4,5,6,7\\]\\]")
    message(FATAL_ERROR "installed megamoe-layout printed unexpected groups")
  endif()
  foreach(program megamoe-train megamoe-checkpoint megamoe-layout)
    run(${WORK_DIR}/prefix/bin/${program} --version)
    if(NOT last_output MATCHES "^${program} \\(megamoe [0-9]+\\.[0-9]+\\.[0-9]+\\)")
      message(FATAL_ERROR "installed ${program} --version printed '${last_output}'")
    endif()
  endforeach()
  # The user's model, built against the installed package, trains on the shipped sample.
  run(${WORK_DIR}/build/my-model --data ${SOURCE_DIR}/tests/data/corpus_sample.txt --steps 2
      --seq-len 32 --micro-batch 4 --eval-iters 1 --out ${WORK_DIR}/my-model-out)
  if(NOT last_output MATCHES "{\"final\":{\"steps\":2,\"precision\":\"fp8_current\"")
    message(FATAL_ERROR "the installed package's my-model did not end with its final line")
  endif()
endif()
