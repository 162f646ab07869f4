#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# run/crc32c.h: the unit tests in ./test_crc32c (known vectors, SSE4.2 == portable,
# incremental, combine), then crc32c_file on files of awkward sizes against two
# independent Python implementations: a bit-at-a-time CRC from the definition, and the
# crcmod package where it is installed (said loudly when it is not).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
[ -x ./test_crc32c ] || fatal "./test_crc32c is built"

check "test_crc32c: known vectors, SSE4.2 == portable, incremental, combine" ./test_crc32c

# Random files (seeded) of lengths around the 8-byte steps, plus the classic check string.
$PY - "$TMP" <<'PYEOF' || fatal "write the test files"
import os, random, sys
rng = random.Random(20241129)
for n in (0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4099, 20011):
    with open(os.path.join(sys.argv[1], "rand_%05d.bin" % n), "wb") as f:
        f.write(bytes(rng.getrandbits(8) for _ in range(n)))
with open(os.path.join(sys.argv[1], "check.txt"), "wb") as f:
    f.write(b"123456789")
PYEOF
files=("$TMP"/*)
./test_crc32c "${files[@]}" >"$TMP/c.out" || fatal "test_crc32c FILE..." "$TMP/c.out"
check_match 'crc32c_file of "123456789" is e3069283' "^e3069283 9 .*check.txt$" "$TMP/c.out"
for ref in bitwise crcmod; do
    $PY dev/test/crc32c_reference.py $ref "${files[@]}" >"$TMP/$ref.out"
    rc=$?
    if [ $ref = crcmod ] && [ $rc = 3 ]; then
        skip "crc32c_file == Python crcmod reference" "the Python package crcmod is not installed; bitwise reference only"
        continue
    fi
    if [ $rc = 0 ] && [ -s "$TMP/$ref.out" ] && cmp -s "$TMP/c.out" "$TMP/$ref.out"; then
        ok "crc32c_file == Python $ref reference on ${#files[@]} files"
    else
        not_ok "crc32c_file == Python $ref reference (rc $rc)"
        diag "$(diff "$TMP/c.out" "$TMP/$ref.out" | head)"
    fi
done
done_testing
