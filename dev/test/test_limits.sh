#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# Resource limits end with one error, and leave nothing half-written (docs/testing.md,
# "limits"). ulimit -f: SIGXFSZ would kill the process without a word, so
# the programs ignore it and the write fails with EFBIG: a checkpoint past the limit, a
# main.log line past it (the log keeps whole lines), hf_convert export past it.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
make -s train_gpt2 hf_convert USE_ZERO1=1 >/dev/null || fatal "build train_gpt2 hf_convert"
ARGS=(-e d1 -b 2 -t 32 -v 0 -s 0 -i data/tinyshakespeare_train.bin)
# limited KIB LOG CMD...: CMD under ulimit -f KIB (a subshell), its output in LOG; its exit status
limited() { local kib=$1 log=$2; shift 2; (ulimit -f "$kib" && timeout 120 "$@" >"$log" 2>&1); }
one_error() {  # one_error NAME LOG RC WORD...: exit != 0 (no signal), one error line naming each WORD
    local name=$1 log=$2 rc=$3 word; shift 3
    local n; n=$(grep -c '^error:' "$log")
    for word; do grep '^error:' "$log" | grep -qF -- "$word" || { not_ok "$name: the error names '$word'" "$log"; return; }; done
    if [ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] && [ "$n" = 1 ]; then ok "$name (exit $rc): $(grep '^error:' "$log" | cut -c1-150)"
    else not_ok "$name: exit $rc, $n error lines" "$log"; fi
}

# A checkpoint past the limit (d1's optimizer.bin is 26 MB): no checkpoint_00000002.
limited 20000 "$TMP/ckpt.log" ./train_gpt2 "${ARGS[@]}" -x 2 -n 2 -o "$TMP/ckpt"
one_error "checkpoint past ulimit -f" "$TMP/ckpt.log" $? "ulimit -f" ".checkpoint_00000002.tmp"
check "no checkpoint_00000002 after it" test ! -e "$TMP/ckpt/checkpoint_00000002"

# A run to resume, and its main.log padded to 20 bytes below the limit: the first step line
# of the resumed run does not fit, and is taken back off.
./train_gpt2 "${ARGS[@]}" -x 2 -n 2 -o "$TMP/run" >"$TMP/run.log" 2>&1 || fatal "the first run" "$TMP/run.log"
LIMIT_KIB=30000
$PY - "$TMP/run/main.log" $((LIMIT_KIB * 1024 - 20)) <<'PYEOF'
import sys
path, size = sys.argv[1], int(sys.argv[2])
text = open(path).read()
pad = size - len(text)
line = "# " + "x" * 97 + "\n"
text += line * (pad // len(line))
text += "#" * (size - len(text) - 1) + "\n"
open(path, "w").write(text)
PYEOF
limited $LIMIT_KIB "$TMP/resume.log" ./train_gpt2 "${ARGS[@]}" -x 4 -n 0 -o "$TMP/run" -y 1
one_error "main.log past ulimit -f" "$TMP/resume.log" $? "main.log" "File too large"
check "main.log ends with a whole line ($(stat -c %s "$TMP/run/main.log") bytes)" \
    $PY -c "import sys; d = open(sys.argv[1], 'rb').read(); sys.exit(0 if d.endswith(b'\n') and b's:2 trl' not in d.split(b'\n')[-2] else 1)" "$TMP/run/main.log"
check "no main.log.tmp" test ! -e "$TMP/run/main.log.tmp"

# -y 1 rewrites main.log (dropping what it repeats) through main.log.tmp: past the limit, one
# error, main.log as it was, and no main.log.tmp holding the space.
before=$(md5sum <"$TMP/run/main.log")
limited 20000 "$TMP/rewrite.log" ./train_gpt2 "${ARGS[@]}" -x 4 -n 0 -o "$TMP/run" -y 1
one_error "-y 1's main.log rewrite past ulimit -f" "$TMP/rewrite.log" $? "main.log.tmp" "main.log is unchanged"
check "main.log unchanged, no main.log.tmp" test "$(md5sum <"$TMP/run/main.log")" = "$before" -a ! -e "$TMP/run/main.log.tmp"

# hf_convert export past the limit (model.safetensors is 13 MB): no .tmp left.
limited 5000 "$TMP/hf.log" ./hf_convert export "$TMP/run/checkpoint_00000002/model.bin" "$TMP/hf"
one_error "hf_convert export past ulimit -f" "$TMP/hf.log" $? "model.safetensors" "File too large"
check "no model.safetensors(.tmp) left" test -z "$(ls -A "$TMP/hf" 2>/dev/null | grep safetensors)"
# ulimit -v: the start-up check counts it (what is mapped already taken off): a limit far
# below the need is one error naming it.
(ulimit -v 450000 && timeout 60 ./train_gpt2 "${ARGS[@]}" -x 1 >"$TMP/as.log" 2>&1)
one_error "ulimit -v 450000" "$TMP/as.log" $? "ulimit -v of 439 MiB leaves room for" "raise ulimit -v"

# ulimit -s: below about 200 KiB MPI_Init crashed. A soft limit the hard one lets rise is
# raised (the run trains); a hard limit below 1 MiB is one error before MPI starts.
(ulimit -s 150 && timeout 60 ./train_gpt2 "${ARGS[@]}" -x 1 >"$TMP/stack_hard.log" 2>&1)
one_error "ulimit -s 150 (hard)" "$TMP/stack_hard.log" $? "the stack limit (ulimit -s) is 150 KiB" "ulimit -s 8192"
check "ulimit -S -s 100 under a hard limit of 8 MiB: raised, the run trains" \
    bash -c 'ulimit -S -s 100 && ulimit -H -s 8192 && exec "$@"' _ timeout 60 ./train_gpt2 "${ARGS[@]}" -x 1
done_testing
