#!/usr/bin/env bash
# test: timeout=300 lane=cpu tier=full
# ZeRO-1 across real host boundaries (dev/test/multihost.sh: network namespaces, veth
# links through a bridge, Open MPI's rsh launcher, TCP between hosts):
#   1. the launcher places ranks by host (2 hosts x 2 slots: two ranks on each);
#   2. the links are shaped: a TCP transfer between two hosts is no faster than the rate;
#   3. ./train_gpt2 -z 1 on 2 hosts x 2 ranks, and on 3 hosts x 1 rank, equals the
#      single-host run with as many ranks (plain mpirun, root namespace) bitwise: the step
#      lines' losses and norms, and the final checkpoint's model.bin and optimizer.bin;
#      so does 2 hosts x 2 ranks as 2 distributed-optimizer instances, one per host (the
#      reduce-scatter and all-gather inside a host, the shard all-reduce across the link);
#   4. the inter-host traffic really went over the links: each host's veth sent at least
#      what ZeRO-1 must send between hosts (below); a 1 host x 4 ranks run, whose traffic
#      stays inside the host (shared memory), sends almost nothing: the counter tells;
#   5. nothing is left behind: no process in the namespaces after the runs, and no
#      namespace after the teardown.
# SKIPPED (exit 0) only where network namespaces cannot be created (not root, no `ip`, no
# permission). Env: MULTIHOST_RATE, MULTIHOST_DELAY (see multihost.sh).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"
source dev/test/multihost.sh
BIN=./train_gpt2
DATA=data/tinyshakespeare_train.bin
STEPS=3

at_exit mh_teardown

make -s train_gpt2 USE_ZERO1=1 >/dev/null || fatal "build $BIN"
[ -f "$DATA" ] || fatal "$DATA is there (make data)"

t0=$SECONDS
mh_setup 3
case $? in
    0) ;;
    2) skip_all "$MH_SKIP_REASON" ;;
    *) fatal "build the hosts" ;;
esac
note "hosts: ${MH_HOSTS[*]} (switch $MH_SW), links: $MH_SHAPING"

# ---- 1. placement ----------------------------------------------------------------------
# stdout only: Open MPI may warn on stderr (plm:rsh's setpgid in a namespace) without a fault.
if mh_mpirun 2 2 hostname >"$TMP/hostnames" 2>"$TMP/hostnames.stderr" &&
   [ "$(sort "$TMP/hostnames" | uniq -c | awk '{ print $1 "x" $2 }' | tr '\n' ' ')" = \
     "2x$(mh_hostname 0) 2x$(mh_hostname 1) " ]; then
    ok "2 hosts x 2 slots: ranks run on $(sort -u "$TMP/hostnames" | tr '\n' ' ')"
else
    not_ok "placement: expected two ranks on each of $(mh_hostname 0), $(mh_hostname 1):"
    sed 's/^/       | /' "$TMP/hostnames" "$TMP/hostnames.stderr"
fi

# ---- 2. the link rate ------------------------------------------------------------------
# tc's rate units (SI prefixes; "bps" is bytes per second) -> bits per second
rate_bits() {
    echo "$1" | awk '{ $0 = tolower($0); if (!match($0, /^[0-9.]+/)) exit 1; n = substr($0, 1, RLENGTH); u = substr($0, RLENGTH + 1)
        m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
        m["bps"] = 8; m["kbps"] = 8e3; m["mbps"] = 8e6; m["gbps"] = 8e9; m["tbps"] = 8e12
        if (!(u in m)) exit 1; printf "%.0f\n", n * m[u] }'
}
PROBE_BYTES=25000000
if probe=$(mh_probe_link 1 0 $PROBE_BYTES); then
    mbit=$(echo "$probe" | awk '{ printf "%.0f", $1 * 8 / $2 / 1e6 }')
    if [ "$MH_RATE" = none ]; then
        note "link host 1 -> host 0: $mbit Mbit/s, unshaped (MULTIHOST_RATE=none)"
    elif ! limit=$(rate_bits "$MH_RATE"); then
        note "link host 1 -> host 0: $mbit Mbit/s (rate '$MH_RATE': units not understood, not checked)"
    elif awk -v m="$mbit" -v l="$limit" 'BEGIN { exit !(m * 1e6 <= 1.1 * l) }'; then
        ok "link host 1 -> host 0: $mbit Mbit/s, within the shaped rate $MH_RATE"
    else
        not_ok "link host 1 -> host 0: $mbit Mbit/s exceeds the shaped rate $MH_RATE: shaping is not working"
    fi
else
    not_ok "could not send $PROBE_BYTES bytes from host 1 to host 0"
fi

# ---- 3, 4. training across hosts == training on one host --------------------------------
# d2 (7M parameters, mostly wte) in 2M-element buckets: several reduce-scatters and
# all-gathers in flight per step, across the host links.
ARGS=(-e d2 -i "$DATA" -b 1 -t 64 -x $STEPS -l 1e-3 -v 0 -s 0 -z 1 --bucket-size 2000000 -n $STEPS)
EXTRA=()   # flags of one configuration
CKPT=$(printf "checkpoint_%08d" $STEPS)

# train NAME NP LAUNCHER...: runs `LAUNCHER... BIN ARGS -o DIR`, checks that it finished with
# identical replicas and wrote its checkpoint.
train() {
    local name=$1 np=$2; shift 2
    "$@" "$BIN" "${ARGS[@]}" "${EXTRA[@]}" -o "$TMP/$name" >"$TMP/$name.log" 2>&1
    local rc=$?
    if [ $rc -eq 0 ] && grep -qF "parameters identical on all $np ranks: yes" "$TMP/$name.log" &&
       grep -qE "^ranks $np \|" "$TMP/$name.log" && [ -f "$TMP/$name/$CKPT/optimizer.bin" ]; then
        return 0
    fi
    not_ok "$name: exit $rc, or no 'parameters identical on all $np ranks: yes', config line or checkpoint" "$TMP/$name.log"
    return 1
}

# The traffic ZeRO-1 must send off every host per step, with H hosts each holding 1/H of
# the ranks, fp32 grads and params, N parameters: the reduce-scatter's results for the
# shards owned elsewhere, (H-1)/H * N floats, cannot be formed without this host's
# contribution; the all-gather needs this host's own 1/H of the updated parameters to
# leave it at least once. So each host's link sends >= N floats = 4N bytes per step.
tx_start() { local i; TX0=(); for ((i = 0; i < $1; i++)); do TX0+=("$(mh_tx_bytes $i)"); done; }
tx_check() {  # tx_check NAME NHOSTS: every host sent >= 4 N STEPS bytes since tx_start
    local name=$1 nh=$2 i sent need
    need=$(awk '/^GPT-2: .* [0-9]+ parameters$/ { print 4 * $(NF - 1) * '"$STEPS"' }' "$TMP/$name.log")
    [ -n "$need" ] || { not_ok "$name: no parameter count in the log"; return; }
    for ((i = 0; i < nh; i++)); do
        sent=$(($(mh_tx_bytes $i) - TX0[i]))
        if [ "$sent" -ge "$need" ]; then
            ok "$name: host $i sent $sent bytes on its link (>= $need, 4 x params x steps)"
        else
            not_ok "$name: host $i sent only $sent bytes on its link, ZeRO-1 needs >= $need: inter-host traffic bypassed the links"
        fi
    done
}

# With K instances (one per host) every host still sends >= N floats per step: the other
# group cannot form the sum of any element without this group's partial sums of it.
for cfg in "2 2 1" "3 1 1" "2 2 2"; do
    read -r nh per k <<<"$cfg"
    np=$((nh * per))
    ref=single_np$np
    multi=hosts${nh}x$per
    EXTRA=()
    if [ "$k" -gt 1 ]; then
        ref+=_k$k multi+=_k$k
        EXTRA=(--dist-opt-instances "$k")
    fi
    train "$ref" $np "${MPIRUN[@]}" -np $np || continue
    tx_start $nh
    train "$multi" $np mh_mpirun $nh $per || continue
    tx_check "$multi" $nh
    same_runs "$multi" "$ref"
done
EXTRA=()   # the runs below are flat ZeRO-1 again

# The users' launcher, scripts/multi_node/launch.sh, on 2 nodes x 2 "GPUs" (the CPU trainer;
# the harness's agent in place of ssh) gives the same run.
launch_multi() {  # launch_multi BIN ARGS...
    local bin=$1; shift
    mh_on 0 env TRAIN_BIN="$bin" GPUS_PER_NODE=2 OMP_NUM_THREADS=1 MPI_IF="$MH_SUBNET" \
        MPIRUN_ARGS="${MH_LAUNCH_ARGS[*]} --mca pml ob1 -x OPENBLAS_NUM_THREADS" bash scripts/multi_node/launch.sh "$(mh_hostfile 2 2)" "$@"
}
tx_start 2
if train launch2x2 4 launch_multi; then
    tx_check launch2x2 2
    same_runs launch2x2 single_np4
fi

# Control: the same job with all 4 ranks on host 0 (shared memory between them) equals the
# reference too, and its link carries no training traffic, so the counter discriminates.
tx_start 1
if train hosts1x4 4 mh_mpirun 1 4; then
    sent=$(($(mh_tx_bytes 0) - TX0[0]))
    if [ "$sent" -lt 1000000 ]; then
        ok "control: 1 host x 4 ranks sent $sent bytes on the link (no inter-host traffic)"
    else
        not_ok "control: 1 host x 4 ranks sent $sent bytes on the link; expected almost none"
    fi
    same_runs hosts1x4 single_np4
fi

# Shaped links show in the step time (figures for the log; the machine is shared).
for name in single_np4 hosts2x2 single_np4_k2 hosts2x2_k2 single_np3 hosts3x1; do
    [ -f "$TMP/$name.log" ] && note "$name: $(grep -m1 '^average step' "$TMP/$name.log")"
done

# ---- 5. nothing left behind ------------------------------------------------------------
left=
for _ in $(seq 10); do   # orteds exit shortly after mpirun returns
    left=$(for ns in "${MH_NAMESPACES[@]}"; do ip netns pids "$ns"; done | tr '\n' ' ')
    [ -z "${left// /}" ] && break
    sleep 0.5
done
if [ -z "${left// /}" ]; then ok "no process left in the hosts after the runs"; else not_ok "processes left in the hosts: $left"; fi
ours=("${MH_NAMESPACES[@]}")
mh_teardown
still=$(ip netns list | awk '{ print $1 }' | grep -Fx -f <(printf "%s\n" "${ours[@]}") | tr '\n' ' ')
if [ -z "$still" ]; then ok "teardown removed every namespace (${#ours[@]})"; else not_ok "namespaces left: $still"; fi

note "test_multihost: $((SECONDS - t0)) s"
done_testing
