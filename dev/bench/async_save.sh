#!/usr/bin/env bash
# What a checkpoint save costs the step loop, synchronous against --async-save 1, side by
# side in one invocation: train_gpt2 (USE_ZERO1=1) at np 2 on a random GPT-2 (BENCH_MODEL,
# default d4: 4 layers, 256 channels, V=50257), a save every BENCH_EVERY steps (default 4)
# for BENCH_STEPS steps (default 24), the two modes alternating BENCH_REPEATS times
# (default 2).
#
# A step line's ms leaves out the save that follows it, so rank 0's output is stamped line
# by line as it arrives (a monotonic clock), and the interval between the lines of steps
# N-1 and N is step N's wall time plus whatever ran before it: after a save step, the save
# (sync: all of it; async: the snapshot, the agreement and the commit, and any slowdown
# the writer thread causes). For each mode:
#   step ms       median interval of the steps after which nothing was saved (steps 1-2,
#                 start-up, and the last save, at the end of the run, left out)
#   after-save ms median interval that follows a save step
#   save cost ms  their difference: what one save adds to the loop
#   waits         async: saves that found the previous one still being written, and
#   waited s      how long they waited in all (included in the intervals above)
#   run s         the whole run, start-up and the last save included
# The files are the same either way (dev/test/test_async_save.sh).
set -eu
source "$(dirname "${BASH_SOURCE[0]}")/../test/env.sh"
MODEL=${BENCH_MODEL:-d4}
EVERY=${BENCH_EVERY:-4}
STEPS=${BENCH_STEPS:-24}
REPEATS=${BENCH_REPEATS:-2}
NP=2 B=4 T=64
bench_work_dir
make -s train_gpt2 USE_ZERO1=1 >/dev/null
make -s data >/dev/null

run() {  # run sync|async REPEAT: one run, its row appended to $work/rows
    local mode=$1 r=$2 flag=() log="$work/$1_$2.log"
    [ "$mode" = async ] && flag=(--async-save 1)
    rm -rf "$work/out"
    local t0=$SECONDS
    "${MPIRUN[@]}" -np $NP ./train_gpt2 -e "$MODEL" -b $B -t $T -x "$STEPS" -v 0 -s 0 -z 1 -n "$EVERY" \
        -o "$work/out" "${flag[@]}" 2>&1 |
        $PY -u -c 'import sys, time
for line in sys.stdin: sys.stdout.write("%.6f %s" % (time.monotonic(), line))' >"$log"
    $PY - "$log" "$mode" "$EVERY" "$STEPS" $((SECONDS - t0)) >>"$work/rows" <<'PYEOF'
import re, statistics, sys
log, mode, every, steps, run_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
at = {}
for line in open(log):
    m = re.match(r"([\d.]+) step +(\d+)/\d+ \|", line)
    if m: at[int(m.group(2))] = float(m.group(1))
plain, after_save = [], []
for n in range(3, steps + 1):
    gap = (at[n] - at[n - 1]) * 1000
    (after_save if (n - 1) % every == 0 else plain).append(gap)
p, a = statistics.median(plain), statistics.median(after_save)
waits = [float(w) for w in re.findall(r"save waited ([\d.]+) s for step", open(log).read())]
print(f"{mode}\t{p:.1f}\t{a:.1f}\t{a - p:.1f}\t{len(waits)}\t{sum(waits):.2f}\t{run_s}")
PYEOF
}

: >"$work/rows"
for r in $(seq "$REPEATS"); do
    run sync "$r"
    run async "$r"
done
ckpt=$(grep -o "saved in [^ ]* ([0-9.]* MiB" "$work/sync_1.log" | head -1 | sed 's/.*(//')
echo "checkpoint saves at np $NP, -e $MODEL, B=$B T=$T per rank, -n $EVERY -x $STEPS ($ckpt per checkpoint), runs alternating"
printf "%-6s %8s %14s %13s %6s %8s %6s\n" mode "step ms" "after-save ms" "save cost ms" waits "waited s" "run s"
awk -F'\t' '{ printf "%-6s %8s %14s %13s %6s %8s %6s\n", $1, $2, $3, $4, $5, $6, $7 }' "$work/rows"
echo "async: $(grep -o "the step paused [0-9.]* s for the snapshot" "$work/async_1.log" | head -1), per rank"
