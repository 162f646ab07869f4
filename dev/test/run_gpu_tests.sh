#!/usr/bin/env bash
# The GPU suite: the GPU trainer and zero1/'s GPU path. One code path, two places to run:
#   make test_gpu                    on an NVIDIA GPU (nvidia-smi lists one); without one it
#                                    says SKIPPED (make test has run the same suite on the CPU)
#   CUDA_ON_CPU=1 run_gpu_tests.sh   on the CPU execution layer for CUDA (cuda_cpu/), which
#                                    `make test` does: every binary is built with CUDA_ON_CPU=1,
#                                    each MPI rank emulates a GPU of its own (distinct UUIDs, so
#                                    NCCL is used), or all ranks one shared GPU with
#                                    CUDA_CPU_SHARED_GPU=1 (so staged MPI is)
# On the layer the runs are shorter (smaller models, fewer steps) and some run under more
# than one execution mode (CUDA_CPU_EXEC=async|eager|lazy) and thread order
# (CUDA_CPU_ORDER=forward|random); the checks are the same.
#   1. oracle files (fp32 and bf16 models, L=2 C=64, B=4 T=64, 10 AdamW steps; 4 on the layer)
#   2. every CUDA kernel against plain C double references (test_kernels_cuda), FP32 and BF16;
#      on the layer once more with cuBLASLt refusing its epilogues (CUDA_CPU_BLASLT_HEURISTIC=
#      none in FP32, random in BF16: the product's separate kernels, checked as such)
#   3. test_gpt2cu, FP32 (oracle tolerances) and BF16 (stated bf16 tolerances), each with a
#      bitwise rerun in process; on the layer both async and eager (eager with no cuBLASLt
#      epilogue: CUDA_CPU_BLASLT_HEURISTIC=none); flash attention, fused kernels and -r 1 (the
#      defaults) everywhere, FP32 once more with the reference paths (--attention naive -r 0
#      --fused-kernels 0)
#   4. with >= 2 GPUs: the BF16 test on 2 ranks (NCCL all-reduce, replicas identical)
#  4a. --optimizer muon against emerging-optimizers' Muon (dev/test/gpu_rows_muon.sh: FP32,
#      BF16, --muon-ns-bf16, np 2, negative controls, a resume)
#   5. train_gpt2cu twice with identical flags on a random token shard: identical step lines
#      and main.log (minus timings)
#   6. test_zero1_cuda (zero1's CUDA device ops bitwise against the CPU device, events, NCCL
#      at one rank; with >= 2 GPUs also at 2-4 ranks) and test_watchdog_cuda (a stream that
#      never finishes ends the process past --comm-timeout's deadline; on the layer also with
#      an ncclCommAbort that blocks, CUDA_CPU_NCCL_ABORT=block, and NCCL's own peers)
#   7. ZeRO-1 on the GPU trainer (USE_ZERO1=1 builds) against the oracle: np 1 (NCCL), np 2
#      and 4 through NCCL (a GPU per rank) and through staged MPI (one shared GPU); np 4 with
#      --dist-opt-instances 2 over NCCL (on the layer with CUDA_CPU_NCCL_CONCURRENT=1: no two
#      communicators' collectives of a GPU could run at once); --fp32-accumulation, --average-in-collective and
#      --split-embedding at np 2 over NCCL; a hazard run; ZeRO-1 against replicated; a planted
#      NaN (--check-nan); non-finite steps skipped and the run stopped past --max-nonfinite-steps
#      (replicated, np 2 ZeRO-1), then resumed; a NaN loss skipped; a NaN model file refused;
#      a trace whose gradient collectives start before their own step's backward ends
#      (np 2 reduce-scatters; with one GPU np 1 all-reduces); a stopped rank ends the job
#      within --comm-timeout + a few s, and so does one stopped inside an MPI call of the
#      set-up, the NCCL bootstrap or the split embedding's host all-gather, and one killed in its
#      teardown, before its parameters' all-gathers or before a step of the plain trainer (on the
#      layer with NCCL's own peers: CUDA_CPU_NCCL_PEERS=local); one model's val loss
#      at np 1 and 2 (-m global batches)
#   8. checkpoints moved between train_gpt2cu and train_gpt2 in both directions, master exact,
#      and the HellaSwag-style eval (-H 1) of both trainers on one model: the same losses
#      and accuracy (on the layer under the pageable-copy switches, PAGEABLE_D2H/H2D below); --stochastic-rounding at -l 0: the BF16 GPU trainer's params (zero1/
#      and replicated) are the CPU trainer's bitwise (needs OpenBLAS for the CPU trainer:
#      SKIPPED without it)
#   9. the demo's job on the GPU trainer: -e d2, ZeRO-1 on 4 GPUs, the loss falls
#  10. on the layer: train_gpt2cu on a driver older than its CUDA (CUDA_CPU_DRIVER_VERSION)
#      fails with one message naming both versions; the memory check against the GPU's memory
#      as the layer counts it (dev/test/gpu_rows_memory.sh): 2 ranks sharing a GPU, and NCCL's
#      buffers, each refused where only the count of issue 46 refuses, and trained just above
# The bitwise claims across runs (3) hold with NCCL's algorithm pinned, which this script
# does as Megatron's deterministic mode does: NCCL_ALGO=Ring, NCCL_NVLS_ENABLE=0,
# CUBLAS_WORKSPACE_CONFIG=:4096:8 (docs/gpu.md#what-is-bitwise-on-a-gpu). On the layer the sums
# run in ring order (CUDA_CPU_NCCL_ORDER's default) but in rows that claim bits whatever the
# order: random there (--dp-invariant, the 4-rank ZeRO-1 oracle test).
# Rows whose ranks share one GPU (the layer's CUDA_CPU_SHARED_GPU=1 rows; on a GPU, more ranks
# than GPUs) need its Default compute mode: under Exclusive_Process they say SKIPPED, loudly.
# Prints TAP (dev/test/test_lib.sh), one row per check, each run's output kept in
# $OUT/NAME.log (the scratch directory); after the plan, test_lib.sh's count line `# N passed,
# M failed, K skipped` (rows), which scripts/test.sh and scripts/gpu_check.sh read. Exits
# non-zero on any failure.
set -uo pipefail
# The oracle runs under $LLMC_PYTHON (default Debian's python3, which has torch): $PY.
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

LAYER=0
if [ "${CUDA_ON_CPU:-0}" = 1 ]; then
    require LAYER
    LAYER=1
    NUM_GPUS=4   # emulated: one per rank (the tests use at most 4 ranks)
    MAKE_ARGS=(CUDA_ON_CPU=1)
    WHERE="the CPU execution layer for CUDA (cuda_cpu/)"
else
    have GPU || note "make test runs this suite on the CPU execution layer for CUDA: CUDA_ON_CPU=1 dev/test/run_gpu_tests.sh"
    require GPU
    NUM_GPUS=$(nvidia-smi -L | grep -c '^GPU')
    MAKE_ARGS=()
    WHERE="$NUM_GPUS GPU(s): $(nvidia-smi -L | head -n 1)"
fi
# NCCL's algorithm pinned (a fixed order of every float sum across ranks) and cuBLAS's
# workspace per stream, as Megatron's --deterministic-mode sets them; a setting of the
# caller's is kept.
export NCCL_ALGO=${NCCL_ALGO-Ring} NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE-0} CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG-:4096:8}
OUT=${TEST_GPU_OUT:-$TMP}
mkdir -p "$OUT"
row() {  # row NAME COMMAND...: one check, its output in $OUT/NAME.log (later rows read some)
    local name=$1 t0=$SECONDS log=$OUT/$1.log
    shift
    note "== $name: $*"
    if "$@" >"$log" 2>&1; then
        { grep -E '^(ok |not ok |# SKIPPED|PASS|FAIL|SKIPPED)' "$log" | tail -n 4 || tail -n 3 "$log"; } | sed 's/^/    /'
        ok "$name ($((SECONDS - t0)) s)"
    else
        TEST_LOG_LINES=40 not_ok "$name ($((SECONDS - t0)) s; log: $log)" "$log"
    fi
}
layer_only() { [ $LAYER = 1 ]; }
# on_layer VAR=value... COMMAND: the environment settings apply on the layer only (COMMAND
# may be a function of this script).
on_layer() {
    local envs=()
    while [[ $1 == *=* ]]; do envs+=("$1"); shift; done
    if [ $LAYER = 1 ]; then (for e in ${envs[@]+"${envs[@]}"}; do export "$e"; done; "$@"); else "$@"; fi
}
# The driver's freedoms with pageable memory (docs/cuda_cpu.md#the-hardwares-freedoms), for the
# rows that copy to or from it: a cudaMemcpyAsync to pageable memory returning before it lands
# (lazy: it lands only when something waits), and a copy from it waiting for its stream first.
PAGEABLE_D2H=(CUDA_CPU_PAGEABLE_D2H=async CUDA_CPU_EXEC=lazy)
PAGEABLE_H2D=(CUDA_CPU_PAGEABLE_H2D=stream)
SHARED=(CUDA_CPU_SHARED_GPU=1)   # ranks that share one GPU (staged MPI); a no-op on a real GPU

note "GPU tests on $WHERE; work dir $OUT"

# Every binary of the suite, built up front in the background: one copy of the sources per
# (precision, USE_ZERO1) variant (what git tracks or would track; on the layer with the
# layer's library), two variants at a time, while the first tests run. A build is one
# compiler on one core most of the time, so the suite's other core does the next one.
# build() below waits for its variant and takes the binary.
VARIANT_TARGETS_FP32_0="test_kernels_cuda test_gpt2cu train_gpt2cu"
VARIANT_TARGETS_BF16_0="gpu_compute_mode test_kernels_cuda test_gpt2cu train_gpt2cu test_zero1_cuda test_watchdog_cuda"
VARIANT_TARGETS_FP32_1="test_gpt2cu train_gpt2cu"
VARIANT_TARGETS_BF16_1="test_gpt2cu train_gpt2cu"
prebuild() {  # prebuild PRECISION USE_ZERO1: the variant's targets in $OUT/tree_P_z; .rc when done
    local dir=$OUT/tree_$1_$2 targets=VARIANT_TARGETS_$1_$2
    mkdir -p "$dir"
    bash scripts/copy_sources.sh "$dir"
    if [ $LAYER = 1 ]; then
        mkdir -p "$dir/build" && cp -rp build/cuda_cpu "$dir/build/" && rm -rf "$dir/build/cuda_cpu/"{src,tests}
    fi
    # shellcheck disable=SC2086
    (cd "$dir" && make -j2 ${!targets} PRECISION="$1" USE_ZERO1="$2" "${MAKE_ARGS[@]}") >"$dir.log" 2>&1
    echo $? >"$dir.rc"
}
[ $LAYER = 1 ] && { make -s cuda_cpu CUDA_ON_CPU=1 >"$OUT/cuda_cpu_build.log" 2>&1 || sed 's/^/    /' "$OUT/cuda_cpu_build.log"; }
( prebuild FP32 0 & prebuild BF16 0 & wait; prebuild FP32 1 & prebuild BF16 1 & wait ) &

# On the layer 4 AdamW steps instead of 10 (same model, same tolerances): each costs seconds there.
ORACLE_STEPS=10
[ $LAYER = 1 ] && ORACLE_STEPS=4
for p in fp32 bf16; do
    row "oracle_$p" $PY dev/test/gpt2_oracle.py make --out-model "$OUT/model_$p.bin" --out-state "$OUT/state_$p.bin" \
        --dtype $p --steps $ORACLE_STEPS
done

build() {  # build TARGET PRECISION [z]: the prebuilt binary (the plugin build, USE_ZERO1=1, with z)
    local z=0 name=$1_$2
    [ "${3:-}" = z ] && z=1 name=$1_z_$2
    local dir=$OUT/tree_$2_$z
    while [ ! -f "$dir.rc" ]; do sleep 1; done
    [ "$(cat "$dir.rc")" = 0 ] || { tail -n 40 "$dir.log"; echo "FAIL the $2 USE_ZERO1=$z build (log: $dir.log)"; return 1; }
    cp "$dir/$1" "$OUT/$name"
}

# ---- kernels ----
for P in FP32 BF16; do
    row "build_kernels_$P" build test_kernels_cuda "$P"
    row "kernels_$P" on_layer CUDA_CPU_ORDER=forward "$OUT/test_kernels_cuda_$P"
    # cuBLASLt with no algorithm for epilogues (docs/cuda_cpu.md#the-hardwares-freedoms): every
    # fused request in FP32 (none), half of them by a hash in BF16 (random: some backward
    # matmuls with one epilogue and not the other).
    HEURISTIC=none
    [ $P = BF16 ] && HEURISTIC=random
    layer_only && row "kernels_${P}_random" on_layer CUDA_CPU_ORDER=random CUDA_CPU_EXEC=lazy \
        CUDA_CPU_BLASLT_HEURISTIC=$HEURISTIC "$OUT/test_kernels_cuda_$P"
done

# ---- the compute mode: rows whose ranks share a GPU need Default ----
row build_compute_mode build gpu_compute_mode BF16
COMPUTE_MODE=$("$OUT/gpu_compute_mode_BF16" 2>/dev/null) || COMPUTE_MODE=unknown
note "GPU 0's compute mode: $COMPUTE_MODE"
SHARED_SKIPPED=()
shared_row() {  # shared_row NP NAME COMMAND...: row, or SKIPPED where its NP ranks share a GPU that cannot be shared
    local np=$1
    shift
    if [ "$COMPUTE_MODE" != Default ] && [ "$COMPUTE_MODE" != unknown ] && { [ $LAYER = 1 ] || [ "$NUM_GPUS" -lt "$np" ]; }; then
        SHARED_SKIPPED+=("$1")
        skip "$1" "its $np ranks share a GPU, and the GPU's compute mode is $COMPUTE_MODE"
    else
        row "$@"
    fi
}
# On the layer: the probe reads CUDA_CPU_COMPUTE_MODE, and under Exclusive_Process a shared row
# is skipped, not run (its command would fail). The row is counted apart (its own TEST_STATE
# in the subshell), not as one of the suite's.
compute_mode_skips() {
    local mode out
    mode=$(CUDA_CPU_COMPUTE_MODE=exclusive-process "$OUT/gpu_compute_mode_BF16") || return 1
    out=$(COMPUTE_MODE=$mode TEST_STATE=$OUT/compute_mode_skips.state
          echo "0 0 0" >"$TEST_STATE"
          shared_row 2 a_shared_row false; echo "${SHARED_SKIPPED[*]}")
    echo "$out"
    [ "$mode" = Exclusive_Process ] &&
        grep -q "^ok 1 - a_shared_row # SKIP its 2 ranks share a GPU, and the GPU's compute mode is Exclusive_Process$" <<<"$out" &&
        [ "$(tail -n 1 <<<"$out")" = a_shared_row ] && echo "PASS Exclusive_Process read, the shared row skipped"
}
layer_only && row compute_mode_skips compute_mode_skips

# ---- the trainer against the oracle ----
for P in FP32 BF16; do
    p=$(echo "$P" | tr A-Z a-z)
    row "build_test_$p" build test_gpt2cu "$P"
    row "test_gpt2cu_$p" "$OUT/test_gpt2cu_$P" "$OUT/model_$p.bin" "$OUT/state_$p.bin"
    # Eager execution in random order, FP32 only on the layer (CI time is bounded; the layer's
    # own tests cover its modes, BF16 takes the same paths); with cuBLASLt refusing every
    # epilogue: the trainer's separate kernels against the oracle.
    layer_only && [ $P = FP32 ] && row "test_gpt2cu_${p}_eager" on_layer CUDA_CPU_EXEC=eager CUDA_CPU_ORDER=random \
        CUDA_CPU_BLASLT_HEURISTIC=none "$OUT/test_gpt2cu_$P" "$OUT/model_$p.bin" "$OUT/state_$p.bin"
    # The runs above take the defaults (flash attention, -r 1, --fused-kernels 1); the
    # reference paths once, together, FP32 (the tight tolerances): naive attention, the GELU
    # output kept per layer, separate GELU, bias-gradient, classifier and residual passes.
    [ $P = FP32 ] && row "test_gpt2cu_${p}_reference_kernels" "$OUT/test_gpt2cu_$P" "$OUT/model_$p.bin" \
        "$OUT/state_$p.bin" --attention naive -r 0 --fused-kernels 0
done
if [ "$NUM_GPUS" -ge 2 ]; then
    row test_gpt2cu_bf16_np2 "${MPIRUN[@]}" -np 2 "$OUT/test_gpt2cu_BF16" "$OUT/model_bf16.bin" "$OUT/state_bf16.bin"
else
    skip test_gpt2cu_bf16_np2 "one GPU: the replicated optimizer's NCCL all-reduce needs a GPU per rank"
fi
# More ranks than GPUs: the plain trainer says so instead of NCCL's bare "invalid usage".
shared_refused() {
    on_layer "${SHARED[@]}" "${MPIRUN[@]}" -np 2 "$OUT/test_gpt2cu_FP32" "$OUT/model_fp32.bin" "$OUT/state_fp32.bin" \
        >"$OUT/shared_refused.out" 2>&1
    [ $? -ne 0 ] && grep -q "error: .*2 ranks on this node share GPUs" "$OUT/shared_refused.out" &&
        cat "$OUT/shared_refused.out" | grep -m1 "share GPUs"
}
if layer_only || [ "$NUM_GPUS" = 1 ]; then
    shared_row 2 plain_shared_gpu_refused shared_refused
fi

# Determinism of the trainer binary on a random token shard (no data preparation needed).
row random_shard $PY -c "
import numpy as np
n = 200000
h = np.zeros(256, dtype='<i4'); h[0] = 20240520; h[1] = 1; h[2] = n
t = np.random.default_rng(1234).integers(0, 50257, n, dtype=np.uint16)
with open('$OUT/random_tokens.bin', 'wb') as f:
    f.write(h.tobytes()); f.write(t.astype('<u2').tobytes())
"
row build_train_bf16 build train_gpt2cu BF16
source dev/test/gpu_rows_muon.sh  # --optimizer muon against emerging-optimizers' Muon, resumed
if [ $LAYER = 1 ]; then
    STEPS=6
    FLAGS=(-e d2 -i "$OUT/random_tokens.bin" -j "$OUT/random_tokens.bin" --allow-train-val-overlap -b 2 -t 64 -x $STEPS -v 3 -m 2 -s 0 -l 6e-4 -d 256)
else
    STEPS=10
    FLAGS=(-e d4 -i "$OUT/random_tokens.bin" -j "$OUT/random_tokens.bin" --allow-train-val-overlap -b 4 -t 256 -x $STEPS -v 5 -m 2 -s 0 -l 6e-4 -d 2048)
fi
row train_run1 "$OUT/train_gpt2cu_BF16" "${FLAGS[@]}" -o "$OUT/run1"
row train_run2 on_layer CUDA_CPU_EXEC=lazy "$OUT/train_gpt2cu_BF16" "${FLAGS[@]}" -o "$OUT/run2"
same_losses() {
    diff <(grep '^step' "$OUT/train_run1.log" | sed -E 's/ \| [0-9.]+ ms.*//') \
         <(grep '^step' "$OUT/train_run2.log" | sed -E 's/ \| [0-9.]+ ms.*//') &&
    diff <(grep -v ' busy_ms:' "$OUT/run1/main.log" | sed -E 's/ ms:.*//') \
         <(grep -v ' busy_ms:' "$OUT/run2/main.log" | sed -E 's/ ms:.*//') &&
    [ "$(grep -c '^step' "$OUT/train_run1.log")" -eq "$STEPS" ] && echo "PASS $STEPS step lines and main.log identical"
}
row determinism same_losses
# The step metrics of run/metrics.h in the GPU trainer (dev/test/test_metrics.sh has the
# rest): MFU against the chip's peak named in the header (on the layer: none, and why), the
# device memory's peak in main.log, and the event files TensorBoard's own reader loads.
gpu_metrics() {
    if [ $LAYER = 1 ]; then grep -q "^MFU: not reported: the CPU execution layer plays" "$OUT/train_run1.log" || return 1
    else grep -qE "^MFU: (against .* dense BF16 .* TFLOPS per GPU|not reported: '.*' is not a chip whose)" \
        "$OUT/train_run1.log" || return 1; fi
    [ "$(grep -c ' trl:.* tps:.* gmem:[0-9.]* slow:' "$OUT/run1/main.log")" = "$STEPS" ] || return 1
    local peer rc=0
    peer=$(bash dev/test/tensorboard_peer.sh "$(bash dev/test/tensorboard_peer.sh --pinned)") || rc=$?
    [ $rc = 2 ] && { echo "SKIPPED the TensorBoard reader: PyPI cannot be reached"; [ "${CI:-}" != true ]; return; }
    [ $rc = 0 ] && PYTHONPATH="$peer/site" $PY dev/test/tensorboard_check.py "$OUT/run1" "$OUT/run1/main.log" --files 1 &&
        grep -m1 '^MFU' "$OUT/train_run1.log" && echo "PASS MFU header, gmem: in main.log, TensorBoard = main.log"
}
row gpu_metrics gpu_metrics

# Memory is checked before it is allocated (run/memory_check.h). A GPU too small for the
# job refuses it at once, before any training, with one error naming the device need and
# cudaMemGetInfo's free bytes: on the layer a 500 MiB GPU (CUDA_CPU_MEMORY_MIB: 36 MiB free
# beside the context and the two workspaces), on a GPU a
# job no GPU holds (d48 at B 64, T 1024: 150 GiB of activations alone, as much again of
# attention probabilities with --attention naive).
gpu_memory_refused() {
    local log=$OUT/gpu_memory_refused.out t0=$SECONDS big=(-e d48 -b 64 -t 1024 -d 65536)
    [ $LAYER = 1 ] && big=()
    CUDA_CPU_MEMORY_MIB=500 timeout 60 "$OUT/train_gpt2cu_BF16" "${FLAGS[@]}" "${big[@]}" >"$log" 2>&1
    local rc=$? secs=$((SECONDS - t0))
    grep 'error:' "$log"
    [ $rc -ne 0 ] && [ $rc -lt 124 ] && [ "$(grep -c 'error:' "$log")" = 1 ] && ! grep -q '^step' "$log" &&
        grep -qE '^error: .* needs about .* of GPU memory .* but cudaMemGetInfo reports [0-9.]+ [MG]iB free$' "$log" &&
        [ $secs -le 30 ] && echo "PASS refused in $secs s (exit $rc)"
}
row gpu_memory_refused gpu_memory_refused
# The device estimate of train_run1 against what it took: the GPU memory in use at the end
# less what was in use at the check, within [0.9, 2] of it (as test_memory_check.sh's host
# check: below it would let through jobs that do not fit, above refuse jobs that do).
gpu_memory_honest() {
    awk '/^memory: need about .* of GPU memory/ { est = $4; for (i = 3; i <= NF; i++) if ($i == "free") free = $(i - 2) }
         /^GPU memory in use at the end:/ { used = $8; total = $11 }
         END { growth = used - (total - free); if (!(est > 0 && growth > 0)) { print "FAIL no estimate or use"; exit 1 }
               r = est / growth; printf "estimate %d MiB, growth %.1f MiB: %.2f x\n", est, growth, r
               if (r >= 0.9 && r <= 2) print "PASS estimate within [0.9, 2] x the growth"; else exit 1 }' "$OUT/train_run1.log"
}
row gpu_memory_honest gpu_memory_honest

row build_zero1_cuda build test_zero1_cuda BF16
row zero1_cuda "$OUT/test_zero1_cuda_BF16"
if [ "$NUM_GPUS" -ge 2 ]; then
    row zero1_cuda_multirank "${MPIRUN[@]}" -np "$((NUM_GPUS < 4 ? NUM_GPUS : 4))" "$OUT/test_zero1_cuda_BF16"
fi
row build_watchdog_cuda build test_watchdog_cuda BF16
row watchdog_cuda "$OUT/test_watchdog_cuda_BF16"
# Lazy execution runs nothing until it is waited for: an initialisation on a stream the
# kernel is not ordered with shows (the kernel would read poison).
layer_only && row watchdog_cuda_lazy on_layer CUDA_CPU_EXEC=lazy "$OUT/test_watchdog_cuda_BF16"
# An ncclCommAbort that blocks behind the kernel that never ends, as a GPU's may, and NCCL's
# own peers (CUDA_CPU_NCCL_PEERS=local): the job still ends past the deadline, without it.
abort_blocks() {
    CUDA_CPU_NCCL_ABORT=block CUDA_CPU_NCCL_PEERS=local "$OUT/test_watchdog_cuda_BF16" &&
        grep -q "the abort blocked" "$OUT/watchdog_cuda_abort_block.log"
}
layer_only && row watchdog_cuda_abort_block abort_blocks

# ---- ZeRO-1 on the GPU ----
# Small buckets (4096 elements: hundreds of them, parameters split across buckets). On the
# layer every bucket costs launches that take milliseconds there, so the runs use 65536
# (still dozens, still split) and one run, FP32 at np 2 over NCCL, keeps 4096.
BUCKET=4096
[ $LAYER = 1 ] && BUCKET=65536
for P in FP32 BF16; do
    p=$(echo "$P" | tr A-Z a-z)
    row "build_test_z_$p" build test_gpt2cu "$P" z
    T="$OUT/test_gpt2cu_z_$P"
    M=("$OUT/model_$p.bin" "$OUT/state_$p.bin" -z 1 --bucket-size $BUCKET)
    row "zero1_oracle_${p}_np1_nccl" "$T" "${M[@]}" --comm nccl
    if layer_only && [ $P = FP32 ]; then
        row zero1_oracle_fp32_np2_nccl_small_buckets "${MPIRUN[@]}" -np 2 "$T" "${M[@]}" --comm nccl --bucket-size 4096
    fi
    for np in 2 4; do
        # On the layer (CI time is bounded) BF16 runs np 2 over NCCL only, FP32 np 2 over NCCL
        # only with the small buckets above, and the staged MPI path only at np 2 under the
        # hazard wrapper (zero1_oracle_fp32_np2_hazard below: the same run, every collective
        # still through the staged communicator): the other runs take the same paths.
        if [ $LAYER = 1 ] && [ $P = BF16 ] && [ $np = 4 ]; then continue; fi
        if [ $LAYER = 1 ] && [ $P = FP32 ] && [ $np = 2 ]; then
            :
        elif [ $LAYER = 1 ] && [ $np = 4 ]; then
            # 4 ranks sum in a random order per call: the oracle's tolerances and the same
            # parameters on every rank hold in any order; the rerun's bits need NCCL_ALGO
            # pinned, which this row leaves unset (test_gpt2.cu then says SKIPPED for them).
            row "zero1_oracle_${p}_np${np}_nccl" on_layer CUDA_CPU_NCCL_ORDER=random NCCL_ALGO= "${MPIRUN[@]}" -np $np \
                "$T" "${M[@]}" --comm nccl
        elif [ "$NUM_GPUS" -ge $np ]; then
            row "zero1_oracle_${p}_np${np}_nccl" "${MPIRUN[@]}" -np $np "$T" "${M[@]}" --comm nccl
        else
            skip "zero1_oracle_${p}_np${np}_nccl" "fewer than $np GPUs"
        fi
        [ $LAYER = 1 ] && continue
        shared_row $np "zero1_oracle_${p}_np${np}_staged" on_layer "${SHARED[@]}" "${MPIRUN[@]}" -np $np "$T" "${M[@]}" \
            --comm mpi
    done
done
TZ=("$OUT/test_gpt2cu_z_FP32" "$OUT/model_fp32.bin" "$OUT/state_fp32.bin" -z 1 --bucket-size $BUCKET)
if [ "$NUM_GPUS" -ge 4 ]; then
    # On the layer under CUDA_CPU_NCCL_CONCURRENT=1 (docs/cuda_cpu.md): the group and the cross
    # communicator of one GPU never have collectives queued that could run at once.
    row zero1_oracle_fp32_np4_instances on_layer CUDA_CPU_NCCL_CONCURRENT=1 "${MPIRUN[@]}" -np 4 "${TZ[@]}" \
        --comm nccl --dist-opt-instances 2
else
    skip zero1_oracle_fp32_np4_instances "fewer than 4 GPUs"
fi
# bf16 on the wire with fp32 sums (an all-to-all of ncclSend/ncclRecv, then the sum_slices
# kernel) at np 2 over NCCL.
if [ "$NUM_GPUS" -ge 2 ]; then
    row zero1_oracle_bf16_np2_nccl_fp32acc "${MPIRUN[@]}" -np 2 "$OUT/test_gpt2cu_z_BF16" "$OUT/model_bf16.bin" \
        "$OUT/state_bf16.bin" -z 1 --bucket-size $BUCKET --comm nccl --grad-dtype bf16 --fp32-accumulation
fi
shared_row 2 zero1_oracle_fp32_np2_hazard on_layer "${SHARED[@]}" "${MPIRUN[@]}" -np 2 "${TZ[@]}" --comm mpi --test-hazard
# --split-embedding: wte's classifier part reduced at once, the encoder's rows sent to their
# owners by NCCL send/recv and added there by the CUDA add_rows kernel; in the same run the
# reductions average in the collective (ncclAvg).
if [ "$NUM_GPUS" -ge 2 ]; then
    row zero1_oracle_fp32_np2_nccl_split_average "${MPIRUN[@]}" -np 2 "${TZ[@]}" --comm nccl --split-embedding \
        --average-in-collective
fi
if [ "$NUM_GPUS" -ge 2 ]; then
    row zero1_oracle_fp32_np2_nccl_hazard_lazy on_layer CUDA_CPU_EXEC=lazy "${MPIRUN[@]}" -np 2 "${TZ[@]}" \
        --comm nccl --test-hazard
fi

# ZeRO-1 vs replicated through the trainer binary (FP32: the runs agree to float rounding).
row build_train_fp32 build train_gpt2cu FP32
# A first run that fails only for real reasons: on a driver older than the CUDA it was built
# with, train_gpt2cu says so with both versions (the layer plays a CUDA 12.8 driver).
old_driver() {  # old_driver BINARY
    local out
    out=$(CUDA_CPU_DRIVER_VERSION=12080 "$1" -e d2 -x 1 2>&1) && { echo "exit 0: $out"; return 1; }
    echo "$out"
    [ "$(echo "$out" | grep -c '^error: ')" = 1 ] &&
        echo "$out" | grep -q "the NVIDIA driver supports CUDA 12.8, but train_gpt2cu was built with CUDA 13"
}
layer_only && row train_fp32_old_driver old_driver "$OUT/train_gpt2cu_FP32"
# On the layer cuBLAS is OpenBLAS: with a faked "Prescott" report the trainer restarts once
# on the kernels this CPU can run, as the CPU trainer does (run/blas_cores.h; OpenBLAS's
# own OPENBLAS_VERBOSE=2 report names the kernels each load runs).
blas_restart() {  # blas_restart BINARY
    env -u OPENBLAS_CORETYPE -u LLMC_BLAS_REEXEC LLMC_TEST_BLAS_CORENAME=Prescott OPENBLAS_VERBOSE=2 \
        "$1" -e d1 -b 1 -t 32 -x 1 -v 0 -s 0 >"$OUT/blas.out" 2>"$OUT/blas.err" || { tail -n 5 "$OUT/blas.err"; return 1; }
    local line loads
    line=$(grep '^blas: OpenBLAS chose the Prescott kernels' "$OUT/blas.out")
    loads=$(sed -n 's/^Core: //p' "$OUT/blas.err" | tr '\n' ' ')
    echo "restart line: ${line:-none}; OpenBLAS loads: $loads"
    if ! grep -qE '^flags.* (avx|avx2|avx512f)( |$)' /proc/cpuinfo; then
        [ -z "$line" ] && echo "PASS an SSE-only CPU: no restart"; return
    fi
    local after
    after=$(echo "$loads" | awk '{ print $2 }')
    [ "$(grep -c '^blas:' "$OUT/blas.out")" = 1 ] && [ "$(echo "$loads" | wc -w)" = 2 ] && [ -n "$after" ] &&
        [[ $line == *"OPENBLAS_CORETYPE=$after "* ]] && grep -q '^step *1/1' "$OUT/blas.out" &&
        echo "PASS one restart line, then OpenBLAS runs the kernels it names"
}
layer_only && row train_fp32_blas_restart blas_restart "$OUT/train_gpt2cu_FP32"
row build_train_z_fp32 build train_gpt2cu FP32 z
ZSTEPS=8 ZT=128
[ $LAYER = 1 ] && ZSTEPS=4 ZT=64
ZFLAGS=(-e d2 -i "$OUT/random_tokens.bin" -j "$OUT/random_tokens.bin" -b 4 -t $ZT -x $ZSTEPS -v 0 -s 0 -l 1e-3 -c 0.1)
step_values() { grep '^step' "$1" | sed -E 's/.*loss ([0-9.]+) \| norm ([0-9.]+).*/\1 \2/'; }
same_within() {  # same_within LOG_A LOG_B REL: every step's loss and norm within REL
    paste <(step_values "$1") <(step_values "$2") | awk -v rel="$3" -v want="$ZSTEPS" '
        { n++; for (i = 1; i <= 2; i++) { d = $i - $(i + 2); if (d < 0) d = -d; s = $(i + 2) < 0 ? -$(i + 2) : $(i + 2);
          if (!(d <= rel * s)) { print "step " n ": " $0; bad = 1 } } }
        END { if (!bad && n == want) print "PASS " n " steps within " rel; exit (bad || n != want) }'
}
ZZ=("$OUT/train_gpt2cu_z_FP32")
# No np 1 ZeRO-1 run of the trainer against np 1 plain: ZeRO-1 at np 1 is proven against the
# oracle by zero1_oracle_fp32_np1_nccl, and the trainer binary's -z 1 by
# zero1_vs_plain_np2_batch (np 2 ZeRO-1 against np 1 plain, the same global batch).
row z_np1_plain "$OUT/train_gpt2cu_FP32" "${ZFLAGS[@]}" -z 0
shared_row 2 z_np2_replicated on_layer "${SHARED[@]}" "${MPIRUN[@]}" -np 2 "${ZZ[@]}" "${ZFLAGS[@]}" -b 2 -z 0 --comm mpi
shared_row 2 z_np2_zero1 on_layer "${SHARED[@]}" "${MPIRUN[@]}" -np 2 "${ZZ[@]}" "${ZFLAGS[@]}" -b 2 -z 1 \
    --bucket-size 100000 --comm mpi
shared_row 2 zero1_vs_replicated_np2 same_within "$OUT/z_np2_replicated.log" "$OUT/z_np2_zero1.log" 1e-5  # of the two above
shared_row 2 zero1_vs_plain_np2_batch same_within "$OUT/z_np1_plain.log" "$OUT/z_np2_zero1.log" 1e-5
# -m counts global batches (run/eval.h): one model's val loss at np 1 and np 2 (-m 5: rank 1
# gets one batch fewer) within 1e-5, a few float ulps of the summed losses (about 54).
val_ranks() {
    local f=(-e "$OUT/model_fp32.bin" -i "$OUT/random_tokens.bin" -j "$OUT/random_tokens.bin" --allow-train-val-overlap -b 2 -t 64 -x 0 -v 1
        -m 5 -s 0 -z 1)
    "${ZZ[@]}" "${f[@]}" >"$OUT/val_np1.log" 2>&1 &&
        on_layer "${SHARED[@]}" "${MPIRUN[@]}" -np 2 "${ZZ[@]}" "${f[@]}" --comm mpi >"$OUT/val_np2.log" 2>&1 || return 1
    awk -v a="$(sed -n 's/^val loss //p' "$OUT/val_np1.log")" -v b="$(sed -n 's/^val loss //p' "$OUT/val_np2.log")" '
        BEGIN { d = a - b; if (d < 0) d = -d; r = a != "" && b != "" && d <= 1e-5
                print (r ? "PASS" : "FAIL") " val loss " a " at np 1, " b " at np 2"; exit !r }'
}
shared_row 2 z_val_ranks val_ranks

# A planted NaN on the last rank (LLMC_TEST_PLANT_NAN: dev/test/seams.c): --check-nan stops
# every rank with one message.
nan_stops() {
    LLMC_TEST_PLANT_NAN=2 on_layer "${SHARED[@]}" "${MPIRUN[@]}" -np 2 "${ZZ[@]}" "${ZFLAGS[@]}" -b 2 -z 1 \
        --bucket-size 100000 --comm mpi --check-nan >"$OUT/nan_run.log" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && [ "$(grep -c 'error: non-finite gradient in h0.qkvb at step 3' "$OUT/nan_run.log")" = 1 ] &&
        ! grep -q '^step    4' "$OUT/nan_run.log" && echo "PASS one message, every rank stopped"
}
shared_row 2 zero1_check_nan nan_stops

# -sg on the GPU trainer's own replicated AdamW (llmc/adamw.cuh path; zero1/'s gate is the
# runtime's, tested on the CPU): a grad-norm spike planted at step 4 (LLMC_TEST_GRAD_SPIKE)
# skips its update, so the checkpoints before and after it hold the same weights (the spike
# detector, which would skip it too, off).
skip_update() {
    LLMC_TEST_GRAD_SPIKE=3 "$OUT/train_gpt2cu_FP32" "${ZFLAGS[@]}" -x 4 -n 1 -nk 2 -o "$OUT/skip" --outlier-window 2 \
        -sg 3 --spike-norm-factor 0 >"$OUT/skip_run.log" 2>&1 || return 1
    [ "$(grep -c '^step 4: update skipped' "$OUT/skip_run.log")" = 1 ] &&
        cmp "$OUT/skip/checkpoint_00000003/model.bin" "$OUT/skip/checkpoint_00000004/model.bin" &&
        echo "PASS step 4's update skipped, its weights unchanged"
}
row skip_outlier_update skip_update

# Non-finite steps (run/step.h's update gate: the GPU trainer's replicated AdamW, and
# zero1/ at np 2): a NaN gradient in every step from step 3 (LLMC_TEST_PLANT_NAN=2+) skips
# steps 3 and 4, and past --max-nonfinite-steps 1 the run stops after step 4 with one error
# (exit 1, every rank); checkpoint 2, the newest, is what is left, and -y 1 resumes from it.
# A NaN loss alone (LLMC_TEST_NAN_LOSS) skips its step too; a model file holding a NaN is
# refused at load.
nonfinite_stops() {  # nonfinite_stops NAME LAUNCH... -- ARGS...
    local name=$1 out=$OUT/nonfinite_$1 launch=()
    shift
    while [ "$1" != -- ]; do launch+=("$1"); shift; done
    shift
    local flags=("${ZFLAGS[@]}" -x 4 -n 2 -nk 1 --max-nonfinite-steps 1 -o "$out" "$@")
    LLMC_TEST_PLANT_NAN=2+ "${launch[@]}" "${flags[@]}" >"$out.log" 2>&1
    local rc=$?
    [ $rc = 1 ] && [ "$(grep -c 'error:' "$out.log")" = 1 ] && ! grep -q '^\[rank [1-9]' "$out.log" &&
        grep -q 'error: non-finite grad norm .* in 2 steps in a row, 3 to 4, more than --max-nonfinite-steps 1' "$out.log" &&
        [ "$(grep -c 'update skipped (non-finite grad norm)$' "$out.log")" = 2 ] &&
        [ "$(cd "$out" && ls -d checkpoint_* | tr '\n' ' ')" = "checkpoint_00000002 " ] || { echo "exit $rc"; return 1; }
    "${launch[@]}" "${flags[@]}" -y 1 >"$out.resumed.log" 2>&1 &&
        grep -q "^resumed from $out/checkpoint_00000002: step 2" "$out.resumed.log" &&
        grep -qE '^step +4/4 ' "$out.resumed.log" &&
        echo "PASS $name: steps 3-4 skipped, one error (exit $rc), checkpoint 2 left; -y 1 resumes from it"
}
row nonfinite_replicated nonfinite_stops replicated "$OUT/train_gpt2cu_FP32" -- -z 0
shared_row 2 nonfinite_zero1_np2 nonfinite_stops zero1_np2 on_layer "${SHARED[@]}" "${MPIRUN[@]}" -np 2 "${ZZ[@]}" -- -b 2 -z 1 \
    --bucket-size 100000 --comm mpi
nan_loss_skips() {
    LLMC_TEST_NAN_LOSS=1 "$OUT/train_gpt2cu_FP32" "${ZFLAGS[@]}" -x 2 -n 1 -o "$OUT/nan_loss" >"$OUT/nan_loss.log" 2>&1 &&
        [ "$(grep -c '^step 2: update skipped: non-finite loss (1 in a row' "$OUT/nan_loss.log")" = 1 ] &&
        cmp "$OUT/nan_loss/checkpoint_00000001/model.bin" "$OUT/nan_loss/checkpoint_00000002/model.bin" &&
        echo "PASS a NaN loss with finite gradients: step 2's update skipped, its weights unchanged"
}
row nonfinite_loss nan_loss_skips
nan_model_refused() {
    cp "$OUT/model_fp32.bin" "$OUT/nan_model.bin" &&
        printf '\x00\x00\xc0\x7f' | dd of="$OUT/nan_model.bin" bs=1 seek=$((1024 + 4 * 7)) conv=notrunc status=none
    "$OUT/train_gpt2cu_FP32" "${ZFLAGS[@]}" -e "$OUT/nan_model.bin" -x 1 >"$OUT/nan_model.log" 2>&1
    [ $? = 1 ] && [ "$(grep -c 'error:' "$OUT/nan_model.log")" = 1 ] &&
        grep -q "error: $OUT/nan_model.bin: tensor wte holds a non-finite value (nan) at element 7" "$OUT/nan_model.log" &&
        echo "PASS a model file holding a NaN is refused, naming the tensor and the element"
}
row nonfinite_model nan_model_refused

# --trace: device-time spans; a bucket's gradient collective starts on the communication
# stream while its own step's backward still runs on the compute stream (dev/test/
# trace_overlap.py pairs them; its self-test shows it fails on collectives that start only
# after their own backward). At np 1 ZeRO-1 all-reduces (a one-rank reduce-scatter is the
# identity), at np 2 it reduce-scatters.
row trace_overlap_self_test $PY dev/test/trace_overlap.py --self-test
# With 2 GPUs (and on the layer) np 2's reduce-scatters prove the overlap; np 1's one-rank
# all-reduces are for one-GPU machines.
if [ "$NUM_GPUS" -lt 2 ]; then
    row z_trace_np1 "${ZZ[@]}" "${ZFLAGS[@]}" -x 3 -z 1 --bucket-size 100000 --comm nccl --trace "$OUT/trace1.json"
    row zero1_trace_overlap_np1 $PY dev/test/trace_overlap.py "$OUT/trace1.rank0.json" "all-reduce b"
else
    row z_trace_np2 "${MPIRUN[@]}" -np 2 "${ZZ[@]}" "${ZFLAGS[@]}" -b 2 -x 3 -z 1 --bucket-size 100000 --comm nccl \
        --trace "$OUT/trace2.json"
    row zero1_trace_overlap_np2 $PY dev/test/trace_overlap.py "$OUT/trace2.rank0.json" "reduce-scatter b"
fi

# A stopped rank (SIGSTOP): every rank ends within --comm-timeout plus a few seconds, with
# one error line that names what it waited for.
stopped_rank() {
    local np=2 timeout_s=5 log=$OUT/stopped.out pid victim t_fault secs
    on_layer CUDA_CPU_NCCL_PEERS=local timeout 300 "${MPIRUN[@]}" -np $np "${ZZ[@]}" "${ZFLAGS[@]}" -b 2 -x 100000 -z 1 \
        --bucket-size 100000 --comm nccl \
        --comm-timeout $timeout_s -o "$OUT/stopped_run" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -qE '^step +2/' "$log" && break; sleep 0.1; done
    victim=$(for p in $(pgrep -f -- "-o $OUT/stopped_run"); do
                 tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && echo "$p"; done | head -n 1)
    [ -n "$victim" ] || { echo "FAIL no rank 1 to stop"; kill $pid; return 1; }
    kill -STOP "$victim"
    t_fault=$SECONDS
    wait $pid
    local rc=$?
    secs=$((SECONDS - t_fault))
    kill -KILL "$victim" 2>/dev/null
    local lines
    lines=$(grep -c "did not complete within $timeout_s s" "$log")
    grep -m1 "did not complete within" "$log"
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -le $((timeout_s + 5)) ] && [ "$lines" = 1 ] &&
        grep -qE "^error: \[rank 0\] (zero1: the GPU step|loss all-reduce) at step [0-9]+ did not complete within $timeout_s s" "$log" &&
        echo "PASS the job ended (exit $rc) $secs s after rank 1 stopped (timeout $timeout_s s)"
}
if [ "$NUM_GPUS" -ge 2 ]; then row zero1_stopped_rank stopped_rank; else skip zero1_stopped_rank "fewer than 2 GPUs"; fi
# A peer that dies in its teardown, before its ncclCommDestroy (dev/test/peer_killed.sh): the
# survivor's destroy, which NCCL 2.14+ completes only once every rank has reached its own, ends by
# the deadline. On the layer with NCCL's own peers (CUDA_CPU_NCCL_PEERS=local).
if [ "$NUM_GPUS" -ge 2 ]; then
    row zero1_peer_killed_at_teardown on_layer CUDA_CPU_NCCL_PEERS=local bash dev/test/peer_killed.sh \
        "$OUT/peer_killed.out" 3 "zero1 nccl: ncclCommDestroy did not complete within 3 s" -- "${MPIRUN[@]}" -np 2 \
        "${ZZ[@]}" "${ZFLAGS[@]}" -b 2 -x 1 -z 1 --bucket-size 100000 --comm nccl
else
    skip zero1_peer_killed_at_teardown "fewer than 2 GPUs"
fi
# A peer that dies with its part of a collective never queued: the survivor's host wait on the
# GPU (cudaStreamSynchronize, with NCCL kernels spinning) ends by the deadline too. At the run's
# end before the parameters' all-gathers (ZeRO-1: the replica check's sync), and before step 2
# (the plain trainer's NCCL all-reduce, its step's one sync).
PEER_JOB=("${MPIRUN[@]}" -np 2)
PEER_SMALL=(-b 1 -t 16 -v 0 -s 0 -l 1e-3 -c 0.1)
if [ "$NUM_GPUS" -ge 2 ]; then
    row zero1_peer_killed_before_param_sync on_layer CUDA_CPU_NCCL_PEERS=local env PEER_KILLED_AT=sync_params:1:1 \
        bash dev/test/peer_killed.sh "$OUT/peer_killed_sync.out" 3 "the parameters' all-gathers before the replica check" \
        -- "${PEER_JOB[@]}" "${ZZ[@]}" "${ZFLAGS[@]}" "${PEER_SMALL[@]}" -x 1 -z 1 --bucket-size 100000 --comm nccl
    row plain_peer_killed_in_step on_layer CUDA_CPU_NCCL_PEERS=local env PEER_KILLED_AT=step:1:2 \
        bash dev/test/peer_killed.sh "$OUT/peer_killed_step.out" 3 "the GPU step (its NCCL all-reduce) at step 2" \
        -- "${PEER_JOB[@]}" "$OUT/train_gpt2cu_FP32" "${ZFLAGS[@]}" "${PEER_SMALL[@]}" -x 2
else
    skip zero1_peer_killed_before_param_sync "fewer than 2 GPUs"
    skip plain_peer_killed_in_step "fewer than 2 GPUs"
fi

# Stopped in an MPI call (dev/test/mpi_stop.sh: an LD_PRELOAD shim stops rank 1 in it): the
# set-up's MPI_Comm_split_type and GPU check (MPI_Allgather of the GPUs' UUIDs), the NCCL
# bootstrap's MPI_Bcast (rank 0, its root, then waits in the MPI_Comm_dup) and MPI_Comm_dup, the
# split embedding's host all-gather in the steps (its third MPI_Allgather): each ends the job
# within --comm-timeout + 8 s naming the call.
STOP_JOB=("${MPIRUN[@]}" -np 2 "${ZZ[@]}" "${ZFLAGS[@]}" -b 2 -x 3 --comm nccl)
if [ "$NUM_GPUS" -ge 2 ]; then
    row stopped_in_split_type bash dev/test/mpi_stop.sh "$OUT" MPI_Comm_split_type 3 "MPI_Comm_split_type" -- "${STOP_JOB[@]}"
    row stopped_in_gpu_check bash dev/test/mpi_stop.sh "$OUT" MPI_Allgather 3 "MPI_Allgather of GPU UUIDs" -- "${STOP_JOB[@]}"
    row stopped_in_bcast bash dev/test/mpi_stop.sh "$OUT" MPI_Bcast 3 "bootstrap's MPI_Comm_dup" -- "${STOP_JOB[@]}"
    row stopped_in_comm_dup bash dev/test/mpi_stop.sh "$OUT" MPI_Comm_dup 3 "bootstrap's MPI_Comm_dup" -- "${STOP_JOB[@]}"
    # In the steps, its NCCL communicator live: on the layer with NCCL's own peers.
    row stopped_in_host_all_gather on_layer CUDA_CPU_NCCL_PEERS=local bash dev/test/mpi_stop.sh "$OUT" MPI_Allgather:1:3 3 \
        "host all-gather" -- "${STOP_JOB[@]}" --split-embedding
else
    skip stopped_in_mpi_calls "fewer than 2 GPUs"
fi

# ---- --dp-invariant: 1, 2 and 4 ranks (a GPU each over NCCL; ranks that share a GPU over
# staged MPI), 4 steps with clipping: byte-identical checkpoints and step lines
# (dev/test/test_dp_invariant.sh's GPU mode, on the BF16 zero1/ build) ----
# Its bits hold in any order of NCCL's sums (its own exact sums: docs/zero1.md) and for any
# layout's alignments (the cuBLASLt plans' keys: llmc/matmul.cuh; bf16 views are 128 or 256
# bytes aligned as the bucket size falls, fp32 ones always 256): the BF16 build, on the
# layer with both random.
row build_train_z_bf16 build train_gpt2cu BF16 z
DPI=(env GPU="$OUT/train_gpt2cu_z_BF16" bash dev/test/test_dp_invariant.sh)
if [ $LAYER = 1 ]; then
    row dp_invariant_gpu on_layer CUDA_CPU_NCCL_ORDER=random CUDA_CPU_BLASLT_HEURISTIC=random "${DPI[@]}"
else
    shared_row 4 dp_invariant_gpu "${DPI[@]}"
fi
source dev/test/gpu_rows_memory.sh  # the memory check against the GPU's memory as the layer counts it

# ---- Checkpoints across trainers (the FP32 GPU builds above, the CPU trainer) ----
if [ -n "$(find /usr/include -name cblas.h -path '*openblas*' 2>/dev/null | head -n 1)" ] || [ -f /usr/include/cblas.h ]; then
    row build_train_cpu make train_gpt2 USE_ZERO1=1
    CKPT_FLAGS=(-e "$OUT/model_fp32.bin" -i "$OUT/random_tokens.bin" -t 64 -v 0 -s 0)
    # resumes_exactly NAME "NP WRITER FLAGS..." "NP READER FLAGS...": the writer saves step 2, the
    # reader resumes it for one step at learning rate 0 (a deliberate change of the schedule:
    # --allow-resume-change); model.bin of step 3 == that of step 2. On the layer a GPU writer's
    # saves (pageable D2H copies) run under PAGEABLE_D2H, a GPU reader's loads under PAGEABLE_H2D.
    resumes_exactly() {
        local a=$OUT/ckpt_$1_a b=$OUT/ckpt_$1_b np bin flags
        read -r np bin flags <<<"$2"
        # shellcheck disable=SC2086
        "${MPIRUN[@]}" -np "$np" "$bin" "${CKPT_FLAGS[@]}" -b $((4 / np)) -x 2 -n 2 -o "$a" $flags || return 1
        mkdir -p "$b" && cp -r "$a/checkpoint_00000002" "$b/" || return 1
        read -r np bin flags <<<"$3"
        # shellcheck disable=SC2086
        "${MPIRUN[@]}" -np "$np" "$bin" "${CKPT_FLAGS[@]}" -b $((4 / np)) -x 3 -n 1 -l 0 -y 1 --allow-resume-change -o "$b" $flags || return 1
        cmp "$a/checkpoint_00000002/model.bin" "$b/checkpoint_00000003/model.bin" && echo "PASS $1: master exact"
    }
    GPU=$OUT/train_gpt2cu_FP32 GPU_Z1=$OUT/train_gpt2cu_z_FP32
    row ckpt_gpu_to_cpu on_layer "${PAGEABLE_D2H[@]}" resumes_exactly gpu_to_cpu "1 $GPU -z 0" "1 ./train_gpt2 -z 1"
    row ckpt_cpu_to_gpu on_layer "${PAGEABLE_H2D[@]}" resumes_exactly cpu_to_gpu "1 ./train_gpt2 -z 1" "1 $GPU -z 0"
    row ckpt_gpu_zero1_to_cpu on_layer "${PAGEABLE_D2H[@]}" resumes_exactly gpu_zero1_to_cpu "1 $GPU_Z1 -z 1" "1 ./train_gpt2 -z 0"
    row ckpt_cpu_to_gpu_zero1 on_layer "${PAGEABLE_H2D[@]}" resumes_exactly cpu_to_gpu_zero1 "1 ./train_gpt2 -z 0" "1 $GPU_Z1 -z 1"
    if [ "$NUM_GPUS" -ge 2 ]; then
        row ckpt_gpu_zero1_np2_to_cpu on_layer "${PAGEABLE_D2H[@]}" resumes_exactly gpu_zero1_np2_to_cpu "2 $GPU_Z1 -z 1" "1 ./train_gpt2 -z 1"
        row ckpt_cpu_np2_to_gpu_np2 on_layer "${PAGEABLE_H2D[@]}" resumes_exactly cpu_np2_to_gpu_np2 "2 ./train_gpt2 -z 1" "2 $GPU -z 0"
    fi
    # The HellaSwag-style eval (-H 1, run/eval.h): on the same model and file the
    # GPU trainer's completion losses (read back into pageable memory: PAGEABLE_D2H), predictions
    # and accuracy are the CPU trainer's. On the
    # layer 8 items of the small set (each forward costs seconds there), on a GPU all 40.
    hellaswag_same() {
        local d=$OUT/hellaswag items=40
        [ $LAYER = 1 ] && items=8
        mkdir -p "$d" && make -s prepro_text && ./prepro_text --out-dir "$d" --eval-items $items >"$d/prepro.log" || return 1
        local flags=(-e "$OUT/model_fp32.bin" -i "$OUT/random_tokens.bin" -b 4 -t 64 -x 0 -v 0 -s 0 -H 1
                     --hellaswag-file "$d/tinyshakespeare_hellaswag.bin")
        ./train_gpt2 "${flags[@]}" --hellaswag-dump "$d/cpu.txt" >"$d/cpu.log" 2>&1 || { tail "$d/cpu.log"; return 1; }
        "$GPU" "${flags[@]}" --hellaswag-dump "$d/gpu.txt" >"$d/gpu.log" 2>&1 || { tail "$d/gpu.log"; return 1; }
        local cpu gpu
        cpu=$(grep '^step 0: hellaswag accuracy' "$d/cpu.log") gpu=$(grep '^step 0: hellaswag accuracy' "$d/gpu.log")
        echo "CPU '$cpu', GPU '$gpu'"
        [ -n "$cpu" ] && [ "$cpu" = "$gpu" ] && dev/test/hellaswag_compare.sh "$d/gpu.txt" "$d/cpu.txt" 1e-4 $items &&
            echo "PASS the GPU trainer's HellaSwag-style eval is the CPU trainer's"
    }
    row hellaswag_gpu_vs_cpu on_layer "${PAGEABLE_D2H[@]}" hellaswag_same
    # --stochastic-rounding at -l 0 (the master stays the fp32 model's weights): after 2
    # steps the BF16 GPU trainer's params, through zero1/'s CUDA AdamW and through its own
    # replicated one (llmc/adamw.cuh), are the CPU trainer's bf16 zero1/ params bit for bit
    # (the bits depend only on seed, step and model-space index).
    sr_same() {
        local d=$OUT/sr flags=(-l 0 --stochastic-rounding)
        mkdir -p "$d" && make -s test_zero1 USE_ZERO1=1 || return 1
        "${MPIRUN[@]}" -np 1 ./test_zero1 "$OUT/model_fp32.bin" --steps 2 --dump-params "$d/cpu.bin" -z 1 \
            --param-dtype bf16 "${flags[@]}" >"$d/cpu.log" 2>&1 || { tail "$d/cpu.log"; return 1; }
        "$OUT/test_gpt2cu_z_BF16" --dump-params "$d/gpu_z1.bin" "$OUT/model_fp32.bin" 2 -z 1 "${flags[@]}" &&
            "$OUT/test_gpt2cu_BF16" --dump-params "$d/gpu_rep.bin" "$OUT/model_fp32.bin" 2 "${flags[@]}" || return 1
        cmp "$d/cpu.bin" "$d/gpu_z1.bin" && cmp "$d/cpu.bin" "$d/gpu_rep.bin" &&
            echo "PASS stochastic rounding: GPU (zero1/ and replicated) params == the CPU trainer's, bitwise"
    }
    row stochastic_rounding_gpu_vs_cpu sr_same
else
    skip "checkpoints across trainers" "no OpenBLAS headers for the CPU trainer (a GPU machine without them)"
fi

# ---- The demo's job on the GPU trainer: ZeRO-1 on 4 GPUs, the loss falls ----
demo_job() {
    local data=data/tinyshakespeare_train.bin val=data/tinyshakespeare_val.bin
    [ -f $data ] || { data=$OUT/random_tokens.bin; val=$data; }
    local steps=20
    [ $LAYER = 1 ] && steps=10
    "${MPIRUN[@]}" -np 4 "$OUT/train_gpt2cu_z_FP32" -e d2 -i $data -j $val -b 4 -t 64 -x $steps -l 1e-3 -u 3 -q 0.1 \
        -c 0.1 -v 5 -m 2 -s 0 -z 1 -o "$OUT/demo" 2>&1 | tee "$OUT/demo.out"
    [ "${PIPESTATUS[0]}" = 0 ] || return 1
    # The end-of-run report (gathered over the ranks) once showed NaN rows: none may.
    if grep -qi nan "$OUT/demo.out"; then echo "FAIL a NaN in the output"; return 1; fi
    local first last
    first=$(sed -n 's/^s:[0-9]* trl:\([^ ]*\).*/\1/p' "$OUT/demo/main.log" | head -n 1)
    last=$(sed -n 's/^s:[0-9]* trl:\([^ ]*\).*/\1/p' "$OUT/demo/main.log" | tail -n 1)
    awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' && echo "PASS train loss $first -> $last"
}
if [ "$NUM_GPUS" -ge 4 ]; then row demo_gpu demo_job; else skip demo_gpu "fewer than 4 GPUs"; fi

note "GPU suite on $WHERE: $SECONDS s in all"
if [ ${#SHARED_SKIPPED[@]} -gt 0 ]; then
    note "SKIPPED: ${#SHARED_SKIPPED[@]} rows whose ranks share a GPU, which the compute mode $COMPUTE_MODE forbids" \
        "(nvidia-smi -c DEFAULT allows it): ${SHARED_SKIPPED[*]}"
fi
done_testing
