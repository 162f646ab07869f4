#!/usr/bin/env bash
# Prints an MPI compiler wrapper's flags translated for nvcc (the Makefile's GPU targets).
#
#   scripts/mpi_nvcc_flags.sh compile|link [MPICC]      (MPICC defaults to mpicc)
#
# Why: nvcc understands -I -D -L -l itself but stops at anything else gcc takes
# ("nvcc fatal: Unknown option '-pthread'" with Open MPI 5, whose wrapper adds -pthread
# and -Wl,-rpath,...). Translation:
#   -I -D -L -l -isystem   unchanged
#   -Wl,a,b / -Xlinker a   -Xlinker a,b (nvcc splits at commas, as gcc's -Wl does)
#   -pthread, the rest     -Xcompiler X (nvcc hands it to gcc when compiling and linking)
# Where the flags come from: Open MPI's wrapper splits them itself (--showme:compile,
# --showme:link); MPICH's (and Intel MPI's) prints one command line with -show, whose
# flags are sorted here: -I -D -isystem to compile, -L -l -Wl -Xlinker to link, -pthread
# to both, anything else to compile. Exits 1 with an `error:` line if neither works.
set -euo pipefail
mode=${1:-}
mpicc=${2:-mpicc}
if [ "$mode" != compile ] && [ "$mode" != link ]; then
    echo "usage: $0 compile|link [MPICC]" >&2
    exit 2
fi

# The wrapper's flags for this mode, one line; which flavour answered goes to $flavour.
if flags=$("$mpicc" --showme:"$mode" 2>/dev/null); then
    flavour=openmpi
elif flags=$("$mpicc" -show 2>/dev/null); then
    flavour=mpich
else
    echo "error: cannot read the MPI compiler flags from '$mpicc' (neither Open MPI's --showme:$mode" \
        "nor MPICH's -show works); install MPI or name its wrapper with MPICC=..." >&2
    exit 1
fi

# MPICH's single line: which side of the build a flag belongs to.
side_of() {
    case "$1" in
        -pthread) echo both ;;
        -L* | -l* | -Wl,* | -Xlinker* | -rpath*) echo link ;;
        *) echo compile ;;
    esac
}

out=()
read -r -a words <<<"$flags"
[ "$flavour" = mpich ] && words=("${words[@]:1}")  # -show's first word is the compiler itself
for ((i = 0; i < ${#words[@]}; i++)); do
    w=${words[i]}
    # Options whose value may be the next word.
    case "$w" in
        -I | -L | -D | -l | -isystem | -Xlinker | -include) w="$w ${words[i + 1]:-}"; i=$((i + 1)) ;;
    esac
    if [ "$flavour" = mpich ]; then
        side=$(side_of "$w")
        [ "$side" = both ] || [ "$side" = "$mode" ] || continue
    fi
    case "$w" in
        -I* | -D* | -L* | -l* | "-isystem "*) out+=("$w") ;;
        -Wl,*) out+=("-Xlinker ${w#-Wl,}") ;;
        "-Xlinker "*) out+=("$w") ;;
        *) out+=("-Xcompiler $w") ;;
    esac
done
echo "${out[*]}"
