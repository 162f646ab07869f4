# Sourced by the test and benchmark scripts: the repository root as working directory,
# one thread per rank, the oracle's interpreter (Debian's python3 with torch), and
# mpirun with the flags a root CI machine with few cores needs.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=${LLMC_PYTHON:-/usr/bin/python3}
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
