# Resuming must go on exactly as an uninterrupted run: runs PROGRAM straight to the end, and again
# to the half-way point (which ends with a snapshot, one file per process under mpiexec) followed
# by a run resumed from that snapshot (-r) to the end, and fails unless the last LogReport entries
# of the two agree on every key but elapsed_time, to the last digit (the log keeps every digit of
# a double). Used by train_a2c and train_charlm.
#
#   cmake -DPROGRAM=<program> -DOUT=<dir> -DEND=<flags of the full run> -DHALF=<flags of the
#         half run> -DSNAPSHOT=<the half run's snapshot, e.g. snapshot_iter_100> [-DARGS=<flags of
#         every run>] [-DMPIEXEC=<mpiexec> -DNP=2 -DMPI_FLAGS=<flags>] -P check_resume.cmake
#
# Lists of flags are separated by |.
foreach(_var PROGRAM OUT END HALF SNAPSHOT)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_resume: -D${_var}=... is required")
  endif()
endforeach()
get_filename_component(_name ${PROGRAM} NAME)
file(REMOVE_RECURSE ${OUT})

function(run_program out)
  string(REPLACE "|" ";" _args "${ARGS}")
  set(_command ${PROGRAM} ${_args} ${ARGN} --out ${out})
  if(DEFINED MPIEXEC)
    string(REPLACE "|" ";" _mpi_flags "${MPI_FLAGS}")
    set(_command ${MPIEXEC} -n ${NP} ${_mpi_flags} ${_command})
  endif()
  string(REPLACE ";" " " _shown "${_command}")
  message("running: ${_shown}")
  execute_process(COMMAND ${_command} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out TIMEOUT 300)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${_name} failed (exit status ${_rc}): ${_shown}\n${_out}")
  endif()
endfunction()

function(last_entry out var)
  if(NOT EXISTS ${out}/log)
    message(FATAL_ERROR "${_name} wrote no ${out}/log")
  endif()
  file(READ ${out}/log _text)
  string(JSON _count LENGTH "${_text}")
  math(EXPR _last "${_count} - 1")
  string(JSON _entry GET "${_text}" ${_last})
  set(${var} "${_entry}" PARENT_SCOPE)
endfunction()

string(REPLACE "|" ";" _end "${END}")
string(REPLACE "|" ";" _half "${HALF}")
run_program(${OUT}/straight ${_end})
run_program(${OUT}/resumed ${_half})
set(_snapshot ${OUT}/resumed/${SNAPSHOT})
if(NOT EXISTS ${_snapshot} AND NOT EXISTS ${_snapshot}.0)
  message(FATAL_ERROR "the half run left no ${_snapshot} (nor ${_snapshot}.0)")
endif()
run_program(${OUT}/resumed ${_end} --resume ${_snapshot})

last_entry(${OUT}/straight _straight)
last_entry(${OUT}/resumed _resumed)
string(JSON _keys LENGTH "${_straight}")
math(EXPR _last_key "${_keys} - 1")
set(_compared "")
foreach(_i RANGE ${_last_key})
  string(JSON _key MEMBER "${_straight}" ${_i})
  if(_key STREQUAL "elapsed_time")
    continue()
  endif()
  string(JSON _a GET "${_straight}" "${_key}")
  string(JSON _b ERROR_VARIABLE _missing GET "${_resumed}" "${_key}")
  if(_missing)
    message(FATAL_ERROR "the resumed run's last log entry has no '${_key}':\n${_resumed}")
  endif()
  if(NOT _a STREQUAL _b)
    message(FATAL_ERROR "after resuming, '${_key}' is ${_b}; the uninterrupted run has ${_a}\n"
                        "uninterrupted: ${_straight}\nresumed: ${_resumed}")
  endif()
  string(APPEND _compared " ${_key}=${_a}")
endforeach()
message("the resumed run ends as the uninterrupted one:${_compared}")
