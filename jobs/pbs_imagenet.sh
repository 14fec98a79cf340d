#!/bin/bash
# PBS Pro job: data-parallel ResNet-50 on ImageNet, one process per GPU. While debugging start
# with 1x2 or 2x2 (nodes x GPUs), then raise the node count.
# Submit from the folder the results should go to:   qsub jobs/pbs_imagenet.sh
# Edit the resource lines, $KUSARI_SHARED/env.sh once (see jobs/env.sh, docs/cluster.md), and
# IMAGENET (a folder with train/ and val/, one subfolder per class, on the shared file system;
# the nodes have no internet: prepare it beforehand, see docs/imagenet.md).
# Submitting the same script again continues from the last checkpoint (--checkpoint-interval).
#PBS -N kusari-imagenet
#PBS -l select=2:ncpus=32:mpiprocs=4:ompthreads=8:ngpus=4
#PBS -l walltime=24:00:00
#PBS -j oe
# Site-specific: the queue and the group the job is charged to (remove one '#' to use them).
##PBS -q <queue>
##PBS -W group_list=<group>

set -euo pipefail
cd "${PBS_O_WORKDIR:-.}"
loaders=${OMP_NUM_THREADS:-8}   # (PBS sets it from ompthreads) the process's cores decode the images
source "${KUSARI_SHARED:-/lustre/$(id -ng)/$USER}/env.sh"
IMAGENET=${IMAGENET:-$KUSARI_DATASET_ROOT/imagenet}
export OMP_NUM_THREADS=1

nprocs=$(wc -l < "$PBS_NODEFILE")   # one line per MPI process (mpiprocs per node)
per_node=$(( nprocs / $(sort -u "$PBS_NODEFILE" | wc -l) ))
mpiexec -n "$nprocs" --hostfile "$PBS_NODEFILE" --map-by "ppr:$per_node:node" "${KUSARI_MPIEXEC_ENV[@]}" \
  train_imagenet "$IMAGENET/train" "$IMAGENET/val" \
  --arch resnet50 --gpu --communicator pure_nccl --dtype bfloat16 --channels-last \
  -B 64 -j "$loaders" --checkpoint-interval 1000 --out result_imagenet
