# Resuming under mpiexec must be bit-identical: runs train_mnist on NP processes for 2 epochs, and
# again for 1 epoch (which ends with a snapshot, one file per process) followed by a run resumed
# from that snapshot (-r) up to epoch 2, and fails unless the last LogReport entries of the two
# agree exactly on the losses and accuracies (the log keeps every digit of a double), and the
# final snapshots of the two runs hold the same parameters, optimizer state and iterator state
# bit for bit on every process (compared with NumPy: $KUSARI_TEST_PYTHON, default
# /usr/bin/python3).
#
#   cmake -DTRAIN_MNIST=<program> -DMPIEXEC=<mpiexec> -DNP=2 [-DMPI_FLAGS=<flags separated by |>]
#         -DOUT=<dir> -DARGS=<train_mnist flags separated by |> -P check_resume_mnist.cmake
foreach(_var TRAIN_MNIST MPIEXEC NP OUT ARGS)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_resume_mnist: -D${_var}=... is required")
  endif()
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/fashion_mnist.cmake)
if(NOT FASHION_MNIST_FOUND)
  return()
endif()
string(REPLACE "|" ";" _args "${ARGS}")
string(REPLACE "|" ";" _mpi_flags "${MPI_FLAGS}")
file(REMOVE_RECURSE ${OUT})

function(run_train_mnist)
  set(_command ${MPIEXEC} -n ${NP} ${_mpi_flags} ${TRAIN_MNIST} ${_args} --noplot ${ARGN})
  string(REPLACE ";" " " _shown "${_command}")
  message("running: ${_shown}")
  execute_process(COMMAND ${_command} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 60)
  if(NOT _rc EQUAL 0)
    if(_err MATCHES "no CUDA device can be used")
      # A GPU case (ARGS with --gpu) on a machine without a GPU: CTest reports it as skipped.
      message("SKIP: no GPU on this machine:\n${_err}")
      set(_no_gpu ON PARENT_SCOPE)
      return()
    endif()
    message(FATAL_ERROR "train_mnist failed (${_rc}): ${_shown}\n${_out}${_err}")
  endif()
endfunction()

run_train_mnist(-e 2 --out ${OUT}/straight)
if(_no_gpu)
  return()
endif()
run_train_mnist(-e 1 --out ${OUT}/resumed)
# One file per process: snapshot_iter_<iteration>.<rank> (one process keeps Chainer's name,
# snapshot_iter_<iteration>).
file(GLOB _snapshots RELATIVE ${OUT}/resumed ${OUT}/resumed/snapshot_iter_*)
list(LENGTH _snapshots _n)
if(NOT _n EQUAL NP)
  message(FATAL_ERROR "the 1-epoch run left ${_n} snapshot files (${_snapshots}); expected one per process, "
                      "snapshot_iter_<iteration>.<rank>")
endif()
if(NP EQUAL 1)
  list(FILTER _snapshots EXCLUDE REGEX "^snapshot_iter_[0-9]+$")
else()
  math(EXPR _last_rank "${NP} - 1")
  foreach(_rank RANGE ${_last_rank})
    list(FILTER _snapshots EXCLUDE REGEX "^snapshot_iter_[0-9]+\\.${_rank}$")
  endforeach()
endif()
if(_snapshots)
  message(FATAL_ERROR "unexpected snapshot files: ${_snapshots}")
endif()
file(GLOB _first ${OUT}/resumed/snapshot_iter_*)
list(GET _first 0 _snapshot)
if(NP GREATER 1)
  string(REGEX REPLACE "\\.[0-9]+$" "" _snapshot "${_snapshot}")
endif()
run_train_mnist(-e 2 --out ${OUT}/resumed -r ${_snapshot})

set(_keys main/loss main/accuracy validation/main/loss validation/main/accuracy)
foreach(_run straight resumed)
  file(READ ${OUT}/${_run}/log _log)
  string(JSON _entries LENGTH "${_log}")
  if(NOT _entries EQUAL 2)
    message(FATAL_ERROR "${OUT}/${_run}/log has ${_entries} entries; expected epochs 1 and 2")
  endif()
  string(JSON _epoch GET "${_log}" 1 epoch)
  set(_${_run} "epoch ${_epoch}")
  foreach(_key ${_keys})
    string(JSON _value GET "${_log}" 1 ${_key})
    string(APPEND _${_run} ", ${_key} ${_value}")
  endforeach()
  message("${_run}: ${_${_run}}")
endforeach()
if(NOT _straight STREQUAL _resumed)
  message(FATAL_ERROR "the resumed run ended elsewhere than the uninterrupted one:\n"
                      "  uninterrupted: ${_straight}\n  resumed:       ${_resumed}")
endif()

# The final snapshots (one per process): every entry of the updater (model, optimizer, iterator).
set(_python /usr/bin/python3)
if(DEFINED ENV{KUSARI_TEST_PYTHON} AND NOT "$ENV{KUSARI_TEST_PYTHON}" STREQUAL "")
  set(_python $ENV{KUSARI_TEST_PYTHON})
endif()
file(GLOB _finals RELATIVE ${OUT}/straight ${OUT}/straight/snapshot_iter_*)
list(LENGTH _finals _n)
if(NOT _n EQUAL NP)
  message(FATAL_ERROR "the uninterrupted run left ${_n} snapshot files (${_finals}); expected ${NP}")
endif()
set(_compare [=[
import sys
import numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
keys = sorted(k for k in a.files if k.startswith("updater/"))
if keys != sorted(k for k in b.files if k.startswith("updater/")):
    sys.exit("the two snapshots hold different updater entries")
bad = [k for k in keys if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes()]
if bad:
    sys.exit("entries that differ: " + ", ".join(bad))
print(f"{len(keys)} updater entries equal bit for bit")
]=])
foreach(_final ${_finals})
  execute_process(COMMAND ${_python} -c "${_compare}" ${OUT}/straight/${_final} ${OUT}/resumed/${_final}
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _cmp_out ERROR_VARIABLE _cmp_err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "the final snapshot ${_final} of the resumed run differs from the uninterrupted "
                        "one's (${_python}): ${_cmp_out}${_cmp_err}")
  endif()
  message("${_final}: ${_cmp_out}")
endforeach()
