# Runs train_imagenet under mpiexec on the fixture's image folder and fails unless it exits with
# 0 and its LogReport ends with a validation accuracy of at least MIN_ACCURACY.
#
#   cmake -DTRAIN_IMAGENET=<program> -DIMAGES=<folder with train/ and val/> -DOUT=<dir>
#         -DMPIEXEC=<mpiexec> -DNP=2 -DMPI_FLAGS=<flags separated by |>
#         -DARGS=<train_imagenet flags separated by |> [-DMIN_ACCURACY=0.5] [-DRESUME=ON]
#         [-DRESUME_EPOCH=k]
#         -P check_train_imagenet.cmake
#
# With RESUME the training runs three times: two epochs without a stop, then one epoch (ending
# with a snapshot, one file per process: snapshot_iter_<iteration>.<rank>), then again with
# --resume from that snapshot and two epochs. The resumed run must say it continues at epoch 1,
# its log (restored from the snapshot, then extended) must hold exactly epochs 1 and 2, the
# second at twice the first's iteration count, and its last entry must equal the uninterrupted
# run's to the last digit (each process resumes from its own file, its loader state included).
#
# With RESUME_EPOCH=k the training runs twice with the ARGS' epochs: once without a stop and a
# snapshot every epoch, then again resumed from the snapshot at the end of epoch k; the last
# entries must be equal to the last digit (used where the schedule depends on the run's length).
#
# With SAME_WITH=<flags separated by |> the training runs twice, without and with those flags
# (e.g. --overlap, which must not change a number): the last entries must be equal to the last
# digit, and the second run's output must match SAME_WITH_SAYS (a regular expression) if given.
#
# Without the fixture's folder (no Fashion-MNIST) it prints "SKIP:" and exits 0.
foreach(_var TRAIN_IMAGENET IMAGES OUT MPIEXEC NP)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_train_imagenet: -D${_var}=... is required")
  endif()
endforeach()
if(NOT EXISTS ${IMAGES}/train OR NOT EXISTS ${IMAGES}/val)
  message("SKIP: Fashion-MNIST is not installed (the image folder ${IMAGES} was not made)")
  return()
endif()

string(REPLACE "|" ";" _args "${ARGS}")
string(REPLACE "|" ";" _mpi_flags "${MPI_FLAGS}")
file(REMOVE_RECURSE ${OUT})
set(_out ${OUT})  # the folder of the next run

# Runs train_imagenet with the common arguments and `extra`; its output goes to _output.
macro(_run_training)
  set(_command ${MPIEXEC} -n ${NP} ${_mpi_flags} ${TRAIN_IMAGENET} ${IMAGES}/train ${IMAGES}/val
               ${_args} --noplot --out ${_out} ${ARGN})
  string(REPLACE ";" " " _shown "${_command}")
  message("running: ${_shown}")
  string(TIMESTAMP _start "%s")
  execute_process(COMMAND ${_command} RESULT_VARIABLE _rc OUTPUT_VARIABLE _output
                  ERROR_VARIABLE _output)
  string(TIMESTAMP _end "%s")
  math(EXPR _seconds "${_end} - ${_start}")
  message("${_output}(${_seconds} s)")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "train_imagenet failed (exit status ${_rc}): ${_shown}")
  endif()
endmacro()

# The log's entry count and the value of `key` in entry `index` (negative: from the end).
function(_log_value index key result)
  if(NOT EXISTS ${_out}/log)
    message(FATAL_ERROR "train_imagenet wrote no ${_out}/log")
  endif()
  file(READ ${_out}/log _log)
  string(JSON _n LENGTH "${_log}")
  if(_n EQUAL 0)
    message(FATAL_ERROR "${_out}/log has no entries")
  endif()
  if(index LESS 0)
    math(EXPR index "${_n} + ${index}")
  endif()
  string(JSON _value GET "${_log}" ${index} "${key}")
  set(${result} "${_value}" PARENT_SCOPE)
  set(_log_entries ${_n} PARENT_SCOPE)
endfunction()

set(_compared main/loss main/accuracy validation/main/loss validation/main/accuracy)
# The compared values of the log's last entry, as " key value key value ...".
function(_last_entry result)
  set(_entry "")
  foreach(_key ${_compared})
    _log_value(-1 ${_key} _value)
    string(APPEND _entry " ${_key} ${_value}")
  endforeach()
  set(${result} "${_entry}" PARENT_SCOPE)
endfunction()

if(RESUME)
  set(_out ${OUT}/straight)
  _run_training(--epoch 2)
  _last_entry(_straight)
  set(_out ${OUT})
  _run_training(--epoch 1)
  _log_value(-1 iteration _first_iteration)
  set(_snapshot ${OUT}/snapshot_iter_${_first_iteration})
  math(EXPR _last_rank "${NP} - 1")
  foreach(_rank RANGE ${_last_rank})
    if(NOT EXISTS ${_snapshot}.${_rank})
      message(FATAL_ERROR "the first run left no ${_snapshot}.${_rank} (each process writes its own)")
    endif()
  endforeach()
  _run_training(--epoch 2 --resume ${_snapshot})
  if(NOT _output MATCHES "Continuing at epoch 1, iteration ${_first_iteration}")
    message(FATAL_ERROR "the resumed run did not continue at epoch 1, iteration ${_first_iteration}")
  endif()
  _log_value(0 epoch _epoch0)
  _log_value(-1 epoch _epoch1)
  _log_value(-1 iteration _last_iteration)
  math(EXPR _expected_iteration "2 * ${_first_iteration}")
  if(NOT _log_entries EQUAL 2 OR NOT _epoch0 EQUAL 1 OR NOT _epoch1 EQUAL 2
     OR NOT _last_iteration EQUAL _expected_iteration)
    message(FATAL_ERROR "after resuming, the log holds ${_log_entries} entries, epochs ${_epoch0} .. "
                        "${_epoch1}, ending at iteration ${_last_iteration}; expected epochs 1 and 2, "
                        "ending at iteration ${_expected_iteration}")
  endif()
  _last_entry(_resumed)
  if(NOT _resumed STREQUAL _straight)
    message(FATAL_ERROR "the resumed run ended elsewhere than the uninterrupted one:\n"
                        "  uninterrupted:${_straight}\n  resumed:      ${_resumed}")
  endif()
  message("resumed: epochs 1 and 2 logged, iteration ${_last_iteration}, as without a stop:${_resumed}")
elseif(DEFINED RESUME_EPOCH)
  # One run with a snapshot every epoch (the ARGS set the epochs), then a run of the same length
  # resumed from the snapshot at the end of epoch RESUME_EPOCH: both must end alike to the digit.
  set(_out ${OUT}/straight)
  _run_training(--frequency 1)
  _log_value(-1 iteration _iterations)
  _log_value(-1 epoch _epochs)
  math(EXPR _at "${_iterations} * ${RESUME_EPOCH} / ${_epochs}")
  _last_entry(_straight)
  set(_out ${OUT}/resumed)
  _run_training(--resume ${OUT}/straight/snapshot_iter_${_at})
  _last_entry(_resumed)
  if(NOT _resumed STREQUAL _straight)
    message(FATAL_ERROR "the run resumed at iteration ${_at} ended elsewhere than the "
                        "uninterrupted one:\n  uninterrupted:${_straight}\n  resumed:      ${_resumed}")
  endif()
  message("resumed at iteration ${_at}: as without a stop:${_resumed}")
elseif(DEFINED SAME_WITH)
  string(REPLACE "|" ";" _with "${SAME_WITH}")
  string(REPLACE "|" " " _with_shown "${SAME_WITH}")
  set(_runs "")
  foreach(_which without with)
    set(_out ${OUT}/${_which})
    if(_which STREQUAL "with")
      _run_training(${_with})
      if(DEFINED SAME_WITH_SAYS AND NOT _output MATCHES "${SAME_WITH_SAYS}")
        message(FATAL_ERROR "the run with ${_with_shown} did not say '${SAME_WITH_SAYS}'")
      endif()
    else()
      _run_training()
    endif()
    _last_entry(_entry)
    list(APPEND _runs "${_entry}")
  endforeach()
  list(GET _runs 0 _without)
  list(GET _runs 1 _with_entry)
  if(NOT _with_entry STREQUAL _without)
    message(FATAL_ERROR "the run with ${_with_shown} ended elsewhere than the run without:\n"
                        "  without:${_without}\n  with:   ${_with_entry}")
  endif()
  message("with ${_with_shown}: as without:${_with_entry}")
else()
  _run_training()
endif()

if(DEFINED MIN_ACCURACY)
  _log_value(-1 "validation/main/accuracy" _accuracy)
  message("validation/main/accuracy: ${_accuracy} (expected at least ${MIN_ACCURACY})")
  if(NOT _accuracy GREATER_EQUAL MIN_ACCURACY)
    message(FATAL_ERROR "validation accuracy ${_accuracy} is below ${MIN_ACCURACY}")
  endif()
endif()
