#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# Validation does not depend on the rank count (-m counts global batches, run/eval.h):
#   1. one checkpoint (the small model, 2 steps, -n 2); its model evaluated with -x 0 at
#      np 1, 2 and 4 (ZeRO-1 build, -m 13: not a multiple of 2 or 4, and past the first of
#      three odd-sized val shards) prints the same val loss within 2e-6 (float summation);
#   2. that loss equals an independent one: the PyTorch oracle's mean cross-entropy over the
#      first 13 batches of B x T tokens in file order (each shard read as its whole batches);
#   3. planted: the old per-rank meaning (np 2 reading 13 batches each = the first 26) gives
#      the oracle's mean over 26 batches, which differs from the 13-batch loss by more than
#      the tolerance, so this test would have failed it;
#   4. -m beyond the val split's 33 batches is read as those 33, with one line, at np 1 and 4
#      (-m 2147483647 no longer loops), and -m 3 at np 4 (a rank without a batch) still agrees.
# About 6 s.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

small_model "$TMP" >"$TMP/setup.log" 2>&1 && random_shards "$TMP" >>"$TMP/setup.log" 2>&1 &&
    pattern_shard "$TMP/train.bin" >>"$TMP/setup.log" 2>&1 || fatal "set-up" "$TMP/setup.log"
VAL="$TMP/shard_*.bin"
B=2 T=32 TOL=2e-6

timeout 60 ./train_gpt2 -e "$TMP/m.bin" -i "$TMP/train.bin" -j "$VAL" -b $B -t $T -x 2 -v 100 -s 0 -n 2 \
    -o "$TMP/run" >"$TMP/train.log" 2>&1 || fatal "2 steps with a checkpoint" "$TMP/train.log"
CKPT=$TMP/run/checkpoint_00000002/model.bin
[ -f "$CKPT" ] || fatal "the checkpoint's model.bin" "$TMP/train.log"

# val NP M: the val loss of the checkpoint at NP ranks with -m M (its log: $TMP/val_NP_M.log).
val() {
    local log=$TMP/val_$1_$2.log
    timeout 60 "${MPIRUN[@]}" -np "$1" ./train_gpt2 -e "$CKPT" -i "$TMP/train.bin" -j "$VAL" -b $B -t $T -x 0 \
        -v 100 -m "$2" -s 0 >"$log" 2>&1 || { echo "exit $?"; return 1; }
    sed -n 's/^val loss \([0-9.]*\)$/\1/p' "$log"
}
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= t) }'; }

# The oracle's mean losses over the first 13 and 26 batches, and the batches there are: shards in sorted order, each read as
# floor(floor((n-1)/T)/B) batches of B rows of T+1 tokens (row j: tokens jT .. jT+T).
oracle_means() {
    $PY - "$CKPT" "$TMP" "$B" "$T" <<'PYEOF'
import glob, sys
sys.path.insert(0, "dev/test")
import numpy as np, torch
import gpt2_oracle as o
ckpt, d, B, T = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
cfg, p, _ = o.read_model(ckpt)
batches = []
for path in sorted(glob.glob(f"{d}/shard_*.bin")):
    toks = np.fromfile(path, dtype="<u2", offset=1024).astype(np.int64)
    rows = (len(toks) - 1) // T
    for b in range(rows // B):
        batches.append(np.stack([toks[(b * B + r) * T:(b * B + r) * T + T + 1] for r in range(B)]))
with torch.no_grad():
    losses = [o.forward(cfg, p, torch.tensor(x[:, :-1]), torch.tensor(x[:, 1:]))[1].item() for x in batches[:26]]
print(f"{sum(losses[:13]) / 13:.6f} {sum(losses) / 26:.6f} {len(batches)}")
PYEOF
}

v1=$(val 1 13) && v2=$(val 2 13) && v4=$(val 4 13) || fatal "a val run failed: $v1 $v2 $v4" "$TMP/val_4_13.log"
if near "$v1" "$v2" $TOL && near "$v1" "$v4" $TOL; then
    ok "-m 13: the same val loss at np 1, 2, 4 ($v1, $v2, $v4; tolerance $TOL)"
else
    not_ok "-m 13: val loss at np 1, 2, 4: $v1, $v2, $v4 (tolerance $TOL)"
fi

means=$(oracle_means 2>"$TMP/oracle.log") || fatal "the oracle's means" "$TMP/oracle.log"
read -r want13 want26 nbatches <<<"$means"
near "$v1" "$want13" 2e-5 && ok "the oracle's mean over the first 13 batches: $want13 (trainer $v1)" ||
    not_ok "the oracle's mean over the first 13 batches is $want13, the trainer's $v1"
if ! near "$want13" "$want26" $TOL && near "$(val 1 26)" "$want26" 2e-5; then
    ok "planted: the old per-rank meaning at np 2 (26 batches: $want26) differs from $want13 beyond $TOL"
else
    not_ok "planted: 26 batches ($want26, trainer $(val 1 26)) do not tell from 13 ($want13)"
fi

[ "$nbatches" = 33 ] || fatal "the oracle counts $nbatches val batches, this test expects 33"
line="validation: -m 2147483647, but the val split holds 33 batches of B=2 x T=32 tokens; reading those 33"
all=$(val 1 33)
for np in 1 4; do
    got=$(val $np 2147483647)
    if near "$got" "$all" $TOL && [ "$(grep -cxF "$line" "$TMP/val_${np}_2147483647.log")" = 1 ]; then
        ok "np $np, -m 2147483647: the whole split's 33 batches ($got), one line"
    else
        not_ok "np $np, -m 2147483647: $got (33 batches: $all)" "$TMP/val_${np}_2147483647.log"
    fi
done
v3=$(val 1 3) && v3_4=$(val 4 3)
near "$v3" "$v3_4" $TOL && ok "-m 3 at np 4 (rank 3 has no batch): $v3_4 = np 1's $v3" ||
    not_ok "-m 3: np 1 $v3, np 4 $v3_4"
done_testing
