#!/bin/bash
# Plain mpiexec with a hostfile, for clusters without a batch system (or a few workstations).
#   jobs/hostfile.sh hosts.txt [train_mnist arguments...]
# hosts.txt lists one host per line, e.g. "node1 slots=4" (Open MPI syntax). Every host needs
# the same install path (a shared file system or an identical copy) and password-less ssh.
set -euo pipefail
hostfile=${1:?usage: jobs/hostfile.sh HOSTFILE [train_mnist arguments...]}
shift
KUSARI_PREFIX=${KUSARI_PREFIX:-$HOME/kusari}
export LD_LIBRARY_PATH="$KUSARI_PREFIX/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
nprocs=$(awk '/^[^#]/ { n = 1; for (i = 2; i <= NF; ++i) if ($i ~ /^slots=/) { split($i, a, "="); n = a[2] } s += n } END { print s }' "$hostfile")
mpiexec -n "$nprocs" --hostfile "$hostfile" -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x KUSARI_DATASET_ROOT \
  "$KUSARI_PREFIX/bin/train_mnist" "$@"
