#!/usr/bin/env bash
# `make bench`: CPU benchmarks, every figure a ratio of runs made side by side in this
# one invocation (the machine is shared and noisy, so absolute times mean little).
#
#  1. C trainer vs PyTorch eager, one thread, same model, batch and AdamW:
#     tokens/s of train_gpt2 / tokens/s of dev/test/gpt2_oracle.py bench.
#  2. ZeRO-1 vs replicated at np=2 (train_gpt2 built with USE_ZERO1=1):
#     step time ratio, optimizer-state bytes per rank ratio, and the milliseconds per step
#     blocked on communication with overlap on vs off.
#  3. the CPU execution layer for CUDA: emulated device threads per second (elementwise,
#     barrier-heavy, shuffle-heavy kernels), elementwise against a plain host loop.
#  4. OpenBLAS kernels: sgemm GFLOP/s and a C trainer step with the Prescott kernels forced
#     (what cloud VMs with a generic CPU model got) against the automatic choice
#     (llmc/blas_cores.h), and with that fault faked and repaired by the restart.
# Runs alternate (A B A B ...) so that drift in machine load hits both sides alike;
# medians over the repeats. Environment: BENCH_REPEATS (default 3), BENCH_STEPS (default 8).
set -eu
source "$(dirname "${BASH_SOURCE[0]}")/../dev/test/env.sh"
REPEATS=${BENCH_REPEATS:-3}
STEPS=${BENCH_STEPS:-8}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

make -s train_gpt2 USE_ZERO1=1 >/dev/null
make -s data >/dev/null

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# Mean over the steps after the first of a field of the step lines ("| 812.3 ms |", "comm wait 3.1 ms").
step_ms() { awk -F'|' '/^step/ && ++n > 1 { split($5, a, " "); s += a[1]; c++ } END { printf "%.3f\n", s / c }' "$1"; }
wait_ms() { awk '/^step/ && ++n > 1 { for (i = 1; i <= NF; i++) if ($i == "wait") { s += $(i + 1); c++ } } END { printf "%.3f\n", s / c }' "$1"; }

# ---- 1. one thread: C vs PyTorch eager --------------------------------------------------
L=4 C=256 NH=4 T=128 B=4
$PY dev/test/gpt2_oracle.py make --out-model "$work/model.bin" --out-state "$work/state.bin" \
    --layers $L --channels $C --heads $NH --max-seq $T --seq $T --batch $B --steps 1 >/dev/null
echo "== 1. training throughput, one thread: GPT-2 L=$L C=$C NH=$NH V=50257, B=$B T=$T, forward+backward+AdamW"
: >"$work/c_tps"
: >"$work/py_tps"
for r in $(seq "$REPEATS"); do
    ./train_gpt2 -z 0 -e "$work/model.bin" -b $B -t $T -x $((STEPS + 1)) -v 0 -s 0 -l 1e-4 -c 0.1 >"$work/c.log"
    awk -v bt=$((B * T)) -v ms="$(step_ms "$work/c.log")" 'BEGIN { printf "%.1f\n", bt / (ms / 1000) }' >>"$work/c_tps"
    $PY dev/test/gpt2_oracle.py bench --model "$work/model.bin" --batch $B --seq $T --steps "$STEPS" --threads 1 \
        | awk '/oracle_tokens_per_s/ { print $2 }' >>"$work/py_tps"
done
c_tps=$(median <"$work/c_tps")
py_tps=$(median <"$work/py_tps")
printf "  C trainer      %10.1f tok/s   (median of %d)\n" "$c_tps" "$REPEATS"
printf "  PyTorch eager  %10.1f tok/s\n" "$py_tps"
awk -v a="$c_tps" -v b="$py_tps" 'BEGIN { printf "  ratio C / PyTorch = %.2f (goal >= 1.0)\n", a / b }'

# ---- 2. ZeRO-1 vs replicated at np=2 ------------------------------------------------------
NP=2 B2=2
DATA=data/tinyshakespeare_train.bin
common=(-e "$work/model.bin" -i "$DATA" -b $B2 -t $T -x $((STEPS + 1)) -v 0 -s 0 -l 1e-4 --bucket-size 1000000)
echo "== 2. ZeRO-1 vs replicated, np=$NP, B=$B2 per rank, T=$T, bucket size 1e6 elements"
: >"$work/z1_ms"; : >"$work/z0_ms"; : >"$work/on_wait"; : >"$work/off_wait"
for r in $(seq "$REPEATS"); do
    "${MPIRUN[@]}" -np $NP ./train_gpt2 "${common[@]}" -z 1 >"$work/z1.log" 2>&1
    "${MPIRUN[@]}" -np $NP ./train_gpt2 "${common[@]}" -z 0 >"$work/z0.log" 2>&1
    "${MPIRUN[@]}" -np $NP ./train_gpt2 "${common[@]}" -z 1 --no-overlap-grad-reduce --no-overlap-param-gather \
        >"$work/off.log" 2>&1
    step_ms "$work/z1.log" >>"$work/z1_ms"
    step_ms "$work/z0.log" >>"$work/z0_ms"
    wait_ms "$work/z1.log" >>"$work/on_wait"
    wait_ms "$work/off.log" >>"$work/off_wait"
done
z1=$(median <"$work/z1_ms"); z0=$(median <"$work/z0_ms")
s1=$(awk '/optimizer state bytes on rank 0/ { print $NF }' "$work/z1.log")
s0=$(awk '/optimizer state bytes on rank 0/ { print $NF }' "$work/z0.log")
on=$(median <"$work/on_wait"); off=$(median <"$work/off_wait")
printf "  step time       ZeRO-1 %8.1f ms   replicated %8.1f ms   ratio %.3f (goal <= 1.0)\n" "$z1" "$z0" \
    "$(awk -v a="$z1" -v b="$z0" 'BEGIN { print a / b }')"
printf "  optimizer state ZeRO-1 %10d B  replicated %10d B  ratio %.4f (1/DP = %.4f)\n" "$s1" "$s0" \
    "$(awk -v a="$s1" -v b="$s0" 'BEGIN { print a / b }')" "$(awk -v n=$NP 'BEGIN { print 1 / n }')"
printf "  blocked on comm overlap on %7.2f ms/step   overlap off %7.2f ms/step   ratio %.3f\n" "$on" "$off" \
    "$(awk -v a="$on" -v b="$off" 'BEGIN { if (b > 0) print a / b; else print 0 }')"

# ---- 3. the CPU execution layer for CUDA ---------------------------------------------------
# Device threads per second for a kernel that never waits, one full of __syncthreads and one
# full of warp shuffles, and the elementwise one against a plain host loop (dev/cuda_cpu/).
echo "== 3. CPU execution layer for CUDA: emulated device threads (one worker thread)"
make -s bench_cuda_cpu CUDA_ON_CPU=1 >/dev/null
./bench_cuda_cpu

# ---- 4. OpenBLAS kernels: the cloud-VM fault against the automatic choice ----------------
# "forced": OPENBLAS_CORETYPE=Prescott, which llmc/blas_cores.h respects as the user's choice;
# "auto": no OPENBLAS_CORETYPE; "repaired": LLMC_TEST_BLAS_CORENAME=Prescott makes the
# program believe OpenBLAS chose Prescott, so it restarts itself with the right kernels.
echo "== 4. OpenBLAS kernels, one thread: Prescott forced vs the automatic choice"
make -s bench_sgemm >/dev/null
B4=1
declare -A core_of
: >"$work/gf_forced"; : >"$work/gf_auto"; : >"$work/gf_repaired"; : >"$work/st_forced"; : >"$work/st_auto"
for r in $(seq "$REPEATS"); do
    for side in forced auto repaired; do
        case $side in
        forced) envs=(OPENBLAS_CORETYPE=Prescott) ;;
        auto) envs=() ;;
        repaired) envs=(LLMC_TEST_BLAS_CORENAME=Prescott) ;;
        esac
        env -u OPENBLAS_CORETYPE -u LLMC_TEST_BLAS_CORENAME "${envs[@]}" ./bench_sgemm 0.5 >"$work/sgemm.out"
        awk '/^sgemm_gflops/ { print $2 }' "$work/sgemm.out" >>"$work/gf_$side"
        core_of[$side]=$(awk '/^sgemm_gflops/ { print $4 }' "$work/sgemm.out")
        [ $side = repaired ] && continue  # the trainer's restart is the same call as bench_sgemm's
        env -u OPENBLAS_CORETYPE -u LLMC_TEST_BLAS_CORENAME "${envs[@]}" \
            ./train_gpt2 -z 0 -e "$work/model.bin" -b $B4 -t $T -x 3 -v 0 -s 0 -l 1e-4 >"$work/st.log"
        step_ms "$work/st.log" >>"$work/st_$side"
    done
done
for side in forced auto repaired; do
    printf "  sgemm 512x3072x768  %-8s %-9s %7.1f GFLOP/s\n" "$side" "${core_of[$side]}" "$(median <"$work/gf_$side")"
done
awk -v a="$(median <"$work/gf_auto")" -v b="$(median <"$work/gf_forced")" -v c="$(median <"$work/gf_repaired")" \
    'BEGIN { printf "  sgemm ratio auto / forced = %.2f, repaired / auto = %.2f (goal ~1.0)\n", a / b, c / a }'
sf=$(median <"$work/st_forced"); sa=$(median <"$work/st_auto")
printf "  C trainer step (L=$L C=$C, B=$B4 T=$T)  forced %8.1f ms   auto %8.1f ms   ratio forced / auto %.2f\n" \
    "$sf" "$sa" "$(awk -v a="$sf" -v b="$sa" 'BEGIN { print a / b }')"
