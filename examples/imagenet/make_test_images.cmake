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
file(REMOVE_RECURSE ${OUT})
include(${CMAKE_CURRENT_LIST_DIR}/../mnist/fashion_mnist.cmake)  # sets FASHION_MNIST_FOUND
if(NOT FASHION_MNIST_FOUND)
  return()
endif()
execute_process(COMMAND ${MAKE_IMAGE_FOLDER} --out ${OUT} --size ${SIZE} --train ${TRAIN}
                        --val ${VAL} RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "make_image_folder failed (exit status ${_rc})")
endif()
