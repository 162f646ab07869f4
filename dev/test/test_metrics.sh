#!/usr/bin/env bash
# test: timeout=240 lane=cpu tier=full
# The step metrics (run/metrics.h), the stragglers and the TensorBoard event files
# (run/tensorboard.h), on the small model (vocab 1000) and the CPU trainer with zero1/:
#
#   straggler    np 2, rank 1 made slow (LLMC_TEST_SLOW_RANK=1:400, a test seam) for 4 steps
#                with --straggler-every 2: every train line of main.log names rank 1 as the
#                slowest (slow:<ms>@1, at least the 400 ms it slept), the busy_ms lines at
#                steps 2 and 4 give it the max busy time and rank 0 the max comm wait; the
#                header names the measured matmul rate MFU counts against, every train line
#                has tps:, mfu:, comm:, mem:
#   tensorboard  that run's event files, loaded by the real tensorboard package's reader
#                (dev/test/tensorboard_peer.sh, pinned; without PyPI SKIPPED, under CI=true
#                a failure), hold every scalar of main.log (dev/test/tensorboard_check.py)
#   resume       np 1, -x 6 -n 4 -v 2, killed (kill -9) before step 6; -y 1 resumes at 4:
#                two event files, and TensorBoard shows each step once (step 5 and the val
#                loss at 4 of the killed run dropped), every scalar equal to main.log's
#   planted      one CRC byte of a record flipped: the real reader stops there and the
#                check fails, naming what is missing
#   bad_dir      --tensorboard-dir naming a regular file: one error line, exit non-zero
#   full_disk    the event files on a 64 KiB tmpfs with one page left (root, a private mount
#                namespace; else SKIPPED), main.log elsewhere: the job stops at the step whose
#                event did not fit, with one error naming the file; the file ends at a whole
#                record (its framing and CRCs walked by tensorboard_check.py --records, with
#                dev/test/crc32c_reference.py's CRC) and holds every step before that one
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
small_model "$TMP" || fatal "the small model (build, oracle)"
pattern_shard "$TMP/pattern.bin" || fatal "the pattern shard"
BIN=./train_gpt2
COMMON=(-e "$TMP/m.bin" -i "$TMP/pattern.bin" -j "$TMP/pattern.bin" --allow-train-val-overlap -b 2 -t 32 -m 1 -s 0 -l 1e-3)

# ---- straggler
if selected straggler || selected tensorboard; then
    LLMC_TEST_SLOW_RANK=1:400 timeout 120 "${MPIRUN[@]}" -np 2 $BIN "${COMMON[@]}" -x 4 -v 0 --straggler-every 2 \
        -o "$TMP/slow" >"$TMP/slow.log" 2>&1 || fatal "the run with a slow rank" "$TMP/slow.log"
fi
if selected straggler; then
    LOG=$TMP/slow/main.log
    check_match "header: MFU against the measured matmul rate" "^MFU: against this rank's measured matmul rate, [0-9.]+ GFLOP/s" "$TMP/slow.log"
    check "4 train lines with tps mfu comm mem, slow:<ms>@1 with ms >= 400" \
        awk '/ trl:/ { n++; if ($0 !~ / tps:[0-9]+ mfu:[0-9.]+ comm:[0-9.]+ mem:[0-9.]+ slow:/) bad++;
                       split($NF, s, "[:@]"); if (s[3] != 1 || s[2] < 400) bad++ }
             END { print n " train lines, " bad+0 " bad"; exit !(n == 4 && bad == 0) }' "$LOG"
    check "busy_ms lines at steps 2 and 4: busy max rank 1 (>= 400 ms), comm max rank 0" \
        awk '/ busy_ms:/ { n++; steps = steps " " substr($1, 3); split($2, b, "[:/@]"); split($3, c, "[:/@]");
                            print; if (b[4] < 400 || b[5] != 1 || c[5] != 0 || !(b[2] <= b[3] && b[3] <= b[4])) bad++ }
             END { exit !(steps == " 2 4" && bad == 0) }' "$LOG"
    check_match "the step line names the slowest rank" "^step    4/4 .* \| slowest rank 1 [0-9.]+ ms" "$TMP/slow.log"
    check "mfu: = tps x (6N + 6LCT) / (2 ranks x the header's rate); at 2 ranks the median is the mean of min and max" \
        $PY - "$TMP/slow.log" "$LOG" <<'PYEOF'
import re, sys
out, log = open(sys.argv[1]).read(), open(sys.argv[2]).read()
L, C, N = (int(x) for x in re.search(r"GPT-2: L=(\d+) NH=\d+ C=(\d+) .*, (\d+) parameters", out).groups())
rate = float(re.search(r"measured matmul rate, ([0-9.]+) GFLOP/s", out).group(1)) * 1e9
T, world = 32, 2
for tps, mfu in re.findall(r" tps:(\d+) mfu:([0-9.]+)", log):
    want = 100 * int(tps) * (6 * N + 6 * L * C * T) / (world * rate)
    assert abs(float(mfu) - want) <= 5e-3 * want, (tps, mfu, want)  # tps and the rate as printed: rounded
for lo, med, hi in re.findall(r" busy_ms:([0-9.]+)/([0-9.]+)/([0-9.]+)@", log):
    assert abs(float(med) - (float(lo) + float(hi)) / 2) <= 0.0015, (lo, med, hi)
print("N", N, "L", L, "C", C, "rate", rate / 1e9, "GFLOP/s: every mfu and median as computed here")
PYEOF
fi

# ---- TensorBoard's own reader
PEER=
peer_ready() {
    [ -n "$PEER" ] && return 0
    local rc=0
    PEER=$(bash dev/test/tensorboard_peer.sh "$(bash dev/test/tensorboard_peer.sh --pinned)" 2>"$TMP/peer.err") || rc=$?
    [ $rc = 0 ] && return 0
    PEER=
    if [ $rc = 2 ]; then missing PYPI "$1" "$(sed -n "s/^SKIPPED: //p" "$TMP/peer.err" | head -n 1)"
    else not_ok "$1: dev/test/tensorboard_peer.sh exited $rc" "$TMP/peer.err"; fi
    return 1
}
tb_check() {  # tb_check DESC DIR FILES: the event files against DIR/main.log
    PYTHONPATH="$PEER/site" check "$1" $PY dev/test/tensorboard_check.py "$2" "$2/main.log" --files "$3"
}
if selected tensorboard && peer_ready "tensorboard"; then
    tb_check "tensorboard: every scalar of the 2-rank run equals main.log's" "$TMP/slow" 1
fi

# ---- resume: a killed run, then -y 1
if selected resume || selected planted; then
    LLMC_TEST_STOP=step:0:6 timeout 120 $BIN "${COMMON[@]}" -x 6 -n 4 -v 2 -o "$TMP/res" >"$TMP/res1.log" 2>&1 &
    pids=$(wait_stopped "$TMP/res1.log" 1) || fatal "the first run never stopped before step 6" "$TMP/res1.log"
    { kill -9 $pids; wait; } 2>/dev/null  # the shell's "Killed" notice
    timeout 120 $BIN "${COMMON[@]}" -x 6 -n 4 -v 2 -o "$TMP/res" -y 1 >"$TMP/res2.log" 2>&1 ||
        fatal "the resumed run" "$TMP/res2.log"
fi
if selected resume; then
    check_match "the resumed run dropped the killed run's events after step 4" \
        "^tensorboard: .*: dropped 2 events after step 4" "$TMP/res2.log"
    peer_ready resume && tb_check "resume: two segments, each step once, every scalar equals main.log's" "$TMP/res" 2
fi

# ---- planted: a flipped CRC byte
if selected planted && peer_ready planted; then
    mkdir -p "$TMP/bad" && cp "$TMP/res/main.log" "$TMP/bad/"
    first=$(ls "$TMP/res"/events.out.tfevents.* | head -1)
    cp "$first" "$TMP/bad/"
    # The third record's data CRC (its last 4 bytes), found by walking the framing.
    at=$($PY -c "
import struct, sys
d = open(sys.argv[1], 'rb').read(); at = 0
for _ in range(3): at += 16 + struct.unpack_from('<Q', d, at)[0]
print(at - 1)" "$TMP/bad/$(basename "$first")")
    printf '\x5a' | dd of="$TMP/bad/$(basename "$first")" bs=1 seek="$at" conv=notrunc status=none
    $PY - "$TMP/res/main.log" "$TMP/bad/main.log" <<'PYEOF'
import sys  # the bad directory's main.log: the first segment's steps only (those the file holds)
lines = [l for l in open(sys.argv[1]) if int(l.split()[0][2:]) <= 4]
open(sys.argv[2], "w").writelines(lines)
PYEOF
    if PYTHONPATH="$PEER/site" $PY dev/test/tensorboard_check.py "$TMP/bad" "$TMP/bad/main.log" >"$TMP/bad.out" 2>&1; then
        not_ok "planted: a flipped CRC byte went unnoticed" "$TMP/bad.out"
    else
        check_match "planted: a flipped CRC byte: the reader stops, the check fails" "not in TensorBoard" "$TMP/bad.out"
    fi
fi

# ---- a bad --tensorboard-dir
BASE=("${COMMON[@]}" -x 1 -v 0)
touch "$TMP/a_file"
expect_error bad_dir 1 "$TMP/a_file" -- --tensorboard-dir "$TMP/a_file"

# ---- a full disk under the event files
if ! selected full_disk; then :
elif [ "$(id -u)" != 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
    skip "full_disk" "needs root and unshare -m for a small tmpfs (not run here)"
else
    mkdir -p "$TMP/fs"
    unshare -m --propagation private bash -c '
        fs=$1; shift
        mount -t tmpfs -o size=64k tmpfs "$fs" || exit 97
        dd if=/dev/zero of="$fs/fill" bs=4096 count=15 status=none
        timeout 60 "$@" --tensorboard-dir "$fs"
        rc=$?
        cp "$fs"/events.out.tfevents.* "$fs.events" 2>/dev/null
        exit $rc' _ "$TMP/fs" $BIN "${COMMON[@]}" -x 1000 -v 0 -o "$TMP/full" >"$TMP/full.log" 2>&1
    rc=$?
    steps=$(grep -c '^s:[0-9]* trl:' "$TMP/full/main.log" 2>/dev/null)
    records=$($PY dev/test/tensorboard_check.py --records "$TMP/fs.events" 2>&1)
    if [ $rc != 0 ] && [ $rc != 97 ] && [ $rc != 124 ] && [ "$(grep -c 'error:' "$TMP/full.log")" = 1 ] &&
       grep -q "error: cannot write $TMP/fs/events.out.tfevents.*: No space left on device" "$TMP/full.log" &&
       [ "${steps:-0}" -gt 2 ] && [ "$records" = "$steps whole records" ]; then
        ok "full_disk: stopped at step $steps, the event file whole ($records: file_version and steps 1..$((steps - 1)))"
    else
        not_ok "full_disk: exit $rc, $steps steps in main.log, the event file: $records" "$TMP/full.log"
    fi
fi
done_testing
