#!/usr/bin/env bash
# Sets kusari up (packages, configure, build) and runs every test, the multi-process ones under
# mpiexec included. Arguments are passed to setup.sh.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${KUSARI_BUILD_DIR:-$here/build}
# (KUSARI_CHECK_ARGS: the arguments are setup.sh's to judge)
if [ "${KUSARI_CHECK_ARGS:-0}" != 0 ]; then exec "$here/scripts/setup.sh" "$@"; fi
"$here/scripts/setup.sh" "$@"

# OpenMPI refuses to start as root unless told that it is on purpose (containers, CI).
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)"
