#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=full
# zero1_plan against megatron-core's own layout code (dev/test/megatron_layout.py: Megatron's
# DistributedDataParallel, _ParamAndGradBuffer and DistributedOptimizer's range maps, over
# GPT-2 d2/d4/d12 x DP 1-8 x bucket sizes x bus-bandwidth padding, the shared-embedding rule,
# overlap off, distributed-optimizer instances and random parameter lists), then the same
# comparison with zero1_plans built from copies of zero1/ with one rule changed, each of
# which it must catch. With --optimizer muon, zero1_plan's two buffers against megatron-core
# 0.19.2's LayerWiseDistributedOptimizer.compute_full_param_layout (dev/test/layerwise_layout.py's
# grid: both buffers, every matrix's owner), and planted changes of zero1/layout_layerwise.c
# (a matrix split across shards, LPT replaced by first-fit, no padding floor, LPT's ties to the
# last shard), each of which it must catch. The wheels come from PyPI once (dev/test/megatron_core.sh, cached);
# without PyPI the step says SKIPPED, except under CI (CI=true), where it fails (test_lib.sh's PYPI).
# LLMC_MEGATRON_VERSIONS (default: dev/test/megatron_core.sh --pinned, "0.19.2 0.13.1") names
# the megatron-core releases to run; the first is the reference docs/zero1.md names.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

make -s zero1_plan >/dev/null || fatal "make zero1_plan"
dirs=()
layerwise_dir=''  # 0.19.2's: the first release with the layer-wise optimizer
for version in ${LLMC_MEGATRON_VERSIONS:-$(bash dev/test/megatron_core.sh --pinned)}; do
    dir=$(bash dev/test/megatron_core.sh "$version")
    rc=$?
    if [ $rc = 2 ]; then
        missing PYPI "zero1_plan against megatron-core $version" \
            "PyPI cannot be reached, so zero1/'s layout was not compared with its code"
        continue
    fi
    [ $rc = 0 ] || fatal "megatron-core $version could not be had (dev/test/megatron_core.sh exited $rc)"
    dirs+=("$dir")
    [ "$version" = 0.19.2 ] && layerwise_dir=$dir
done
[ ${#dirs[@]} -gt 0 ] || { [ $TEST_COUNT = 0 ] && skip_all "no megatron-core release to compare with"; done_testing; }

# plant NAME FILE OLD NEW: zero1_plan built from a copy of the sources with OLD replaced
# by NEW in FILE (text that must occur exactly once: a mutation that no longer applies fails).
planted=()
plant() {
    local dir=$TMP/$1
    mkdir -p "$dir"
    cp -a Makefile llmc run zero1 "$dir/"
    if [ -f build/run/librun.a ]; then  # run/'s library as built here (mtimes kept): not rebuilt per mutation
        mkdir -p "$dir/build" && cp -a build/run "$dir/build/" && cp -a .build-run.stamp "$dir/"
    fi
    replace_once "$dir/$2" "$3" "$4" || fatal "mutation $1: its text is not in $2 once"
    make -s -C "$dir" zero1_plan TEST_SEAMS=0 >/dev/null 2>&1 || fatal "mutation $1 builds"  # (no dev/ in the copy)
    planted+=(--planted "$1=$dir/zero1_plan")
}
plant shard_range zero1/shards.h "r.end = r.start + shard_numel;" \
    "r.end = r.start + shard_numel - (rank == layout->dp - 1 && bucket == 0 && rank > 0);"
plant bucket_end_padding zero1/layout.h "#define ZERO1_BUCKET_ALIGN 128" "#define ZERO1_BUCKET_ALIGN 64"
plant busbw_padding zero1/layout.h "#define ZERO1_BUSBW_ALIGN 65536" "#define ZERO1_BUSBW_ALIGN 32768"
plant param_start_alignment zero1/layout.h "#define ZERO1_PARAM_START_ALIGN 64" "#define ZERO1_PARAM_START_ALIGN 32"
plant bucket_closes_past_size zero1/layout.c "param_end - w.bucket_start >= L.bucket_size" \
    "param_end - w.bucket_start > L.bucket_size"
plant shared_embedding_joins_open_bucket zero1/layout.c "if (needs_own_bucket && w.open_params > 0) {" \
    "if (needs_own_bucket && w.open_params < 0) {"
plant default_over_the_group zero1/zero1_plan.c "zero1_ddp_bucket_size(o->bucket_size, o->dp, " \
    "zero1_ddp_bucket_size(o->bucket_size, o->dp / o->instances, "
plant buckets_without_overlap zero1/layout.c "if (!overlap_grad_reduce) return 0;" "(void)overlap_grad_reduce;"

for dir in "${dirs[@]}"; do
    if indented $PY dev/test/megatron_layout.py --megatron "$dir" --binary ./zero1_plan "${planted[@]}"; then
        ok "zero1_plan == megatron-core in $dir; the $((${#planted[@]} / 2)) planted rules caught"
    else
        not_ok "zero1_plan against megatron-core in $dir"
    fi
done

# --optimizer muon: the layer-wise buffer's rules, each changed once.
if [ -z "$layerwise_dir" ]; then
    skip "zero1_plan --optimizer muon against megatron-core's layer-wise optimizer" \
        "LLMC_MEGATRON_VERSIONS has no 0.19.2 (the first release with LayerWiseDistributedOptimizer)"
    done_testing
fi
planted=()
plant matrix_split_across_shards zero1/layout_layerwise.c \
    "zero1_round_up(largest_load(w->load, dp), w->shard_divisor, &shard_size)" \
    "zero1_round_up((chunk_numel + (size_t)dp - 1) / (size_t)dp, w->shard_divisor, &shard_size)"
plant lpt_replaced_by_first_fit zero1/layout_layerwise.c "int s = least_loaded_shard(w->load, dp);" \
    "int s = 0; while (s + 1 < dp && w->load[s] + w->items[k].numel > (chunk_numel + (size_t)dp - 1) / (size_t)dp) s++;"
plant no_padding_floor zero1/layout_layerwise.h "#define ZERO1_LAYERWISE_PADDING_FLOOR 0.9" \
    "#define ZERO1_LAYERWISE_PADDING_FLOOR 0.0"
plant lpt_ties_to_last_shard zero1/layout_layerwise.c "if (load[s] < load[best]) best = s;" \
    "if (load[s] <= load[best]) best = s;"
if indented $PY dev/test/layerwise_layout.py --megatron "$layerwise_dir" --grid --out "$TMP/layerwise.jsonl" \
    --binary ./zero1_plan "${planted[@]}"; then
    ok "zero1_plan --optimizer muon == megatron-core's LayerWiseDistributedOptimizer in $layerwise_dir (both buffers, every matrix's owner); the $((${#planted[@]} / 2)) planted rules caught"
else
    not_ok "zero1_plan --optimizer muon against megatron-core's layer-wise layout in $layerwise_dir"
fi
done_testing
