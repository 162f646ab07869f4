#!/usr/bin/env bash
# test: timeout=600 lane=cpu tier=fast,full
# ZeRO-1 equals replicated AdamW under mpirun with 1-4 ranks, across bucket layouts,
# dtypes, accumulation and overlap (dev/test/test_zero1.c asserts each run), with
# distributed-optimizer instances at np 4 and 6, also on the
# deferred device with the hazard communicator (zero1_hazard), and with the split
# embedding (--split-embedding); ZeRO-1 matches the PyTorch oracle at np=2, B=2 (also
# split); --stochastic-rounding stores the same bf16 params at any DP and bucket size;
# a planted NaN stops every rank.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
make -s test_zero1 test_gpt2 USE_ZERO1=1 >/dev/null || fatal "build"
make -s train_gpt2 train_gpt2_testing USE_ZERO1=1 >/dev/null || fatal "build"

# A small model (vocab 1000) keeps 40 runs fast; its parameters still span many buckets.
$PY dev/test/gpt2_oracle.py make --out-model "$TMP/small.bin" --out-state "$TMP/small_state.bin" \
    --vocab 1000 --max-seq 32 --seq 32 --steps 1 >/dev/null || fatal "oracle models"
# C = 48 for the split embedding: wte's shards then end inside rows at np 3 and 4, so a row
# goes to two owners and each adds only its part.
$PY dev/test/gpt2_oracle.py make --out-model "$TMP/c48.bin" --out-state "$TMP/c48_state.bin" \
    --vocab 1000 --channels 48 --max-seq 32 --seq 32 --steps 1 >/dev/null || fatal "oracle models"

# The rows are named "np=NP NAME"; the fast tier runs these.
fast_rows "np=2 zero1_hazard: many small buckets" "np=2 zero1_hazard: accumulation" "np=3 average in the collective" \
    "np=2 zero1_hazard: ZeRO-1 vs PyTorch oracle" "np=2 planted NaN" "np=2 --trace"
zero1_row() {  # zero1_row NAME NP ARGS...: one test_zero1 run (of $MODEL, default small.bin), the row "np=NP NAME"
    local name=$1 np=$2; shift 2
    selected "np=$np $name" || return 0
    if timeout 300 "${MPIRUN[@]}" -np "$np" ./test_zero1 "${MODEL:-$TMP/small.bin}" "$@" >"$TMP/log" 2>&1 &&
       [ "$(tap_verdict "$TMP/log")" = passed ]; then
        ok "np=$np $name"
    else
        not_ok "np=$np $name ($*)" "$TMP/log"
    fi
}

# Every run also repeats its candidate with both overlaps switched and asserts bitwise the
# same result (test_zero1.c; overlap off lays out one bucket, so the flip also changes the
# layout), so no row needs --no-overlap-*: overlap off is proven by every row's flip. At np 1 the communicator is the single-rank one, whose collectives move
# nothing: "one bucket" proves it; each other row's feature is proven at np 2-4, where the
# collectives move data (the split embedding and stochastic rounding keep their np 1 rows).
for np in 1 2 3 4; do
    zero1_row "one bucket" $np -z 1 --bucket-size none
    [ $np = 1 ] && continue
    zero1_row "many small buckets (split params, padding-only ranks)" $np -z 1 --bucket-size 3000
    zero1_row "bucket size hitting a parameter end" $np -z 1 --bucket-size 64
    zero1_row "pad-busbw" $np -z 1 --bucket-size 20000 --pad-busbw
    zero1_row "accumulation" $np --accum 2 --batch 24 -z 1 --bucket-size 5000
    zero1_row "bf16 param storage" $np -z 1 --bucket-size 5000 --param-dtype bf16
    zero1_row "bf16 grad reduction" $np -z 1 --bucket-size 5000 --grad-dtype bf16
    zero1_row "bf16 wire, fp32 accumulation" $np -z 1 --bucket-size 5000 --grad-dtype bf16 --fp32-accumulation
    zero1_row "average in the collective" $np -z 1 --bucket-size 5000 --average-in-collective
    zero1_row "replicated through the runtime (bucketed all-reduce)" $np -z 0 --bucket-size 5000
done

# --stochastic-rounding: the bf16 write-back's bits depend only on (seed, step, model-space
# index). With -l 0 the master stays the initial weights, so the final params are their
# rounding with the last step's bits: the same bits at np 1 (one bucket) and np 2 (small
# buckets, parameters cut by shard bounds), and not round-to-nearest's. With -l 1e-3
# ZeRO-1 still matches the replicated mode within bf16's tolerance.
SR_LR0=(--steps 3 --param-dtype bf16 -l 0 -z 1)  # after test_zero1's own options (--dump-params)
zero1_row "stochastic rounding, lr 0, one bucket" 1 --dump-params "$TMP/sr_np1.bin" "${SR_LR0[@]}" \
    --bucket-size none --stochastic-rounding
zero1_row "stochastic rounding, lr 0, small buckets" 2 --dump-params "$TMP/sr_np2.bin" "${SR_LR0[@]}" \
    --bucket-size 3000 --stochastic-rounding
zero1_row "round to nearest, lr 0" 2 --dump-params "$TMP/rne_np2.bin" "${SR_LR0[@]}" --bucket-size 3000
if ! selected "np=2 stochastic rounding: np 1 == np 2"; then
    :
elif cmp -s "$TMP/sr_np1.bin" "$TMP/sr_np2.bin" && ! cmp -s "$TMP/sr_np1.bin" "$TMP/rne_np2.bin"; then
    ok "stochastic rounding: np 1 (one bucket) == np 2 (bucket size 3000) bitwise, != nearest"
else
    not_ok "stochastic rounding: params differ across DP/bucket size, or equal nearest's"
fi
zero1_row "bf16 param storage, stochastic rounding" 2 -z 1 --bucket-size 5000 --param-dtype bf16 --stochastic-rounding

# Distributed-optimizer instances: K groups of np/K consecutive ranks shard the state, each
# shard all-reduced across the groups (K = np: every group is one rank). The reference is
# still the plain replicated optimizer over all ranks.
for run in "4 2" "6 3" "4 4"; do
    read -r np k <<<"$run"
    zero1_row "$k distributed-optimizer instances" $np -z 1 --bucket-size 3000 --dist-opt-instances $k
done
zero1_row "2 instances, accumulation" 4 --accum 2 --batch 24 -z 1 --bucket-size 5000 --dist-opt-instances 2
zero1_row "2 instances, bf16 grad reduction" 4 -z 1 --bucket-size 5000 --grad-dtype bf16 --dist-opt-instances 2
zero1_row "2 instances, bf16 param storage" 4 -z 1 --bucket-size 5000 --param-dtype bf16 --dist-opt-instances 2
zero1_row "2 instances, fp32 accumulation (the shard crosses in fp32)" 4 -z 1 --bucket-size 5000 --grad-dtype bf16 \
    --fp32-accumulation --dist-opt-instances 2
zero1_row "2 instances, average in the collective (over G, then over K)" 4 -z 1 --bucket-size 5000 \
    --average-in-collective --dist-opt-instances 2
zero1_row "average in the collective, replicated (-z 0)" 3 -z 0 --bucket-size 5000 --average-in-collective
zero1_row "fp32 accumulation, averaged (the 1/DP inside sum_slices)" 3 -z 1 --bucket-size 5000 --grad-dtype bf16 \
    --fp32-accumulation --average-in-collective

# zero1_hazard: the candidate again on the deferred device (device pointers the host cannot
# read, every op run as late as streams and events allow) with the hazard communicator
# (regions NaN while in flight, test() "not yet" at random). A runtime that reads a buffer
# before its collective completes, misses an event between streams or reads the device
# before a sync gets NaN or stale values here, so the comparison fails.
HAZARD=(--test-device deferred --test-hazard)
for np in 2 3 4; do  # np 1 has no collective in flight to poison
    zero1_row "zero1_hazard: one bucket" $np -z 1 --bucket-size none "${HAZARD[@]}"
    zero1_row "zero1_hazard: many small buckets" $np -z 1 --bucket-size 3000 "${HAZARD[@]}"
    zero1_row "zero1_hazard: accumulation" $np --accum 2 --batch 24 -z 1 --bucket-size 5000 "${HAZARD[@]}"
    zero1_row "zero1_hazard: bf16 param storage" $np -z 1 --bucket-size 5000 --param-dtype bf16 "${HAZARD[@]}"
    zero1_row "zero1_hazard: bf16 grad reduction" $np -z 1 --bucket-size 5000 --grad-dtype bf16 "${HAZARD[@]}"
    zero1_row "zero1_hazard: -z 0 (bucketed all-reduce)" $np -z 0 --bucket-size 5000 "${HAZARD[@]}"
done
# The split embedding: wte's classifier part reduced as soon as it is final, the last
# micro-step's encoder rows sent sparsely to their owners and added there (C = 48 model).
SPLIT=(-z 1 --bucket-size 3000 --split-embedding)
for np in 1 2 3 4; do
    MODEL="$TMP/c48.bin" zero1_row "split embedding" $np "${SPLIT[@]}"
done
MODEL="$TMP/c48.bin" zero1_row "split embedding, accumulation" 2 --accum 2 --batch 24 "${SPLIT[@]}"
MODEL="$TMP/c48.bin" zero1_row "split embedding, 2 instances" 4 "${SPLIT[@]}" --dist-opt-instances 2
MODEL="$TMP/c48.bin" zero1_row "split embedding, average in the collective" 3 "${SPLIT[@]}" --average-in-collective
for np in 2 3; do
    MODEL="$TMP/c48.bin" zero1_row "zero1_hazard: split embedding" $np "${SPLIT[@]}" "${HAZARD[@]}"
done
for np in 2 3; do
    zero1_row "zero1_hazard: fp32 accumulation" $np -z 1 --bucket-size 5000 --grad-dtype bf16 --fp32-accumulation "${HAZARD[@]}"
done
zero1_row "zero1_hazard: average in the collective" 2 -z 1 --bucket-size 5000 --average-in-collective "${HAZARD[@]}"
zero1_row "zero1_hazard: 2 instances" 4 -z 1 --bucket-size 3000 --dist-opt-instances 2 "${HAZARD[@]}"
zero1_row "zero1_hazard: 3 instances, bf16 grad reduction" 6 -z 1 --bucket-size 5000 --grad-dtype bf16 \
    --dist-opt-instances 3 "${HAZARD[@]}"

# ZeRO-1 at np=2, B=2 against the PyTorch oracle's losses for the global batch of 4, on the
# CPU device and (zero1_hazard) on the deferred device with the hazard communicator.
$PY dev/test/gpt2_oracle.py make --out-model "$TMP/m.bin" --out-state "$TMP/s.bin" >/dev/null
for extra in "" "${HAZARD[*]}" "--split-embedding"; do
    name="ZeRO-1 vs PyTorch oracle"
    [ "$extra" = "${HAZARD[*]}" ] && name="zero1_hazard: $name"
    [ "$extra" = --split-embedding ] && name="split embedding: $name"
    selected "np=2 $name" || continue
    # shellcheck disable=SC2086  # $extra: the flags, split on purpose
    if timeout 300 "${MPIRUN[@]}" -np 2 ./test_gpt2 "$TMP/m.bin" "$TMP/s.bin" -z 1 --bucket-size 20000 $extra \
        >"$TMP/log" 2>&1 && [ "$(tap_verdict "$TMP/log")" = passed ]; then
        ok "np=2 $name"
    else
        not_ok "np=2 $name" "$TMP/log"
    fi
done

# A planted NaN (LLMC_TEST_PLANT_NAN: on the last rank only) is caught by --check-nan: one
# message, every rank stops; zero1_hazard at np=2 (train_gpt2_testing, which has the test
# options): the flags travel through a collective and are read on the host; with 2
# instances the flags cross from the last rank's group to the other.
for run in "2" "3" "2 ${HAZARD[*]}" "4 --dist-opt-instances 2"; do
    read -r np extra <<<"$run"
    name="planted NaN${extra:+ ($extra)}"
    selected "np=$np $name" || continue
    bin=./train_gpt2
    [ "$extra" = "${HAZARD[*]}" ] && bin=./train_gpt2_testing
    # shellcheck disable=SC2086  # $extra: the flags, split on purpose
    LLMC_TEST_PLANT_NAN=2 timeout 120 "${MPIRUN[@]}" -np $np $bin -e "$TMP/m.bin" -i "data/tinyshakespeare_train.bin" \
        -b 2 -t 32 -x 5 -v 0 -s 0 -z 1 --bucket-size 3000 --check-nan $extra >"$TMP/log" 2>&1
    rc=$?
    n=$(grep -c "error: non-finite gradient in h0.qkvb at step 3" "$TMP/log")
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" = 1 ] && ! grep -q "^step    4" "$TMP/log"; then
        ok "np=$np $name stops every rank with one message"
    else
        not_ok "np=$np $name (rc=$rc, messages=$n)" "$TMP/log"
    fi
done
# --trace: one Chrome trace per rank with per-layer compute, every bucket's reduce-scatter
# and all-gather (with 2 instances also its shard's all-reduce across them), and the step
# lines report the time blocked on communication. The reduce-scatters also show the
# readiness counts learned on the first step (dev/test/trace_overlap.py --learned, which
# pairs each collective with its own step's backward): none fires during its backward,
# some during the second's. First, that check fails on hand-made traces where it must.
if $PY dev/test/trace_overlap.py --self-test >"$TMP/log" 2>&1; then
    ok "trace_overlap.py fails on traces whose collectives start after their own backward"
else
    not_ok "trace_overlap.py --self-test" "$TMP/log"
fi
for run in "2 1" "4 2"; do
    read -r np k <<<"$run"
    selected "np=$np --trace" || continue
    rm -f "$TMP"/trace.rank*.json
    timeout 120 "${MPIRUN[@]}" -np $np ./train_gpt2 -e "$TMP/m.bin" -i "data/tinyshakespeare_train.bin" -b 2 -t 32 \
        -x 3 -v 0 -s 0 -z 1 --bucket-size 20000 --dist-opt-instances $k --trace "$TMP/trace.json" >"$TMP/log" 2>&1
    buckets=$(awk '/^zero1: .* [0-9]+\.\.[0-9]+$/ { n++ } END { print n + 0 }' "$TMP/log")
    overlap=1
    for ((rank = 0; rank < np; rank++)); do
        $PY dev/test/trace_overlap.py "$TMP/trace.rank$rank.json" "reduce-scatter b" --learned >>"$TMP/log" 2>&1 || overlap=0
    done
    if grep -q "comm wait" "$TMP/log" && [ $overlap = 1 ] && $PY - "$TMP" "$buckets" $np $k <<'PYEOF'
import json, sys
work, buckets, np_, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
assert buckets > 1, "expected several buckets"
for rank in range(np_):
    events = json.load(open(f"{work}/trace.rank{rank}.json"))["traceEvents"]
    names = [e["name"] for e in events if e.get("ph") == "X"]
    for layer in (-1, 0, 1, 2):  # embeddings, both blocks, final norm + classifier (L=2)
        assert names.count(f"forward {layer}") >= 3 and names.count(f"backward {layer}") >= 3, layer
    for b in range(buckets):
        assert names.count(f"reduce-scatter b{b}") == 3, ("reduce-scatter", b, names.count(f"reduce-scatter b{b}"))
        assert names.count(f"all-gather b{b}") >= 2, ("all-gather", b)
        cross = names.count(f"all-reduce across instances b{b}")
        assert cross == (3 if k > 1 else 0), ("all-reduce across instances", b, cross)
    assert all(e["dur"] >= 0 for e in events if e.get("ph") == "X")
PYEOF
    then
        ok "np=$np --trace ($k instance(s)): per-layer compute, per-bucket collectives"
    else
        not_ok "np=$np --trace ($k instance(s))" "$TMP/log"
    fi
done
# Overlap off lays out one bucket, as Megatron's DDP does, and says a --bucket-size given is
# not used; the same flags with overlap lay out several.
if selected "np=2 one bucket without overlap"; then
    layout() {  # layout FLAGS...: the start-up's bucket rows and notes of a 1-step run at np 2
        timeout 120 "${MPIRUN[@]}" -np 2 ./train_gpt2 -e "$TMP/m.bin" -i "data/tinyshakespeare_train.bin" -b 2 -t 32 \
            -x 1 -v 0 -s 0 -z 1 --bucket-size 3000 "$@" >"$TMP/log" 2>&1 || return 1
        echo "$(awk '/^zero1: .* [0-9]+\.\.[0-9]+$/ { n++ } END { print n + 0 }' "$TMP/log") buckets" \
            "$(grep -c '^zero1: note: --no-overlap-grad-reduce lays out one bucket.*--bucket-size 3000 is not used' "$TMP/log") notes"
    }
    off=$(layout --no-overlap-grad-reduce) on=$(layout)
    if [ "$off" = "1 buckets 1 notes" ] && [[ $on == *" buckets 0 notes" ]] && [ "${on%% *}" -gt 1 ]; then
        ok "np=2 one bucket without overlap, and a note (with overlap: ${on%% buckets*} buckets)"
    else
        not_ok "np=2 one bucket without overlap: off '$off', on '$on'" "$TMP/log"
    fi
fi
done_testing
