#!/bin/bash
# PBS Pro job: data-parallel ResNet-50 on ImageNet, 2 nodes x 4 GPUs, one process per GPU.
# Submit from the folder the results should go to:   qsub jobs/pbs_imagenet.sh
# Edit the resource line, KUSARI_PREFIX (the shared install, see docs/cluster.md) and
# IMAGENET (a folder with train/ and val/, one subfolder per class, on a shared file system;
# the nodes have no internet: prepare it beforehand, see docs/imagenet.md).
# Submitting the same script again continues from the last checkpoint (--checkpoint-interval).
#PBS -N kusari-imagenet
#PBS -l select=2:ncpus=32:mpiprocs=4:ngpus=4
#PBS -l walltime=24:00:00
#PBS -j oe

set -euo pipefail
cd "${PBS_O_WORKDIR:-.}"
KUSARI_PREFIX=${KUSARI_PREFIX:-$HOME/kusari}
IMAGENET=${IMAGENET:-$HOME/data/imagenet}
export LD_LIBRARY_PATH="$KUSARI_PREFIX/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}

nprocs=$(wc -l < "$PBS_NODEFILE")   # one line per MPI process (mpiprocs per node)
# Open MPI: place 4 processes per node; each uses the GPU of its rank within the node and
# 8 loader threads (32 cores / 4 processes).
mpiexec -n "$nprocs" --hostfile "$PBS_NODEFILE" --map-by ppr:4:node \
  -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE \
  "$KUSARI_PREFIX/bin/train_imagenet" "$IMAGENET/train" "$IMAGENET/val" \
  --arch resnet50 --gpu --communicator pure_nccl --dtype bfloat16 --channels-last \
  -B 64 -j 8 --checkpoint-interval 1000 --out result_imagenet
