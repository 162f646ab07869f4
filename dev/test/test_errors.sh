#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=fast,full
# Bad input to ./train_gpt2 (docs/design.md, "Errors"): every case must end with an exit code != 0 (not a timeout,
# not a signal), exactly one `error:` line that names the problem (a keyword), and no
# hang (timeout 60 s); the runner is expect_error in dev/test/test_lib.sh. Some cases also under
# mpirun -np 2, where the message must appear exactly once (rank 0 speaks for an error
# every rank sees). Crafted headers and damaged checkpoints: dev/test/test_files.sh.
# A control run with the same fixtures and no defect must succeed, so each failure is
# caused by the one defect that case introduces. Each case is the row NAME/NP; the fast
# tier runs the controls and one or two cases of each kind.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
BIN=./train_gpt2

fast_rows missing_model/1 model_truncated/1 shard_wrong_magic/1 shard_token_eq_V/1 unknown_flag/1 flag_out_of_range/1 \
    T_exceeds_maxT/1 model_is_fifo/1 ranks_differ_flag/mpmd missing_model/2 shard_token_eq_V/2 \
    instances_not_divide/2 fp32acc_fp32_grads/2
source dev/test/expect_error.sh

[ -x $BIN ] || fatal "$BIN is built"

# ---- fixtures (small_model, write_shard: dev/test/expect_error.sh) ---------------------
small_model "$TMP/model.bin" || fatal "the oracle writes a model"
MODEL=$TMP/model.bin
MODEL_BYTES=$(stat -c %s "$MODEL")
write_shard "$TMP/good.bin" 4096
write_shard "$TMP/badmagic.bin" 4096 12345678
write_shard "$TMP/badtoken.bin" 4096 20240520 3000 $V        # id == V: the first invalid id
write_shard "$TMP/bigtoken.bin" 4096 20240520 4095 65535     # the largest uint16, at the end
write_shard "$TMP/short.bin" 40                              # fewer tokens than one step needs
head -c $((1024 + 2 * 4096 - 10)) "$TMP/good.bin" >"$TMP/truncshard.bin"
cp "$MODEL" "$TMP/badmagic_model.bin"
printf '\x01\x02\x03\x04' | dd of="$TMP/badmagic_model.bin" bs=1 seek=0 conv=notrunc status=none
cp "$MODEL" "$TMP/badversion_model.bin"
printf '\x07\x00\x00\x00' | dd of="$TMP/badversion_model.bin" bs=1 seek=4 conv=notrunc status=none
head -c $((MODEL_BYTES - 4096)) "$MODEL" >"$TMP/trunc_model.bin"
head -c 100 "$MODEL" >"$TMP/tiny_model.bin"
cp "$MODEL" "$TMP/badheads_model.bin"        # header[5] = NH = 3: C=64 is not divisible by it
printf '\x03\x00\x00\x00' | dd of="$TMP/badheads_model.bin" bs=1 seek=20 conv=notrunc status=none
: >"$TMP/not_a_dir"
cp "$MODEL" "$TMP/nan_model.bin"             # a NaN as wte's element 7 (the first tensor in the file)
printf '\x00\x00\xc0\x7f' | dd of="$TMP/nan_model.bin" bs=1 seek=$((1024 + 4 * 7)) conv=notrunc status=none
cp "$MODEL" "$TMP/inf_model.bin"             # +inf as the file's last value: element 63 of lnfb
printf '\x00\x00\x80\x7f' | dd of="$TMP/inf_model.bin" bs=1 seek=$((MODEL_BYTES - 4)) conv=notrunc status=none

# Arguments of a good run; each case overrides one thing (later flags win).
BASE=(-e "$MODEL" -i "$TMP/good.bin" -j "$TMP/good.bin" -b 2 -t 32 -x 1 -v 0 -s 0 -z 0)

t0=$SECONDS
# Control: the fixtures themselves are fine.
if timeout 60 $BIN "${BASE[@]}" -o "$TMP/control_out" >"$TMP/control.log" 2>&1 && ! grep -q 'error:' "$TMP/control.log"; then
    ok "control: a good run with the same fixtures succeeds"
else
    not_ok "control: the good run failed, so the cases below prove nothing"
    tail -n 15 "$TMP/control.log" | sed 's/^/       | /'
fi
if timeout 60 "${MPIRUN[@]}" -np 2 $BIN "${BASE[@]}" >"$TMP/control2.log" 2>&1; then
    ok "control: the same good run under mpirun -np 2 succeeds"
else
    not_ok "control: the good run under mpirun -np 2 failed"
    tail -n 15 "$TMP/control2.log" | sed 's/^/       | /'
fi

# model files
expect_error missing_model        1 "nope.bin"                 -- -e "$TMP/nope.bin"
expect_error model_wrong_magic    1 "magic"                    -- -e "$TMP/badmagic_model.bin"
expect_error model_bad_version    1 "version 7"                -- -e "$TMP/badversion_model.bin"
expect_error model_truncated      1 "truncated"                -- -e "$TMP/trunc_model.bin"
expect_error model_tiny           1 "tiny_model.bin"           -- -e "$TMP/tiny_model.bin"
expect_error model_C_not_div_NH   1 "not divisible by NH=3"    -- -e "$TMP/badheads_model.bin"
expect_error model_nan            1 "nan_model.bin: tensor wte holds a non-finite value (nan) at element 7" -- -e "$TMP/nan_model.bin"
expect_error model_inf            2 "tensor lnfb holds a non-finite value (inf) at element 63" -- -e "$TMP/inf_model.bin"
# a tokenizer file that exists but is not one (a missing one is only a warning, as in llm.c)
expect_error bad_tokenizer        1 "not an llm.c tokenizer"   -- -s 1 --tokenizer "$TMP/good.bin"
# token shards
expect_error missing_shard        1 "no token shard matches"   -- -i "$TMP/none_*.bin"
expect_error missing_val_shard    1 "no token shard matches"   -- -j "$TMP/none_val.bin" -v 1
expect_error shard_wrong_magic    1 "not a token shard"        -- -i "$TMP/badmagic.bin"
expect_error shard_truncated      1 "truncated"                -- -i "$TMP/truncshard.bin"
expect_error shard_token_eq_V     1 "vocabulary size $V"       -- -i "$TMP/badtoken.bin"
expect_error shard_token_65535    1 "65535"                    -- -i "$TMP/bigtoken.bin"
expect_error val_shard_bad_token  1 "badtoken.bin"             -- -j "$TMP/badtoken.bin" -v 1
expect_error shard_too_short      1 "short.bin"                -- -i "$TMP/short.bin"
# configuration
expect_error T_exceeds_maxT       1 "maximum sequence length"  -- -t 128
expect_error d_not_divisible      1 "-d 100"                   -- -d 100
expect_error unknown_flag         1 "--bogus"                  -- --bogus 3
expect_error flag_missing_value   1 "-b needs a value"         -- -b
expect_error flag_out_of_range    1 "-z 7 is out of range"     -- -z 7
expect_error flag_not_a_number    1 "-b expects an integer"    -- -b four
expect_error lr_nan               1 "-l nan"                   -- -l nan
# llm.c's -h takes 0 or 1 (its HellaSwag flag); another value is an error, not the help.
expect_error h_value_2            1 "-h takes 0 or 1" "got '2'" -- -h 2
expect_error h_value_word         1 "-h takes 0 or 1" "got 'yes'" -- -h yes
# The GPU trainer's kernel choices: the CPU trainer cannot honour them, so it refuses them.
expect_error cpu_attention_bogus  1 "--attention bogus: a choice of the GPU trainer's kernels" -- --attention bogus
expect_error cpu_attention_naive  2 "--attention naive: a choice of the GPU trainer's kernels" -- --attention naive
expect_error cpu_recompute_0      1 "-r 0: a choice of the GPU trainer's kernels" -- -r 0
expect_error cpu_fused_kernels_0  1 "--fused-kernels 0: a choice of the GPU trainer's kernels" -- --fused-kernels 0
expect_error cpu_comm_nccl        1 "--comm nccl: a choice of the GPU trainer's communication" -- --comm nccl
expect_error cpu_comm_mpi         2 "--comm mpi: a choice of the GPU trainer's communication" -- --comm mpi
expect_error trace_empty          1 "--trace '': give the trace files' path prefix" -- -z 1 --trace ''
echo outside >"$TMP/outside.txt" && ln -s "$TMP/outside.txt" "$TMP/traced.rank0.json.tmp"
expect_error trace_through_link   1 "traced.rank0.json.tmp' is a symbolic link" -- -z 1 --trace "$TMP/traced"
[ "$(cat "$TMP/outside.txt")" = outside ] || not_ok "trace_through_link: the trace was written through the link"
expect_error output_empty         1 "-o '': give the output directory" -- -o ''
expect_error keep_without_o       1 "-nk 2 keeps the newest of the checkpoints that -n saves in -o" -- -nk 2
expect_error keep_without_n       1 "-nk 2 keeps the newest of the checkpoints that -n saves in -o" -- -nk 2 -o "$TMP/keep_out"
expect_error start_over_without_o 1 "checkpoints (-n, -nk, -y, --start-over) live in the output directory" -- --start-over
expect_error eps_nan              1 "--eps nan"                -- --eps nan
expect_error output_not_a_dir     1 "not_a_dir"                -- -o "$TMP/not_a_dir"
expect_error timeout_negative     1 "--comm-timeout -1 is out of range"     -- --comm-timeout -1
expect_error timeout_tiny         1 "--comm-timeout 1e-09: use 0 (wait forever) or at least 1 s" -- --comm-timeout 1e-9
expect_error bucket_size_0        2 "--bucket-size 0: for one bucket use --bucket-size none" -- --bucket-size 0
expect_error bucket_size_word     1 "--bucket-size expects a number of elements" -- --bucket-size lots
expect_error bucket_size_blank    1 "--bucket-size expects a number of elements" -- --bucket-size ' 5'
expect_error int_leading_blank    1 "-b expects an integer, got ' 2'" -- -b ' 2'
expect_error o_newline            1 "-o holds a control character (byte 10" -- -o "$TMP/a"$'\n'"b" -n 1
expect_error allow_change_no_resume 1 "--allow-resume-change allows a change" "add -y 1" -- --allow-resume-change -o "$TMP/x"
expect_error allow_corpus_no_resume 1 "--allow-corpus-change allows a change" "add -y 1" -- --allow-corpus-change -o "$TMP/x"
expect_error int_range_printed    1 "-b 0 is out of range [1, 1048576]"     -- -b 0
expect_error descriptor_depth_0   1 "-e d0: a descriptor dN"  -- -e d0
expect_error descriptor_too_deep  1 "takes N from 1 to 1024"   -- -e d5000
# inputs that are not regular files: one error naming the path and what it is (a FIFO used
# to block forever)
mkfifo "$TMP/fifo_model" "$TMP/fifo_shard"
mkdir -p "$TMP/a_dir"
ln -sf "$TMP/no_such_dir" "$TMP/dangling_out"
expect_error model_is_fifo        1 "fifo_model' is a pipe or FIFO" -- -e "$TMP/fifo_model"
expect_error model_is_directory   1 "a_dir' is a directory"   -- -e "$TMP/a_dir"
expect_error model_is_pipe        1 "is a pipe or FIFO"        -- -e <(cat "$TMP/good.bin")
expect_error shard_is_fifo        1 "fifo_shard' is a pipe or FIFO" -- -i "$TMP/fifo_shard"
expect_error tokenizer_is_fifo    1 "tokenizer '$TMP/fifo_model' is a pipe" -- -s 1 --tokenizer "$TMP/fifo_model"
expect_error hellaswag_is_fifo    1 "fifo_model' is a pipe or FIFO" -- -H 1 --hellaswag-file "$TMP/fifo_model"
expect_error output_dangling_link 1 "symbolic link to '$TMP/no_such_dir', which does not exist" -- -o "$TMP/dangling_out"
expect_error output_parent_file   1 "cannot create output directory '$TMP/not_a_dir/run': Not a directory" -- -o "$TMP/not_a_dir/run"
# -o's missing parents are made, as mkdir -p would (a job script's path is often fresh).
if timeout 60 $BIN "${BASE[@]}" -o "$TMP/fresh/parents/out" >"$TMP/parents.log" 2>&1 && [ -f "$TMP/fresh/parents/out/main.log" ]; then
    ok "-o with missing parents: they are made, main.log written"
else
    not_ok "-o with missing parents failed"
    tail -n 5 "$TMP/parents.log" | sed 's/^/       | /'
fi
expect_error instances_zero       1 "--dist-opt-instances 0 is out of range" -- --dist-opt-instances 0
# One job per output directory: while a job runs in D, a second one on D stops at once naming
# the holder; once the first is gone (kill -9 too: the lock is the kernel's), D is free again.
# The holder stands stopped before its step 3 (LLMC_TEST_STOP), holding the lock, while the
# second job tries.
lock_cases() {
    rm -rf "$TMP/busy_out"
    LLMC_TEST_STOP=step:0:3 $BIN "${BASE[@]}" -x 100000 -o "$TMP/busy_out" >"$TMP/holder.log" 2>&1 &
    holder=$!
    wait_stopped "$TMP/holder.log" 1 >/dev/null || not_ok "output_dir_in_use: the holder did not stop before step 3"
    expect_error output_dir_in_use 1 "is in use by another job (host $(hostname), pid $holder, started" -- -o "$TMP/busy_out"
    kill -9 $holder 2>/dev/null
    wait $holder 2>/dev/null
    if timeout 60 $BIN "${BASE[@]}" -y 1 -o "$TMP/busy_out" >"$TMP/after_holder.log" 2>&1; then
        ok "output_dir_free_after_kill: after the holder was killed (-9) a new job runs in the same directory"
    else
        not_ok "output_dir_free_after_kill: exit $?"; tail -n 5 "$TMP/after_holder.log" | sed 's/^/       | /'
    fi
}

# A full disk (a 64 KiB tmpfs in a private mount namespace, root only): main.log fills
# after some steps. The job must stop at that step with one error naming the file, not
# run on with lines missing and exit 0; a trace that does not fit is an error too.
# on_full_disk LOG ARGS...: the run with -o on a disk with one 4 KiB page left for main.log.
on_full_disk() {
    local log=$1
    shift
    mkdir -p "$TMP/fs"
    unshare -m --propagation private bash -c '
        fs=$1; shift
        mount -t tmpfs -o size=64k tmpfs "$fs" || exit 97
        mkdir "$fs/out" && head -c 100 /dev/zero >"$fs/out/.lock"  # the lock file holds its page already
        dd if=/dev/zero of="$fs/fill" bs=4096 count=14 status=none
        timeout 60 "$@" -o "$fs/out" --tensorboard 0  # its event files: test_metrics.sh
        rc=$?
        cp "$fs/out/main.log" "$fs.main.log" 2>/dev/null
        exit $rc' _ "$TMP/fs" "$BIN" "$@" >"$log" 2>&1
}
full_disk_cases() {
    if [ "$(id -u)" != 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
        skip "full_disk" "needs root and unshare -m for a small tmpfs (not run here)"
    else
        rm -f "$TMP/fs.main.log"
        on_full_disk "$TMP/full_disk.log" "${BASE[@]}" -x 1000
        rc=$?
        full=$(grep -c "^s:[0-9]* trl:.* slow:[0-9.]*@[0-9]*$" "$TMP/fs.main.log" 2>/dev/null)
        last=$(sed -n 's/^step *\([0-9]*\)\/1000 .*/\1/p' "$TMP/full_disk.log" | tail -n 1)
        msg=$(grep "error:" "$TMP/full_disk.log")
        if [ $rc -ne 0 ] && [ $rc -ne 97 ] && [ $rc -ne 124 ] && [ "$(grep -c "error:" "$TMP/full_disk.log")" = 1 ] &&
           [[ $msg == *"cannot write $TMP/fs/out/main.log: No space left on device"* ]] &&
           [ -n "$last" ] && [ "$full" -gt 10 ] && [ "$last" = $((full + 1)) ]; then
            ok "full_disk: main.log full after $full steps: the job stopped at step $last (exit $rc): $msg"
        else
            not_ok "full_disk: exit $rc, $full whole lines in main.log, last step $last; expected a stop at the step that failed"
            tail -n 5 "$TMP/full_disk.log" | sed 's/^/       | /'
        fi
        on_full_disk "$TMP/full_trace.log" "${BASE[@]}" -x 2 -z 1 --trace "$TMP/fs/out/trace"
        rc=$?
        if [ $rc -ne 0 ] && [ "$(grep -c "error:" "$TMP/full_trace.log")" = 1 ] &&
           grep -q "error: cannot write trace $TMP/fs/out/trace.rank0.json: No space left on device" "$TMP/full_trace.log"; then
            ok "full_trace: a trace that does not fit: one error naming it, exit $rc"
        else
            not_ok "full_trace: exit $rc"; tail -n 5 "$TMP/full_trace.log" | sed 's/^/       | /'
        fi
    fi
}

# -z 1 on a build without the plugin (make train_gpt2_plain builds one under its own name).
plain_build_cases() {
    make -s train_gpt2_plain >/dev/null 2>&1 || not_ok "could not build ./train_gpt2_plain"
    if [ -x ./train_gpt2_plain ]; then
        BIN=./train_gpt2_plain expect_error z1_without_plugin 1 "USE_ZERO1=1"  -- -z 1
        BIN=./train_gpt2_plain expect_error instances_without_plugin 1 "--dist-opt-instances needs the zero1/ plugin" -- \
            --dist-opt-instances 2
    fi
}

selected output_dir_in_use/1 output_dir_free_after_kill && lock_cases
selected full_disk && full_disk_cases
selected z1_without_plugin/1 instances_without_plugin/1 && plain_build_cases

# Ranks given different jobs (mpirun's MPMD form: each rank its own command line, or its
# own working directory): one message from rank 0 naming the first field that differs
# and both values (run/ranks_agree.h), not an MPI abort with a backtrace.
mkdir -p "$TMP/host_a" "$TMP/host_b"
cp "$TMP/good.bin" "$TMP/host_a/shard.bin"
write_shard "$TMP/host_b/shard.bin" 8192
cp $BIN "$TMP/train_gpt2_other" && printf 'x' >>"$TMP/train_gpt2_other"  # another build: it runs the same
RUN=(-np 1 "$PWD/${BIN#./}" "${BASE[@]}")
expect_error ranks_differ_flag  mpmd "the ranks disagree on --lr: rank 0 has '0.0003', rank 1 has '0.001'" -- \
    "${RUN[@]}" : "${RUN[@]}" -l 1e-3
expect_error ranks_differ_data  mpmd "the ranks disagree on --train-data: rank 0 has '$TMP/good.bin', rank 1 has '$TMP/badmagic.bin'" -- \
    "${RUN[@]}" : "${RUN[@]}" -i "$TMP/badmagic.bin"
expect_error ranks_differ_file  mpmd "the ranks disagree on train file 0: rank 0 has 'shard.bin, 9216 bytes', rank 1 has 'shard.bin, 17408 bytes'" -- \
    -wdir "$TMP/host_a" "${RUN[@]}" -i shard.bin : -wdir "$TMP/host_b" "${RUN[@]}" -i shard.bin
expect_error ranks_differ_build mpmd "the ranks disagree on build" "program" -- \
    "${RUN[@]}" : -np 1 "$TMP/train_gpt2_other" "${BASE[@]}"

# under mpirun -np 2: one message, from rank 0
expect_error missing_model        2 "nope.bin"                 -- -e "$TMP/nope.bin"
expect_error model_truncated      2 "truncated"                -- -e "$TMP/trunc_model.bin"
expect_error shard_wrong_magic    2 "not a token shard"        -- -i "$TMP/badmagic.bin"
expect_error shard_token_eq_V     2 "vocabulary size $V"       -- -i "$TMP/badtoken.bin"
expect_error d_not_divisible_np2  2 "B*T*ranks = 1*32*2"       -- -b 1 -d 96
expect_error unknown_flag         2 "--bogus"                  -- --bogus
expect_error flag_out_of_range    2 "-z 7 is out of range"     -- -z 7
expect_error T_exceeds_maxT       2 "maximum sequence length"  -- -t 128
expect_error instances_not_divide 2 "--dist-opt-instances 3 does not divide the 2 ranks" -- -z 1 --dist-opt-instances 3
expect_error instances_with_z0    2 "needs ZeRO-1 (-z 1)"      -- -z 0 --dist-opt-instances 2
expect_error split_with_z0         2 "--split-embedding needs ZeRO-1 (-z 1)" -- -z 0 --split-embedding
expect_error split_bf16_instances  2 "split embedding with distributed-optimizer instances needs" "--grad-dtype fp32" -- \
    -z 1 --dist-opt-instances 2 --grad-dtype bf16 --split-embedding
expect_error fp32acc_with_z0      2 "--fp32-accumulation" "needs --grad-dtype bf16 and -z 1" -- -z 0 --grad-dtype bf16 --fp32-accumulation
expect_error fp32acc_fp32_grads   2 "--fp32-accumulation" "(got --grad-dtype fp32, -z 1)" -- -z 1 --fp32-accumulation
expect_error sr_fp32_params       1 "--stochastic-rounding" "these params are fp32" -- --stochastic-rounding

note "test_errors: $((SECONDS - t0)) s"
done_testing
