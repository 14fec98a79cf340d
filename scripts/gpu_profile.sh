#!/usr/bin/env bash
# On a machine with a GPU: times every kernel of one ResNet training step with Nsight Compute,
# for kusari (bench_resnet50's rows) and for the PyTorch peer, and prints the GPU time summed
# per kernel name, largest first, so that two layouts or two frameworks can be compared.
#
#   scripts/gpu_profile.sh [--debs DIR] [--out DIR] [--rows f32-cl,f32-nchw] [--batch 64]
#                          [--arch resnet50] [--peer] [--compile] [--top 25]
#
#   --debs DIR   unpack DIR/*.deb into a prefix and build against it (scripts/prefix_from_debs.sh)
#   --out DIR    where the raw CSV files and the summaries go (default build-gpu/profile)
#   --peer       also profile PyTorch (bench/peers/resnet50.py) on the same rows
#   --compile    also profile the PyTorch peer under torch.compile (compiled in the warm-up)
#
# Each program runs its warm-up steps unprofiled, then one step between profiler start and stop
# (--profile); Nsight records that step only. Clocks are left as they are.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
debs="" out="" rows="f32-cl,f32-nchw" batch=64 arch=resnet50 peer=0 compile=0 top=25
while [ $# -gt 0 ]; do
  case "$1" in
    --debs) debs=$2; shift ;;
    --out) out=$2; shift ;;
    --rows) rows=$2; shift ;;
    --batch) batch=$2; shift ;;
    --arch) arch=$2; shift ;;
    --peer) peer=1 ;;
    --compile) compile=1 ;;
    --top) top=$2; shift ;;
    *) echo "gpu_profile.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
if [ "${KUSARI_CHECK_ARGS:-0}" != 0 ]; then echo "gpu_profile.sh: arguments accepted"; exit 0; fi  # (the docs' commands are checked so)
build=$here/build-gpu
out=${out:-$build/profile}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0

if [ ! -x "$build/bench/bench_resnet50" ]; then
  cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90)
  if [ -n "$debs" ]; then
    read -r -a prefix_args <<<"$("$here/scripts/prefix_from_debs.sh" unpack "$debs" /tmp/kusari-deps)"
    cmake_args+=("${prefix_args[@]}")
  fi
  cmake -S "$here" -B "$build" "${cmake_args[@]}" >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
  cmake --build "$build" -j "$(nproc)" --target bench_resnet50 >"$out/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
fi
if [ -d /tmp/kusari-deps ]; then
  export LD_LIBRARY_PATH=/tmp/kusari-deps/usr/lib/x86_64-linux-gnu:/tmp/kusari-deps/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

summarize() {  # summarize <csv> : time per kernel name
  python3 - "$1" "$top" <<'EOF'
import csv, sys, collections
lines = open(sys.argv[1], errors="replace").read().splitlines()
start = next((i for i, l in enumerate(lines) if '"Kernel Name"' in l), None)
if start is None:
    sys.exit("no kernel table in " + sys.argv[1] + ":\n" + "\n".join(lines[:15]))
def value(r):
    try:
        return float(r.get("gpu__time_duration.sum", "").replace(",", ""))
    except ValueError:
        return None  # the units row
rows = [r for r in csv.DictReader(lines[start:]) if r.get("Kernel Name") and value(r) is not None]
per = collections.defaultdict(lambda: [0.0, 0])
for r in rows:
    name = r["Kernel Name"].split("(")[0][:90]
    per[name][0] += value(r) / 1e6
    per[name][1] += 1
total = sum(v[0] for v in per.values())
print(f"{len(rows)} launches, {total:.2f} ms of GPU time")
for name, (ms, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[: int(sys.argv[2])]:
    print(f"{ms:9.3f} ms {100 * ms / total:5.1f}% {n:5d}x  {name}")
EOF
}

IFS=, read -r -a row_list <<<"$rows"
for row in "${row_list[@]}"; do
  ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw --print-units base \
    "$build/bench/bench_resnet50" --child "$row" --profile --arch "$arch" --device cuda \
    --batch "$batch" --warmup 2 >"$out/kusari_$row.csv" 2>"$out/kusari_$row.err" || { tail "$out/kusari_$row.err"; exit 1; }
  echo "=== kusari $row (batch $batch)"; summarize "$out/kusari_$row.csv" | tee "$out/kusari_$row.txt" || true
  modes=()
  [ "$peer" = 1 ] && modes+=(eager)
  [ "$compile" = 1 ] && modes+=(compile)
  for mode in "${modes[@]}"; do
    name=torch_${mode}_$row
    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw --print-units base \
      python3 "$here/bench/peers/resnet50.py" --row "$row" --mode "$mode" --profile --arch "$arch" \
      --batch "$batch" --warmup 3 >"$out/$name.csv" 2>"$out/$name.err" || { tail "$out/$name.err"; exit 1; }
    echo "=== PyTorch $mode $row (batch $batch)"; summarize "$out/$name.csv" | tee "$out/$name.txt" || true
  done
done
