# Finds NCCL: sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY.
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_ROOT
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl
  HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_ROOT
  PATH_SUFFIXES lib lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL DEFAULT_MSG NCCL_LIBRARY NCCL_INCLUDE_DIR)
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
