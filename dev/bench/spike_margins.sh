#!/usr/bin/env bash
# How close healthy runs come to the spike detector's thresholds (run/spikes.h), the figures
# of docs/training.md's "Loss spikes": each run's largest loss and grad norm ratio over the
# median of its recent good steps, from its main.log, by dev/test/spike_reference.py (an
# independent re-implementation), at the defaults (--spike-loss-factor 2,
# --spike-norm-factor 10, --spike-window 16). Every run must finish without a spike.
#
#   bash dev/bench/spike_margins.sh [RUN...]     RUN: demo readme diverged_doc recipe_d4 recipe_d12 (all)
#
# recipe_*: scripts/pretrain_gpt2_124M.sh's optimizer settings (-l 6e-4 -u 700 -q 0 -c 0.1
# --grad-clip 1 --shuffle --seed 42) on tinyshakespeare; its batch (524288 tokens per step)
# does not fit 2 CPU cores, so d4 runs 300 steps of -b 4 -t 256 and d12 SPIKE_D12_STEPS
# (default 40) of -b 1 -t 1024. Env: SPIKE_D4_STEPS (300), SPIKE_D12_STEPS (40). On 2 shared
# cores: d4 614 s, d12 639 s, the rest under a minute.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source dev/test/env.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
OUT=out/spike_margins
mkdir -p "$OUT"
DATA=(-i data/tinyshakespeare_train.bin -j data/tinyshakespeare_val.bin)
RECIPE=(-l 6e-4 -u 700 -q 0 -c 0.1 --grad-clip 1 --shuffle --seed 42 -v 0 -s 0)
run() {  # run NAME NP ARGS...
    local name=$1 np=$2
    shift 2
    rm -rf "${OUT:?}/$name"
    local t0=$SECONDS
    if ! "${MPIRUN[@]}" -np "$np" ./train_gpt2 "${DATA[@]}" -o "$OUT/$name" "$@" >"$OUT/$name.log" 2>&1; then
        echo "$name: FAILED (exit $?): $OUT/$name.log"; tail -3 "$OUT/$name.log"; return 1
    fi
    echo "== $name: $(grep -c '^s:[0-9]* trl:' "$OUT/$name/main.log") steps in $((SECONDS - t0)) s: ./train_gpt2 $*"
    grep -q 'update skipped' "$OUT/$name.log" && echo "$name: a step was skipped" && return 1
    $PY dev/test/spike_reference.py margin "$OUT/$name/main.log" 2 10 16
}
SELECTED=("$@")
sel() { [ ${#SELECTED[@]} -eq 0 ] || [[ " ${SELECTED[*]} " == *" $1 "* ]]; }
sel demo && run demo 4 -e d2 -b 4 -t 64 -x 25 -l 1e-3 -u 10 -q 0.1 -c 0.1 -v 20 -m 5 -s 0 -z 1
sel readme && run readme 1 -e d2 -b 4 -t 64 -x 10
sel diverged_doc && run diverged_doc 1 -e d2 -b 4 -t 64 -x 12 -l 1e-3 -n 2 -v 0 -s 0
sel recipe_d4 && run recipe_d4 1 -e d4 -b 4 -t 256 -x "${SPIKE_D4_STEPS:-300}" "${RECIPE[@]}"
sel recipe_d12 && run recipe_d12 1 -e d12 -b 1 -t 1024 -x "${SPIKE_D12_STEPS:-40}" "${RECIPE[@]}"
exit 0
