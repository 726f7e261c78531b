# SPDX-License-Identifier: Apache-2.0
# Helpers for megamoe's own tests (not installed).

# How MPI tests run here: as root if need be, oversubscribed, shared memory only (docs/PLATFORM.md).
set(MEGAMOE_MPI_TEST_ENVIRONMENT
  OMPI_ALLOW_RUN_AS_ROOT=1
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_rmaps_base_oversubscribe=1
  OMPI_MCA_pml=ob1
  OMPI_MCA_btl=self,vader
  OMPI_MCA_btl_vader_single_copy_mechanism=none)

# Builds TARGET as a ctest test. Builds share one lock: they run in the same build tree.
function(megamoe_add_build_test name)
  cmake_parse_arguments(ARG "" "TARGET" "LABELS" ${ARGN})
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target ${ARG_TARGET} --config $<CONFIG>)
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" RESOURCE_LOCK megamoe_build
    TIMEOUT 600)
endfunction()

# megamoe_add_mpi_test(name RANKS n COMMAND program args... [ENVIRONMENT VAR=value...])
function(megamoe_add_mpi_test name)
  cmake_parse_arguments(ARG "" "RANKS" "COMMAND;ENVIRONMENT" ${ARGN})
  add_test(NAME mpi.${name}
    COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe ${MPIEXEC_NUMPROC_FLAG} ${ARG_RANKS}
            ${MPIEXEC_PREFLAGS} ${ARG_COMMAND} ${MPIEXEC_POSTFLAGS})
  set_tests_properties(mpi.${name} PROPERTIES LABELS mpi PROCESSORS ${ARG_RANKS} TIMEOUT 120
    ENVIRONMENT "${MEGAMOE_MPI_TEST_ENVIRONMENT};${ARG_ENVIRONMENT}")
endfunction()

# megamoe_add_mpi_failure_test(name RANKS n EXPECT regex COMMAND program args... [PRINTING_RANKS r...]
#                              [WITHIN seconds])
# Passes when the job exits non-zero and every rank (or each of PRINTING_RANKS) printed one error line
# matching EXPECT (and, with WITHIN, the job ended within that many seconds).
function(megamoe_add_mpi_failure_test name)
  cmake_parse_arguments(ARG "" "RANKS;EXPECT;WITHIN" "COMMAND;ENVIRONMENT;PRINTING_RANKS" ${ARGN})
  list(JOIN ARG_COMMAND "|" command)
  set(printing)
  if(ARG_WITHIN)
    list(APPEND printing "-DWITHIN=${ARG_WITHIN}")
  endif()
  if(DEFINED ARG_PRINTING_RANKS)
    list(JOIN ARG_PRINTING_RANKS "|" joined)
    list(APPEND printing "-DPRINTING_RANKS=${joined}")
  endif()
  add_test(NAME mpi.${name}
    COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} -DRANKS=${ARG_RANKS}
            "-DEXPECT=${ARG_EXPECT}" "-DCOMMAND=${command}" ${printing}
            -P ${PROJECT_SOURCE_DIR}/tests/mpi/expect_error_on_every_rank.cmake)
  set_tests_properties(mpi.${name} PROPERTIES LABELS mpi PROCESSORS ${ARG_RANKS} TIMEOUT 120
    ENVIRONMENT "${MEGAMOE_MPI_TEST_ENVIRONMENT};${ARG_ENVIRONMENT}")
endfunction()

# megamoe_add_run_test(name EXIT zero|nonzero EXPECT regex COMMAND program args... [LABELS ...])
# Passes when the program's exit status and its output are both as expected.
function(megamoe_add_run_test name)
  cmake_parse_arguments(ARG "" "EXIT;EXPECT" "COMMAND;LABELS" ${ARGN})
  list(JOIN ARG_COMMAND "|" command)
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} -DEXIT=${ARG_EXIT} "-DEXPECT=${ARG_EXPECT}" "-DCOMMAND=${command}"
            -P ${PROJECT_SOURCE_DIR}/tests/run_and_match.cmake)
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT 120)
endfunction()

# One generated translation unit per public header under include_dir, each including its header
# twice, compiled at -O0 into the OBJECT library `target`.
function(megamoe_add_header_tests target include_dir)
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS RELATIVE ${include_dir} ${include_dir}/megamoe/*.hpp)
  set(sources)
  foreach(header IN LISTS headers)
    string(REPLACE "/" "__" stem ${header})
    string(REPLACE ".hpp" ".cpp" stem ${stem})
    set(source ${CMAKE_CURRENT_BINARY_DIR}/header_tests/${stem})
    file(CONFIGURE OUTPUT ${source} CONTENT
      "// Generated: <${header}> compiles on its own, and its include guard works.\n#include <${header}>\n#include <${header}>\n")
    list(APPEND sources ${source})
  endforeach()
  # Linked into one program in header-only mode (megamoe::headers): a definition that is not
  # inline where every unit includes it fails the link.
  set(main ${CMAKE_CURRENT_BINARY_DIR}/header_tests/main.cpp)
  file(CONFIGURE OUTPUT ${main} CONTENT
    "// Generated: the program every header's unit is linked into.\nint main() { return 0; }\n")
  add_executable(${target} ${sources} ${main})
  target_link_libraries(${target} PRIVATE megamoe::headers megamoe_warnings)
  target_compile_options(${target} PRIVATE -O0)
endfunction()

# compile_fail.<stem> passes only if compiling <source> with MEGAMOE_COMPILE_FAIL prints the rule id
# its name starts with (R003_... -> megamoe[R003]) and no other rule id; compile_ok.<stem> builds the
# same file without the define and must succeed, which proves the failure comes from the bad line.
function(megamoe_add_compile_fail_test source)
  get_filename_component(stem ${source} NAME_WE)
  string(SUBSTRING ${stem} 0 4 id)
  set(others)
  foreach(n RANGE 1 99)
    if(n LESS 10)
      set(other R00${n})
    else()
      set(other R0${n})
    endif()
    if(NOT other STREQUAL id)
      list(APPEND others ${other})
    endif()
  endforeach()
  list(JOIN others "|" others)

  add_library(compile_fail_${stem} OBJECT EXCLUDE_FROM_ALL ${source})
  target_link_libraries(compile_fail_${stem} PRIVATE megamoe::megamoe)
  target_compile_definitions(compile_fail_${stem} PRIVATE MEGAMOE_COMPILE_FAIL)
  add_test(NAME compile_fail.${stem}
    COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target compile_fail_${stem}
            --config $<CONFIG>)
  set_tests_properties(compile_fail.${stem} PROPERTIES
    PASS_REGULAR_EXPRESSION "megamoe\\[${id}\\]"
    FAIL_REGULAR_EXPRESSION "megamoe\\[(${others})\\]"
    RESOURCE_LOCK megamoe_build LABELS compile_fail TIMEOUT 300)

  add_library(compile_ok_${stem} OBJECT EXCLUDE_FROM_ALL ${source})
  target_link_libraries(compile_ok_${stem} PRIVATE megamoe::megamoe megamoe_warnings)
  add_test(NAME compile_ok.${stem}
    COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target compile_ok_${stem}
            --config $<CONFIG>)
  set_tests_properties(compile_ok.${stem} PROPERTIES
    RESOURCE_LOCK megamoe_build LABELS compile_fail TIMEOUT 300)
endfunction()

# package.<name>: configures, builds and runs the consumer project tests/package/<name>, which uses
# megamoe through add_subdirectory (MODE subdir) or through find_package after `cmake --install` of
# this build into a temporary prefix (MODE install).
function(megamoe_add_package_test name)
  cmake_parse_arguments(ARG "" "MODE" "" ${ARGN})
  add_test(NAME package.${name}
    COMMAND ${CMAKE_COMMAND} -DMODE=${ARG_MODE} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
            -DBINARY_DIR=${PROJECT_BINARY_DIR} -DCONSUMER_DIR=${PROJECT_SOURCE_DIR}/tests/package/${name}
            -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/package/${name} "-DGENERATOR=${CMAKE_GENERATOR}"
            -DCXX=${CMAKE_CXX_COMPILER}
            -P ${PROJECT_SOURCE_DIR}/tests/package/run_consumer.cmake)
  set_tests_properties(package.${name} PROPERTIES LABELS package TIMEOUT 600 PROCESSORS 2
    ENVIRONMENT "${MEGAMOE_MPI_TEST_ENVIRONMENT}")
endfunction()
