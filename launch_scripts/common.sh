# shellcheck shell=bash
# Helpers sourced by every launcher in launch_scripts/. The checks themselves are Python
# (python -m cooper_openrlhf.cli.preflight STAGE): the scripts only start processes.
#
# Every launcher works in two modes:
#   bash launch_scripts/X.sbatch [extra flags]   check the configuration (seconds, no Slurm or GPU needed), then
#                                                 sbatch this same script; with DRY_RUN=1, print the sbatch line
#                                                 (and, RL, what each node would run) instead of submitting
#   inside the job (SLURM_JOB_ID set)             check again, then run
# `sbatch launch_scripts/X.sbatch` directly works too (it skips the check before the queue): the job runs a copy
# of the script in slurmd's spool folder, so each launcher finds this kit through COOPER_LAUNCH_DIR (exported by
# the first mode) or SLURM_SUBMIT_DIR (the folder sbatch ran in: the checkout or its launch_scripts/).
#
# Environment for every launcher: COOPER_PYTHON (python; its folder's `ray` is used too), COOPER_SETUP (a file
# sourced in the job and on every node before anything starts: modules, conda, venv), CONTAINER_IMAGE (pyxis:
# every srun step runs in it), GPUS_PER_NODE=0 (CPU mode: every role on CPU, for tiny models and the local
# cluster of scripts/local_slurm.sh), CPUS_PER_TASK / MEM (sbatch --cpus-per-task / --mem at submission),
# SIGNAL_MARGIN (seconds before the time limit at which the job requeues itself; default 600; at submission
# through this kit, for the launchers that requeue: RL, annotate, evaluate).

if [[ -n "${COOPER_SETUP:-}" ]]; then
  [[ -f "$COOPER_SETUP" ]] || { echo "error: COOPER_SETUP=$COOPER_SETUP: no such file" >&2; exit 2; }
  # shellcheck source=/dev/null
  source "$COOPER_SETUP"
fi

COOPER_PYTHON=${COOPER_PYTHON:-python}
# The `ray` beside the interpreter (a venv's), else PATH's: the CLI must be the Ray the job imports.
if [[ -z "${COOPER_RAY:-}" ]]; then
  COOPER_RAY=ray
  python_path=$(command -v "$COOPER_PYTHON" 2>/dev/null || true)
  [[ -n "$python_path" && -x "$(dirname "$python_path")/ray" ]] && COOPER_RAY="$(dirname "$python_path")/ray"
fi
export COOPER_PYTHON COOPER_RAY

cpu_mode() { [[ "${GPUS_PER_NODE:-}" == 0 ]]; }
if cpu_mode; then  # DeepSpeed's CPU accelerator and one thread per process (many processes share few cores)
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi

# True inside a Slurm job (the submit side has no SLURM_JOB_ID).
in_job() { [[ -n "${SLURM_JOB_ID:-}" ]]; }

dry_run() { [[ "${DRY_RUN:-0}" == 1 ]]; }

preflight() { "$COOPER_PYTHON" -m cooper_openrlhf.cli.preflight "$@"; }

# The check before submission. reproduce_paper.sh checks every stage first (DRY_RUN=1) and then submits them with
# COOPER_CHECKED=1, so that no stage is checked twice on the login node (the RL check parses train_cooper's flags
# with OpenRLHF's parser: seconds each); the job checks again inside, where the allocation is known.
check_before_submit() {
  if [[ "${COOPER_CHECKED:-0}" == 1 ]] && ! dry_run; then return 0; fi
  preflight "$@"
}

# Run a command, or print it (shell-quoted, every secret shown as ***: runtime/secrets.py) under DRY_RUN=1.
run() {
  if dry_run; then
    "$COOPER_PYTHON" -m cooper_openrlhf.runtime.secrets "$@"
  else
    "$@"
  fi
}

# The plan's commands start with `python`: the job runs them with COOPER_PYTHON.
with_python() {
  if [[ $1 == python ]]; then shift; set -- "$COOPER_PYTHON" "$@"; fi
  printf '%s\0' "$@"
}

# CPU mode's sbatch options: no GPU, a core and a little memory, nodes shared (overriding the #SBATCH lines).
cpu_sbatch_args() {
  CPUS_PER_TASK=${CPUS_PER_TASK:-1} MEM=${MEM:-1G}
  SBATCH_ARGS="${SBATCH_ARGS:-} --oversubscribe"
}

# sbatch this launcher with the environment exported (the variables are its configuration); extra sbatch options
# from SBATCH_ARGS (e.g. "--dependency=afterok:123 --partition=gpu"). Prints the job id as the last line.
# Under DRY_RUN=1 it prints the sbatch line instead, after the script's #SBATCH defaults it does not override
# (the time limit among them) and, when SBATCH_ARGS is empty, where a cluster's partition and account go.
submit() {
  local extra=()
  read -r -a extra <<< "${SBATCH_ARGS:-}"
  [[ -z "${CPUS_PER_TASK:-}" ]] || extra+=("--cpus-per-task=$CPUS_PER_TASK")
  [[ -z "${MEM:-}" ]] || extra+=("--mem=$MEM")
  # SIGNAL_MARGIN moves the signal of the launchers that ask for one (#SBATCH --signal: they requeue on it). The
  # others do not handle USR1, and bash's default action for it would end them that long before their time limit.
  if [[ -n "${SIGNAL_MARGIN:-}" ]] && grep -q '^#SBATCH --signal=' "$0"; then
    extra+=("--signal=B:USR1@$SIGNAL_MARGIN")
  fi
  if dry_run; then
    local defaults
    defaults=$(sed -n 's/^#SBATCH //p' "$0" | tr '\n' ' ')
    echo "# would submit, with $(basename "$0")'s #SBATCH lines: $defaults(the options below override them)"
    [[ -n "${SBATCH_ARGS:-}" ]] ||
      echo '# partition, account and any other sbatch option: SBATCH_ARGS="--partition=P --account=A"'
  fi
  run sbatch --parsable --export=ALL "${extra[@]}" "$@"
}

# ---------------------------------------------------------------- in the job: time limits and preemption
# The launchers ask for `--requeue --signal=B:USR1@600`: Slurm sends USR1 to this shell 10 minutes before the
# time limit (and at a preemption where the site sets SlurmctldParameters=preempt_send_user_signal; otherwise a
# preempted job gets SIGTERM, and Ray with it), the job requeues itself and the next attempt resumes (RL:
# --ckpt.load_enable from the checkpoint the trainer saved on the signal, else the last periodic one; annotate and
# evaluate: from their caches). The main
# command runs in the background so that the signal is handled at once (bash runs traps between commands).
job_ref() {
  if [[ -n "${SLURM_ARRAY_JOB_ID:-}" ]]; then echo "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"; else echo "$SLURM_JOB_ID"; fi
}

requeue_self() {
  request_checkpoint
  if [[ -n "$MAIN_PID" ]] && ! kill -0 "$MAIN_PID" 2>/dev/null; then
    echo "[$(date -u +%FT%TZ)] USR1: the main command ended meanwhile; no requeue" >&2; return 0
  fi
  echo "[$(date -u +%FT%TZ)] USR1 (time limit or preemption ahead): requeueing job $(job_ref); the next attempt" \
       "resumes from the last checkpoint" >&2
  scontrol requeue "$(job_ref)" || echo "error: scontrol requeue $(job_ref) failed; the job ends here" >&2
}

# RL (SAVE_REQUEST_DIR = the run's --ckpt.path): before the requeue, ask the trainer for a checkpoint of the step in
# flight (cooper_openrlhf/ray/save_request.py) and wait for its answer, so that the next attempt goes on after that
# step rather than after the last periodic checkpoint. The wait ends SAVE_RESERVE (120) s before the time limit,
# leaving time for the requeue, and lasts at most SAVE_ON_SIGNAL_S (SIGNAL_MARGIN - SAVE_RESERVE) s.
SAVE_REQUEST_DIR=""
request_checkpoint() {
  [[ -n "$SAVE_REQUEST_DIR" ]] || return 0
  local reserve=${SAVE_RESERVE:-120} left wait_s
  wait_s=${SAVE_ON_SIGNAL_S:-$(( ${SIGNAL_MARGIN:-600} - reserve ))}
  left=$(seconds_left)
  if [[ -n "$left" ]] && (( left - reserve < wait_s )); then wait_s=$(( left - reserve )); fi
  if (( wait_s <= 0 )); then
    echo "[$(date -u +%FT%TZ)] USR1: no time left for a checkpoint (${left:-?} s to the time limit)" >&2; return 0
  fi
  mkdir -p "$SAVE_REQUEST_DIR" && rm -f "$SAVE_REQUEST_DIR/save_request.done"
  echo "USR1 at $(date -u +%FT%TZ), job $(job_ref): time limit or preemption ahead" > "$SAVE_REQUEST_DIR/save_request"
  echo "[$(date -u +%FT%TZ)] USR1: asked the trainer for a checkpoint of the step in flight; waiting up to" \
       "$wait_s s" >&2
  local deadline=$(( SECONDS + wait_s ))
  while (( SECONDS < deadline )); do
    if [[ -s "$SAVE_REQUEST_DIR/save_request.done" ]]; then
      echo "[$(date -u +%FT%TZ)] USR1: the trainer saved $(< "$SAVE_REQUEST_DIR/save_request.done")" >&2; return 0
    fi
    if [[ -n "$MAIN_PID" ]] && ! kill -0 "$MAIN_PID" 2>/dev/null; then return 0; fi
    sleep 2
  done
  echo "[$(date -u +%FT%TZ)] USR1: no checkpoint within $wait_s s; the next attempt resumes from the last whole one" >&2
}

# The job's seconds to its time limit (squeue's %L: [D-][H:]M:S), or nothing when unknown or unlimited.
seconds_left() {
  local left
  left=$(squeue -h -j "$(job_ref)" -o %L 2>/dev/null) || return 0
  [[ "$left" =~ ^(([0-9]+)-)?(([0-9]+):)?([0-9]+):([0-9]+)$ ]] || return 0
  echo $(( ${BASH_REMATCH[2]:-0} * 86400 + 10#${BASH_REMATCH[4]:-0} * 3600 + 10#${BASH_REMATCH[5]} * 60 + 10#${BASH_REMATCH[6]} ))
}

requeue_on_signal() { trap requeue_self USR1; }

# Run a plan's command (NUL-separated words in a file; a leading `python` is COOPER_PYTHON) as the main command.
run_argv_file() {
  local words
  mapfile -d '' words < <(mapfile -d '' raw < "$1"; with_python "${raw[@]}")
  if dry_run; then run "${words[@]}"; else run_main "${words[@]}"; fi
}

# Run the job's main command; its exit status. `wait` returns early (128 + the signal) when a trapped signal
# arrives: wait again while the command runs, then once more for its own status (bash keeps it), which is also
# right when the command ended during the trap.
MAIN_PID=""
run_main() {
  "$@" &
  MAIN_PID=$!
  while kill -0 "$MAIN_PID" 2>/dev/null; do wait "$MAIN_PID" || true; done
  local status=0
  wait "$MAIN_PID" || status=$?
  return "$status"
}

# scancel, requeue, time limit: Slurm sends SIGTERM to every process of the job, then SIGKILL after KillWait.
# Wait for the main command's own clean-up (ray_cluster.sh stops Ray) before this shell ends the job.
stop_on_term() { trap 'trap - TERM INT; [[ -z "$MAIN_PID" ]] || wait "$MAIN_PID" 2>/dev/null; exit 143' TERM INT; }
