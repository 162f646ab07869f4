# shellcheck shell=bash
# Sourced by the layer's test scripts, so that they need nothing outside the layer's folder.
# Prints TAP (the Test Anything Protocol, version 13), which any TAP harness reads:
#   ok DESC / not_ok DESC [LOG]   a check that passed / failed (LOG's tail on stderr)
#   skip DESC REASON              a check that cannot run here (also a "# SKIPPED:" line)
#   skip_all REASON               the whole script cannot run here (before any check): exits 0
#   diag MSG                      a "# MSG" line on stderr
#   done_testing                  the plan 1..N; exits 1 iff a check failed
# and sets: the layer's folder as working directory ($LAYER), where its tests are built
# ($TB), one thread per process, and mpirun with the flags a root machine with few cores
# needs ($MPIRUN).
LAYER=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TB=$(dirname "$LAYER")/build/cuda_cpu/tests
cd "$LAYER" || exit 1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)

TAP_COUNT=0 TAP_FAILED=0
echo "TAP version 13"
ok() { TAP_COUNT=$((TAP_COUNT + 1)); echo "ok $TAP_COUNT - $1"; }
not_ok() {
    TAP_COUNT=$((TAP_COUNT + 1)) TAP_FAILED=$((TAP_FAILED + 1))
    echo "not ok $TAP_COUNT - $1"
    [ -n "${2:-}" ] && [ -e "$2" ] && tail -n 15 "$2" | sed 's/^/#   | /' >&2
    return 0
}
skip() { ok "$1 # SKIP $2"; echo "# SKIPPED: $1: $2"; }
skip_all() { echo "1..0 # SKIP $1"; echo "# SKIPPED: $1"; exit 0; }
diag() { echo "$*" | sed 's/^/# /' >&2; }
done_testing() {
    [ $TAP_COUNT = 0 ] && not_ok "the script ran no check"
    echo "1..$TAP_COUNT"
    [ $TAP_FAILED = 0 ] || diag "$TAP_FAILED of $TAP_COUNT checks failed"
    exit $((TAP_FAILED > 0))
}
