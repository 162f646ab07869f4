#!/usr/bin/env bash
# Pretraining GPT-2 124M: a corpus -> token shards -> ZeRO-1 training -> a Hugging Face export.
#
#   scripts/pretrain_gpt2_124M.sh --corpus 'fineweb-edu/sample/10BT/*.jsonl.zst'   # 1 node x 8 GPUs
#   scripts/pretrain_gpt2_124M.sh --dry-run                                        # print the plan only
#   sbatch --nodes=4 scripts/pretrain_gpt2_124M.sh --corpus ...                    # Slurm: srun, a task per GPU
#   scripts/pretrain_gpt2_124M.sh --launcher hostfile --hostfile hosts.txt ...     # N nodes over ssh
#   scripts/pretrain_gpt2_124M.sh --cpu-smoke --corpus c.jsonl.zst --shards D --out O   # the same recipe, CPU-sized
#
# Phases (a progress line each): inputs (checked before anything is built), build, shards (prepro_corpus, skipped when the
# shards' manifest is there), train (always -y 1: a rerun of the same command resumes
# from the newest checkpoint, a finished run exits at once), export (hf_convert, once the
# run has reached its last step). The 124M hyperparameters are llm.c's GPT-2 (124M)
# reproduction's (docs/training.md, "Pretraining GPT-2 124M"): 524,288 tokens per step,
# -b 64 -t 1024 per GPU at 8 GPUs, lr 6e-4, 700 warmup steps, cosine to 0, weight
# decay 0.1, plus ZeRO-1, --shuffle, checkpoints and the HellaSwag-format eval. On several
# nodes it passes --dist-opt-instances NODES (docs/zero1.md: one ZeRO-1 group per node, only
# the shard all-reduce crosses the network). Validation reads 10.5M tokens (-m global
# batches of B x T: llm.c's 20 batches per GPU at 8 GPUs) at any rank count.
#
# --cpu-smoke: the same phases and the same flags, sized for 2 CPU cores (train_gpt2 at
# np 2, a d1 model, T=64, 12 steps, the shipped 40-item HellaSwag-format set);
# dev/test/test_recipe.sh runs it in `make test`.
#
# Options (each also as the environment variable in brackets):
#   --corpus PATH      an input of prepro_corpus (JSONL, .jsonl.zst, .jsonl.gz, .txt...);
#                      repeatable, globs are expanded [CORPUS: blank-separated]
#   --shards DIR       where the shards go / are [SHARDS_DIR; default data/pretrain_124M]
#   --name NAME        the shards' name prefix [SHARDS_NAME; default corpus]
#   --out DIR          the run directory: main.log, checkpoints [OUT_DIR; default out/gpt2_124M]
#   --hf-out DIR       the export [HF_DIR; default OUT/hf]
#   --hellaswag FILE   the -H 1 eval file [HELLASWAG_FILE; default dev/data/hellaswag/hellaswag_val.bin]
#   --launcher KIND    local (mpirun on this node), hostfile (scripts/multi_node/launch.sh),
#                      slurm (scripts/multi_node/train.sbatch's srun) [LAUNCHER; default:
#                      slurm inside a Slurm job, else local]
#   --gpus N           GPUs (ranks) per node [GPUS_PER_NODE; default 8, with --launcher
#                      hostfile the first node's slots=]
#   --nodes N          nodes, for the plan of a dry run outside Slurm [NODES; default 1; above 1
#                      the launcher defaults to slurm: a local mpirun stays on this node]
#   --hostfile FILE    for --launcher hostfile [HOSTFILE]
#   --steps N          optimizer steps [STEPS; default 19073 = 10e9 tokens / 524,288]
#   --micro-batch B    sequences per GPU per micro-step [MICRO_BATCH; default: 64, or less
#                      at more than 8 GPUs so that the tokens per step stay 524,288]
#   --no-build         do not run make (the binaries must exist)
#   --dry-run          print every command instead of running it
#   --cpu-smoke        the CPU-sized run above
# Extra trainer flags after `--` are appended (later flags win in the trainer).
# `--corpus -` reads JSON Lines on stdin (e.g. FineWeb-Edu's Parquet files through a reader).
#
# Under sbatch: the defaults below are 1 node x 8 GPUs; --nodes=N on the sbatch line for
# more. The job runs this script on the first node (shards, export) and the trainer through
# scripts/multi_node/train.sbatch (srun --mpi=pmix, one task per GPU). A requeued job runs
# the same command, which resumes (-y 1). --time is a guess: no GPU has timed this run.
#SBATCH --job-name=gpt2-124M
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --signal=TERM@120
#SBATCH --requeue
#SBATCH --output=%x-%j.out
set -euo pipefail
die() { echo "pretrain: error: $*" >&2; exit 1; }

# ---- options ----------------------------------------------------------------------------
DRY_RUN=0 CPU_SMOKE=0 BUILD=1
read -r -a CORPUS_LIST <<<"${CORPUS:-}"
EXTRA=()
while [ $# -gt 0 ]; do
    case $1 in
        --dry-run) DRY_RUN=1 ;;
        --cpu-smoke) CPU_SMOKE=1 ;;
        --no-build) BUILD=0 ;;
        --corpus | --shards | --name | --out | --hf-out | --hellaswag | --launcher | --gpus | --nodes | --hostfile | \
            --steps | --micro-batch)
            [ $# -ge 2 ] || die "$1 needs a value"
            case $1 in
                --corpus) CORPUS_LIST+=("$2") ;;
                --shards) SHARDS_DIR=$2 ;;
                --name) SHARDS_NAME=$2 ;;
                --out) OUT_DIR=$2 ;;
                --hf-out) HF_DIR=$2 ;;
                --hellaswag) HELLASWAG_FILE=$2 ;;
                --launcher) LAUNCHER=$2 ;;
                --gpus) GPUS_PER_NODE=$2 ;;
                --nodes) NODES=$2 ;;
                --hostfile) HOSTFILE=$2 ;;
                --steps) STEPS=$2 ;;
                --micro-batch) MICRO_BATCH=$2 ;;
            esac
            shift ;;
        --) shift; EXTRA=("$@"); break ;;
        -h | --help) sed -n '2,/^#SBATCH/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option '$1' (see $0 --help)" ;;
    esac
    shift
done

# ---- where the repository is (under sbatch the script runs from a spool copy) ---------
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ ! -f "$REPO/scripts/pretrain_gpt2_124M.sh" ] && [ -n "${SLURM_SUBMIT_DIR:-}" ]; then REPO=$SLURM_SUBMIT_DIR; fi
# Paths given on the command line or in the environment are the caller's: made absolute
# here, before the script moves to the repository root (where its defaults live).
absolute() { case $1 in /* | -) printf '%s' "$1" ;; *) printf '%s' "$PWD/$1" ;; esac; }
for var in SHARDS_DIR OUT_DIR HF_DIR HELLASWAG_FILE HOSTFILE; do
    if [ -n "${!var:-}" ]; then printf -v "$var" '%s' "$(absolute "${!var}")"; fi
done
for i in "${!CORPUS_LIST[@]}"; do CORPUS_LIST[i]=$(absolute "${CORPUS_LIST[i]}"); done
cd "$REPO"
START=$SECONDS
phase() { echo "== [pretrain +$((SECONDS - START)) s] $*"; }

# ---- the recipe: one set of variables, two sizes -----------------------------------------
# Everything below the profiles is shared: the smoke run goes through the same phases,
# builds its trainer command with the same function and passes the same flags.
if [ "$CPU_SMOKE" = 1 ]; then
    PROFILE="CPU smoke (train_gpt2, 2 ranks, d1, T=64)"
    TRAIN_BIN=./train_gpt2
    MAKE_TARGETS=(train_gpt2 prepro_corpus hf_convert USE_ZERO1=1)
    MODEL=d1 SEQ_LEN=64 TOKENS_PER_STEP=256 MAX_MICRO_BATCH=2
    STEPS=${STEPS:-12} WARMUP=2 VAL_EVERY=12 VAL_TOKENS_PER_EVAL=256 SAMPLE_EVERY=0 GEN_TOKENS=16
    CKPT_EVERY=4 CKPT_KEEP=2
    SHARD_TOKENS=65536 VAL_TOKENS=16384
    HELLASWAG_FILE=${HELLASWAG_FILE:-data/tinyshakespeare_hellaswag.bin}
    SHARDS_DIR=${SHARDS_DIR:-out/recipe_smoke/shards} OUT_DIR=${OUT_DIR:-out/recipe_smoke/run}
    LAUNCHER=${LAUNCHER:-local} GPUS_PER_NODE=${GPUS_PER_NODE:-2}
else
    PROFILE="GPT-2 124M (train_gpt2cu, one rank per GPU)"
    TRAIN_BIN=./train_gpt2cu
    MAKE_TARGETS=(train_gpt2cu prepro_corpus hf_convert USE_ZERO1=1)
    MODEL=d12 SEQ_LEN=1024 TOKENS_PER_STEP=524288 MAX_MICRO_BATCH=64
    STEPS=${STEPS:-$((10000000000 / 524288))}  # 10B tokens: 19073 steps
    WARMUP=700 VAL_EVERY=250 VAL_TOKENS_PER_EVAL=10485760 SAMPLE_EVERY=20000 GEN_TOKENS=144
    CKPT_EVERY=500 CKPT_KEEP=3
    SHARD_TOKENS=100000000 VAL_TOKENS=100000000   # llm.c's FineWeb layout: shard 0 (100M tokens) is val
    HELLASWAG_FILE=${HELLASWAG_FILE:-dev/data/hellaswag/hellaswag_val.bin}
    SHARDS_DIR=${SHARDS_DIR:-data/pretrain_124M} OUT_DIR=${OUT_DIR:-out/gpt2_124M}
    if [ -z "${GPUS_PER_NODE:-}" ] && [ "${LAUNCHER:-}" = hostfile ] && [ -r "${HOSTFILE:-}" ]; then
        # as scripts/multi_node/launch.sh: the nodes' slots (scripts/multi_node/hostfile.sh checks the file)
        source "$REPO/scripts/multi_node/hostfile.sh"
        read -r _ GPUS_PER_NODE < <(hostfile_nodes "$HOSTFILE") && [ -n "${GPUS_PER_NODE:-}" ] || exit 1
    fi
    GPUS_PER_NODE=${GPUS_PER_NODE:-8}
    if [ -z "${LAUNCHER:-}" ]; then
        if [ -n "${SLURM_JOB_ID:-}" ] || [ "${NODES:-1}" != 1 ]; then LAUNCHER=slurm; else LAUNCHER=local; fi
    fi
fi
LR=6e-4 FINAL_LR_FRAC=0.0 WEIGHT_DECAY=0.1 GRAD_CLIP=1.0 SEED=42
SHARDS_NAME=${SHARDS_NAME:-corpus}
HF_DIR=${HF_DIR:-$OUT_DIR/hf}

# ---- what has not run on a GPU: said first, every time -----------------------------------
cat <<'EOF'
==========================================================================================
 NOT RUN ON A GPU. This recipe has never run on a GPU: no GPU has been available to this
 project. Never run: train_gpt2cu on real GPUs (any size), GPT-2 124M at -b 64 -t 1024
 (its speed, and whether it fits GPU memory: the trainer checks at start-up and refuses
 with the need if not; then pass --micro-batch 32), NCCL between real GPUs, the
 multi-node and Slurm launches, the real HellaSwag file, and a 10B-token run itself.
 What has run: the same phases and flags, CPU-sized (--cpu-smoke, dev/test/test_recipe.sh
 in make test): train_gpt2 at np 2 with ZeRO-1, a kill and a -y 1 resume, the evals and
 the Hugging Face export checked by an independent reader. The GPU trainer's code runs in
 make test only on the CPU execution layer for CUDA (docs/cuda_cpu.md).
==========================================================================================
EOF
if [ "$DRY_RUN" = 1 ]; then phase "recipe: $PROFILE; dry run: the commands are printed, not run"
else phase "recipe: $PROFILE"; fi

# show CMD...: print it (shell-quoted); run it unless this is a dry run.
show() { printf '+'; printf ' %q' "$@"; printf '\n'; }
run() { show "$@"; [ "$DRY_RUN" = 1 ] || "$@"; }

# ---- ranks and the launcher ---------------------------------------------------------------
[[ $GPUS_PER_NODE =~ ^[1-9][0-9]*$ ]] || die "--gpus '$GPUS_PER_NODE': want a positive integer"
[[ ${NODES:-1} =~ ^[1-9][0-9]*$ ]] || die "--nodes '$NODES': want a positive integer"
case $LAUNCHER in
    local)
        [ "${NODES:-1}" = 1 ] || die "--launcher local runs on this node only: for --nodes $NODES submit with sbatch --nodes=$NODES or use --launcher hostfile"
        NODES=1 RANKS=$GPUS_PER_NODE ;;
    hostfile)
        [ -n "${HOSTFILE:-}" ] || die "--launcher hostfile needs --hostfile FILE (scripts/multi_node/hostfile.example)"
        source "$REPO/scripts/multi_node/hostfile.sh"
        read -r NODES _ < <(hostfile_nodes "$HOSTFILE") && [ -n "${NODES:-}" ] || exit 1
        RANKS=$((NODES * GPUS_PER_NODE)) ;;
    slurm)
        NODES=${SLURM_JOB_NUM_NODES:-${NODES:-1}}
        if [ -n "${SLURM_NTASKS:-}" ]; then RANKS=$SLURM_NTASKS
        else RANKS=$((NODES * GPUS_PER_NODE)); fi ;;
    *) die "--launcher '$LAUNCHER': want local, hostfile or slurm" ;;
esac
[ "$RANKS" -ge 1 ] || die "no ranks ($LAUNCHER)"
# Several nodes: one distributed-optimizer instance per node (ZeRO-1 inside it).
INSTANCES=1
if [ "$NODES" -gt 1 ]; then
    [ $((RANKS % NODES)) = 0 ] || die "$RANKS ranks on $NODES nodes: --dist-opt-instances $NODES needs the same ranks on every node"
    INSTANCES=$NODES
fi

# The tokens per step stay fixed; the micro-batch is what fits it (gradient accumulation
# makes up the rest at fewer GPUs).
per_rank=$((TOKENS_PER_STEP / (SEQ_LEN * RANKS)))
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || die "--steps '$STEPS': want a positive integer"
if [ "$per_rank" -lt 1 ] || [ $((per_rank * SEQ_LEN * RANKS)) != "$TOKENS_PER_STEP" ]; then
    die "$TOKENS_PER_STEP tokens per step are not a whole number of -t $SEQ_LEN sequences for each of $RANKS ranks"
fi
if [ -z "${MICRO_BATCH:-}" ]; then
    MICRO_BATCH=$MAX_MICRO_BATCH
    while [ $((per_rank % MICRO_BATCH)) != 0 ] || [ "$MICRO_BATCH" -gt "$per_rank" ]; do MICRO_BATCH=$((MICRO_BATCH - 1)); done
fi
if ! [[ $MICRO_BATCH =~ ^[1-9][0-9]*$ ]] || [ $((per_rank % MICRO_BATCH)) != 0 ]; then
    die "--micro-batch $MICRO_BATCH does not divide the $per_rank sequences per rank per step"
fi
ACCUM=$((per_rank / MICRO_BATCH))
VAL_STEPS=$((VAL_TOKENS_PER_EVAL / (MICRO_BATCH * SEQ_LEN)))
[ "$VAL_STEPS" -ge 1 ] || VAL_STEPS=1
INSTANCE_FLAGS=()
[ "$INSTANCES" = 1 ] || INSTANCE_FLAGS=(--dist-opt-instances "$INSTANCES")

# The trainer's flags, for either size.
train_flags() {
    TRAIN_FLAGS=(-i "$SHARDS_DIR/${SHARDS_NAME}_train_*.bin" -j "$SHARDS_DIR/${SHARDS_NAME}_val_*.bin"
        --tokenizer "$SHARDS_DIR/gpt2_tokenizer.bin" -o "$OUT_DIR"
        -e "$MODEL" -b "$MICRO_BATCH" -t "$SEQ_LEN" -d "$TOKENS_PER_STEP" -x "$STEPS"
        -l "$LR" -u "$WARMUP" -q "$FINAL_LR_FRAC" -c "$WEIGHT_DECAY" --grad-clip "$GRAD_CLIP"
        -z 1 "${INSTANCE_FLAGS[@]}" --shuffle --seed "$SEED"
        -v "$VAL_EVERY" -m "$VAL_STEPS" -H 1 --hellaswag-file "$HELLASWAG_FILE" -s "$SAMPLE_EVERY" -g "$GEN_TOKENS"
        -n "$CKPT_EVERY" -nk "$CKPT_KEEP" -y 1 "${EXTRA[@]}")
}

# launch_cmd: the whole command that starts the ranks, in LAUNCH.
launch_cmd() {
    local mpirun=(mpirun)
    [ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
    case $LAUNCHER in
        local)
            # the smoke run's 2 ranks share 2 cores with whatever else runs there
            [ "$CPU_SMOKE" = 1 ] && mpirun+=(--oversubscribe)
            LAUNCH=(env "OMP_NUM_THREADS=$THREADS" "${mpirun[@]}" -np "$RANKS" "$TRAIN_BIN") ;;
        hostfile) LAUNCH=(env "TRAIN_BIN=$REPO/${TRAIN_BIN#./}" "GPUS_PER_NODE=$GPUS_PER_NODE"
                          bash scripts/multi_node/launch.sh "$HOSTFILE") ;;
        slurm) LAUNCH=(env "TRAIN_BIN=$REPO/${TRAIN_BIN#./}" bash scripts/multi_node/train.sbatch) ;;
    esac
}
if [ "$CPU_SMOKE" = 1 ]; then THREADS=1; else THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / GPUS_PER_NODE > 0 ? $(nproc) / GPUS_PER_NODE : 1 ))}; fi

echo "plan: $RANKS ranks = $NODES node(s) x $((RANKS / NODES)) ($LAUNCHER), $INSTANCES ZeRO-1 instance(s), $MODEL, -b $MICRO_BATCH -t $SEQ_LEN x $ACCUM micro-steps = $TOKENS_PER_STEP tokens/step," \
     "$STEPS steps = $((STEPS * TOKENS_PER_STEP)) tokens; lr $LR, warmup $WARMUP, cosine to $LR x $FINAL_LR_FRAC," \
     "weight decay $WEIGHT_DECAY; val -m $VAL_STEPS; shards $SHARDS_DIR/${SHARDS_NAME}_*; run $OUT_DIR; export $HF_DIR"

# ---- inputs --------------------------------------------------------------------------------
phase "inputs"
MANIFEST=$SHARDS_DIR/${SHARDS_NAME}_manifest.txt
if [ ! -f "$HELLASWAG_FILE" ]; then
    msg="the -H 1 eval file '$HELLASWAG_FILE' is missing: make it with llm.c's dev/data/hellaswag.py (docs/huggingface.md, \"HellaSwag-style eval\") and copy it there, or pass --hellaswag FILE; without it, --hellaswag data/tinyshakespeare_hellaswag.bin (make data's 40 items: it checks the plumbing, no benchmark)"
    if [ "$DRY_RUN" = 1 ]; then echo "warning: $msg"; else die "$msg"; fi
fi
if [ -f "$MANIFEST" ]; then
    echo "shards: $MANIFEST exists ($(awk '$1 == "total" { printf "%s shards, %s tokens: val %s, train %s", $2, $3, $4, $5 }' "$MANIFEST")); prepro_corpus is skipped"
else
    if [ ${#CORPUS_LIST[@]} = 0 ]; then
        msg="no shards in $SHARDS_DIR (no $MANIFEST) and no corpus given: pass --corpus PATH (e.g. FineWeb-Edu's sample-10BT as JSONL / .jsonl.zst; docs/training.md, \"Pretraining GPT-2 124M\")"
        if [ "$DRY_RUN" = 1 ]; then echo "warning: $msg"; CORPUS_LIST=("CORPUS.jsonl.zst"); else die "$msg"; fi
    fi
    INPUTS=()
    for pattern in "${CORPUS_LIST[@]}"; do
        if [ "$pattern" = - ]; then INPUTS+=(-); continue; fi  # JSON Lines on stdin
        if [ -e "$pattern" ]; then  # a file of that name is that file, blanks and glob characters too
            matched=("$pattern")
        else  # a glob: expanded, never split on blanks
            shopt -s nullglob
            saved_ifs=$IFS IFS=
            # shellcheck disable=SC2206  # the pattern is meant to expand
            matched=($pattern)
            IFS=$saved_ifs
            shopt -u nullglob
        fi
        [ ${#matched[@]} -gt 0 ] || { [ "$DRY_RUN" = 1 ] && matched=("$pattern"); } || die "corpus '$pattern': no such file"
        for f in "${matched[@]}"; do
            [ "$DRY_RUN" = 1 ] || [ -r "$f" ] || die "corpus '$f' is not a readable file"
            INPUTS+=("$f")
        done
    done
    echo "corpus: ${#INPUTS[@]} input(s): ${INPUTS[*]:0:3}$([ ${#INPUTS[@]} -gt 3 ] && echo ' ...')"
fi

# ---- build ---------------------------------------------------------------------------------
phase "build"
if [ "$BUILD" = 1 ]; then
    run make "${MAKE_TARGETS[@]}"
else
    echo "(--no-build: using the binaries as they are)"
fi
for bin in "$TRAIN_BIN" ./prepro_corpus ./hf_convert; do
    [ "$DRY_RUN" = 1 ] || [ -x "$bin" ] || die "$bin is not built (make ${MAKE_TARGETS[*]})"
done

# ---- shards ------------------------------------------------------------------------------
phase "shards"
if [ -f "$MANIFEST" ]; then
    echo "shards are there ($MANIFEST)"
else
    run mkdir -p "$SHARDS_DIR"
    run ./prepro_corpus --out-dir "$SHARDS_DIR" --name "$SHARDS_NAME" --shard-tokens "$SHARD_TOKENS" \
        --val-tokens "$VAL_TOKENS" --progress 10 "${INPUTS[@]}"
fi

# ---- train -------------------------------------------------------------------------------
phase "train: $STEPS steps, resumable (-y 1: a rerun continues from the newest checkpoint in $OUT_DIR)"
train_flags
launch_cmd
run mkdir -p "$OUT_DIR"
run "${LAUNCH[@]}" "${TRAIN_FLAGS[@]}"

# ---- export ------------------------------------------------------------------------------
phase "export: the final checkpoint -> $HF_DIR (model.safetensors + config.json)"
FINAL=$OUT_DIR/$(printf 'checkpoint_%08d' "$STEPS")
if [ "$DRY_RUN" = 0 ] && [ ! -f "$FINAL/manifest.txt" ]; then
    die "the run ended without its final checkpoint $FINAL (rerun this command to resume)"
fi
run ./hf_convert export "$FINAL" "$HF_DIR" --overwrite  # a rerun of a finished run exports again
phase "done: $OUT_DIR/main.log, $FINAL, $HF_DIR"
