#!/bin/bash
# Plain mpiexec with a hostfile, for clusters without a batch system (or a few workstations).
#   jobs/hostfile.sh hosts.txt [train_mnist arguments...]
# hosts.txt lists one host per line, e.g. "node1 slots=2" (Open MPI syntax); while debugging
# start with 1x2 or 2x2 (hosts x GPUs). Every host needs the install at the same path (the
# shared file system, see jobs/env.sh and docs/cluster.md) and password-less ssh.
set -euo pipefail
hostfile=${1:?usage: jobs/hostfile.sh HOSTFILE [train_mnist arguments...]}
shift
source "${KUSARI_SHARED:-/lustre/$(id -ng)/$USER}/env.sh"
nprocs=$(awk '/^[^#]/ { n = 1; for (i = 2; i <= NF; ++i) if ($i ~ /^slots=/) { split($i, a, "="); n = a[2] } s += n } END { print s }' "$hostfile")
mpiexec -n "$nprocs" --hostfile "$hostfile" "${KUSARI_MPIEXEC_ENV[@]}" train_mnist "$@"
