#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=fast,full
# --dp-invariant (docs/zero1.md#the-dp-invariant-mode---dp-invariant): one optimizer step of
# 8 micro-batches (B=2, T=32, -d 512) split over 1, 2, 4 and 8 ranks (8, 4, 2 and 1
# micro-steps, and other bucket sizes), 8 steps with clipping biting at every step
# (--grad-clip 0.5: the norms are 0.55-0.85), on shards that end inside the run:
#   1. the step-8 checkpoints' model.bin (fp32 master) and optimizer.bin (AdamW m, v) are
#      byte-identical, and so are the step lines' loss and norm and main.log (timings aside)
#   2. the control: without the mode, np 1 and np 4 give different checkpoints
#   3. resume at another rank count: np 4's step-4 checkpoint resumed at np 1, and np 1's
#      at np 4, end at the straight run's step-8 checkpoint byte for byte
#   4. the same for --param-dtype bf16 --stochastic-rounding and for --shuffle
#   5. the deferred device with the hazard communicator (train_gpt2_testing) at np 2 and
#      the CPU device at np 1: the same bytes (the device contract keeps the bits)
#   6. a planted change of the tree order is caught: a copy of the tree whose exchange sums
#      the ranks in rank order ((s0 + s1) + s2) + s3 gives np 4 != np 1
#   7. what the mode cannot keep is refused, one error each
#   8. the memory ledger's extra terms (start-up and zero1_plan) against the layout by hand
# The fast tier: np 1 against np 2 (item 1's first row) only.
# GPU=BINARY: a train_gpt2cu USE_ZERO1=1 (run_gpu_tests.sh): np 1, 2 and 4 (one GPU each, or
# sharing one GPU through staged MPI on a single GPU), 4 steps: item 1 only.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
source dev/test/expect_error.sh   # the bad-input fixtures
fast_rows "np 2 == np 1"

$PY dev/test/gpt2_oracle.py make --out-model "$TMP/m.bin" --out-state "$TMP/s.bin" --vocab 1000 --max-seq 32 \
    --seq 32 --steps 1 >/dev/null || fatal "oracle model"
# 1100 and 1700 tokens: 34 and 53 rows of T=32, 2 and 3 whole steps of 16 rows, so steps 3
# and 6 begin new shards.
write_shard "$TMP/shard_0.bin" 1100 && write_shard "$TMP/shard_1.bin" 1700 && write_shard "$TMP/shard_2.bin" 20000 ||
    fatal "shards"

BIN=${GPU:-./train_gpt2}
STEPS=8
[ -n "${GPU:-}" ] && STEPS=4
if [ -z "${GPU:-}" ]; then
    make -s train_gpt2 train_gpt2_testing USE_ZERO1=1 >/dev/null || fatal "build"
fi
COMMON=(-e "$TMP/m.bin" -i "$TMP/shard_*.bin" -b 2 -t 32 -d 512 -x $STEPS -v 0 -s 0 -l 1e-3 -c 0.1
        --grad-clip 0.5 -n 4)
run() {  # run NAME NP [BINARY] ARGS...: one run into $TMP/out_NAME, its output in $TMP/log_NAME
    local name=$1 np=$2 bin=$BIN; shift 2
    [[ ${1:-} == */* ]] && { bin=$1; shift; }
    mkdir -p "$TMP/out_$name"
    timeout 300 "${MPIRUN[@]}" -np "$np" "$bin" "${COMMON[@]}" -o "$TMP/out_$name" "$@" >"$TMP/log_$name" 2>&1 ||
        { not_ok "run $name (np $np $*)" "$TMP/log_$name"; return 1; }
}
step_lines() { grep '^step' "$TMP/log_$1" | sed -E 's/ \| [0-9.]+ ms .*//'; }
train_log() { sed -E 's/ ms:.*//' "$TMP/out_$1/main.log"; }
ckpt() { echo "$TMP/out_$1/checkpoint_$(printf %08d "${2:-$STEPS}")"; }
same_bytes() { cmp -s "$(ckpt "$1")/model.bin" "$(ckpt "$2")/model.bin" && cmp -s "$(ckpt "$1")/optimizer.bin" "$(ckpt "$2")/optimizer.bin"; }
# same RUN_A RUN_B WHAT: the checkpoints, the step lines and main.log of two runs identical.
same() {
    if [ -f "$(ckpt "$1")/model.bin" ] && same_bytes "$1" "$2" && diff <(step_lines "$1") <(step_lines "$2") >/dev/null &&
       diff <(train_log "$1") <(train_log "$2") >/dev/null && [ "$(step_lines "$1" | wc -l)" = "$STEPS" ]; then
        ok "$3: model.bin, optimizer.bin, step lines and main.log identical"
    else
        not_ok "$3: they differ"
        diag "$(diff <(step_lines "$1") <(step_lines "$2") | head -6)"
    fi
}

if [ -n "${GPU:-}" ]; then
    run g1 1 --dp-invariant && run g2 2 --dp-invariant --bucket-size 20000 && run g4 4 --dp-invariant --bucket-size 5000 &&
        same g1 g2 "GPU np 2 (2 micro-steps) == np 1 (4)" && same g1 g4 "GPU np 4 (1 micro-step) == np 1 (4)"
    grep -q '^step' "$TMP/log_g1" && note "$(step_lines g1 | tail -n 1)"
    done_testing
fi

# 1. Every split of the step: the same bits. (The rows after this one compare with np 1's run.)
selected "np 2 == np 1" && run a1 1 --dp-invariant --bucket-size none && run a2 2 --dp-invariant --bucket-size 3000 &&
    same a1 a2 "np 2 (4 micro-steps, 3000-element buckets) == np 1 (8, one bucket)"
if selected clipping; then
    clipped=$(step_lines a1 | sed -E 's/.*norm ([0-9.]+).*/\1/' | awk '$1 > 0.5 { n++ } END { print n + 0 }')
    [ "$clipped" = $STEPS ] && ok "clipping bit at all $STEPS steps (norms above --grad-clip 0.5)" ||
        not_ok "clipping bit at $clipped of $STEPS steps"
fi
selected "np 4 == np 1" && run a4 4 --dp-invariant --bucket-size 3000 && same a1 a4 "np 4 (2 micro-steps) == np 1"
selected "np 8 == np 1" && run a8 8 --dp-invariant && same a1 a8 "np 8, oversubscribed (1 micro-step) == np 1"

# 2. The control: the default sums the same micro-batches in other orders at np 1 and 4.
if selected control && run c1 1 --bucket-size none && run c4 4 --bucket-size 3000; then
    same_bytes c1 c4 && not_ok "control: without --dp-invariant np 1 and np 4 gave the same checkpoint" ||
        ok "control: without --dp-invariant np 1 and np 4 give different checkpoints"
fi

# 3. Resume at another rank count, from the straight runs' step-4 checkpoints.
resume() {  # resume NAME FROM NP ARGS...
    local name=$1 from=$2 np=$3; shift 3
    mkdir -p "$TMP/out_$name"
    cp -r "$(ckpt "$from" 4)" "$TMP/out_$name/"
    run "$name" "$np" -y 1 "$@"
}
for spec in "r41 a4 1" "r14 a1 4"; do
    read -r name from np <<<"$spec"
    selected "resume at np $np" || continue
    if resume "$name" "$from" "$np" --dp-invariant && same_bytes "$name" a1 &&
       diff <(step_lines "$name") <(step_lines a1 | tail -n 4) >/dev/null &&
       diff <(grep -vE '^(ranks|grad_accum_steps) ' "$(ckpt a1)/state.txt") \
            <(grep -vE '^(ranks|grad_accum_steps) ' "$(ckpt "$name")/state.txt") >/dev/null; then
        ok "resume at np $np of $from's step-4 checkpoint: the straight run's step-8 checkpoint and step lines"
    else
        not_ok "resume $name at np $np" "$TMP/log_$name"
    fi
done

# 4. bf16 params with stochastic rounding; --shuffle.
selected "bf16 params, stochastic rounding" && run b1 1 --dp-invariant --param-dtype bf16 --stochastic-rounding &&
    run b4 4 --dp-invariant --param-dtype bf16 --stochastic-rounding --bucket-size 3000 --no-overlap-grad-reduce \
        --no-overlap-param-gather &&
    same b1 b4 "bf16 params, stochastic rounding: np 4 (no overlap) == np 1"
selected shuffle && run s1 1 --dp-invariant --shuffle && run s2 2 --dp-invariant --shuffle --bucket-size 3000 &&
    same s1 s2 "--shuffle: np 2 == np 1"

# 5. Every op as late as the device contract allows, collectives poisoned while in flight.
selected "deferred device and hazard communicator" &&
    run d2 2 ./train_gpt2_testing --dp-invariant --bucket-size 3000 --test-device deferred --test-hazard &&
    same a1 d2 "deferred device and hazard communicator at np 2 == the CPU device at np 1"

# 6. A planted change of the tree order: the exchange sums the ranks' subtrees in rank order.
if selected "planted tree order"; then
    mutant=$TMP/mutant
    mkdir -p "$mutant"
    bash scripts/copy_sources.sh "$mutant"
    if $PY - "$mutant/zero1/exact_sum.h" <<'PYEOF' && (cd "$mutant" && make -s train_gpt2 USE_ZERO1=1 >/dev/null 2>&1); then
import sys
path = sys.argv[1]
text = open(path).read()
old = "for (int b = r; b & 1; b >>= 1)"
if text.count(old) != 1:
    sys.exit("the tree's loop is not in %s" % path)
open(path, "w").write(text.replace(old, "for (int b = r; top > 0; b >>= 1)"))
PYEOF
        if run m1 1 "$mutant/train_gpt2" --dp-invariant && run m4 4 "$mutant/train_gpt2" --dp-invariant; then
            same_bytes m1 m4 && not_ok "planted tree order (rank-order exchange): NOT caught, np 4 == np 1" ||
                ok "planted tree order (rank-order exchange): caught, np 4 != np 1"
        fi
    else
        not_ok "the mutated copy of zero1/exact_sum.h could not be made or built"
    fi
fi

# 7. Refusals: one error each, naming the flag.
BASE=("${COMMON[@]}" -x 1 -n 0 --dp-invariant)
before=$TEST_FAILED count=$TEST_COUNT
expect_error z0 1 "--dp-invariant" "-z 0" -- -z 0
expect_error bf16_grads 1 "--dp-invariant" "--grad-dtype bf16" -- --grad-dtype bf16
expect_error average 2 "--dp-invariant" "--average-in-collective" -- --average-in-collective
expect_error split 2 "--dp-invariant" "--split-embedding" -- --split-embedding
expect_error instances 4 "--dp-invariant" "--dist-opt-instances" -- --dist-opt-instances 2
expect_error overfit 1 "--dp-invariant" "-a 1" -- -a 1
expect_error three_ranks 3 "--dp-invariant" "power-of-two" "3 ranks" -- -d 384
expect_error six_micro_steps 1 "--dp-invariant" "power-of-two" "6 micro-steps" -- -d 384
[ "$TEST_FAILED" = "$before" ] && [ $((TEST_COUNT - count)) = 8 ] && ok "8 refusals, one error line each"

# 8. The memory ledger's extra terms, by hand from the layout: the start-up ledger of np 1 (8
# micro-steps: 3 partial buffers of the grad buffer), and zero1_plan at d12, DP 8, K 8 (and its
# receive temporaries: 2 x the largest bucket in fp32); a DP of 3 refused.
if selected ledger; then
    numel=$(sed -n 's/^zero1: buffer \([0-9]*\) elements.*/\1/p' "$TMP/log_a1")
    partial=$(sed -n 's/^  dp-inv\. partial grads (log2 k = 3) *0 *0 B *\([0-9]*\) .*/\1/p' "$TMP/log_a1")
    [ -n "$numel" ] && [ "$partial" = $((3 * numel * 4)) ] && ok "start-up ledger: 3 partial grad buffers of $numel x 4 B" ||
        not_ok "start-up ledger: partial grads '$partial' for a buffer of '$numel' elements" "$TMP/log_a1"
    make -s zero1_plan >/dev/null &&
    ./zero1_plan --model d12 --dp 8 --dp-invariant --accumulation 8 --json | $PY -c '
import json, sys
plan = json.load(sys.stdin)
largest = max(b["end"] - b["start"] for b in plan["buckets"])
for g in plan["ledger"].values():
    assert g["partial_grads"] == 3 * plan["numel"] * 4, g["partial_grads"]
    assert g["recv_temporaries"] == 2 * largest * 4, g["recv_temporaries"]
    assert g["sent_reduce_scatter"] == 7 * plan["numel"] // 8 * 4, g["sent_reduce_scatter"]
    ' && ! ./zero1_plan --model d2 --dp 3 --dp-invariant >/dev/null 2>&1 &&
        ok "zero1_plan --dp-invariant: partial grads, receive temporaries and bytes sent by hand; --dp 3 refused" ||
        not_ok "zero1_plan --dp-invariant"
fi

done_testing
