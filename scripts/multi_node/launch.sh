#!/usr/bin/env bash
# train_gpt2cu on the nodes of an Open MPI hostfile, one rank per GPU:
#
#   scripts/multi_node/launch.sh HOSTFILE [trainer flags...]
#   NCCL_SOCKET_IFNAME=eth0 MPI_IF=eth0 scripts/multi_node/launch.sh hosts.txt -e d12 -b 16 -t 1024
#
# HOSTFILE: one node per line, "NAME slots=GPUS", the same slots on every node (see
# hostfile.example; the rules: scripts/multi_node/hostfile.sh). mpirun runs on this
# node and starts the others' ranks over ssh: passwordless ssh between the nodes, and the
# repository, Open MPI, CUDA and NCCL at the same paths on every node. Ranks run in the
# current directory (on every node), so relative paths in the flags mean the same everywhere.
# Ranks are placed node by node (ranks 0..G-1 on the first node, ...); the trainer picks
# the GPU of its rank among the node's ranks.
#
# Env (scripts/multi_node/README.md says more):
#   TRAIN_BIN        the trainer (default: train_gpt2cu of this repository; train_gpt2 is the CPU one)
#   GPUS_PER_NODE    ranks per node (default: the first node's slots)
#   MPI_IF           interface (eth0) or subnet (10.1.0.0/16) for Open MPI's own TCP traffic
#   OMP_NUM_THREADS  host threads per rank (default: this node's cores / GPUS_PER_NODE)
#   MPIRUN_ARGS      more mpirun arguments, split on blanks, never glob-expanded (e.g. --bind-to numa)
#   SIGKILL_TIMEOUT  seconds a signalled job has to save its checkpoint (default 30)
#   DRY_RUN=1        print the mpirun command instead of running it
# Every NCCL_*, UCX_* and CUDA_* variable set here is passed to every rank.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
die() { echo "launch: error: $*" >&2; exit 1; }

[ $# -ge 1 ] || die "usage: $0 HOSTFILE [trainer flags...]"
HOSTFILE=$1; shift
[ -r "$HOSTFILE" ] || die "cannot read the hostfile '$HOSTFILE'"
TRAIN_BIN=${TRAIN_BIN:-$REPO/train_gpt2cu}
[ -x "$TRAIN_BIN" ] || die "$TRAIN_BIN is not built (make train_gpt2cu)"

# The nodes and their slots, checked (scripts/multi_node/hostfile.sh).
source "$REPO/scripts/multi_node/hostfile.sh"
read -r nodes slots < <(hostfile_nodes "$HOSTFILE") && [ -n "${slots:-}" ] || exit 1
GPUS_PER_NODE=${GPUS_PER_NODE:-$slots}
[[ $GPUS_PER_NODE =~ ^[1-9][0-9]*$ ]] && [ "$GPUS_PER_NODE" -le "$slots" ] ||
    die "GPUS_PER_NODE='$GPUS_PER_NODE': give 1 to the nodes' slots=$slots"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / GPUS_PER_NODE > 0 ? $(nproc) / GPUS_PER_NODE : 1 ))}

cmd=(mpirun -np $((nodes * GPUS_PER_NODE)) --hostfile "$HOSTFILE" --map-by "ppr:$GPUS_PER_NODE:node" --bind-to none)
[ "$(id -u)" = 0 ] && cmd+=(--allow-run-as-root)
[ -n "${MPI_IF:-}" ] && cmd+=(--mca btl_tcp_if_include "$MPI_IF" --mca oob_tcp_if_include "$MPI_IF")
# SIGTERM or Ctrl-C to mpirun: Open MPI 4 sends the ranks SIGCONT, waits this many seconds,
# SIGTERM, waits as long, then SIGKILL (default 1). The trainer saves a checkpoint on SIGTERM
# (--exit-signal-handler): SIGKILL_TIMEOUT seconds (default 30) are its time to do so.
cmd+=(--mca odls_base_sigkill_timeout "${SIGKILL_TIMEOUT:-30}")
# mpirun -x refuses a variable that is not set, so only what is.
for var in OMP_NUM_THREADS PATH LD_LIBRARY_PATH $(compgen -e | grep -E '^(NCCL|UCX|CUDA)_' || true); do
    [ -n "${!var+set}" ] && cmd+=(-x "$var")
done
# split on blanks, and nothing else: a '*' in them stays a '*' (no file names)
if [ -n "${MPIRUN_ARGS:-}" ]; then
    read -r -a extra <<<"$MPIRUN_ARGS"
    cmd+=("${extra[@]}")
fi
cmd+=("$TRAIN_BIN" "$@")

if [ "${DRY_RUN:-0}" = 1 ]; then
    printf '%q ' "${cmd[@]}"; echo
    exit 0
fi
echo "launch: $nodes nodes x $GPUS_PER_NODE ranks, OMP_NUM_THREADS=$OMP_NUM_THREADS" >&2
exec "${cmd[@]}"
