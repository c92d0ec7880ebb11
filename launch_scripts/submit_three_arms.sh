#!/bin/bash
# Submit the paper's three arms (Cooper, static RM, rule reward) with the same configuration.
#   VERIFY_RM=/path/to/verifyrm PROMPTS=/path/to/prompts.jsonl bash launch_scripts/submit_three_arms.sh [extra train_cooper flags]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for arm in cooper static rule; do
  ARM=$arm sbatch --job-name="cooper-$arm" --export=ALL,ARM=$arm "$here/cooper_slurm.sbatch" "$@"
done
