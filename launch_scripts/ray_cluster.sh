#!/bin/bash
# Run one Ray job on the nodes of a Slurm allocation; called by cooper_slurm.sbatch after its checks.
#
#   ray_cluster.sh ARGV_FILE RUNTIME_ENV_FILE [SCRATCH_DIR]
#     ARGV_FILE         the job's entrypoint, NUL-separated words (preflight --argv-out)
#     RUNTIME_ENV_FILE  the Ray job's runtime environment, JSON
#     SCRATCH_DIR       removed at exit (the caller's temporary folder)
#   Environment: RAY_NODES (node names, the head first), GPUS_PER_NODE, LOG_DIR, SUBMISSION_ID; optional
#   RAY_PORT (6379), RAY_DASHBOARD_PORT (8265), HEAD_TIMEOUT (180 s), JOIN_TIMEOUT (300 s), DRY_RUN, COOPER_PYTHON.
#
# The head starts on the first node and a worker on every other, each as one `srun` step running
# `ray start --block` (log: LOG_DIR/ray-<node>.log). cluster/ray_wait.py waits for the head, then for all
# nodes x GPUS_PER_NODE GPUs, and fails at once, naming the log, when a node's step exits. The job is submitted
# with `ray job submit` (its output also in LOG_DIR/job.log; the exit status is the job's). At exit -- success,
# failure, time-out or scancel -- `ray stop` runs on every node and the steps are ended, so no GPU stays held.
set -euo pipefail
# shellcheck source=launch_scripts/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

ARGV_FILE=$1 RUNTIME_ENV_FILE=$2 SCRATCH_DIR=${3:-}
read -r -a NODE_NAMES <<< "${RAY_NODES:?}"
GPUS_PER_NODE=${GPUS_PER_NODE:?}
LOG_DIR=${LOG_DIR:?}
RAY_PORT=${RAY_PORT:-6379}
RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-8265}
mapfile -d '' JOB_ARGV < "$ARGV_FILE"
RUNTIME_ENV=$(cat "$RUNTIME_ENV_FILE")
[[ -z "$SCRATCH_DIR" ]] || rm -rf "$SCRATCH_DIR"
NODES=${#NODE_NAMES[@]}
HEAD=${NODE_NAMES[0]}

node_step() {  # node, command...: one srun step on that node, beside the steps already running there
  local node=$1; shift
  srun --nodes=1 --ntasks=1 --nodelist="$node" --overlap "$@"
}

if dry_run; then
  HEAD_IP="IP-OF-$HEAD"
else
  HEAD_IP=$(node_step "$HEAD" hostname --ip-address | awk '{print $1}')
fi
echo "Ray head: $HEAD ($HEAD_IP:$RAY_PORT); nodes: ${NODE_NAMES[*]}; logs: $LOG_DIR"

STEP_PIDS=()
WATCH=()
start_node() {  # node, ray start arguments...
  local node=$1; shift
  local log="$LOG_DIR/ray-$node.log"
  local argv=(srun --nodes=1 --ntasks=1 --nodelist="$node" --overlap
              ray start "$@" --num-gpus="$GPUS_PER_NODE" --disable-usage-stats --block)
  if dry_run; then
    printf '+ [%s, log %s]' "$node" "$log"; printf ' %q' "${argv[@]}"; printf ' &\n'
    return
  fi
  "${argv[@]}" > "$log" 2>&1 &
  STEP_PIDS+=("$!")
  WATCH+=(--watch "$node=$!=$log")
}

stop_cluster() {
  local status=$?
  trap - EXIT INT TERM
  echo "stopping Ray on $NODES node(s) (exit status $status)"
  for node in "${NODE_NAMES[@]}"; do
    node_step "$node" ray stop --force >> "$LOG_DIR/ray-stop.log" 2>&1 || echo "ray stop failed on $node" >&2
  done
  for pid in "${STEP_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${STEP_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  exit "$status"
}
if ! dry_run; then
  trap stop_cluster EXIT
  trap 'exit 143' INT TERM   # scancel / time limit: the EXIT trap still stops every node
fi

wait_for() {  # nodes, gpus
  run "$COOPER_PYTHON" -m cooper_openrlhf.cluster.ray_wait --address "$HEAD_IP:$RAY_PORT" --nodes "$1" --gpus "$2" \
    --head-timeout "${HEAD_TIMEOUT:-180}" --join-timeout "${JOIN_TIMEOUT:-300}" "${WATCH[@]}"
}

start_node "$HEAD" --head --node-ip-address="$HEAD_IP" --port="$RAY_PORT" \
  --dashboard-host=0.0.0.0 --dashboard-port="$RAY_DASHBOARD_PORT"
wait_for 1 "$GPUS_PER_NODE"
for node in "${NODE_NAMES[@]:1}"; do
  start_node "$node" --address="$HEAD_IP:$RAY_PORT"
done
wait_for "$NODES" "$((NODES * GPUS_PER_NODE))"

SUBMIT=(ray job submit --address="http://$HEAD_IP:$RAY_DASHBOARD_PORT" --submission-id="${SUBMISSION_ID:?}"
        --runtime-env-json="$RUNTIME_ENV" -- "${JOB_ARGV[@]}")
if dry_run; then
  run "${SUBMIT[@]}"
  echo "at exit (trap, also when the job fails):"
  for node in "${NODE_NAMES[@]}"; do run srun --nodes=1 --ntasks=1 --nodelist="$node" --overlap ray stop --force; done
  exit 0
fi
"${SUBMIT[@]}" 2>&1 | tee "$LOG_DIR/job.log"
