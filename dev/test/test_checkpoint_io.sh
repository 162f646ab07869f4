#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=full
# Sharded checkpoint I/O (run/checkpoint_io.h): every rank writes and reads only its own
# pieces, through MPI-IO and a bounded staging buffer.
#   1. the files against independent references, at 1-3 ranks, ZeRO-1 (small buckets),
#      the plugin's replicated mode and the plain build: one step with -l 0 leaves the
#      weights bit for bit, so model.bin must equal the oracle's model file byte for byte;
#      optimizer.bin must hold (1-beta1)*g and (1-beta2)*g^2 of the oracle's gradient in
#      file order (dev/test/check_checkpoint.py); the manifest's CRC32Cs, combined from the
#      ranks' pieces, must equal each file's whole-file CRC32C (./test_crc32c); on the
#      deferred test device with the hazard communicator, a resume and the next save give
#      the CPU device's files byte for byte;
#   2. peak host memory at np=4 on a d6 model (30M parameters: its master, m and v are
#      347 MiB, far above the bounds): with LLMC_CHECKPOINT_MEMCHECK=1 every rank prints
#      how far its peak RSS rose during a save or a load. A save may add at most the
#      staging buffer + slack; a load at most the staging buffer + slack + the optimizer's
#      own buffers it fills for the first time (the whole param buffer, this rank's m and
#      v), which are allocated but untouched before it. Control: with a 32 MiB staging
#      buffer some rank's save must grow by >= 16 MiB, so the measurement sees buffers;
#   3. a disk that fills up during a save (a 4 MiB tmpfs; root only, else SKIPPED): one
#      error naming the file, exit != 0, no checkpoint renamed into place.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
mnt=""
at_exit '[ -n "$mnt" ] && umount "$mnt" 2>/dev/null'
make -s train_gpt2 train_gpt2_testing USE_ZERO1=1 >/dev/null && make -s train_gpt2_plain test_crc32c >/dev/null ||
    fatal "build"
DATA=data/tinyshakespeare_train.bin
[ -f $DATA ] || fatal "$DATA is there (make data)"

# ---- 1. the files against independent references -----------------------------------------
# An oracle batch of 6 rows, so that 1, 2 and 3 ranks all train on the same global batch.
$PY dev/test/gpt2_oracle.py make --out-model "$TMP/m.bin" --out-state "$TMP/s.bin" --steps 1 --batch 6 --seq 32 \
    --tokens $DATA >/dev/null || fatal "oracle"
RUNS=("./train_gpt2 1 6 -z 1" "./train_gpt2 3 2 -z 1 --bucket-size 20000" "./train_gpt2 3 2 -z 0"
      "./train_gpt2_plain 2 3 -z 0")
for i in "${!RUNS[@]}"; do
    read -r bin np b flags <<<"${RUNS[$i]}"
    # shellcheck disable=SC2086
    timeout 120 "${MPIRUN[@]}" -np "$np" "$bin" -e "$TMP/m.bin" -i $DATA -b "$b" -t 32 -x 1 -v 0 -s 0 -l 0 -n 1 \
        -o "$TMP/layout_$i" $flags >"$TMP/layout_$i.log" 2>&1
done
# one oracle process for all of them (importing torch takes a while)
$PY dev/test/check_checkpoint.py "$TMP/s.bin" "$TMP"/layout_*/checkpoint_00000001 >"$TMP/layout.check"
for i in "${!RUNS[@]}"; do
    read -r bin np b flags <<<"${RUNS[$i]}"
    what="$bin at np=$np B=$b $flags" ck=$TMP/layout_$i/checkpoint_00000001
    if cmp -s "$TMP/m.bin" "$ck/model.bin" && grep -q "^PASS $ck: " "$TMP/layout.check" &&
       ! grep -q "^FAIL $ck: " "$TMP/layout.check" &&
       diff <(./test_crc32c "$ck/model.bin" "$ck/optimizer.bin" "$ck/state.txt" | awk '{ n = split($3, p, "/"); print p[n], $2, $1 }') \
            "$ck/manifest.txt" >/dev/null; then
        ok "$what: model.bin == the oracle's file, optimizer.bin == the oracle's m and v, manifest == whole-file CRC32C"
    else
        not_ok "$what: checkpoint files"
        diag "$(tail -3 "$TMP/layout_$i.log"; grep "$ck" "$TMP/layout.check"; cat "$ck/manifest.txt")"
    fi
done

# The same I/O on the deferred test device with the hazard communicator (train_gpt2_testing,
# the trainer with the test options: device memory the host cannot touch, every op as late as the ordering rules allow, collectives that read
# NaN while in flight): resuming a CPU-device checkpoint and saving the next one, at np=3
# with bf16 storage (master shards, the compute copy), sharded and replicated, gives the
# CPU device's files byte for byte.
for z in 1 0; do
    F=(-e "$TMP/m.bin" -i "$DATA" -b 2 -t 32 -x 2 -v 0 -s 0 -n 1 -z "$z" --bucket-size 20000 --param-dtype bf16)
    cpu=$TMP/dev_cpu_$z res=$TMP/dev_deferred_$z
    mkdir -p "$res"
    timeout 120 "${MPIRUN[@]}" -np 3 ./train_gpt2 "${F[@]}" -o "$cpu" >"$cpu.log" 2>&1 &&
        cp -r "$cpu/checkpoint_00000001" "$res/" &&
        timeout 120 "${MPIRUN[@]}" -np 3 ./train_gpt2_testing "${F[@]}" --test-device deferred --test-hazard -o "$res" -y 1 \
            >"$res.log" 2>&1
    if grep -q "resumed from .*checkpoint_00000001: step 1" "$res.log" &&
       cmp -s "$cpu/checkpoint_00000002/model.bin" "$res/checkpoint_00000002/model.bin" &&
       cmp -s "$cpu/checkpoint_00000002/optimizer.bin" "$res/checkpoint_00000002/optimizer.bin"; then
        ok "-z $z, deferred device + hazard communicator at np=3: a resume and a save give the CPU device's files"
    else
        not_ok "-z $z on the deferred device"; diag "$(tail -3 "$cpu.log" "$res.log")"
    fi
done

# ---- 2. peak host memory at np=4 ----------------------------------------------------------
SLACK_MIB=24   # MPI-IO's own buffers, the ranks' CRC reports, stdio
D6=(-e d6 -i "$DATA" -b 1 -t 32 -v 0 -s 0 -n 1 -z 1 -o "$TMP/mem")
memrun() {  # memrun STAGING_MIB LOG [flags]: the d6 run at np=4 with the memory check on
    local staging=$1 log=$2
    shift 2
    LLMC_CHECKPOINT_MEMCHECK=1 LLMC_CHECKPOINT_STAGING_MIB=$staging timeout 200 "${MPIRUN[@]}" -np 4 \
        ./train_gpt2 "${D6[@]}" "$@" >"$log" 2>&1
}
# growth OP LOG: every rank's peak growth (MiB) during OP (save|load), one per line
growth() { sed -n "s/^checkpoint memcheck: rank [0-9]* $1: peak growth \([0-9.]*\) MiB.*/\1/p" "$2"; }
# all_at_most LIMIT: every number on stdin is <= LIMIT, and there are 4 of them
all_at_most() { awk -v lim="$1" '{ n++; if ($1 > lim) bad = 1 } END { exit !(n == 4 && !bad) }'; }

if memrun 1 "$TMP/mem_save.log" -x 1 && memrun 32 "$TMP/mem_load.log" -x 2 -y 1; then
    params=$(sed -n 's/^GPT-2: .*, \([0-9]*\) parameters$/\1/p' "$TMP/mem_save.log")
    numel=$(sed -n 's/^zero1: buffer \([0-9]*\) elements.*/\1/p' "$TMP/mem_save.log")
    full_mib=$(awk -v n="$params" 'BEGIN { printf "%.0f", 12 * n / 1048576 }')
    # a load fills the param buffer (fp32, whole on every rank) and this rank's m and v
    buffers_mib=$(awk -v n="$numel" 'BEGIN { printf "%.1f", (4 * n + 8 * n / 4) / 1048576 }')
    save_limit=$((1 + SLACK_MIB)) load_limit=$(awk -v b="$buffers_mib" -v s="$SLACK_MIB" 'BEGIN { print b + 32 + s }')
    note "d6: $params parameters, master+m+v $full_mib MiB; save growth per rank (staging 1 MiB):" \
         "$(growth save "$TMP/mem_save.log" | tr '\n' ' ')MiB; load growth (staging 32 MiB):" \
         "$(growth load "$TMP/mem_load.log" | tr '\n' ' ')MiB, of which $buffers_mib MiB are the optimizer's own buffers"
    if [ "$full_mib" -gt $((4 * save_limit)) ] && growth save "$TMP/mem_save.log" | all_at_most $save_limit; then
        ok "np=4 save: every rank's peak grew <= $save_limit MiB (staging 1 + slack $SLACK_MIB); master+m+v are $full_mib MiB"
    else
        not_ok "np=4 save: peak growth beyond $save_limit MiB"; diag "$(grep memcheck "$TMP/mem_save.log")"
    fi
    if growth load "$TMP/mem_load.log" | all_at_most "$load_limit"; then
        ok "np=4 load: every rank's peak grew <= $load_limit MiB ($buffers_mib MiB of its own buffers + staging 32 + slack)"
    else
        not_ok "np=4 load: peak growth beyond $load_limit MiB"; diag "$(grep memcheck "$TMP/mem_load.log")"
    fi
    if growth save "$TMP/mem_load.log" | all_at_most $((32 + SLACK_MIB)) &&
       [ "$(growth save "$TMP/mem_load.log" | awk '$1 >= 16' | wc -l)" -ge 1 ]; then
        ok "control: with a 32 MiB staging buffer a save grows by >= 16 MiB on some rank, and <= $((32 + SLACK_MIB)) on all"
    else
        not_ok "control: the staging buffer is not seen"; diag "$(grep memcheck "$TMP/mem_load.log")"
    fi
else
    not_ok "the d6 runs at np=4 failed"; diag "$(tail -5 "$TMP/mem_save.log" "$TMP/mem_load.log")"
fi

# ---- 3. a disk that fills up during a save ---------------------------------------------
mkdir -p "$TMP/full"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=4m tmpfs "$TMP/full" 2>/dev/null; then
    mnt=$TMP/full
    timeout 60 "${MPIRUN[@]}" -np 2 ./train_gpt2 -e "$TMP/m.bin" -i $DATA -b 3 -t 32 -x 2 -v 0 -s 0 -n 1 \
        -o "$mnt/run" >"$TMP/full.log" 2>&1
    rc=$?
    # One error of ours; Open MPI's I/O component may print its own line about the failed
    # pwritev first ("error: mca_fbtl_posix_pwritev: ..."), depending on how the write ends.
    ours=$(grep 'error:' "$TMP/full.log" | grep -v '^error: mca_')
    if [ $rc != 0 ] && [ $rc != 124 ] && [ "$(grep -c . <<<"$ours")" = 1 ] &&
       grep -qE "\.checkpoint_00000001\.tmp/(model|optimizer)\.bin: .*(is the disk full|No space)" <<<"$ours" &&
       [ ! -e "$mnt/run/checkpoint_00000001" ]; then
        ok "disk full during a save: $(cut -c1-150 <<<"$ours"); nothing renamed into place"
    else
        not_ok "disk full during a save (exit $rc)"; diag "$(grep -v '^ *$' "$TMP/full.log" | tail -n 25; ls -la "$mnt/run")"
    fi
else
    skip "disk full during a save" "needs root and a tmpfs mount"
fi

done_testing
