#!/usr/bin/env bash
# test: timeout=120 lane=cpu tier=full
# hf_convert (tools/hf_convert.c): llm.c model files <-> Hugging Face GPT-2 directories,
# against an independent reference (dev/test/hf_reference.py: its own safetensors reader
# and writer, the oracle's GPT-2 in torch) on a tiny model (L=2 C=32 NH=4 V=50257 maxT=32).
#
#   bytes       export = the reference's writer, byte for byte; llm.c -> HF -> llm.c and
#               HF -> llm.c -> HF byte-identical (fp32 and bf16); the published `gpt2`
#               naming (no prefix, attn.bias buffers; F32, F16, BF16) imports
#   padding     non-zero padded vocabulary rows: export warns and drops them, so the
#               round trip gives them back as zeros (the one condition for byte identity)
#   checkpoints the trainer fine-tunes an imported model (2 steps, loss falls); its run
#               directory, checkpoint directory and model.bin export alike
#   logits      the oracle on each safetensors file = on the llm.c file (1e-5), and
#               transformers' GPT2LMHeadModel.from_pretrained too: the real client, pinned,
#               from scripts/install_hf_client.sh (SKIPPED only where PyPI cannot be reached
#               outside CI; a failure in CI)
#   bad input   one `error:` line, exit 1, no output file left
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
source dev/test/expect_error.sh
REF=dev/test/hf_reference.py
HC=./hf_convert
t0=$SECONDS

# Built by run_tests.sh's build steps (calling make here would rewrite the build stamps).
[ -x $HC ] || fatal "$HC is built (make hf_convert)"
[ -x ./train_gpt2 ] || fatal "./train_gpt2 is built (make train_gpt2)"
[ -f data/tinyshakespeare_train.bin ] || fatal "data/ is there (make data)"

F=$TMP/fx
if ! $PY $REF fixtures --out "$F" >"$TMP/fixtures.log" 2>&1; then
    fatal "the reference makes its fixtures" "$TMP/fixtures.log"
fi
M=$F/model.bin

# run NAME CMD...: the command must succeed (its output in $TMP/NAME.log).
run() {
    local name=$1; shift
    if "$@" >"$TMP/$name.log" 2>&1; then return 0; fi
    not_ok "$name: '$*' failed" "$TMP/$name.log"
    return 1
}
same() {  # NAME A B: byte-identical files
    if cmp -s "$2" "$3"; then ok "$1"; else not_ok "$1: $2 and $3 differ ($(cmp "$2" "$3" 2>&1 | head -1))"; fi
}

note "round trips"
run export_m $HC export "$M" "$TMP/e1" &&
    same "export writes the reference writer's bytes" "$F/canonical/model.safetensors" "$TMP/e1/model.safetensors"
run import_e1 $HC import "$TMP/e1" "$TMP/b1.bin" && same "llm.c -> HF -> llm.c is byte-identical" "$M" "$TMP/b1.bin"
run export_b1 $HC export "$TMP/b1.bin" "$TMP/e2" &&
    same "HF -> llm.c -> HF is byte-identical (safetensors)" "$TMP/e1/model.safetensors" "$TMP/e2/model.safetensors" &&
    same "HF -> llm.c -> HF is byte-identical (config.json)" "$TMP/e1/config.json" "$TMP/e2/config.json"
run import_ref $HC import "$F/canonical/model.safetensors" "$TMP/c.bin" && run export_c $HC export "$TMP/c.bin" "$TMP/e3" &&
    same "reference HF file -> llm.c -> HF is byte-identical" "$F/canonical/model.safetensors" "$TMP/e3/model.safetensors"
run export_bf16 $HC export "$M" "$TMP/eb1" --dtype bf16 && run import_bf16 $HC import "$TMP/eb1" "$TMP/bb1.bin" --dtype bf16 &&
    run export_bb1 $HC export "$TMP/bb1.bin" "$TMP/eb2" --dtype bf16 &&
    same "bf16: HF -> llm.c (version 5) -> HF is byte-identical" "$TMP/eb1/model.safetensors" "$TMP/eb2/model.safetensors"
run import_eb2 $HC import "$TMP/eb2" "$TMP/bb2.bin" --dtype bf16 &&
    same "bf16: llm.c (version 5) -> HF -> llm.c is byte-identical" "$TMP/bb1.bin" "$TMP/bb2.bin"
if [ -f "$TMP/bb1.bin" ] && [ "$(od -An -tu4 -j4 -N4 "$TMP/bb1.bin" | tr -d ' ')" = 5 ]; then
    ok "--dtype bf16 import writes a version 5 model file"
else
    not_ok "--dtype bf16 import did not write a version 5 model file"
fi

note "the published naming (h.N..., attn.bias buffers)"
run import_pub $HC import "$F/published" "$TMP/pub.bin" && same "published F32 imports to the same model file" "$M" "$TMP/pub.bin"
run import_tied $HC import "$F/tied_head" "$TMP/tied.bin" && same "a stored lm_head.weight equal to wte is accepted" "$M" "$TMP/tied.bin"
run import_pub16 $HC import "$F/published_f16" "$TMP/pub_f16.bin"   # its logits are checked below
run import_pubb16 $HC import "$F/published_bf16/model.safetensors" "$TMP/pub_bf16.bin" &&
    run export_pubb16 $HC export "$TMP/pub_bf16.bin" "$TMP/e_pub_bf16" --dtype bf16 &&
    same "published BF16 (rounded by the reference) -> llm.c -> BF16 = export --dtype bf16" \
        "$TMP/eb1/model.safetensors" "$TMP/e_pub_bf16/model.safetensors"

note "padded vocabulary rows"
if run export_padded $HC export "$F/padded_noise.bin" "$TMP/ep"; then
    if grep -q "warning: .*padded vocabulary rows 50257..50303 of wte are not zero" "$TMP/export_padded.log"; then
        ok "export warns about non-zero padded rows"
    else
        not_ok "no warning about non-zero padded rows" "$TMP/export_padded.log"
    fi
    same "padded rows are dropped: the same safetensors as without them" "$TMP/e1/model.safetensors" "$TMP/ep/model.safetensors"
    run import_ep $HC import "$TMP/ep" "$TMP/bp.bin" && same "... and come back as zeros" "$M" "$TMP/bp.bin"
    if cmp -s "$F/padded_noise.bin" "$TMP/bp.bin"; then not_ok "non-zero padded rows survived a round trip?"
    else ok "with non-zero padded rows llm.c -> HF -> llm.c is not byte-identical (the stated condition)"; fi
fi

note "fine-tuning an imported model, exporting its checkpoints"
RUN=$TMP/run
if run train ./train_gpt2 -e "$TMP/b1.bin" -b 2 -t 32 -x 2 -a 1 -l 1e-3 -v 0 -s 0 -z 0 -n 2 -o "$RUN"; then
    mapfile -t losses < <(sed -n 's/^step *[0-9]*\/2 | loss \([0-9.]*\) .*/\1/p' "$TMP/train.log")
    if [ ${#losses[@]} = 2 ] && awk -v a="${losses[0]}" -v b="${losses[1]}" 'BEGIN { exit !(b < a) }'; then
        ok "train_gpt2 -e imported.bin: 2 steps, loss ${losses[0]} -> ${losses[1]}"
    else
        not_ok "train_gpt2 on the imported model: expected 2 steps with a falling loss, got '${losses[*]}'"
    fi
fi
CK=$RUN/checkpoint_00000002
run export_run $HC export "$RUN" "$TMP/e_run" && run export_ck $HC export "$CK" "$TMP/e_ck" &&
    run export_ckbin $HC export "$CK/model.bin" "$TMP/e_ckbin" &&
    same "a run directory exports its newest checkpoint" "$TMP/e_run/model.safetensors" "$TMP/e_ckbin/model.safetensors" &&
    same "a checkpoint directory exports its model.bin" "$TMP/e_ck/model.safetensors" "$TMP/e_ckbin/model.safetensors"

note "files that transformers itself wrote (save_pretrained)"
TS=$TMP/transformers
TS_PAIRS=()
hf_client || not_ok "the real client: scripts/install_hf_client.sh failed"
if [ -n "$HF_PY" ] && run transformers_save "$HF_PY" $REF transformers-save --out "$TS"; then
    for kind in lm_head base; do  # GPT2LMHeadModel's names (prefixed), GPT2Model's (unprefixed)
        run "import_transformers_$kind" $HC import "$TS/$kind" "$TMP/ts_$kind.bin" &&
            ok "imports what transformers' $kind save_pretrained wrote" && TS_PAIRS+=(--pair "$TMP/ts_$kind.bin" "$TS/$kind")
    done
fi

note "logits (the reference reads the safetensors files itself)"
# Negative control: the fine-tuned checkpoint's export is not the model it started from.
if "${HF_CHECK[@]}" --pair "$M" "$TMP/e1" --pair "$TMP/pub_f16.bin" "$F/published_f16" --pair "$CK/model.bin" "$TMP/e_ck" \
        --pair-bf16 "$M" "$TMP/eb1" "${TS_PAIRS[@]}" --pair-mismatch "$M" "$TMP/e_ck" >"$TMP/check.log" 2>&1; then
    ok "logits agree: export, F16 import, checkpoint export, bf16 export${TS_PAIRS:+, files written by transformers}; the negative control fails"
else
    not_ok "the logits check failed"
fi
sed 's/^/       | /' "$TMP/check.log"

note "bad input"
BIN=$HC BASE=()
# refuse NAME OUT KEYWORD... -- ARGS: one error (check), and nothing at OUT (for an export
# directory created before the failure: no file in it) nor at OUT.tmp.
refuse() {
    local name=$1 out=$2; shift 2
    expect_error "$name" 1 "$@"
    if [ -e "$out.tmp" ] || { [ -d "$out" ] && [ -n "$(ls -A "$out")" ]; } || { [ -e "$out" ] && [ ! -d "$out" ]; }; then
        not_ok "$name: left output behind: $(ls -ld "$out" "$out.tmp" "$out"/* 2>/dev/null | tr '\n' ' ')"
    fi
}
B=$TMP/bad
mkdir -p "$B"
head -c 2000 /dev/urandom >"$B/random.bin"
head -c 10 "$M" >"$B/tiny.bin"
head -c 100000 "$M" >"$B/truncated.bin"
cp "$M" "$B/version4.bin" && set_int32 "$B/version4.bin" 1 4
echo hello >"$B/afile"
mkdir -p "$B/emptydir" "$B/run/checkpoint_00000002"
cp "$CK"/* "$B/run/checkpoint_00000002/" && printf '\x55' | dd of="$B/run/checkpoint_00000002/model.bin" bs=1 seek=5000 conv=notrunc 2>/dev/null
refuse export_not_a_model "$B/o1" "not a GPT-2 model file" -- export "$B/random.bin" "$B/o1"
refuse export_too_small "$B/o2" "too small to be a model file" -- export "$B/tiny.bin" "$B/o2"
refuse export_truncated "$B/o3" "truncated or corrupt" -- export "$B/truncated.bin" "$B/o3"
refuse export_version "$B/o4" "unsupported model version 4" -- export "$B/version4.bin" "$B/o4"
refuse export_missing "$B/o5" "cannot read" "nothere.bin" -- export "$B/nothere.bin" "$B/o5"
refuse export_plain_dir "$B/o6" "neither a checkpoint" -- export "$B/emptydir" "$B/o6"
refuse export_corrupt_checkpoint "$B/o7" "checksum mismatch" -- export "$B/run" "$B/o7"
refuse export_out_under_file "$B/afile/out" "cannot create output directory" -- export "$M" "$B/afile/out"
expect_error export_out_is_file 1 "exists and is not a directory" -- export "$M" "$B/afile"
mkdir -p "$B/o_exists" && cp "$F/canonical/config.json" "$B/o_exists/"
expect_error export_existing 1 "o_exists/config.json exists (an earlier export?): --overwrite replaces it" -- export "$M" "$B/o_exists"
check "export_existing --overwrite: replaced" $HC export "$M" "$B/o_exists" --overwrite
refuse export_bad_dtype "$B/o8" "--dtype expects one of fp32|bf16" -- export "$M" "$B/o8" --dtype fp16
refuse usage "$B/o9" "expected 'export IN OUT_DIR' or 'import IN OUT.bin'" -- convert "$M" "$B/o9"
# A full disk: writes past 64 KiB fail (SIGXFSZ ignored, so write() returns EFBIG).
printf 'trap "" XFSZ; ulimit -f 64; exec %s "$@"\n' "$HC" >"$B/limited.sh"
BIN="bash $B/limited.sh" refuse export_disk_full "$B/o10" "write failed" -- export "$M" "$B/o10"
BIN=$HC

for fx in missing:"tensor 'h.1.mlp.c_fc.bias' is missing" unknown:"unknown tensor 'transformer.h.0.attn.rotary.weight'" \
          misshaped:"'transformer.h.0.attn.c_attn.weight' has shape [96, 32], expected [32, 96]" \
          untied:"'lm_head.weight' differs from wte" beyond:"'transformer.h.2.ln_1.weight' is for layer 2" \
          duplicate:"'transformer.wte.weight' and 'wte.weight' are the same parameter" \
          bad_activation:"activation_function"; do
    refuse "import_${fx%%:*}" "$B/i_${fx%%:*}.bin" "${fx#*:}" -- import "$F/${fx%%:*}" "$B/i_${fx%%:*}.bin"
done
mkdir -p "$B/trunc" "$B/notst" "$B/badjson" "$B/noconfig"
cp "$F/canonical/config.json" "$B/trunc/" && head -c 3000000 "$F/canonical/model.safetensors" >"$B/trunc/model.safetensors"
cp "$F/canonical/config.json" "$B/notst/" && cp "$M" "$B/notst/model.safetensors"
cp "$F/canonical"/* "$B/badjson/" && printf '#' | dd of="$B/badjson/model.safetensors" bs=1 seek=40 conv=notrunc 2>/dev/null
cp "$F/canonical/model.safetensors" "$B/noconfig/"
refuse import_truncated "$B/i1.bin" "truncated" -- import "$B/trunc" "$B/i1.bin"
refuse import_not_safetensors "$B/i2.bin" "not a safetensors file" -- import "$B/notst" "$B/i2.bin"
refuse import_bad_json "$B/i3.bin" "malformed JSON at byte" -- import "$B/badjson" "$B/i3.bin"
refuse import_no_config "$B/i4.bin" "cannot open" "config.json" -- import "$B/noconfig" "$B/i4.bin"
# A key twice: Python's json (so transformers) takes the last value, a first-match lookup
# the first; here n_layer 2 (the tensors' count), then 3: refused, naming the key.
mkdir -p "$B/dupkey" && cp "$F/canonical/model.safetensors" "$B/dupkey/" &&
    $PY -c 'import sys; t = open(sys.argv[1]).read().rstrip()[:-1]; open(sys.argv[2], "w").write(t + ",\n  \"n_layer\": 3\n}\n")' \
        "$F/canonical/config.json" "$B/dupkey/config.json"
if [ "$($PY -c 'import json, sys; print(json.load(open(sys.argv[1]))["n_layer"])' "$B/dupkey/config.json")" = 3 ] &&
   [ "$(grep -c '"n_layer"' "$B/dupkey/config.json")" = 2 ]; then
    refuse import_duplicate_key "$B/i6.bin" 'key "n_layer" appears twice' "config.json" -- import "$B/dupkey" "$B/i6.bin"
else
    not_ok "import_duplicate_key: the fixture is not n_layer 2, then 3 (the last, as Python reads it)"
fi
# The header is UTF-8 JSON whose __metadata__ maps strings to strings (the format's rules), and
# an untied lm_head cannot become llm.c's model: each refused, not imported.
sthead() {  # sthead SRC DST PYEXPR: DST/model.safetensors with SRC's header text h rewritten as PYEXPR
    mkdir -p "$2" && cp "$1/config.json" "$2/" && $PY - "$1/model.safetensors" "$2/model.safetensors" "$3" <<'PYEOF'
import struct, sys
src, dst, expr = sys.argv[1:4]
data = open(src, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
h = data[8:8 + n]
h = eval(expr)
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + data[8 + n:])
PYEOF
}
sthead "$F/canonical" "$B/not_utf8" 'h.replace(b"\"pt\"", b"\"p\xff\"", 1)'
sthead "$F/canonical" "$B/meta_list" 'h.replace(b"{\"format\":\"pt\"}", b"[\"pt\"]", 1)'
sthead "$F/canonical" "$B/meta_number" 'h.replace(b"\"pt\"", b"1", 1)'
mkdir -p "$B/untied_cfg" && cp "$F/canonical/model.safetensors" "$B/untied_cfg/" &&
    $PY -c 'import json, sys; c = json.load(open(sys.argv[1])); c["tie_word_embeddings"] = False; json.dump(c, open(sys.argv[2], "w"))' \
        "$F/canonical/config.json" "$B/untied_cfg/config.json"
refuse import_header_not_utf8 "$B/i7.bin" "a byte that is not UTF-8" -- import "$B/not_utf8" "$B/i7.bin"
refuse import_metadata_list "$B/i8.bin" "__metadata__ is not a map of strings to strings" -- import "$B/meta_list" "$B/i8.bin"
refuse import_metadata_number "$B/i9.bin" "__metadata__ is not a map of strings to strings" -- import "$B/meta_number" "$B/i9.bin"
refuse import_untied "$B/i10.bin" '"tie_word_embeddings" must be true' -- import "$B/untied_cfg" "$B/i10.bin"
refuse import_out_under_file "$B/afile/x.bin" "cannot open" -- import "$F/canonical" "$B/afile/x.bin"
expect_error import_out_is_dir 1 "exists and is not a regular file" -- import "$F/canonical" "$B/emptydir"
BIN="bash $B/limited.sh" refuse import_disk_full "$B/i5.bin" "write failed" -- import "$F/canonical" "$B/i5.bin"

note "non-finite weights (a model that diverged): refused both ways unless --allow-nonfinite"
# poke_st DIR TENSOR INDEX BYTES: the 4 bytes at element INDEX of an F32 tensor in DIR/model.safetensors.
poke_st() {
    $PY - "$1/model.safetensors" "$2" "$3" "$4" <<'PYEOF'
import json, struct, sys
path, name, index, value = sys.argv[1], sys.argv[2], int(sys.argv[3]), bytes.fromhex(sys.argv[4])
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    start = json.loads(f.read(n))[name]["data_offsets"][0]
    f.seek(8 + n + start + 4 * index)
    f.write(value)
PYEOF
}
cp "$M" "$B/nan.bin" && printf '\x00\x00\xc0\x7f' | dd of="$B/nan.bin" bs=1 seek=$((1024 + 4 * 7)) conv=notrunc 2>/dev/null
refuse export_nonfinite "$B/o11" "nan.bin: tensor wte holds a non-finite value (nan) at element 7" "--allow-nonfinite" \
    -- export "$B/nan.bin" "$B/o11"
for k in bias weight; do
    mkdir -p "$B/inf_$k" && cp "$TMP/e1"/* "$B/inf_$k/"
done
# +inf in a bias, -inf in a transposed weight: the index named is the file's (HF's layout).
poke_st "$B/inf_bias" transformer.h.0.attn.c_attn.bias 2 0000807f
poke_st "$B/inf_weight" transformer.h.1.mlp.c_fc.weight 5 000080ff
refuse import_nonfinite_bias "$B/i6.bin" "tensor 'transformer.h.0.attn.c_attn.bias' holds a non-finite value (inf) at index 2" \
    "--allow-nonfinite" -- import "$B/inf_bias" "$B/i6.bin"
refuse import_nonfinite_weight "$B/i7.bin" "tensor 'transformer.h.1.mlp.c_fc.weight' holds a non-finite value (-inf) at index 5" \
    -- import "$B/inf_weight" "$B/i7.bin"
run export_nonfinite_allowed $HC export "$B/nan.bin" "$B/o12" --allow-nonfinite &&
    run import_nonfinite_allowed $HC import "$B/o12" "$B/nan_back.bin" --allow-nonfinite &&
    same "--allow-nonfinite: the NaN model goes to HF and back byte-identical" "$B/nan.bin" "$B/nan_back.bin"

note "test_hf: $((SECONDS - t0)) s"
done_testing
