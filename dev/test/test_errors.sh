#!/usr/bin/env bash
# Bad input to ./train_gpt2 (docs/design.md, "Bad input"): every case must end with an exit code
# != 0 (not a timeout, not a signal), exactly one `error:` line that names the problem
# (a keyword), and no hang (timeout 60 s). Some cases also under mpirun -np 2, where the
# message must appear exactly once (rank 0 speaks for an error every rank sees).
# A control run with the same fixtures and no defect must succeed, so each failure is
# caused by the one defect that case introduces.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
BIN=./train_gpt2

TMP=$(mktemp -d /tmp/test_errors.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
failed=0
ok() { echo "  ok   $*"; }
bad() { echo "  FAIL $*"; failed=$((failed + 1)); }

[ -x $BIN ] || { echo "FAIL test_errors: $BIN is not built"; exit 1; }

# ---- fixtures ------------------------------------------------------------------------
# A small model: V=1000 (Vp=1024), L=2, C=64, NH=4, maxT=64, fp32, v3.
V=1000
timeout 120 $PY dev/test/gpt2_oracle.py make --out-model "$TMP/model.bin" --out-state "$TMP/unused.bin" \
    --vocab $V --steps 0 --batch 1 --seq 8 >"$TMP/oracle.log" 2>&1 \
    || { cat "$TMP/oracle.log"; echo "FAIL test_errors: the oracle could not write a model"; exit 1; }
MODEL=$TMP/model.bin
MODEL_BYTES=$(stat -c %s "$MODEL")

# Token shards: header int32[256] = 20240520, 1, n; then n uint16 tokens.
# write_shard PATH N [MAGIC] [BAD_INDEX BAD_ID]
write_shard() {
    $PY - "$@" <<'EOF'
import struct, sys
path, n = sys.argv[1], int(sys.argv[2])
magic = int(sys.argv[3]) if len(sys.argv) > 3 else 20240520
toks = [(i * 7919) % 1000 for i in range(n)]          # ids < V = 1000
if len(sys.argv) > 5:
    toks[int(sys.argv[4])] = int(sys.argv[5])
hdr = [0] * 256
hdr[0], hdr[1], hdr[2] = magic, 1, n
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack("<%dH" % n, *toks))
EOF
}
write_shard "$TMP/good.bin" 4096
write_shard "$TMP/badmagic.bin" 4096 12345678
write_shard "$TMP/badtoken.bin" 4096 20240520 3000 $V        # id == V: the first invalid id
write_shard "$TMP/bigtoken.bin" 4096 20240520 4095 65535     # the largest uint16, at the end
write_shard "$TMP/short.bin" 40                              # fewer tokens than one step needs
head -c $((1024 + 2 * 4096 - 10)) "$TMP/good.bin" >"$TMP/truncshard.bin"
cp "$MODEL" "$TMP/badmagic_model.bin"
printf '\x01\x02\x03\x04' | dd of="$TMP/badmagic_model.bin" bs=1 seek=0 conv=notrunc status=none
cp "$MODEL" "$TMP/badversion_model.bin"
printf '\x07\x00\x00\x00' | dd of="$TMP/badversion_model.bin" bs=1 seek=4 conv=notrunc status=none
head -c $((MODEL_BYTES - 4096)) "$MODEL" >"$TMP/trunc_model.bin"
head -c 100 "$MODEL" >"$TMP/tiny_model.bin"
cp "$MODEL" "$TMP/badheads_model.bin"        # header[5] = NH = 3: C=64 is not divisible by it
printf '\x03\x00\x00\x00' | dd of="$TMP/badheads_model.bin" bs=1 seek=20 conv=notrunc status=none
: >"$TMP/not_a_dir"

# Arguments of a good run; each case overrides one thing (later flags win).
BASE=(-e "$MODEL" -i "$TMP/good.bin" -j "$TMP/good.bin" -b 2 -t 32 -x 1 -v 0 -s 0 -z 0)

# ---- the runner ----------------------------------------------------------------------
# check NAME NP KEYWORD -- extra trainer arguments
check() {
    local name=$1 np=$2 keyword=$3; shift 4
    local log="$TMP/$name.log" rc
    if [ "$np" = 1 ]; then
        timeout --kill-after=5 60 $BIN "${BASE[@]}" "$@" >"$log" 2>&1
    else
        timeout --kill-after=5 60 "${MPIRUN[@]}" -np "$np" $BIN "${BASE[@]}" "$@" >"$log" 2>&1
    fi
    rc=$?
    local problems=()
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then problems+=("HANG: killed after 60 s");
    elif [ $rc -eq 0 ]; then problems+=("exit code 0");
    elif [ $rc -ge 128 ]; then problems+=("killed by a signal (exit $rc)"); fi
    grep -qE 'Segmentation fault|core dumped|exited on signal|Aborted \(core' "$log" && problems+=("crash text in the output")
    local n
    n=$(grep -c 'error:' "$log")
    [ "$n" = 1 ] || problems+=("$n 'error:' lines, expected exactly 1")
    grep 'error:' "$log" | grep -qF -- "$keyword" || problems+=("the error line does not mention '$keyword'")
    if [ "$np" != 1 ] && grep -q '^\[rank [1-9]' "$log"; then problems+=("a non-zero rank also reported it"); fi
    if [ ${#problems[@]} -eq 0 ]; then
        ok "$name (np=$np, exit $rc): $(grep 'error:' "$log" | head -1 | cut -c1-110)"
    else
        bad "$name (np=$np): $(printf "%s; " "${problems[@]}")"
        sed 's/^/       | /' "$log" | tail -n 15
    fi
}

t0=$SECONDS
# Control: the fixtures themselves are fine.
if timeout 60 $BIN "${BASE[@]}" -o "$TMP/control_out" >"$TMP/control.log" 2>&1 && ! grep -q 'error:' "$TMP/control.log"; then
    ok "control: a good run with the same fixtures succeeds"
else
    bad "control: the good run failed, so the cases below prove nothing"
    tail -n 15 "$TMP/control.log" | sed 's/^/       | /'
fi
if timeout 60 "${MPIRUN[@]}" -np 2 $BIN "${BASE[@]}" >"$TMP/control2.log" 2>&1; then
    ok "control: the same good run under mpirun -np 2 succeeds"
else
    bad "control: the good run under mpirun -np 2 failed"
    tail -n 15 "$TMP/control2.log" | sed 's/^/       | /'
fi

# model files
check missing_model        1 "nope.bin"                 -- -e "$TMP/nope.bin"
check model_wrong_magic    1 "magic"                    -- -e "$TMP/badmagic_model.bin"
check model_bad_version    1 "version 7"                -- -e "$TMP/badversion_model.bin"
check model_truncated      1 "truncated"                -- -e "$TMP/trunc_model.bin"
check model_tiny           1 "tiny_model.bin"           -- -e "$TMP/tiny_model.bin"
check model_C_not_div_NH   1 "not divisible by NH=3"    -- -e "$TMP/badheads_model.bin"
# a tokenizer file that exists but is not one (a missing one is only a warning, as in llm.c)
check bad_tokenizer        1 "not an llm.c tokenizer"   -- -s 1 --tokenizer "$TMP/good.bin"
# token shards
check missing_shard        1 "no token shard matches"   -- -i "$TMP/none_*.bin"
check missing_val_shard    1 "no token shard matches"   -- -j "$TMP/none_val.bin" -v 1
check shard_wrong_magic    1 "not a token shard"        -- -i "$TMP/badmagic.bin"
check shard_truncated      1 "truncated"                -- -i "$TMP/truncshard.bin"
check shard_token_eq_V     1 "vocabulary size $V"       -- -i "$TMP/badtoken.bin"
check shard_token_65535    1 "65535"                    -- -i "$TMP/bigtoken.bin"
check val_shard_bad_token  1 "badtoken.bin"             -- -j "$TMP/badtoken.bin" -v 1
check shard_too_short      1 "short.bin"                -- -i "$TMP/short.bin"
# configuration
check T_exceeds_maxT       1 "maximum sequence length"  -- -t 128
check d_not_divisible      1 "-d 100"                   -- -d 100
check unknown_flag         1 "--bogus"                  -- --bogus 3
check flag_missing_value   1 "-b needs a value"         -- -b
check flag_out_of_range    1 "-z 7 is out of range"     -- -z 7
check flag_not_a_number    1 "-b expects an integer"    -- -b four
check lr_nan               1 "-l nan"                   -- -l nan
check eps_nan              1 "--eps nan"                -- --eps nan
check output_not_a_dir     1 "not_a_dir"                -- -o "$TMP/not_a_dir"
# -z 1 on a build without the plugin (make train_gpt2_plain builds one under its own name).
make -s train_gpt2_plain >/dev/null 2>&1 || bad "could not build ./train_gpt2_plain"
if [ -x ./train_gpt2_plain ]; then
    BIN=./train_gpt2_plain check z1_without_plugin 1 "USE_ZERO1=1"  -- -z 1
fi

# under mpirun -np 2: one message, from rank 0
check missing_model        2 "nope.bin"                 -- -e "$TMP/nope.bin"
check model_truncated      2 "truncated"                -- -e "$TMP/trunc_model.bin"
check shard_wrong_magic    2 "not a token shard"        -- -i "$TMP/badmagic.bin"
check shard_token_eq_V     2 "vocabulary size $V"       -- -i "$TMP/badtoken.bin"
check d_not_divisible_np2  2 "B*T*ranks = 1*32*2"       -- -b 1 -d 96
check unknown_flag         2 "--bogus"                  -- --bogus
check flag_out_of_range    2 "-z 7 is out of range"     -- -z 7
check T_exceeds_maxT       2 "maximum sequence length"  -- -t 128

if [ $failed -eq 0 ]; then
    echo "PASS test_errors ($((SECONDS - t0)) s)"
    exit 0
fi
echo "FAIL test_errors: $failed case(s) failed"
exit 1
