#!/bin/bash
# Slurm job: data-parallel MNIST on 2 nodes x 4 GPUs, one task per GPU.
# Submit from the folder the results should go to:   sbatch jobs/slurm.sh
# Edit the resource lines and KUSARI_PREFIX (the shared install, see docs/cluster.md).
#SBATCH --job-name=kusari-mnist
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=4
#SBATCH --time=01:00:00

set -euo pipefail
KUSARI_PREFIX=${KUSARI_PREFIX:-$HOME/kusari}
export LD_LIBRARY_PATH="$KUSARI_PREFIX/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}

# srun starts the MPI processes itself (PMIx); use `mpiexec` instead if your site's MPI was
# not built with Slurm support.
srun --mpi=pmix "$KUSARI_PREFIX/bin/train_mnist" --gpu --communicator pure_nccl --out "result_${SLURM_JOB_ID:-local}"
