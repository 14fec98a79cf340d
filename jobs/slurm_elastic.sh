#!/bin/bash
# Slurm job: data-parallel MNIST that goes on when a node is lost (kusari-run, docs/elastic.md).
# It asks for one node more than the job needs: kusari-run starts on every node and, when a node
# (or a process) is lost, restarts from the newest complete snapshot on the nodes that are left,
# down to "every node but one". Keep --no-kill so that Slurm leaves the job alive when a node fails.
# Submit from the folder the results should go to:   sbatch jobs/slurm_elastic.sh
# Edit the resource lines and, once, $KUSARI_SHARED/env.sh (see jobs/env.sh, docs/cluster.md).
#SBATCH --job-name=kusari-mnist-elastic
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=2
#SBATCH --gpus-per-node=2
#SBATCH --cpus-per-task=8
#SBATCH --no-kill
#SBATCH --time=01:00:00
# Site-specific: the partition (queue) and the account (group) (remove one '#' to use them).
##SBATCH --partition=<queue>
##SBATCH --account=<group>

set -euo pipefail
source "${KUSARI_SHARED:-/lustre/$(id -ng)/$USER}/env.sh"
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-${OMP_NUM_THREADS:-1}}

out="result_${SLURM_JOB_ID:-local}"
mkdir -p "$out"
per_node=${SLURM_NTASKS_PER_NODE:-2}
# One line per node of the job, "node slots=<processes per node>" (Open MPI's host file).
scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname)}" | sed "s/\$/ slots=$per_node/" > "$out/hosts"
nodes=$(wc -l < "$out/hosts")
most=$(( nodes * per_node ))
least=$(( (nodes > 1 ? nodes - 1 : 1) * per_node ))
# Every mpiexec argument for the environment, one --mpiexec-arg each.
mpiexec_args=()
for a in "${KUSARI_MPIEXEC_ENV[@]}" --map-by "ppr:$per_node:node"; do mpiexec_args+=("--mpiexec-arg=$a"); done
kusari-run -n "$least:$most" --hostfile "$out/hosts" --max-restarts 3 --hang-timeout 300 \
  --heartbeat-dir "$out/.kusari-run" "${mpiexec_args[@]}" -- \
  train_mnist --gpu --communicator pure_nccl --elastic --snapshot-interval 200 --out "$out" -r "$out"
