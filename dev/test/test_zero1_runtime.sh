#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=fast,full
# The zero1 runtime alone: AdamW through buckets and views equals dense AdamW; a step whose
# gradient contributions differ from the ones learned on the first step (one missing, one
# extra) stops with one message naming the parameters and both counts.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
make -s test_zero1_runtime >/dev/null || fatal "build test_zero1_runtime"
check "runtime AdamW through buckets and views == dense AdamW" ./test_zero1_runtime
# contributions MODE EXPECTED: the second step's counts differ from the first's: one message, exit 1.
contributions() {
    local out rc
    out=$(timeout 60 ./test_zero1_runtime "$1" 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "^first step done" <<<"$out" &&
       [ "$(grep -c "^error: " <<<"$out")" = 1 ] && [ "$(grep -cF "error: $2" <<<"$out")" = 1 ]; then
        ok "$1 contribution: one message naming the parameter and both counts"
    else
        not_ok "$1 contribution (rc=$rc)"
        diag "$out"
    fi
}
contributions missing "zero1: gradient contributions at step 2 differ from the first step's, which set when each bucket fires: p0 (1, the first step 2), p1 (0, the first step 1)"
contributions extra "zero1: p0 had 3 gradient contributions at step 2, but 2 at the first step, which set when its bucket fires"
done_testing
