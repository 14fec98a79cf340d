# Runs train_a2c and fails unless it exits with 0 and some entry of its log reaches a mean
# episode return of at least MIN_RETURN (the example's CTest; see CMakeLists.txt).
#
#   cmake -DTRAIN_A2C=<program> -DOUT=<dir> -DMIN_RETURN=150 [-DMPIEXEC=<mpiexec> -DNP=2
#         -DMPI_FLAGS=<flags separated by |>] -DARGS=<train_a2c flags separated by |> -P check_train_a2c.cmake
foreach(_var TRAIN_A2C OUT MIN_RETURN)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_train_a2c: -D${_var}=... is required")
  endif()
endforeach()

include(${CMAKE_CURRENT_LIST_DIR}/../run_example.cmake)
kusari_run_example(${TRAIN_A2C} ${OUT})
if(_entries EQUAL 0)
  message(FATAL_ERROR "${OUT}/log has no entries")
endif()
math(EXPR _last "${_entries} - 1")
set(_best 0)
set(_reached "")
foreach(_i RANGE ${_last})
  string(JSON _return GET "${_log}" ${_i} "mean_return")
  if(_return GREATER _best)
    set(_best ${_return})
  endif()
  if(_reached STREQUAL "" AND _return GREATER_EQUAL MIN_RETURN)
    string(JSON _reached GET "${_log}" ${_i} "iteration")
  endif()
endforeach()
if(_reached STREQUAL "")
  message(FATAL_ERROR "the mean episode return never reached ${MIN_RETURN} (best ${_best})")
endif()
message("mean episode return reached ${MIN_RETURN} at iteration (update) ${_reached} (best ${_best})")
