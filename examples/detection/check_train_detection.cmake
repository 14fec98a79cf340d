# Writes a synthetic detection set with make_detection_set, trains train_detection on it and fails
# unless the program exits with 0 and its LogReport's last entry has validation/main/map (mAP@0.5
# over the whole validation set) of at least MIN_MAP and a finite validation/main/map_coco (the
# example's CTest; see CMakeLists.txt).
#
#   cmake -DTRAIN_DETECTION=<program> -DMAKE_SET=<make_detection_set> -DOUT=<dir> -DMIN_MAP=0.5
#         -DSET_ARGS=<make_detection_set flags separated by |>
#         [-DMPIEXEC=<mpiexec> -DNP=2 -DMPI_FLAGS=<flags separated by |>]
#         -DARGS=<train_detection flags separated by |> -P check_train_detection.cmake
foreach(_var TRAIN_DETECTION MAKE_SET OUT MIN_MAP SET_ARGS)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_train_detection: -D${_var}=... is required")
  endif()
endforeach()

string(REPLACE "|" ";" _set_args "${SET_ARGS}")
file(REMOVE_RECURSE ${OUT}_data)
execute_process(COMMAND ${MAKE_SET} --out ${OUT}_data ${_set_args} RESULT_VARIABLE _rc
                OUTPUT_VARIABLE _set_out ERROR_VARIABLE _set_out)
message("${_set_out}")
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "make_detection_set failed (exit status ${_rc})")
endif()

include(${CMAKE_CURRENT_LIST_DIR}/../run_example.cmake)
kusari_run_example(${TRAIN_DETECTION} ${OUT} --data ${OUT}_data)
if(_entries LESS 1)
  message(FATAL_ERROR "${OUT}/log has no entries")
endif()
math(EXPR _last "${_entries} - 1")
string(JSON _map GET "${_log}" ${_last} "validation/main/map")
string(JSON _coco GET "${_log}" ${_last} "validation/main/map_coco")
message("validation/main/map (mAP@0.5): ${_map} (expected at least ${MIN_MAP}); validation/main/map_coco: ${_coco}")
foreach(_value ${_map} ${_coco})
  if(NOT _value MATCHES "^[0-9]+(\\.[0-9]*)?([eE][-+]?[0-9]+)?$")
    message(FATAL_ERROR "a validation mAP is not a finite number: ${_value}")
  endif()
endforeach()
if(_map LESS MIN_MAP)
  message(FATAL_ERROR "the detector did not learn: mAP@0.5 ${_map} < ${MIN_MAP}")
endif()
