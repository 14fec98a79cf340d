# kusari's environment for jobs, sourced by every job script in jobs/ (and by you on the login
# node). Copy it next to your install on the shared file system and edit it there once:
#
#   cp jobs/env.sh /lustre/$(id -ng)/$USER/env.sh
#
# Compute nodes often cannot see $HOME: the shared parallel file system (Lustre, GPFS) is the
# home of the install, the data and the results. KUSARI_SHARED is that folder; the job scripts
# source $KUSARI_SHARED/env.sh.
export KUSARI_SHARED=${KUSARI_SHARED:-/lustre/$(id -ng)/$USER}

# Site-specific: the modules kusari was built with (a C++20 compiler, MPI, CUDA, cuDNN, NCCL).
# module load gcc openmpi cuda cudnn nccl

export KUSARI_PREFIX=${KUSARI_PREFIX:-$KUSARI_SHARED/kusari}        # cmake --install build --prefix $KUSARI_PREFIX
export KUSARI_DATASET_ROOT=${KUSARI_DATASET_ROOT:-$KUSARI_SHARED/datasets}
export PATH="$KUSARI_PREFIX/bin:$PATH"
export LD_LIBRARY_PATH="$KUSARI_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}   # keep NVLink SHARP off where the site asks for it
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# The mpiexec options that hand this environment to every process (Open MPI's -x), for the
# variables that are set (-x warns about an unset one): mpiexec "${KUSARI_MPIEXEC_ENV[@]}" ...
KUSARI_MPIEXEC_ENV=()
for _kusari_var in PATH LD_LIBRARY_PATH OMP_NUM_THREADS NCCL_NVLS_ENABLE KUSARI_DATASET_ROOT KUSARI_MN_TIMEOUT \
                   KUSARI_MN_DEBUG NCCL_DEBUG NCCL_SOCKET_IFNAME; do
  if [ -n "${!_kusari_var+x}" ]; then KUSARI_MPIEXEC_ENV+=(-x "$_kusari_var"); fi
done
unset _kusari_var
