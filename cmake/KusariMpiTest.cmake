# How the tests start MPI jobs (tests/mn, and the example tests under mpiexec): sets
#   KUSARI_MPI_TEST_FLAGS  flags for mpiexec after "-n N" (Open MPI: --oversubscribe, since a
#                          test may start more ranks than there are cores), plus
#                          KUSARI_MPIEXEC_EXTRA_FLAGS;
#   KUSARI_MPI_TEST_ENV    the environment for such a test: Open MPI refuses to run as root
#                          unless told it is on purpose (containers, CI).
set(KUSARI_MPIEXEC_EXTRA_FLAGS "" CACHE STRING "Extra flags for mpiexec in the tests")
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _kusari_mpiexec_version ERROR_QUIET)
if(_kusari_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(KUSARI_MPI_TEST_FLAGS --oversubscribe ${KUSARI_MPIEXEC_EXTRA_FLAGS})
else()
  set(KUSARI_MPI_TEST_FLAGS ${KUSARI_MPIEXEC_EXTRA_FLAGS})
endif()
set(KUSARI_MPI_TEST_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
