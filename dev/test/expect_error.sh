# shellcheck shell=bash
# Sourced by the bad-input tests (test_errors.sh, test_files.sh and others), after
# test_lib.sh, whose expect_error checks one case of bad input to $BIN (its log in the
# script's scratch directory $TMP): the fixtures below, made in $TMP.

# ---- fixtures -------------------------------------------------------------------------
# small_model PATH: an oracle model with V=1000 (Vp=1024), L=2, C=64, NH=4, maxT=64, fp32 (v3).
V=1000
small_model() {
    timeout 120 $PY dev/test/gpt2_oracle.py make --out-model "$1" --out-state "$TMP/unused_state.bin" \
        --vocab $V --steps 0 --batch 1 --seq 8 >"$TMP/oracle.log" 2>&1 && rm -f "$TMP/unused_state.bin" && return 0
    sed 's/^/    /' "$TMP/oracle.log"
    return 1
}

# Token shards: header int32[256] = 20240520, 1, n; then n uint16 tokens (ids < V).
# write_shard PATH N [MAGIC] [BAD_INDEX BAD_ID]
write_shard() {
    $PY - "$@" <<'PYEOF'
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
PYEOF
}

# set_int32 FILE INDEX VALUE: writes VALUE (little-endian int32, may be negative) as the
# INDEX-th int32 of FILE, i.e. a header field.
set_int32() {
    $PY -c 'import struct, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(4 * int(sys.argv[2])); f.write(struct.pack("<i", int(sys.argv[3])))' "$@"
}
