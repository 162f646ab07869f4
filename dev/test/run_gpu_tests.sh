#!/usr/bin/env bash
# `make test_gpu`: the GPU trainer against the PyTorch oracle, in both precisions, and
# the determinism of train_gpt2cu. Without an NVIDIA GPU it says so and exits 0.
#   1. oracle files (fp32 and bf16 models, L=2 C=64, B=4 T=64, 10 AdamW steps)
#   2. test_gpt2cu built with PRECISION=FP32: tight tolerances (as the CPU test)
#   3. test_gpt2cu built with PRECISION=BF16: the stated bf16 tolerances
#      (both also check that a rerun is bitwise identical, in process)
#   4. with >= 2 GPUs and mpirun: the BF16 test on 2 ranks (replicas identical)
#   5. train_gpt2cu (BF16) twice with identical flags on a random token shard:
#      the step lines and main.log (minus timings) must be identical
#   6. test_zero1_cuda: zero1's CUDA device ops bitwise against the CPU device, events,
#      and the NCCL communicator on one rank (ordering with the compute stream, groups);
#      with >= 2 GPUs also on 2-4 ranks (in-place offsets and sums); test_watchdog_cuda:
#      a stream that never finishes ends the process past --comm-timeout's deadline
#   7. ZeRO-1 on the GPU (USE_ZERO1=1 builds):
#      - test_gpt2cu -z 1 against the oracle: np=1 through a one-rank NCCL communicator,
#        np=2 and 4 on this one GPU through the staged MPI communicator (small buckets),
#        FP32 (oracle tolerances) and BF16 (its stated tolerances), np=2 also under the
#        hazard communicator (regions poisoned while in flight);
#      - train_gpt2cu ZeRO-1 vs replicated (-z 0 through the runtime; at np=1 the plain
#        build): step losses and norms within 1e-5 relative (FP32);
#      - a planted NaN with --check-nan: one message naming h0.qkvb, every rank stops;
#      - --trace: a reduce-scatter starts on the communication stream before backward ends
#   8. checkpoints across trainers: one written by train_gpt2cu (FP32 build, replicated and
#      the zero1 plugin's -z 1) resumes in train_gpt2, and one written by train_gpt2
#      resumes in train_gpt2cu, master exact: the resumed run trains one step with -l 0
#      (AdamW then subtracts exact zeros), so its checkpoint's model.bin must equal the one
#      it resumed from byte for byte; with >= 2 GPUs also at 2 ranks on both sides
# Prints "N passed, M failed"; exits non-zero on any failure.
set -uo pipefail
# The oracle runs under $LLMC_PYTHON (default Debian's python3, which has torch): $PY.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "SKIPPED: no GPU found (make test_gpu needs an NVIDIA GPU)"
    exit 0
fi
NUM_GPUS=$(nvidia-smi -L | grep -c '^GPU')
OUT=${TEST_GPU_OUT:-$(mktemp -d /tmp/llmc_test_gpu.XXXXXX)}
mkdir -p "$OUT"
passed=0
failed=0
check() {  # check NAME COMMAND...: runs it, logs to $OUT/NAME.log, counts the result
    local name=$1
    shift
    echo "== $name: $*"
    if "$@" >"$OUT/$name.log" 2>&1; then
        passed=$((passed + 1))
        grep -E '^(PASS|FAIL|SKIPPED)' "$OUT/$name.log" || tail -n 3 "$OUT/$name.log"
        echo "   ok"
    else
        failed=$((failed + 1))
        tail -n 40 "$OUT/$name.log"
        echo "   FAILED (log: $OUT/$name.log)"
    fi
}

echo "GPU tests on $NUM_GPUS GPU(s): $(nvidia-smi -L | head -n 1); work dir $OUT"
check oracle_fp32 $PY dev/test/gpt2_oracle.py make --out-model "$OUT/model_fp32.bin" --out-state "$OUT/state_fp32.bin" --dtype fp32
check oracle_bf16 $PY dev/test/gpt2_oracle.py make --out-model "$OUT/model_bf16.bin" --out-state "$OUT/state_bf16.bin" --dtype bf16

# One output name per Makefile rule: build, then move the binary aside per precision.
build() {  # build TARGET PRECISION
    make -B "$1" PRECISION="$2" && mv "$1" "$OUT/$1_$2"
}
check build_test_fp32 build test_gpt2cu FP32
check test_gpt2cu_fp32 "$OUT/test_gpt2cu_FP32" "$OUT/model_fp32.bin" "$OUT/state_fp32.bin"
check build_test_bf16 build test_gpt2cu BF16
check test_gpt2cu_bf16 "$OUT/test_gpt2cu_BF16" "$OUT/model_bf16.bin" "$OUT/state_bf16.bin"
if [ "$NUM_GPUS" -ge 2 ] && command -v mpirun >/dev/null 2>&1; then
    check test_gpt2cu_bf16_np2 "${MPIRUN[@]}" -np 2 \
        "$OUT/test_gpt2cu_BF16" "$OUT/model_bf16.bin" "$OUT/state_bf16.bin"
fi

# Determinism of the trainer binary on a random token shard (no data preparation needed).
check random_shard $PY -c "
import numpy as np, sys
n = 200000
h = np.zeros(256, dtype='<i4'); h[0] = 20240520; h[1] = 1; h[2] = n
t = np.random.default_rng(1234).integers(0, 50257, n, dtype=np.uint16)
with open('$OUT/random_tokens.bin', 'wb') as f:
    f.write(h.tobytes()); f.write(t.astype('<u2').tobytes())
"
check build_train_bf16 build train_gpt2cu BF16
FLAGS=(-e d4 -i "$OUT/random_tokens.bin" -j "$OUT/random_tokens.bin" -b 4 -t 256 -x 10 -v 5 -m 2 -s 0 -l 6e-4 -d 2048)
check train_run1 "$OUT/train_gpt2cu_BF16" "${FLAGS[@]}" -o "$OUT/run1"
check train_run2 "$OUT/train_gpt2cu_BF16" "${FLAGS[@]}" -o "$OUT/run2"
same_losses() {
    diff <(grep '^step' "$OUT/train_run1.log" | sed -E 's/ \| [0-9.]+ ms.*//') \
         <(grep '^step' "$OUT/train_run2.log" | sed -E 's/ \| [0-9.]+ ms.*//') &&
    diff <(sed -E 's/ ms:.*//' "$OUT/run1/main.log") <(sed -E 's/ ms:.*//' "$OUT/run2/main.log") &&
    [ "$(grep -c '^step' "$OUT/train_run1.log")" -eq 10 ]
}
check determinism same_losses

check build_zero1_cuda build test_zero1_cuda BF16
check zero1_cuda "$OUT/test_zero1_cuda_BF16"
if [ "$NUM_GPUS" -ge 2 ] && command -v mpirun >/dev/null 2>&1; then
    check zero1_cuda_multirank mpirun --allow-run-as-root --oversubscribe -np "$((NUM_GPUS < 4 ? NUM_GPUS : 4))" \
        "$OUT/test_zero1_cuda_BF16"
fi
# The GPU step's deadline (zero1/watchdog_cuda.h): a stream that never finishes ends the process.
check build_watchdog_cuda build test_watchdog_cuda BF16
check watchdog_cuda "$OUT/test_watchdog_cuda_BF16"

# ---- ZeRO-1 on the GPU ----
build_z() {  # build_z TARGET PRECISION: the plugin build, kept as TARGET_z_PRECISION
    make -B "$1" PRECISION="$2" USE_ZERO1=1 && mv "$1" "$OUT/$1_z_$2"
}
MPI_OK=0
command -v mpirun >/dev/null 2>&1 && MPI_OK=1
for P in FP32 BF16; do
    p=$(echo "$P" | tr A-Z a-z)
    check "build_test_z_$p" build_z test_gpt2cu "$P"
    T="$OUT/test_gpt2cu_z_$P"
    M=("$OUT/model_$p.bin" "$OUT/state_$p.bin")
    check "zero1_oracle_${p}_np1_nccl" "$T" "${M[@]}" -z 1 --bucket-size 4096 --comm nccl
    if [ $MPI_OK = 1 ]; then
        check "zero1_oracle_${p}_np2_staged" "${MPIRUN[@]}" -np 2 "$T" "${M[@]}" -z 1 --bucket-size 4096 --comm mpi
        check "zero1_oracle_${p}_np4_staged" "${MPIRUN[@]}" -np 4 "$T" "${M[@]}" -z 1 --bucket-size 4096 --comm mpi
    fi
done
if [ $MPI_OK = 1 ]; then
    check zero1_oracle_fp32_np2_hazard "${MPIRUN[@]}" -np 2 "$OUT/test_gpt2cu_z_FP32" "$OUT/model_fp32.bin" \
        "$OUT/state_fp32.bin" -z 1 --bucket-size 4096 --comm mpi --test-hazard
fi

# ZeRO-1 vs replicated through the trainer binary (FP32: the runs agree to float rounding).
check build_train_fp32 build train_gpt2cu FP32
check build_train_z_fp32 build_z train_gpt2cu FP32
ZFLAGS=(-e d2 -i "$OUT/random_tokens.bin" -j "$OUT/random_tokens.bin" -b 4 -t 128 -x 8 -v 0 -s 0 -l 1e-3 -c 0.1)
step_values() { grep '^step' "$1" | sed -E 's/.*loss ([0-9.]+) \| norm ([0-9.]+).*/\1 \2/'; }
same_within() {  # same_within LOG_A LOG_B REL: every step's loss and norm within REL
    paste <(step_values "$1") <(step_values "$2") | awk -v rel="$3" '
        { n++; for (i = 1; i <= 2; i++) { d = $i - $(i + 2); if (d < 0) d = -d; s = $(i + 2) < 0 ? -$(i + 2) : $(i + 2);
          if (!(d <= rel * s)) { print "step " n ": " $0; bad = 1 } } }
        END { exit (bad || n != 8) }'
}
check z_np1_plain "$OUT/train_gpt2cu_FP32" "${ZFLAGS[@]}" -z 0
check z_np1_zero1 "$OUT/train_gpt2cu_z_FP32" "${ZFLAGS[@]}" -z 1 --bucket-size 100000
check zero1_vs_plain_np1 same_within "$OUT/z_np1_plain.log" "$OUT/z_np1_zero1.log" 1e-5
if [ $MPI_OK = 1 ]; then
    check z_np2_replicated "${MPIRUN[@]}" -np 2 "$OUT/train_gpt2cu_z_FP32" "${ZFLAGS[@]}" -b 2 -z 0 --comm mpi
    check z_np2_zero1 "${MPIRUN[@]}" -np 2 "$OUT/train_gpt2cu_z_FP32" "${ZFLAGS[@]}" -b 2 -z 1 --bucket-size 100000 --comm mpi
    check zero1_vs_replicated_np2 same_within "$OUT/z_np2_replicated.log" "$OUT/z_np2_zero1.log" 1e-5
    check zero1_vs_plain_np2_batch same_within "$OUT/z_np1_plain.log" "$OUT/z_np2_zero1.log" 1e-5

    # A planted NaN on the last rank: --check-nan stops every rank with one message.
    nan_stops() {
        "${MPIRUN[@]}" -np 2 "$OUT/train_gpt2cu_z_FP32" "${ZFLAGS[@]}" -b 2 -z 1 --bucket-size 100000 --comm mpi \
            --check-nan --test-plant-nan 2 >"$OUT/nan_run.log" 2>&1
        local rc=$?
        [ $rc -ne 0 ] && [ "$(grep -c 'error: non-finite gradient in h0.qkvb at step 3' "$OUT/nan_run.log")" = 1 ] &&
            ! grep -q '^step    4' "$OUT/nan_run.log"
    }
    check zero1_check_nan nan_stops
fi

# --trace at np=1 through NCCL: device-time spans; a bucket's reduce-scatter starts on the
# communication stream while backward is still running on the compute stream.
check z_trace "$OUT/train_gpt2cu_z_FP32" "${ZFLAGS[@]}" -x 3 -z 1 --bucket-size 100000 --comm nccl \
    --trace "$OUT/trace.json"
check zero1_trace_overlap $PY - "$OUT/trace.rank0.json" <<'PYEOF'
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
rs = [e for e in events if e["name"].startswith("reduce-scatter b")]
bw = [e for e in events if e["name"] == "backward -1"]   # the last block of each backward
assert rs and bw, ("no reduce-scatter or backward spans", len(rs), len(bw))
early = [r for r in rs if any(r["ts"] < b["ts"] + b["dur"] and b["ts"] - r["ts"] < 1e6 for b in bw)]
print(f"{len(rs)} reduce-scatter spans, {len(early)} start before the end of their step's backward")
assert early, "no reduce-scatter overlaps backward"
PYEOF

# ---- Checkpoints across trainers (the FP32 GPU builds above, the CPU trainer) ----
check build_train_cpu make train_gpt2 USE_ZERO1=1
CKPT_FLAGS=(-e "$OUT/model_fp32.bin" -i "$OUT/random_tokens.bin" -t 64 -v 0 -s 0)
# resumes_exactly NAME "NP WRITER FLAGS..." "NP READER FLAGS...": the writer saves step 2, the
# reader resumes it for one step at learning rate 0; model.bin of step 3 == that of step 2.
resumes_exactly() {
    local a=$OUT/ckpt_$1_a b=$OUT/ckpt_$1_b np bin flags
    read -r np bin flags <<<"$2"
    # shellcheck disable=SC2086
    "${MPIRUN[@]}" -np "$np" "$bin" "${CKPT_FLAGS[@]}" -b $((4 / np)) -x 2 -n 2 -o "$a" $flags || return 1
    mkdir -p "$b" && cp -r "$a/checkpoint_00000002" "$b/" || return 1
    read -r np bin flags <<<"$3"
    # shellcheck disable=SC2086
    "${MPIRUN[@]}" -np "$np" "$bin" "${CKPT_FLAGS[@]}" -b $((4 / np)) -x 3 -n 1 -l 0 -y 1 -o "$b" $flags || return 1
    cmp "$a/checkpoint_00000002/model.bin" "$b/checkpoint_00000003/model.bin" && echo "PASS $1: master exact"
}
GPU=$OUT/train_gpt2cu_FP32 GPU_Z1=$OUT/train_gpt2cu_z_FP32
check ckpt_gpu_to_cpu resumes_exactly gpu_to_cpu "1 $GPU -z 0" "1 ./train_gpt2 -z 1"
check ckpt_cpu_to_gpu resumes_exactly cpu_to_gpu "1 ./train_gpt2 -z 1" "1 $GPU -z 0"
check ckpt_gpu_zero1_to_cpu resumes_exactly gpu_zero1_to_cpu "1 $GPU_Z1 -z 1" "1 ./train_gpt2 -z 0"
check ckpt_cpu_to_gpu_zero1 resumes_exactly cpu_to_gpu_zero1 "1 ./train_gpt2 -z 0" "1 $GPU_Z1 -z 1"
if [ "$NUM_GPUS" -ge 2 ] && command -v mpirun >/dev/null 2>&1; then
    check ckpt_gpu_zero1_np2_to_cpu resumes_exactly gpu_zero1_np2_to_cpu "2 $GPU_Z1 -z 1" "1 ./train_gpt2 -z 1"
    check ckpt_cpu_np2_to_gpu_np2 resumes_exactly cpu_np2_to_gpu_np2 "2 ./train_gpt2 -z 1" "2 $GPU -z 0"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
