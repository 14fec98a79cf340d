# Included by the example tests' scripts: sets FASHION_MNIST_FOUND when Fashion-MNIST is installed
# ($KUSARI_DATASET_ROOT/fashion-mnist or /usr/share/datasets/fashion-mnist) and otherwise prints
# "SKIP: Fashion-MNIST ..." (the tests' SKIP_REGULAR_EXPRESSION reports them as skipped).
set(_data_dirs /usr/share/datasets/fashion-mnist)
if(DEFINED ENV{KUSARI_DATASET_ROOT})
  list(PREPEND _data_dirs $ENV{KUSARI_DATASET_ROOT}/fashion-mnist)
endif()
set(FASHION_MNIST_FOUND FALSE)
foreach(_dir ${_data_dirs})
  if(EXISTS ${_dir}/train-images-idx3-ubyte OR EXISTS ${_dir}/train-images-idx3-ubyte.gz)
    set(FASHION_MNIST_FOUND TRUE)
  endif()
endforeach()
if(NOT FASHION_MNIST_FOUND)
  message("SKIP: Fashion-MNIST is not installed (looked in ${_data_dirs})")
endif()
