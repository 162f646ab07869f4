#!/usr/bin/env bash
# `make test`: builds what the CPU tests need, prepares the data, runs every test.
# `make test-fast`: the fast tier (FAST_STEPS below; under 2 minutes on 2 cores from a built
# tree): every module once, with LLMC_TEST_TIER=fast, under which the scripts run the rows
# they name with fast_rows (dev/test/test_lib.sh):
#   the CPU kernels; zero1's layout, runtime and test devices (deferred, hazard); the
#   trainer against the PyTorch oracle at np 1 and 2 (-z 0 and -z 1) and its negative
#   control; ZeRO-1 against replicated at np 2 on the deferred device with the hazard
#   communicator, and at np 3 averaging in the collective; the oracle at np 2 under the
#   hazards; a planted NaN; a trace's overlap (and trace_overlap.py's self-test); a
#   representative subset of bad input; a checkpoint resumed at the same and at another
#   rank count (np 2 -> 4); the GPU trainer on the CPU execution layer (test_gpt2cu FP32
#   with ZeRO-1 over the layer's NCCL, 2 oracle steps; built incrementally in a copy).
#
#   dev/test/run_tests.sh              # everything
#   dev/test/run_tests.sh --fast       # the fast tier
#   dev/test/run_tests.sh oracle errors  # only the tests with these names (--fast: of the fast tier)
#
# Every test runs under `timeout`, with its output in a log file under $LOG_DIR (a fresh
# temp dir unless set). Prints, as each step ends (two lanes run at once: see JOBS below),
# `PASS name (12.3 s)` with the log's SKIPPED lines, or `SKIPPED name (reason)` for a script
# whose TAP plan is the whole-script skip `1..0 # SKIP` (dev/test/test_lib.sh), or
# `FAIL name` with its `not ok` lines and the log's tail; then exactly one summary line
# `N passed, M failed, K skipped`; exits 1 if anything failed. A test whose script or
# binary is missing is a FAIL, never a skip. Build and data steps count as tests.
set -u
cd "$(dirname "$0")/../.." || exit 1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export LLMC_TEST_TIER=full

# ---- the list: one line per step: NAME TIMEOUT_SECONDS [VAR=value ...] COMMAND... ------
# Build steps first (a failed build is reported and the tests still run, to show the damage).
# Words are split on blanks (no quoting); a missing script, binary or command is a FAIL.
STEPS=(
  "build           600 make -j2 train_gpt2 test_gpt2 test_zero1 USE_ZERO1=1"
  "build_more      600 make -j2 train_gpt2_plain prepro_text prepro_corpus zero1_plan gpt2_cost test_zero1_layout test_kernels test_crc32c test_zero1_devices test_mpi_wait hf_convert"
  "data            300 make data"
  "build_stamp     120 dev/test/test_build_stamp.sh"
  "tokenizer       300 dev/test/test_tokenizer.sh"
  "corpus          120 dev/test/test_corpus.sh"
  "corpus_dir      120 dev/test/test_corpus_dir.sh"
  "kernels         120 ./test_kernels"
  "blas_cores      120 dev/test/test_blas_cores.sh"
  "threads         300 dev/test/test_threads.sh"
  "crc32c          120 dev/test/test_crc32c.sh"
  "zero1_layout    120 ./test_zero1_layout"
  "zero1_plan      300 dev/test/test_zero1_plan.sh"
  "megatron_layout 300 dev/test/test_megatron_layout.sh"
  "gpt2_cost       120 dev/test/test_gpt2_cost.sh"
  "compiler_report 120 dev/test/test_compiler_report.sh"
  "zero1_runtime   120 dev/test/test_zero1_runtime.sh"
  "zero1_devices   300 dev/test/test_zero1_devices.sh"
  "oracle          300 dev/test/test_oracle.sh"
  "multirank       300 TRAIN_BIN=./train_gpt2_plain dev/test/test_multirank.sh"
  # No multirank_z0 (the plugin build at -z 0): its replicated mode is proven element by
  # element against the plain path by test_zero1.sh's "replicated through the runtime" rows
  # (np 1-4), and the trainer's rank-strided data and accumulation by multirank and
  # multirank_z1.
  "multirank_z1    300 Z=1 dev/test/test_multirank.sh"
  "errors          300 dev/test/test_errors.sh"
  "hellaswag       120 dev/test/test_hellaswag.sh"
  "memory_check    120 dev/test/test_memory_check.sh"
  "files           300 dev/test/test_files.sh"
  "zero1           600 dev/test/test_zero1.sh"
  "dp_invariant    300 dev/test/test_dp_invariant.sh"
  "numeric_coretypes 600 dev/test/test_numeric_coretypes.sh"
  "checkpoint      420 dev/test/test_checkpoint.sh"
  "shuffle         300 dev/test/test_shuffle.sh"
  "skip_batches    120 dev/test/test_skip_batches.sh"
  "outliers        300 dev/test/test_outliers.sh"
  "nonfinite       300 dev/test/test_nonfinite.sh"
  "checkpoint_io   300 dev/test/test_checkpoint_io.sh"
  "paths           300 dev/test/test_paths.sh"
  "multihost       300 dev/test/test_multihost.sh"
  "faults          300 dev/test/test_faults.sh"
  "plot_loss       120 dev/test/test_plot_loss.sh"
  "hf              120 dev/test/test_hf.sh"
  "recipe          120 dev/test/test_recipe.sh"
  "cuda_cpu_layer  600 dev/cuda_cpu/tests/run_layer_tests.sh"
  "gpu_on_cpu     1800 CUDA_ON_CPU=1 dev/test/run_gpu_tests.sh"
  # After the GPU suite, whose CPU-layer library the docs' layer build reuses.
  "docs            900 dev/test/test_docs.sh"
  "layer_tools     900 dev/test/test_layer_tools.sh"
  "gpu_mutations   900 dev/test/test_gpu_mutations.sh"
)
# -------------------------------------------------------------------------------------
# The fast tier (make test-fast): every module once. USE_ZERO1=1 for every make below, so
# that no step's make rewrites the build stamp and relinks the trainers (warm runs stay warm).
FAST_STEPS=(
  "data            300 make data"
  "build           600 make -j2 train_gpt2 test_gpt2 test_zero1 test_kernels test_zero1_layout test_zero1_runtime test_zero1_devices USE_ZERO1=1"
  "docs_static     60 python3 dev/test/docs_check.py static ."
  "kernels         120 ./test_kernels"
  "zero1_layout    120 ./test_zero1_layout"
  "zero1_runtime   120 dev/test/test_zero1_runtime.sh"
  "zero1_devices   300 dev/test/test_zero1_devices.sh"
  "oracle          300 dev/test/test_oracle.sh"
  "zero1           300 dev/test/test_zero1.sh"
  "dp_invariant    120 dev/test/test_dp_invariant.sh"
  "errors          300 dev/test/test_errors.sh"
  "checkpoint      300 dev/test/test_checkpoint.sh"
  "nonfinite       120 dev/test/test_nonfinite.sh"
  "gpu_smoke       900 dev/test/test_gpu_smoke.sh"
)
if [ "${1:-}" = --fast ]; then
    shift
    STEPS=("${FAST_STEPS[@]}")
    export USE_ZERO1=1 LLMC_TEST_TIER=fast
fi
# Two lanes where the machine has two cores or more (LLMC_TEST_JOBS=1: one): the steps that
# run CUDA code on the CPU execution layer, one after another in their order, beside all the
# others in theirs. Each lane builds only its own targets in the tree (the layer's
# library and GPU stamp; the CPU trainers' are built by the steps before). Those first steps
# build, prepare the data or switch the build stamps, so they run before both lanes, alone.
ALONE=" build build_more data build_stamp "
LAYER_LANE=" cuda_cpu_layer gpu_on_cpu docs layer_tools gpu_mutations gpu_smoke "
JOBS=${LLMC_TEST_JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 1)}  # nproc obeys OMP_*

LOG_DIR=${LOG_DIR:-$(mktemp -d /tmp/llmc_tests.XXXXXX)}
mkdir -p "$LOG_DIR"
TAIL_LINES=${TAIL_LINES:-25}
echo "test logs: $LOG_DIR"
RESULTS=$LOG_DIR/.results   # one line per step: PASS|FAIL|SKIPPED NAME
: >"$RESULTS"

now() { date +%s.%N; }

selected() {  # no arguments: everything; else only the named steps
    [ $# -le 1 ] && return 0
    local name=$1; shift
    for want in "$@"; do [ "$want" = "$name" ] && return 0; done
    return 1
}

# report NAME: prints the step's report ($LOG_DIR/NAME.report) whole, one lane at a time.
report() { flock "$LOG_DIR/.print" cat "$LOG_DIR/$1.report"; }

# run_step LINE: runs one step of the list, writes its result line and prints its report.
run_step() {
    local name limit cmd log words envs exe t0 rc secs why out skip_plan
    read -r name limit cmd <<<"$1"
    log="$LOG_DIR/$name.log" out="$LOG_DIR/$name.report"
    read -r -a words <<<"$cmd"
    envs=()   # leading VAR=value words set the environment of that step only
    while [ ${#words[@]} -gt 0 ] && [[ ${words[0]} == [A-Za-z_]*=* ]]; do envs+=("${words[0]}"); words=("${words[@]:1}"); done
    exe=${words[0]:-}
    # A missing test (script or binary) is a failure: the list says it must exist.
    if { [[ $exe == */* ]] && [ ! -e "$exe" ]; } || { [[ $exe != */* ]] && ! command -v "$exe" >/dev/null 2>&1; }; then
        echo "missing: $exe does not exist" >"$log"
        echo "FAIL $name (missing: $exe)" >"$out"
        echo "FAIL $name" >>"$RESULTS"
        report "$name"
        return
    fi
    # bash for scripts, so a lost executable bit does not turn into a spurious failure
    [[ $exe == *.sh ]] && words=(bash "${words[@]}")
    t0=$(now)
    env "${envs[@]}" timeout --kill-after=10 "$limit" "${words[@]}" >"$log" 2>&1
    rc=$?
    secs=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
    skip_plan=$(grep -m1 '^1\.\.0 # SKIP' "$log")  # TAP's whole-script skip
    if [ $rc -eq 0 ] && [ -n "$skip_plan" ]; then
        echo "SKIPPED $name (${skip_plan#1..0 # SKIP }; $secs s)" >"$out"
        echo "SKIPPED $name" >>"$RESULTS"
    elif [ $rc -eq 0 ]; then
        { echo "PASS $name ($secs s)"
          grep -h 'SKIPPED' "$log" | head -n 5 | sed 's/^ */    /'  # what did not run, loudly
        } >"$out"
        echo "PASS $name" >>"$RESULTS"
    else
        why="exit $rc"
        [ $rc -eq 124 ] || [ $rc -eq 137 ] && why="timed out after $limit s"
        { echo "FAIL $name ($why, $secs s; log $log)"
          grep -h '^not ok ' "$log" | head -n 10 | sed 's/^/    /'  # the TAP checks that failed
          tail -n "$TAIL_LINES" "$log" | sed 's/^/    | /'
        } >"$out"
        echo "FAIL $name" >>"$RESULTS"
    fi
    report "$name"
}

# lane WHICH ARGS...: the selected steps of one lane (alone, layer, cpu, all) in list order.
lane() {
    local which=$1 line name in_layer
    shift
    for line in "${STEPS[@]}"; do
        read -r name _ <<<"$line"
        selected "$name" "$@" || continue
        in_layer=0; [[ $LAYER_LANE == *" $name "* ]] && in_layer=1
        case $which in
        alone) [[ $ALONE == *" $name "* ]] || continue ;;
        layer) [ $in_layer = 1 ] || continue ;;
        cpu) [[ $ALONE == *" $name "* ]] || [ $in_layer = 1 ] && continue ;;
        esac
        run_step "$line"
    done
}

if [ "$JOBS" -ge 2 ]; then
    echo "two lanes: the CUDA-on-CPU steps beside the others, after the build and data steps (LLMC_TEST_JOBS=1: one lane)"
    lane alone "$@"
    lane layer "$@" &
    lane cpu "$@"
    wait
else
    lane all "$@"
fi

passed=$(grep -c '^PASS ' "$RESULTS")
failed=$(grep -c '^FAIL ' "$RESULTS")
skipped=$(grep -c '^SKIPPED ' "$RESULTS")
[ "$failed" -gt 0 ] && echo "failed: $(awk '$1 == "FAIL" { printf "%s%s", s, $2; s = " " }' "$RESULTS")"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
