# Sourced by dev/test/run_gpu_tests.sh (its row, $OUT, $ORACLE_STEPS, $NUM_GPUS, the binaries
# it built, $OUT/random_tokens.bin):
# --optimizer muon on the GPU trainer's replicated optimizer (issue 43) against the real peer,
# emerging-optimizers 0.3.0's Muon (dev/test/muon_reference.py, wpe with AdamW as ours), over
# the oracle's GPT-2 for $ORACLE_STEPS steps. test_gpt2cu's --final tolerances say why each:
#   FP32 build, fp32 Newton-Schulz against the reference's fp32 ("highest"): the CPU rows' 1e-4;
#   BF16 build against the same reference: 1e-1 of the update, the rest 2 lr per step;
#   --muon-ns-bf16 against the reference's bf16 GEMMs ("medium"): 5e-2 of the update;
#   np 2 (NCCL): the same reference, replicas bitwise identical;
#   ZeRO-1 (-z 1, 20000-element buckets) at np 2 and 3 on a batch-12 reference: fp32 tolerances,
#   replicas bitwise identical;
#   negative controls: AdamW fails Muon's reference; --muon-ns-bf16 changes the trained weights;
#   train_gpt2cu (BF16) resumed at step 3 writes the straight run's step-6 checkpoint byte for
#   byte (the momentum lives in AdamW's m; test_muon.sh plants a checkpoint without it).
# Without PyPI the rows say SKIPPED; under CI=true that is a failure (test_lib.sh's pypi_peer).
pypi_peer emerging-optimizers emerging_optimizers.sh "$(bash dev/test/emerging_optimizers.sh --pinned)"
if [ -n "$PEER_DIR" ]; then
    muon_reference() {  # muon_reference NAME PRECISION: $OUT/NAME.{m0,state,final}
        timeout 300 $PY dev/test/muon_reference.py run --emerging "$PEER_DIR" --steps "$ORACLE_STEPS" --wpe adamw \
            --muon-fp32-matmul-prec "$2" --out-model "$OUT/$1.m0" --out-state "$OUT/$1.state" --out-final "$OUT/$1.final" \
            "${@:3}"
    }
    muon_against() {  # muon_against PRECISION NAME [flags]: test_gpt2cu of that build on NAME's reference
        local p=$1 name=$2
        shift 2
        "$OUT/test_gpt2cu_$p" "$OUT/$name.m0" "$OUT/$name.state" --final "$OUT/$name.final" "$@"
    }
    fails_final() {  # fails_final COMMAND...: exits 1 with a 'not ok' on the final weights
        ! "$@" >"$OUT/fails_final.out" 2>&1 && grep -m1 "^not ok .*final" "$OUT/fails_final.out"
    }
    differ() {  # differ FLAGS: one step of d2 without and with FLAGS writes other params
        "$OUT/test_gpt2cu_FP32" --dump-params "$OUT/muon_plain.bin" d2 1 --optimizer muon &&
            "$OUT/test_gpt2cu_FP32" --dump-params "$OUT/muon_flag.bin" d2 1 --optimizer muon "$@" &&
            ! cmp -s "$OUT/muon_plain.bin" "$OUT/muon_flag.bin" && echo "PASS $* changes the step's params"
    }
    muon_resumed() {  # the straight 6 steps and a resume at step 3: the same step-6 checkpoint
        local run=("$OUT/train_gpt2cu_BF16" -e "$OUT/muon_fp32.m0" -i "$OUT/random_tokens.bin" -b 2 -t 64 -x 6 -v 0
                   -s 0 -l 1e-2 -u 2 -q 0.1 -c 0.1 --optimizer muon -n 3)
        rm -rf "$OUT/muon_straight" "$OUT/muon_resumed" && mkdir -p "$OUT/muon_resumed" &&
            "${run[@]}" -o "$OUT/muon_straight" && cp -r "$OUT/muon_straight/checkpoint_00000003" "$OUT/muon_resumed/" &&
            head -n 3 "$OUT/muon_straight/main.log" >"$OUT/muon_resumed/main.log" &&
            "${run[@]}" -o "$OUT/muon_resumed" -y 1 | grep "resumed from .*checkpoint_00000003" &&
            for f in model.bin optimizer.bin; do
                cmp "$OUT/muon_straight/checkpoint_00000006/$f" "$OUT/muon_resumed/checkpoint_00000006/$f" || return 1
            done && echo "PASS the resumed run's step-6 checkpoint is the straight run's"
    }
    row muon_reference_fp32 muon_reference muon_fp32 highest
    row muon_reference_medium muon_reference muon_medium medium
    # ZeRO-1 (zero1/'s CUDA muon op): a batch of 12 splits over 2 and 3 ranks, small buckets.
    row muon_reference_batch12 muon_reference muon_b12 highest --batch 12
    row test_gpt2cu_fp32_muon muon_against FP32 muon_fp32 --optimizer muon
    row test_gpt2cu_bf16_muon muon_against BF16 muon_fp32 --optimizer muon
    row build_test_z_fp32_muon build test_gpt2cu FP32 z  # the plugin build (the suite's own z rows come later)
    for np in 2 3; do
        if [ "$NUM_GPUS" -lt $np ]; then
            skip "test_gpt2cu_fp32_muon_zero1_np$np" "$NUM_GPUS GPU(s): NCCL needs a GPU per rank"
            continue
        fi
        row "test_gpt2cu_fp32_muon_zero1_np$np" "${MPIRUN[@]}" -np $np "$OUT/test_gpt2cu_z_FP32" "$OUT/muon_b12.m0" \
            "$OUT/muon_b12.state" --final "$OUT/muon_b12.final" --optimizer muon -z 1 --bucket-size 20000
    done
    row test_gpt2cu_fp32_muon_ns_bf16 muon_against FP32 muon_medium --optimizer muon --muon-ns-bf16
    row test_gpt2cu_fp32_adamw_fails_muon fails_final muon_against FP32 muon_fp32
    row muon_ns_bf16_takes_effect differ --muon-ns-bf16
    row train_gpt2cu_bf16_muon_resume muon_resumed
    if [ "$NUM_GPUS" -ge 2 ]; then
        row test_gpt2cu_fp32_muon_np2 "${MPIRUN[@]}" -np 2 "$OUT/test_gpt2cu_FP32" "$OUT/muon_fp32.m0" \
            "$OUT/muon_fp32.state" --final "$OUT/muon_fp32.final" --optimizer muon
    else
        skip test_gpt2cu_fp32_muon_np2 "one GPU: the replicated optimizer's NCCL all-reduce needs a GPU per rank"
    fi
fi
