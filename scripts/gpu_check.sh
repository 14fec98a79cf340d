#!/usr/bin/env bash
# On a machine with GPUs: builds kusari (with packages unpacked from carried .deb files when the
# machine cannot install them, see scripts/prefix_from_debs.sh), runs every test there, the GPU
# ones and the multi-process ones included, and optionally the benchmarks that guard against a
# slowdown, alternating this tree with another checkout of kusari.
#
#   scripts/gpu_check.sh [--debs DIR] [--logs DIR] [--targets "T1 T2"] [--tests] [--bench]
#                        [--baseline SRC_DIR]
#
#   --debs DIR       unpack DIR/*.deb into a prefix and build against it
#   --logs DIR       where ctest's and the benchmarks' output go (default build-gpu/logs)
#   --targets "..."  build only these targets (default: everything; --tests needs everything)
#   --tests          run ctest (all tests) and every kusari_*_tests binary's GPU cases
#   --bench          run bench_op_overhead, bench_mnist_epoch and bench_gpu_mlp_step, twice each,
#                    alternating with the baseline tree when one is given
#   --baseline DIR   another kusari source tree to build (benchmarks only) and compare with
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
debs="" logs="" targets="" tests=0 bench=0 baseline=""
while [ $# -gt 0 ]; do
  case "$1" in
    --debs) debs=$2; shift ;;
    --logs) logs=$2; shift ;;
    --targets) targets=$2; shift ;;
    --tests) tests=1 ;;
    --bench) bench=1 ;;
    --baseline) baseline=$2; shift ;;
    *) echo "gpu_check.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
if [ "${KUSARI_CHECK_ARGS:-0}" != 0 ]; then echo "gpu_check.sh: arguments accepted"; exit 0; fi  # (the docs' commands are checked so)
build=$here/build-gpu
logs=${logs:-$build/logs}
mkdir -p "$logs"
export NCCL_NVLS_ENABLE=0
# The tests that check NumPy reads our files use the python3 on PATH (which holds NumPy).
export KUSARI_TEST_PYTHON=${KUSARI_TEST_PYTHON:-$(command -v python3)}
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90)
if [ -n "$debs" ]; then
  read -r -a prefix_args <<<"$("$here/scripts/prefix_from_debs.sh" unpack "$debs" /tmp/kusari-deps)"
  cmake_args+=("${prefix_args[@]}")
  export LD_LIBRARY_PATH=/tmp/kusari-deps/usr/lib/x86_64-linux-gnu:/tmp/kusari-deps/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

t0=$(date +%s)
cmake -S "$here" -B "$build" "${cmake_args[@]}" >"$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
grep "kusari:" "$logs/configure.log"
target_args=()
# shellcheck disable=SC2206
if [ -n "$targets" ]; then target_args=(--target $targets); fi
cmake --build "$build" -j "$(nproc)" "${target_args[@]}" >"$logs/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$logs/build.log" | head -40; exit 1; }
if [ -n "$baseline" ]; then
  cmake -S "$baseline" -B "$baseline/build-gpu" "${cmake_args[@]}" -DKUSARI_BUILD_TESTS=OFF \
    -DKUSARI_BUILD_EXAMPLES=OFF >"$logs/configure-baseline.log" 2>&1 || { tail -30 "$logs/configure-baseline.log"; exit 1; }
  cmake --build "$baseline/build-gpu" -j "$(nproc)" --target bench_op_overhead bench_mnist_epoch bench_gpu_mlp_step \
    >"$logs/build-baseline.log" 2>&1 || { grep -E "error|FAILED" "$logs/build-baseline.log" | head -40; exit 1; }
fi
echo "gpu_check.sh: built in $(( $(date +%s) - t0 )) s"

status=0
if [ "$tests" = 1 ]; then
  t1=$(date +%s)
  ctest --test-dir "$build" -j 8 --output-on-failure >"$logs/ctest.log" 2>&1 || status=1
  grep -E "tests passed|tests failed" "$logs/ctest.log"
  grep -E "\(Failed\)|\(Timeout\)|\*\*\*Failed|Exception" "$logs/ctest.log" | head -40 || true
  # The GPU cases that ctest counts as skipped on a machine without GPUs must have run here.
  skipped=$(grep -c "Skipped" "$logs/ctest.log" || true)
  echo "gpu_check.sh: tests took $(( $(date +%s) - t1 )) s; $skipped skipped (see $logs/ctest.log)"
fi

if [ "$bench" = 1 ]; then
  run_benches() {  # run_benches <label> <build dir>
    local label=$1 dir=$2
    echo "=== $label: bench_op_overhead"; "$dir/bench/bench_op_overhead"
    echo "=== $label: bench_mnist_epoch"; "$dir/bench/bench_mnist_epoch" --iterations 300 --configs 1+1,2+2
    echo "=== $label: bench_gpu_mlp_step"; "$dir/bench/bench_gpu_mlp_step"
  }
  for turn in 1 2; do
    if [ -n "$baseline" ]; then run_benches "baseline (turn $turn)" "$baseline/build-gpu" 2>&1 | tee -a "$logs/bench.log"; fi
    run_benches "this tree (turn $turn)" "$build" 2>&1 | tee -a "$logs/bench.log"
  done
fi
exit "$status"
