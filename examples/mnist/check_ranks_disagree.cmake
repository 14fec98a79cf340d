# Starts two train_mnist processes with different flags in one MPI job (MPMD: rank 0 gets ARGS0,
# rank 1 ARGS1) and passes when the job exits non-zero, well within its timeout, with a message
# matching EXPECT: processes started with different settings must fail together at the start, not
# hang in a collective (Note [Same settings]).
#
#   cmake -DTRAIN_MNIST=<program> -DMPIEXEC=<mpiexec> [-DMPI_FLAGS=<flags separated by |>]
#         -DOUT=<dir> "-DARGS0=-b|50" "-DARGS1=-b|100" "-DEXPECT=<regex>" [-DNP=<n> (default 2)]
#         [-DPLOT=OFF] -P check_ranks_disagree.cmake
# With NP=n, rank 0 gets ARGS0 and the other n-1 ranks ARGS1. PLOT=OFF: the program has no
# --noplot flag (the model-parallel examples write no plots).
foreach(_var TRAIN_MNIST MPIEXEC OUT ARGS0 ARGS1 EXPECT)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_ranks_disagree: -D${_var}=... is required")
  endif()
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/fashion_mnist.cmake)
if(NOT FASHION_MNIST_FOUND)
  return()
endif()
string(REPLACE "|" ";" _args0 "${ARGS0}")
string(REPLACE "|" ";" _args1 "${ARGS1}")
string(REPLACE "|" ";" _mpi_flags "${MPI_FLAGS}")
if(NOT DEFINED NP)
  set(NP 2)
endif()
math(EXPR _others "${NP} - 1")
set(_common --out ${OUT})
if(NOT DEFINED PLOT OR PLOT)
  list(PREPEND _common --noplot)
endif()
set(_command ${MPIEXEC} ${_mpi_flags} -n 1 ${TRAIN_MNIST} ${_args0} ${_common} : -n ${_others} ${TRAIN_MNIST}
             ${_args1} ${_common})
file(REMOVE_RECURSE ${OUT})
string(REPLACE ";" " " _shown "${_command}")
message("running: ${_shown}")
# Before the check the job hung until it was killed; 40 s is far more than the start takes.
execute_process(COMMAND ${_command} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 40)
set(_all "${_out}${_err}")
if(_rc EQUAL 0)
  message(FATAL_ERROR "the job exited 0; expected both processes to refuse the different settings:\n${_all}")
endif()
if(NOT _rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end by itself (${_rc}); it hangs instead of failing:\n${_all}")
endif()
if(NOT _all MATCHES "${EXPECT}")
  message(FATAL_ERROR "the job exited ${_rc} but its output does not match '${EXPECT}':\n${_all}")
endif()
message(STATUS "refused as expected (exit ${_rc}):\n${_all}")
