# shellcheck shell=bash
# Helpers sourced by every launcher in launch_scripts/. The checks themselves are Python
# (python -m cooper_openrlhf.cli.preflight STAGE): the scripts only start processes.
#
# Every launcher works in two modes:
#   bash launch_scripts/X.sbatch [extra flags]   check the configuration (seconds, no Slurm or GPU needed), then
#                                                 sbatch this same script; with DRY_RUN=1, print what each node
#                                                 would run instead of submitting
#   inside the job (SLURM_JOB_ID set)             check again, then run
# `sbatch launch_scripts/X.sbatch` directly also works; it only skips the check before the queue.

COOPER_PYTHON=${COOPER_PYTHON:-python}

# True inside a Slurm job (the submit side has no SLURM_JOB_ID).
in_job() { [[ -n "${SLURM_JOB_ID:-}" ]]; }

dry_run() { [[ "${DRY_RUN:-0}" == 1 ]]; }

preflight() { "$COOPER_PYTHON" -m cooper_openrlhf.cli.preflight "$@"; }

# Run a command, or print it (shell-quoted) under DRY_RUN=1.
run() {
  if dry_run; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

# sbatch this launcher with the environment exported (the variables are its configuration); extra sbatch options
# from SBATCH_ARGS (e.g. "--dependency=afterok:123 --partition=gpu"). Prints the job id as the last line.
submit() {
  local extra=()
  read -r -a extra <<< "${SBATCH_ARGS:-}"
  run sbatch --parsable --export=ALL "${extra[@]}" "$@"
}
