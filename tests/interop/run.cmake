# CTest `interop`: runs tests/interop/interop_test.py with the virtual environment's Python.
#   cmake -DPYTHON=<python> -DSCRIPT=<interop_test.py> -DMOECHECK=<moecheck> -DPROBE=<dequant_probe>
#         -DWORK=<scratch dir> -P tests/interop/run.cmake
# A missing interpreter fails here (the script itself fails on a missing module), naming it and
# the command that creates it.
foreach(v PYTHON SCRIPT MOECHECK PROBE WORK)
  if(NOT ${v})
    message(FATAL_ERROR "interop: pass -D${v}=...")
  endif()
endforeach()
if(NOT EXISTS "${PYTHON}")
  message(FATAL_ERROR
    "interop: FAILED: the interop test's Python, ${PYTHON}, does not exist.\n"
    "Create the virtual environment with `bash .ci/deps` (as root: /opt/moecheck-venv from "
    "tests/interop/requirements.txt), or configure with -DMOECHECK_PYTHON=<a python with gguf, "
    "h5py and numpy>.")
endif()
set(cmd "${PYTHON}" -B "${SCRIPT}" --moecheck "${MOECHECK}" --probe "${PROBE}" --work "${WORK}")
execute_process(COMMAND ${cmd} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  list(JOIN cmd " " line)
  message(FATAL_ERROR "interop: FAILED (exit ${rc}); repro: ${line}")
endif()
