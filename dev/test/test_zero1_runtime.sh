#!/usr/bin/env bash
# The zero1 runtime alone: AdamW through buckets and views equals dense AdamW; a bucket
# whose gradients never all became final stops the step with one message naming them.
set -u
cd "$(dirname "$0")/../.."
make -s test_zero1_runtime >/dev/null || { echo "FAIL build"; exit 1; }
./test_zero1_runtime || exit 1
out=$(timeout 60 ./test_zero1_runtime unfired 2>&1)
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
   [ "$(grep -c "error: zero1: bucket 0 did not fire at step 0: gradients never became final: p0 (1 of 2), p1 (0 of 1)" <<<"$out")" = 1 ]; then
    echo "PASS a bucket that never fires names its unfinished parameters"
else
    echo "FAIL unfired bucket (rc=$rc): $out"
    exit 1
fi
