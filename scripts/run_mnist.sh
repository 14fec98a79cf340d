#!/usr/bin/env bash
# The main job: sets kusari up (packages, build) and trains the MNIST example data-parallel
# under mpiexec, on CPUs by default or one process per GPU with --gpu.
#
#   scripts/run_mnist.sh                  2 processes on CPUs ("naive" communicator)
#   scripts/run_mnist.sh --gpu            one process per GPU ("pure_nccl")
#   scripts/run_mnist.sh -- -e 5 -u 500   everything after -- goes to train_mnist
#   KUSARI_NP=4 scripts/run_mnist.sh      another number of processes
#
# Results (log, plots, snapshot) go to ./result.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${KUSARI_BUILD_DIR:-$here/build}

gpu=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu=1 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "run_mnist.sh: unknown argument '$1' (expected --gpu, or -- followed by train_mnist flags)" >&2; exit 2 ;;
  esac
  shift
done

"$here/scripts/setup.sh"

if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mpi_flags=()
if mpiexec --version 2>&1 | grep -q -E "Open MPI|OpenRTE"; then
  mpi_flags+=(--oversubscribe)
fi

if [ "$gpu" = 1 ]; then
  ngpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
  if [ "${ngpus:-0}" -lt 1 ]; then
    echo "run_mnist.sh: --gpu given but no GPU is visible (nvidia-smi -L lists none)" >&2
    exit 1
  fi
  np=${KUSARI_NP:-$ngpus}
  export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
  exec mpiexec -n "$np" "${mpi_flags[@]}" "$build_dir/examples/mnist/train_mnist" --gpu --communicator pure_nccl \
    "${extra[@]}"
else
  np=${KUSARI_NP:-2}
  exec mpiexec -n "$np" "${mpi_flags[@]}" "$build_dir/examples/mnist/train_mnist" "${extra[@]}"
fi
