#!/usr/bin/env bash
# test: timeout=240 lane=cpu tier=full
# --async-save 1 (run/checkpoint_async.h): checkpoints written by a background thread while
# training goes on, committed by the same rules as the synchronous save.
#   1. at np=2 (ZeRO-1), every checkpoint of an async run (-n 2 -x 6) equals the synchronous
#      run's byte for byte (model.bin and optimizer.bin through MPI-IO there, pwrite here;
#      state.txt, manifest.txt), the step lines are the same, and a step ran while the
#      first save was written; a resume from the async step-4 checkpoint ends with the
#      synchronous run's step-6 checkpoint and losses;
#   2. kill -9 of the whole job while rank 1's writer of step 4 hangs (LLMC_TEST_STOP=
#      save_write, dev/test/seams.c) and step 5 has run: checkpoint 2 is whole, step 4 is
#      only a temporary directory, and the same command line with -y 1 resumes from step 2
#      and ends with the synchronous run's step-6 checkpoint (-nk 1 pruning after commits);
#   3. a writer that hangs on rank 1 ends the job with one error: line naming rank 1 and
#      the step within --comm-timeout (2 s) plus the error's 3 s; a disk that fills up under
#      the writer (a 4 MiB tmpfs) ends it with one error: line naming the file; --async-save
#      without -n is refused.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
make -s train_gpt2 USE_ZERO1=1 >/dev/null || fatal "build"
$PY dev/test/gpt2_oracle.py make --out-model "$TMP/m.bin" --out-state "$TMP/s.bin" --steps 0 >/dev/null ||
    fatal "oracle"

RUN=(./train_gpt2 -e "$TMP/m.bin" -i data/tinyshakespeare_train.bin -t 64 -b 2 -x 6 -v 0 -s 0 -l 1e-3 -u 2 -q 0.1
     -c 0.1 -z 1 --bucket-size 20000 -n 2)
train() {  # train DIR [flags]: np=2, output in DIR.log
    local dir=$1
    shift
    mkdir -p "$dir"
    timeout 120 "${MPIRUN[@]}" -np 2 "${RUN[@]}" -o "$dir" "$@" >"$dir.log" 2>&1
}
same_files() {  # same_files A B FILE...: each FILE of checkpoint directories A and B byte for byte
    local a=$1 b=$2 f
    shift 2
    for f; do cmp -s "$a/$f" "$b/$f" || return 1; done
}
CKPT_FILES=(model.bin optimizer.bin state.txt manifest.txt)
step_text() { sed -n 's/^\(step *[0-9]*\/[0-9]* | loss [^|]* | norm [^|]*\) |.*/\1/p' "$1"; }

sync=$TMP/sync async=$TMP/async
train "$sync" || fatal "the synchronous run" "$sync.log"

if selected "async = sync"; then
    if ! train "$async" --async-save 1; then
        not_ok "the --async-save run" "$async.log"
    else
        same=1
        for s in 2 4 6; do
            c=$(printf 'checkpoint_%08d' $s)
            same_files "$sync/$c" "$async/$c" "${CKPT_FILES[@]}" || same=0
        done
        if [ $same = 1 ] && [ "$(step_text "$sync.log")" = "$(step_text "$async.log")" ] &&
           [ "$(step_text "$async.log" | wc -l)" = 6 ] &&
           grep -Eq "^checkpoint: step 2 saved .*in the background.* [1-9] steps? ran meanwhile" "$async.log"; then
            ok "async = sync: checkpoints 2, 4, 6 byte for byte, the same step lines, a step ran during the write"
        else
            not_ok "async-saved checkpoints differ from the synchronous ones" "$async.log"
        fi
        resumed=$TMP/resumed
        mkdir -p "$resumed" && cp -r "$async/checkpoint_00000004" "$async/main.log" "$resumed/"
        if train "$resumed" --async-save 1 -y 1 &&
           grep -q "resumed from $resumed/checkpoint_00000004: step 4 " "$resumed.log" &&
           same_files "$sync/checkpoint_00000006" "$resumed/checkpoint_00000006" "${CKPT_FILES[@]}" &&
           [ "$(step_text "$resumed.log")" = "$(step_text "$sync.log" | tail -n 2)" ]; then
            ok "a resume from the async step-4 checkpoint ends with the synchronous run's step 5-6 losses and checkpoint 6"
        else
            not_ok "resume from an async checkpoint" "$resumed.log"
        fi
    fi
fi

if selected "kill -9 during a background write"; then
    dir=$TMP/killed
    mkdir -p "$dir"
    LLMC_TEST_STOP=save_write:1:4 setsid "${MPIRUN[@]}" -np 2 "${RUN[@]}" -o "$dir" --async-save 1 -nk 1 -y 1 \
        >"$dir.log" 2>&1 &
    sid=$!
    for _ in $(seq 600); do  # rank 1's writer of step 4 hangs, and step 5 has run meanwhile
        grep -q "^test: rank 1 stalls its checkpoint writer" "$dir.log" && grep -q "^step *5/6" "$dir.log" && break
        sleep 0.1
    done
    during=$(cd "$dir" && echo checkpoint_* .checkpoint_*)
    kill_session $sid
    wait $sid 2>/dev/null
    if [ "$during" != "checkpoint_00000002 .checkpoint_00000004.tmp" ]; then
        not_ok "kill -9 during a background write: -o held '$during' (want checkpoint 2 and step 4's temporary)" "$dir.log"
    elif timeout 120 "${MPIRUN[@]}" -np 2 "${RUN[@]}" -o "$dir" --async-save 1 -nk 1 -y 1 >"$dir.resume.log" 2>&1 &&
         grep -q "resumed from $dir/checkpoint_00000002: step 2 " "$dir.resume.log" &&
         grep -q "removed $dir/.checkpoint_00000004.tmp, left by an interrupted save" "$dir.resume.log" &&
         # -nk 1 keeps the newest and the one a later good step vouched for (run/spikes.h)
         [ "$(cd "$dir" && echo checkpoint_* .checkpoint_*)" = "checkpoint_00000004 checkpoint_00000006 .checkpoint_*" ] &&
         same_files "$sync/checkpoint_00000006" "$dir/checkpoint_00000006" "${CKPT_FILES[@]}"; then
        ok "kill -9 while step 4's save was written in the background: checkpoint 2 intact, -y 1 resumed from it to the synchronous run's checkpoint 6"
    else
        not_ok "resume after kill -9 during a background write" "$dir.resume.log"
    fi
fi

BIN=./train_gpt2
BASE=("${RUN[@]:1}" -x 40 -o "$TMP/stalled" --async-save 1 --comm-timeout 2)
start=$SECONDS
LLMC_TEST_STOP=save_write:1:2 expect_error stalled_writer 2 "rank 1's background write" "step 2" "no progress in 2 s" --
if selected stalled_writer/2; then
    took=$((SECONDS - start))
    if [ $took -le 15 ] && [ ! -e "$TMP/stalled/checkpoint_00000002" ]; then
        ok "the stalled writer's job ended in $took s (deadline 2 s, the error's 3 s, start-up), step 2 not committed"
    else
        not_ok "the stalled writer's job took $took s, or step 2 was committed"
    fi
fi
# A disk that fills up under the writer (a 4 MiB tmpfs, root): the writer's failure, not a hang.
mnt=""
at_exit '[ -n "$mnt" ] && umount "$mnt" 2>/dev/null'
if selected disk_full/2; then
    mkdir -p "$TMP/full"
    if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=4m tmpfs "$TMP/full" 2>/dev/null; then
        mnt=$TMP/full
        BASE=("${RUN[@]:1}" -o "$mnt/run" --async-save 1)
        expect_error disk_full 2 "background write failed" ".checkpoint_00000002.tmp/" "is the disk full" --
        [ -e "$mnt/run/checkpoint_00000002" ] && not_ok "disk full: step 2 was renamed into place"
    else
        skip "disk full under the writer" "needs root and a tmpfs mount"
    fi
fi
BASE=("${RUN[@]:1}" -n 0 -o "$TMP/no_n")
expect_error async_without_n 1 "--async-save" "-n" -- --async-save 1
done_testing
