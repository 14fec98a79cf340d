# Runs train_dcgan for a short training and fails unless it exits with 0, its LogReport ends with
# a finite discriminator loss in [MIN_DIS_LOSS, MAX_DIS_LOSS] and a finite generator loss, it
# wrote preview/image_epoch_<N>.png for every epoch, and the last preview's pixel standard
# deviation (printed by the program) is at least MIN_STDDEV: a generator whose samples are one
# flat grey gives about 0 (the example's CTest; see CMakeLists.txt).
#
#   cmake -DTRAIN_DCGAN=<program> -DOUT=<dir> -DEPOCHS=2 -DMIN_DIS_LOSS=0.01 -DMAX_DIS_LOSS=5
#         -DMIN_STDDEV=0.03 [-DMPIEXEC=<mpiexec> -DNP=2 -DMPI_FLAGS=<flags separated by |>]
#         -DARGS=<train_dcgan flags separated by |> -P check_train_dcgan.cmake
#
# Without Fashion-MNIST it prints "SKIP:" and exits 0 (see ../mnist/fashion_mnist.cmake).
foreach(_var TRAIN_DCGAN OUT EPOCHS MIN_DIS_LOSS MAX_DIS_LOSS MIN_STDDEV)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_train_dcgan: -D${_var}=... is required")
  endif()
endforeach()

include(${CMAKE_CURRENT_LIST_DIR}/../mnist/fashion_mnist.cmake)
if(NOT FASHION_MNIST_FOUND)
  return()
endif()

include(${CMAKE_CURRENT_LIST_DIR}/../run_example.cmake)
kusari_run_example(${TRAIN_DCGAN} ${OUT} --epoch ${EPOCHS})
if(NOT _entries EQUAL EPOCHS)
  message(FATAL_ERROR "${OUT}/log has ${_entries} entries; expected one per epoch (${EPOCHS})")
endif()
math(EXPR _last "${_entries} - 1")
foreach(_key dis/loss gen/loss)
  string(JSON _value GET "${_log}" ${_last} "${_key}")
  message("${_key}: ${_value}")
  if(NOT _value MATCHES "^-?[0-9]+(\\.[0-9]*)?([eE][-+]?[0-9]+)?$")
    message(FATAL_ERROR "${_key} is not a finite number: ${_value}")
  endif()
  if(_key STREQUAL "dis/loss" AND (_value LESS MIN_DIS_LOSS OR _value GREATER MAX_DIS_LOSS))
    message(FATAL_ERROR "dis/loss ${_value} is outside [${MIN_DIS_LOSS}, ${MAX_DIS_LOSS}]")
  endif()
endforeach()

foreach(_epoch RANGE 1 ${EPOCHS})
  if(NOT EXISTS ${OUT}/preview/image_epoch_${_epoch}.png)
    message(FATAL_ERROR "train_dcgan wrote no ${OUT}/preview/image_epoch_${_epoch}.png")
  endif()
endforeach()
string(REGEX MATCHALL "image_epoch_${EPOCHS}\\.png: pixel standard deviation [0-9.]+" _stats "${_output}")
list(LENGTH _stats _count)
if(NOT _count EQUAL 1)
  message(FATAL_ERROR "train_dcgan printed no pixel standard deviation for image_epoch_${EPOCHS}.png")
endif()
string(REGEX REPLACE ".* " "" _stddev "${_stats}")
message("pixel standard deviation of the last preview: ${_stddev} (expected at least ${MIN_STDDEV})")
if(_stddev LESS MIN_STDDEV)
  message(FATAL_ERROR "the generator's samples are nearly constant: pixel standard deviation ${_stddev} < ${MIN_STDDEV}")
endif()
