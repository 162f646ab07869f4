#!/usr/bin/env bash
# Muon against AdamW on the CPU trainer (train_gpt2_plain; issue 43's make bench figures), one invocation:
#  (a) tokens to reach a validation loss of TARGET on tinyshakespeare with a random d4 GPT-2
#      (L=4 C=256, B=8 T=64: 512 tokens a step, validation every 10 steps on 8 batches), each
#      optimizer at its best -l of LRS (the sweep at seed 42: fewest tokens wins), then that -l
#      at seeds 43 and 44: the median of the three, and the ratio Muon / AdamW. A run stops once
#      it reaches the target (killed: only its main.log is read) or at MAX_STEPS (not reached).
#      Same data, order and seeds for both; the expectation (not a test) is that Muon needs fewer.
#  (b) the optimizer update's share of the step, Muon's and AdamW's: train_gpt2's end line
#      "optimizer update (OPT): X ms per step" over its "average step", each from one run.
# Prints one line per run, then `figure NAME VALUE` lines (scripts/bench.sh tables them).
# Environment: MUON_TARGET (default 6.4), MUON_LRS (default "1e-3 3e-3 1e-2"), MUON_MAX_STEPS (200).
set -eu
source "$(dirname "${BASH_SOURCE[0]}")/../test/env.sh"
TARGET=${MUON_TARGET:-6.4}
LRS=${MUON_LRS:-1e-3 3e-3 1e-2}
MAX_STEPS=${MUON_MAX_STEPS:-200}
bench_work_dir
make -s train_gpt2_plain >/dev/null  # the plain replicated optimizer, whose end line times the update
make -s data >/dev/null

# first_step DIR: the first step whose validation loss is <= TARGET, or empty.
first_step() { awk -F'[: ]+' -v t="$TARGET" '$3 == "tel" && $4 <= t { print $2; exit }' "$1/main.log" 2>/dev/null; }

# tokens OPT LR SEED: tokens until TARGET (0: not reached in MAX_STEPS); the run's line on stderr.
tokens() {
    local dir="$work/$1_$2_$3"
    OMP_NUM_THREADS=2 ./train_gpt2_plain -z 0 -e d4 -b 8 -t 64 -x "$MAX_STEPS" -v 10 -m 8 -s 0 -l "$2" -c 0.1 --seed "$3" \
        --optimizer "$1" -i data/tinyshakespeare_train.bin -j data/tinyshakespeare_val.bin -o "$dir" \
        >"$dir.log" 2>&1 &
    local pid=$! step=""
    while kill -0 $pid 2>/dev/null; do
        step=$(first_step "$dir")
        [ -n "$step" ] && { kill $pid 2>/dev/null || true; break; }
        sleep 0.2
    done
    wait $pid 2>/dev/null || true
    [ -n "$step" ] || step=$(first_step "$dir")
    echo "  $1 -l $2 --seed $3: $([ -n "$step" ] && echo "val <= $TARGET at step $step" || echo "not reached in $MAX_STEPS steps")" >&2
    echo $((${step:-0} * 512))
}

median3() { printf '%s\n' "$@" | sort -g | sed -n 2p; }
declare -A best_lr best_tokens
for opt in adamw muon; do
    best_tokens[$opt]=0
    for lr in $LRS; do
        t=$(tokens $opt "$lr" 42)
        if [ "$t" -gt 0 ] && { [ "${best_tokens[$opt]}" = 0 ] || [ "$t" -lt "${best_tokens[$opt]}" ]; }; then
            best_tokens[$opt]=$t
            best_lr[$opt]=$lr
        fi
    done
done
declare -A median
for opt in adamw muon; do
    if [ "${best_tokens[$opt]}" = 0 ]; then
        echo "figure tokens to val loss $TARGET, $opt|not reached in $MAX_STEPS steps at any -l of ($LRS)"
        continue
    fi
    t43=$(tokens $opt "${best_lr[$opt]}" 43)
    t44=$(tokens $opt "${best_lr[$opt]}" 44)
    median[$opt]=$(median3 "${best_tokens[$opt]}" "$t43" "$t44")
    echo "figure tokens to val loss $TARGET, $opt at its best -l ${best_lr[$opt]} (seeds 42 43 44: ${best_tokens[$opt]} $t43 $t44; 0 = not reached), median|${median[$opt]}"
done
if [ -n "${median[adamw]:-}" ] && [ -n "${median[muon]:-}" ] && [ "${median[adamw]}" -gt 0 ]; then
    echo "figure Muon / AdamW tokens to val loss $TARGET (d4, tinyshakespeare)|$(awk -v m="${median[muon]}" -v a="${median[adamw]}" 'BEGIN { printf "%.2f", m / a }')"
fi

# (b): one run of each optimizer, 20 steps on the train data.
for opt in muon adamw; do
    OMP_NUM_THREADS=2 ./train_gpt2_plain -z 0 -e d4 -b 8 -t 64 -x 20 -v 0 -s 0 --optimizer $opt -l 3e-3 \
        -i data/tinyshakespeare_train.bin >"$work/share_$opt.log" 2>&1
    update=$(sed -n "s/^optimizer update ($opt): \([0-9.]*\) ms per step.*/\1/p" "$work/share_$opt.log")
    step=$(sed -n 's/^average step \([0-9.]*\) ms.*/\1/p' "$work/share_$opt.log")
    echo "figure $opt's optimizer update / step time, d4 B=8 T=64, 2 threads|$update / $step ms = $(awk -v u="$update" \
        -v s="$step" 'BEGIN { printf "%.1f%%", 100 * u / s }')"
done
