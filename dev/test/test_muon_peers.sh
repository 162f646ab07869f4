#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=full
# The Muon peers of issue 43, themselves (dev/test/MUON_NOTES.md): NVIDIA emerging-optimizers
# 0.3.0's Muon under Debian's python3 and torch 1.13 (dev/test/muon_reference.py selftest: the
# header's formulas, Megatron 0.19.2's OptimizerConfig defaults, kwargs and routing, and EO's Muon
# bit for bit equal to megatron-core's TensorParallelMuon with its own QKV split); 10 steps of the
# reference on the oracle's default GPT-2 from both engines, byte for byte; and megatron-core's
# LayerWiseDistributedOptimizer.compute_full_param_layout over the layout grid
# (dev/test/layerwise_layout.py --grid: Megatron's DDP takes every layout, documented_layout
# equals it in every case, and each of its planted rule changes differs somewhere). The wheels
# come from PyPI once (dev/test/emerging_optimizers.sh, dev/test/megatron_core.sh, cached);
# without PyPI the rows say SKIPPED, except under CI (CI=true), where they fail (test_lib.sh's PYPI).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

pypi_peer emerging-optimizers emerging_optimizers.sh "$(bash dev/test/emerging_optimizers.sh --pinned)"
EO=$PEER_DIR
pypi_peer megatron-core megatron_core.sh "$(bash dev/test/megatron_core.sh --pinned | cut -d' ' -f1)"
MC=$PEER_DIR
[ -n "$EO$MC" ] || { [ $TEST_COUNT = 0 ] && skip_all "no peer could be fetched"; done_testing; }

if [ -n "$EO" ]; then
    megatron=()
    [ -n "$MC" ] && megatron=(--megatron "$MC")
    check "muon_reference selftest: emerging-optimizers' Muon${MC:+ == megatron-core TensorParallelMuon}" \
        $PY dev/test/muon_reference.py selftest --emerging "$EO" "${megatron[@]}"
    if [ -n "$MC" ]; then
        run=($PY dev/test/muon_reference.py run --emerging "$EO" --megatron "$MC" --steps 10)
        if "${run[@]}" --out-state "$TMP/eo.state" --out-final "$TMP/eo.final" >"$TMP/eo.log" 2>&1 &&
           "${run[@]}" --engine megatron --out-state "$TMP/mc.state" --out-final "$TMP/mc.final" >"$TMP/mc.log" 2>&1 &&
           cmp -s "$TMP/eo.state" "$TMP/mc.state" && cmp -s "$TMP/eo.final" "$TMP/mc.final"; then
            ok "10 steps on the oracle's default GPT-2: both engines write the same state and final weights, byte for byte"
        else
            not_ok "10 steps on the oracle's default GPT-2: the engines differ or fail" "$TMP/mc.log"
        fi
    fi
fi
if [ -n "$MC" ]; then
    check "layerwise_layout --grid: megatron-core's LayerWiseDistributedOptimizer layout == documented_layout" \
        $PY dev/test/layerwise_layout.py --megatron "$MC" --grid --out "$TMP/layerwise.jsonl"
fi
done_testing
