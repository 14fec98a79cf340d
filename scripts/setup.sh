#!/usr/bin/env bash
# Installs kusari's build dependencies from the distribution's packages (Debian 12 / Ubuntu),
# then configures and builds kusari into build/ (or $KUSARI_BUILD_DIR).
#
#   scripts/setup.sh                      install what is missing, configure, build everything
#   scripts/setup.sh --no-deps            skip the package step (e.g. on a cluster without root)
#   scripts/setup.sh --bench              also install the peers the benchmarks compare with (PyTorch)
#   scripts/setup.sh --target train_mnist build only that program and the libraries it needs
#                                         (repeatable; the main job, scripts/run_mnist.sh, does this)
#
# Extra CMake arguments can be passed in $KUSARI_CMAKE_ARGS, e.g.
#   KUSARI_CMAKE_ARGS="-DKUSARI_WITH_CUDA=OFF" scripts/setup.sh
# Where ccache is installed (the package step installs it), every compile goes through it, so a
# second build of the same sources (another build folder, another checkout, a rebuild after
# `git checkout`) reuses the objects; KUSARI_CCACHE=0 turns that off.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${KUSARI_BUILD_DIR:-$here/build}
install_deps=1
bench=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-deps) install_deps=0 ;;
    --bench) bench=1 ;;
    --target)
      [ $# -ge 2 ] || { echo "setup.sh: --target needs a CMake target name, e.g. --target train_mnist" >&2; exit 2; }
      targets+=("$2"); shift ;;
    *) echo "setup.sh: unknown argument '$1' (expected --no-deps, --bench or --target NAME)" >&2; exit 2 ;;
  esac
  shift
done
if [ "${KUSARI_CHECK_ARGS:-0}" != 0 ]; then echo "setup.sh: arguments accepted"; exit 0; fi  # (the docs' commands are checked so)

packages=(
  build-essential cmake ninja-build pkg-config ccache
  libopenblas-dev libdnnl-dev ocl-icd-opencl-dev
  libgtest-dev
  openmpi-bin libopenmpi-dev
  zlib1g-dev libzip-dev libcairo2-dev fonts-dejavu-core libpng-dev
  libturbojpeg0-dev libjpeg62-turbo-dev
  libcli11-dev nlohmann-json3-dev libpcre2-dev
  dataset-fashion-mnist
  python3-dev python3-numpy python3-pytest pybind11-dev libdlpack-dev  # the Python package and its tests
  iproute2  # ip netns, for the multi-host test (its unshare comes with util-linux, always installed)
)
if [ "$bench" = 1 ]; then
  packages+=(python3-torch python3-torchvision python3-pil mate-backgrounds)
fi

t_start=$(date +%s)
if [ "$install_deps" = 1 ]; then
  missing=()
  for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then
      if command -v sudo >/dev/null; then sudo="sudo"; else
        echo "setup.sh: missing packages (${missing[*]}) and not root; install them or run with --no-deps" >&2
        exit 1
      fi
    fi
    echo "setup.sh: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

t_packages=$(date +%s)
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
launcher=()
if [ "${KUSARI_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  # Paths inside the checkout are hashed relative to it, so that a checkout elsewhere hits the
  # same cache; the test programs' precompiled headers need the two sloppiness settings.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$here}
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
  export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
elif [ "${KUSARI_CCACHE:-1}" = 0 ] && [ -f "$build_dir/CMakeCache.txt" ]; then
  launcher=(-UCMAKE_C_COMPILER_LAUNCHER -UCMAKE_CXX_COMPILER_LAUNCHER -UCMAKE_CUDA_COMPILER_LAUNCHER)
fi
# shellcheck disable=SC2086
cmake -S "$here" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" ${KUSARI_CMAKE_ARGS:-}
t_configured=$(date +%s)
target_args=()
for t in "${targets[@]}"; do target_args+=(--target "$t"); done
cmake --build "$build_dir" -j "$(nproc)" "${target_args[@]}"
t_built=$(date +%s)

# The Python package (build/python/kusari): importable by the interpreter it was built for, as an
# editable install (a .pth file naming build/python) in that interpreter's site-packages with
# root, in the user's own without (KUSARI_PYTHON_PTH=0: neither).
python_dir="$build_dir/python"
if [ -f "$python_dir/python_executable.txt" ] && ls "$python_dir"/kusari/_kusari*.so >/dev/null 2>&1 &&
   [ "${KUSARI_PYTHON_PTH:-1}" != 0 ]; then
  python=$(cat "$python_dir/python_executable.txt")
  if [ "$(id -u)" = 0 ]; then
    site=$("$python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  else
    site=$("$python" -m site --user-site)
  fi
  if mkdir -p "$site" 2>/dev/null && echo "$python_dir" >"$site/kusari-build.pth.tmp" 2>/dev/null; then
    mv "$site/kusari-build.pth.tmp" "$site/kusari-build.pth"
    echo "setup.sh: $python imports kusari from $python_dir ($site/kusari-build.pth)"
  else
    echo "setup.sh: cannot write $site; use PYTHONPATH=$python_dir $python" >&2
  fi
fi
echo "setup.sh: packages $((t_packages - t_start)) s, configure $((t_configured - t_packages)) s," \
     "build $((t_built - t_configured)) s (${targets[*]:-everything})"
