#!/usr/bin/env bash
# The main job: a small GPT-2 trained on tinyshakespeare on 4 MPI ranks with ZeRO-1.
#
#   ./scripts/demo.sh          (or: make demo)
#
# Installs the dependencies (scripts/install_deps.sh), builds the CPU trainer with the
# zero1/ plugin, prepares the data (make data), trains a d2 GPT-2 (L=2, C=128, 7M params)
# for 25 steps (B=4 per rank, T=64, 1024 tokens/step, lr 1e-3, 10 warmup steps, cosine to
# 1e-4), validates every 20 steps, prints a sample at the end, writes out/demo/main.log
# and draws its train and validation loss into out/demo/loss.png (scripts/plot_loss.sh).
# Its time on 2 cores: the README's set-up table. Env: DEMO_NP (4), DEMO_STEPS (25), DEMO_MODEL (d2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
START=$SECONDS
NP=${DEMO_NP:-4}
STEPS=${DEMO_STEPS:-25}
MODEL=${DEMO_MODEL:-d2}
OUT=out/demo
phase() { echo; echo "== [demo +$((SECONDS - START)) s] $*"; }

phase "dependencies"
bash scripts/install_deps.sh

phase "build"
ZERO=1
make train_gpt2 USE_ZERO1=1

phase "data"
make data

phase "train: $NP ranks, -z $ZERO, $MODEL, $STEPS steps"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
LAUNCH=(mpirun -np "$NP")
if [ "$(id -u)" = 0 ]; then LAUNCH=(mpirun --allow-run-as-root --oversubscribe -np "$NP"); fi
rm -rf "$OUT"
mkdir -p "$OUT"
set -x
"${LAUNCH[@]}" ./train_gpt2 -e "$MODEL" -i data/tinyshakespeare_train.bin -j data/tinyshakespeare_val.bin \
    -b 4 -t 64 -x "$STEPS" -l 1e-3 -u 10 -q 0.1 -c 0.1 -v 20 -m 5 -s "$STEPS" -g 64 -z "$ZERO" -o "$OUT" \
    2>&1 | tee "$OUT/stdout.txt"
{ set +x; } 2>/dev/null

phase "result"
first=$(sed -n 's/^s:[0-9]* trl:\([^ ]*\).*/\1/p' "$OUT/main.log" | head -n 1)
last=$(sed -n 's/^s:[0-9]* trl:\([^ ]*\).*/\1/p' "$OUT/main.log" | tail -n 1)
if [ -z "$first" ] || [ -z "$last" ]; then
    echo "demo: error: no train losses in $OUT/main.log"
    exit 1
fi
echo "demo: first train loss $first, last train loss $last ($OUT/main.log)"
if ! awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; then
    echo "demo: error: the train loss did not fall ($first -> $last)"
    exit 1
fi
bash scripts/plot_loss.sh "$OUT/main.log" -o "$OUT/loss.png" --title "demo: $MODEL GPT-2, $NP ranks, ZeRO-1"
echo "demo: the train loss fell ($first -> $last) in $((SECONDS - START)) s; the loss curve is in $OUT/loss.png"
