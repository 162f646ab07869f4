#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=fast,full
# --trace that survives (docs/zero1.md, "Traces"), on the CPU trainer with zero1/:
#   kill    --trace-every 2, the rank stopped before step 6 (LLMC_TEST_STOP) and killed with
#           kill -9: its file is valid JSON (Python's parser) holding the step markers 1-4 of
#           the second rewrite, each other event inside one of them;
#   clock   np 2, rank 1's clock planted 5 s ahead (LLMC_TEST_TRACE_CLOCK_SKEW): the offset
#           measured is -5 s within its bound, and the ends of the steps (each after the
#           grad norm's all-reduce) line up across the ranks within the bound plus 2 ms,
#           while the same times without the offset are 5 s apart (the check can fail);
#   range   --trace-steps 3-5 holds the markers 3, 4, 5 and no event outside them;
#   refused bad trace paths (missing directory, a file as the directory, a directory, a FIFO,
#           a directory the job cannot write in) and bad --trace-steps / --trace-every, each
#           at start (no step ran) with one error: line; the path at np 2 too.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
small_model "$TMP" >"$TMP/build.log" 2>&1 || fatal "the small model (build, oracle)" "$TMP/build.log"
pattern_shard "$TMP/shard.bin" || fatal "the train shard"
BIN=./train_gpt2
fast_rows kill trace_missing_dir/1 "at start"
BASE=(-e "$TMP/m.bin" -i "$TMP/shard.bin" -b 2 -t 32 -v 0 -s 0 -z 1)

# trace_check FILE STEPS: FILE is a JSON trace whose step markers are exactly STEPS
# ("1 2 3 4") and whose other events each lie inside one of them; prints what it holds.
trace_check() {
    $PY - "$@" <<'PYEOF'
import json, sys
path, want = sys.argv[1], [int(s) for s in sys.argv[2].split()]
events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
steps = {int(e["name"].split()[1]): (e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("step ")}
others = [e for e in events if not e["name"].startswith("step ")]
print(f"{path}: step markers {sorted(steps)}, {len(others)} other events")
assert sorted(steps) == want, f"step markers {sorted(steps)}, expected {want}"
outside = [e for e in others if not any(a <= e["ts"] and e["ts"] + e["dur"] <= b for a, b in steps.values())]
assert others and not outside, f"{len(outside)} of {len(others)} events outside every step marker: {outside[:3]}"
PYEOF
}

# ---- kill: a run killed with kill -9 after its second rewrite --------------------------
if selected "kill"; then
    LLMC_TEST_STOP=step:0:6 $BIN "${BASE[@]}" -x 20 --trace "$TMP/killed" --trace-every 2 >"$TMP/kill.log" 2>&1 &
    pid=$!
    if wait_stopped "$TMP/kill.log" 1 >/dev/null; then
        kill -9 $pid
        wait $pid 2>/dev/null
        if trace_check "$TMP/killed.rank0.json" "1 2 3 4" >>"$TMP/kill.log" 2>&1 && grep -q "^step    5/20" "$TMP/kill.log"; then
            ok "kill: kill -9 before step 6 (step 5 done, rewrites after 2 and 4): $(tail -n 1 "$TMP/kill.log" | sed "s|$TMP/||")"
        else
            not_ok "kill: the killed run's trace" "$TMP/kill.log"
        fi
    else
        kill -9 $pid 2>/dev/null
        not_ok "kill: the run did not stop before step 6" "$TMP/kill.log"
    fi
fi

# ---- clock: every rank on rank 0's clock -----------------------------------------------
if selected "clock"; then
    SKEW_US=5000000
    if LLMC_TEST_TRACE_CLOCK_SKEW=1:$SKEW_US timeout 60 "${MPIRUN[@]}" -x LLMC_TEST_TRACE_CLOCK_SKEW -np 2 \
           $BIN "${BASE[@]}" -x 8 --trace "$TMP/clock" --trace-every 4 >"$TMP/clock.log" 2>&1 &&
       $PY - "$TMP/clock" $SKEW_US >>"$TMP/clock.log" 2>&1 <<'PYEOF'
import json, statistics, sys
prefix, skew = sys.argv[1], float(sys.argv[2])
traces = [json.load(open(f"{prefix}.rank{r}.json")) for r in (0, 1)]
ends = [{e["name"]: e["ts"] + e["dur"] for e in t["traceEvents"] if e["name"].startswith("step ")} for t in traces]
assert sorted(ends[0]) == sorted(ends[1]) and len(ends[0]) == 8, (sorted(ends[0]), sorted(ends[1]))
offset, bound = traces[1]["otherData"]["clock_offset_us"], traces[1]["otherData"]["clock_error_bound_us"]
assert traces[0]["otherData"]["clock_offset_us"] == 0.0
assert abs(offset + skew) <= bound, f"measured offset {offset} us, planted skew {skew} us, bound {bound} us"
# The first step's end is left out: rank 1 leaves start-up (the offset's measurement) later.
later = sorted(ends[0])[1:]
aligned = statistics.median(abs(ends[1][s] - ends[0][s]) for s in later)
raw = statistics.median(abs(ends[1][s] - offset - ends[0][s]) for s in later)
print(f"offset {offset:.1f} us (bound {bound:.1f}); step ends apart by {aligned:.1f} us (median), "
      f"{raw:.0f} us without the offset")
assert aligned <= bound + 2000, "the ranks' step ends do not line up"
assert abs(raw - skew) <= bound + 2000, "without the offset the ends should be the planted skew apart"
PYEOF
    then
        ok "clock: np 2, rank 1 planted 5 s ahead: $(tail -n 1 "$TMP/clock.log")"
    else
        not_ok "clock: np 2 with a planted skew" "$TMP/clock.log"
    fi
fi

# ---- range: --trace-steps 3-5 -----------------------------------------------------------
if selected "range"; then
    if $BIN "${BASE[@]}" -x 7 --trace "$TMP/range.json" --trace-steps 3-5 >"$TMP/range.log" 2>&1 &&
       trace_check "$TMP/range.rank0.json" "3 4 5" >>"$TMP/range.log" 2>&1; then
        ok "range: --trace-steps 3-5 of 7: $(tail -n 1 "$TMP/range.log" | sed "s|$TMP/||")"
    else
        not_ok "range: --trace-steps 3-5" "$TMP/range.log"
    fi
fi

# ---- refused at start ---------------------------------------------------------------------
BASE+=(-x 2)
mkdir "$TMP/dir.rank0.json" && mkfifo "$TMP/fifo.rank0.json" && : >"$TMP/a_file" || fatal "fixtures"
# Root writes in any mode bits: a directory of /sys refuses new files even to root.
if [ "$(id -u)" = 0 ]; then locked=/sys/llmc_trace; else mkdir "$TMP/locked" && chmod 555 "$TMP/locked" && locked=$TMP/locked/t; fi
expect_error trace_missing_dir   1 "--trace $TMP/none/t.rank0.json" "No such file or directory" -- --trace "$TMP/none/t"
expect_error trace_missing_dir   2 "--trace $TMP/none/t.rank0.json" -- --trace "$TMP/none/t"
expect_error trace_file_as_dir   1 "its directory $TMP/a_file/: Not a directory" -- --trace "$TMP/a_file/t"
expect_error trace_is_dir        1 "dir.rank0.json: that path is a directory" -- --trace "$TMP/dir"
expect_error trace_is_fifo       1 "fifo.rank0.json: that path is a FIFO" -- --trace "$TMP/fifo.json"
expect_error trace_not_writable  1 "cannot open '$locked.rank0.json.tmp' for writing" -- --trace "$locked"
expect_error trace_steps_reverse 1 "--trace-steps expects A-B or A" "got '5-3'" -- --trace "$TMP/t" --trace-steps 5-3
expect_error trace_steps_zero    1 "--trace-steps expects A-B or A" -- --trace "$TMP/t" --trace-steps 0-2
expect_error trace_steps_past_x  1 "--trace-steps 3-4: the run ends at step 2 (-x)" -- --trace "$TMP/t" --trace-steps 3-4
expect_error trace_steps_alone   1 "--trace-steps says what --trace FILE records" -- --trace-steps 1-2
expect_error trace_every_zero    1 "--trace-every" -- --trace "$TMP/t" --trace-every 0
if selected "at start"; then
    late=$(grep -l "^step " "$TMP"/trace_*.log)
    if [ -z "$late" ]; then ok "at start: none of the refused runs ran a step"; else not_ok "at start: steps ran in $late"; fi
fi
done_testing
