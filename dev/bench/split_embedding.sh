#!/usr/bin/env bash
# The split embedding (--split-embedding) against wte's dense bucket, side by side in one
# invocation: train_gpt2 (USE_ZERO1=1) at np 4 on random GPT-2s of depth 4 and 6 (V=50257),
# a few steps each with --trace, the flag off and on, runs alternating.
#
# For each run, from rank 0's log and every rank's trace:
#   tail collective   what can only start after the encoder's backward (the last compute of
#                     the backward): off, wte's bucket's reduce-scatter; on, the sparse
#                     all-to-all of the encoder's rows
#   tail KiB/rank     what that collective sends per rank and step: off, the ring's
#                     (DP-1)/DP of the bucket in fp32; on, the rows rank 0 sent to others
#   exposed ms/step   per step, from the end of "backward -1" (the encoder) to the end of
#                     the last wait for a gradient collective (reduce-scatter, all-to-all,
#                     all-reduce across instances; the norm's all-reduce is not counted);
#                     0 when nothing is waited for; mean over ranks and steps after the first
#   step ms           the step lines' mean after the first step
# Environment: BENCH_STEPS (default 5), BENCH_REPEATS (default 1), BENCH_BUCKET (default
# 1000000 elements: several buckets, so that "off" has wte's bucket at the end as a tail).
set -eu
source "$(dirname "${BASH_SOURCE[0]}")/../test/env.sh"
STEPS=${BENCH_STEPS:-5}
REPEATS=${BENCH_REPEATS:-1}
BUCKET=${BENCH_BUCKET:-1000000}
NP=4 B=4 T=64
bench_work_dir
make -s train_gpt2 USE_ZERO1=1 >/dev/null
make -s data >/dev/null

run() {  # run MODEL on|off REPEAT: one traced run, its row of the table appended to $work/rows
    local model=$1 split=$2 r=$3 flag=() log="$work/$1_$2_$3.log"
    [ "$split" = on ] && flag=(--split-embedding)
    "${MPIRUN[@]}" -np $NP ./train_gpt2 -e "$model" -b $B -t $T -x "$STEPS" -v 0 -s 0 -z 1 --bucket-size "$BUCKET" \
        "${flag[@]}" --trace "$work/trace_$1_$2_$3.json" >"$log" 2>&1
    $PY - "$work" "$model" "$split" "$r" $NP "$log" >>"$work/rows" <<'PYEOF'
import json, re, statistics, sys
work, model, split, r, np_, log = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
text = open(log).read()
# The bucket that holds wte (parameter 0): "zero1: <b> <start> <end> <unpadded> <padding>  0..<k>".
buckets = re.findall(r"^zero1: +(\d+) +(\d+) +(\d+) +\d+ +\d+  (\d+)\.\.(\d+)$", text, re.M)
wte = [b for b in buckets if b[3] == "0"][0]
wte_bytes = (int(wte[2]) - int(wte[1])) * 4
if split == "on":
    kib = float(re.search(r"split embedding: rank 0 sent [\d.]+ rows per step to other ranks \(([\d.]+) KiB", text).group(1))
    what = f"all-to-all b{wte[0]}"
else:
    kib = (np_ - 1) / np_ * wte_bytes / 1024
    what = f"reduce-scatter b{wte[0]} ({wte_bytes / 2**20:.1f} MiB bucket)"
steps = [float(m) for m in re.findall(r"^step .*\| ([\d.]+) ms \|", text, re.M)][1:]
grad_wait = re.compile(r"^wait (reduce-scatter|all-to-all|all-reduce across instances) ")
exposed = []
for rank in range(np_):
    ev = [e for e in json.load(open(f"{work}/trace_{model}_{split}_{r}.rank{rank}.json"))["traceEvents"]
          if e.get("ph") == "X"]
    ends = sorted(e["ts"] + e["dur"] for e in ev if e["name"] == "backward -1")
    waits = [(e["ts"], e["ts"] + e["dur"]) for e in ev if grad_wait.match(e["name"])]
    for i, t in enumerate(ends[1:], 1):
        nxt = ends[i + 1] if i + 1 < len(ends) else float("inf")
        last = max([w[1] for w in waits if t <= w[0] < nxt], default=t)
        exposed.append((last - t) / 1000)
print(f"{model}\t{split}\t{what}\t{kib:.1f}\t{statistics.mean(exposed):.1f}\t{statistics.mean(steps):.1f}")
PYEOF
}

: >"$work/rows"
for model in d4 d6; do
    for r in $(seq "$REPEATS"); do
        run $model off "$r"
        run $model on "$r"
    done
done
echo "split embedding at np $NP, B=$B T=$T per rank, --bucket-size $BUCKET, $STEPS steps (first not counted)"
printf "%-5s %-6s %-36s %14s %16s %10s\n" model split "tail collective" "tail KiB/rank" "exposed ms/step" "step ms"
awk -F'\t' '{ printf "%-5s %-6s %-36s %14s %16s %10s\n", $1, $2, $3, $4, $5, $6 }' "$work/rows"
