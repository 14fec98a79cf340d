#!/bin/bash
# PBS Pro job: data-parallel MNIST that goes on when a node is lost (kusari-run, docs/elastic.md).
# It asks for one node more than the job needs: kusari-run starts on every node and, when a node
# (or a process) is lost, restarts from the newest complete snapshot on the nodes that are left,
# down to "every node but one".
# Submit from the folder the results should go to:   qsub jobs/pbs_elastic.sh
# Edit the resource lines and, once, $KUSARI_SHARED/env.sh (see jobs/env.sh, docs/cluster.md).
#PBS -N kusari-mnist-elastic
#PBS -l select=3:ncpus=16:mpiprocs=2:ompthreads=8:ngpus=2
#PBS -l walltime=01:00:00
#PBS -j oe
# Site-specific: the queue and the group the job is charged to (remove one '#' to use them).
##PBS -q <queue>
##PBS -W group_list=<group>

set -euo pipefail
cd "${PBS_O_WORKDIR:-.}"
source "${KUSARI_SHARED:-/lustre/$(id -ng)/$USER}/env.sh"

out="result_${PBS_JOBID:-local}"
mkdir -p "$out"
# $PBS_NODEFILE has one line per MPI process: "node slots=<processes on it>" per node.
sort "$PBS_NODEFILE" | uniq -c | awk '{ print $2 " slots=" $1 }' > "$out/hosts"
nodes=$(wc -l < "$out/hosts")
most=$(wc -l < "$PBS_NODEFILE")
per_node=$(( most / nodes ))
least=$(( (nodes > 1 ? nodes - 1 : 1) * per_node ))
mpiexec_args=()
for a in "${KUSARI_MPIEXEC_ENV[@]}" --map-by "ppr:$per_node:node"; do mpiexec_args+=("--mpiexec-arg=$a"); done
kusari-run -n "$least:$most" --hostfile "$out/hosts" --max-restarts 3 --hang-timeout 300 \
  --heartbeat-dir "$out/.kusari-run" "${mpiexec_args[@]}" -- \
  train_mnist --gpu --communicator pure_nccl --elastic --snapshot-interval 200 --out "$out" -r "$out"
