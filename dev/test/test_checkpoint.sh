#!/usr/bin/env bash
# test: timeout=420 lane=cpu tier=fast,full
# Checkpoints (-n, -y): written atomically, in model space, resumable at another DP.
#   1. same DP, same flags: resuming at step 3 reproduces the straight run's step-6
#      checkpoint byte for byte (model.bin, optimizer.bin), ZeRO-1 fp32 and bf16 storage
#      (also with --stochastic-rounding);
#      So do gradient accumulation and -a 1; main.log then holds every step once (the
#      entries the resumed run repeats are dropped). A resume that changes the tokens per
#      step, -t, -a, the schedule or AdamW's settings is refused with the saved and the new
#      values (nothing written), unless --allow-resume-change;
#   2. other rank counts (np=1 B=4, np=4 B=1, same global batch), another bucket size, the
#      plain replicated build, 2 distributed-optimizer instances, and ZeRO-1 resuming a
#      checkpoint of the plain build: the step 4-6 losses match the straight run within
#      1e-5; with instances, a same-flags resume is also bit-identical;
#   3. the train data: another corpus of the same size is refused unless
#      --allow-corpus-change, a copy of the same one elsewhere resumes, and so does a
#      checkpoint that predates the record; a stale temporary directory is never taken for a
#      checkpoint; -n without -o is a clear error;
#   4. the life cycle of a requeued job: -y 1 before the first checkpoint starts from step
#      0 (== the straight run) and the first save removes a stale temporary; -nk 2 keeps
#      the newest two (symlinks unlinked, never followed; foreign files kept); a kill -9
#      in the middle of a save resumes from the checkpoint before it; kill -9 of a whole
#      2-rank job at random moments, four times in a row, and the same command line each
#      time: the finished run equals an uninterrupted one bitwise; resuming a run that is
#      already at -x exits 0 on every rank. (Damaged checkpoints: test_files.sh; the
#      sharded I/O itself: test_checkpoint_io.sh.)
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
# The fast tier: the fp32 same-DP resume and the resume at np=4 only.
fast_rows "same-DP resume (fp32 params)" "resume at np=4 B=1 (./train_gpt2 -z 1 --bucket-size 5000)"
make -s train_gpt2 USE_ZERO1=1 >/dev/null && make -s train_gpt2_plain >/dev/null || fatal "build"
$PY dev/test/gpt2_oracle.py make --out-model "$TMP/m.bin" --out-state "$TMP/s.bin" --steps 0 >/dev/null ||
    fatal "oracle"

# train BIN NP B DIR [flags]: 6 steps with the data and schedule every run shares.
COMMON=(-e "$TMP/m.bin" -i data/tinyshakespeare_train.bin -t 64 -x 6 -v 0 -s 0 -l 1e-3 -u 2 -q 0.1 -c 0.1)
train() {
    local bin=$1 np=$2 b=$3 dir=$4
    shift 4
    timeout 300 "${MPIRUN[@]}" -np "$np" "$bin" "${COMMON[@]}" -b "$b" -o "$dir" "$@" >"$dir.log" 2>&1
}
same_checkpoint() {  # same_checkpoint A B: model and optimizer state byte for byte
    cmp -s "$1/model.bin" "$2/model.bin" && cmp -s "$1/optimizer.bin" "$2/optimizer.bin"
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

# With --stochastic-rounding the resume rebuilds the bf16 params from the master with step
# 3's bits, as the straight run's step 3 wrote them back (round to nearest there would
# change step 4's forward, and so the step-6 master).
VARIANTS=(fp32 bf16 "bf16 --stochastic-rounding")
for variant in "${VARIANTS[@]}"; do
    selected "same-DP resume ($variant params)" || continue
    read -r dtype extra <<<"$variant"
    name=$dtype${extra:+-sr}
    straight=$TMP/straight_$name
    # shellcheck disable=SC2086  # $extra: a flag or nothing
    train ./train_gpt2 2 2 "$straight" -z 1 --bucket-size 20000 --param-dtype $dtype $extra -n 3 ||
        { not_ok "straight run ($variant)"; tail -5 "$straight.log"; continue; }
    resumed=$TMP/resumed_$name
    resume_from "$straight" "$resumed"
    # shellcheck disable=SC2086
    train ./train_gpt2 2 2 "$resumed" -z 1 --bucket-size 20000 --param-dtype $dtype $extra -n 3 -y 1 ||
        { not_ok "resume ($variant)"; tail -5 "$resumed.log"; continue; }
    if same_checkpoint "$straight/checkpoint_00000006" "$resumed/checkpoint_00000006" &&
       grep -q "resumed from .*checkpoint_00000003: step 3" "$resumed.log"; then
        ok "same-DP resume ($variant params) continues bit-identically"
    else
        not_ok "same-DP resume ($variant params) differs from the straight run"
    fi
done

# Other rank counts and builds resume the fp32 run's step-3 checkpoint.
S=$TMP/straight_fp32
OTHER_RUNS=("./train_gpt2 1 4 -z 1" "./train_gpt2 4 1 -z 1 --bucket-size 5000" "./train_gpt2 2 2 -z 0"
            "./train_gpt2_plain 4 1 -z 0" "./train_gpt2 4 1 -z 1 --bucket-size 5000 --dist-opt-instances 2")
for cfg in "${OTHER_RUNS[@]}"; do
    read -r bin np b flags <<<"$cfg"
    selected "resume at np=$np B=$b ($bin $flags)" || continue
    dir=$TMP/other_$TEST_COUNT
    resume_from "$S" "$dir"
    # shellcheck disable=SC2086
    if train "$bin" "$np" "$b" "$dir" $flags -y 1 && close "$S" "$dir"; then
        ok "resume at np=$np B=$b ($bin $flags) matches the np=2 run within 1e-5"
    else
        not_ok "resume at np=$np B=$b ($bin $flags)"; diag "$(tail -5 "$dir.log"; losses "$dir")"
    fi
done

# Every mode that changes which data a step reads resumes exactly: gradient accumulation
# (-d: 2 micro-steps) and -a 1 (the run's first batch every step, a resumed run's too). The
# resumed directory gets the straight run's whole main.log, as a job killed after its last
# step leaves it: after the resume every step appears once, with the straight run's values.
log_values() { sed -E 's/ ms:.*//; / busy_ms:/d' "$1/main.log"; }   # main.log without the timings
exact_resume() {  # exact_resume NAME FLAGS...
    local name=$1 straight=$TMP/straight_$1 resumed=$TMP/resumed_$1
    shift
    selected "same-DP resume ($name)" || return 0
    if ! train ./train_gpt2 2 2 "$straight" -z 1 --bucket-size 20000 -n 3 "$@"; then
        not_ok "straight run ($name)" "$straight.log"; return
    fi
    mkdir -p "$resumed"
    cp -r "$straight/checkpoint_00000003" "$resumed/"
    cp "$straight/main.log" "$resumed/"
    if train ./train_gpt2 2 2 "$resumed" -z 1 --bucket-size 20000 -n 3 "$@" -y 1 &&
       same_checkpoint "$straight/checkpoint_00000006" "$resumed/checkpoint_00000006" &&
       grep -q "^main.log: dropped 3 entries after step 3, which this resumed run repeats$" "$resumed.log" &&
       [ "$(log_values "$resumed")" = "$(log_values "$straight")" ] && [ "$(losses "$resumed" | wc -l)" = 6 ]; then
        ok "same-DP resume ($name) continues bit-identically; main.log has each step once, as the straight run's"
    else
        not_ok "resume ($name) differs from the straight run" "$resumed.log"
        diag "$(diff <(log_values "$straight") <(log_values "$resumed") | head -5)"
    fi
}
exact_resume accumulation -d 512
exact_resume overfit -a 1

# A resume that changes what a step means is refused with the saved and the new values,
# touching nothing, unless --allow-resume-change says it is meant. (Another rank count
# or -b with the same tokens per step is a legitimate resume: the loops below.)
refused() {  # refused NAME WANT NP B FLAGS...: one error naming the change, nothing written
    local name=$1 want=$2 np=$3 b=$4 dir=$TMP/refused_$1
    shift 4
    selected "resume with $name" || return 0
    resume_from "$TMP/straight_fp32" "$dir"
    local before
    before=$(cd "$dir" && find . -type f | sort | xargs md5sum)
    train ./train_gpt2 "$np" "$b" "$dir" -z 1 "$@" -y 1
    local rc=$? msg
    msg=$(grep "error:" "$dir.log")
    if [ $rc -ne 0 ] && [ "$(grep -c "error:" "$dir.log")" = 1 ] && [[ $msg == *"(saved -> now: $want)"* ]] &&
       [[ $msg == *"--allow-resume-change"* ]] && [ "$(cd "$dir" && find . -type f ! -name .lock | sort | xargs md5sum)" = "$before" ]; then
        ok "resume with $name is refused: $want"
    else
        not_ok "resume with $name: exit $rc, expected one error naming '$want' and no file changed"; diag "$(tail -3 "$dir.log")"
    fi
}
refused global_batch "tokens per step (ranks x B x T x accumulation) 256 -> 512" 2 4
refused seq_len "-t 64 -> 32" 2 4 -t 32
refused overfit "-a 0 -> 1" 2 2 -a 1
refused schedule "-l 0.001 -> 0.0003, -x 6 -> 8" 2 2 -l 3e-4 -x 8
refused adamw "-c 0.1 -> 0, --beta2 0.95 -> 0.99" 2 2 -c 0 --beta2 0.99
if selected allow_resume_change; then
    dir=$TMP/allowed_change
    resume_from "$TMP/straight_fp32" "$dir"
    if train ./train_gpt2 2 2 "$dir" -z 1 -l 3e-4 -y 1 --allow-resume-change &&
       grep -q "^resume: --allow-resume-change: continuing .* (saved -> now: -l 0.001 -> 0.0003)$" "$dir.log" &&
       [ "$(losses "$dir" | wc -l)" = 6 ]; then
        ok "--allow-resume-change continues with a new -l, saying so"
    else
        not_ok "--allow-resume-change"; diag "$(tail -5 "$dir.log")"
    fi
fi

# The train data: the checkpoint records its corpus (tinyshakespeare's manifest: its shard's
# size and CRC32C). Another shard of the same size (one token changed) is refused, touching
# nothing, unless --allow-corpus-change; the same shard copied elsewhere without its
# manifest resumes; so does a checkpoint that predates the record (its fields taken out),
# saying the data was not checked.
if selected corpus_other corpus_copy corpus_unrecorded; then
    mkdir -p "$TMP/data_copy" "$TMP/data_other"
    cp data/tinyshakespeare_train.bin "$TMP/data_copy/shard.bin"
    cp data/tinyshakespeare_train.bin "$TMP/data_other/shard.bin"
    printf '\x07\x00' | dd of="$TMP/data_other/shard.bin" bs=1 seek=$((1024 + 2 * 5000)) conv=notrunc status=none
    # The saved digest, by its definition (run/data_identity.h): FNV-1a 64 over each shard's
    # bytes (uint64) and CRC32C (uint32), little-endian, from the manifest.
    digest=$($PY -c 'import struct, sys
h = 1469598103934665603
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "shard" and f[1] == "train":
        for b in struct.pack("<QI", int(f[3]), int(f[4], 16)):
            h = ((h ^ b) * 1099511628211) % 2**64
print(h)' data/tinyshakespeare_manifest.txt)
fi
if selected corpus_other; then
    dir=$TMP/corpus_other
    resume_from "$TMP/straight_fp32" "$dir"
    before=$(cd "$dir" && find . -type f | sort | xargs md5sum)
    train ./train_gpt2 2 2 "$dir" -z 1 -y 1 -i "$TMP/data_other/shard.bin"
    rc=$? msg=$(grep "error:" "$dir.log")
    if [ $rc -ne 0 ] && [ "$(grep -c "error:" "$dir.log")" = 1 ] &&
       [[ $msg == *"checkpoint_00000003 was trained on other data (corpus 'tinyshakespeare', 1 shard, digest $digest) than -i '$TMP/data_other/shard.bin' holds now (shards without a manifest, 1 shard, digest "*"--allow-corpus-change"* ]] &&
       [ "$(cd "$dir" && find . -type f ! -name .lock | sort | xargs md5sum)" = "$before" ]; then
        ok "resume on another corpus of the same size is refused, naming both, nothing written"
    else
        not_ok "resume on another corpus: exit $rc"; diag "$(tail -3 "$dir.log")"
    fi
    if train ./train_gpt2 2 2 "$dir" -z 1 -y 1 -i "$TMP/data_other/shard.bin" --allow-corpus-change &&
       grep -q "^resume: --allow-corpus-change: continuing .*checkpoint_00000003 on other data (shards without a manifest, 1 shard, digest [0-9]*; it was trained on corpus 'tinyshakespeare', 1 shard, digest $digest)$" "$dir.log" &&
       [ "$(losses "$dir" | wc -l)" = 6 ]; then
        ok "--allow-corpus-change continues on the other corpus, saying so"
    else
        not_ok "--allow-corpus-change"; diag "$(tail -5 "$dir.log")"
    fi
fi
if selected corpus_copy; then
    dir=$TMP/corpus_copy
    resume_from "$TMP/straight_fp32" "$dir"
    if train ./train_gpt2 2 2 "$dir" -z 1 --bucket-size 20000 --param-dtype fp32 -n 3 -y 1 -i "$TMP/data_copy/shard.bin" &&
       ! grep -q "other data" "$dir.log" &&
       same_checkpoint "$TMP/straight_fp32/checkpoint_00000006" "$dir/checkpoint_00000006"; then
        ok "the same shard copied elsewhere, without its manifest: the same corpus, the resume equals the straight run"
    else
        not_ok "resume on a copy of the corpus"; diag "$(tail -5 "$dir.log")"
    fi
fi
if selected corpus_unrecorded; then
    dir=$TMP/corpus_unrecorded
    resume_from "$TMP/straight_fp32" "$dir"
    ck=$dir/checkpoint_00000003
    sed -i '/^train_corpus \|^train_shards \|^train_digest \|^nonfinite_in_a_row \|^spike_/d' "$ck/state.txt"
    make -s test_crc32c >/dev/null && ./test_crc32c "$ck/model.bin" "$ck/optimizer.bin" "$ck/state.txt" |
        awk '{ n = split($3, part, "/"); print part[n], $2, $1 }' >"$ck/manifest.txt"
    if train ./train_gpt2 2 2 "$dir" -z 1 -y 1 -i "$TMP/data_other/shard.bin" &&
       grep -q "^resume: $ck predates the record of its train data; the data was not checked$" "$dir.log" &&
       [ "$(losses "$dir" | wc -l)" = 6 ]; then
        ok "a checkpoint without the record (an earlier version) resumes, saying the data was not checked"
    else
        not_ok "a checkpoint without the record"; diag "$(tail -5 "$dir.log")"
    fi
fi

# Distributed-optimizer instances (np=4 as 2 groups of 2): group 0 saves and loads the
# pieces, the other group gets the loaded state across the instances.
if selected instances; then
    inst=$TMP/straight_inst
    if train ./train_gpt2 4 1 "$inst" -z 1 --bucket-size 20000 --dist-opt-instances 2 -n 3; then
        resumed=$TMP/resumed_inst
        resume_from "$inst" "$resumed"
        if train ./train_gpt2 4 1 "$resumed" -z 1 --bucket-size 20000 --dist-opt-instances 2 -n 3 -y 1 &&
           same_checkpoint "$inst/checkpoint_00000006" "$resumed/checkpoint_00000006" &&
           grep -q "parameters identical on all 4 ranks: yes" "$resumed.log"; then
            ok "same-flags resume with 2 distributed-optimizer instances continues bit-identically"
        else
            not_ok "resume with 2 distributed-optimizer instances differs from the straight run"; diag "$(tail -5 "$resumed.log")"
        fi
    else
        not_ok "straight run with 2 distributed-optimizer instances"; diag "$(tail -5 "$inst.log")"
    fi
fi

# ZeRO-1 resumes what the plain build saved.
if selected plain_to_zero1; then
    plain=$TMP/plain
    train ./train_gpt2_plain 2 2 "$plain" -z 0 -n 3 || not_ok "plain straight run"
    dir=$TMP/plain_to_zero1
    resume_from "$plain" "$dir"
    if train ./train_gpt2 4 1 "$dir" -z 1 --bucket-size 3000 -y 1 && close "$plain" "$dir"; then
        ok "ZeRO-1 at np=4 resumes a checkpoint of the plain replicated build"
    else
        not_ok "ZeRO-1 resuming the plain build's checkpoint"; diag "$(tail -5 "$dir.log")"
    fi
fi

# A temporary directory is never taken for a checkpoint, not even one whose files are all
# there (killed between the last write and the rename): the complete one is used.
if selected stale_temporary; then
    dir=$TMP/stale
    resume_from "$S" "$dir"
    cp -r "$S/checkpoint_00000006" "$dir/.checkpoint_00000006.tmp"
    if train ./train_gpt2 2 2 "$dir" -z 1 -y 1 && grep -q "checkpoint_00000003: step 3" "$dir.log"; then
        ok "a temporary checkpoint directory is ignored, even with all its files"
    else
        not_ok "stale temporary checkpoint"; diag "$(tail -5 "$dir.log")"
    fi
fi

# -y 1 before any checkpoint exists starts from step 0 and is the straight run (the same
# step-6 checkpoint, byte for byte); the first save removes a stale temporary directory,
# MPI-IO's side files included.
if selected fresh; then
    dir=$TMP/fresh
    mkdir -p "$dir/.checkpoint_00000004.tmp" && echo partial >"$dir/.checkpoint_00000004.tmp/model.bin" &&
        : >"$dir/.checkpoint_00000004.tmp/model.bin.locktest.0"  # what Open MPI's MPI-IO leaves if killed in open
    if train ./train_gpt2 2 2 "$dir" -z 1 --bucket-size 20000 -n 3 -y 1 &&
       [ "$(grep -c "^resume: no checkpoint in $dir yet; starting from step 0$" "$dir.log")" = 1 ] &&
       grep -q "removed $dir/.checkpoint_00000004.tmp, left by an interrupted save" "$dir.log" &&
       [ ! -e "$dir/.checkpoint_00000004.tmp" ] && same_checkpoint "$S/checkpoint_00000006" "$dir/checkpoint_00000006"; then
        ok "-y 1 with no checkpoint yet starts from step 0 (== the straight run) and removes a stale temporary"
    else
        not_ok "-y 1 with no checkpoint yet"; diag "$(tail -5 "$dir.log"; ls -a "$dir")"
    fi
fi

# -nk 2 keeps this run's newest two. Among the older ones, a symlink is removed without
# touching what it points to, and a directory holding a file of someone else's is kept.
if selected keep; then
    dir=$TMP/keep
    resume_from "$S" "$dir"
    mkdir -p "$TMP/outside" "$dir/checkpoint_00000002"
    cp "$S/checkpoint_00000003/"* "$TMP/outside/" && ln -s "$TMP/outside" "$dir/checkpoint_00000001"
    cp "$S/checkpoint_00000003/"* "$dir/checkpoint_00000002/" && echo mine >"$dir/checkpoint_00000002/notes.txt"
    if train ./train_gpt2 2 2 "$dir" -z 1 --bucket-size 20000 -n 1 -nk 2 -y 1 &&
       [ "$(cd "$dir" && echo checkpoint_*)" = "checkpoint_00000002 checkpoint_00000005 checkpoint_00000006" ] &&
       [ "$(ls "$TMP/outside" | wc -l)" = 4 ] && [ -f "$dir/checkpoint_00000002/notes.txt" ] &&
       grep -q "not removing $dir/checkpoint_00000002: it holds 'notes.txt'" "$dir.log" &&
       same_checkpoint "$S/checkpoint_00000006" "$dir/checkpoint_00000006"; then
        ok "-nk 2 leaves the newest 2; a symlink is unlinked, not followed; foreign files are kept"
    else
        not_ok "-nk 2"; diag "$(tail -5 "$dir.log"; ls -la "$dir" "$TMP/outside")"
    fi
fi

# kill -9 in the middle of a save (the job stopped in the save of step 3, its temporary
# directory written to: LLMC_TEST_STOP=save, dev/test/seams.c): the checkpoints before it
# stay whole, and the same command line resumes from the newest of them and finishes.
if selected kill_in_save; then
    dir=$TMP/killed
    mkdir -p "$dir"
    KILL_RUN=(./train_gpt2 "${COMMON[@]}" -b 4 -x 4 -n 1 -o "$dir")
    LLMC_TEST_STOP=save:0:3 "${KILL_RUN[@]}" >"$dir.log" 2>&1 &
    pid=$! caught=""
    if wait_stopped "$dir.log" 1 >/dev/null && [ -d "$dir/.checkpoint_00000003.tmp" ]; then caught=$dir/.checkpoint_00000003.tmp; fi
    kill -KILL $pid 2>/dev/null
    wait $pid 2>/dev/null
    if [ -z "$caught" ]; then
        not_ok "kill -9 during a save: no save was caught in progress"; diag "$(tail -5 "$dir.log")"
    else
        step=${caught##*_} && step=$((10#${step%.tmp})) && prev=$((step - 1))
        if timeout 120 "${KILL_RUN[@]}" -y 1 >"$dir.resume.log" 2>&1 &&
           grep -q "resumed from $dir/checkpoint_0*$prev: step $prev " "$dir.resume.log" &&
           grep -q "removed $caught, left by an interrupted save" "$dir.resume.log" && [ -d "$dir/checkpoint_00000004" ]; then
            ok "kill -9 while saving step $step: resumed from step $prev, the temporary removed, the run finished"
        else
            not_ok "resume after kill -9 while saving step $step"; diag "$(tail -5 "$dir.resume.log")"
        fi
    fi
fi

# kill -9 at random moments, several times in a row, of a 2-rank job that checkpoints
# every step: all its processes at once (mpirun and the ranks, as a scheduler ends a job),
# then the same command line again (-y 1 from the first start). The first kill comes at a
# random time from the start (start-up included); the next ones a random 3-10 steps
# further on, plus 0-40 ms (inside a step or a save), whatever the machine's speed.
# KILL_SEED reproduces them. The finished run must equal an uninterrupted one bit for bit:
# the last logged loss of every step, and the final checkpoint's files (-nk 3 pruning all
# along). A small model (V=1000, L=2, C=64) on a shard of ids below 1000, so that a step and its
# save take milliseconds and the kills land anywhere in them.
if selected random_kills; then
    $PY - "$TMP/small.bin" "$TMP/small_tokens.bin" <<'EOF'
import numpy as np, sys
V, Vp, maxT, L, NH, C = 1000, 1024, 64, 2, 4, 64   # an llm.c v3 model: any finite weights do
n = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
header = np.zeros(256, "<i4"); header[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
rng = np.random.default_rng(5)
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes()); f.write((0.02 * rng.standard_normal(n)).astype("<f4").tobytes())
header = np.zeros(256, "<i4"); header[:3] = [20240520, 1, 30000]
with open(sys.argv[2], "wb") as f:
    f.write(header.tobytes()); f.write(rng.integers(0, V, 30000).astype("<u2").tobytes())
EOF
    # 120 steps: long enough that four kills (each at most 10 steps after the last) always land
    # before the job ends, whatever the machine's speed.
    KILL_STEPS=120
    KILL_RUN=(-np 2 ./train_gpt2 -e "$TMP/small.bin" -i "$TMP/small_tokens.bin" -t 64 -b 2 -x $KILL_STEPS -v 0 -s 0 -l 1e-3
              -u 2 -q 0.1 -c 0.1 -z 1 --bucket-size 20000 -n 1 -nk 3 -y 1)
    last_losses() { awk '/^s:[0-9]+ trl:/ { split($1, a, ":"); split($2, b, ":"); loss[a[2]] = b[2] }
                         END { for (s in loss) print s, loss[s] }' "$1/main.log" | sort -n; }
    straight=$TMP/kills_straight
    mkdir -p "$straight"
    timeout 300 "${MPIRUN[@]}" "${KILL_RUN[@]}" -o "$straight" >"$straight.log" 2>&1 || not_ok "uninterrupted run for the kills"
    logged_step() {  # the last step in DIR/main.log, 0 before the first
        local s
        s=$(sed -n 's/^s:\([0-9]*\) trl:.*/\1/p' "$1/main.log" 2>/dev/null | tail -n 1)
        echo "${s:-0}"
    }
    seed=${KILL_SEED:-$RANDOM}
    RANDOM=$seed
    dir=$TMP/kills hits=0 story=""
    mkdir -p "$dir"
    for attempt in 1 2 3 4; do
        target=$(($(logged_step "$dir") + 3 + RANDOM % 8))
        pause=$(awk -v r=$RANDOM 'BEGIN { printf "%.3f", 0.04 * r / 32767 }')
        setsid "${MPIRUN[@]}" "${KILL_RUN[@]}" -o "$dir" >>"$dir.log" 2>&1 &
        sid=$!
        if [ $attempt = 1 ]; then
            pause=$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.8 * r / 32767 }')
            what="${pause}s after the start"
        else
            deadline=$((SECONDS + 120))
            while kill -0 $sid 2>/dev/null && [ "$(logged_step "$dir")" -lt $target ] && [ $SECONDS -lt $deadline ]; do
                sleep 0.01
            done
            what="step $target + ${pause}s"
        fi
        sleep "$pause"
        if kill -0 $sid 2>/dev/null; then
            kill_session $sid
            hits=$((hits + 1))
            story+="$what (newest then: $(cd "$dir" && ls -d checkpoint_* 2>/dev/null | tail -n 1)"
            compgen -G "$dir/.checkpoint_*.tmp" >/dev/null && story+=", a save cut short"
            story+="); "
        else
            story+="$what: the job had ended; "
        fi
        wait $sid
    done 2>/dev/null  # the shell's "Killed" notices
    timeout 300 "${MPIRUN[@]}" "${KILL_RUN[@]}" -o "$dir" >>"$dir.log" 2>&1
    rc=$?
    note "kills (seed $seed): $story"
    final=$(printf 'checkpoint_%08d' $KILL_STEPS)
    if [ $rc = 0 ] && [ $hits = 4 ] && [ "$(last_losses "$dir" | wc -l)" = $KILL_STEPS ] &&
       [ "$(last_losses "$dir")" = "$(last_losses "$straight")" ] &&
       same_checkpoint "$straight/$final" "$dir/$final"; then
        ok "$hits kill -9s at random moments (np=2, a checkpoint every step): the finished run equals the uninterrupted one bitwise"
    else
        not_ok "random kills (seed $seed, rc $rc, $hits hits)" "$dir.log"
        diag "$(diff <(last_losses "$straight") <(last_losses "$dir") | head)"
    fi
fi

# Requeued once more after the end: the newest checkpoint is at -x, every rank exits 0.
if selected complete; then
    md5_before=$(cat "$S"/main.log "$S"/checkpoint_00000006/* | md5sum)
    train ./train_gpt2 2 2 "$S" -z 1 -y 1
    rc=$?
    if [ $rc = 0 ] && [ "$(grep -c "^resume: $S/checkpoint_00000006 is at step 6 = -x: the run is already complete$" "$S.log")" = 1 ] &&
       [ "$(cat "$S"/main.log "$S"/checkpoint_00000006/* | md5sum)" = "$md5_before" ]; then
        ok "resuming a complete run (np=2) says so and exits 0, changing nothing"
    else
        not_ok "resuming a complete run (rc=$rc)"; diag "$(tail -5 "$S.log")"
    fi
fi

if selected no_output_dir; then
    timeout 60 ./train_gpt2 -e "$TMP/m.bin" -t 64 -n 3 -x 1 >"$TMP/noout.log" 2>&1
    if [ $? -ne 0 ] && grep -q "error: checkpoints (-n, -nk, -y, --start-over) live in the output directory" "$TMP/noout.log"; then
        ok "-n without -o is a clear error"
    else
        not_ok "-n without -o" "$TMP/noout.log"
    fi
fi

done_testing
