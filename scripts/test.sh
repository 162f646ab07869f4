#!/usr/bin/env bash
# All tests on a fresh machine (the README's second command; CI runs it through .ci/run):
#   1. scripts/install_deps.sh   what the build and the PyTorch oracle need
#   2. make test                 every CPU test (dev/test/run_tests.sh: prove), ends "N passed, M failed, K skipped"
#   3. scripts/check_cuda_build.sh  every CUDA target compiles in FP32 and BF16 (no GPU needed);
#                                3 and 4 run beside 2 at nice 19, in scratch copies of the tree
#   4. scripts/check_openmpi5_build.sh  the trainers build (and the CPU one runs) against the
#                                Open MPI 5 wheel from PyPI; SKIPPED without a network
#   5. make test_gpu             the GPU tests (TAP), ending "# N passed, M failed, K skipped"; SKIPPED
#                                where there is no GPU (the plan "1..0 # SKIP why")
# Exit status: non-zero if any step failed.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
START=$SECONDS
phase() { echo; echo "== [test +$((SECONDS - START)) s] $*"; }
# counts LOG: passed, failed, skipped from LOG's last count line "N passed, M failed, K skipped":
# make test's closing line (dev/test/run_tests.sh's, from prove's summaries), or make test_gpu's
# after its TAP plan, a comment (dev/test/test_lib.sh's done_testing).
counts() {
    local line
    line=$(grep -E '^(# )?[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$1" | tail -n 1)
    set -- ${line#\# }  # N passed, M failed, K skipped
    echo "${1:-0} ${3:-0} ${5:-0}"
}

phase "dependencies"
bash scripts/install_deps.sh || { echo "test: error: scripts/install_deps.sh failed"; exit 1; }

# Steps 3 and 4 build in scratch copies of the tree, so they run beside make test, at the
# lowest priority: they take the cores make test's waits leave idle (its deadlines, its
# sleeping ranks) and barely slow its timed checks.
export PATH=$PATH:${CUDA_HOME:-/usr/local/cuda}/bin
side=$(mktemp -d)
log=$side/log
trap 'rm -rf "$side"' EXIT
if command -v nvcc >/dev/null 2>&1; then
    nice -n 19 bash scripts/check_cuda_build.sh >"$side/cuda.log" 2>&1 &
    cuda_pid=$!
fi
nice -n 19 bash scripts/check_openmpi5_build.sh >"$side/mpi5.log" 2>&1 &
mpi5_pid=$!

phase "make test (steps 3 and 4 beside it, at nice 19)"
make test 2>&1 | tee "$log"
tests=${PIPESTATUS[0]}
read -r passed failed skipped < <(counts "$log")

phase "CUDA compile check"
if [ -n "${cuda_pid:-}" ]; then
    wait $cuda_pid
    cuda=$?
    cat "$side/cuda.log"
    if [ $cuda -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
else
    echo "test: CUDA compile check SKIPPED: no nvcc (install the CUDA toolkit to compile train_gpt2cu)"
    cuda=0
    skipped=$((skipped + 1))
fi

phase "build against Open MPI 5 (PyPI wheel)"
wait $mpi5_pid
mpi5=$?
tee "$log" <"$side/mpi5.log"
if [ $mpi5 -ne 0 ]; then
    failed=$((failed + 1))
elif grep -q "^SKIPPED" "$log"; then
    skipped=$((skipped + 1))
else
    passed=$((passed + 1))
fi

phase "make test_gpu"
make test_gpu 2>&1 | tee "$log"
gpu=${PIPESTATUS[0]}
if grep -q '^1\.\.0 # SKIP' "$log"; then  # TAP's whole-script skip: no GPU
    skipped=$((skipped + 1))
else
    read -r p f s < <(counts "$log")
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    [ $gpu -ne 0 ] && [ "$f" = 0 ] && failed=$((failed + 1))
fi

phase "done: make test $tests, CUDA build $cuda, Open MPI 5 build $mpi5, make test_gpu $gpu"
[ $tests -ne 0 ] && [ $failed -eq 0 ] && failed=1  # a broken runner still fails
echo "total: $passed passed, $failed failed, $skipped skipped"
[ $tests -eq 0 ] && [ $cuda -eq 0 ] && [ $mpi5 -eq 0 ] && [ $gpu -eq 0 ]
