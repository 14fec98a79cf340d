#!/usr/bin/env bash
# Builds kusari with AddressSanitizer and UndefinedBehaviorSanitizer (CPU only, into
# build-sanitize/ or $KUSARI_SANITIZE_DIR) and runs the tests there, the multi-process ones under
# mpiexec included, and a short fuzz of the file readers. Any report of either sanitizer fails
# the test that printed it (halt_on_error), so a clean run is "100% tests passed".
#
#   scripts/sanitize.sh [-R <ctest regex>] [--fuzz-runs N] [--targets "<cmake targets>"]
#
#   -R REGEX        run only the matching tests (default: all)
#   --fuzz-runs N   inputs per reader for kusari_fuzz_readers under the sanitizers (default 100000)
#   --targets LIST  build only these targets (default: everything)
#
# Leak checking is off: Open MPI keeps its allocations until exit, by design.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KUSARI_SANITIZE_DIR:-$here/build-sanitize}
regex="" fuzz_runs=100000 targets=""
while [ $# -gt 0 ]; do
  case "$1" in
    -R) regex=$2; shift ;;
    --fuzz-runs) fuzz_runs=$2; shift ;;
    --targets) targets=$2; shift ;;
    *) echo "sanitize.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
if [ "${KUSARI_CHECK_ARGS:-0}" != 0 ]; then echo "sanitize.sh: arguments accepted"; exit 0; fi  # (the docs' commands are checked so)
flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$here" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKUSARI_WITH_CUDA=OFF \
  -DKUSARI_BUILD_BENCHMARKS=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" ${KUSARI_CMAKE_ARGS:-} >/dev/null
# shellcheck disable=SC2086
cmake --build "$build" -j "$(nproc)" ${targets:+--target $targets}

# allocator_may_return_null: some tests ask for more memory than an address space holds, on
# purpose, and expect kusari's out-of-memory error (a null from the allocator), not ASan's abort.
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_stack_use_after_return=0:allocator_may_return_null=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
status=0
ctest --test-dir "$build" -j "$(nproc)" --output-on-failure ${regex:+-R "$regex"} || status=1
if [ -x "$build/tests/fuzz/kusari_fuzz_readers" ]; then
  for t in npz idx image; do
    "$build/tests/fuzz/kusari_fuzz_readers" --target "$t" --corpus "$here/tests/fuzz/corpus" \
      --runs "$fuzz_runs" --seed 7 --findings "$build/fuzz-findings" || status=1
  done
fi
exit "$status"
