#!/bin/bash
# PBS Pro job: data-parallel MNIST on 2 nodes x 4 GPUs, one process per GPU.
# Submit from the folder the results should go to:   qsub jobs/pbs.sh
# Edit the resource line and KUSARI_PREFIX (the shared install, see docs/cluster.md).
#PBS -N kusari-mnist
#PBS -l select=2:ncpus=16:mpiprocs=4:ngpus=4
#PBS -l walltime=01:00:00
#PBS -j oe

set -euo pipefail
cd "${PBS_O_WORKDIR:-.}"
KUSARI_PREFIX=${KUSARI_PREFIX:-$HOME/kusari}
export LD_LIBRARY_PATH="$KUSARI_PREFIX/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

nprocs=$(wc -l < "$PBS_NODEFILE")   # one line per MPI process (mpiprocs per node)
# Open MPI: place 4 processes per node; each uses the GPU of its rank within the node.
mpiexec -n "$nprocs" --hostfile "$PBS_NODEFILE" --map-by ppr:4:node \
  -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x KUSARI_DATASET_ROOT \
  "$KUSARI_PREFIX/bin/train_mnist" --gpu --communicator pure_nccl --out "result_${PBS_JOBID:-local}"
