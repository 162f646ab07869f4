#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=full
# The output directory (-o) as cluster jobs meet it:
#   long   a 250-character -o of nested directories: checkpoints save and resume at np 1
#          and 2 (Open MPI 4.1's MPI_File_open aborted the job, "buffer overflow detected",
#          on names over about 230 characters); an -o too long for the system's paths is
#          refused at start, before any step, with the limit and the path;
#   own    a fresh run refuses an -o holding another run's checkpoints or main.log (np 1 and
#          2, nothing changed there), --start-over replaces them, -y 1 with no checkpoint yet
#          takes main.log as its own; main.log or .lock a symbolic link (main.log a FIFO) is
#          refused, nothing written through it;
#   lock   with the job stopped at a known place (LLMC_TEST_STOP, dev/test/seams.c): rm -rf
#          of -o before a step (np 1 and 2) or with a save in flight (np 2) stops the job with
#          one error saying -o is gone, and nothing is recreated there; rm -rf, then a second
#          job on the same -o, stopped at its step 20, while the first is stopped (before a
#          step, a save in flight, a save's files written): once continued, the first job
#          stops, the second finishes, and the log and every checkpoint are the second's;
#   temps  a resume, and a fresh start, in a directory holding a dead .checkpoint_*.tmp and
#          main.log.tmp remove them before writing anything, saying so; a save that failed
#          on a full disk, then a little space freed (less than main.log: the rewrite of
#          the log needs the dead temporary's space): the resume succeeds and leaves no
#          temporary (root and a tmpfs in a private mount namespace: else SKIPPED).
# Usage: dev/test/test_paths.sh [long] [own] [lock] [temps] (all by default); TRAIN_BIN (default
# ./train_gpt2) is the trainer, e.g. a CUDA_ON_CPU=1 ./train_gpt2cu for `long`.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
BIN=${TRAIN_BIN:-./train_gpt2}
source dev/test/expect_error.sh
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(long own lock temps)
if [ "$BIN" = ./train_gpt2 ]; then
    make -s train_gpt2 USE_ZERO1=1 >/dev/null || fatal "build train_gpt2"
fi
[ -x "$BIN" ] || fatal "$BIN is built"
t0=$SECONDS
small_model "$TMP/model.bin" || fatal "the oracle writes a model"
write_shard "$TMP/good.bin" 8192
BASE=(-e "$TMP/model.bin" -i "$TMP/good.bin" -b 2 -t 32 -v 0 -s 0)

# train NP LOG ARGS...: the trainer (under mpirun when NP > 1) within 120 s; its exit code.
train() {
    local np=$1 log=$2
    shift 2
    if [ "$np" = 1 ]; then timeout --kill-after=5 120 "$BIN" "${BASE[@]}" "$@" >"$log" 2>&1
    else timeout --kill-after=5 120 "${MPIRUN[@]}" -np "$np" "$BIN" "${BASE[@]}" "$@" >"$log" 2>&1; fi
}
# line_of LOG TEXT: the number of the first line holding TEXT (0 when none).
line_of() { grep -nF -- "$2" "$1" | head -n 1 | cut -d: -f1 | grep . || echo 0; }
show() { sed 's/^/       | /' "$1" | tail -n "${2:-8}"; }
temporaries() { find "$1" -maxdepth 1 \( -name '.checkpoint_*.tmp' -o -name main.log.tmp \) -printf '%f ' 2>/dev/null; }
lost_msg="is no longer the one this job locked"

# long_path DIR LENGTH: DIR/ddd.../ddd... in 60-character names, LENGTH characters long.
long_path() {
    local seg tail
    seg="/$(printf 'd%.0s' {1..59})"
    tail=$(printf "$seg%.0s" {1..80})
    tail=${tail:0:$(($2 - ${#1}))}
    [[ $tail == */ ]] && tail="${tail%/}e"
    echo "$1$tail"
}

part_long() {
    local np out
    for np in 1 2; do
        out=$(long_path "$TMP/long$np" 250)
        train $np "$TMP/long_save$np.log" -x 2 -n 1 -o "$out"
        local rc_save=$?
        train $np "$TMP/long_resume$np.log" -x 3 -n 1 -y 1 -o "$out"
        local rc_resume=$?
        if [ $rc_save = 0 ] && [ $rc_resume = 0 ] && [ -f "$out/checkpoint_00000002/manifest.txt" ] &&
           grep -qF "resumed from $out/checkpoint_00000002: step 2" "$TMP/long_resume$np.log" &&
           [ -f "$out/checkpoint_00000003/manifest.txt" ] && [ -z "$(temporaries "$out")" ]; then
            ok "long -o (${#out} characters), np $np: saved at steps 1-2, resumed from step 2, saved step 3"
        else
            not_ok "long -o (${#out} characters), np $np: save exit $rc_save, resume exit $rc_resume"
            show "$TMP/long_save$np.log" 4
            show "$TMP/long_resume$np.log" 4
        fi
    done
    # One the system cannot hold with a checkpoint's names appended: refused at start.
    out=$(long_path "$TMP/toolong" 4040)
    local max=$((4096 - 1 - 64))
    for np in 1 2; do
        expect_error too_long_o $np "-o '$TMP/toolong/ddd" "is 4040 characters long; at most $max fit" -- -x 1 -n 1 -o "$out"
        grep -q '^step' "$TMP/too_long_o.np$np.log" && not_ok "too long -o, np $np: refused only after training"
    done
    expect_error too_long_o_resume 1 "is 4040 characters long; at most $max fit" -- -x 1 -n 1 -y 1 -o "$out"
    [ -e "$TMP/toolong" ] && not_ok "too long -o: $TMP/toolong was created"
}

# stopped_run NAME POINT STOPPERS NP ARGS...: the trainer (under mpirun when NP > 1) in the
# background, LLMC_TEST_STOP=POINT (dev/test/seams.c), until STOPPERS processes stand
# stopped there; sets job (its pid) and pids (the stopped ones). Output in $TMP/NAME.log.
stopped_run() {
    local name=$1 point=$2 stoppers=$3 np=$4
    shift 4
    local cmd=("$BIN" "${BASE[@]}" "$@")
    [ "$np" = 1 ] || cmd=("${MPIRUN[@]}" -x LLMC_TEST_STOP -np "$np" "${cmd[@]}")
    LLMC_TEST_STOP=$point timeout --kill-after=5 240 "${cmd[@]}" >"$TMP/$name.log" 2>&1 &
    job=$!
    pids=$(wait_stopped "$TMP/$name.log" "$stoppers") || { not_ok "$name: no process stopped at $point"; show "$TMP/$name.log"; }
}
# lost_ok LOG RC WHAT: one error, rank 0's, saying -o is lost (WHAT: how), exit != 0.
lost_ok() {
    [ "$2" != 0 ] && [ "$2" != 124 ] && [ "$(grep -c 'error:' "$1")" = 1 ] && ! grep -q '^\[rank [1-9]' "$1" &&
        grep 'error:' "$1" | grep -qF "$lost_msg ($3"
}

part_lock() {
    local np out rc point
    # Alone: rm -rf of -o while the job stands before step 3 (np 1, 2), and while a save is in
    # flight (np 2: every rank stopped in the save of step 2, its temporary directory made,
    # before model.bin is opened; the open then fails, and the error says why).
    for point in "step:*:3 1" "step:*:3 2" "save_open:*:2 2"; do
        np=${point#* } point=${point% *}
        out=$TMP/removed_${point%%:*}_$np
        stopped_run "removed_${point%%:*}_$np" "$point" "$np" "$np" -x 2000 -n 2 -o "$out"
        rm -rf "$out"
        # shellcheck disable=SC2086  # one pid per word
        kill -CONT $pids
        wait $job
        rc=$?
        if lost_ok "$TMP/removed_${point%%:*}_$np.log" $rc "it no longer exists" && [ ! -e "$out" ]; then
            ok "rm -rf of -o at $point, np $np: exit $rc, nothing recreated: $(grep 'error:' "$TMP/removed_${point%%:*}_$np.log" | cut -c1-150)"
        else
            not_ok "rm -rf of -o at $point, np $np: exit $rc, $out $([ -e "$out" ] && echo exists || echo "is gone")"
            show "$TMP/removed_${point%%:*}_$np.log"
        fi
    done
    # A second job on the same -o once the first one's directory was removed, the first
    # stopped at a known place: before a step, with a save in flight (np 2), with a save's
    # files written but not yet renamed into place. The second stops itself at its step 20
    # (holding its lock); then the first is continued and must stop, the second continued
    # and must finish; the log and every checkpoint are the second job's alone.
    for point in "step:*:3 1" "save_open:*:2 2" "save_commit:0:2 1"; do
        np=${point#* } point=${point% *}
        out=$TMP/shared_${point%%:*}
        local first second
        stopped_run "first_${point%%:*}" "$point" "$np" "$np" -x 3000 -n 2 -l 1e-3 -o "$out"
        first=$job
        local first_pids=$pids
        rm -rf "$out"
        stopped_run "second_${point%%:*}" "step:0:20" 1 1 -x 40 -n 10 -l 2e-4 -o "$out"
        second=$job
        # shellcheck disable=SC2086
        kill -CONT $first_pids
        wait $first
        local rc1=$?
        # shellcheck disable=SC2086
        kill -CONT $pids
        wait $second
        local rc2=$?
        local lrs logged
        lrs=$(cat "$out"/checkpoint_*/state.txt 2>/dev/null | awk '$1 == "lr" { print ($2 > 1.9e-4 && $2 < 2.1e-4) ? "second" : "other" }' | sort | uniq -c | xargs)
        logged=$(grep -c '^s:[0-9]* trl:.* lr:2.00e-04 ' "$out/main.log")
        if lost_ok "$TMP/first_${point%%:*}.log" $rc1 "it is another directory now" && [ $rc2 = 0 ] &&
           [ "$lrs" = "4 second" ] && [ "$logged" = 40 ] && [ "$(grep -vc ' busy_ms:' "$out/main.log")" = 40 ] &&
           [ -z "$(temporaries "$out")" ]; then
            ok "a second job on a removed -o, the first stopped at $point (np $np): the first stopped (exit $rc1), the second's 40 log lines and 4 checkpoints alone are there"
        else
            not_ok "a second job on a removed -o, the first at $point: first exit $rc1, second exit $rc2, checkpoints' lr: '$lrs', the second's log lines: $logged of $(wc -l <"$out/main.log"), temporaries: $(temporaries "$out")"
            show "$TMP/first_${point%%:*}.log" 4
            show "$TMP/second_${point%%:*}.log" 4
        fi
    done
}

# A run owns its directory: a fresh run refuses another run's checkpoints and main.log (at
# np 1 and 2, changing nothing), --start-over replaces them, -y 1 with no checkpoint yet
# takes main.log as its own; main.log or .lock a symbolic link is refused, writing nothing
# through it.
part_own() {
    local out=$TMP/owned before rc
    train 1 "$TMP/owned_run.log" -x 4 -n 2 -o "$out" || { not_ok "own: the first run failed"; show "$TMP/owned_run.log"; }
    before=$(cd "$out" && find . -type f ! -name .lock | sort | xargs md5sum)
    local want="output directory '$out' holds another run's main.log and checkpoints (checkpoint_00000002, checkpoint_00000004): a fresh run would replace them"
    expect_error fresh_into_a_run 1 "$want" "-y 1" "--start-over" -- -x 4 -n 2 -l 1e-3 -o "$out"
    expect_error fresh_into_a_run 2 "$want" -- -x 4 -n 2 -l 1e-3 -o "$out"
    [ "$(cd "$out" && find . -type f ! -name .lock | sort | xargs md5sum)" = "$before" ] ||
        not_ok "fresh_into_a_run: the refused runs changed files in $out"
    mkdir -p "$TMP/log_only" && echo "s:1 trl:10.0 norm:1 lr:3.00e-04 ms:1.0" >"$TMP/log_only/main.log"
    expect_error fresh_into_a_log 1 "holds another run's main.log: a fresh run would replace them" -- -x 1 -o "$TMP/log_only"
    if train 1 "$TMP/log_only_y.log" -x 1 -y 1 -o "$TMP/log_only" && [ "$(grep -c '^s:1 trl' "$TMP/log_only/main.log")" = 1 ] &&
       grep -q "resume: no checkpoint in $TMP/log_only yet; starting from step 0" "$TMP/log_only_y.log"; then
        ok "-y 1 with a main.log and no checkpoint yet: the run's own, started again from step 0"
    else
        not_ok "-y 1 with a main.log and no checkpoint"; show "$TMP/log_only_y.log"
    fi
    if train 2 "$TMP/start_over.log" -x 4 -n 2 -l 1e-3 --start-over -o "$out" &&
       grep -q "^--start-over: removed the run that was in $out (2 checkpoints and main.log)$" "$TMP/start_over.log" &&
       [ "$(awk '$1 == "lr" { print $2 }' "$out"/checkpoint_*/state.txt | sort -u)" = 0.00100000005 ] &&
       [ "$(grep -c ' lr:1.00e-03 ' "$out/main.log")" = 4 ] && [ "$(wc -l <"$out/main.log")" = 4 ]; then
        ok "--start-over (np 2): the other run's checkpoints and main.log removed, saying so; the new run's alone are there"
    else
        not_ok "--start-over"; show "$TMP/start_over.log"
    fi
    expect_error start_over_resume 1 "--start-over removes the run in -o to start a fresh one, -y 1 resumes it" -- -x 1 -y 1 --start-over -o "$out"
    # A user's file in the older checkpoint (named like a side file of model.bin): --start-over
    # removes nothing and says so; -nk keeps that checkpoint's directory and the file.
    echo notes >"$out/checkpoint_00000002/model.bin.notes"
    before=$(cd "$out" && find . -type f ! -name .lock | sort | xargs md5sum)
    expect_error start_over_foreign 1 "checkpoint_00000002 holds 'model.bin.notes', which is no checkpoint file: nothing was removed" \
        -- -x 4 -n 2 --start-over -o "$out"
    [ "$(cd "$out" && find . -type f ! -name .lock | sort | xargs md5sum)" = "$before" ] ||
        not_ok "start_over_foreign: files changed in $out"
    if train 2 "$TMP/nk_foreign.log" -x 8 -n 2 -nk 1 -l 1e-3 -y 1 -o "$out" && [ "$(cat "$out/checkpoint_00000002/model.bin.notes")" = notes ] &&
       grep -q "not removing $out/checkpoint_00000002: it holds 'model.bin.notes'" "$TMP/nk_foreign.log"; then
        ok "-nk keeps a checkpoint directory holding a user's model.bin.notes, saying so"
    else
        not_ok "-nk with a user's file in an old checkpoint"; show "$TMP/nk_foreign.log"
    fi
    # Symbolic links: main.log to a file outside, .lock to one; the outside files untouched.
    mkdir -p "$TMP/links_log" "$TMP/links_lock"
    echo outside >"$TMP/outside.txt"
    ln -s "$TMP/outside.txt" "$TMP/links_log/main.log"
    ln -s "$TMP/outside.txt" "$TMP/links_lock/.lock"
    expect_error main_log_link 1 "'$TMP/links_log/main.log' is a symbolic link: the job writes, and reads back from its own directory, regular files only, never through a link" -- -x 1 -o "$TMP/links_log"
    expect_error main_log_link 2 "'$TMP/links_log/main.log' is a symbolic link" -- -x 1 -y 1 -o "$TMP/links_log"
    expect_error lock_link 1 "the lock file '$TMP/links_lock/.lock' is a symbolic link, not a regular file" -- -x 1 -o "$TMP/links_lock"
    mkdir -p "$TMP/fifo_log" && mkfifo "$TMP/fifo_log/main.log"
    expect_error main_log_fifo 1 "'$TMP/fifo_log/main.log' is a FIFO" -- -x 1 -o "$TMP/fifo_log"
    [ "$(cat "$TMP/outside.txt")" = outside ] || not_ok "links: the file outside -o was written through a link"
}

# plant DIR: what a save and a log rewrite cut short leave behind.
plant() {
    mkdir -p "$1/.checkpoint_00000003.tmp"
    head -c 1000 "$1/checkpoint_00000002/model.bin" >"$1/.checkpoint_00000003.tmp/model.bin"
    head -n 1 "$1/main.log" >"$1/main.log.tmp"
}

part_temps() {
    local out=$TMP/temps log rc
    train 1 "$TMP/temps_run.log" -x 2 -n 1 -o "$out" || { not_ok "temporaries: the first run failed"; show "$TMP/temps_run.log"; }
    for mode in resume fresh; do
        plant "$out"
        log=$TMP/temps_$mode.log
        if [ $mode = resume ]; then train 1 "$log" -x 3 -n 1 -y 1 -o "$out"
        else train 1 "$log" -x 1 -n 0 --start-over -o "$out"; fi
        rc=$?
        local first_write removed_ck removed_log
        first_write=$(line_of "$log" "$([ $mode = resume ] && echo "resumed from" || echo "step    1/1")")
        removed_ck=$(line_of "$log" "checkpoint: removed $out/.checkpoint_00000003.tmp, left by an interrupted save")
        removed_log=$(line_of "$log" "main.log: removed $out/main.log.tmp")
        if [ $rc = 0 ] && [ "$removed_ck" -gt 0 ] && [ "$removed_log" -gt 0 ] && [ "$first_write" -gt "$removed_ck" ] &&
           [ "$first_write" -gt "$removed_log" ] && [ -z "$(temporaries "$out")" ]; then
            ok "dead temporaries, $mode: both removed and named before the run writes"
        else
            not_ok "dead temporaries, $mode: exit $rc; lines: removed checkpoint temporary $removed_ck, removed main.log.tmp $removed_log, first write $first_write; left: $(temporaries "$out")"
            show "$log"
        fi
    done

    if [ "$(id -u)" != 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
        skip "full disk" "needs root and unshare -m for a small tmpfs (not run here)"
        return
    fi
    # In a private mount namespace: K steps with a checkpoint at K on a roomy tmpfs; then the
    # tmpfs shrunk to what holds one more checkpoint but 16 KiB, and a resume to K+1 whose
    # save fails; then 40 KiB freed (less than main.log) and the same resume again.
    local K=1000
    cat >"$TMP/full_disk.sh" <<'EOF'
set -u
fs=$1 res=$2 bin=$3 K=$4
shift 4
out=$fs/out
mount -t tmpfs -o size=64m tmpfs "$fs" || exit 97
timeout 120 "$bin" "$@" -x $K -n $K -o "$out" >"$res/a.log" 2>&1
echo $? >"$res/a.rc"
used=$(df -k --output=used "$fs" | tail -n 1)
ck=$(du -sk "$out/checkpoint_$(printf %08d $K)" | cut -f1)
size=$((used + ck - 16))
mount -o remount,size=${size}k "$fs" || exit 98
timeout 120 "$bin" "$@" -x $((K + 1)) -n $K -y 1 -o "$out" >"$res/b.log" 2>&1
echo $? >"$res/b.rc"
ls -A "$out" >"$res/b.ls"
df -k --output=avail "$fs" | tail -n 1 >"$res/b.avail"
stat -c %s "$out/main.log" >"$res/b.log_bytes"
mount -o remount,size=$((size + 40))k "$fs" || exit 98
timeout 120 "$bin" "$@" -x $((K + 1)) -n $K -y 1 -o "$out" >"$res/c.log" 2>&1
echo $? >"$res/c.rc"
ls -A "$out" >"$res/c.ls"
EOF
    mkdir -p "$TMP/fs" "$TMP/full"
    unshare -m --propagation private bash "$TMP/full_disk.sh" "$TMP/fs" "$TMP/full" "$BIN" "$K" "${BASE[@]}"
    rc=$?
    local r=$TMP/full tmp_name next
    tmp_name=.checkpoint_$(printf %08d $((K + 1))).tmp
    next=checkpoint_$(printf %08d $((K + 1)))
    if [ $rc != 0 ] || [ "$(cat $r/a.rc)" != 0 ]; then
        not_ok "full disk: could not set up (namespace script exit $rc, first run exit $(cat $r/a.rc 2>/dev/null))"
        show "$r/a.log"
    elif [ "$(cat $r/b.rc)" = 0 ] || ! grep -qx "$tmp_name" "$r/b.ls" || [ "$(cat $r/b.log_bytes)" -le $((48 * 1024)) ]; then
        not_ok "full disk: the setup did not fail a save leaving $tmp_name with main.log over 48 KiB (exit $(cat $r/b.rc), main.log $(cat $r/b.log_bytes) bytes, left: $(xargs <$r/b.ls))"
        show "$r/b.log"
    elif [ "$(cat $r/c.rc)" = 0 ] && grep -qF "checkpoint: removed $TMP/fs/out/$tmp_name" "$r/c.log" &&
         grep -qx "$next" "$r/c.ls" && ! grep -qE '^\.checkpoint_.*\.tmp$|^main\.log\.tmp$' "$r/c.ls"; then
        ok "full disk: the save of step $((K + 1)) failed ($(grep -m1 'error:' $r/b.log | cut -c1-90)...); with 40 KiB freed the resume removed $tmp_name, saved step $((K + 1)), no temporary left"
    else
        not_ok "full disk: the resume with 40 KiB freed: exit $(cat $r/c.rc), left: $(xargs <$r/c.ls)"
        show "$r/c.log"
    fi
}

for part in "${PARTS[@]}"; do
    case $part in
    long | own | lock | temps) part_$part ;;
    *) fatal "unknown part '$part' (long, own, lock, temps)" ;;
    esac
done
note "test_paths (${PARTS[*]}; $((SECONDS - t0)) s)"
done_testing
