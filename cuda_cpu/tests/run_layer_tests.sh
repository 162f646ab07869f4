#!/usr/bin/env bash
# The CPU execution layer's own tests (make -C cuda_cpu test; the project's make test runs
# this too): builds them (make tests in the layer's folder), then runs
#   test_layer  kernels (barriers, warp collectives, faults, blocks in parallel), launch
#               checks, memory, streams and events, in every thread order (forward, reverse,
#               random) and execution mode (async, eager, lazy), and under CUDA_CPU_PROTECT=1
#   test_blas   cuBLAS and cuBLASLt on hand-worked examples and the documented errors, and
#               the heuristic's answers under each CUDA_CPU_BLASLT_HEURISTIC
#   test_nccl   NCCL at 2, 3 and 4 ranks, its rules and its failures (test_nccl.sh)
#   test_tools  the sanitizer and profiler (CUDA_CPU_CHECK=race, CUDA_CPU_PROFILE) on hand-worked
#               cases; and a build without CUDA_CPU_TOOLS=1 refusing them with the fix
#   test_memcheck  memcheck (CUDA_CPU_CHECK=memcheck) on hand-worked faults: out of bounds,
#               misaligned, host code (C++ and C) touching device memory
#   test_boundary  memcheck at the MPI boundary (a device buffer handed to MPI) and the
#               pageable copies' switches (CUDA_CPU_PAGEABLE_D2H, CUDA_CPU_PAGEABLE_H2D)
#   test_numerics  GPU numerics (a CUDA_CPU_NUMERICS=gpu build) on hand-worked values; and a
#               run asking for the numerics its program was not built with refused
#   test_device_memory  the GPU's memory as its driver counts it (the cap, the 2 MiB
#               granularity, the context, cuBLAS's workspace, a GPU shared by processes)
#   test_tensorcore  GPU numerics' tensor-core model (WMMA, cuBLAS BF16, split-K) on
#               hand-worked values and a reference of its rule, under three settings
# and checks the layer's version line, and that the layer builds and runs from a copy of its
# folder alone. Prints TAP (tap.sh).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/tap.sh"
source tests/pkeys.sh
# Without CUDA headers (no toolkit, and no PyPI wheels to take them from) nothing here can build.
if ! bash cuda_headers.sh >/dev/null; then
    skip_all "no CUDA headers (no toolkit, and the PyPI wheels could not be had): the GPU code cannot be built"
fi
run() {  # run NAME COMMAND...: one check, the run's own checks counted (its TAP ok lines)
    local name=$1 log
    shift
    log=$(mktemp)
    if "$@" >"$log" 2>&1; then
        ok "$name ($(grep -E '^(PASS |ok [0-9]+ - )' "$log" | grep -vc ' # SKIP ') checks)"
        grep 'SKIPPED' "$log" | sed 's/^/    /'
    else
        not_ok "$name" "$log"
        diag "$(grep -E '^(not ok|# rank [0-9]+: not ok)' "$log" | head -n 20)"
    fi
    rm -f "$log"
}
run build make -s tests
version_line() {  # VERSION holds "cuda_cpu X.Y.Z"; nvcc --version prints it; the README states it
    local v
    v=$(cat VERSION)
    [[ $v =~ ^cuda_cpu\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "FAIL VERSION holds '$v', not 'cuda_cpu X.Y.Z'"; return 1; }
    [ "$(./nvcc --version)" = "$v" ] || { echo "FAIL nvcc --version prints '$(./nvcc --version)'"; return 1; }
    echo "PASS nvcc --version prints VERSION, $v"
    grep -qF "\`$v\`" README.md || { echo "FAIL README.md does not state $v"; return 1; }
    echo "PASS README.md states it"
}
run "version line" version_line
# The layer alone: a copy of its folder and nothing else of the project builds the library
# (make's default goal) and the tests, which run there. From outside it needs only what
# README.md lists (g++, python3, OpenBLAS, MPI, the CUDA headers).
alone() {
    local dir rc=0
    dir=$(mktemp -d /tmp/cuda_cpu_alone.XXXXXX)
    cp -rp "$LAYER" "$dir/cuda_cpu" && make -s -C "$dir/cuda_cpu" && make -s -C "$dir/cuda_cpu" tests &&
        [ -f "$dir/build/cuda_cpu/libcuda_cpu.a" ] && echo "PASS make -C cuda_cpu: $dir/build/cuda_cpu/libcuda_cpu.a" &&
        "$dir/build/cuda_cpu/tests/test_blas" && "$dir/build/cuda_cpu/tests/test_layer" || rc=1
    rm -rf "$dir"
    return $rc
}
run "the layer alone: built and tested in a copy of its folder" alone
for order in forward reverse random; do
    run "test_layer order=$order" env CUDA_CPU_ORDER=$order "$TB/test_layer"
done
for exec in eager lazy; do
    run "test_layer exec=$exec" env CUDA_CPU_EXEC=$exec CUDA_CPU_ORDER=random "$TB/test_layer"
done
if pkeys_available; then
    run "test_layer protect" env CUDA_CPU_PROTECT=1 "$TB/test_layer"
else
    skip "test_layer protect, test_blas protect (CUDA_CPU_PROTECT=1)" "$PKEYS_SKIPPED"
fi
run test_blas "$TB/test_blas"
# CUDA_CPU_BLASLT_HEURISTIC: each value's answers; random's the same in another process, and
# others under another CUDA_CPU_SEED; a value it does not know is refused.
heuristic_modes() {
    local m a b c out
    for m in documented none random all; do
        CUDA_CPU_BLASLT_HEURISTIC=$m "$TB/test_blas" heuristic $m || return 1
    done
    a=$(CUDA_CPU_BLASLT_HEURISTIC=random "$TB/test_blas" heuristic random 2>/dev/null | grep '^random answers')
    b=$(CUDA_CPU_BLASLT_HEURISTIC=random "$TB/test_blas" heuristic random 2>/dev/null | grep '^random answers')
    c=$(CUDA_CPU_SEED=2 CUDA_CPU_BLASLT_HEURISTIC=random "$TB/test_blas" heuristic random 2>/dev/null |
        grep '^random answers')
    echo "seed 1: $a; again: $b; seed 2: $c"
    [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ] || return 1
    echo "PASS random: the same answers in another process, others under CUDA_CPU_SEED=2"
    out=$(CUDA_CPU_BLASLT_HEURISTIC=bogus "$TB/test_blas" heuristic bogus 2>&1) && return 1
    grep -q "^error: cuda_cpu: CUDA_CPU_BLASLT_HEURISTIC=bogus: use one of documented none random all" <<<"$out" &&
        echo "PASS CUDA_CPU_BLASLT_HEURISTIC=bogus refused"
}
run "test_blas CUDA_CPU_BLASLT_HEURISTIC" heuristic_modes
pkeys_available && run "test_blas protect" env CUDA_CPU_PROTECT=1 CUDA_CPU_EXEC=lazy "$TB/test_blas"
run test_nccl bash tests/test_nccl.sh "$TB/test_nccl"
run test_tools "$TB/test_tools"
run test_memcheck "$TB/test_memcheck"
run test_boundary "$TB/test_boundary"
run test_numerics "$TB/test_numerics"
# The tensor-core model: the H100's settings (the default), the A100's, and off (the layer before).
run "test_tensorcore h100" "$TB/test_tensorcore" h100
run "test_tensorcore a100" env CUDA_CPU_TC_GROUP=8 CUDA_CPU_TC_EXTRA_BITS=1 "$TB/test_tensorcore" a100
run "test_tensorcore exact" env CUDA_CPU_TC_GROUP=0 "$TB/test_tensorcore" exact
run test_device_memory "$TB/test_device_memory"
numerics_refused() {  # CUDA_CPU_NUMERICS naming what the program was not built with: one error with the fix
    local v bin out
    for v in gpu:"$TB/test_layer" ieee:"$TB/test_numerics"; do
        bin=${v#*:} v=${v%%:*}
        out=$(CUDA_CPU_NUMERICS=$v "$bin" 2>&1) && { echo "FAIL CUDA_CPU_NUMERICS=$v $bin: ran"; return 1; }
        grep -q "^error: cuda_cpu: CUDA_CPU_NUMERICS=$v, but this program was built with .* numerics: rebuild with make" \
            <<<"$out" || { echo "FAIL CUDA_CPU_NUMERICS=$v $bin: $out" | head -n 3; return 1; }
        echo "PASS CUDA_CPU_NUMERICS=$v refused by $bin with the fix"
    done
}
run "numerics refused where not built" numerics_refused
tools_refused() {  # CUDA_CPU_CHECK / CUDA_CPU_PROFILE in a build without the tools: one error with the fix
    local v out
    for v in CUDA_CPU_CHECK=race CUDA_CPU_CHECK=memcheck CUDA_CPU_PROFILE=/dev/null; do
        out=$(env "$v" "$TB/test_layer" 2>&1) && { echo "FAIL $v: ran"; return 1; }
        grep -q "^error: cuda_cpu: .* needs the layer's tools in the build: rebuild with make ... CUDA_ON_CPU=1 CUDA_CPU_TOOLS=1" \
            <<<"$out" || { echo "FAIL $v: $out" | head -n 3; return 1; }
        echo "PASS $v refused with the fix"
    done
}
run "tools refused without CUDA_CPU_TOOLS=1" tools_refused
done_testing
