#!/usr/bin/env bash
# The large-minibatch experiment of docs/imagenet.md ("Large minibatches"): a narrow ResNet-18
# on a Fashion-MNIST JPEG folder, trained for the same number of epochs
#   small        16 images per step, momentum SGD at 0.05 (cosine decay);
#   large        512 images per step (32x), the same hyperparameters;
#   large+recipe 512 images per step with the large-minibatch recipe (the RUNS below);
# then a table of the final validation accuracies and a plot of the curves (plot_logs).
#
#   scripts/large_minibatch_experiment.sh [build dir] [output dir] [runs...]
#
# RUNS defaults to "small large recipe"; "lars" and "rmsprop" add the other optimizers. Each run
# is one process with one compute thread (on a shared 2-core machine a second thread costs more
# than it gives); about 5 minutes each on an idle 2-core x86_64 CPU.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-large_minibatch}
shift $(( $# > 2 ? 2 : $# ))
RUNS=${*:-small large recipe}
TRAIN="$BUILD/examples/imagenet/train_imagenet"
mkdir -p "$OUT"
if [[ ! -d "$OUT/images/train" ]]; then
  "$BUILD/tools/make_image_folder" --out "$OUT/images" --size 32 --train 8192 --val 2000
fi
# The same network, data, augmentation, epochs, weight decay and schedule shape for every run.
COMMON=("$OUT/images/train" "$OUT/images/val" --arch resnet18 --width 16 --size 32 -b 500 -E 10
        -j 1 --threads 1 --no-progress --noplot --min-crop-scale 0.5 --seed 1
        --weight-decay 5e-4 --lr-schedule cosine)
# The recipe: the rate scaled linearly (0.05 per 16 images: 1.6 for 512), a warm-up from the
# small batch's rate over 2 epochs, label smoothing, no weight decay on biases and batch norm,
# plain-average batch-norm statistics over the last epoch.
RECIPE=(-B 512 --lr-scaling linear --base-lr 0.05 --base-batchsize 16 --warmup-epochs 2
        --warmup-start-lr 0.05 --label-smoothing 0.1 --no-bn-weight-decay --bn-freeze-epochs 1)
run() {
  local name=$1
  shift
  echo "== $name: $TRAIN ${COMMON[*]} $* -o $OUT/$name"
  /usr/bin/env time -f "$name: %e s wall, %U s user" "$TRAIN" "${COMMON[@]}" "$@" -o "$OUT/$name"
}
for r in $RUNS; do
  case $r in
    small) run small -B 16 --lr 0.05 --warmup-epochs 0 ;;
    large) run large -B 512 --lr 0.05 --warmup-epochs 0 ;;
    recipe) run recipe "${RECIPE[@]}" ;;
    lars) run lars "${RECIPE[@]}" --optimizer lars --lr 8 --lars-eta 0.01 ;;
    rmsprop) run rmsprop "${RECIPE[@]}" --optimizer rmsprop-warmup --rmsprop-lr 0.005
                 --rmsprop-warmup-center 2 --rmsprop-warmup-period 2 ;;
    *) echo "unknown run '$r' (small, large, recipe, lars, rmsprop)" >&2; exit 1 ;;
  esac
done
# The table and the plot of every run that has a log.
logs=()
printf '%-8s %s\n' run "validation accuracy per epoch"
for r in small large recipe lars rmsprop; do
  [[ -f "$OUT/$r/log" ]] || continue
  logs+=("$r=$OUT/$r/log")
  python3 -c 'import json,sys; l=json.load(open(sys.argv[2])); print("%-8s %s" % (sys.argv[1], " ".join("%.4f" % e["validation/main/accuracy"] for e in l)))' "$r" "$OUT/$r/log"
done
"$BUILD/tools/plot_logs" --out "$OUT/large_minibatch.png" \
  --title "ResNet-18 (width 16), Fashion-MNIST 32x32: validation accuracy" "${logs[@]}"
echo "plot: $OUT/large_minibatch.png"
