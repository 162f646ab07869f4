#!/usr/bin/env bash
# The docs test (make test step docs): the README and docs/ say what the code does.
#   1. static checks (dev/test/docs_check.py): README.md <= 350 lines; every relative link
#      and #anchor resolves; every docs/ page is linked from the README; no paragraph
#      explained twice (shared 8-word runs)
#   2. negative controls: each check, and the block runner, must report a planted fault
#   3. README.md's blocks marked <!-- runnable --> run as written, in order, with bash -e,
#      in a scratch copy of the tree (the built binaries and data/ copied in where present,
#      so make finds them up to date; built there otherwise)
#   4. blocks marked <!-- output: COMMAND --> in README.md and docs/*.md equal COMMAND's
#      output, run in that scratch copy
# Marks and rules: docs/testing.md, "The docs test". Prints PASS/FAIL lines, then
# "N passed, M failed"; exits 1 on any failure.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
ROOT=$PWD
WORK=$(mktemp -d /tmp/llmc_docs.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
passed=0
failed=0
pass() { echo "PASS $*"; passed=$((passed + 1)); }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }

# run_blocks README TREE LOGDIR: runs README's runnable blocks in TREE; 0 only if all pass.
run_blocks() {
    local readme=$1 tree=$2 logs=$3 n b status rc=0
    mkdir -p "$logs"
    n=$($PY "$ROOT/dev/test/docs_check.py" blocks "$readme" "$logs") || return 1
    [ "$n" -gt 0 ] || { echo "no runnable block in $readme"; return 1; }
    for b in "$logs"/block_*.sh; do
        # The README's own commands set the threads they need; the runner's must not leak in.
        (cd "$tree" && env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS timeout 600 bash -eo pipefail "$b") \
            >"${b%.sh}.log" 2>&1
        status=$?
        if [ $status -eq 0 ]; then
            echo "  ok   $(basename "$b"): $(head -n 1 "$b")"
        else
            echo "  FAIL $(basename "$b") (exit $status):"
            sed 's/^/    | /' "$b"
            tail -n 15 "${b%.sh}.log" | sed 's/^/    > /'
            rc=1
        fi
    done
    return $rc
}

# check_outputs TREE LOGDIR FILE...: every output block equals its command's output in TREE.
check_outputs() {
    local tree=$1 logs=$2 f c exe rc=0 count=0
    shift 2
    mkdir -p "$logs"
    for f in "$@"; do
        rm -f "$logs"/output_*
        $PY "$ROOT/dev/test/docs_check.py" outputs "$f" "$logs" >/dev/null || return 1
        for c in "$logs"/output_*.cmd; do
            [ -e "$c" ] || continue
            count=$((count + 1))
            exe=$(awk '{ print $1 }' "$c")
            [[ $exe == ./* ]] && (cd "$tree" && make -s "${exe#./}" >/dev/null 2>&1)
            if (cd "$tree" && bash -c "$(cat "$c")") >"${c%.cmd}.out" 2>"${c%.cmd}.err" &&
                diff -u "${c%.cmd}.txt" "${c%.cmd}.out" >"${c%.cmd}.diff"; then
                echo "  ok   $f: $(cat "$c")"
            else
                echo "  FAIL $f: the output of '$(cat "$c")' is not the block's (- block, + now):"
                head -n 20 "${c%.cmd}.diff" "${c%.cmd}.err" | sed 's/^/    | /'
                rc=1
            fi
        done
    done
    [ $count -gt 0 ] || { echo "no output block found"; return 1; }
    return $rc
}

# ---- 1. static checks ----------------------------------------------------------------------
if $PY dev/test/docs_check.py static . >"$WORK/static.log" 2>&1; then
    pass "static: $(tail -n 1 "$WORK/static.log")"
else
    fail "static:"
    sed 's/^/    | /' "$WORK/static.log"
fi

# ---- the scratch tree ----------------------------------------------------------------------
TREE=$WORK/tree
bash scripts/copy_sources.sh "$TREE"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # Built binaries, build stamps and prepared data (mtimes kept, so make sees them current).
    git ls-files -o -i --exclude-standard | grep -E '^[^/]+$|^data/[^/]+$' | grep -v '\.tmp$' |
        tar -cf - -T - | tar -xf - -C "$TREE"
fi

# ---- 2. negative controls: each check must see a planted fault -------------------------------
# control NAME EXPECTED_TEXT: runs the static checks on $CTL (already planted), restores it.
CTL=$WORK/control
control() {
    local name=$1 want=$2
    if $PY dev/test/docs_check.py static "$CTL" >"$WORK/ctl.log" 2>&1; then
        fail "control $name: the planted fault passed the checks"
    elif grep -q -- "$want" "$WORK/ctl.log"; then
        pass "control $name: reported"
    else
        fail "control $name: not reported as '$want':"
        sed 's/^/    | /' "$WORK/ctl.log"
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
rm -rf "$CTL"
mkdir -p "$WORK/planted"
printf '%s\n' '# planted' '<!-- runnable -->' '```' 'true' '```' '<!-- runnable -->' '```' 'false' '```' \
    '<!-- output: echo one -->' '```' 'two' '```' >"$WORK/planted/README.md"
if run_blocks "$WORK/planted/README.md" "$WORK/planted" "$WORK/planted/blocks" >"$WORK/ctl.log" 2>&1; then
    fail "control failing runnable block: not reported"
else
    pass "control failing runnable block: reported"
fi
if check_outputs "$WORK/planted" "$WORK/planted/outputs" "$WORK/planted/README.md" >"$WORK/ctl.log" 2>&1; then
    fail "control wrong output block: not reported"
else
    pass "control wrong output block: reported"
fi

# ---- 3. the README's runnable blocks, as written -------------------------------------------
t0=$SECONDS
if run_blocks "$TREE/README.md" "$TREE" "$WORK/blocks"; then
    pass "README.md runnable blocks ($((SECONDS - t0)) s)"
else
    fail "README.md runnable blocks"
fi

# ---- 4. verbatim outputs -------------------------------------------------------------------
if check_outputs "$TREE" "$WORK/outputs" "$TREE/README.md" "$TREE"/docs/*.md; then
    pass "output blocks"
else
    fail "output blocks"
fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
