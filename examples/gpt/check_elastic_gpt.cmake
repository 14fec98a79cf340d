# train_gpt --elastic resumes on another number of processes: 3 processes train to iteration 40
# with a snapshot every 20; the set of iteration 40 then loses rank 2's file (as if rank 2 died
# while the others wrote theirs), and 2 processes given -r <out folder> must resume from the
# complete set of iteration 20, which 3 processes wrote, and end at iteration 40 with a log entry
# there. (docs/elastic.md; the launcher's own tests are in tests/tools and tests/mn.)
#
# With -DEXTRA_ARGS=--zero|2 the optimizer is sharded: each process's snapshot holds its shard of
# the optimizer's state, and the 2 processes put theirs together from the 3 files.
#
#   cmake -DTRAIN_GPT=<program> -DOUT=<dir> -DMPIEXEC=<mpiexec> [-DMPI_FLAGS=<flags separated by |>]
#         [-DEXTRA_ARGS=<train_gpt flags separated by |>] -P check_elastic_gpt.cmake
foreach(_var TRAIN_GPT OUT MPIEXEC)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_elastic_gpt: -D${_var}=... is required")
  endif()
endforeach()
string(REPLACE "|" ";" _mpi_flags "${MPI_FLAGS}")
string(REPLACE "|" ";" _extra_args "${EXTRA_ARGS}")
file(REMOVE_RECURSE ${OUT})
file(MAKE_DIRECTORY ${OUT})
set(_text "")
foreach(_i RANGE 0 199)
  math(EXPR _k "${_i} % 7")
  string(APPEND _text "line ${_i} holds the word ${_k} and then some more words.\n")
endforeach()
file(WRITE ${OUT}/corpus.txt "${_text}")
set(_args --text ${OUT}/corpus.txt --n-layer 2 --n-head 2 --n-embd 32 --block-size 32 --seq-len 32 -b 4 -i 40
          --elastic --snapshot-interval 20 --eval-interval 20 --log-interval 20 --noplot -o ${OUT}/run -r ${OUT}/run ${_extra_args})

function(run_np np)
  set(_command ${MPIEXEC} -n ${np} ${_mpi_flags} ${TRAIN_GPT} ${_args})
  string(REPLACE ";" " " _shown "${_command}")
  message("running: ${_shown}")
  execute_process(COMMAND ${_command} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 120)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "train_gpt failed (${_rc}): ${_shown}\n${_out}${_err}")
  endif()
  set(_output "${_out}" PARENT_SCOPE)
endfunction()

run_np(3)
if(NOT _output MATCHES "no complete snapshot set in '[^']*'; starting from the beginning")
  message(FATAL_ERROR "the first start did not say it started from the beginning:\n${_output}")
endif()
foreach(_rank 0 1 2)
  if(NOT EXISTS ${OUT}/run/snapshot_iter_40.${_rank})
    message(FATAL_ERROR "the 3-process run wrote no ${OUT}/run/snapshot_iter_40.${_rank}")
  endif()
endforeach()
file(REMOVE ${OUT}/run/snapshot_iter_40.2)
run_np(2)
if(NOT _output MATCHES "2 processes resumed from iteration 20, which 3 processes wrote")
  message(FATAL_ERROR "2 processes did not resume from the set of iteration 20 that 3 wrote:\n${_output}")
endif()
file(READ ${OUT}/run/log _log)
string(JSON _entries LENGTH "${_log}")
math(EXPR _last "${_entries} - 1")
string(JSON _iteration GET "${_log}" ${_last} iteration)
if(NOT _iteration EQUAL 40)
  message(FATAL_ERROR "the resumed run's last log entry is of iteration ${_iteration}; expected 40")
endif()
message("3 processes to iteration 40, rank 2's last file removed, 2 processes resumed from 20 and ended at 40")
