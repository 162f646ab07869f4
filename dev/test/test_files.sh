#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=full
# Model files, token shards, tokenizer files and checkpoints are untrusted input. Each
# case crafts one defect and must end with one `error:` line naming the file and the
# field (or the check that failed), exit != 0, no hang or crash, and under mpirun -np 2
# one message only (the runner is expect_error in dev/test/test_lib.sh):
#   - model headers: L = 2^28 in a 1,024-byte file, C = 65536 (C*C overflows int32),
#     C beyond its range, negative maxT/V/NH, Vp < V, Vp not a multiple of 128;
#   - token shards: a token count beyond the file, a negative one; against their manifest
#     (run/shard_manifest.h): a flipped byte, a size other than listed, a stray shard the
#     pattern matches, a listed one missing, a pattern mixing a corpus with other files; a
#     shard replaced under a running job; shards without a manifest said to be unverified;
#     a manifest listing a shard twice (the same line, or another size), of version 2, a
#     FIFO as a manifest; a pattern over two corpora, a shard two manifests list; a token
#     count of -5, one the size contradicts, a role other than train|val; train and val
#     shards in each other's place (-i or its glob taking a val shard, -j a train one, both
#     the same file without --allow-train-val-overlap);
#   - tokenizer files: a vocabulary size out of range, or beyond the file;
#   - checkpoints: truncated file, flipped byte (CRC32C; in model.bin, at the end of
#     optimizer.bin read by the last of 3 ranks, in state.txt), missing file, a FIFO (as
#     optimizer.bin, as manifest.txt), a symlink (to a FIFO, to a state.txt outside),
#     missing or malformed manifest, and with a manifest that matches the damage
#     (so the file's own checks must catch it): wrong magic, an optimizer of another
#     model, state.txt fields out of range or inconsistent, a data position beyond the
#     shard; a checkpoint of another model than -e; ranks x B x T x accumulation that wraps
#     64 bits to this run's tokens per step; AdamW's state that no run writes: a negative v,
#     m and v swapped, the halves of m swapped (m^2 <= C v: run/checkpoint_io.c).
# Controls: a good run and a good resume with the same fixtures succeed.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
BIN=./train_gpt2
source dev/test/expect_error.sh
make -s train_gpt2 USE_ZERO1=1 test_crc32c >/dev/null || fatal "build train_gpt2 test_crc32c"
t0=$SECONDS

# ---- fixtures ---------------------------------------------------------------------------
small_model "$TMP/model.bin" || fatal "the oracle writes a model"
MODEL=$TMP/model.bin
write_shard "$TMP/good.bin" 4096
BASE=(-e "$MODEL" -i "$TMP/good.bin" -b 2 -t 32 -x 1 -v 0 -s 0 -z 1)

# crafted_model NAME SIZE INDEX VALUE...: the good model, cut to SIZE bytes (0: whole),
# with header int32 INDEX set to VALUE for each pair. Header: 0 magic, 1 version, 2 maxT,
# 3 V, 4 L, 5 NH, 6 C, 7 Vp.
crafted_model() {
    local path=$TMP/$1 size=$2
    shift 2
    cp "$MODEL" "$path"
    [ "$size" != 0 ] && truncate -s "$size" "$path"
    while [ $# -gt 0 ]; do set_int32 "$path" "$1" "$2"; shift 2; done
}
crafted_model L_huge.bin 1024 4 268435456
crafted_model C_squared.bin 1024 6 65536 5 1     # in range, but C*C = 2^32 wraps an int32
crafted_model C_huge.bin 0 6 100000
crafted_model maxT_negative.bin 0 2 -1
crafted_model V_negative.bin 0 3 -5
crafted_model NH_negative.bin 0 5 -4
crafted_model Vp_below_V.bin 0 7 896
crafted_model Vp_odd.bin 0 7 1100

# A corpus with its manifest (tools/shard_writer.h's format; CRC32Cs by ./test_crc32c), and
# copies of it to damage.
mkdir -p "$TMP/corpus"
write_shard "$TMP/corpus/c_train_000001.bin" 4096 && write_shard "$TMP/corpus/c_train_000002.bin" 3000
{
    echo "llmc-shards 1 test_files"
    ./test_crc32c "$TMP/corpus"/c_train_00000[12].bin | while read -r crc bytes path; do
        echo "shard train $(((bytes - 1024) / 2)) $bytes $crc $(basename "$path")"
    done
    echo "total 2 7096 0 7096"
} >"$TMP/corpus/c_manifest.txt"
corpus_copy() { cp -r "$TMP/corpus" "$TMP/$1" && echo "$TMP/$1"; }
d=$(corpus_copy shards_crc_flipped) && printf '\x01' | dd of="$d/c_train_000001.bin" bs=1 seek=3001 conv=notrunc status=none
d=$(corpus_copy shards_size_listed) && sed -i 's/^shard train 4096 9216 /shard train 4097 9218 /' "$d/c_manifest.txt"
d=$(corpus_copy shards_stray) && cp "$d/c_train_000002.bin" "$d/c_train_000099.bin"
d=$(corpus_copy shards_missing) && rm "$d/c_train_000002.bin"
d=$(corpus_copy shards_mixed) && cp "$TMP/good.bin" "$d/extra.bin"
# A manifest edited or damaged: a shard listed twice (the same line; another size), another
# version; a second corpus beside the first (its own manifest), a shard two manifests claim;
# a FIFO where a manifest is looked for.
d=$(corpus_copy shards_dup) && sed -i '3p' "$d/c_manifest.txt"
d=$(corpus_copy shards_contradict) && sed -i '3{p;s/^shard train 3000 7024 /shard train 3001 7026 /}' "$d/c_manifest.txt"
d=$(corpus_copy shards_version) && sed -i '1s/^llmc-shards 1 /llmc-shards 2 /' "$d/c_manifest.txt"
d=$(corpus_copy shards_two_corpora) && for f in c_train_000001.bin c_train_000002.bin; do cp "$d/$f" "$d/o${f#c}"; done &&
    sed 's/ c_train_/ o_train_/' "$d/c_manifest.txt" >"$d/o_manifest.txt"
d=$(corpus_copy shards_two_claims) && cp "$d/c_manifest.txt" "$d/copy_manifest.txt"
d=$(corpus_copy shards_manifest_fifo) && mkfifo "$d/x_manifest.txt"
# A manifest's fields: a token count that is no count, one that disagrees with the size, a role
# that is neither train nor val.
d=$(corpus_copy manifest_negative) && sed -i 's/^shard train 4096 /shard train -5 /' "$d/c_manifest.txt"
d=$(corpus_copy manifest_count_size) && sed -i 's/^shard train 4096 /shard train 4000 /' "$d/c_manifest.txt"
d=$(corpus_copy manifest_role) && sed -i 's/^shard train 4096 /shard test 4096 /' "$d/c_manifest.txt"
# Train and val keep their roles: the corpus with a val shard listed as val.
d=$(corpus_copy shards_roles) && mv "$d/c_train_000002.bin" "$d/c_val_000001.bin" &&
    sed -i 's/^shard train 3000 \(.*\) c_train_000002.bin/shard val 3000 \1 c_val_000001.bin/' "$d/c_manifest.txt"

cp "$TMP/good.bin" "$TMP/count_beyond.bin" && set_int32 "$TMP/count_beyond.bin" 2 1000000000
cp "$TMP/good.bin" "$TMP/count_negative.bin" && set_int32 "$TMP/count_negative.bin" 2 -1

# Tokenizer files: uint32 header[256] (20240328, version 2, vocab size, eot id), then
# per token a length byte and the bytes. This one holds 3 tokens.
$PY - "$TMP/tok.bin" <<'EOF'
import struct, sys
hdr = [0] * 256
hdr[0], hdr[1], hdr[2], hdr[3] = 20240328, 2, 3, 2
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256I", *hdr))
    for t in (b"a", b"bc", b"<|endoftext|>"):
        f.write(bytes([len(t)]) + t)
EOF
cp "$TMP/tok.bin" "$TMP/tok_huge.bin" && set_int32 "$TMP/tok_huge.bin" 2 1073741824
cp "$TMP/tok.bin" "$TMP/tok_beyond.bin" && set_int32 "$TMP/tok_beyond.bin" 2 1000

# A good checkpoint (steps 1 and 2) to damage, one copy per case.
timeout 60 $BIN "${BASE[@]}" -x 2 -n 1 -o "$TMP/run" >"$TMP/run.log" 2>&1 || fatal "a checkpoint to break" "$TMP/run.log"
CK=checkpoint_00000002
damaged() {  # damaged NAME: a copy of the run's output directory to break
    cp -r "$TMP/run" "$TMP/$1"
    echo "$TMP/$1/$CK"
}
# After a deliberate edit: a manifest that matches, so only the file's own checks can
# catch the defect (crc32c_file via ./test_crc32c prints "crc bytes path").
refresh_manifest() {
    ./test_crc32c "$1/model.bin" "$1/optimizer.bin" "$1/state.txt" |
        awk '{ n = split($3, part, "/"); print part[n], $2, $1 }' >"$1/manifest.txt"
}
set_state() {  # set_state DIR KEY VALUE
    sed -i "s/^$2 .*/$2 $3/" "$1/state.txt"
    refresh_manifest "$1"
}

d=$(damaged truncated) && truncate -s -100 "$d/optimizer.bin"
d=$(damaged flipped) && printf '\x5a' | dd of="$d/model.bin" bs=1 seek=5000 conv=notrunc status=none
# The last bytes of optimizer.bin (the end of v): at np=3 the last rank reads them, so its
# checksum must reach rank 0's verdict. state.txt is small and checked by every rank.
d=$(damaged flipped_tail) && $PY -c 'import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(-3, 2); b = f.read(1); f.seek(-3, 2); f.write(bytes([b[0] ^ 0x40]))' "$d/optimizer.bin"
d=$(damaged state_edited) && sed -i 's/^\(sample_rng .*\)1$/\12/; t; s/^\(sample_rng .*\).$/\11/' "$d/state.txt"  # last digit
d=$(damaged missing) && rm "$d/optimizer.bin"
d=$(damaged no_manifest) && rm "$d/manifest.txt"
d=$(damaged bad_manifest) && sed -i 's/^model.bin .*/model.bin 12 zz/' "$d/manifest.txt"
d=$(damaged opt_magic) && set_int32 "$d/optimizer.bin" 0 7 && refresh_manifest "$d"
d=$(damaged opt_other_model) && truncate -s -8 "$d/optimizer.bin" && refresh_manifest "$d"
d=$(damaged state_negative) && set_state "$d" step -2
d=$(damaged state_overflow) && set_state "$d" B 99999999999999999999999
d=$(damaged state_step) && set_state "$d" step 1
d=$(damaged state_two_blanks) && set_state "$d" step " 2"
d=$(damaged skips_full) && set_state "$d" skipped_batches "$(seq -s, 3 18 | sed 's/\([0-9]*\)/\1-\1/g')"
d=$(damaged state_position) && set_state "$d" shard_tokens_done 4000000
# ranks x B x T x accumulation = 64 (2^58 + 1) = 2^64 + 64, which wraps to this run's 64.
d=$(damaged state_tokens_wrap) && sed -i 's/^ranks .*/ranks 536838145/; s/^grad_accum_steps .*/grad_accum_steps 536903681/' \
    "$d/state.txt" && refresh_manifest "$d"
# AdamW's state with finite values and matching checksums that no run writes: a negative v,
# m and v swapped, the two halves of m swapped (as two ranks' parts moved).
edit_moments() {  # edit_moments DIR HOW: optimizer.bin's m and v (after its 1024-byte header) edited
    $PY - "$1/optimizer.bin" "$2" <<'PYEOF'
import struct, sys
path, how = sys.argv[1], sys.argv[2]
data = bytearray(open(path, "rb").read())
p = (len(data) - 1024) // 8
m, v = data[1024:1024 + 4 * p], data[1024 + 4 * p:]
h = (p // 2) * 4
if how == "v_negative":
    v[40:44] = struct.pack("<f", -1.0)
elif how == "swap_m_v":
    m, v = v, m
elif how == "swap_m_halves":
    m = m[len(m) - h:] + m[h:len(m) - h] + m[:h]
open(path, "wb").write(bytes(data[:1024] + m + v))
PYEOF
    refresh_manifest "$1"
}
for how in v_negative swap_m_v swap_m_halves; do d=$(damaged "opt_$how") && edit_moments "$d" $how; done
damaged other_model >/dev/null  # undamaged: resumed with another -e
# A FIFO: named as one, not as a truncated file, and never opened (a read would wait for a
# writer forever); the manifest itself too. A symbolic link (here to a FIFO): the job's own
# files are never read through one.
d=$(damaged fifo) && rm "$d/optimizer.bin" && mkfifo "$d/optimizer.bin"
d=$(damaged fifo_manifest) && rm "$d/manifest.txt" && mkfifo "$d/manifest.txt"
d=$(damaged link) && mkfifo "$TMP/a_fifo" && ln -sf "$TMP/a_fifo" "$d/optimizer.bin"
d=$(damaged link_state) && mv "$d/state.txt" "$TMP/outside_state.txt" && ln -s "$TMP/outside_state.txt" "$d/state.txt"
d=$(damaged link_dir) && mv "$d" "$TMP/outside_checkpoint" && ln -s "$TMP/outside_checkpoint" "$d"

# ---- controls ---------------------------------------------------------------------------
if timeout 60 $BIN "${BASE[@]}" -o "$TMP/control" >"$TMP/control.log" 2>&1; then
    ok "control: a good run with these fixtures succeeds"
else
    not_ok "control: the good run failed, so the cases below prove nothing" "$TMP/control.log"
fi
cp -r "$TMP/run" "$TMP/resume_ok"
refresh_manifest "$TMP/resume_ok/$CK"  # the manifest helper writes what the trainer writes
if cmp -s "$TMP/run/$CK/manifest.txt" "$TMP/resume_ok/$CK/manifest.txt" &&
   timeout 60 $BIN "${BASE[@]}" -x 3 -y 1 -o "$TMP/resume_ok" >"$TMP/resume_ok.log" 2>&1 &&
   grep -q "resumed from .*$CK: step 2" "$TMP/resume_ok.log"; then
    ok "control: resuming an undamaged copy succeeds, and refresh_manifest writes the trainer's manifest"
else
    not_ok "control: the good resume failed or refresh_manifest differs" "$TMP/resume_ok.log"
    diff "$TMP/run/$CK/manifest.txt" "$TMP/resume_ok/$CK/manifest.txt"
fi

# ---- model headers ----------------------------------------------------------------------
expect_error model_L_2pow28      1 "L_huge.bin" "header field L = 268435456 is out of range (1..1024)" -- -e "$TMP/L_huge.bin"
expect_error model_L_2pow28      2 "L_huge.bin" "header field L = 268435456 is out of range (1..1024)" -- -e "$TMP/L_huge.bin"
expect_error model_C_squared     1 "C_squared.bin" "C=65536" "found 1024"                    -- -e "$TMP/C_squared.bin"
expect_error model_C_huge        1 "C_huge.bin" "header field C = 100000 is out of range (1..65536)" -- -e "$TMP/C_huge.bin"
expect_error model_maxT_negative 1 "maxT_negative.bin" "header field maxT = -1 is out of range" -- -e "$TMP/maxT_negative.bin"
expect_error model_V_negative    1 "V_negative.bin" "header field V = -5 is out of range"   -- -e "$TMP/V_negative.bin"
expect_error model_NH_negative   1 "NH_negative.bin" "header field NH = -4 is out of range" -- -e "$TMP/NH_negative.bin"
expect_error model_Vp_below_V    1 "Vp_below_V.bin" "header field Vp = 896 is out of range (1000..131072)" -- -e "$TMP/Vp_below_V.bin"
expect_error model_Vp_not_128    1 "Vp_odd.bin" "header field Vp = 1100 is not a multiple of 128" -- -e "$TMP/Vp_odd.bin"

# ---- token shards and tokenizer files ---------------------------------------------------
expect_error shard_count_beyond  1 "count_beyond.bin" "header field token count = 1000000000 needs" -- -i "$TMP/count_beyond.bin"
expect_error shard_count_beyond  2 "count_beyond.bin" "header field token count = 1000000000 needs" -- -i "$TMP/count_beyond.bin"
expect_error shard_count_negative 1 "count_negative.bin" "header field token count = -1 is out of range" -- -i "$TMP/count_negative.bin"
# Against the manifest: the first shard is opened at start, so a defect there stops the job
# before its first step, on every rank.
C_GLOB='c_train_*.bin'
if timeout 60 $BIN "${BASE[@]}" -i "$TMP/corpus/$C_GLOB" >"$TMP/corpus.log" 2>&1 && ! grep -q "unverified" "$TMP/corpus.log" &&
   [ "$(grep -c "^data: '$TMP/good.bin': 1 shard without a manifest beside it (NAME_manifest.txt): unverified" "$TMP/control.log")" = 1 ]; then
    ok "control: shards with their manifest train, unannounced; one without one is said once to be unverified"
else
    not_ok "control: the corpus with its manifest did not train, or the unverified shard was not announced once" "$TMP/corpus.log"; diag "$(grep "^data:" "$TMP/control.log")"
fi
expect_error shard_crc_flipped 1 "shards_crc_flipped/c_train_000001.bin: checksum mismatch (CRC32C" "shards_crc_flipped/c_manifest.txt lists" -- -i "$TMP/shards_crc_flipped/$C_GLOB"
expect_error shard_crc_flipped 2 "shards_crc_flipped/c_train_000001.bin: checksum mismatch (CRC32C" "shards_crc_flipped/c_manifest.txt lists" -- -i "$TMP/shards_crc_flipped/$C_GLOB"
expect_error shard_size_listed 1 "shards_size_listed/c_train_000001.bin: 9216 bytes, but" "lists it with 9218" -- -i "$TMP/shards_size_listed/$C_GLOB"
expect_error shard_stray 1 "shards_stray/c_train_000099.bin matches" "is not listed in $TMP/shards_stray/c_manifest.txt" -- -i "$TMP/shards_stray/$C_GLOB"
expect_error shard_stray 2 "shards_stray/c_train_000099.bin matches" "is not listed in $TMP/shards_stray/c_manifest.txt" -- -i "$TMP/shards_stray/$C_GLOB"
expect_error shard_listed_missing 1 "shards_missing/c_manifest.txt lists $TMP/shards_missing/c_train_000002.bin" "is missing" -- -i "$TMP/shards_missing/$C_GLOB"
expect_error shard_mixed 1 "matches shards listed in $TMP/shards_mixed/c_manifest.txt and also $TMP/shards_mixed/extra.bin" "mixes" -- -i "$TMP/shards_mixed/*.bin"
expect_error manifest_dup 1 "shards_dup/c_manifest.txt: line 4 lists c_train_000002.bin again (first at line 3)" "lists each shard once" -- \
    -i "$TMP/shards_dup/$C_GLOB"
expect_error manifest_contradict 1 "shards_contradict/c_manifest.txt: line 4 lists c_train_000002.bin again (first at line 3, with another size or checksum" \
    "contradict" -- -i "$TMP/shards_contradict/$C_GLOB"
expect_error manifest_version 1 "shards_version/c_manifest.txt: manifest version '2' is unknown to this build" -- -i "$TMP/shards_version/$C_GLOB"
expect_error two_corpora 1 "'$TMP/shards_two_corpora/*_train_*.bin' matches shards of two corpora" "o_manifest.txt" "c_manifest.txt" -- \
    -i "$TMP/shards_two_corpora/*_train_*.bin"
expect_error two_corpora 2 "matches shards of two corpora" -- -i "$TMP/shards_two_corpora/*_train_*.bin"
expect_error shard_two_claims 1 "c_train_000001.bin is listed in both" "copy_manifest.txt" -- -i "$TMP/shards_two_claims/$C_GLOB"
expect_error manifest_negative 1 "manifest_negative/c_manifest.txt: malformed line 2" -- -i "$TMP/manifest_negative/$C_GLOB"
expect_error manifest_count_size 1 "line 2 lists 4000 tokens in 9216 bytes" -- -i "$TMP/manifest_count_size/$C_GLOB"
expect_error manifest_role 1 "manifest_role/c_manifest.txt: malformed line 2" "val|train" -- -i "$TMP/manifest_role/$C_GLOB"
R=$TMP/shards_roles
expect_error train_glob_takes_val 1 "-i '$R/c_*.bin' matches $R/c_val_000001.bin" "as a val shard" -- -i "$R/c_*.bin"
expect_error train_glob_takes_val 2 "as a val shard" -- -i "$R/c_*.bin"
expect_error train_is_val 1 "-i '$R/c_val_000001.bin'" "as a val shard" -- -i "$R/c_val_000001.bin"
expect_error val_glob_takes_train 1 "-j '$R/c_*.bin' matches $R/c_train_000001.bin" "as a train shard" -- \
    -i "$R/c_train_*.bin" -j "$R/c_*.bin" -v 1
expect_error train_val_same 1 "both read $TMP/good.bin" "--allow-train-val-overlap" -- -j "$TMP/good.bin" -v 1
check "train_val_same with --allow-train-val-overlap: trains" timeout 60 $BIN "${BASE[@]}" -j "$TMP/good.bin" -v 1 \
    --allow-train-val-overlap
check "train and val of one corpus, each in its role: trains" timeout 60 $BIN "${BASE[@]}" -i "$R/c_train_*.bin" \
    -j "$R/c_val_*.bin" -v 1
# A literal path with glob characters is that file, even where the glob matches another
# (g1/x.bin, not a shard): the literal one trains.
mkdir -p "$TMP/g[1]" "$TMP/g1" && cp "$TMP/good.bin" "$TMP/g[1]/x.bin" && head -c 2000 /dev/urandom >"$TMP/g1/x.bin"
check "-i 'g[1]/x.bin' (and g1/x.bin there too) trains on the literal file" timeout 60 $BIN "${BASE[@]}" -i "$TMP/g[1]/x.bin"
expect_error glob_matches_other 1 "$TMP/g1/x.bin: not a token shard" -- -i "$TMP/g[0-9]/x.bin"
expect_error manifest_fifo 1 "shards_manifest_fifo/x_manifest.txt' is a pipe or FIFO" -- -i "$TMP/shards_manifest_fifo/$C_GLOB"

# A shard replaced (a new file under its name) while the job runs: the loader reopens it at
# every epoch (here every 3 steps: 200 tokens) and stops at the first reopen after.
write_shard "$TMP/short.bin" 200
timeout 60 $BIN "${BASE[@]}" -i "$TMP/short.bin" -x 100000 >"$TMP/replaced.log" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q "^step *2/" "$TMP/replaced.log" && break; sleep 0.1; done
cp "$TMP/short.bin" "$TMP/short.new" && mv "$TMP/short.new" "$TMP/short.bin"
wait $job
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c 'error:' "$TMP/replaced.log")" = 1 ] &&
   grep -q "^error: $TMP/short.bin changed while this job ran (it is another file now: inode" "$TMP/replaced.log"; then
    ok "shard_replaced (np=1, exit $rc after $(grep -c '^step' "$TMP/replaced.log") steps): $(grep 'error:' "$TMP/replaced.log" | cut -c1-140)"
else
    not_ok "shard_replaced: exit $rc, $(grep -E 'error:' "$TMP/replaced.log" | head -2), last: $(tail -n 1 "$TMP/replaced.log")"
fi

expect_error tokenizer_vocab_huge 1 "tok_huge.bin" "header field vocab size = 1073741824 is out of range" -- -s 1 --tokenizer "$TMP/tok_huge.bin"
expect_error tokenizer_vocab_beyond 1 "tok_beyond.bin" "header field vocab size = 1000 needs" -- -s 1 --tokenizer "$TMP/tok_beyond.bin"

# ---- checkpoints ------------------------------------------------------------------------
# check_resume NAME NP COPY KEYWORD...: resuming (-y 1 -x 3) from the damaged copy COPY fails.
check_resume() {  # at np > 1 the ranks read the damaged files in parts; the batch per step
    local name=$1 np=$2 copy=$3 allow=()   # then grows, which a resume must be told is meant
    shift 3
    [ "$np" -gt 1 ] && allow=(--allow-resume-change)
    expect_error "$name" "$np" "$@" -- -x 3 -y 1 -o "$TMP/$copy" "${allow[@]}"
}
check_resume ckpt_truncated        1 truncated       "$CK/optimizer.bin: " "manifest says" "truncated or corrupt"
check_resume ckpt_flipped_byte     1 flipped         "$CK/model.bin: checksum mismatch (CRC32C" "the file is corrupt"
check_resume ckpt_flipped_byte     2 flipped         "$CK/model.bin: checksum mismatch (CRC32C" "the file is corrupt"
check_resume ckpt_flipped_tail     3 flipped_tail    "$CK/optimizer.bin: checksum mismatch (CRC32C" "the file is corrupt"
check_resume ckpt_state_edited     2 state_edited    "$CK/state.txt: checksum mismatch (CRC32C"
check_resume ckpt_missing_file     1 missing         "$CK/optimizer.bin is missing" "delete its directory"
check_resume ckpt_missing_file     2 missing         "$CK/optimizer.bin is missing"
check_resume ckpt_fifo             1 fifo            "$CK/optimizer.bin is a pipe or FIFO" "not a regular file"
check_resume ckpt_fifo_manifest    1 fifo_manifest   "$CK/manifest.txt' is a FIFO: the job writes, and reads back from its own directory, regular files only"
check_resume ckpt_fifo_manifest    2 fifo_manifest   "$CK/manifest.txt' is a FIFO"
check_resume ckpt_link             1 link            "$CK/optimizer.bin is a symbolic link, not a regular file"
check_resume ckpt_link_dir         1 link_dir        "$CK is a symbolic link, not a directory of -o's own"
check_resume ckpt_link_state       1 link_state      "$CK/state.txt is a symbolic link, not a regular file"
check_resume ckpt_no_manifest      1 no_manifest     "$CK/manifest.txt is missing"
check_resume ckpt_bad_manifest     1 bad_manifest    "$CK/manifest.txt: malformed line 'model.bin 12 zz'"
check_resume ckpt_opt_magic        1 opt_magic       "$CK/optimizer.bin: not an optimizer state file"
check_resume ckpt_opt_other_model  1 opt_other_model "$CK/optimizer.bin:" "of another model"
check_resume ckpt_state_negative   1 state_negative  "$CK/state.txt: field step = '-2' is not an integer in 1..2147483647"
check_resume ckpt_state_overflow   1 state_overflow  "$CK/state.txt: field B = '99999999999999999999999'"
check_resume ckpt_state_two_blanks 1 state_two_blanks "$CK/state.txt: line 'step  2' is not 'KEY VALUE' with one blank"
expect_error ckpt_skips_full 1 "its record of skipped ranges, full (the newest 16), does not hold this one" \
    -- -x 3 -y 1 -o "$TMP/skips_full" --skip-batches 1-1
check_resume ckpt_state_step       1 state_step      "$CK/state.txt: field step = 1" "for step 2"
check_resume ckpt_data_position    1 state_position  "data position: token 4000000 of shard 0" "good.bin"
check_resume ckpt_state_tokens_wrap 1 state_tokens_wrap "$CK/state.txt: ranks 536838145 x B 2 x T 32" "do not fit in 63 bits"
check_resume ckpt_v_negative     1 opt_v_negative  "element 10 of wte in AdamW's v is not finite or is negative"
check_resume ckpt_v_negative     2 opt_v_negative  "in AdamW's v is not finite or is negative"
check_resume ckpt_m_v_swapped    1 opt_swap_m_v    "in AdamW's v is not finite or is negative"
check_resume ckpt_m_halves_swapped 1 opt_swap_m_halves "AdamW's m and v cannot be averages of the same gradients"
check_resume ckpt_m_halves_swapped 2 opt_swap_m_halves "AdamW's m and v cannot be averages of the same gradients"
# The same two-shard corpus, its manifest gone since the checkpoint: said so, not "other data".
d=$(corpus_copy manifest_gone)
if timeout 60 $BIN "${BASE[@]}" -i "$d/$C_GLOB" -x 2 -n 2 -o "$TMP/manifest_gone_run" >"$TMP/manifest_gone_run.log" 2>&1; then
    rm "$d/c_manifest.txt"
    expect_error ckpt_manifest_gone 1 "was trained on corpus 'c' (2 shards, listed in its manifest)" "put c_manifest.txt back" \
        -- -i "$d/$C_GLOB" -x 3 -y 1 -o "$TMP/manifest_gone_run"
else
    not_ok "ckpt_manifest_gone: the first run failed" "$TMP/manifest_gone_run.log"
fi
expect_error ckpt_other_model 1 "$CK/model.bin is a model with L=2" "-e d1" "belongs to another run" -- -x 3 -y 1 -o "$TMP/other_model" -e d1

note "test_files: $((SECONDS - t0)) s"
done_testing
