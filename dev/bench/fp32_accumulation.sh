#!/usr/bin/env bash
# bf16 on the wire with fp32 accumulation (--fp32-accumulation) against the plain fp32 and
# bf16 reduce-scatters: for each, at np 2, 4 and 8, one optimizer step of a random GPT-2
# (-e d4 by default) on real data (data/tinyshakespeare_train.bin, prepared by `make data`),
# and
#   - the relative error of the step's grad norm (main.log's norm, printed to %.9g) against
#     the fp32 reference: the plain replicated fp32 path (-z 0) at the same np and batch;
#   - the bytes each rank sends per step for the gradients and in all (gradients plus the
#     all-gather of the params), computed from the layout: the start-up ledger's rows
#     (zero1/ledger.h; the all-to-all sends each peer its slice, (DP-1)/DP of the bucket).
# Usage: dev/bench/fp32_accumulation.sh [model]   (environment: BENCH_B, BENCH_T)
set -eu
source "$(dirname "${BASH_SOURCE[0]}")/../test/env.sh"
MODEL=${1:-d4}
B=${BENCH_B:-2} T=${BENCH_T:-64}
bench_work_dir
make -s train_gpt2 USE_ZERO1=1 >/dev/null
make -s data >/dev/null

# run NAME NP FLAGS...: one step into $work/NAME (main.log) with its output in $work/NAME.out
run() {
    local name=$1 np=$2
    shift 2
    "${MPIRUN[@]}" -np "$np" ./train_gpt2 -e "$MODEL" -i data/tinyshakespeare_train.bin -b "$B" -t "$T" -x 1 -v 0 \
        -s 0 -o "$work/$name" "$@" >"$work/$name.out" 2>&1 || { tail -20 "$work/$name.out"; exit 1; }
}
norm_of() { sed -n 's/^s:1 .* norm:\([^ ]*\) .*/\1/p' "$work/$1/main.log"; }
# The ledger's ZeRO-1 column of a row ("grads (bf16)", "total sent").
ledger() { awk -v row="$2" 'index($0, "  " row) == 1 { for (i = NF; i > 0; i--) if ($i ~ /^[0-9]+$/) { print $i; exit } }' "$work/$1.out"; }

printf "%-4s %-28s %16s %18s %18s\n" np reduction "grad norm rel err" "grad bytes/rank" "total bytes/rank"
for np in 2 4 8; do
    run ref$np "$np" -z 0
    ref=$(norm_of ref$np)
    for mode in "fp32 reduce-scatter|--grad-dtype fp32" "bf16 reduce-scatter|--grad-dtype bf16" \
                "bf16 + fp32 accumulation|--grad-dtype bf16 --fp32-accumulation"; do
        label=${mode%%|*}
        # shellcheck disable=SC2086  # the flags, split on purpose
        run m$np "$np" -z 1 ${mode#*|}
        got=$(norm_of m$np)
        grad_row=$(grep -o '^  grads ([a-z0-9]*)' "$work/m$np.out" | head -n 1 | sed 's/^  //')
        awk -v np="$np" -v l="$label" -v g="$got" -v r="$ref" -v gb="$(ledger m$np "$grad_row")" \
            -v tb="$(ledger m$np "total sent")" 'BEGIN { e = (g - r) / r; if (e < 0) e = -e;
            printf "%-4s %-28s %16.3e %18d %18d\n", np, l, e, gb, tb }'
    done
done
echo "(model $MODEL, B=$B T=$T per rank, one step; reference: -z 0 fp32, norm $(norm_of ref8) at np 8)"
