#!/usr/bin/env bash
# Builds kusari on a machine where packages cannot be installed (no root, no network: a
# supercomputer's compute node, a locked-down GPU host), from Debian packages carried there.
#
# On a machine with Debian's archive:
#   scripts/prefix_from_debs.sh download <dir>     fetch the .deb files kusari's build needs
#                                                  beyond a CUDA toolkit, MPI, CMake and a compiler
# On the build machine:
#   scripts/prefix_from_debs.sh unpack <dir> <prefix>
#                                                  unpack them into <prefix> (no root needed) and
#                                                  print the CMake arguments that use it, e.g.
#   cmake -S . -B build $(scripts/prefix_from_debs.sh unpack debs /tmp/deps)
#
# The packages are unpacked, not installed: their files land under <prefix>/usr, and
# CMAKE_PREFIX_PATH, the include and library paths, and the run-time search path point there.
set -euo pipefail

# Headers and libraries for the build (BLAS, oneDNN, GoogleTest, CLI11, nlohmann-json, PCRE2, libpng,
# libzip, libjpeg-turbo), with the run-time libraries those -dev packages point to. (oneDNN's
# CMake configuration asks for OpenCL: its loader and headers come too. Without oneDNN the CPU
# backend builds, but its float32 convolutions run as im2col + GEMM, several times slower.)
packages=(
  libopenblas-dev libopenblas0 libopenblas0-pthread libopenblas-pthread-dev libgfortran5
  libdnnl-dev libdnnl2 ocl-icd-opencl-dev ocl-icd-libopencl1 opencl-c-headers opencl-clhpp-headers
  libgtest-dev googletest
  libcli11-dev nlohmann-json3-dev
  libpcre2-dev libpcre2-8-0  # GPT-2's tokenizer in examples/gpt
  libpng-dev libpng16-16 zlib1g-dev zlib1g
  libzip-dev libzip4
  libturbojpeg0-dev libturbojpeg0 libjpeg62-turbo-dev libjpeg62-turbo
  pybind11-dev libdlpack-dev  # the Python package (header-only; the machine's Python, NumPy and headers)
)

cmd=${1:-}
if [ "${KUSARI_CHECK_ARGS:-0}" != 0 ]; then  # (the docs' commands are checked so)
  case "$cmd:$#" in
    download:2 | unpack:3) echo "prefix_from_debs.sh: arguments accepted"; exit 0 ;;
    *) echo "usage: prefix_from_debs.sh download <dir> | unpack <dir> <prefix>" >&2; exit 2 ;;
  esac
fi
case "$cmd" in
  download)
    dir=${2:?usage: prefix_from_debs.sh download <dir>}
    mkdir -p "$dir"
    (cd "$dir" && apt-get download "${packages[@]}" >/dev/null)
    ls "$dir"/*.deb | wc -l | xargs echo "prefix_from_debs.sh: .deb files in $dir:" >&2
    ;;
  unpack)
    dir=${2:?usage: prefix_from_debs.sh unpack <dir> <prefix>}
    prefix=${3:?usage: prefix_from_debs.sh unpack <dir> <prefix>}
    mkdir -p "$prefix"
    for deb in "$dir"/*.deb; do dpkg -x "$deb" "$prefix"; done
    # Some -dev packages hold absolute links (libz.so -> /lib/.../libz.so.1.2.13): point them
    # into the prefix, so the linker finds the carried library and not a missing file.
    find "$prefix" -type l -lname '/*' | while read -r link; do
      target=$(readlink "$link")
      [ -e "$prefix$target" ] && ln -sfn "$prefix$target" "$link"
    done
    usr="$prefix/usr"
    multiarch="$usr/lib/x86_64-linux-gnu"
    # Debian's alternatives are not set up by dpkg -x: name OpenBLAS's library and header.
    blas_lib=$(ls "$multiarch"/openblas-pthread/libopenblas.so* 2>/dev/null | head -n 1 || true)
    [ -n "$blas_lib" ] && ln -sf "$blas_lib" "$multiarch/libopenblas.so"
    [ -e "$multiarch/libopenblas.so.0" ] || { [ -n "$blas_lib" ] && ln -sf "$blas_lib" "$multiarch/libopenblas.so.0"; }
    echo "-DCMAKE_PREFIX_PATH=$usr" \
         "-DCMAKE_INCLUDE_PATH=$usr/include;$usr/include/x86_64-linux-gnu;$usr/include/x86_64-linux-gnu/openblas-pthread" \
         "-DCMAKE_LIBRARY_PATH=$multiarch;$multiarch/openblas-pthread" \
         "-DKUSARI_GTEST_SOURCE_DIR=$usr/src/googletest" \
         "-DCMAKE_BUILD_RPATH=$multiarch;$multiarch/openblas-pthread"
    ;;
  *)
    echo "usage: prefix_from_debs.sh download <dir> | unpack <dir> <prefix>" >&2
    exit 2
    ;;
esac
