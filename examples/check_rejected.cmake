# Runs PROGRAM with ARGS ('|'-separated) and passes when it exits non-zero and its output
# matches EXPECT: a bad flag must be refused with a message naming it, not train with a guess.
#   cmake -DPROGRAM=... "-DARGS=--size|16" "-DEXPECT=..." -P check_rejected.cmake
string(REPLACE "|" ";" _args "${ARGS}")
execute_process(COMMAND ${PROGRAM} ${_args} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                ERROR_VARIABLE _err TIMEOUT 60)
set(_all "${_out}${_err}")
if(_rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} ${ARGS} exited 0; expected it to refuse the input:\n${_all}")
endif()
if(NOT _all MATCHES "${EXPECT}")
  message(FATAL_ERROR "${PROGRAM} ${ARGS} exited ${_rc} but its output does not match "
                      "'${EXPECT}':\n${_all}")
endif()
message(STATUS "${PROGRAM} ${ARGS} refused as expected (exit ${_rc}):\n${_all}")
