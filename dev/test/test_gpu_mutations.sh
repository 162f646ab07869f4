#!/usr/bin/env bash
# test: timeout=900 lane=layer tier=full
# The GPU suite must catch these bugs (make test runs this on the CPU execution layer for
# CUDA). Each mutation is applied to a copy of the source tree, the binary that exercises
# it is rebuilt with CUDA_ON_CPU=1, and its check must FAIL, for the reason named:
#   1. block_reduce (block_reduce_sum and its kin) without the __syncthreads between the warp
#      sums' writes and reads
#   2. a lane of layernorm_forward_kernel returning before its warp's shuffle
#   3. gelu_forward_kernel's tail loop bound off by one (j <= n)
#   4. matmul_forward's cuBLASLt call with transA swapped
#   5. zero1's NCCL reduce-scatter at the wrong in-place offset
#   6. zero1's NCCL collectives without cudaStreamWaitEvent on the compute stream
# and these, which today's checks in forward order pass, and the layer's tools (built with
# CUDA_CPU_TOOLS=1; docs/cuda_cpu.md) must catch:
#   7. the BF16 flash forward without the __syncthreads between the k/v tile's loads and the
#      warps' reads of it: CUDA_CPU_CHECK=race reports the hazard
#   8. layernorm_forward_kernel's last warp also normalizing the next block's first row (the
#      same values, written twice): CUDA_CPU_CHECK=race reports the race between blocks
#   9. the flash forward's q/k/v tiles without their 8 elements of row padding: the
#      profiler's shared-memory wavefronts per request exceed the kernel's budget
#  10. residual_forward_kernel's threads taking their packs in a strided order (each still
#      once): the profiler's sectors per request exceed the kernel's budget
# and these, which pass under the layer's former behaviour (every cuBLASLt request gets an
# algorithm; NCCL sums in rank order) and its freedoms (docs/cuda_cpu.md) must catch:
#  11. test_kernels_cuda requiring the fused BGRADB path: fails under
#      CUDA_CPU_BLASLT_HEURISTIC=none, where a GPU's cuBLASLt may have no algorithm
#  12. test_gpt2cu asserting its rerun's bits at 4 ranks without NCCL_ALGO pinned: fails under
#      CUDA_CPU_NCCL_ORDER=random, where NCCL may pick another order on the rerun
# and these, which only CUDA_CPU_CHECK=memcheck catches:
#  13. layernorm's 128-bit path chosen by the weight's and bias's alignment alone, so taken at
#      rows aligned to 4 bytes only (x86 loads them silently): CUDA_CPU_CHECK=memcheck reports
#      the misaligned 16-byte load
#  14. zero1/'s C runtime reading a gradient on the host to check it for NaN (the device's
#      buffer: a GPU's process would crash): CUDA_CPU_CHECK=memcheck names the line
# and this, which only GPU numerics' tensor-core model (CUDA_CPU_NUMERICS=gpu) catches:
#  15. test_kernels_cuda's 32778-long one-sided dweight sum held to the round-to-nearest bound
#      (10 sqrt(k) U of its mass, which needs mean-zero errors): passes with
#      CUDA_CPU_TC_GROUP=0 (exact products, fp32 sums), fails as tensor cores truncate
# and this, which the layer caught only once it kept each kernel's launch resources (issue 46):
#  16. adamw_kernel's __launch_bounds__ halved (to buy registers) while its launch keeps 256
#      threads: an H100 refuses the launch ("too many resources requested for launch")
# and this, which only the layer's count of device memory (docs/cuda_cpu.md, "Device memory")
# catches:
#  17. the memory check not counting NCCL's buffers: on a GPU 2 MiB over its need the layer
#      refuses ncclCommInitRank (the former layer charged no buffers: the run trained)
# and this one, which passes under the layer's former NCCL peers (a peer's exit ends the others'
# waits; ncclCommDestroy waits for local work only) and only CUDA_CPU_NCCL_PEERS=local catches:
#  18. ncclCommDestroy outside the job's deadline (run/nccl_comm.cu): with a peer killed in its
#      teardown (dev/test/peer_killed.sh, test_zero1_cuda at np 2) rank 0 stays in the destroy
#      past --comm-timeout + 5 s
# and these, at the host/library boundary, which only the layer's MPI check and its
# pageable-copy switch catch (docs/cuda_cpu.md, "The hardware's freedoms"):
#  19. zero1's staged MPI reduce-scatter handed the device buffer instead of its host copy
#      (an MPI that is not CUDA-aware reads it on the host: a GPU's process crashes):
#      CUDA_CPU_CHECK=memcheck names the call, the argument and the line
#  20. test_gpt2cu reading the GPU trainer's loss after a cudaMemcpyAsync into pageable memory,
#      without the stream sync: fails under CUDA_CPU_PAGEABLE_D2H=async, where the copy may
#      return before it lands, as on a GPU
#  21. the plain trainer queueing a pageable upload behind its step's NCCL all-reduce: where the
#      driver waits for the stream before staging it (CUDA_CPU_PAGEABLE_H2D=stream), that is a
#      host wait outside the deadline, and with a peer killed (CUDA_CPU_NCCL_PEERS=local) rank 0
#      does not end within --comm-timeout + 5 s
# A mutation whose text is not found in the source is a failure too (the test would have
# rotted). Two mutations run at a time; LLMC_TEST_ROWS=REGEX runs only those whose names match. Prints
# TAP (dev/test/test_lib.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
require LAYER
ROOT=$PWD

make -s cuda_cpu CUDA_ON_CPU=1 >/dev/null || fatal "build the CPU layer"
$PY dev/test/gpt2_oracle.py make --out-model "$TMP/model.bin" --out-state "$TMP/state.bin" --dtype fp32 --steps 2 \
    >/dev/null || fatal "oracle"

# mutate NAME FILE OLD NEW: a fresh copy of the tree in $TMP/NAME with OLD replaced by NEW in FILE.
mutate() {
    local dir=$TMP/$1
    mkdir -p "$dir"
    bash "$ROOT/scripts/copy_sources.sh" "$dir"
    mkdir -p "$dir/build" && cp -rp "$ROOT/build/cuda_cpu" "$dir/build/"  # the layer itself is not mutated
    rm -rf "$dir/build/cuda_cpu/"{src,tests}
    $PY - "$dir/$2" "$3" "$4" <<'PYEOF'
import sys
path, old, new = sys.argv[1:4]
text = open(path).read()
if text.count(old) != 1:
    sys.exit("mutation text found %d times in %s" % (text.count(old), path))
open(path, "w").write(text.replace(old, new))
PYEOF
}

# caught_one NAME FILE OLD NEW TARGET USE_ZERO1 REASON COMMAND...: COMMAND (run in the
# mutated tree) must fail, and its output must contain REASON; prints one PASS or FAIL line
# (then the log's tail), which the end of this script reads back as a TAP check.
caught_one() {
    local name=$1 file=$2 old=$3 new=$4 target=$5 z=$6 reason=$7
    shift 7
    local dir=$TMP/$name log=$TMP/$name.log
    if ! mutate "$name" "$file" "$old" "$new" >"$log" 2>&1; then
        echo "FAIL $name: the mutation could not be applied: $(tail -n 1 "$log")"
        return
    fi
    # PREC, TOOLS, NUMERICS (set by the caller): the build's precision, CUDA_CPU_TOOLS, CUDA_CPU_NUMERICS.
    if ! (cd "$dir" && make -j2 "$target" CUDA_ON_CPU=1 PRECISION="${PREC:-FP32}" CUDA_CPU_TOOLS="${TOOLS:-0}" \
            CUDA_CPU_NUMERICS="${NUMERICS:-ieee}" USE_ZERO1="$z") >>"$log" 2>&1; then
        echo "FAIL $name: the mutated tree does not build (see $log)"
        return
    fi
    (cd "$dir" && timeout 300 bash -c '"$@"' caught_one "$@") >>"$log" 2>&1  # bash: COMMAND may be a function below
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qE -- "$reason" "$log"; then
        echo "PASS $name: caught (exit $rc): $(grep -m1 -E -- "$reason" "$log" | cut -c1-200)"
    else
        echo "FAIL $name: NOT caught (exit $rc, no line matching '$reason')"
        tail -n 15 "$log" | sed 's/^/    | /'
    fi
}
# expect_caught ARGS...: caught_one in the background, two at a time (each mutated tree is
# its own copy: their builds and runs share nothing); the results are read in order below.
NAMES=()
expect_caught() {
    selected "$1" || return 0  # LLMC_TEST_ROWS=REGEX: the mutations whose names match
    while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n; done
    NAMES+=("$1")
    caught_one "$@" >"$TMP/$1.result" 2>&1 &
}

KERNELS=(./test_kernels_cuda)
expect_caught no_barrier llmc/cuda_common.cuh \
    "    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : empty;" \
    "    if (lane == 0) shared[warp] = v;
    v = lane < nwarps ? shared[lane] : empty;" \
    test_kernels_cuda 0 "^not ok" "${KERNELS[@]}"
expect_caught lane_returns llmc/layernorm.cuh \
    "    float m = warp_reduce_sum(sum) / C;" \
    "    if (lane == 31) return;
    float m = warp_reduce_sum(sum) / C;" \
    test_kernels_cuda 0 "lane 31 \(thread [0-9]+\) returned before the __shfl_xor_sync" "${KERNELS[@]}"
expect_caught off_by_one llmc/gelu.cuh \
    "        for (size_t j = i; j < n && j < i + PACK_X; j++) out[j] = gelu_value(inp[j]);" \
    "        for (size_t j = i; j <= n && j < i + PACK_X; j++) out[j] = gelu_value(inp[j]);" \
    test_kernels_cuda 0 "^not ok.*gelu|past the end" "${KERNELS[@]}"
expect_caught swapped_transpose llmc/matmul.cuh \
    "matmul_cublaslt(out, CUBLAS_FLOATX, weight, inp, bias, OC, BT, C, 1, 0, 0.0f, stream);" \
    "matmul_cublaslt(out, CUBLAS_FLOATX, weight, inp, bias, OC, BT, C, 0, 0, 0.0f, stream);" \
    test_kernels_cuda 0 "^not ok.*matmul|cuBLAS" "${KERNELS[@]}"
ZERO1_NP2=("${MPIRUN[@]}" -np 2 ./test_gpt2cu "$TMP/model.bin" "$TMP/state.bin" -z 1 --bucket-size 4096 --comm nccl)
expect_caught wrong_inplace_offset zero1/comm_nccl.cu \
    "char* mine = whole + (size_t)c->rank * count * zero1_dtype_size(t);" \
    "char* mine = whole + (size_t)((c->rank + 1) % c->size) * count * zero1_dtype_size(t);" \
    test_gpt2cu 1 "in-place" "${ZERO1_NP2[@]}"
expect_caught no_stream_wait zero1/comm_nccl.cu \
    "    cudaCheck(cudaStreamWaitEvent(im->stream, im->compute_ready, 0));
    s->trace_start" \
    "    s->trace_start" \
    test_gpt2cu 1 "^not ok" env CUDA_CPU_EXEC=lazy "${ZERO1_NP2[@]}"

# The layer's tools. Each check first runs the test as today's suite does (forward order, no
# tools: it must pass, or the mutation proves nothing about the tools), then with them.
tools_only() {  # tools_only NAME=value... -- COMMAND...: fails when COMMAND fails under those settings
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    CUDA_CPU_ORDER=forward "$@" >plain.log 2>&1 || { echo "caught without the tools already: not a test of them"; return 0; }
    echo "today's check passes in forward order"
    env "${envs[@]}" "$@"
}
over_budget() {  # over_budget BUDGETS COMMAND...: fails when COMMAND's profile exceeds BUDGETS
    local budgets=$1
    shift
    tools_only CUDA_CPU_PROFILE=profile.jsonl -- "$@" >/dev/null || return 0
    $PY dev/test/check_kernel_budgets.py profile.jsonl "$budgets"
}
export -f tools_only over_budget
export PY
PREC=BF16 TOOLS=1 expect_caught flash_no_barrier llmc/attention_flash.cuh \
    "        flash_load_rows(v_s, ld, qkv, 3 * C, 2 * C + h * hs, b, k0, BC, T, hs);
        __syncthreads();" \
    "        flash_load_rows(v_s, ld, qkv, 3 * C, 2 * C + h * hs, b, k0, BC, T, hs);" \
    test_kernels_cuda 0 "kernel flash_attention_forward_kernel<[0-9]+> .*shared-memory hazard \(read after write\)" \
    tools_only CUDA_CPU_CHECK=race -- "${KERNELS[@]}"
TOOLS=1 expect_caught neighbour_row llmc/layernorm.cuh \
    "    layernorm_row(out + (size_t)row * C, mean + row, rstd + row, inp + (size_t)row * C, weight, bias, C, vec,
                  threadIdx.x % WARP_SIZE);
}" \
    "    layernorm_row(out + (size_t)row * C, mean + row, rstd + row, inp + (size_t)row * C, weight, bias, C, vec,
                  threadIdx.x % WARP_SIZE);
    int next = row + 1;
    if (threadIdx.x / WARP_SIZE == blockDim.x / WARP_SIZE - 1 && next < N)
        layernorm_row(out + (size_t)next * C, mean + next, rstd + next, inp + (size_t)next * C, weight, bias, C, vec,
                      threadIdx.x % WARP_SIZE);
}" \
    test_kernels_cuda 0 "kernel layernorm_forward_kernel .*global-memory race between blocks \(write after write\)" \
    tools_only CUDA_CPU_CHECK=race -- "${KERNELS[@]}"
# BF16: its WMMA loads of the unpadded rows meet 5x their bound; the FP32 build's 16-byte
# loads only just cross theirs (the <128> instance, 4.83 against 4.40).
PREC=BF16 TOOLS=1 expect_caught no_padding llmc/attention_flash.cuh \
    "    const int C = NH * hs, ld = hs + 8;
    const int qt" \
    "    const int C = NH * hs, ld = hs;
    const int qt" \
    test_kernels_cuda 0 "FAIL flash_attention_forward_kernel<[0-9]+>: shared_load_wavefronts_per_request .* over its budget" \
    over_budget dev/test/kernel_budgets_bf16.txt "${KERNELS[@]}"
TOOLS=1 expect_caught strided_load llmc/residual.cuh \
    "    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK_X;" \
    "    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x % 32 * 8 + threadIdx.x / 32) * PACK_X;" \
    test_kernels_cuda 0 "FAIL residual_forward_kernel: global_load_sectors_per_request .* over its budget" \
    over_budget dev/test/kernel_budgets_fp32.txt "${KERNELS[@]}"
# FP32: the skewed rows are 4 bytes off their 16-byte alignment (test_layernorm's skew 1).
TOOLS=1 expect_caught misaligned_vector llmc/layernorm.cuh \
    "return C % PACK_X == 0 && aligned16(p0) && aligned16(p1) && aligned16(p2) && aligned16(p3);" \
    "return C % PACK_X == 0 && aligned16(p2) && aligned16(p3);" \
    test_kernels_cuda 0 "kernel layernorm_forward_kernel .*memcheck: misaligned 16-byte load \(address mod 16 = 4\)" \
    tools_only CUDA_CPU_CHECK=memcheck -- "${KERNELS[@]}"
PREC=BF16 TOOLS=1 expect_caught host_reads_device zero1/runtime.c \
    "    fold_micro_step(rt, b);  // DP-invariant: the rank's pairwise sum first" \
    "    fold_micro_step(rt, b);  // DP-invariant: the rank's pairwise sum first
    if (isnan(rt->grads[bk->start])) fatal(\"zero1: a NaN gradient in bucket %d\", b);" \
    test_gpt2cu 1 "memcheck: host code reads 4 bytes of device memory, .* at zero1/runtime.c:[0-9]+" \
    tools_only CUDA_CPU_CHECK=memcheck -- "${MPIRUN[@]}" -np 2 ./test_gpt2cu --dump-params params.bin d2 1 -z 1 \
    --comm nccl

# The layer's freedoms. Each check first runs the test under the layer's former behaviour
# (it must pass, or the mutation proves nothing about the new mode), then under the mode.
mode_only() {  # mode_only OLD=value... -- NEW=value... -- COMMAND...: fails when COMMAND fails under NEW
    local old=() new=()
    while [ "$1" != -- ]; do old+=("$1"); shift; done
    shift
    while [ "$1" != -- ]; do new+=("$1"); shift; done
    shift
    env "${old[@]}" "$@" >former.log 2>&1 || { echo "caught under ${old[*]} already: not a test of the mode"; return 0; }
    echo "passes under ${old[*]}"
    env "${new[@]}" "$@"
}
export -f mode_only
expect_caught needs_fused_path dev/test/test_kernels_cuda.cu \
    "    report(bgrad != NOT_ASKED, \"matmul_backward_fused dbias path\"" \
    "    report(bgrad == FUSED, \"matmul_backward_fused dbias path\"" \
    test_kernels_cuda 0 "^not ok [0-9]+ - matmul_backward_fused dbias path .*\(BGRADB refused by the heuristic" \
    mode_only CUDA_CPU_BLASLT_HEURISTIC=all -- CUDA_CPU_BLASLT_HEURISTIC=none -- "${KERNELS[@]}"
expect_caught rerun_bits_unpinned dev/test/test_gpt2.cu \
    "    const char* algo = getenv(\"NCCL_ALGO\");" \
    "    const char* algo = \"Ring\";  // taken as pinned" \
    test_gpt2cu 1 "^not ok [0-9]+ - rerun bitwise identical" \
    mode_only CUDA_CPU_NCCL_ORDER=rank NCCL_ALGO= -- CUDA_CPU_NCCL_ORDER=random NCCL_ALGO= -- \
    "${MPIRUN[@]}" -np 4 ./test_gpt2cu "$TMP/model.bin" "$TMP/state.bin" -z 1 --bucket-size 65536 --comm nccl
PREC=BF16 NUMERICS=gpu expect_caught tc_unbiased_bound dev/test/test_kernels_cuda.cu \
    "            (*tol)[(size_t)o * C + c] = dot_err(BT + 2, fabs(pre_oc) + p.mass, p.bound());" \
    "            (*tol)[(size_t)o * C + c] = sum_err(BT + 2) * (fabs(pre_oc) + p.mass);" \
    test_kernels_cuda 0 "^not ok [0-9]+ - matmul_backward dweight \(\+=\) \[BT=32778 C=8 OC=8 .* positive\]" \
    mode_only CUDA_CPU_TC_GROUP=0 -- CUDA_CPU_TC_GROUP=16 -- "${KERNELS[@]}" long-sum
PREC=BF16 TOOLS=1 expect_caught mpi_device_buffer zero1/comm_mpi.c \
    "        mpi_fail(MPI_Ireduce_scatter_block(host, s->scratch," \
    "        mpi_fail(MPI_Ireduce_scatter_block(buf, s->scratch," \
    test_gpt2cu 1 "memcheck: MPI_Ireduce_scatter_block's sendbuf \([0-9]+ bytes\) is device memory, .* passed at zero1/comm_mpi.c:[0-9]+" \
    tools_only CUDA_CPU_CHECK=memcheck -- env CUDA_CPU_SHARED_GPU=1 "${MPIRUN[@]}" -np 2 ./test_gpt2cu --dump-params \
    params.bin d2 1 -z 1 --bucket-size 65536 --comm mpi
# Lazy both times: the copy lands only when something waits for it (0 is read, not a race).
expect_caught loss_read_unsynced dev/test/test_gpt2.cu \
    "    float loss;
    cudaCheck(cudaMemcpy(&loss, m->d_loss, sizeof(float), cudaMemcpyDeviceToHost));" \
    "    float loss = 0.0f;
    cudaCheck(cudaMemcpyAsync(&loss, m->d_loss, sizeof(float), cudaMemcpyDeviceToHost, m->stream));" \
    test_gpt2cu 0 "^not ok [0-9]+ - loss  " \
    mode_only CUDA_CPU_EXEC=lazy -- CUDA_CPU_EXEC=lazy CUDA_CPU_PAGEABLE_D2H=async -- \
    ./test_gpt2cu "$TMP/model.bin" "$TMP/state.bin"

# The launch's resources (cuda_cpu/kernel_attributes.cpp): before, __launch_bounds__ was erased.
expect_caught launch_bounds_halved llmc/adamw.cuh \
    "static __global__ void __launch_bounds__(ADAMW_THREADS)" \
    "static __global__ void __launch_bounds__(ADAMW_THREADS / 2)" \
    test_kernels_cuda 0 "kernel adamw_kernel \(llmc/adamw.cuh:[0-9]+\): a block of 256 threads, over its __launch_bounds__ of 128" \
    "${KERNELS[@]}"
# 17: the FP32 trainer without zero1/ (the smaller build): its all-reduce communicator at np 2.
expect_caught nccl_not_counted run/memory_check.c \
    "    memory_add(device, \"NCCL buffers\", staged ? 0 : buffers.communicators * MEMORY_NCCL_COMM_BYTES);" \
    "" \
    train_gpt2cu 0 "ncclCommInitRank: no device memory for its buffers" \
    bash dev/test/gpu_rows_memory.sh nccl_just_fits ./train_gpt2cu
expect_caught destroy_outside_deadline run/nccl_comm.cu \
    "    mpi_blocking_begin(what);
    ncclCheck(ncclCommDestroy(comm));
    mpi_blocking_end();" \
    "    (void)what;
    ncclCheck(ncclCommDestroy(comm));" \
    test_zero1_cuda 1 "FAIL rank 0 did not end within 7 s of rank 1's death at teardown" \
    mode_only CUDA_CPU_NCCL_PEERS=notify -- CUDA_CPU_NCCL_PEERS=local -- \
    bash dev/test/peer_killed.sh "$TMP/peer_killed.log" 2 "ncclCommDestroy did not complete" -- "${MPIRUN[@]}" -np 2 \
    ./test_zero1_cuda
# 21: the plain trainer's step (d2, 2 steps; rank 1 killed before step 2's collectives).
$PY -c "
import struct, sys
with open(sys.argv[1], 'wb') as f:
    f.write(struct.pack('<256i', 20240520, 1, 4096, *([0] * 253)))
    f.write(struct.pack('<4096H', *((i * 7919) % 50257 for i in range(4096))))
" "$TMP/tokens.bin"
expect_caught upload_behind_all_reduce train_gpt2.cu \
    "    nccl_all_reduce_sum(r->grads, r->numel, &r->nccl, st);" \
    "    nccl_all_reduce_sum(r->grads, r->numel, &r->nccl, st);
    float lr_host = lr;  // planted: a pageable upload queued behind the all-reduce
    cudaCheck(cudaMemcpyAsync(r->norm, &lr_host, sizeof(float), cudaMemcpyHostToDevice, st));" \
    train_gpt2cu 0 "FAIL rank 0 did not end within" \
    mode_only CUDA_CPU_NCCL_PEERS=local CUDA_CPU_PAGEABLE_H2D=staged PEER_KILLED_AT=step:1:2 -- \
    CUDA_CPU_NCCL_PEERS=local CUDA_CPU_PAGEABLE_H2D=stream PEER_KILLED_AT=step:1:2 -- \
    bash dev/test/peer_killed.sh "$TMP/upload_behind.log" 3 "the GPU step (its NCCL all-reduce) at step 2" -- \
    "${MPIRUN[@]}" -np 2 ./train_gpt2cu -e d2 -i "$TMP/tokens.bin" -b 1 -t 16 -x 2 -v 0 -s 0 -l 1e-3 -c 0.1

wait
for name in "${NAMES[@]}"; do
    result=$(grep -m1 -E "^(PASS|FAIL) $name:" "$TMP/$name.result")
    if [[ $result == "PASS $name:"* ]]; then
        ok "${result#PASS }"
    else
        not_ok "${result#FAIL }" "$TMP/$name.result"
    fi
done
done_testing
