# What the examples' CTest check scripts share: run an example (under mpiexec when MPIEXEC is
# set) and read the JSON log its LogReport wrote.
#
#   include(../run_example.cmake)
#   kusari_run_example(<program> <out dir> <flags...>)
#
# Uses the script's ARGS (flags separated by |), MPIEXEC, NP and MPI_FLAGS (separated by |);
# removes <out dir> first; fails unless the program exits with 0 and wrote <out dir>/log. Sets, in
# the caller: _output (stdout and stderr, also printed), _log (the log's text) and _entries (its
# number of entries).
function(kusari_run_example program out)
  string(REPLACE "|" ";" _args "${ARGS}")
  set(_command ${program} ${_args} ${ARGN} --out ${out})
  if(DEFINED MPIEXEC)
    string(REPLACE "|" ";" _mpi_flags "${MPI_FLAGS}")
    set(_command ${MPIEXEC} -n ${NP} ${_mpi_flags} ${_command})
  endif()
  file(REMOVE_RECURSE ${out})
  string(REPLACE ";" " " _shown "${_command}")
  message("running: ${_shown}")
  execute_process(COMMAND ${_command} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  message("${_out}")
  get_filename_component(_name ${program} NAME)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${_name} failed (exit status ${_rc}): ${_shown}")
  endif()
  if(NOT EXISTS ${out}/log)
    message(FATAL_ERROR "${_name} wrote no ${out}/log")
  endif()
  file(READ ${out}/log _text)
  string(JSON _count LENGTH "${_text}")
  set(_output "${_out}" PARENT_SCOPE)
  set(_log "${_text}" PARENT_SCOPE)
  set(_entries ${_count} PARENT_SCOPE)
endfunction()
