# Sourced by dev/test/run_gpu_tests.sh (its row, $OUT, $LAYER, $MPIRUN), or run as
# `bash dev/test/gpu_rows_memory.sh nccl_just_fits BINARY` (test_gpu_mutations.sh's bug 17):
# the memory check against the GPU's memory as the layer counts it (docs/cuda_cpu.md,
# "Device memory"), on a zero1/ build of train_gpt2cu, d2. Layer only: the GPU's size is
# CUDA_CPU_MEMORY_MIB. Before the check each rank holds its context, cuBLAS's default
# workspace and the trainer's cuBLASLt workspace: 400 + 32 + 32 = 464 MiB (the layer's
# documented charges), so a GPU of M MiB shows M - 464 per rank free there.
#   gpu_memory_shared: 2 ranks on one GPU (CUDA_CPU_SHARED_GPU=1, staged MPI). A GPU whose
#     free bytes hold 1.5 ranks' need (the count before issue 46, one rank per GPU, fits)
#     refuses the job before it allocates: one error line, every rank exits 1 by itself;
#     one that holds the 2 ranks' need and 2 MiB trains.
#   gpu_memory_nccl: 2 ranks, a GPU each, zero1/ over NCCL: a GPU 2 MiB over the need, which
#     counts NCCL's 1 GiB of buffers (the count before did not), trains; short of them the
#     layer refuses ncclCommInitRank (test_gpu_mutations.sh's bug 17 runs nccl_just_fits).
MEM_FLAGS=(-e d2 -b 2 -t 64 -x 1 -v 0 -s 0 --allow-train-val-overlap)
MEM_CHARGES=464  # MiB per rank before the check: context 400, cuBLAS 32, cuBLASLt 32

mem_tokens() {  # mem_tokens DIR: DIR/mem_tokens.bin, 4096 tokens (the shard header of dev/data)
    [ -f "$1/mem_tokens.bin" ] || ${PY:-/usr/bin/python3} -c "
import struct, sys
n = 4096
with open(sys.argv[1], 'wb') as f:
    f.write(struct.pack('<256i', 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack('<%dH' % n, *((i * 7919) % 50257 for i in range(n))))
" "$1/mem_tokens.bin"
}

# mem_run LOG MIB BIN [env...]: 2 ranks of BIN on a GPU of MIB MiB (per rank where they do not
# share it); rank R's output in LOG.R and its exit status in LOG.rc.R, LOG both outputs (mpirun
# told not to end the job at the first rank's exit: each rank must end by itself).
mem_run() {
    local log=$1 mib=$2 bin=$3 dir
    shift 3
    dir=$(dirname "$log")
    mem_tokens "$dir" || return 1
    local data=$dir/mem_tokens.bin
    [ "${MEM_DATA:-}" = none ] && data=$dir/no_such_shard.bin  # the run ends after the check
    rm -f "$log".*
    # cuBLAS's workspace as MEM_CHARGES counts it (:4096:8, 32 MiB: the suite's, whatever the caller's)
    env CUDA_CPU_MEMORY_MIB="$mib" CUBLAS_WORKSPACE_CONFIG=:4096:8 "$@" timeout 120 "${MPIRUN[@]}" \
        --mca orte_abort_on_non_zero_status 0 -x CUDA_CPU_MEMORY_MIB -x CUBLAS_WORKSPACE_CONFIG -x CUDA_CPU_SHARED_GPU -np 2 bash -c \
        "\"\$0\" \"\$@\" >$log.\$OMPI_COMM_WORLD_RANK 2>&1; rc=\$?; echo \$rc >$log.rc.\$OMPI_COMM_WORLD_RANK; exit \$rc" \
        "$bin" "${MEM_FLAGS[@]}" -i "$data" -j "$data" >"$log" 2>&1
    cat "$log.0" "$log.1" >>"$log" 2>/dev/null
}

# mem_refused LOG: the check's error line once on each rank (the user sees rank 0's), every
# rank exited 1, nothing trained, nothing the layer refused (the check came first).
mem_refused() {
    local rcs r
    rcs="$(cat "$1.rc.0" 2>/dev/null) $(cat "$1.rc.1" 2>/dev/null)"
    grep 'error:' "$1"
    [ "$rcs" = "1 1" ] || { echo "FAIL exit codes '$rcs', not 1 on each rank"; return 1; }
    for r in 0 1; do
        [ "$(grep -c 'error:' "$1.$r")" = 1 ] &&
            grep -qE '^(\[rank 1\] )?error: .* needs about .* of GPU memory .* but cudaMemGetInfo reports' "$1.$r" ||
            { echo "FAIL rank $r: not the memory check's one error line"; return 1; }
    done
    ! grep -qE '^step|out of device memory|no device memory' "$1" || { echo "FAIL it allocated or trained"; return 1; }
    echo "PASS refused by the check, before allocating: one error line and exit 1 on each rank"
}

# mem_need LOG FREE: the per-rank need (MiB) that rank 0's "memory:" line names, and the free
# bytes it names checked against FREE (the GPU less the ranks' charges before the check).
mem_need() {
    local need free
    need=$(sed -n 's/^memory: need about \([0-9]*\) MiB per rank of GPU memory .*/\1/p' "$1")
    free=$(sed -n 's/^memory: need about .* of GPU memory .* MiB of \([0-9]*\) MiB free (cudaMemGetInfo)$/\1/p' "$1")
    [ -n "$need" ] && [ "$free" = "$2" ] || { echo "FAIL need '$need', free '$free' (expected $2)" >&2; return 1; }
    echo "$need"
}

# mem_probe LOG [env...]: the job's check on a GPU of 100000 MiB, then no data (it ends there).
mem_probe() {
    local log=$1
    shift
    MEM_DATA=none mem_run "$log" 100000 "$BIN_Z" "$@"
    mem_need "$log" $((100000 - $(grep -q SHARED_GPU=1 <<<"$*" && echo 2 || echo 1) * MEM_CHARGES))
}

# The job at a size the count before issue 46 fits and today's refuses: 2 ranks sharing a GPU
# whose free bytes hold 1.5 ranks' need.
between() {
    local log=$1 need mib
    need=$(mem_probe "${log%.out}_probe.out" CUDA_CPU_SHARED_GPU=1) || return 1
    mib=$((2 * MEM_CHARGES + need * 3 / 2))
    echo "need $need MiB per rank: a GPU of $mib MiB, $((mib - 2 * MEM_CHARGES)) MiB free for the 2 ranks"
    mem_run "$log" "$mib" "$BIN_Z" CUDA_CPU_SHARED_GPU=1
    mem_refused "$log"
}

gpu_memory_shared() {
    local need mib
    between "$OUT/mem_shared.out" || return 1
    need=$(mem_need "$OUT/mem_shared_probe.out" $((100000 - 2 * MEM_CHARGES))) || return 1
    mib=$((2 * MEM_CHARGES + 2 * need + 2))
    mem_run "$OUT/mem_fits.out" "$mib" "$BIN_Z" CUDA_CPU_SHARED_GPU=1
    mem_trains "$OUT/mem_fits.out" &&
        grep -q "^memory: need about $need MiB per rank of GPU memory .* 2 ranks on this GPU" "$OUT/mem_fits.out" &&
        echo "PASS a GPU of $mib MiB (2 x $need + 2 free): it trains"
}

# mem_trains LOG: both ranks exited 0 and step 1 ran.
mem_trains() {
    grep -E '^memory: need .* GPU|^step|error' "$1"
    [ "$(cat "$1.rc.0" "$1.rc.1" 2>/dev/null | tr -d '\n')" = 00 ] && grep -q '^step    1/1' "$1"
}

# 2 ranks, a GPU each, zero1/ over NCCL, on a GPU with 2 MiB more free than the check's need:
# it trains (with the need short of NCCL's buffers the layer refuses ncclCommInitRank).
nccl_just_fits() {
    local log=$1 need
    need=$(mem_probe "${log%.out}_probe.out") || return 1
    mem_run "$log" $((MEM_CHARGES + need + 2)) "$BIN_Z"
    mem_trains "$log" && echo "PASS a GPU of $((MEM_CHARGES + need + 2)) MiB ($need + 2 free): it trains"
}

gpu_memory_nccl() {
    nccl_just_fits "$OUT/mem_nccl_fits.out" || return 1
    grep -q 'NCCL buffers 1\.0' "$OUT/mem_nccl_fits_probe.out" && echo "PASS the need counts NCCL's 1.0 GiB"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run by itself: FUNCTION BINARY, its files in a scratch directory
    BIN_Z=$(realpath "$2")
    source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
    MEM_DIR=$(mktemp -d)
    trap 'rm -rf "$MEM_DIR"' EXIT
    "$1" "$MEM_DIR/mem_$1.out"
elif [ $LAYER = 1 ]; then
    BIN_Z=$OUT/train_gpt2cu_z_BF16
    row gpu_memory_shared gpu_memory_shared
    row gpu_memory_nccl gpu_memory_nccl
else
    skip "gpu_memory_shared, gpu_memory_nccl" "the layer's rows (a GPU's memory cannot be set)"
fi
