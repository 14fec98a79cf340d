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

"$build/xor_cpu"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
flags=()
if mpiexec --version 2>&1 | grep -q -E "Open MPI|OpenRTE"; then flags+=(--oversubscribe); fi
mpiexec -n 2 "${flags[@]}" "$build/mean_of_ranks"
[ "$status" = 0 ] && echo "check.sh: the installed kusari works from an out-of-tree project"
exit "$status"
