# train_imagenet --help lists each argument once: the image sets as the two positionals (their
# --train/--val spellings work but stay out of the help).
#   cmake -DPROGRAM=... -P check_help.cmake
execute_process(COMMAND ${PROGRAM} --help RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err TIMEOUT 60)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} --help exited ${_rc}:\n${_out}${_err}")
endif()
foreach(_word "train TEXT" "val TEXT")
  string(REGEX MATCHALL "${_word}" _hits "${_out}")
  list(LENGTH _hits _n)
  if(NOT _n EQUAL 1)
    message(FATAL_ERROR "--help lists '${_word}' ${_n} times, expected once:\n${_out}")
  endif()
endforeach()
if(_out MATCHES "--train TEXT" OR _out MATCHES "--val TEXT")
  message(FATAL_ERROR "--help lists --train/--val beside the positionals:\n${_out}")
endif()
