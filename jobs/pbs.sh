#!/bin/bash
# PBS Pro job: data-parallel MNIST, one process per GPU. While debugging start with 1x2 or 2x2
# (nodes x GPUs), then raise the node count; keep the GPUs per node at what a node has.
# Submit from the folder the results should go to:   qsub jobs/pbs.sh
# Edit the resource lines and, once, $KUSARI_SHARED/env.sh (see jobs/env.sh, docs/cluster.md).
#PBS -N kusari-mnist
#PBS -l select=2:ncpus=16:mpiprocs=2:ompthreads=8:ngpus=2
#PBS -l walltime=01:00:00
#PBS -j oe
# Site-specific: the queue and the group the job is charged to (remove one '#' to use them).
##PBS -q <queue>
##PBS -W group_list=<group>

set -euo pipefail
cd "${PBS_O_WORKDIR:-.}"
# PBS sets OMP_NUM_THREADS from ompthreads (as Slurm's --cpus-per-task); env.sh keeps it and
# hands it to every process.
source "${KUSARI_SHARED:-/lustre/$(id -ng)/$USER}/env.sh"

nprocs=$(wc -l < "$PBS_NODEFILE")   # one line per MPI process (mpiprocs per node)
per_node=$(( nprocs / $(sort -u "$PBS_NODEFILE" | wc -l) ))
# Open MPI: the processes of a node use the GPUs of their rank within the node.
mpiexec -n "$nprocs" --hostfile "$PBS_NODEFILE" --map-by "ppr:$per_node:node" "${KUSARI_MPIEXEC_ENV[@]}" \
  train_mnist --gpu --communicator pure_nccl --out "result_${PBS_JOBID:-local}"
