#!/usr/bin/env bash
# Checkpoints (-n, -y): written atomically, in model space, resumable at another DP.
#   1. same DP, same flags: resuming at step 3 reproduces the straight run's step-6
#      checkpoint byte for byte (model.bin, optimizer.bin), ZeRO-1 fp32 and bf16 storage;
#   2. other rank counts (np=1 B=4, np=4 B=1, same global batch), another bucket size, the
#      plain replicated build, and ZeRO-1 resuming a checkpoint of the plain build: the
#      step 4-6 losses match the straight run within 1e-5;
#   3. a stale temporary directory is never taken for a checkpoint; -y 1 without one, and
#      -n without -o, are clear errors.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
make -s train_gpt2 USE_ZERO1=1 >/dev/null && make -s train_gpt2_plain >/dev/null || { echo "FAIL build"; exit 1; }
$PY dev/test/gpt2_oracle.py make --out-model "$work/m.bin" --out-state "$work/s.bin" --steps 0 >/dev/null ||
    { echo "FAIL oracle"; exit 1; }
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "PASS $*"; }
bad() { failed=$((failed + 1)); echo "FAIL $*"; }

# train BIN NP B DIR [flags]: 6 steps with the data and schedule every run shares.
train() {
    local bin=$1 np=$2 b=$3 dir=$4
    shift 4
    timeout 300 "${MPIRUN[@]}" -np "$np" "$bin" -e "$work/m.bin" -i data/tinyshakespeare_train.bin -b "$b" -t 64 -x 6 \
        -v 0 -s 0 -l 1e-3 -u 2 -q 0.1 -c 0.1 -o "$dir" "$@" >"$dir.log" 2>&1
}
losses() { sed -n 's/^s:\([0-9]*\) trl:\([^ ]*\).*/\1 \2/p' "$1/main.log"; }
# close A B: the losses of steps 4..6 agree within 1e-5
close() {
    awk 'NR == FNR { a[$1] = $2; next } $1 >= 4 { n++; d = $2 - a[$1]; if (d < 0) d = -d; if (d > 1e-5) bad = 1 }
         END { exit !(n == 3 && !bad) }' <(losses "$1") <(losses "$2")
}
resume_from() {  # resume_from SRC DST: DST gets SRC's step-3 checkpoint and log
    mkdir -p "$2"
    cp -r "$1/checkpoint_00000003" "$2/"
    head -n 3 "$1/main.log" >"$2/main.log"
}

for dtype in fp32 bf16; do
    straight=$work/straight_$dtype
    train ./train_gpt2 2 2 "$straight" -z 1 --bucket-size 20000 --param-dtype $dtype -n 3 ||
        { bad "straight run ($dtype)"; tail -5 "$straight.log"; continue; }
    resumed=$work/resumed_$dtype
    resume_from "$straight" "$resumed"
    train ./train_gpt2 2 2 "$resumed" -z 1 --bucket-size 20000 --param-dtype $dtype -n 3 -y 1 ||
        { bad "resume ($dtype)"; tail -5 "$resumed.log"; continue; }
    if cmp -s "$straight/checkpoint_00000006/model.bin" "$resumed/checkpoint_00000006/model.bin" &&
       cmp -s "$straight/checkpoint_00000006/optimizer.bin" "$resumed/checkpoint_00000006/optimizer.bin" &&
       grep -q "resumed from .*checkpoint_00000003: step 3" "$resumed.log"; then
        ok "same-DP resume ($dtype params) continues bit-identically"
    else
        bad "same-DP resume ($dtype params) differs from the straight run"
    fi
done

S=$work/straight_fp32
for cfg in "./train_gpt2 1 4 -z 1" "./train_gpt2 4 1 -z 1 --bucket-size 5000" "./train_gpt2 2 2 -z 0" \
           "./train_gpt2_plain 4 1 -z 0"; do
    read -r bin np b flags <<<"$cfg"
    dir=$work/other_$((passed + failed))
    resume_from "$S" "$dir"
    # shellcheck disable=SC2086
    if train "$bin" "$np" "$b" "$dir" $flags -y 1 && close "$S" "$dir"; then
        ok "resume at np=$np B=$b ($bin $flags) matches the np=2 run within 1e-5"
    else
        bad "resume at np=$np B=$b ($bin $flags)"; tail -5 "$dir.log"; losses "$dir"
    fi
done

# ZeRO-1 resumes what the plain build saved.
plain=$work/plain
train ./train_gpt2_plain 2 2 "$plain" -z 0 -n 3 || bad "plain straight run"
dir=$work/plain_to_zero1
resume_from "$plain" "$dir"
if train ./train_gpt2 4 1 "$dir" -z 1 --bucket-size 3000 -y 1 && close "$plain" "$dir"; then
    ok "ZeRO-1 at np=4 resumes a checkpoint of the plain replicated build"
else
    bad "ZeRO-1 resuming the plain build's checkpoint"; tail -5 "$dir.log"
fi

# A half-written checkpoint (the temporary name) is ignored; the complete one is used.
dir=$work/stale
resume_from "$S" "$dir"
mkdir -p "$dir/.checkpoint_00000005.tmp" && echo partial >"$dir/.checkpoint_00000005.tmp/model.bin"
if train ./train_gpt2 2 2 "$dir" -z 1 -y 1 && grep -q "checkpoint_00000003: step 3" "$dir.log"; then
    ok "a stale temporary checkpoint directory is ignored"
else
    bad "stale temporary checkpoint"; tail -5 "$dir.log"
fi

# Errors: one message, non-zero exit.
mkdir -p "$work/empty"
train ./train_gpt2 2 2 "$work/empty" -y 1
rc=$?
if [ $rc -ne 0 ] && [ "$(grep -c "error: -y 1: no checkpoint in" "$work/empty.log")" = 1 ]; then
    ok "-y 1 without a checkpoint is one clear error"
else
    bad "-y 1 without a checkpoint (rc=$rc)"; tail -5 "$work/empty.log"
fi
timeout 60 ./train_gpt2 -e "$work/m.bin" -t 64 -n 3 -x 1 >"$work/noout.log" 2>&1
if [ $? -ne 0 ] && grep -q "error: checkpoints (-n, -y) live in the output directory" "$work/noout.log"; then
    ok "-n without -o is a clear error"
else
    bad "-n without -o"; cat "$work/noout.log"
fi

echo "test_checkpoint: $passed passed, $failed failed"
[ $failed = 0 ]
