#!/usr/bin/env bash
# test: timeout=180 lane=cpu tier=full
# A preempted job saves before it goes (run/preempt.h; docs/training.md, "Preemption"):
#   sigterm        SIGTERM before step 4 (the rank stopped there: LLMC_TEST_STOP): step 4 ends,
#                  its checkpoint is saved, one line names it, exit 143, main.log says so;
#   resume         -y 1 resumes from that checkpoint;
#   second_signal  a second SIGTERM inside that save (stopped in it) ends the process at once:
#                  the checkpoint before stays, -y 1 resumes from it;
#   mpirun         SIGTERM to mpirun -np 2 (Open MPI 4: SIGCONT, a wait, SIGTERM, a wait,
#                  SIGKILL; odls_base_sigkill_timeout 3 s): both ranks save one checkpoint
#                  and no rank is left running;
#   duration       --exit-duration-in-mins ends the run with a checkpoint, exit 0;
#   handler_off    --exit-signal-handler 0: SIGTERM ends it at once, nothing saved;
#   sbatch         scripts/multi_node/train.sbatch asks for the signal ahead of the limit and
#                  requeues: a trainer that exits 143 under a fake srun is requeued through a
#                  fake scontrol.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
make -s train_gpt2 USE_ZERO1=1 >/dev/null || fatal "build train_gpt2"
ARGS=(-e d1 -b 2 -t 32 -v 0 -s 0 -i data/tinyshakespeare_train.bin)
ck() { printf '%s/checkpoint_%08d' "$1" "$2"; }

# sigterm_at LOG POINTS SIGNALS... -- COMMAND...: COMMAND in the background with
# LLMC_TEST_STOP=POINTS, each signal sent (then SIGCONT) as it stops; its exit status.
sigterm_at() {
    local log=$1 points=$2 pid rc; shift 2
    local sigs=()
    while [ "$1" != "--" ]; do sigs+=("$1"); shift; done
    shift
    LLMC_TEST_STOP=$points "$@" >"$log" 2>&1 &
    pid=$!
    local i=0 sig
    for sig in "${sigs[@]}"; do
        i=$((i + 1))
        wait_stopped "$log" $i >/dev/null || { kill -9 $pid; return 99; }
        kill -"$sig" $pid
        kill -CONT $pid
    done
    wait $pid
}

# ---- sigterm, resume ---------------------------------------------------------------------
O=$TMP/sigterm
sigterm_at "$TMP/sigterm.log" step:0:4 TERM -- ./train_gpt2 "${ARGS[@]}" -x 1000 -o "$O"
rc=$?
if [ $rc = 143 ] && grep -q "^stopped by SIGTERM after step 4; checkpoint of step 4 in $(ck "$O" 4): -y 1 resumes from it$" \
    "$TMP/sigterm.log" && [ -f "$(ck "$O" 4)/manifest.txt" ] && grep -q '^s:4 stop:SIGTERM$' "$O/main.log"; then
    ok "sigterm: exit 143, $(grep '^stopped by' "$TMP/sigterm.log")"
else
    not_ok "sigterm: exit $rc (want 143, the line, checkpoint 4, main.log's stop line)" "$TMP/sigterm.log"
fi
check_match "resume: -y 1 resumes from checkpoint 4" "resumed from .*checkpoint_00000004: step 4" \
    <(./train_gpt2 "${ARGS[@]}" -x 6 -o "$O" -y 1 2>&1)

# ---- a second signal during the save -------------------------------------------------------
O=$TMP/second
sigterm_at "$TMP/second.log" step:0:5,save:0:5 TERM TERM -- ./train_gpt2 "${ARGS[@]}" -x 1000 -n 2 -o "$O"
rc=$?
if [ $rc = 143 ] && [ -f "$(ck "$O" 4)/manifest.txt" ] && [ ! -e "$(ck "$O" 5)" ] && ! grep -q '^stopped by' "$TMP/second.log"; then
    ok "second_signal: killed in the save (exit $rc); checkpoint 4 intact, no checkpoint 5"
else
    not_ok "second_signal: exit $rc; $(ls "$O" | tr '\n' ' ')" "$TMP/second.log"
fi
check_match "second_signal: -y 1 resumes from checkpoint 4" "resumed from .*checkpoint_00000004: step 4" \
    <(./train_gpt2 "${ARGS[@]}" -x 5 -o "$O" -y 1 2>&1)

# ---- mpirun ----------------------------------------------------------------------------------
O=$TMP/mpirun
LLMC_TEST_STOP='step:*:3' OMPI_MCA_odls_base_sigkill_timeout=3 setsid "${MPIRUN[@]}" -np 2 ./train_gpt2 "${ARGS[@]}" \
    -x 100000 -o "$O" >"$TMP/mpirun.log" 2>&1 &
pid=$!
wait_stopped "$TMP/mpirun.log" 2 >/dev/null
kill -TERM $pid
wait $pid
rc=$?
sleep 0.5
saved=$(ls -d "$O"/checkpoint_* 2>/dev/null | wc -l)
left=$(pgrep -f -- "-o $O" | wc -l)
if [ $rc != 0 ] && [ "$saved" = 1 ] && [ -f "$(ls -d "$O"/checkpoint_*)/manifest.txt" ] && [ "$left" = 0 ] &&
    grep -q ' stop:SIGTERM$' "$O/main.log"; then
    ok "mpirun: exit $rc, $(basename "$(ls -d "$O"/checkpoint_*)") saved, no rank left, main.log: $(grep stop: "$O/main.log")"
else
    not_ok "mpirun: exit $rc, $saved checkpoint(s), $left process(es) left" "$TMP/mpirun.log"
fi

# ---- --exit-duration-in-mins, --exit-signal-handler 0 ---------------------------------------------
O=$TMP/duration
./train_gpt2 "${ARGS[@]}" -x 100000 -o "$O" --exit-duration-in-mins 0.02 >"$TMP/duration.log" 2>&1
rc=$?
line=$(grep '^stopped by --exit-duration-in-mins 0.02 after step' "$TMP/duration.log")
n=$(sed -n 's/.* after step \([0-9]*\);.*/\1/p' <<<"$line")
if [ $rc = 0 ] && [ -n "$n" ] && [ -f "$(ck "$O" "$n")/manifest.txt" ]; then ok "duration: exit 0, $line"
else not_ok "duration: exit $rc" "$TMP/duration.log"; fi
O=$TMP/off
sigterm_at "$TMP/off.log" step:0:3 TERM -- ./train_gpt2 "${ARGS[@]}" -x 1000 -o "$O" --exit-signal-handler 0
rc=$?
if [ $rc = 143 ] && ! ls -d "$O"/checkpoint_* >/dev/null 2>&1; then ok "handler_off: killed by SIGTERM, nothing saved"
else not_ok "handler_off: exit $rc" "$TMP/off.log"; fi

# ---- train.sbatch ------------------------------------------------------------------------------
S=scripts/multi_node/train.sbatch
check_match "sbatch: asks for SIGTERM ahead of the time limit" '^#SBATCH --signal=TERM@[0-9]+$' $S
check_match "sbatch: requeueable" '^#SBATCH --requeue$' $S
mkdir -p "$TMP/fake"
printf '#!/bin/sh\nexit 143\n' >"$TMP/fake/srun"
printf '#!/bin/sh\necho "$@" >"%s/scontrol.args"\n' "$TMP" >"$TMP/fake/scontrol"
chmod +x "$TMP/fake/srun" "$TMP/fake/scontrol"
PATH=$TMP/fake:$PATH SLURM_JOB_ID=4242 TRAIN_BIN=./train_gpt2 bash $S -y 1 >"$TMP/sbatch.log" 2>&1
rc=$?
if [ $rc = 143 ] && [ "$(cat "$TMP/scontrol.args" 2>/dev/null)" = "requeue 4242" ]; then
    ok "sbatch: a trainer stopped by SIGTERM (exit 143) is requeued: scontrol requeue 4242"
else
    not_ok "sbatch: exit $rc, scontrol: $(cat "$TMP/scontrol.args" 2>/dev/null)" "$TMP/sbatch.log"
fi
done_testing
