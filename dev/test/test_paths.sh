#!/usr/bin/env bash
# The output directory (-o) as cluster jobs meet it:
#   long   a 250-character -o of nested directories: checkpoints save and resume at np 1
#          and 2 (Open MPI 4.1's MPI_File_open aborted the job, "buffer overflow detected",
#          on names over about 230 characters); an -o too long for the system's paths is
#          refused at start, before any step, with the limit and the path;
#   lock   rm -rf of -o during a run stops the job at its next main.log line with one
#          error, and nothing is recreated there (np 1 and 2); rm -rf, then a second job on
#          the same -o while the first is stopped: once it goes on, the first job stops,
#          the second finishes, and the log and every checkpoint are the second job's;
#   temps  a resume, and a fresh start, in a directory holding a dead .checkpoint_*.tmp and
#          main.log.tmp remove them before writing anything, saying so; a save that failed
#          on a full disk, then a little space freed (less than main.log: the rewrite of
#          the log needs the dead temporary's space): the resume succeeds and leaves no
#          temporary (root and a tmpfs in a private mount namespace: else SKIPPED).
# Usage: dev/test/test_paths.sh [long] [lock] [temps] (all by default); TRAIN_BIN (default
# ./train_gpt2) is the trainer, e.g. a CUDA_ON_CPU=1 ./train_gpt2cu for `long`.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
BIN=${TRAIN_BIN:-./train_gpt2}
source dev/test/expect_error.sh
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(long lock temps)
if [ "$BIN" = ./train_gpt2 ]; then
    make -s train_gpt2 USE_ZERO1=1 >/dev/null || { echo "FAIL test_paths: build"; exit 1; }
fi
[ -x "$BIN" ] || { echo "FAIL test_paths: $BIN is not built"; exit 1; }
t0=$SECONDS
small_model "$TMP/model.bin" || exit 1
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
# wait_lines FILE N PID: until FILE has N lines, while PID runs (10 s at most).
wait_lines() {
    local i
    for i in $(seq 500); do
        [ "$({ wc -l <"$1"; } 2>/dev/null || echo 0)" -ge "$2" ] && return 0
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.02
    done
    return 1
}
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
            bad "long -o (${#out} characters), np $np: save exit $rc_save, resume exit $rc_resume"
            show "$TMP/long_save$np.log" 4
            show "$TMP/long_resume$np.log" 4
        fi
    done
    # One the system cannot hold with a checkpoint's names appended: refused at start.
    out=$(long_path "$TMP/toolong" 4040)
    local max=$((4096 - 1 - 64))
    for np in 1 2; do
        check too_long_o $np "-o '$TMP/toolong/ddd" "is 4040 characters long; at most $max fit" -- -x 1 -n 1 -o "$out"
        grep -q '^step' "$TMP/too_long_o.np$np.log" && bad "too long -o, np $np: refused only after training"
    done
    check too_long_o_resume 1 "is 4040 characters long; at most $max fit" -- -x 1 -n 1 -y 1 -o "$out"
    [ -e "$TMP/toolong" ] && bad "too long -o: $TMP/toolong was created"
}

part_lock() {
    local np out pid rc
    # Alone: rm -rf of -o while the job runs (its next checkpoint would be at step 1000).
    for np in 1 2; do
        out=$TMP/removed$np
        local cmd=("$BIN" "${BASE[@]}" -x 2000 -n 1000 -o "$out")
        [ $np = 1 ] || cmd=("${MPIRUN[@]}" -np $np "${cmd[@]}")
        timeout --kill-after=5 120 "${cmd[@]}" >"$TMP/removed$np.log" 2>&1 &
        pid=$!
        wait_lines "$out/main.log" 3 $pid || bad "rm -rf, np $np: the job wrote no main.log"
        rm -rf "$out"
        wait $pid
        rc=$?
        if [ $rc != 0 ] && [ $rc != 124 ] && [ "$(grep -c 'error:' "$TMP/removed$np.log")" = 1 ] &&
           grep 'error:' "$TMP/removed$np.log" | grep -qF "output directory '$out' $lost_msg" &&
           ! grep -q '^\[rank [1-9]' "$TMP/removed$np.log" && [ ! -e "$out" ]; then
            ok "rm -rf of -o during a run, np $np: exit $rc, nothing recreated: $(grep 'error:' "$TMP/removed$np.log" | cut -c1-150)"
        else
            bad "rm -rf of -o during a run, np $np: exit $rc, $out $([ -e "$out" ] && echo exists || echo "is gone")"
            show "$TMP/removed$np.log"
        fi
    done
    # A second job on the same -o once the first one's directory was removed: the first is
    # stopped (SIGSTOP, so not under timeout: the signal must reach the trainer) from the
    # removal until the second runs.
    out=$TMP/shared
    "$BIN" "${BASE[@]}" -x 3000 -n 10 -l 1e-3 -o "$out" >"$TMP/first.log" 2>&1 &
    local first=$!
    wait_lines "$out/main.log" 3 $first || bad "second job: the first job wrote no main.log"
    kill -STOP $first
    rm -rf "$out"
    timeout --kill-after=5 120 "$BIN" "${BASE[@]}" -x 40 -n 10 -l 2e-4 -o "$out" >"$TMP/second.log" 2>&1 &
    local second=$!
    wait_lines "$out/main.log" 1 $second || bad "second job: it wrote no main.log"
    kill -CONT $first
    wait $first
    local rc1=$?
    wait $second
    local rc2=$?
    local lrs logged
    lrs=$(cat "$out"/checkpoint_*/state.txt 2>/dev/null | awk '$1 == "lr" { print ($2 > 1.9e-4 && $2 < 2.1e-4) ? "second" : "other" }' | sort | uniq -c | xargs)
    logged=$(grep -c '^s:[0-9]* trl:.* lr:2.00e-04 ' "$out/main.log")
    if [ $rc1 != 0 ] && [ $rc1 != 124 ] && [ "$(grep -c 'error:' "$TMP/first.log")" = 1 ] &&
       grep 'error:' "$TMP/first.log" | grep -qF "output directory '$out' $lost_msg (it is another directory now" &&
       [ $rc2 = 0 ] && [ "$lrs" = "4 second" ] && [ "$logged" = 40 ] && [ "$(wc -l <"$out/main.log")" = 40 ]; then
        ok "a second job on a removed -o: the first stopped (exit $rc1), the second's 40 log lines and 4 checkpoints alone are there"
    else
        bad "a second job on a removed -o: first exit $rc1, second exit $rc2, checkpoints' lr: '$lrs', the second's log lines: $logged of $(wc -l <"$out/main.log")"
        show "$TMP/first.log" 4
        show "$TMP/second.log" 4
    fi
}

# plant DIR: what a save and a log rewrite cut short leave behind.
plant() {
    mkdir -p "$1/.checkpoint_00000003.tmp"
    head -c 1000 "$1/checkpoint_00000002/model.bin" >"$1/.checkpoint_00000003.tmp/model.bin"
    head -n 1 "$1/main.log" >"$1/main.log.tmp"
}

part_temps() {
    local out=$TMP/temps log rc
    train 1 "$TMP/temps_run.log" -x 2 -n 1 -o "$out" || { bad "temporaries: the first run failed"; show "$TMP/temps_run.log"; }
    for mode in resume fresh; do
        plant "$out"
        log=$TMP/temps_$mode.log
        if [ $mode = resume ]; then train 1 "$log" -x 3 -n 1 -y 1 -o "$out"
        else train 1 "$log" -x 1 -n 0 -o "$out"; fi
        rc=$?
        local first_write removed_ck removed_log
        first_write=$(line_of "$log" "$([ $mode = resume ] && echo "resumed from" || echo "step    1/1")")
        removed_ck=$(line_of "$log" "checkpoint: removed $out/.checkpoint_00000003.tmp, left by an interrupted save")
        removed_log=$(line_of "$log" "main.log: removed $out/main.log.tmp")
        if [ $rc = 0 ] && [ "$removed_ck" -gt 0 ] && [ "$removed_log" -gt 0 ] && [ "$first_write" -gt "$removed_ck" ] &&
           [ "$first_write" -gt "$removed_log" ] && [ -z "$(temporaries "$out")" ]; then
            ok "dead temporaries, $mode: both removed and named before the run writes"
        else
            bad "dead temporaries, $mode: exit $rc; lines: removed checkpoint temporary $removed_ck, removed main.log.tmp $removed_log, first write $first_write; left: $(temporaries "$out")"
            show "$log"
        fi
    done

    if [ "$(id -u)" != 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
        echo "SKIPPED full disk: needs root and unshare -m for a small tmpfs (not run here)"
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
        bad "full disk: could not set up (namespace script exit $rc, first run exit $(cat $r/a.rc 2>/dev/null))"
        show "$r/a.log"
    elif [ "$(cat $r/b.rc)" = 0 ] || ! grep -qx "$tmp_name" "$r/b.ls" || [ "$(cat $r/b.log_bytes)" -le $((48 * 1024)) ]; then
        bad "full disk: the setup did not fail a save leaving $tmp_name with main.log over 48 KiB (exit $(cat $r/b.rc), main.log $(cat $r/b.log_bytes) bytes, left: $(xargs <$r/b.ls))"
        show "$r/b.log"
    elif [ "$(cat $r/c.rc)" = 0 ] && grep -qF "checkpoint: removed $TMP/fs/out/$tmp_name" "$r/c.log" &&
         grep -qx "$next" "$r/c.ls" && ! grep -qE '^\.checkpoint_.*\.tmp$|^main\.log\.tmp$' "$r/c.ls"; then
        ok "full disk: the save of step $((K + 1)) failed ($(grep -m1 'error:' $r/b.log | cut -c1-90)...); with 40 KiB freed the resume removed $tmp_name, saved step $((K + 1)), no temporary left"
    else
        bad "full disk: the resume with 40 KiB freed: exit $(cat $r/c.rc), left: $(xargs <$r/c.ls)"
        show "$r/c.log"
    fi
}

for part in "${PARTS[@]}"; do
    case $part in
    long | lock | temps) part_$part ;;
    *) echo "FAIL test_paths: unknown part '$part' (long, lock, temps)"; exit 1 ;;
    esac
done
if [ $failed -eq 0 ]; then
    echo "PASS test_paths (${PARTS[*]}; $((SECONDS - t0)) s)"
    exit 0
fi
echo "FAIL test_paths: $failed case(s) failed"
exit 1
