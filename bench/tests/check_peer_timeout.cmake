# Runs a benchmark whose peer never finishes (sleeping_peer.sh as its --python) with a short
# --timeout and passes when the benchmark stops the peer in time, prints its own rows, names the
# peer that did not finish and after how long, and exits with status 1.
#   cmake -DBENCH=... "-DARGS=--chains|100" -DPEER=sleeping_peer.sh -DROWS=... -P check_peer_timeout.cmake
string(REPLACE "|" ";" _args "${ARGS}")
string(TIMESTAMP _start "%s")
execute_process(COMMAND ${BENCH} ${_args} --python ${PEER} --timeout 2
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 50)
string(TIMESTAMP _end "%s")
math(EXPR _seconds "${_end} - ${_start}")
set(_all "${_out}${_err}")
if(NOT _rc EQUAL 1)
  message(FATAL_ERROR "${BENCH} exited with '${_rc}' after ${_seconds} s; expected 1 (a peer did not finish):\n${_all}")
endif()
foreach(_expect "${ROWS}" "did not finish within 2 s and was stopped" "incomplete: the pytorch peer"
                "sleeping peer started" "reproduce: ")
  if(NOT _all MATCHES "${_expect}")
    message(FATAL_ERROR "the output of ${BENCH} lacks '${_expect}':\n${_all}")
  endif()
endforeach()
if(_seconds GREATER 20)
  message(FATAL_ERROR "${BENCH} took ${_seconds} s with --timeout 2:\n${_all}")
endif()
message(STATUS "${BENCH} stopped its peer after 2 s and reported it (${_seconds} s in all):\n${_all}")
