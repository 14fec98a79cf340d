# Runs train_mnist for a short training and fails unless it exits with 0 and its LogReport ends
# with a validation accuracy of at least MIN_ACCURACY (the examples' CTest; see CMakeLists.txt).
#
#   cmake -DTRAIN_MNIST=<program> -DOUT=<dir> -DMIN_ACCURACY=0.8 [-DMPIEXEC=<mpiexec> -DNP=2
#         -DMPI_FLAGS=<flags separated by |>] -DARGS=<train_mnist flags separated by |>
#         [-DPLAIN_OUTPUT=ON] -P check_train_mnist.cmake
#
# With PLAIN_OUTPUT the program's output goes to <dir>/output.txt, as a batch job's does, and
# the test also fails if that file holds an escape character (0x1b) or lacks ProgressBar's
# plain progress line: under mpiexec each rank's stdout is a pseudo-terminal even then, and the
# report extensions must still write plain lines (Note [Terminal output]).
#
# Without Fashion-MNIST ($KUSARI_DATASET_ROOT/fashion-mnist or /usr/share/datasets/fashion-mnist)
# it prints "SKIP:" and exits 0; the test's SKIP_REGULAR_EXPRESSION reports it as skipped.
foreach(_var TRAIN_MNIST OUT MIN_ACCURACY)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_train_mnist: -D${_var}=... is required")
  endif()
endforeach()

include(${CMAKE_CURRENT_LIST_DIR}/fashion_mnist.cmake)
if(NOT FASHION_MNIST_FOUND)
  return()
endif()

string(REPLACE "|" ";" _args "${ARGS}")
string(REPLACE "|" ";" _mpi_flags "${MPI_FLAGS}")
set(_command ${TRAIN_MNIST} ${_args} --noplot --out ${OUT})
if(DEFINED MPIEXEC)
  set(_command ${MPIEXEC} -n ${NP} ${_mpi_flags} ${_command})
endif()
file(REMOVE_RECURSE ${OUT})
string(REPLACE ";" " " _shown "${_command}")
if(PLAIN_OUTPUT)
  file(MAKE_DIRECTORY ${OUT})
  set(_output_file ${OUT}/output.txt)
  message("running: ${_shown} > ${_output_file} 2>&1")
  execute_process(COMMAND ${_command} RESULT_VARIABLE _rc OUTPUT_FILE ${_output_file}
                  ERROR_FILE ${_output_file})
else()
  message("running: ${_shown}")
  execute_process(COMMAND ${_command} RESULT_VARIABLE _rc)
endif()
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "train_mnist failed (exit status ${_rc}): ${_shown}")
endif()

if(PLAIN_OUTPUT)
  file(READ ${_output_file} _output)
  message("${_output}")
  string(ASCII 27 _esc)
  string(FIND "${_output}" "${_esc}" _esc_at)
  if(NOT _esc_at EQUAL -1)
    message(FATAL_ERROR "${_output_file} holds terminal escapes (0x1b, the first at character "
                        "${_esc_at}); a log file must get plain lines (Note [Terminal output])")
  endif()
  if(NOT _output MATCHES "iter, [0-9]+ epoch / [0-9]+ epochs; total [0-9.]+%")
    message(FATAL_ERROR "${_output_file} lacks ProgressBar's plain progress line")
  endif()
endif()

if(NOT EXISTS ${OUT}/log)
  message(FATAL_ERROR "train_mnist wrote no ${OUT}/log")
endif()
file(READ ${OUT}/log _log)
string(JSON _entries LENGTH "${_log}")
if(_entries EQUAL 0)
  message(FATAL_ERROR "${OUT}/log has no entries")
endif()
math(EXPR _last "${_entries} - 1")
string(JSON _accuracy GET "${_log}" ${_last} "validation/main/accuracy")
message("validation/main/accuracy: ${_accuracy} (expected at least ${MIN_ACCURACY})")
if(NOT _accuracy GREATER_EQUAL MIN_ACCURACY)
  message(FATAL_ERROR "validation accuracy ${_accuracy} is below ${MIN_ACCURACY}")
endif()
