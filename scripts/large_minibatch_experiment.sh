#!/usr/bin/env bash
# The large-minibatch experiment of docs/imagenet.md ("Large minibatches"): a narrow ResNet-18
# on a Fashion-MNIST JPEG folder, trained for the same number of epochs
#   small        16 images per step, momentum SGD at 0.05 (cosine decay);
#   large        512 images per step (32x), the same hyperparameters;
#   recipe       512 images per step with the large-minibatch recipe: LARS, a warm-up, label
#                smoothing, no decay on biases and batch norm, plain-average BN statistics;
#   sgd, rmsprop (optional) the same recipe with linearly scaled momentum SGD, or with the
#                RMSprop warm-up switching to it;
# then a table of the final validation accuracies and a plot of the curves (plot_logs).
#
#   scripts/large_minibatch_experiment.sh [build dir] [output dir] [runs...]
#
# RUNS defaults to "small large recipe"; "sgd" and "rmsprop" add the other two, "table" alone
# only prints the table and draws the plot of the runs already made. Each run
# is one process with one compute thread (on a shared 2-core machine a second thread costs more
# than it gives): about 1 minute of CPU each on a 2-core x86_64 CPU.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-large_minibatch}
shift $(( $# > 2 ? 2 : $# ))
RUNS=${*:-small large recipe}
TRAIN="$BUILD/examples/imagenet/train_imagenet"
for r in $RUNS; do
  case $r in
    small | large | recipe | sgd | rmsprop | table) ;;
    *) echo "unknown run '$r' (small, large, recipe, sgd, rmsprop, table)" >&2; exit 1 ;;
  esac
done
if [ "${KUSARI_CHECK_ARGS:-0}" != 0 ]; then echo "large_minibatch_experiment.sh: arguments accepted"; exit 0; fi  # (the docs' commands are checked so)
mkdir -p "$OUT"
if [[ ! -d "$OUT/images/train" ]]; then
  "$BUILD/tools/make_image_folder" --out "$OUT/images" --size 32 --train 8192 --val 10000
fi
# The same network, data, augmentation, epochs, weight decay and schedule shape for every run.
COMMON=("$OUT/images/train" "$OUT/images/val" --arch resnet18 --width 16 --size 32 -b 500 -E 10
        -j 1 --threads 1 --no-progress --noplot --min-crop-scale 0.5 --seed 1
        --weight-decay 5e-4 --lr-schedule cosine)
# Every large-batch run with the recipe: a warm-up from the small batch's rate over 2 epochs,
# label smoothing 0.1, no weight decay on biases and batch norm, and batch norm's statistics as
# plain averages over the last epoch; they differ in the optimizer and its rate.
LARGE=(-B 512 --warmup-epochs 2 --warmup-start-lr 0.05 --label-smoothing 0.1 --no-bn-weight-decay
       --bn-freeze-epochs 1)
# Goyal et al.'s linear scaling: 0.05 per 16 images, 1.6 for 512.
LINEAR=(--lr-scaling linear --base-lr 0.05 --base-batchsize 16)
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
    recipe) run recipe "${LARGE[@]}" --optimizer lars --lr 2 --lars-eta 0.01 ;;
    sgd) run sgd "${LARGE[@]}" "${LINEAR[@]}" ;;
    rmsprop) run rmsprop "${LARGE[@]}" "${LINEAR[@]}" --optimizer rmsprop-warmup \
                 --rmsprop-lr 0.003 --rmsprop-warmup-center 5 --rmsprop-warmup-period 4 ;;
    table) ;;  # (only the table and the plot of the runs already made)
    *) echo "unknown run '$r' (small, large, recipe, sgd, rmsprop, table)" >&2; exit 1 ;;
  esac
done
# The table and the plot of every run that has a log.
declare -A LABEL=([small]="small (16)" [large]="large (512)" [recipe]="recipe, LARS"
                  [sgd]="recipe, SGD 1.6" [rmsprop]="recipe, RMSprop warm-up")
logs=()
printf '%-8s %s\n' run "validation accuracy per epoch"
for r in small large recipe sgd rmsprop; do
  [[ -f "$OUT/$r/log" ]] || continue
  logs+=("${LABEL[$r]}=$OUT/$r/log")
  python3 -c 'import json,sys; l=json.load(open(sys.argv[2])); print("%-8s %s" % (sys.argv[1], " ".join("%.4f" % e["validation/main/accuracy"] for e in l)))' "$r" "$OUT/$r/log"
done
"$BUILD/tools/plot_logs" --out "$OUT/large_minibatch.png" \
  --title "ResNet-18 (width 16), Fashion-MNIST 32x32: validation accuracy" "${logs[@]}"
echo "plot: $OUT/large_minibatch.png"
