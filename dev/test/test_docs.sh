#!/usr/bin/env bash
# test: timeout=900 lane=layer tier=full
# The docs test (make test step docs): the README and docs/ say what the code does.
#   1. static checks (dev/test/docs_check.py): README.md <= 350 lines; every relative link
#      and #anchor resolves; every docs/ page is linked from the README; no paragraph
#      explained twice (shared 8-word runs); every shell block marked: runnable, output,
#      or not runnable with its reason (GPU, network, Slurm, hosts, the suite, long); then
#      the count of each kind per page; and no product file names the CPU execution layer
#   2. negative controls: each check, and the block runner, must report a planted fault
#   3. every page's runnable and output blocks, in document order, as written, with bash -e:
#      README.md in a scratch copy of the tree (the built binaries and data/ copied in where
#      present, so make finds them up to date; built there otherwise), then each docs/ page
#      in a copy of that tree as the README left it; an output block must equal what its
#      command prints (approx: numbers within 0.1%, times any)
# The pinned transformers (scripts/install_hf_client.sh) runs the `runnable: pypi` blocks;
# docs/huggingface.md's install line must be that script's. Marks and rules:
# docs/testing.md, "The docs test". Prints TAP (dev/test/test_lib.sh), a check per page and
# per control; exits 1 on any failure.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
ROOT=$PWD

# run_page PAGE TREE LOGDIR: PAGE's runnable and output blocks in document order, in TREE;
# 0 only if all pass. A block runs as written with bash -e -o pipefail and without the
# runner's thread settings (the docs' commands set what they need); an output block's
# command may read $BLOCK_OUTPUT, what the last runnable block printed (stdout and stderr,
# as a terminal shows them). Without the pinned
# transformers (PyPI unreachable, outside CI) the `runnable: pypi` blocks say SKIPPED.
run_page() {
    local page=$1 tree=$2 logs=$3 n k stem kind status rc=0 last=/dev/null ok TIMEFORMAT='%0R s, %0U+%0S s CPU'
    mkdir -p "$logs"
    n=$($PY "$ROOT/dev/test/docs_check.py" plan "$page" "$logs") || return 1
    for ((k = 1; k <= n; k++)); do
        stem=$logs/$(printf %02d $k)
        kind=$(cat "$stem.kind")
        if [[ $kind == run* ]]; then
            if [ $kind = run-pypi ] && [ -z "$HF_PY" ]; then
                echo "  SKIPPED block $k (the pinned transformers cannot be installed here): $(head -n 1 "$stem.sh")"
                continue
            fi
            # Its wall and CPU seconds (user + system, the block's processes): the CPU time is
            # what the block costs, whatever else the machine runs.
            # A user's environment: no threads set, and product builds (not test_lib.sh's TEST_SEAMS).
            { time (cd "$tree" && env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS -u TEST_SEAMS timeout 600 bash -eo pipefail \
                "$stem.sh" >"$stem.out" 2>&1); } 2>"$stem.time"
            status=$?
            last=$stem.out
            if [ $status -eq 0 ]; then
                echo "  ok   block $k ($(cat "$stem.time")): $(head -n 1 "$stem.sh" | cut -c1-100)"
            else
                echo "  FAIL block $k (exit $status):"
                sed 's/^/    | /' "$stem.sh"
                tail -n 15 "$stem.out" | sed 's/^/    > /'
                rc=1
            fi
            continue
        fi
        (cd "$tree" && BLOCK_OUTPUT=$last bash -c "$(cat "$stem.cmd")") >"$stem.got" 2>"$stem.gerr"
        status=$?
        if [ $kind = exact ]; then
            diff -u "$stem.txt" "$stem.got" >"$stem.why" && ok=1 || ok=0
        else
            $PY "$ROOT/dev/test/docs_check.py" compare "$stem.txt" "$stem.got" >"$stem.why" && ok=1 || ok=0
        fi
        if [ $status -eq 0 ] && [ $ok = 1 ]; then
            echo "  ok   output $k ($kind): $(cat "$stem.cmd")"
        else
            echo "  FAIL output $k ($kind): what '$(cat "$stem.cmd")' prints (exit $status) is not the block's:"
            head -n 20 "$stem.why" "$stem.gerr" | sed 's/^/    | /'
            rc=1
        fi
    done
    [ "$n" -gt 0 ] || echo "  (no runnable or output block)"
    return $rc
}

# ---- 1. static checks ----------------------------------------------------------------------
if $PY dev/test/docs_check.py static . >"$TMP/static.log" 2>&1; then
    ok "static: $(tail -n 1 "$TMP/static.log")"
else
    not_ok "static:"
    sed 's/^/    | /' "$TMP/static.log"
fi
$PY dev/test/docs_check.py summary . | sed 's/^/    /'
# The product uses the CPU execution layer only as a toolchain: no product file names the
# layer's folder or its CUDA_CPU_* variables; what one must do differently on the layer, it
# asks through the layer's macro (__CUDA_CPU__, cuda_cpu/README.md).
PRODUCT="llmc run zero1 tools train_gpt2.c train_gpt2.cu"
layer_mentions() {  # layer_mentions DIR: the lines of DIR's product files that name the layer
    # shellcheck disable=SC2086
    (cd "$1" && grep -rsnIE 'cuda_cpu/|(^|[^_A-Za-z])CUDA_CPU_[A-Z]' $PRODUCT)
}
layer_mentions . >"$TMP/layer.log"
if [ -s "$TMP/layer.log" ]; then
    not_ok "product files ($PRODUCT) name the CPU execution layer:"
    sed 's/^/    | /' "$TMP/layer.log"
else
    ok "no product file ($PRODUCT) names the CPU execution layer's folder or variables"
fi

# ---- the scratch tree ----------------------------------------------------------------------
TREE=$TMP/tree
bash scripts/copy_sources.sh "$TREE"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # Built binaries, build stamps and prepared data (mtimes kept, so make sees them current),
    # and the CPU layer's library where the GPU suite built it (not its rewritten sources or tests).
    git ls-files -o -i --exclude-standard | grep -E '^[^/]+$|^data/[^/]+$|^build/cuda_cpu/' |
        grep -v -e '\.tmp$' -e '^build/cuda_cpu/src/' -e '^build/cuda_cpu/tests/' | tar -cf - -T - | tar -xf - -C "$TREE"
fi

# ---- 2. negative controls: each check must see a planted fault -------------------------------
# control NAME EXPECTED_TEXT: runs the static checks on $CTL (already planted), restores it.
CTL=$TMP/control
control() {
    local name=$1 want=$2
    if $PY dev/test/docs_check.py static "$CTL" >"$TMP/ctl.log" 2>&1; then
        not_ok "control $name: the planted fault passed the checks"
    elif grep -q -- "$want" "$TMP/ctl.log"; then
        ok "control $name: reported"
    else
        not_ok "control $name: not reported as '$want':"
        sed 's/^/    | /' "$TMP/ctl.log"
    fi
    rm -rf "$CTL"
    cp -a "$TREE" "$CTL"
}
cp -a "$TREE" "$CTL"
echo "See [x](no_such_page.md)." >>"$CTL/docs/data.md"
control "broken link" "broken link no_such_page.md"
echo "See [x](zero1.md#no-such-heading)." >>"$CTL/docs/data.md"
control "broken anchor" "no heading #no-such-heading"
echo "# An orphan page" >"$CTL/docs/orphan.md"
control "unlinked page" "does not link docs/orphan.md"
echo "See [x](../docs/nowhere.md)." >>"$CTL/zero1/README.md"
control "broken link in a pointer README" "zero1/README.md:.*broken link"
# A paragraph of zero1.md with one word changed, appended to training.md.
$PY - "$CTL/docs/zero1.md" >>"$CTL/docs/training.md" <<'EOF'
import sys
for p in open(sys.argv[1]).read().split("\n\n"):
    if len(p.split()) >= 40 and p.lstrip()[0] not in "#|`<-":
        print("\n" + p.replace(" the ", " a ", 1))
        break
EOF
control "near-duplicate paragraph" "the same text twice"
seq 400 >>"$CTL/README.md"
control "long README" "lines, more than 350"
printf '%s\n' '' '```' 'make train_gpt2' '```' >>"$CTL/docs/data.md"
control "unmarked shell block" "docs/data.md:.*a shell block without a marker"
printf '%s\n' '' '<!-- not runnable: too tired -->' '```' 'make train_gpt2' '```' >>"$CTL/docs/data.md"
control "not runnable without a known reason" "'not runnable: too tired': the reason must start with one of"
printf '%s\n' '' '## A section the contents line lacks' >>"$CTL/docs/data.md"
control "section missing from the contents line" "section 'A section the contents line lacks' is missing"
rm -rf "$CTL"
mkdir -p "$CTL/llmc" "$CTL/zero1"
echo ' * (cuda_cpu/include/mma.h on the CPU layer)' >"$CTL/llmc/planted.cuh"
echo '#ifdef __CUDA_CPU__  // CUDA_CPU_EXEC=lazy' >"$CTL/zero1/planted.h"
if [ "$(layer_mentions "$CTL" | wc -l)" = 2 ]; then ok "control product files naming the layer: both reported"
else not_ok "control product files naming the layer: not both reported"; layer_mentions "$CTL" | sed 's/^/    | /'; fi
rm -rf "$CTL"
# The runner: each planted page must fail (or, the last, pass) for its one fault.
planted() {  # planted NAME WANT LINES...: a page of LINES through run_page; WANT pass or fail
    local name=$1 want=$2 got=pass
    shift 2
    mkdir -p "$TMP/planted/$name"
    printf '%s\n' '# planted' "$@" >"$TMP/planted/$name/page.md"
    run_page "$TMP/planted/$name/page.md" "$TMP/planted/$name" "$TMP/planted/$name/logs" >"$TMP/ctl.log" 2>&1 || got=fail
    if [ $got = "$want" ]; then ok "control runner, $name: the page must $want, and does"
    else not_ok "control runner, $name: the page must $want, and does not"; sed 's/^/    | /' "$TMP/ctl.log"; fi
}
planted failing_block fail '<!-- runnable -->' '```' 'true' '```' '<!-- runnable -->' '```' 'false' '```'
planted set_e fail '<!-- runnable -->' '```' 'false' 'true' '```'
planted wrong_output fail '<!-- output: echo one -->' '```' 'two' '```'
planted approx_number fail '<!-- runnable -->' '```' 'echo "step 3 | loss 10.450274 | 80.1 ms"' '```' \
    '<!-- output approx: cat "$BLOCK_OUTPUT" -->' '```' 'step 3 | loss 10.550274 | 80.1 ms' '```'
planted approx_rounding_and_times pass '<!-- runnable -->' '```' 'echo "step 3 | loss 10.450274 | 1277.2 ms | 802 tok/s | ms:1277.2"' '```' \
    '<!-- output approx: cat "$BLOCK_OUTPUT" -->' '```' 'step 3 | loss 10.450301 | 80.1 ms | 9000 tok/s | ms:80.1' '```'

# ---- 3. every page's blocks, as written ------------------------------------------------
# The pinned transformers: its install line is docs/huggingface.md's.
hf_client || not_ok "the real client: scripts/install_hf_client.sh failed"
if grep -qxF -- "$(bash scripts/install_hf_client.sh --print)" docs/huggingface.md; then
    ok "docs/huggingface.md's install line is scripts/install_hf_client.sh's: $(bash scripts/install_hf_client.sh --print)"
else
    not_ok "docs/huggingface.md does not show scripts/install_hf_client.sh's install line '$(bash scripts/install_hf_client.sh --print)'"
fi
page() {  # page FILE TREE: one page's blocks, one check, with its time
    local t0=$SECONDS name
    name=$(basename "$1" .md)
    if run_page "$2/$1" "$2" "$TMP/logs_$name"; then ok "$1 ($((SECONDS - t0)) s)"; else not_ok "$1 ($((SECONDS - t0)) s)"; fi
}
page README.md "$TREE"
for f in docs/*.md; do
    rm -rf "$TMP/page"
    cp -a "$TREE" "$TMP/page"
    page "$f" "$TMP/page"
done
rm -rf "$TMP/page"

done_testing
