#!/bin/bash
# The paper's pipeline as one chain of Slurm jobs, every stage checked before anything is submitted:
#   prompts (here, seconds) -> VerifyRM annotation (array) -> VerifyRM training -> RL arms (cooper, static, rule)
#   -> evaluation of the base policy and every arm's final policy (array) and the report (cli.report over the arms:
#   figures, report.md, summary.json in WORKDIR/report), each stage `--dependency=afterok` on the one before. A
#   requeued job (time limit, preemption) keeps its id and is not "ok" until its last attempt completes, so the
#   later stages wait for the final completion. The RL prompts lose HELDOUT (128) rows to WORKDIR/heldout.jsonl,
#   every arm's held-out evaluation (EVAL_STEPS).
#
#   WORKDIR=... POLICY=... ASSISTANT_MODEL=... PROMPTS=my_problems.jsonl DATA_DIR=... \
#   PRETRAIN=... GENERATORS=g1,g2 JUDGE=... bash launch_scripts/reproduce_paper.sh
#   DRY_RUN=1 ... bash launch_scripts/reproduce_paper.sh          # check every stage, print every command
#
# The variables are the single launchers' (README quick start 2), each meaning what it means there.
# Required: WORKDIR (all outputs), POLICY, PROMPTS (your problems, a question and its final answer per row, as
#   verifyrm_annotate.sbatch reads them; FORMAT=auto tells the keys from the first row: the RL prompts are prepared
#   from it here, with the answer-format instruction, as quick start 2's step 1), DATA_DIR (evaluate.sbatch's
#   benchmark folder, <name>/test.jsonl), ASSISTANT_MODEL (cooper arm; 'policy' allowed), and either VERIFY_RM (an
#   existing VerifyRM export: annotation and RM training are skipped) or PRETRAIN (+ INIT_HEAD, default 1),
#   GENERATORS and JUDGE.
# Optional: NODES (1, per RL arm), ARMS ("cooper static rule"), ANNOTATE_PROMPTS (the annotation's problems when they
#   are not PROMPTS; the same keys), INSTRUCTION (gsm8k-verl), HELDOUT (128), GPUS_PER_NODE=0 (CPU mode: every stage
#   on CPU, for tiny models and the local cluster), and every other variable of the single launchers (SHARDS,
#   N_SAMPLES, ...), which they read from the environment. SBATCH_ARGS is added to every sbatch (e.g.
#   "--partition=gpu --account=x"). This script's former names (TRAIN_DATA, EVAL_DATA_DIR, RM_BASE, RL_NODES,
#   TRAIN_FORMAT, ANNOTATE_FORMAT) are refused, each naming the variable that replaced it; so are OUT and ARM,
#   which it sets for every stage (from WORKDIR and ARMS).
set -euo pipefail
# The kit: this script's folder, unless this is slurmd's spool copy of it (plain `sbatch launch_scripts/X.sbatch`):
# then COOPER_LAUNCH_DIR, or the folder sbatch ran in (SLURM_SUBMIT_DIR: the checkout or its launch_scripts/).
if [[ -z "${COOPER_LAUNCH_DIR:-}" ]]; then
  for COOPER_LAUNCH_DIR in "$(dirname "${BASH_SOURCE[0]}")" "${SLURM_SUBMIT_DIR:-.}/launch_scripts" "${SLURM_SUBMIT_DIR:-.}"; do
    [[ -f "$COOPER_LAUNCH_DIR/common.sh" ]] && break
  done
fi
if [[ ! -f "$COOPER_LAUNCH_DIR/common.sh" ]]; then
  echo "error: COOPER_LAUNCH_DIR=$COOPER_LAUNCH_DIR: no common.sh there; cannot find the launch kit. Submit from the" \
       "cooper-openrlhf checkout (sbatch launch_scripts/$(basename "$0")), or export COOPER_LAUNCH_DIR=/path/to/launch_scripts" >&2
  exit 2
fi
COOPER_LAUNCH_DIR=$(cd "$COOPER_LAUNCH_DIR" && pwd)
export COOPER_LAUNCH_DIR
# shellcheck source=launch_scripts/common.sh
source "$COOPER_LAUNCH_DIR/common.sh"

# The names this script took before it took the single launchers': refused, so that no value is silently ignored;
# so are the two single-launcher variables it sets for every stage itself.
for pair in TRAIN_DATA:PROMPTS EVAL_DATA_DIR:DATA_DIR RM_BASE:PRETRAIN RL_NODES:NODES TRAIN_FORMAT:FORMAT \
            ANNOTATE_FORMAT:FORMAT OUT:WORKDIR ARM:ARMS; do
  old=${pair%%:*} new=${pair#*:}
  if [[ -n "${!old:-}" ]]; then
    case $old in
      OUT|ARM) echo "error: $old is set: reproduce_paper.sh sets it for every stage from $new; unset $old and set" \
                    "$new" >&2 ;;
      *) echo "error: $old is set: reproduce_paper.sh takes the single launchers' variable names; set $new instead" \
              "(launch_scripts/reproduce_paper.sh's header lists them)" >&2 ;;
    esac
    exit 2
  fi
done
WORKDIR=${WORKDIR:?set WORKDIR to the folder for every output of the reproduction}
POLICY=${POLICY:?set POLICY to the policy model folder (the paper: Qwen2.5-1.5B-Instruct)}
DATA_DIR=${DATA_DIR:?set DATA_DIR to the benchmark folder (<name>/test.jsonl), as for evaluate.sbatch}
PROMPTS=${PROMPTS:?set PROMPTS to your problems (JSON Lines, a question and its final answer per row)}
USER_DRY_RUN=${DRY_RUN:-0}
read -r -a ARM_LIST <<< "${ARMS:-cooper static rule}"
mkdir -p "$WORKDIR"
export POLICY

# Stage outputs that do not exist yet: the checks accept them (their folders must be writable).
RM_EXPORT=${VERIFY_RM:-$WORKDIR/verifyrm/best}
PENDING=()
[[ -n "${VERIFY_RM:-}" ]] || PENDING+=("$WORKDIR/annotate" "$RM_EXPORT")
for arm in "${ARM_LIST[@]}"; do PENDING+=("$WORKDIR/rl-$arm/final" "$WORKDIR/rl-$arm"); done
PENDING_PATHS=$(IFS=:; echo "${PENDING[*]}")
export PENDING_PATHS

# Submit (or under DRY_RUN=1 only check and print) one launcher; echoes its job id (or a placeholder).
stage() {  # name, dependency ids (space-separated, may be empty), launcher, env assignments...
  local name=$1 after=$2 launcher=$3; shift 3
  local sbatch_args=${SBATCH_ARGS:-}
  [[ -z "$after" ]] || sbatch_args="$sbatch_args --dependency=afterok:${after// /:}"
  echo "== $name${after:+ (after $after)}" >&2
  local output
  output=$(env "$@" SBATCH_ARGS="$sbatch_args" bash "$COOPER_LAUNCH_DIR/$launcher") || {
    echo "$output" >&2; echo "error: the $name stage failed its check; nothing more is submitted" >&2; return 1; }
  echo "$output" >&2
  if dry_run; then echo "$name-job"; else tail -n1 <<< "$output"; fi
}

echo "== prompts: $PROMPTS -> $WORKDIR/prompts.jsonl, held-out $WORKDIR/heldout.jsonl" >&2
"$COOPER_PYTHON" -m cooper_openrlhf.cluster.prompts --input "$PROMPTS" --format "${FORMAT:-auto}" \
  --instruction "${INSTRUCTION:-gsm8k-verl}" --out "$WORKDIR/prompts.jsonl" \
  --heldout "${HELDOUT:-128}" --heldout-out "$WORKDIR/heldout.jsonl" >&2

# Checks first, for every stage (DRY_RUN=1), so that a bad variable of the last stage fails before the first
# stage is queued; then the submissions.
for pass in check submit; do
  if [[ $pass == submit ]]; then [[ $USER_DRY_RUN == 1 ]] && break; export DRY_RUN=0 COOPER_CHECKED=1; else export DRY_RUN=1; fi
  rm_job=""
  if [[ -z "${VERIFY_RM:-}" ]]; then
    annotate_job=$(stage annotate "" verifyrm_annotate.sbatch OUT="$WORKDIR/annotate" \
      PROMPTS="${ANNOTATE_PROMPTS:-$PROMPTS}" FORMAT="${FORMAT:-auto}" \
      GENERATORS="${GENERATORS:?set GENERATORS (or VERIFY_RM to skip the VerifyRM stages)}" \
      JUDGE="${JUDGE:?set JUDGE (or VERIFY_RM to skip the VerifyRM stages)}")
    rm_job=$(stage verifyrm-train "$annotate_job" verifyrm_train.sbatch OUT="$WORKDIR/verifyrm" \
      ANNOTATED="$WORKDIR/annotate" PRETRAIN="${PRETRAIN:?set PRETRAIN (or VERIFY_RM to skip the VerifyRM stages)}" \
      INIT_HEAD="${INIT_HEAD:-1}")
  fi
  arm_jobs=()
  checkpoints=$POLICY
  run_dirs=""
  for arm in "${ARM_LIST[@]}"; do
    arm_jobs+=("$(stage "rl-$arm" "$rm_job" cooper_slurm.sbatch ARM="$arm" NODES="${NODES:-1}" \
      OUT="$WORKDIR/rl-$arm" PROMPTS="$WORKDIR/prompts.jsonl" EVAL_PROMPTS="$WORKDIR/heldout.jsonl" \
      VERIFY_RM="$RM_EXPORT" ASSISTANT_MODEL="${ASSISTANT_MODEL:-}")")
    checkpoints="$checkpoints,$WORKDIR/rl-$arm/final"
    run_dirs="${run_dirs:+$run_dirs,}$WORKDIR/rl-$arm"
  done
  eval_job=$(stage evaluate "${arm_jobs[*]}" evaluate.sbatch OUT="$WORKDIR/eval" CHECKPOINTS="$checkpoints" \
    DATA_DIR="$DATA_DIR")
  stage report "${arm_jobs[*]}" report.sbatch OUT="$WORKDIR/report" RUN_DIRS="$run_dirs" > /dev/null
  echo "evaluation: job $eval_job" >&2
done
if [[ $USER_DRY_RUN == 1 ]]; then
  echo "all stages checked (DRY_RUN=1: nothing submitted)" >&2
else
  echo "submitted; outputs under $WORKDIR" >&2
fi
