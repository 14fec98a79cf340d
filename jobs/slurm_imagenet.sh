#!/bin/bash
# Slurm job: data-parallel ResNet-50 on ImageNet, one task per GPU. While debugging start with
# 1x2 or 2x2 (nodes x GPUs), then raise the node count.
# Submit from the folder the results should go to:   sbatch jobs/slurm_imagenet.sh
# Edit the resource lines, $KUSARI_SHARED/env.sh once (see jobs/env.sh, docs/cluster.md), and
# IMAGENET (a folder with train/ and val/, one subfolder per class, on the shared file system;
# the nodes have no internet: prepare it beforehand, see docs/imagenet.md).
# Submitting the same script again continues from the last checkpoint (--checkpoint-interval).
#SBATCH --job-name=kusari-imagenet
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
# Site-specific: the partition (queue) and the account (group) (remove one '#' to use them).
##SBATCH --partition=<queue>
##SBATCH --account=<group>

set -euo pipefail
source "${KUSARI_SHARED:-/lustre/$(id -ng)/$USER}/env.sh"
IMAGENET=${IMAGENET:-$KUSARI_DATASET_ROOT/imagenet}
loaders=${SLURM_CPUS_PER_TASK:-8}   # the task's cores decode and augment the images
export OMP_NUM_THREADS=1

# srun starts the MPI processes itself (PMIx); use `mpiexec "${KUSARI_MPIEXEC_ENV[@]}" ...`
# instead if your site's MPI was not built with Slurm support.
srun --mpi=pmix train_imagenet "$IMAGENET/train" "$IMAGENET/val" \
  --arch resnet50 --gpu --communicator pure_nccl --dtype bfloat16 --channels-last \
  -B 64 -j "$loaders" --checkpoint-interval 1000 --out result_imagenet
