#!/usr/bin/env bash
# The main job: sets kusari up and runs the training example.
# (Until the MNIST example lands this runs the quickstart demo.)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${KUSARI_BUILD_DIR:-$here/build}
"$here/scripts/setup.sh"
"$build_dir/examples/quickstart/quickstart"
