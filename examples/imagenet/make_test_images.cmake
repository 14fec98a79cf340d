# The fixture of the train_imagenet tests: an ImageNet-layout JPEG folder (train/ and val/, one
# folder per class) made from Fashion-MNIST by make_image_folder.
#
#   cmake -DMAKE_IMAGE_FOLDER=<program> -DOUT=<dir> -DSIZE=32 -DTRAIN=2000 -DVAL=500
#         -P make_test_images.cmake
#
# Without Fashion-MNIST ($KUSARI_DATASET_ROOT/fashion-mnist or /usr/share/datasets/fashion-mnist)
# it prints "SKIP:" and exits 0, writing nothing; the tests that use the folder then skip too.
foreach(_var MAKE_IMAGE_FOLDER OUT SIZE TRAIN VAL)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "make_test_images: -D${_var}=... is required")
  endif()
endforeach()
set(_data_dirs /usr/share/datasets/fashion-mnist)
if(DEFINED ENV{KUSARI_DATASET_ROOT})
  list(PREPEND _data_dirs $ENV{KUSARI_DATASET_ROOT}/fashion-mnist)
endif()
set(_found FALSE)
foreach(_dir ${_data_dirs})
  if(EXISTS ${_dir}/train-images-idx3-ubyte OR EXISTS ${_dir}/train-images-idx3-ubyte.gz)
    set(_found TRUE)
  endif()
endforeach()
file(REMOVE_RECURSE ${OUT})
if(NOT _found)
  message("SKIP: Fashion-MNIST is not installed (looked in ${_data_dirs})")
  return()
endif()
execute_process(COMMAND ${MAKE_IMAGE_FOLDER} --out ${OUT} --size ${SIZE} --train ${TRAIN}
                        --val ${VAL} RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "make_image_folder failed (exit status ${_rc})")
endif()
