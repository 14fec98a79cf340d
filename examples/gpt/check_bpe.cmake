# The GPT-2 tokenizer's algorithm on a small vocabulary written here (the test cannot count on
# GPT-2's own files): the bytes-to-characters map (a space is "Ġ"), the pre-tokenizer's pieces
# and the merges applied in rank order, every occurrence of the best pair at once.
#
#   cmake -DTRAIN_GPT=<program> -DOUT=<dir> -P check_bpe.cmake
file(MAKE_DIRECTORY ${OUT})
file(WRITE ${OUT}/encoder.json
     "{\"h\": 0, \"e\": 1, \"l\": 2, \"o\": 3, \"Ġ\": 4, \"w\": 5, \"r\": 6, \"d\": 7, \"he\": 8, \"ll\": 9, \"hell\": 10, "
     "\"hello\": 11, \"Ġw\": 12, \"Ġwor\": 13, \"or\": 14, \"!\": 15, \"ĠĠ\": 16}")
file(WRITE ${OUT}/vocab.bpe "#version: 0.2\nh e\nl l\nhe ll\nhell o\nĠ w\no r\nĠw or\nĠ Ġ\n")
# "hello" merges to one token; " world" to " wor", "l", "d"; "!" stays; of the three spaces
# before "hello" the first two form one piece (the last space goes with the word).
execute_process(COMMAND ${TRAIN_GPT} --tokenizer gpt2 --bpe-dir ${OUT} --encode "hello world!   hello"
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
string(STRIP "${_out}" _out)
message("ids: ${_out} ${_err}")
if(NOT _rc EQUAL 0 OR NOT _out STREQUAL "11 13 2 7 15 16 4 11")
  message(FATAL_ERROR "expected the ids 11 13 2 7 15 16 4 11, got '${_out}' (exit status ${_rc})")
endif()
