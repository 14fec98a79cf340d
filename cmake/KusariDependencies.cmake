# Finds the libraries kusari builds on and sets KUSARI_HAVE_<X> for each optional one.
# Every dependency comes from the distribution's packages (scripts/setup.sh installs them);
# an install prefix holding them can be given with -DCMAKE_PREFIX_PATH=<prefix>.

set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)

# --- BLAS (CPU GEMM): OpenBLAS preferred, any CBLAS accepted -----------------
add_library(kusari_blas INTERFACE)
find_package(OpenBLAS CONFIG QUIET)
# A relocated package (unpacked under a prefix) can carry a config with absolute paths that
# do not exist here; then search for the files instead.
if(OpenBLAS_FOUND AND NOT EXISTS "${OpenBLAS_LIBRARIES}")
  set(OpenBLAS_FOUND FALSE)
endif()
if(OpenBLAS_FOUND)
  target_include_directories(kusari_blas INTERFACE ${OpenBLAS_INCLUDE_DIRS})
  target_link_libraries(kusari_blas INTERFACE ${OpenBLAS_LIBRARIES})
  target_compile_definitions(kusari_blas INTERFACE KUSARI_BLAS_OPENBLAS=1)
  set(KUSARI_BLAS_NAME "OpenBLAS ${OpenBLAS_VERSION}")
else()
  find_path(KUSARI_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas openblas-pthread x86_64-linux-gnu)
  find_library(KUSARI_OPENBLAS_LIB NAMES openblas)
  if(KUSARI_CBLAS_INCLUDE AND KUSARI_OPENBLAS_LIB)
    target_include_directories(kusari_blas INTERFACE ${KUSARI_CBLAS_INCLUDE})
    target_link_libraries(kusari_blas INTERFACE ${KUSARI_OPENBLAS_LIB})
    target_compile_definitions(kusari_blas INTERFACE KUSARI_BLAS_OPENBLAS=1)
    set(KUSARI_BLAS_NAME "OpenBLAS")
  else()
    find_package(BLAS REQUIRED)
    if(NOT KUSARI_CBLAS_INCLUDE)
      message(FATAL_ERROR "kusari needs a CBLAS header (cblas.h); install libopenblas-dev (scripts/setup.sh does)")
    endif()
    target_include_directories(kusari_blas INTERFACE ${KUSARI_CBLAS_INCLUDE})
    target_link_libraries(kusari_blas INTERFACE BLAS::BLAS)
    set(KUSARI_BLAS_NAME "BLAS")
  endif()
endif()

# --- OpenMP -----------------------------------------------------------------
find_package(OpenMP QUIET COMPONENTS CXX)
set(KUSARI_HAVE_OPENMP ${OpenMP_CXX_FOUND})

# --- oneDNN (CPU convolution) -------------------------------------------------
set(KUSARI_HAVE_DNNL OFF)
if(NOT KUSARI_WITH_DNNL STREQUAL "OFF")
  find_package(dnnl CONFIG QUIET)
  if(dnnl_FOUND)
    set(KUSARI_HAVE_DNNL ON)
  elseif(KUSARI_WITH_DNNL STREQUAL "ON")
    message(FATAL_ERROR "KUSARI_WITH_DNNL=ON but oneDNN was not found (install libdnnl-dev)")
  endif()
endif()

# --- nlohmann-json (LogReport's JSON log, summaries' key lists in snapshots) ----------
find_package(nlohmann_json 3 REQUIRED)

# --- zlib (gzip MNIST files), libzip (npz), cairo (PlotReport) ----------------
find_package(ZLIB REQUIRED)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(LIBZIP QUIET IMPORTED_TARGET libzip>=1.6)
endif()
if(NOT LIBZIP_FOUND)
  # No pkg-config, or packages unpacked into a prefix whose .pc files name another prefix
  # (scripts/prefix_from_debs.sh): look for the files themselves.
  find_path(KUSARI_LIBZIP_INCLUDE_DIR zip.h)
  find_path(KUSARI_LIBZIP_CONF_DIR zipconf.h PATH_SUFFIXES x86_64-linux-gnu aarch64-linux-gnu)
  find_library(KUSARI_LIBZIP_LIBRARY zip)
  if(NOT KUSARI_LIBZIP_INCLUDE_DIR OR NOT KUSARI_LIBZIP_CONF_DIR OR NOT KUSARI_LIBZIP_LIBRARY)
    message(FATAL_ERROR "kusari needs libzip (npz files): install libzip-dev (scripts/setup.sh does)")
  endif()
  add_library(PkgConfig::LIBZIP INTERFACE IMPORTED)
  set_target_properties(PkgConfig::LIBZIP PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${KUSARI_LIBZIP_INCLUDE_DIR};${KUSARI_LIBZIP_CONF_DIR}"
    INTERFACE_LINK_LIBRARIES "${KUSARI_LIBZIP_LIBRARY}")
  set(LIBZIP_VERSION "(found at ${KUSARI_LIBZIP_LIBRARY})")
endif()
# cairo draws PlotReport's plots. A site without it (and without root to install it) can still
# build kusari: PlotReport then says once that it draws nothing.
set(KUSARI_WITH_CAIRO "AUTO" CACHE STRING "Draw PlotReport's plots with cairo: ON, OFF or AUTO")
set_property(CACHE KUSARI_WITH_CAIRO PROPERTY STRINGS ON OFF AUTO)
set(KUSARI_HAVE_CAIRO OFF)
if(NOT KUSARI_WITH_CAIRO STREQUAL "OFF" AND PkgConfig_FOUND)
  pkg_check_modules(CAIRO QUIET IMPORTED_TARGET cairo>=1.14)
  if(CAIRO_FOUND)
    set(KUSARI_HAVE_CAIRO ON)
  elseif(KUSARI_WITH_CAIRO STREQUAL "ON")
    message(FATAL_ERROR "KUSARI_WITH_CAIRO=ON but cairo was not found (install libcairo2-dev)")
  endif()
endif()
# --- libjpeg-turbo (TurboJPEG and jpeglib APIs) and libpng: image datasets (datasets/image.h) --
# jpeglib (find_package(JPEG), the same libjpeg-turbo) decodes windows of JPEGs, which TurboJPEG
# 2.x cannot; the image tests compare the decoder with it. libpng also lets the training tests
# decode PlotReport's PNG files.
find_package(PNG)
if(NOT PNG_FOUND)
  message(FATAL_ERROR "kusari needs libpng (image datasets): install libpng-dev (scripts/setup.sh does)")
endif()
if(PkgConfig_FOUND)
  pkg_check_modules(TURBOJPEG QUIET IMPORTED_TARGET libturbojpeg)
endif()
if(NOT TURBOJPEG_FOUND)
  find_path(KUSARI_TURBOJPEG_INCLUDE_DIR turbojpeg.h)
  find_library(KUSARI_TURBOJPEG_LIBRARY turbojpeg)
  if(NOT KUSARI_TURBOJPEG_INCLUDE_DIR OR NOT KUSARI_TURBOJPEG_LIBRARY)
    message(FATAL_ERROR "kusari needs libjpeg-turbo's TurboJPEG library (image datasets): install libturbojpeg0-dev (scripts/setup.sh does)")
  endif()
  add_library(PkgConfig::TURBOJPEG INTERFACE IMPORTED)
  set_target_properties(PkgConfig::TURBOJPEG PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${KUSARI_TURBOJPEG_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${KUSARI_TURBOJPEG_LIBRARY}")
endif()
find_package(JPEG QUIET)
if(NOT JPEG_FOUND)
  message(FATAL_ERROR "kusari needs libjpeg-turbo's jpeglib API (image datasets): install libjpeg62-turbo-dev (scripts/setup.sh does)")
endif()
# jpeglib.h includes jconfig.h, which Debian keeps in the multiarch directory beside it. FindJPEG
# names only jpeglib.h's directory; without its own jconfig.h the compiler falls back to the
# system's, and a libjpeg from another prefix (a jpeg62 build against a system's jpeg8 header)
# fails at run time with "Wrong JPEG library version" or corrupt decompressor structs.
find_path(KUSARI_JCONFIG_DIR jconfig.h
  PATHS "${JPEG_INCLUDE_DIR}/${CMAKE_LIBRARY_ARCHITECTURE}" "${JPEG_INCLUDE_DIR}" NO_DEFAULT_PATH)
if(KUSARI_JCONFIG_DIR)
  set_property(TARGET JPEG::JPEG APPEND PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${KUSARI_JCONFIG_DIR}")
endif()

# --- MPI (kusari_mn) ---------------------------------------------------------
find_package(MPI QUIET COMPONENTS CXX)
set(KUSARI_HAVE_MPI ${MPI_CXX_FOUND})

# --- CUDA, cuBLAS, cuDNN, NCCL -------------------------------------------------
set(KUSARI_HAVE_CUDA OFF)
set(KUSARI_HAVE_NCCL OFF)
if(NOT KUSARI_WITH_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # sm_90 machine code for Hopper plus compute_90 PTX so newer chips can JIT it.
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER)
      set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
    endif()
    # One CUDA runtime per process: the shared one, which cuBLAS, cuDNN and NCCL use too.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    # CMake < 3.26 does not know nvcc's C++20 flag (nvcc >= 12 has it); without it the CUDA20
    # dialect request below is rejected at generate time.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    find_package(CUDNN)
    if(CUDNN_FOUND)
      set(KUSARI_HAVE_CUDA ON)
      add_library(kusari_cudnn INTERFACE)
      target_include_directories(kusari_cudnn INTERFACE ${CUDNN_INCLUDE_DIR})
      target_link_libraries(kusari_cudnn INTERFACE ${CUDNN_LIBRARY})
    elseif(KUSARI_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "KUSARI_WITH_CUDA=ON but cuDNN was not found")
    endif()
    find_package(NCCL)
    if(NCCL_FOUND)
      set(KUSARI_HAVE_NCCL ON)
      add_library(kusari_nccl INTERFACE)
      target_include_directories(kusari_nccl INTERFACE ${NCCL_INCLUDE_DIR})
      target_link_libraries(kusari_nccl INTERFACE ${NCCL_LIBRARY})
    endif()
  elseif(KUSARI_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KUSARI_WITH_CUDA=ON but no CUDA compiler was found")
  endif()
endif()

# Values for config.h.in (#cmakedefine01 wants 0/1 variables).
foreach(_dep CUDA NCCL DNNL OPENMP MPI)
  if(KUSARI_HAVE_${_dep})
    set(KUSARI_HAVE_${_dep} ON)
  else()
    set(KUSARI_HAVE_${_dep} OFF)
  endif()
endforeach()
