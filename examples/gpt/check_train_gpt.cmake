# Writes a small generated corpus, runs train_gpt on it and fails unless it exits with 0, its
# first logged training loss is above MIN_FIRST (near a guess: log 256 = 5.5 for bytes) and its
# last validation loss is below MAX_LAST, which only learning reaches (the example's CTest). With
# GENERATE, the output must also hold a sample after the prompt.
#
#   cmake -DTRAIN_GPT=<program> -DOUT=<dir> -DMIN_FIRST=3 -DMAX_LAST=1.2
#         [-DMPIEXEC=<mpiexec> -DNP=2 -DMPI_FLAGS=<flags separated by |>]
#         -DARGS=<train_gpt flags separated by |> -P check_train_gpt.cmake
foreach(_var TRAIN_GPT OUT MIN_FIRST MAX_LAST)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_train_gpt: -D${_var}=... is required")
  endif()
endforeach()

# The corpus: sentences built from a few words by a fixed rule, so its next byte is predictable
# from the bytes before it (far below a guess) but not from a byte's frequency alone.
set(_animals cat dog bird fish fox)
set(_verbs sees likes follows)
set(_text "")
foreach(_i RANGE 0 149)
  math(EXPR _a "${_i} % 5")
  math(EXPR _v "(${_i} / 5) % 3")
  math(EXPR _b "(${_i} * 2 + 1) % 5")
  list(GET _animals ${_a} _subject)
  list(GET _verbs ${_v} _verb)
  list(GET _animals ${_b} _object)
  string(APPEND _text "the ${_subject} ${_verb} the ${_object}.\n")
endforeach()
file(MAKE_DIRECTORY ${OUT}_data)
file(WRITE ${OUT}_data/corpus.txt "${_text}")

include(${CMAKE_CURRENT_LIST_DIR}/../run_example.cmake)
kusari_run_example(${TRAIN_GPT} ${OUT} --text ${OUT}_data/corpus.txt)
string(JSON _first GET "${_log}" 0 "main/loss")
math(EXPR _last "${_entries} - 1")
set(_val "")
foreach(_i RANGE ${_last})
  string(JSON _v ERROR_VARIABLE _missing GET "${_log}" ${_i} "validation/main/loss")
  if(NOT _missing)
    set(_val ${_v})
  endif()
endforeach()
message("first training loss ${_first}, last validation loss ${_val}")
if(_val STREQUAL "")
  message(FATAL_ERROR "${OUT}/log has no validation/main/loss")
endif()
if(NOT _first GREATER MIN_FIRST)
  message(FATAL_ERROR "the first training loss ${_first} is not above ${MIN_FIRST}: the model did not start from a guess")
endif()
if(NOT _val LESS MAX_LAST)
  message(FATAL_ERROR "the last validation loss ${_val} is not below ${MAX_LAST}")
endif()
string(JSON _tps GET "${_log}" ${_last} "tokens/s")
if(NOT _tps GREATER 0)
  message(FATAL_ERROR "the log's tokens/s is ${_tps}")
endif()
if(DEFINED GENERATE AND NOT _output MATCHES "---- sample [^\n]*\nthe ")
  message(FATAL_ERROR "no sample after the prompt 'the ' in the output")
endif()
if(NOT EXISTS ${OUT}/gpt.npz)
  message(FATAL_ERROR "train_gpt wrote no ${OUT}/gpt.npz")
endif()
