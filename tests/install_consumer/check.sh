#!/usr/bin/env bash
# Builds this out-of-tree project against the kusari installed in <prefix>, runs its programs
# (the multi-node one under mpiexec -n 2), and checks that neither program nor the libraries it
# links need a CUDA, cuDNN or NCCL library: those are loaded at run time, only for GPUs.
#
#   tests/install_consumer/check.sh <prefix> [build dir]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prefix=${1:?usage: check.sh <kusari install prefix> [build dir]}
build=${2:-$(mktemp -d /tmp/kusari-consumer.XXXXXX)}

cmake -S "$here" -B "$build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)"

status=0
for f in "$build/xor_cpu" "$build/mean_of_ranks" "$prefix"/lib*/libkusari.so "$prefix"/lib*/libkusari_mn.so; do
  [ -e "$f" ] || { echo "check.sh: $f is missing" >&2; status=1; continue; }
  gpu_libs=$(readelf -d "$f" | grep NEEDED | grep -E -o 'lib(cuda|cudart|cublas|cublasLt|cudnn|nccl)[^]]*' || true)
  if [ -n "$gpu_libs" ]; then
    echo "check.sh: $(basename "$f") needs GPU libraries at load time: $gpu_libs" >&2
    status=1
  fi
done

# The pkg-config route of docs/install.md, without CMake: the .pc files find the prefix from
# their own place, wherever the install was put.
pc_dir=$(dirname "$(ls "$prefix"/lib*/pkgconfig/kusari.pc "$prefix"/lib/*/pkgconfig/kusari.pc 2>/dev/null | head -n 1)")
[ -f "$pc_dir/kusari.pc" ] || { echo "check.sh: no kusari.pc under $prefix" >&2; exit 1; }
export PKG_CONFIG_PATH="$pc_dir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# shellcheck disable=SC2046
g++ -std=c++20 "$here/xor_cpu.cc" $(pkg-config --cflags --libs kusari) -o "$build/xor_cpu_pc"
# shellcheck disable=SC2046
g++ -std=c++20 "$here/mean_of_ranks.cc" $(pkg-config --cflags --libs kusari-mn) -o "$build/mean_of_ranks_pc"

"$build/xor_cpu"
"$build/xor_cpu_pc"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
flags=()
if mpiexec --version 2>&1 | grep -q -E "Open MPI|OpenRTE"; then flags+=(--oversubscribe); fi
mpiexec -n 2 "${flags[@]}" "$build/mean_of_ranks"
mpiexec -n 2 "${flags[@]}" "$build/mean_of_ranks_pc"
[ "$status" = 0 ] && echo "check.sh: the installed kusari works from an out-of-tree project"
exit "$status"
