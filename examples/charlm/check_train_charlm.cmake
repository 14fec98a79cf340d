# Runs train_charlm and fails unless it exits with 0, its LogReport's validation perplexity falls
# from each epoch to the next, and the last one is below MAX_PERPLEXITY (the example's CTest).
#
#   cmake -DTRAIN_CHARLM=<program> -DOUT=<dir> -DMAX_PERPLEXITY=40 -DDATA=<text file>
#         [-DMPIEXEC=<mpiexec> -DNP=2 -DMPI_FLAGS=<flags separated by |>]
#         -DARGS=<train_charlm flags separated by |> -P check_train_charlm.cmake
#
# Without the text file it prints "SKIP:" and exits 0; the test's SKIP_REGULAR_EXPRESSION
# reports it as skipped.
foreach(_var TRAIN_CHARLM OUT MAX_PERPLEXITY DATA)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_train_charlm: -D${_var}=... is required")
  endif()
endforeach()
if(NOT EXISTS ${DATA})
  message("SKIP: the text ${DATA} is not installed")
  return()
endif()

include(${CMAKE_CURRENT_LIST_DIR}/../run_example.cmake)
kusari_run_example(${TRAIN_CHARLM} ${OUT} --data ${DATA})
if(_entries LESS 2)
  message(FATAL_ERROR "${OUT}/log has ${_entries} entries; at least 2 epochs are needed")
endif()
math(EXPR _last "${_entries} - 1")
set(_previous "")
foreach(_i RANGE ${_last})
  string(JSON _perplexity GET "${_log}" ${_i} "validation/main/perplexity")
  string(JSON _epoch GET "${_log}" ${_i} "epoch")
  message("epoch ${_epoch}: validation perplexity ${_perplexity}")
  if(NOT _previous STREQUAL "" AND NOT _perplexity LESS _previous)
    message(FATAL_ERROR "the validation perplexity rose from ${_previous} to ${_perplexity} (entry ${_i})")
  endif()
  set(_previous ${_perplexity})
endforeach()
if(NOT _previous LESS MAX_PERPLEXITY)
  message(FATAL_ERROR "the last validation perplexity ${_previous} is not below ${MAX_PERPLEXITY}")
endif()
