#!/usr/bin/env bash
# Benchmark across hosts with shaped links (dev/test/multihost.sh: network namespaces, veth
# links at MULTIHOST_RATE, default 1gbit): the CPU trainer at np=4 on 2 hosts x 2 ranks,
#   flat ZeRO-1 (reduce-scatter and all-gather over all 4 ranks, across the link) vs
#   2 distributed-optimizer instances, one per host (--dist-opt-instances 2: reduce-scatter
#   and all-gather inside a host, only the shard all-reduce crosses the link),
# each with overlap on and off. Per configuration: the mean step time and time blocked on
# communication ("comm wait") over the steps after the first, and the bytes host 0 sent on
# its link per step; medians of BENCH_REPEATS (default 3) runs, the configurations taking
# turns so that drift in machine load hits all alike; ratios side by side.
# Not part of `make test` (2-4 minutes): bash scripts/bench_multihost.sh
# Environment: BENCH_MODEL (d4), BENCH_B (1), BENCH_T (64), BENCH_STEPS (6), BENCH_REPEATS,
# MULTIHOST_RATE. Needs root (namespaces). This kernel may lack sch_netem: the links are then
# shaped by rate only and no latency is added (the script says which).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/../dev/test/env.sh"
source dev/test/multihost.sh
MODEL=${BENCH_MODEL:-d4}
B=${BENCH_B:-1}
T=${BENCH_T:-64}
STEPS=${BENCH_STEPS:-6}
REPEATS=${BENCH_REPEATS:-3}
DATA=data/tinyshakespeare_train.bin

WORK=$(mktemp -d /tmp/bench_multihost.XXXXXX)
trap 'mh_teardown; rm -rf "$WORK"' EXIT
trap 'exit 143' TERM INT HUP
make -s train_gpt2 USE_ZERO1=1 >/dev/null || { echo "bench_multihost: cannot build train_gpt2" >&2; exit 1; }
make -s data >/dev/null || { echo "bench_multihost: make data failed" >&2; exit 1; }
mh_setup 2
case $? in
    0) ;;
    2) echo "SKIPPED bench_multihost: $MH_SKIP_REASON"; exit 0 ;;
    *) echo "bench_multihost: could not build the hosts" >&2; exit 1 ;;
esac

declare -A FLAGS=(
    [flat_on]=""
    [flat_off]="--no-overlap-grad-reduce --no-overlap-param-gather"
    [inst_on]="--dist-opt-instances 2"
    [inst_off]="--dist-opt-instances 2 --no-overlap-grad-reduce --no-overlap-param-gather"
)
declare -A DESC=(
    [flat_on]="flat ZeRO-1, overlap on" [flat_off]="flat ZeRO-1, overlap off"
    [inst_on]="2 instances, overlap on" [inst_off]="2 instances, overlap off"
)
CONFIGS=(flat_on flat_off inst_on inst_off)
ARGS=(-e "$MODEL" -i "$DATA" -b "$B" -t "$T" -x "$STEPS" -v 0 -s 0 -z 1)

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# Means over the step lines after the first: the step time ("| 812.3 ms |") and "comm wait 3.1 ms".
step_ms() { awk -F'|' '/^step/ && ++n > 1 { split($5, a, " "); s += a[1]; c++ } END { if (c) printf "%.1f\n", s / c }' "$1"; }
wait_ms() { awk '/^step/ && ++n > 1 { for (i = 1; i <= NF; i++) if ($i == "wait") { s += $(i + 1); c++ } } END { if (c) printf "%.1f\n", s / c }' "$1"; }

echo "bench_multihost: GPT-2 $MODEL, 2 hosts x 2 ranks, B=$B T=$T, $STEPS steps (the first not timed), links: $MH_SHAPING"
for r in $(seq "$REPEATS"); do
    for c in "${CONFIGS[@]}"; do
        log=$WORK/$c.$r.log
        tx0=$(mh_tx_bytes 0)
        # shellcheck disable=SC2086  # FLAGS: words on purpose
        if ! MH_TIMEOUT=600 mh_mpirun 2 2 ./train_gpt2 "${ARGS[@]}" ${FLAGS[$c]} >"$log" 2>&1 ||
           ! grep -q "parameters identical on all 4 ranks: yes" "$log"; then
            echo "bench_multihost: run $c ($r) failed:" >&2
            tail -n 15 "$log" >&2
            exit 1
        fi
        echo $(( ($(mh_tx_bytes 0) - tx0) / STEPS )) >>"$WORK/$c.tx"
        step_ms "$log" >>"$WORK/$c.ms"
        wait_ms "$log" >>"$WORK/$c.wait"
        echo "  repeat $r $c: $(tail -n 1 "$WORK/$c.ms") ms/step, comm wait $(tail -n 1 "$WORK/$c.wait") ms"
    done
done

declare -A MS WAIT TX
for c in "${CONFIGS[@]}"; do
    MS[$c]=$(median <"$WORK/$c.ms")
    WAIT[$c]=$(median <"$WORK/$c.wait")
    TX[$c]=$(median <"$WORK/$c.tx")
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else printf "-" }'; }
echo
echo "medians of $REPEATS runs (ms per step, after the first step; MB sent by host 0 per step, headers included)"
printf "  %-26s %10s %12s %12s\n" "configuration" "step ms" "comm wait" "host 0 MB"
for c in "${CONFIGS[@]}"; do
    printf "  %-26s %10.1f %12.1f %12.1f\n" "${DESC[$c]}" "${MS[$c]}" "${WAIT[$c]}" \
        "$(awk -v b="${TX[$c]}" 'BEGIN { print b / 1e6 }')"
done
echo "ratios:"
printf "  overlap on / off:         flat step %s  comm wait %s | instances step %s  comm wait %s\n" \
    "$(ratio "${MS[flat_on]}" "${MS[flat_off]}")" "$(ratio "${WAIT[flat_on]}" "${WAIT[flat_off]}")" \
    "$(ratio "${MS[inst_on]}" "${MS[inst_off]}")" "$(ratio "${WAIT[inst_on]}" "${WAIT[inst_off]}")"
printf "  instances / flat:         overlap on step %s  comm wait %s  host 0 bytes %s | overlap off step %s  comm wait %s\n" \
    "$(ratio "${MS[inst_on]}" "${MS[flat_on]}")" "$(ratio "${WAIT[inst_on]}" "${WAIT[flat_on]}")" \
    "$(ratio "${TX[inst_on]}" "${TX[flat_on]}")" \
    "$(ratio "${MS[inst_off]}" "${MS[flat_off]}")" "$(ratio "${WAIT[inst_off]}" "${WAIT[flat_off]}")"
