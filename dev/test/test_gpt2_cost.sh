#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# gpt2_cost (the cost model, dev/cost/cost_model.h) and scripts/gpu_check.sh, without a GPU:
#   1. dev/test/cost_reference.py: FLOP totals (6N + 6LCT identities, attention's square or
#      tiles), bytes by hand from the shapes, the roofline and MFU from their definitions,
#      flash < naive, communication (n-1)/n and its overlap limits;
#   2. bad input: one `error:` line each, exit 1, nothing on stdout;
#   3. gpu_check.sh's dry run (GPU_CHECK_DRY_RUN=1): every variant's command, and the
#      prediction columns equal to gpt2_cost --brief for the GPU the name says;
#   4. gpu_check.sh against a fake GPU (a stub nvidia-smi, nvcc, make, trainer and peer on PATH):
#      the measured column is the mean of the stub's step lines after the skipped ones, and
#      the ratio vs torch is the new path's over the peer's; a driver older than nvcc's CUDA
#      and a trainer that misses a library each stop it with one message;
#   5. the PyTorch peer itself (dev/bench/torch_gpt2_bench.py) on the CPU, tiny: its line,
#      the d2 parameter count from the shapes, a loss near ln(50257) (SKIPPED without torch).
# A few seconds. Prints TAP (dev/test/test_lib.sh); stops at the first failure.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

make -s gpt2_cost >/dev/null || fatal "make gpt2_cost failed"

# 1. the independent reference
ref=$($PY dev/test/cost_reference.py --binary ./gpt2_cost) || fatal "$ref"
ok "$ref"

# 2. bad input
echo '{"precision": "BF16", "blocks_per_sm": 4}' >"$TMP/no_kernel.jsonl"
bad_cases=(
    "bad model|--model d0"
    "bad model name|--model gpt5"
    "zero batch|-b 0"
    "T over maxT|-t 2048"
    "unknown gpu|--gpu a100"
    "bad path|--path fast"
    "bad attention|--attention sparse"
    "unknown option|--frobnicate 1"
    "missing value|-b"
    "zero dp|--dp 0"
    "bad efficiency|--gemm-efficiency 1.5"
    "json and brief|--json --brief"
    "missing profile|--profile /nonexistent/profile.jsonl"
    "profile not JSON|--profile Makefile"
    "occupancy without kernel|--occupancy $TMP/no_kernel.jsonl"
)
for c in "${bad_cases[@]}"; do
    IFS='|' read -r name args <<<"$c"
    # shellcheck disable=SC2086
    ./gpt2_cost $args >"$TMP/out" 2>"$TMP/err"
    rc=$?
    [ $rc -eq 1 ] || fatal "$name ($args): exit $rc, want 1"
    if [ "$(grep -c '^error: ' "$TMP/err")" -ne 1 ] || [ "$(wc -l <"$TMP/err")" -ne 1 ]; then
        fatal "$name ($args): want exactly one error line, got: $(cat "$TMP/err")"
    fi
    [ -s "$TMP/out" ] && fatal "$name ($args): printed on stdout"
done
ok "${#bad_cases[@]} bad inputs: one error line each, exit 1"

# --optimizer muon: Newton-Schulz's FLOPs, worked by hand for d12 (C = 768), 5 steps. An r x c
# matrix (r <= c) costs 4r^2c + 2r^3 a step: Q, K, V, attprojw each C x C (6C^3), fcw and fcprojw
# C x 4C (16C^3 + 2C^3 = 18C^3): 60C^3 a layer and step, x 5 x 12 = 3600 C^3 = 1,630,745,395,200.
# At DP 8 the busiest rank owns the most (> 1/8 of it); with -z 0 every rank runs all of it.
muon_json() { ./gpt2_cost --optimizer muon --json "$@" | $PY -c 'import json, sys; m = json.load(sys.stdin)["muon"]; print(m["total_flops"], m["busiest_flops"])'; }
read -r total busiest < <(muon_json --dp 8)
read -r total0 busiest0 < <(muon_json --dp 8 -z 0)
if [ "$total" = 1630745395200 ] && awk -v b="$busiest" -v t="$total" 'BEGIN { exit !(b > t / 8 && b < t / 4) }' &&
   [ "$busiest0" = "$total0" ] && [ "$total0" = "$total" ]; then
    ok "--optimizer muon: d12's Newton-Schulz FLOPs 3600 C^3 = $total; DP 8's busiest rank $busiest; -z 0 all of it"
else
    not_ok "--optimizer muon: FLOPs $total (want 1630745395200), busiest $busiest at DP 8, -z 0 $busiest0 of $total0"
fi

# The prediction gpu_check should print for a variant: achievable ms from gpt2_cost --brief.
predicted_ms() {  # predicted_ms GPU FLAGS...
    local gpu=$1
    shift
    ./gpt2_cost --model d12 -b 16 -t 1024 --gpu "$gpu" --brief "$@" | sed -nE 's/.* achievable_ms=([0-9.]+) .*/\1/p'
}
row() { awk -v n="$1" 'index($0, n) == 1 { print; exit }' "$2"; }  # the table row of variant $1

# 3. dry run, as an H200 and as an unknown GPU
GPU_CHECK_DRY_RUN=1 GPU_CHECK_GPU_NAME="NVIDIA H200" GPU_CHECK_PEER=0 bash scripts/gpu_check.sh >"$TMP/dry" 2>&1 ||
    fatal "dry run exited $?: $(tail -n 5 "$TMP/dry")"
for flags in "--attention naive" "--fused-kernels 0" "-r 0" "--attention naive --fused-kernels 0 -r 0" "-z 1"; do
    grep -q -- "would run: .*/plain -e d12 -b 16 -t 1024 -x 20 .*$flags\|would run: .*/zero1 .*$flags" "$TMP/dry" ||
        fatal "dry run: no command with '$flags'"
done
grep -q "predicted (gpt2_cost, H200)" "$TMP/dry" || fatal "dry run as an H200: not predicted for the H200"
want=$(predicted_ms h200 --attention naive --fused-kernels 1 -r 1 -z 0)
row "--attention naive" "$TMP/dry" | grep -qF "/ $(printf '%7.2f' "$want")" ||
    fatal "dry run: '--attention naive' row lacks the H200 prediction $want: $(row "--attention naive" "$TMP/dry")"
want=$(predicted_ms h200 --path naive)
row "naive path" "$TMP/dry" | grep -qF "/ $(printf '%7.2f' "$want")" || fatal "dry run: naive path row lacks $want"
GPU_CHECK_DRY_RUN=1 GPU_CHECK_GPU_NAME="Tesla T4" GPU_CHECK_PEER=0 bash scripts/gpu_check.sh >"$TMP/dry_t4" 2>&1 ||
    fatal "dry run (T4) exited $?"
grep -q "H100 (the cost model knows H100 and H200 only" "$TMP/dry_t4" || fatal "dry run (T4): no H100 fallback note"
ok "dry run: every variant's command, predictions for the H200 and (other GPUs) the H100"

# 4. a fake GPU: stubs for nvidia-smi, make (the train_gpt2cu builds, data, test_gpu), the
# trainer (its step lines: 3 slow warm-up steps, then 40 ms, 50 ms with --attention naive)
# and the PyTorch peer; in a copy of the sources, so that this checkout's binaries stay.
mkdir -p "$TMP/bin" "$TMP/repo"
cp -r Makefile train_gpt2.cu llmc run zero1 scripts gpt2_cost "$TMP/repo"/
cat >"$TMP/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in
  *-L*) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-fake)" ;;
  *driver_version*) echo "580.65.06" ;;
  "") echo "| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: ${FAKE_DRIVER_CUDA:-13.0}     |" ;;
  *) echo "NVIDIA H100 80GB HBM3" ;;
esac
EOF
cat >"$TMP/bin/nvcc" <<'EOF'
#!/usr/bin/env bash
echo "Cuda compilation tools, release 13.0, V13.0.88"
EOF
REAL_MAKE=$(command -v make)  # every other target goes to the real make
cat >"$TMP/bin/make" <<EOF
#!/usr/bin/env bash
case " \$* " in
  *" train_gpt2cu "*) cp "\${FAKE_TRAINER:-$TMP/fake_trainer}" train_gpt2cu ;;
  *" data "*) echo "fake make data" ;;
  *" test_gpu "*) printf '1..9\n# 7 passed, 0 failed, 2 skipped\n' ;;
  *" gpt2_cost "*) [ -x gpt2_cost ] ;;
  *) exec "$REAL_MAKE" "\$@" ;;
esac
EOF
cat >"$TMP/fake_trainer" <<'EOF'
#!/usr/bin/env bash
ms=40.0
case " $* " in *" --attention naive "*) ms=50.0 ;; esac
echo "GPT-2: L=12 C=768, 124475904 parameters"
for i in $(seq 1 20); do
  m=$ms; [ "$i" -le 3 ] && m=400.0
  echo "step $(printf '%4d' "$i")/20 | loss 9.0 | norm 1.0 | lr 3.00e-04 | $m ms | 1 tok/s | comm wait 0.0 ms"
done
echo "GPU memory in use at the end: 1234.5 MiB of 81559.0 MiB (the whole GPU: ranks sharing it add up)"
EOF
cat >"$TMP/peer.py" <<'EOF'
print("torch_bench L=12 B=16 T=1024 compile=1 ms/step=45.00 tok/s=364088")
EOF
chmod +x "$TMP/bin/nvidia-smi" "$TMP/bin/nvcc" "$TMP/bin/make" "$TMP/fake_trainer"
PATH="$TMP/bin:$PATH" LLMC_PYTHON=python3 GPU_CHECK_PEER_SCRIPT="$TMP/peer.py" bash "$TMP/repo/scripts/gpu_check.sh" \
    >"$TMP/fake" 2>&1 || fatal "fake GPU run exited $?: $(tail -n 20 "$TMP/fake")"
row "new (flash" "$TMP/fake" | grep -qE '^new \(flash, fused, -r 1\) +40\.00 +409600 ' ||
    fatal "fake GPU: new path row: $(row "new (flash" "$TMP/fake")"
row "--attention naive" "$TMP/fake" | grep -qE '^--attention naive +50\.00 +327680 ' ||
    fatal "fake GPU: naive row: $(row "--attention naive" "$TMP/fake")"
want=$(predicted_ms h100 --path new -z 0)
row "new (flash" "$TMP/fake" | grep -qF "/ $(printf '%7.2f' "$want")" || fatal "fake GPU: no H100 prediction $want"
ratio=$(awk -v a=40 -v b="$want" 'BEGIN { printf "%.2f", a / b }')
row "new (flash" "$TMP/fake" | grep -qE "\| +$ratio\$" || fatal "fake GPU: measured/predicted $ratio missing"
row "torch peer" "$TMP/fake" | grep -qE '45\.00' || fatal "fake GPU: peer row: $(row "torch peer" "$TMP/fake")"
grep -q "tests (make test_gpu): 7 passed, 0 failed, 2 skipped$" "$TMP/fake" || fatal "fake GPU: tests line"
grep -q "ZeRO-1 / replicated step time: 1.000 (round 1), 1.000 (round 2)" "$TMP/fake" || fatal "fake GPU: ratio line"
grep -q "^ratio vs torch 0.89 (the new path's ms/step 40.00 over the PyTorch peer's 45.00" "$TMP/fake" ||
    fatal "fake GPU: ratio vs torch: $(grep 'ratio vs torch' "$TMP/fake")"
grep -q "^gpu_check finished in [0-9]* s" "$TMP/fake" || fatal "fake GPU: no total time"
ok "fake GPU: measured means of steps 4..20, predictions and ratios in the table, ratio vs torch"

# 4b. a first run that fails only for real reasons: a driver of CUDA 12.8 for nvcc 13.0 stops
# gpu_check at once with both versions; a trainer that needs a library the loader cannot find
# (a stub library built here, then removed) stops it after the build, naming it and where the
# loader looked.
PATH="$TMP/bin:$PATH" FAKE_DRIVER_CUDA=12.8 bash "$TMP/repo/scripts/gpu_check.sh" >"$TMP/old_driver" 2>&1 &&
    fatal "an old driver: gpu_check exited 0"
grep -q "the NVIDIA driver 580.65.06 supports CUDA 12.8, but nvcc builds for CUDA 13.0" "$TMP/old_driver" ||
    fatal "an old driver: $(tail -n 3 "$TMP/old_driver")"
grep -q "^== make test_gpu" "$TMP/old_driver" && fatal "an old driver: gpu_check went on to the tests"
mkdir -p "$TMP/lib"
echo 'int llmc_stub;' | gcc -shared -fPIC -x c - -o "$TMP/lib/libllmc_gone.so.1" -Wl,-soname,libllmc_gone.so.1 &&
    echo 'int main(void) { return 0; }' | gcc -x c - -o "$TMP/needs_gone" -L"$TMP/lib" -Wl,--no-as-needed \
        -l:libllmc_gone.so.1 || fatal "cannot build the stub trainer"
rm -rf "$TMP/lib"
PATH="$TMP/bin:$PATH" FAKE_TRAINER="$TMP/needs_gone" bash "$TMP/repo/scripts/gpu_check.sh" >"$TMP/no_lib" 2>&1 &&
    fatal "a missing library: gpu_check exited 0"
grep -q "needs libllmc_gone.so.1, which the dynamic loader does not find; it looked in: LD_LIBRARY_PATH" \
    "$TMP/no_lib" || fatal "a missing library: $(tail -n 3 "$TMP/no_lib")"
ok "first run: an old driver and a missing library each stop gpu_check with what it found"

# 5. the peer on the CPU: d2 (C 128) at B 2, T 64; its parameters counted from the shapes
# (wte 50304 x C, wpe 1024 x C, per layer 12 C^2 + 13 C, lnf 2 C); a loss after 4 steps
# on one batch of random tokens below ln(50257) = 10.82 and above what 4 steps could learn.
if ! $PY -c 'import torch' 2>/dev/null; then
    skip "the PyTorch peer on the CPU" "$PY has no torch"
else
    peer=$(OMP_NUM_THREADS=1 $PY dev/bench/torch_gpt2_bench.py --model d2 -b 2 -t 64 --steps 3 --warmup 1 --device cpu 2>&1)
    C=128 L=2
    params=$((50304 * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C))
    echo "$peer" | awk -v params=$params '
        /^torch_bench / { for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }; n++ }
        END { ok = n == 1 && f["model"] == "d2" && f["params"] == params && f["B"] == 2 && f["T"] == 64 &&
                   f["device"] == "cpu" && f["ms/step"] > 0 && f["peak_mib"] > 0 && f["loss"] > 5 && f["loss"] < 10.82 &&
                   (f["tok/s"] - 128000 / f["ms/step"]) ^ 2 < 1
              exit !ok }' || fatal "the peer on the CPU: want one torch_bench line, $params parameters: $peer"
    ok "the PyTorch peer on the CPU: $peer"
fi
done_testing
