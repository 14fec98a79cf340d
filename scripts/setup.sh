#!/usr/bin/env bash
# Installs kusari's build dependencies from the distribution's packages (Debian 12 / Ubuntu),
# then configures and builds kusari into build/ (or $KUSARI_BUILD_DIR).
#
#   scripts/setup.sh            install what is missing, configure, build
#   scripts/setup.sh --no-deps  skip the package step (e.g. on a cluster without root)
#   scripts/setup.sh --bench    also install the peers the benchmarks compare with (PyTorch)
#
# Extra CMake arguments can be passed in $KUSARI_CMAKE_ARGS, e.g.
#   KUSARI_CMAKE_ARGS="-DKUSARI_WITH_CUDA=OFF" scripts/setup.sh
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${KUSARI_BUILD_DIR:-$here/build}
install_deps=1
bench=0
for arg in "$@"; do
  case "$arg" in
    --no-deps) install_deps=0 ;;
    --bench) bench=1 ;;
    *) echo "setup.sh: unknown argument '$arg' (expected --no-deps or --bench)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev libdnnl-dev ocl-icd-opencl-dev
  libgtest-dev
  openmpi-bin libopenmpi-dev
  zlib1g-dev libzip-dev libcairo2-dev fonts-dejavu-core libpng-dev
  libturbojpeg0-dev libjpeg62-turbo-dev
  libcli11-dev nlohmann-json3-dev
  dataset-fashion-mnist
  python3-numpy
  iproute2  # ip netns, for the multi-host test (its unshare comes with util-linux, always installed)
)
if [ "$bench" = 1 ]; then
  packages+=(python3-torch python3-torchvision python3-pil mate-backgrounds)
fi

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

generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
# shellcheck disable=SC2086
cmake -S "$here" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release ${KUSARI_CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$(nproc)"
