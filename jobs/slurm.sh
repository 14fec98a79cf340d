#!/bin/bash
# Slurm job: data-parallel MNIST, one task per GPU. While debugging start with 1x2 or 2x2 (nodes
# x GPUs), then raise the node count; keep the GPUs per node at what a node has.
# Submit from the folder the results should go to:   sbatch jobs/slurm.sh
# Edit the resource lines and, once, $KUSARI_SHARED/env.sh (see jobs/env.sh, docs/cluster.md).
#SBATCH --job-name=kusari-mnist
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=8
#SBATCH --time=01:00:00
# Site-specific: the partition (queue) and the account (group) (remove one '#' to use them).
##SBATCH --partition=<queue>
##SBATCH --account=<group>

set -euo pipefail
source "${KUSARI_SHARED:-/lustre/$(id -ng)/$USER}/env.sh"
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-${OMP_NUM_THREADS:-1}}

# srun starts the MPI processes itself (PMIx) and hands them this environment; use
# `mpiexec "${KUSARI_MPIEXEC_ENV[@]}" train_mnist ...` instead if your site's MPI was not built
# with Slurm support.
srun --mpi=pmix train_mnist --gpu --communicator pure_nccl --out "result_${SLURM_JOB_ID:-local}"
