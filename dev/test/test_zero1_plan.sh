#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=full
# zero1_plan end to end:
#   1. 2000 random configurations vs the independent Python oracle (dev/test/layout_oracle.py);
#   2. the GPT-2 124M layout, ledger and bucket timing at DP=8 vs arithmetic and reasoning done
#      by hand below, also as 2 distributed-optimizer instances of 4 ranks; the bucket size
#      as Megatron's DDP picks it (64 ranks as 2 instances, overlap off, 0 refused);
#   2d. --optimizer muon on d12 at DP=8: both buffers vs the layer-wise rules worked by hand;
#   3. bad arguments -> usage and exit code 2;
#   4. the zero1 headers compile as C++ (nvcc includes them).
# Run from anywhere; builds zero1_plan with make. Prints TAP (dev/test/test_lib.sh); stops at
# the first failure.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

make -s zero1_plan >/dev/null || fatal "make zero1_plan failed"
[ -x ./zero1_plan ] || fatal "no ./zero1_plan"

# 1. oracle comparison
oracle_out=$($PY dev/test/layout_oracle.py --binary ./zero1_plan --configs 2000 --seed 20240520) \
    || fatal "oracle: $oracle_out"
ok "$oracle_out"

# 2. GPT-2 124M (d12: C=768, L=12, Vp=50304, maxT=1024) at DP=8, default bucket_size 40e6.
C=768; L=12; VP=50304; T=1024; DP=8
LAYER=$((12 * C * C + 13 * C))              # qkvw 3C^2 + attprojw C^2 + fcw 4C^2 + fcprojw 4C^2, 13C of biases/ln
NUMEL=$((VP * C + T * C + L * LAYER + 2 * C)) # every tensor size is a multiple of 256 (C = 3*256), so
                                              # neither 64-alignment nor 128-padding adds anything
[ "$NUMEL" -eq 124475904 ] || fatal "hand arithmetic: numel $NUMEL"
# Buckets (reverse order, close once >= 40e6): lnf (2C) + layers 11..7 + layer 6's fcprojb, fcprojw, fcb, fcw;
B0=$((2 * C + 5 * LAYER + C + 4 * C * C + 4 * C + 4 * C * C))
# then the rest of layer 6 (ln2b ln2w attprojb attprojw qkvb qkvw ln1b ln1w), layers 5..1, layer 0's fcprojb, fcprojw;
B1=$((2 * C + C + C * C + 3 * C + 3 * C * C + 2 * C + 5 * LAYER + C + 4 * C * C))
B2=$((NUMEL - B0 - B1))                      # the tail: rest of layer 0, wpe, wte
json=$(./zero1_plan --model d12 --dp $DP --json) || fatal "zero1_plan --model d12 --json exited $?"
got=$(echo "$json" | $PY -c '
import json, sys
j = json.load(sys.stdin)
b, z = j["ledger"]["bf16_params"], j["ledger"]["fp32_params"]
print(j["numel"], j["numel_unpadded"], j["bucket_size"], j["shared_embedding"],
      " ".join(str(x["end"] - x["start"]) for x in j["buckets"]),
      b["param_buffer"], b["grad_buffer"], b["state_replicated"], b["state_zero1"], b["total_replicated"], b["total_zero1"],
      b["sent_all_reduce"], b["sent_reduce_scatter"], b["sent_all_gather"],
      z["total_replicated"], z["total_zero1"], z["sent_all_gather"])') || fatal "cannot parse the d12 JSON"
OWNED=$((NUMEL / DP))
want="$NUMEL $NUMEL 40000000 None $B0 $B1 $B2 \
$((2 * NUMEL)) $((4 * NUMEL)) $((12 * NUMEL)) $((12 * OWNED)) $((18 * NUMEL)) $((6 * NUMEL + 12 * OWNED)) \
$((2 * (DP - 1) * OWNED * 4)) $(((DP - 1) * OWNED * 4)) $(((DP - 1) * OWNED * 2)) \
$((16 * NUMEL)) $((8 * NUMEL + 8 * OWNED)) $(((DP - 1) * OWNED * 4))"
want=$(echo $want)
[ "$got" == "$want" ] || fatal "d12 DP=8 ledger: got '$got', want '$want'"
text=$(./zero1_plan --model d12 --dp $DP) || fatal "zero1_plan --model d12 exited $?"
for n in $((6 * NUMEL + 12 * OWNED)) $((18 * NUMEL)) $(((DP - 1) * OWNED * 4)); do
    echo "$text" | grep -q " $n " || fatal "text output lacks $n"
done
ok "d12 DP=8: numel $NUMEL, buckets $B0/$B1/$B2, ZeRO-1 $((6 * NUMEL + 12 * OWNED)) B vs replicated $((18 * NUMEL)) B per rank"

# 2a. When each bucket's collectives can start (model blocks: -1 embeddings, 0..11, 12 lnf +
# classifier). Bucket 0 reaches down into h6 and bucket 1 into h0, so their gradients are final
# after those blocks' backward and their params are needed by those blocks' forward; bucket 2
# holds wte, whose encoder contribution comes last (-1). With wte in its own bucket and split,
# its dense part is final after the classifier (12), though the forward needs it first (-1).
timing() {  # timing ARGS...: "ready,needed" per bucket
    ./zero1_plan --model d12 --dp $DP --json "$@" | $PY -c '
import json, sys
print(" ".join("%d,%d" % (b["grads_final_after_backward_of"], b["params_needed_by_forward_of"])
               for b in json.load(sys.stdin)["buckets"]))'
}
got=$(timing) || fatal "timing JSON"
[ "$got" == "6,6 0,0 -1,-1" ] || fatal "d12 DP=8 bucket timing: got '$got'"
got=$(timing --shared-embedding 0 --split-embedding) || fatal "timing JSON (split)"
[ "$got" == "6,6 0,0 -1,-1 12,-1" ] || fatal "d12 DP=8 split-embedding bucket timing: got '$got'"
ok "d12 DP=8: buckets' gradients final after the backward of h6, h0, embeddings (split wte: the classifier)"

# 2c. The ledger of the reduction options. fp32 accumulation: bf16 on the wire (the all-to-all
# sends each peer its slice: (DP-1) x owned x 2 bytes, as a bf16 reduce-scatter) and two
# receive temporaries of the largest bucket (B2) in bf16. The split embedding (P = 1024
# tokens per rank): wte alone in the last bucket (Vp x C), a slot of Vp*C/DP elements meets
# Vp*C/DP/C + 2 rows, so each rank receives at most DP x min(that, P) rows and holds P
# compact ones, fp32; it sends at most (P + DP - 1) rows of C fp32. Averaging changes no bytes.
json=$(./zero1_plan --model d12 --dp $DP --grad-dtype bf16 --fp32-accumulation --average-in-collective --json) ||
    fatal "zero1_plan --fp32-accumulation --json exited $?"
got=$(echo "$json" | $PY -c '
import json, sys
j = json.load(sys.stdin); b = j["ledger"]["bf16_params"]
print(j["grad_dtype"], j["fp32_accumulation"], j["average_in_collective"], b["sent_reduce_scatter"],
      b["recv_temporaries"], b["total_zero1"])') || fatal "cannot parse the fp32-accumulation JSON"
want="bf16 True True $(((DP - 1) * OWNED * 2)) $((4 * B2)) $((2 * NUMEL + 2 * NUMEL + 12 * OWNED + 4 * B2))"
[ "$got" == "$want" ] || fatal "d12 DP=8 fp32-accumulation ledger: got '$got', want '$want'"
P=1024; WTE=$((VP * C)); SLOT_ROWS=$((WTE / DP / C + 2)); RECV=$((DP * (SLOT_ROWS < P ? SLOT_ROWS : P)))
json=$(./zero1_plan --model d12 --dp $DP --split-embedding --tokens $P --json) || fatal "zero1_plan --split-embedding --json"
got=$(echo "$json" | $PY -c '
import json, sys
j = json.load(sys.stdin); b = j["ledger"]["fp32_params"]
print(j["shared_embedding"], j["buckets"][-1]["end"] - j["buckets"][-1]["start"], b["split_rows"], b["split_sent_max"])') ||
    fatal "cannot parse the split JSON"
want="0 $WTE $(((P + RECV) * C * 4)) $(((P + DP - 1) * C * 4))"
[ "$got" == "$want" ] || fatal "d12 DP=8 split-embedding ledger: got '$got', want '$want'"
text=$(./zero1_plan --model d12 --dp $DP --grad-dtype bf16 --fp32-accumulation --split-embedding --tokens $P) ||
    fatal "zero1_plan with the options exited $?"
for line in "fp32-acc. recv temporaries (2 slots)" "split-emb. rows (compact + received)" "wte encoder rows (fp32), at most" \
            "all-to-all"; do
    grep -qF "$line" <<<"$text" || fatal "the options' text output lacks '$line'"
done
ok "d12 DP=8: fp32 accumulation $((4 * B2)) B of receive temporaries; split embedding $(((P + RECV) * C * 4)) B of rows, at most $(((P + DP - 1) * C * 4)) B sent sparsely"

# 2b. The same 8 ranks as K=2 instances of G=4: the layout is DP=4's (d12 needs no padding at
# lcm(4,128) either, and the 40e6 default holds), each rank owns numel/4 and sends, per step,
# reduce-scatter 3/4 numel fp32 + all-gather 3/4 numel bf16 inside its group, and the ring
# all-reduce of its owned shard across the 2 groups: 2*(2-1)/2 * numel/4 fp32. The replicated
# column is still the all-reduce over all 8 ranks.
K=2; G=$((DP / K)); OWNED_G=$((NUMEL / G))
json=$(./zero1_plan --model d12 --dp $DP --instances $K --json) || fatal "zero1_plan --instances $K --json exited $?"
got=$(echo "$json" | $PY -c '
import json, sys
j = json.load(sys.stdin)
b = j["ledger"]["bf16_params"]
print(j["dp"], j["instances"], j["group_size"], j["numel"], " ".join(str(x["end"] - x["start"]) for x in j["buckets"]),
      b["state_zero1"], b["total_zero1"], b["sent_all_reduce"], b["sent_reduce_scatter"], b["sent_all_gather"],
      b["sent_cross_all_reduce"], b["sent_zero1"], len({s["rank"] for s in j.get("shards", [])}))') \
    || fatal "cannot parse the d12 instances JSON"
want="$DP $K $G $NUMEL $B0 $B1 $B2 $((12 * OWNED_G)) $((6 * NUMEL + 12 * OWNED_G)) $((2 * (DP - 1) * NUMEL * 4 / DP)) \
$(((G - 1) * OWNED_G * 4)) $(((G - 1) * OWNED_G * 2)) $((2 * (K - 1) * OWNED_G * 4 / K)) \
$(((G - 1) * OWNED_G * 6 + 2 * (K - 1) * OWNED_G * 4 / K)) 0"
want=$(echo $want)
[ "$got" == "$want" ] || fatal "d12 DP=8 K=2 ledger: got '$got', want '$want'"
shard_ranks=$(./zero1_plan --model d12 --dp $DP --instances $K --json --shards | $PY -c '
import json, sys; print(sorted({s["rank"] for s in json.load(sys.stdin)["shards"]}))')
[ "$shard_ranks" == "[0, 1, 2, 3]" ] || fatal "d12 DP=8 K=2: shards of ranks $shard_ranks, want a group's 0..3"
text=$(./zero1_plan --model d12 --dp $DP --instances $K) || fatal "zero1_plan --instances exited $?"
for n in $((2 * (K - 1) * OWNED_G * 4 / K)) $(((G - 1) * OWNED_G * 6)) $((6 * NUMEL + 12 * OWNED_G)); do
    echo "$text" | grep -q " $n " || fatal "instances text output lacks $n"
done
ok "d12 DP=8 as 2 instances of 4: state $((12 * OWNED_G)) B per rank, sent inside the group $(((G - 1) * OWNED_G * 6)) B, across $((2 * (K - 1) * OWNED_G * 4 / K)) B"

# 2c. Megatron's DistributedDataParallel picks the bucket size (dev/test/test_megatron_layout.sh
# runs its code): the default max(40e6, 1e6 x DP) over all the ranks, instances included (64 ranks
# as 2 instances of 32: 64e6, where the group's 32 ranks would give 40e6), and one bucket without
# overlap, a --bucket-size given then noted as unused.
got=$(./zero1_plan --model d12 --dp 64 --instances 2 --json | $PY -c '
import json, sys; j = json.load(sys.stdin); print(j["bucket_size"], j["group_size"], len(j["buckets"]))') ||
    fatal "zero1_plan --dp 64 --instances 2 --json"
[ "$got" == "64000000 32 2" ] || fatal "d12 DP=64 K=2 default bucket size: got '$got', want '64000000 32 2'"
got=$(./zero1_plan --model d12 --dp 8 --bucket-size 40000 --no-overlap-grad-reduce --json | $PY -c '
import json, sys; j = json.load(sys.stdin); print(j["bucket_size"], j["overlap_grad_reduce"], len(j["buckets"]))') ||
    fatal "zero1_plan --no-overlap-grad-reduce --json"
[ "$got" == "None False 1" ] || fatal "d12 DP=8 --no-overlap-grad-reduce: got '$got', want one bucket"
./zero1_plan --model d12 --dp 8 --bucket-size 40000 --no-overlap-grad-reduce | grep -q "^note: --bucket-size 40000 is not used" ||
    fatal "no note that --bucket-size is not used without overlap"
err=$(./zero1_plan --numels 1,2 --bucket-size 0 2>&1 >/dev/null)
grep -q "use --bucket-size none (Megatron's bucket_size=0 would close a bucket after every parameter" <<<"$err" ||
    fatal "--bucket-size 0: no message pointing at none: $err"
ok "bucket size as Megatron's DDP: default over all 64 ranks with 2 instances (64e6, 2 buckets); one bucket without overlap; 0 refused"

# 3. bad arguments -> exit 2 with a usage message
bad_cases=(
    ""
    "--dp 4"
    "--numels 1,2 --model d12"
    "--numels 1,0,2"
    "--numels 1,-2"
    "--numels 1,,2"
    "--numels abc"
    "--numels 1,2 --dp 0"
    "--numels 1,2 --dp -1"
    "--numels 1,2 --dp"
    "--numels 1,2 --bucket-size -5"
    "--numels 1,2 --bucket-size 1e6"
    "--numels 1,2 --bucket-size 0"
    "--numels 1,2 --shared-embedding 2"
    "--numels 1,2 --shared-embedding x"
    "--numels 18446744073709551615,2"
    "--numels 18446744073709551616"
    "--numels 1,2 --frobnicate"
    "--model x12"
    "--model d0"
    "--model d12 --heads 7"
    "--model d12 --vocab 0"
    "--numels 1,2 --dp 4 --instances 3"
    "--numels 1,2 --dp 4 --instances 0"
    "--numels 1,2 --instances 2"
    "--numels 1,2 --dp 4 --instances x"
    "--numels 1,2 --split-embedding"
    "--model d12 --fp32-accumulation"
    "--model d12 --grad-dtype fp16"
    "--model d12 --split-embedding --tokens 0"
    "--model d2 --dp 3 --dp-invariant"
    "--model d2 --dp-invariant --accumulation 3"
    "--model d12 --optimizer sgd"
    "--model d12 --dp 8 --instances 2 --optimizer muon"
    "--numels 1,2 --optimizer muon"
    "--numels 1,2 --matrices 0"
    "--numels 1,2 --optimizer muon --matrices 2"
    "--numels 1,2 --optimizer muon --matrices 0 --shared-embedding 0"
    "--numels 1,2 --optimizer muon --matrices 0 --wpe muon"
    "--model d12 --optimizer muon --matrices 1"
    "--model d12 --optimizer muon --wpe sgd"
)
for args in "${bad_cases[@]}"; do
    # shellcheck disable=SC2086
    err=$(./zero1_plan $args 2>&1 >/dev/null); rc=$?
    [ $rc -eq 2 ] || fatal "'zero1_plan $args' exited $rc, want 2"
    echo "$err" | grep -q "usage:" || fatal "'zero1_plan $args' printed no usage"
    [ "$(grep -c '^error: ' <<<"$err")" = 1 ] || fatal "'zero1_plan $args' printed no single 'error:' line naming the problem"
done
grep -q "^error: --optimizer muon refuses --instances > 1: Megatron's layer-wise optimizer" <<<"$(./zero1_plan --model d2 --dp 4 --instances 2 --optimizer muon 2>&1)" ||
    fatal "--optimizer muon --instances 2: the error does not say why"
grep -q "^error: --dp-invariant needs a power-of-two --dp" <<<"$(./zero1_plan --model d2 --dp 3 --dp-invariant 2>&1)" ||
    fatal "--dp 3 --dp-invariant: the error does not name the power of two"
grep -q "^error: bad --accumulation '3' (a power of two)" <<<"$(./zero1_plan --model d2 --dp-invariant --accumulation 3 2>&1)" ||
    fatal "--accumulation 3: the error does not name it"
./zero1_plan --batch /nonexistent/file >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fatal "--batch on a missing file exited $rc, want 2"
printf -- '--numels 1,2 --dp 2\n--numels 0\n' | ./zero1_plan --batch - >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fatal "a bad batch line exited $rc, want 2"
./zero1_plan --help | grep -q "usage:" || fatal "--help"
ok "${#bad_cases[@]} bad-argument cases, --batch and --help: exit 2, usage, one error line naming the problem"

# 2d. --optimizer muon, d12 at DP=8, default bucket size 40e6 (Muon's matrices: qkvw 3C^2 =
# 1769472, attprojw C^2 = 589824, fcw = fcprojw 4C^2 = 2359296; a layer's 12C^2 = 7077888). The
# floor int(8 x 2359296 x 0.9) = 16986931 is below 40e6, so chunks close at 40e6 in backprop
# order: layers 11..7 (35389440) + h6.fcprojw + h6.fcw = 40108032 (22 matrices); h6.attprojw,
# h6.qkvw, layers 5..1, h0.fcprojw = 40108032 (23); the tail h0.fcw, h0.attprojw, h0.qkvw =
# 4718592. LPT, bucket 0: the 12 of 2359296 one to each shard, then shards 0-3 a second
# (4718592); the 5 qkvw to shards 4-7 (4128768) and 4 (5898240); the 5 attprojw to 5, 6, 7
# (4718592), 0 and 1 (5308416): shard size 5898240 (a multiple of 64). Bucket 1 the same with
# 11 big ones (shards 0-2 a second), 6 qkvw (3-7, then 3: 5898240), 6 attprojw (4-7, 0, 1):
# 5898240. Bucket 2: one matrix in each of shards 0-2, shard 2359296. Layer-wise numel
# 2 x 8 x 5898240 + 8 x 2359296 = 113246208. Rank 0 owns two big ones and an attprojw in
# buckets 0 and 1 and h0.fcw: 2 x 5308416 + 2359296 = 12976128 elements, the most: Muon's state
# (fp32 master + momentum with bf16 params) 8 x 12976128 B. AdamW's buffer: the other 100
# tensors, 124475904 - 12 x 7077888 = 39541248 elements, one bucket, no padding (multiples of 256).
MUON=$((12 * 7077888)); ADAMW=$((NUMEL - MUON)); MOST=$((2 * 5308416 + 2359296))
json=$(./zero1_plan --model d12 --dp $DP --optimizer muon --json --shards) || fatal "zero1_plan --optimizer muon --json exited $?"
got=$(echo "$json" | $PY -c '
import json, sys
j = json.load(sys.stdin)
a, m = j["buffers"]
plain = set(json.loads(sys.argv[1]))
lb = m["ledger"]["bf16_params"]
print(j["optimizer"], a["optimizer"], m["optimizer"], sorted(plain - set(a)), sorted(plain - set(m)),
      a["numel"], len(a["buckets"]), m["numel"], m["numel_unpadded"],
      " ".join("%d/%d" % (b["numel_unpadded"], b["shard_size"]) for b in m["buckets"]),
      max(r["param_numel"] for r in m["ranks"]), lb["state_bytes"], lb["state_zero1"],
      sorted(len([s for s in x["shards"] if s["rank"] == 0]) for x in (a, m)),
      all(p["param"] == [0, p["gbuf_world"][1] - p["gbuf_world"][0]] for s in m["shards"] for p in s["params"]))
' "$(./zero1_plan --model d12 --dp $DP --json --shards | $PY -c 'import json, sys; print(json.dumps(list(json.load(sys.stdin))))')") ||
    fatal "cannot parse the --optimizer muon JSON"
want="muon adamw muon [] [] $ADAMW 1 113246208 $MUON 40108032/5898240 40108032/5898240 4718592/2359296 $MOST 8 $((8 * MOST)) [1, 3] True"
[ "$got" == "$want" ] || fatal "d12 DP=8 --optimizer muon: got '$got', want '$want'"
text=$(./zero1_plan --model d12 --dp $DP --optimizer muon) || fatal "zero1_plan --optimizer muon exited $?"
for line in "rank 0     7 matrices     $MOST elements: h0.fcw h1.fcprojw h2.attprojw h5.fcprojw h7.fcprojw h8.attprojw h11.fcprojw" \
            "padding 28311552 elements = 25.0000%" "fp32 master+momentum (8 B/elem)" "megatron-core routes wpe"; do
    grep -qF "$line" <<<"$text" || fatal "the --optimizer muon text lacks '$line'"
done
ok "d12 DP=8 --optimizer muon: AdamW buffer $ADAMW, layer-wise $MUON in 3 buckets of shards 5898240, 5898240, 2359296 (25% padding); rank 0 owns the most, $MOST elements"

# 4. headers as C++
if command -v g++ >/dev/null; then
    printf '#include "zero1/layout.h"\n#include "zero1/layout_layerwise.h"\n#include "zero1/shards.h"\n#include "zero1/ledger.h"\nint main(){Zero1Layout l; (void)l; return 0;}\n' |
        g++ -x c++ -std=c++17 -Wall -Wextra -Werror -I. -fsyntax-only - || fatal "zero1 headers do not compile as C++"
    ok "the zero1 headers compile as C++"
else
    skip "the zero1 headers as C++" "no g++"
fi
done_testing
