#!/usr/bin/env bash
# The CPU execution layer's speed in two trees, side by side: each tree's bench_cuda_cpu
# (cuda_cpu/tests/bench_layer.cu, make bench's section 3; ./bench_cuda_cpu in trees older
# than the top-level cuda_cpu/) run in turn, REPEATS times
# (A B A B ...: drift in the machine's load hits both alike). Evidence for a note, not a
# test: it prints medians and ranges, it never judges.
#   dev/bench/layer_speed.sh BEFORE_TREE AFTER_TREE [REPEATS]   (REPEATS: default 7)
# The after tree runs twice a repeat: with the block workers it chooses, and with
# CUDA_CPU_BLOCK_WORKERS=1 (one block after another: the fiber machinery alone). Per kernel:
# threads/s, and its time per thread in the host loop's time per element (computed, for a
# bench that prints only the elementwise ratio, from that ratio and the threads/s).
set -u
[ $# -ge 2 ] || { sed -n 2,9p "$0"; exit 2; }
BEFORE=$(cd "$1" && pwd) AFTER=$(cd "$2" && pwd) || exit 2
REPEATS=${3:-7}
PY=${LLMC_PYTHON:-/usr/bin/python3}
W=$(mktemp -d /tmp/layer_speed.XXXXXX)
trap 'rm -rf "$W"' EXIT
bench() {  # bench TREE: the path of TREE's benchmark binary
    if [ -d "$1/cuda_cpu" ]; then echo "$1/build/cuda_cpu/tests/bench_layer"; else echo "$1/bench_cuda_cpu"; fi
}
for tree in "$BEFORE" "$AFTER"; do
    (cd "$tree" && make -s bench_cuda_cpu CUDA_ON_CPU=1 >/dev/null) || { echo "error: cannot build bench_cuda_cpu in $tree"; exit 1; }
done
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
for r in $(seq "$REPEATS"); do
    (cd "$BEFORE" && "$(bench "$BEFORE")") >"$W/before.$r"
    (cd "$AFTER" && "$(bench "$AFTER")") >"$W/after.$r"
    (cd "$AFTER" && CUDA_CPU_BLOCK_WORKERS=1 "$(bench "$AFTER")") >"$W/after1.$r"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
$PY - "$W" "$REPEATS" <<'PYEOF'
import re, statistics, sys
w, repeats = sys.argv[1], int(sys.argv[2])
KERNELS = ["elementwise", "barriers", "shuffles"]

def figures(path):
    """{kernel: (threads/s, x host loop)} from one run of either bench's output."""
    text = open(path).read()
    tps, ratio = {}, {}
    for k in KERNELS:
        m = re.search(r"^ *%s.*? ([0-9]+) threads/s.*?(?:, +([0-9.]+) x the host loop's time per element)?$" % k, text, re.M)
        tps[k] = float(m.group(1))
        if m.group(2): ratio[k] = float(m.group(2))
    if len(ratio) < len(KERNELS):  # per thread / host per element = the elementwise ratio x tps(ew) / tps(k)
        old = float(re.search(r"elementwise on the layer / plain host loop = ([0-9.]+) x", text).group(1))
        ratio = {k: old * tps["elementwise"] / tps[k] for k in KERNELS}
    return {k: (tps[k], ratio[k]) for k in KERNELS}

runs = {side: [figures("%s/%s.%d" % (w, side, r)) for r in range(1, repeats + 1)] for side in ("before", "after1", "after")}
def med(side, k, i): return statistics.median(run[k][i] for run in runs[side])
def span(side, k, i): return "%.4g..%.4g" % (min(run[k][i] for run in runs[side]), max(run[k][i] for run in runs[side]))
def pair_span(side, k, i):  # the repeats' after / before (threads/s) or before / after (x host)
    r = [(a[k][i] / b[k][i]) if i == 0 else (b[k][i] / a[k][i]) for a, b in zip(runs[side], runs["before"])]
    return "%.2f (repeats %.2f..%.2f)" % (statistics.median(r), min(r), max(r))
print("medians of %d repeats (ranges); speed-up: after / before threads/s, paired repeat by repeat" % repeats)
print("| kernel | figure | before | after, 1 block worker | after, default workers | speed-up 1 worker | speed-up default |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for k in KERNELS:
    for i, name in ((0, "threads/s"), (1, "x host loop per element")):
        cells = ["%.4g (%s)" % (med(s, k, i), span(s, k, i)) for s in ("before", "after1", "after")]
        print("| %s | %s | %s | %s | %s | %s | %s |" % (k, name, *cells, pair_span("after1", k, i), pair_span("after", k, i)))
PYEOF
