#!/usr/bin/env bash
# test: timeout=120 lane=alone tier=full
# The Makefile's build stamps (.build-*.stamp): a build is redone when
# its variables change, and only then. In a copy of the sources, with a stand-in compiler
# that only creates its -o file (what is tested is make's decisions, not compilation):
#   1. the README's sequence: `make train_gpt2 USE_ZERO1=1`, `make data`, then the trainer is
#      up to date (`make -q`): a goal that does not build from a stamp leaves it alone, and
#      no GPU stamp was written by CPU-only goals;
#   2. switching USE_ZERO1, or the compiler, makes the trainer out of date: train_gpt2.c
#      recompiled without -DUSE_ZERO1 and relinked without zero1/ after the switch; switching
#      TEST_SEAMS relinks it with or without dev/test/seams.c and compiles nothing; repeating
#      a build does not;
#   3. the GPU trainer likewise: PRECISION switches, a repeat is up to date.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

bash scripts/copy_sources.sh "$TMP/src" || fatal "copy the sources"
cd "$TMP/src" || fatal "cd to the copy"
for cc in fakecc fakecc2; do  # records its command line, creates its -o file
    printf '#!/usr/bin/env bash\necho "$0 $*" >>%s/compiles\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && : >"$2"; shift; done\n' \
        "$TMP" >"$TMP/$cc"
    chmod +x "$TMP/$cc"
done
CC1=$TMP/fakecc CC2=$TMP/fakecc2
compiles() { wc -l <"$TMP/compiles" 2>/dev/null || echo 0; }
up_to_date() {  # up_to_date LABEL make-args...: make -q says the goal needs nothing
    if make -q "${@:2}" >/dev/null 2>&1; then ok "$1: up to date"; else not_ok "$1: make -q ${*:2} wants a rebuild"; fi
}
out_of_date() {
    if make -q "${@:2}" >/dev/null 2>&1; then not_ok "$1: make -q ${*:2} says up to date"; else ok "$1: out of date"; fi
}

# ---- 1. the README's sequence -------------------------------------------------------------
make train_gpt2 USE_ZERO1=1 CC="$CC1" >"$TMP/build1.log" 2>&1 || not_ok "make train_gpt2 USE_ZERO1=1: $(tail -3 "$TMP/build1.log")"
stamp_before=$(stat -c %Y.%s .build-cpu.stamp 2>/dev/null)
sleep 1  # a rewrite would show in the stamp's mtime
make data >"$TMP/data.log" 2>&1 || not_ok "make data: $(tail -3 "$TMP/data.log")"
make -q zero1_plan >/dev/null 2>&1  # parsing alone used to rewrite the stamp
[ "$(stat -c %Y.%s .build-cpu.stamp 2>/dev/null)" = "$stamp_before" ] && ok "make data, make zero1_plan: the CPU stamp untouched" ||
    not_ok "make data or make zero1_plan rewrote .build-cpu.stamp ($(cat .build-cpu.stamp))"
up_to_date "train_gpt2 USE_ZERO1=1 after make data" train_gpt2 USE_ZERO1=1 CC="$CC1"
[ ! -e .build-gpu.stamp ] && ok "no GPU stamp from CPU goals" || not_ok "CPU goals wrote .build-gpu.stamp"

# ---- 2. switches rebuild, repeats do not ---------------------------------------------------
out_of_date "USE_ZERO1=1 -> 0" train_gpt2 CC="$CC1"
n=$(compiles)
make train_gpt2 CC="$CC1" >/dev/null 2>&1
since() { tail -n +$(($1 + 1)) "$TMP/compiles"; }  # the compiler's lines since the count $1
if since "$n" | grep -q -- '-c train_gpt2.c' && ! since "$n" | grep -- '-c train_gpt2.c' | grep -q -- -DUSE_ZERO1 &&
   since "$n" | tail -n 1 | grep -q -- '-o train_gpt2 ' && ! since "$n" | tail -n 1 | grep -q 'build/cpu/zero1/'; then
    ok "the switch recompiled train_gpt2.c without -DUSE_ZERO1 and relinked train_gpt2 without zero1/"
else
    not_ok "the switch to USE_ZERO1=0 did not rebuild train_gpt2 plainly: $(since "$n" | tr '\n' '|')"
fi
up_to_date "train_gpt2 repeated" train_gpt2 CC="$CC1"
n=$(compiles)
make train_gpt2 CC="$CC1" TEST_SEAMS=0 >/dev/null 2>&1
if [ "$(compiles)" = $((n + 1)) ] && ! since "$n" | grep -q seams.o; then
    ok "TEST_SEAMS 1 -> 0: train_gpt2 relinked without dev/test/seams.c, nothing compiled"
else
    not_ok "TEST_SEAMS 1 -> 0: $(since "$n" | tr '\n' '|')"
fi
make train_gpt2 CC="$CC1" TEST_SEAMS=1 >/dev/null 2>&1  # back to this test's build (test_lib.sh exports it)
out_of_date "another compiler" train_gpt2 CC="$CC2"

# ---- 3. the GPU trainer's stamp -------------------------------------------------------------
GPU=(train_gpt2cu NVCC="$CC1" MPI_NVCC_CFLAGS= check_mpi_flags=)
if make "${GPU[@]}" PRECISION=BF16 >"$TMP/gpu.log" 2>&1; then
    up_to_date "train_gpt2cu repeated" "${GPU[@]}" PRECISION=BF16
    out_of_date "PRECISION=BF16 -> FP32" "${GPU[@]}" PRECISION=FP32
    up_to_date "train_gpt2 after the GPU build" train_gpt2 CC="$CC1"
else
    not_ok "make train_gpt2cu with a stand-in nvcc: $(tail -3 "$TMP/gpu.log")"
fi

done_testing
