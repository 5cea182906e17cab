# CTest `package_consumer` (cmake -P): install this build into BUILD/package-test/install, build
# the consumer project tests/package against it with -O3 -march=native -ffp-contract=fast, and
# require its output to equal the in-tree probe's (PROBE) bit for bit; the control build must
# differ in the plain-expression hash when the machine fuses (an FMA CPU), so the comparison can
# fail. Arguments: -DBUILD= -DSRC= -DPROBE=.
set(root ${BUILD}/package-test)
file(REMOVE_RECURSE ${root})
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "package_consumer: ${what} failed (exit ${rc}):\n${out}\n${err}")
  endif()
  set(run_out "${out}" PARENT_SCOPE)
endfunction()
run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD} --prefix ${root}/install)
run("configuring the consumer" ${CMAKE_COMMAND} -S ${SRC} -B ${root}/consumer
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=${root}/install
    "-DCMAKE_CXX_FLAGS=-O3 -march=native -ffp-contract=fast")
run("building the consumer" ${CMAKE_COMMAND} --build ${root}/consumer -j2)
run("the in-tree probe" ${PROBE})
set(want "${run_out}")
run("the consumer" ${root}/consumer/consumer)
set(got "${run_out}")
run("the control" ${root}/consumer/consumer_control)
set(control "${run_out}")
message(STATUS "in-tree probe:\n${want}consumer (-O3 -march=native -ffp-contract=fast):\n${got}"
               "control (contraction forced on the file):\n${control}")
if(NOT got STREQUAL want)
  message(FATAL_ERROR "package_consumer: the consumer's bits differ from the in-tree build's\n"
                      "  repro: ctest --test-dir ${BUILD} -R package_consumer -V")
endif()
string(REGEX MATCH "plain [0-9a-f]+" want_plain "${want}")
string(REGEX MATCH "plain [0-9a-f]+" control_plain "${control}")
file(READ /proc/cpuinfo cpuinfo)
if(cpuinfo MATCHES " fma ")
  if(want_plain STREQUAL control_plain)
    message(FATAL_ERROR "package_consumer: the control build (-ffp-contract=fast on an FMA CPU) "
                        "printed the same plain-expression bits: the comparison has no teeth")
  endif()
else()
  message(STATUS "package_consumer: no FMA on this CPU, the control cannot differ (not checked)")
endif()
