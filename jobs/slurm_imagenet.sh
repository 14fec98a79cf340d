#!/bin/bash
# Slurm job: data-parallel ResNet-50 on ImageNet, 2 nodes x 4 GPUs, one task per GPU.
# Submit from the folder the results should go to:   sbatch jobs/slurm_imagenet.sh
# Edit the resource lines, KUSARI_PREFIX (the shared install, see docs/cluster.md) and
# IMAGENET (a folder with train/ and val/, one subfolder per class, on a shared file system;
# the nodes have no internet: prepare it beforehand, see docs/imagenet.md).
# Submitting the same script again continues from the last checkpoint (--checkpoint-interval).
#SBATCH --job-name=kusari-imagenet
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00

set -euo pipefail
KUSARI_PREFIX=${KUSARI_PREFIX:-$HOME/kusari}
IMAGENET=${IMAGENET:-$HOME/data/imagenet}
export LD_LIBRARY_PATH="$KUSARI_PREFIX/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export OMP_NUM_THREADS=1
loaders=${SLURM_CPUS_PER_TASK:-8}   # the task's cores decode and augment the images

# srun starts the MPI processes itself (PMIx); use `mpiexec` instead if your site's MPI was
# not built with Slurm support.
srun --mpi=pmix "$KUSARI_PREFIX/bin/train_imagenet" "$IMAGENET/train" "$IMAGENET/val" \
  --arch resnet50 --gpu --communicator pure_nccl --dtype bfloat16 --channels-last \
  -B 64 -j "$loaders" --checkpoint-interval 1000 --out result_imagenet
