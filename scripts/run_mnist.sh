#!/usr/bin/env bash
# The main job: sets kusari up (packages, build) and trains the MNIST example data-parallel
# under mpiexec, on CPUs by default or one process per GPU with --gpu.
#
#   scripts/run_mnist.sh                  2 processes on CPUs ("naive" communicator)
#   scripts/run_mnist.sh --gpu            one process per GPU ("pure_nccl")
#   scripts/run_mnist.sh --no-deps        skip the package step (as scripts/setup.sh --no-deps)
#   scripts/run_mnist.sh -- -e 5 -u 500   everything after -- goes to train_mnist
#   KUSARI_NP=4 scripts/run_mnist.sh      another number of processes
#
# It builds only what it runs: the libraries and train_mnist (scripts/test.sh builds the rest).
# The data is Fashion-MNIST (Debian's dataset-fashion-mnist); `-- --data DIR` trains on the
# MNIST digits' IDX files in DIR instead. Results (log, plots, snapshot, the trained model
# mlp.npz) go to ./result.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${KUSARI_BUILD_DIR:-$here/build}

gpu=0
setup_args=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu=1 ;;
    --no-deps) setup_args+=(--no-deps) ;;
    --) shift; extra=("$@"); break ;;
    *) echo "run_mnist.sh: unknown argument '$1' (expected --gpu, --no-deps, or -- followed by train_mnist flags)" >&2; exit 2 ;;
  esac
  shift
done
program="$build_dir/examples/mnist/train_mnist"
if [ "${KUSARI_CHECK_ARGS:-0}" != 0 ]; then
  # The documentation's commands are checked this way: the flags are train_mnist's to judge.
  [ -x "$program" ] || { echo "run_mnist.sh: $program is not built; run scripts/run_mnist.sh once" >&2; exit 1; }
  if [ "$gpu" = 1 ]; then exec "$program" --gpu --communicator pure_nccl "${extra[@]}"; fi
  exec "$program" "${extra[@]}"
fi

setup_args+=(--target train_mnist)
if [ "$gpu" = 1 ]; then setup_args+=(--target kusari_gpu_libraries); fi
"$here/scripts/setup.sh" "${setup_args[@]}"

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
  exec mpiexec -n "$np" "${mpi_flags[@]}" "$program" --gpu --communicator pure_nccl "${extra[@]}"
else
  np=${KUSARI_NP:-2}
  exec mpiexec -n "$np" "${mpi_flags[@]}" "$program" "${extra[@]}"
fi
