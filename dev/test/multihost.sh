# shellcheck shell=bash
# A cluster of "hosts" on one machine, for tests that cross real host boundaries.
# Sourced (after env.sh) by tests; needs root, `ip`, `tc`, `unshare` and Open MPI 4.x.
#
#   at_exit mh_teardown              # the caller's clean-up (a test's at_exit) must call it
#   mh_setup 3 || ...                # 3 hosts; returns 2 (and sets MH_SKIP_REASON) where
#                                    # namespaces cannot be created, 1 on any other failure
#   mh_mpirun 2 2 ./prog args        # 2 hosts x 2 ranks, mpirun started on host 0
#   mh_on 1 CMD...                   # CMD on host 1 (under a timeout, MH_TIMEOUT s)
#   mh_tx_bytes 1                    # bytes host 1 has sent on its link so far
#   mh_probe_link 1 0 BYTES          # a timed TCP transfer from host 1 to host 0
#
# Topology: host i is a network namespace llmc_h<i>_<id> with its loopback and one veth,
# eth0 = 10.213.0.<i+1>/24; the other ends sit on a bridge br0 in one more namespace,
# llmc_sw_<id> (the switch). <id> is the PID of the sourcing shell, so parallel runs never
# collide; they all use the same subnet, each in its own isolated namespaces. The veth
# pairs are created inside the namespaces: nothing is ever added to the root namespace.
# Teardown kills what still runs inside this run's namespaces (nothing else) and deletes
# them, which deletes the veths and the bridge.
#
# Links: each host's eth0 egress (its NIC) is shaped with `tc netem rate $MULTIHOST_RATE
# delay $MULTIHOST_DELAY` (defaults 1gbit and 1ms; "none" leaves one out). Kernels built
# without sch_netem get `tbf rate $MULTIHOST_RATE` instead, rate only, and MH_SHAPING says
# that the delay is missing.
#
# A host that loses its link: Linux gives up on a TCP connection whose packets go
# unanswered only after net.ipv4.tcp_retries2 retransmissions (15: about 15 minutes), and
# until then mpirun waits for the lost host's daemon even after the job aborted. Every host
# here sets tcp_retries2=5, which Linux turns into 0.2 s x (2^6 - 1) = 12.6 s (MH_TCP_GIVE_UP_S),
# as a cluster's failure detection would end such a job; the ranks themselves end on their own
# (--comm-timeout), whatever the launcher does. Not 3 (3 s): the ranks' own sockets then gave up
# before a 5 s --comm-timeout, and Open MPI's TCP error ended the job first (2 of 6 runs).
#
# Hostnames: every process on a host runs under `ip netns exec NS unshare --uts` with the
# hostname set to the host's name (the namespace's, dashes for underscores). Needed: Open
# MPI keys its session directory (/tmp/ompi.<hostname>.<uid>), and the shared-memory
# segments in it, by hostname; with one hostname for all, two hosts' orteds share it and
# the vader BTL crashes in its first collective (seen: a segfault in
# mca_btl_vader_poll_handle_frag).
#
# Open MPI 4.1 (ORTE) settings in mh_mpirun:
#   plm_rsh_agent <agent>        needed: the rsh launcher starts orted on host i with our
#                                agent (`agent HOST CMD...`: ip netns exec) instead of ssh
#   plm_rsh_no_tree_spawn 1      mpirun starts every orted itself, so only the agent on
#                                host 0 is ever used
#   oob_tcp_if_include <subnet>, btl_tcp_if_include <subnet>: ORTE's out-of-band wire-up
#                                and MPI's TCP traffic on the host links. Here each host has
#                                only lo and eth0 and the defaults pick eth0 too; they are
#                                explicit because on real nodes (several NICs) they matter
#   btl tcp,vader,self           vader (shared memory) serves ranks ORTE placed on the same
#                                host only, TCP the others, as on a real cluster; the test
#                                proves it with the veth counters (mh_tx_bytes)
#   pml ob1                      keeps UCX out where it can open (not on this machine):
#                                UCX picks its own transports, shared memory works across
#                                network namespaces (/dev/shm is shared), and it ignores
#                                the btl settings
#   --bind-to none               the hosts share the machine's cores; ORTE binds per host,
#                                so ranks of different hosts would be pinned to the same core
#   -x OMP_NUM_THREADS ...       what remote ranks need of mpirun's environment

MH_SUBNET=10.213.0.0/24
MH_TCP_RETRIES2=5
MH_TCP_GIVE_UP_S=12.6  # Linux's model for MH_TCP_RETRIES2: TCP_RTO_MIN 0.2 s x (2^(5+1) - 1)
MH_RATE=${MULTIHOST_RATE:-1gbit}
MH_DELAY=${MULTIHOST_DELAY:-1ms}
MH_SHAPING=none   # what mh_shape applied, for the test's log
MH_ID=$$
MH_SW=llmc_sw_$MH_ID
MH_HOSTS=()
MH_NAMESPACES=()   # every namespace this run created, the switch included: teardown's list
MH_DIR=
MH_SKIP_REASON=

# mh_shape NS: the host's egress through netem (rate and delay), or, on a kernel without
# sch_netem, through tbf (rate only; the missing delay is said in MH_SHAPING).
mh_shape() {
    local ns=$1 netem=() err
    [ "$MH_RATE" != none ] && netem+=(rate "$MH_RATE")
    [ "$MH_DELAY" != none ] && netem+=(delay "$MH_DELAY")
    [ ${#netem[@]} -eq 0 ] && return 0
    if err=$(tc -n "$ns" qdisc add dev eth0 root netem "${netem[@]}" limit 100000 2>&1); then
        MH_SHAPING="netem ${netem[*]}"
        return 0
    fi
    if [[ $err != *"qdisc kind is unknown"* ]]; then
        echo "multihost: tc netem ${netem[*]} failed: $err" >&2
        return 1
    fi
    MH_SHAPING="none (no sch_netem in this kernel, rate none: nothing to shape)"
    [ "$MH_RATE" = none ] && return 0
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$MH_RATE" burst 256kb latency 10ms ||
        { echo "multihost: tc tbf rate $MH_RATE failed" >&2; return 1; }
    MH_SHAPING="tbf rate $MH_RATE"
    [ "$MH_DELAY" != none ] && MH_SHAPING+=" (this kernel has no sch_netem: delay $MH_DELAY NOT applied)"
    return 0
}

mh_host_ip() { echo "10.213.0.$(($1 + 1))"; }

# Namespaces of earlier runs that were killed before their trap ran: the owner PID is
# gone and nothing runs inside, so deleting them stops nothing.
mh_sweep_stale() {
    local ns pid
    for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^llmc_(h[0-9]+|sw)_[0-9]+$/ { print $1 }'); do
        pid=${ns##*_}
        kill -0 "$pid" 2>/dev/null && continue
        [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && ip netns del "$ns" 2>/dev/null
    done
}

# mh_setup NHOSTS: builds the cluster. Returns 2 where namespaces cannot be created here.
mh_setup() {
    local n=$1 i ns
    if [ "$(id -u)" != 0 ]; then MH_SKIP_REASON="needs root to create network namespaces (uid $(id -u))"; return 2; fi
    for tool in ip unshare; do
        command -v $tool >/dev/null 2>&1 || { MH_SKIP_REASON="no '$tool' command"; return 2; }
    done
    mh_sweep_stale
    local err
    if ! err=$(ip netns add "$MH_SW" 2>&1); then
        MH_SKIP_REASON="cannot create a network namespace: $err"
        return 2
    fi
    MH_NAMESPACES+=("$MH_SW")
    command -v tc >/dev/null 2>&1 || { echo "multihost: no 'tc' command (iproute2) to shape the links" >&2; return 1; }
    MH_DIR=$(mktemp -d /tmp/llmc_multihost.XXXXXX) || return 1
    ip -n "$MH_SW" link set lo up &&
    ip -n "$MH_SW" link add br0 type bridge &&
    ip -n "$MH_SW" link set br0 up || { echo "multihost: cannot build the switch" >&2; return 1; }
    for ((i = 0; i < n; i++)); do
        ns=llmc_h${i}_$MH_ID
        ip netns add "$ns" || return 1
        MH_NAMESPACES+=("$ns")
        MH_HOSTS+=("$ns")
        ip -n "$ns" link set lo up &&
        ip -n "$MH_SW" link add "h$i" type veth peer name eth0 netns "$ns" &&
        ip -n "$MH_SW" link set "h$i" master br0 up &&
        ip -n "$ns" addr add "$(mh_host_ip $i)/24" dev eth0 &&
        ip -n "$ns" link set eth0 up || { echo "multihost: cannot wire host $i" >&2; return 1; }
        ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=$MH_TCP_RETRIES2 || { echo "multihost: cannot set tcp_retries2" >&2; return 1; }
        mh_shape "$ns" || return 1
    done
    # The rsh agent: `agent HOST CMD...` runs CMD on HOST, as ssh would.
    cat >"$MH_DIR/agent" <<'EOF'
#!/bin/sh
host=$1; shift
exec ip netns exec "$(echo "$host" | tr - _)" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
EOF
    chmod +x "$MH_DIR/agent"
    MH_LAUNCH_ARGS=(--mca plm_rsh_agent "$MH_DIR/agent" --mca plm_rsh_no_tree_spawn 1)
    MH_MPI_ARGS=("${MH_LAUNCH_ARGS[@]}" --bind-to none --mca oob_tcp_if_include "$MH_SUBNET"
        --mca btl tcp,vader,self --mca btl_tcp_if_include "$MH_SUBNET" --mca pml ob1)
    mh_wait_links "$n"
}

# Every host reaches host 0 over the links, so broken wiring fails here with a clear
# message rather than somewhere inside MPI's wire-up.
mh_wait_links() {
    local i
    for ((i = 1; i < $1; i++)); do
        mh_probe_link "$i" 0 1000 >/dev/null || { echo "multihost: host $i cannot reach host 0 over the links" >&2; return 1; }
    done
}

# mh_probe_link FROM TO BYTES: sends BYTES over TCP from host FROM to host TO; prints
# "BYTES SECONDS" as the receiver counted them (first connection to the last byte).
MH_PROBE_PORT=5201
mh_probe_link() {
    local from=$1 to=$2 bytes=$3 out=$MH_DIR/probe.out rpid rc
    : >"$out"   # exists before the receiver's shell gets to open it: the wait below greps it
    MH_TIMEOUT=60 mh_on "$to" "$PY" -c '
import socket, sys, time
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(1)
print("listening", flush=True)
conn, _ = srv.accept(); t0 = time.perf_counter(); n = 0
while True:
    chunk = conn.recv(1 << 20)
    if not chunk: break
    n += len(chunk)
print(n, time.perf_counter() - t0, flush=True)' "$(mh_host_ip "$to")" $MH_PROBE_PORT >"$out" 2>&1 &
    rpid=$!
    for _ in $(seq 100); do grep -q listening "$out" && break; sleep 0.1; done
    MH_TIMEOUT=60 mh_on "$from" "$PY" -c '
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
left, block = int(sys.argv[3]), bytes(1 << 20)
while left > 0:
    s.sendall(block[:min(left, len(block))]); left -= len(block)
s.close()' "$(mh_host_ip "$to")" $MH_PROBE_PORT "$bytes"
    rc=$?
    [ $rc -ne 0 ] && kill $rpid 2>/dev/null   # the receiver would wait for its timeout
    wait $rpid || rc=1
    [ $rc -eq 0 ] && tail -n 1 "$out"
    return $rc
}

# A host's name: its namespace's, with dashes (`hostname` refuses underscores).
mh_hostname() { echo "${MH_HOSTS[$1]//_/-}"; }

# mh_on HOST CMD...: runs CMD on host HOST (index), with that host's hostname, under a
# timeout of MH_TIMEOUT seconds (default 120).
mh_on() {
    local ns=${MH_HOSTS[$1]} name
    name=$(mh_hostname "$1"); shift
    timeout --kill-after=5 "${MH_TIMEOUT:-120}" \
        ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

# mh_hostfile NHOSTS SLOTS: writes an Open MPI hostfile for the first NHOSTS hosts; prints its path.
mh_hostfile() {
    local i f=$MH_DIR/hostfile.$1x$2
    for ((i = 0; i < $1; i++)); do echo "$(mh_hostname $i) slots=$2"; done >"$f"
    echo "$f"
}

# What mpirun needs on these hosts (the header says why), set by mh_setup: MH_LAUNCH_ARGS
# start the orteds through the agent (a launcher under test adds its own other settings),
# MH_MPI_ARGS are all of mh_mpirun's.
MH_LAUNCH_ARGS=()
MH_MPI_ARGS=()

# mh_mpirun NHOSTS RANKS_PER_HOST PROGRAM ARGS...: mpirun on host 0 over the first NHOSTS
# hosts, ranks placed by slot (ranks 0..RANKS_PER_HOST-1 on host 0, ...).
mh_mpirun() {
    local nh=$1 per=$2; shift 2
    mh_on 0 mpirun --allow-run-as-root -np $((nh * per)) --hostfile "$(mh_hostfile "$nh" "$per")" \
        "${MH_MPI_ARGS[@]}" -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$@"
}

# mh_tx_bytes HOST: bytes sent so far on the host's link (the veth's counter, headers included).
mh_tx_bytes() { ip netns exec "${MH_HOSTS[$1]}" cat /sys/class/net/eth0/statistics/tx_bytes; }

# Stops everything still running on our hosts (only processes inside this run's namespaces),
# then deletes the namespaces; their veths and the bridge go with them.
mh_teardown() {
    local ns pids sig
    for sig in TERM KILL; do
        pids=
        for ns in "${MH_NAMESPACES[@]}"; do pids+=" $(ip netns pids "$ns" 2>/dev/null)"; done
        [ -z "${pids// /}" ] && break
        # shellcheck disable=SC2086
        kill -$sig $pids 2>/dev/null
        sleep 1
    done
    for ns in "${MH_NAMESPACES[@]}"; do ip netns del "$ns" || echo "multihost: could not delete namespace $ns" >&2; done
    MH_NAMESPACES=()
    MH_HOSTS=()
    [ -n "$MH_DIR" ] && rm -rf "$MH_DIR"
    MH_DIR=
}
