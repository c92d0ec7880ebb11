#!/bin/bash
# Run one Ray job on the nodes of a Slurm allocation; called by cooper_slurm.sbatch after its checks.
#
#   ray_cluster.sh ARGV_FILE RUNTIME_ENV_FILE [SCRATCH_DIR]
#     ARGV_FILE         the job's entrypoint, NUL-separated words (preflight --argv-out; a leading `python` runs
#                       as COOPER_PYTHON)
#     RUNTIME_ENV_FILE  the Ray job's runtime environment, JSON
#     SCRATCH_DIR       removed at exit (the caller's temporary folder)
#   Environment: RAY_NODES (node names, the head first), RAY_SLOTS_PER_NODE (what `ray start --num-gpus` declares:
#   the node's GPUs, or logical slots in CPU mode), LOG_DIR, SUBMISSION_ID; optional RAY_PORT (6379),
#   RAY_DASHBOARD_PORT (8265), RAY_DASHBOARD_HOST (127.0.0.1: the dashboard and its job-submission API are not
#   exposed; 0.0.0.0 to reach it from elsewhere), HEAD_IP (the address the nodes join; default: the head's first
#   non-loopback IPv4), RAY_CPUS_PER_NODE (`ray start --num-cpus`; default: the allocation's CPUs per task),
#   RAY_PORT_BASE (every port of every node from this base, for several Ray nodes on one host: the local
#   cluster), RAY_OBJECT_STORE_BYTES, RAY_START_ATTEMPTS (1), HEAD_TIMEOUT (180 s), JOIN_TIMEOUT (300 s),
#   SUBMIT_TIMEOUT (300 s), CONTAINER_IMAGE (srun --container-image, pyxis), COOPER_SETUP (sourced on every
#   node), DRY_RUN, COOPER_PYTHON.
#
# The head starts on the first node and a worker on every other, each as one `srun` step running
# `ray start --block` (log: LOG_DIR/ray-<node>.log). cluster/ray_wait.py waits for the head, then for every
# node's slots, and fails at once, naming the log, when a node's step exits. The job is submitted with
# `ray job submit` (retried while the head's job agent is not up yet; output also in LOG_DIR/job.log; the exit
# status is the job's). At exit -- success, failure, time-out, requeue or scancel -- the steps are ended and
# `cluster/ray_stop.py` stops what is left of this cluster's Ray processes on every node (only this cluster's,
# found by its GCS port: never `ray stop`, which would end every Ray of the user on a shared node). Each node's
# workers' and job drivers' complete output is kept in LOG_DIR/ray-logs/attempt-<SLURM_RESTART_COUNT+1>/<node>/
# (cluster/ray_logs.py): job.log gets an actor's lines only as Ray forwards them, and the end of a job ends that.
set -euo pipefail
# shellcheck source=launch_scripts/common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"

ARGV_FILE=$1 RUNTIME_ENV_FILE=$2 SCRATCH_DIR=${3:-}
read -r -a NODE_NAMES <<< "${RAY_NODES:?}"
SLOTS=${RAY_SLOTS_PER_NODE:-${GPUS_PER_NODE:?set RAY_SLOTS_PER_NODE (or GPUS_PER_NODE)}}
LOG_DIR=${LOG_DIR:?}
mapfile -d '' JOB_ARGV < <(mapfile -d '' words < "$ARGV_FILE"; with_python "${words[@]}")
RUNTIME_ENV=$(cat "$RUNTIME_ENV_FILE")
[[ -z "$SCRATCH_DIR" ]] || rm -rf "$SCRATCH_DIR"
NODES=${#NODE_NAMES[@]}
HEAD=${NODE_NAMES[0]}
CPUS=${RAY_CPUS_PER_NODE:-${SLURM_CPUS_PER_TASK:-}}

# Ports. One node per host (a real cluster): Ray's own defaults but for the GCS and dashboard ports. Several nodes
# on one host (RAY_PORT_BASE set): node i takes BASE + 100 i + 0..9 and workers BASE + 500 + 100 i .. + 99.
if [[ -n "${RAY_PORT_BASE:-}" ]]; then
  RAY_PORT=${RAY_PORT:-$RAY_PORT_BASE}
  RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-$((RAY_PORT_BASE + 1))}
else
  RAY_PORT=${RAY_PORT:-6379}
  RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-8265}
fi
DASHBOARD_HOST=${RAY_DASHBOARD_HOST:-127.0.0.1}
node_ports() {  # node index -> `ray start` port flags
  [[ -n "${RAY_PORT_BASE:-}" ]] || return 0
  local b=$((RAY_PORT_BASE + 100 * $1)) w=$((RAY_PORT_BASE + 500 + 100 * $1))
  echo "--node-manager-port=$((b + 2)) --object-manager-port=$((b + 3)) --dashboard-agent-listen-port=$((b + 4))" \
       "--dashboard-agent-grpc-port=$((b + 5)) --metrics-export-port=$((b + 6)) --runtime-env-agent-port=$((b + 7))" \
       "--min-worker-port=$w --max-worker-port=$((w + 99))"
  [[ $1 != 0 ]] || echo "--ray-client-server-port=$((b + 8))"
}

# One srun step on a node, beside the steps already running there: the job's CPUs per task (srun >= 22.05 no
# longer reads SLURM_CPUS_PER_TASK), the container when asked, COOPER_SETUP sourced first.
STEP=(srun --nodes=1 --ntasks=1 --overlap)
[[ -z "${SLURM_CPUS_PER_TASK:-}" ]] || STEP+=("--cpus-per-task=$SLURM_CPUS_PER_TASK")
[[ -z "${CONTAINER_IMAGE:-}" ]] || STEP+=("--container-image=$CONTAINER_IMAGE")
step_argv() {  # node, command... -> STEP_ARGV (an array: started with `&`, its pid is srun's own)
  local node=$1; shift
  if [[ -n "${COOPER_SETUP:-}" ]]; then
    # shellcheck disable=SC2016  # expanded by the inner shell, on the node
    set -- bash -c 'source "$COOPER_SETUP" && exec "$@"' cooper-setup "$@"
  fi
  STEP_ARGV=("${STEP[@]}" --nodelist="$node" "$@")
}
node_step() { step_argv "$@"; "${STEP_ARGV[@]}"; }

pick_ipv4() {  # words -> the first non-loopback IPv4, else the first IPv4
  local word first=""
  for word in "$@"; do
    [[ $word =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || continue
    [[ $word == 127.* ]] || { echo "$word"; return; }
    first=${first:-$word}
  done
  echo "$first"
}

if [[ -n "${HEAD_IP:-}" ]]; then
  :
elif dry_run; then
  HEAD_IP="IP-OF-$HEAD"
else
  # shellcheck disable=SC2046
  HEAD_IP=$(pick_ipv4 $(node_step "$HEAD" bash -c 'hostname -I 2>/dev/null; hostname --ip-address 2>/dev/null' || true))
  [[ -n "$HEAD_IP" ]] || { echo "error: no IPv4 address found for the head node $HEAD; set HEAD_IP" >&2; exit 2; }
fi
echo "Ray head: $HEAD ($HEAD_IP:$RAY_PORT, dashboard $DASHBOARD_HOST:$RAY_DASHBOARD_PORT); nodes: ${NODE_NAMES[*]};" \
     "logs: $LOG_DIR"

STEP_PIDS=()
WATCH=()
start_node() {  # node index, ray start arguments...
  local index=$1; shift
  local node=${NODE_NAMES[$index]}
  local log="$LOG_DIR/ray-$node.log" ports
  read -r -a ports <<< "$(node_ports "$index" | tr '\n' ' ')"
  step_argv "$node" "$COOPER_RAY" start "$@" "${ports[@]}" --num-gpus="$SLOTS" ${CPUS:+--num-cpus="$CPUS"} \
    ${RAY_OBJECT_STORE_BYTES:+--object-store-memory="$RAY_OBJECT_STORE_BYTES"} --disable-usage-stats --block
  if dry_run; then
    printf '+ [%s, log %s]' "$node" "$log"; printf ' %q' "${STEP_ARGV[@]}"; printf ' &\n'
    return
  fi
  "${STEP_ARGV[@]}" > "$log" 2>&1 &
  STEP_PIDS+=("$!")
  WATCH+=(--watch "$node=$!=$log")
}

STOP=("$COOPER_PYTHON" -m cooper_openrlhf.cluster.ray_stop --port "$RAY_PORT")
RAY_LOGS=("$COOPER_PYTHON" -m cooper_openrlhf.cluster.ray_logs)
KEPT_LOGS="$LOG_DIR/ray-logs/attempt-$(( ${SLURM_RESTART_COUNT:-0} + 1 ))"
stop_cluster() {
  local status=$?
  trap - EXIT INT TERM
  echo "stopping Ray on $NODES node(s) (exit status $status)"
  # The `ray start --block` steps first (srun passes SIGTERM on; the node's Ray goes with its ray start), then
  # whatever of this cluster is left on each node; from here when Slurm no longer starts steps (scancel).
  for pid in "${STEP_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${STEP_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for node in "${NODE_NAMES[@]}"; do
    # From the folder recorded at the start (Ray has ended); from here, for this host's nodes, when Slurm no longer
    # starts steps (a requeue, scancel).
    step_argv "$node" "${RAY_LOGS[@]}" keep --dir "$KEPT_LOGS/$node"
    timeout 60 "${STEP_ARGV[@]}" >> "$LOG_DIR/ray-logs.log" 2>&1 \
      || "${RAY_LOGS[@]}" keep --dir "$KEPT_LOGS/$node" >> "$LOG_DIR/ray-logs.log" 2>&1 || true
    step_argv "$node" "${STOP[@]}"
    timeout 60 "${STEP_ARGV[@]}" >> "$LOG_DIR/ray-stop.log" 2>&1 \
      || "${STOP[@]}" >> "$LOG_DIR/ray-stop.log" 2>&1 || echo "ray_stop failed on $node" >&2
  done
  exit "$status"
}
if ! dry_run; then
  trap stop_cluster EXIT
  trap 'exit 143' INT TERM   # scancel / time limit: the EXIT trap still stops every node
fi

wait_for() {  # nodes, slots
  run "$COOPER_PYTHON" -m cooper_openrlhf.cluster.ray_wait --address "$HEAD_IP:$RAY_PORT" --nodes "$1" --gpus "$2" \
    --head-timeout "${HEAD_TIMEOUT:-180}" --join-timeout "${JOIN_TIMEOUT:-300}" "${WATCH[@]}"
}

start_cluster() {
  start_node 0 --head --node-ip-address="$HEAD_IP" --port="$RAY_PORT" \
    --dashboard-host="$DASHBOARD_HOST" --dashboard-port="$RAY_DASHBOARD_PORT"
  wait_for 1 "$SLOTS" || return
  for ((i = 1; i < NODES; i++)); do
    start_node "$i" --address="$HEAD_IP:$RAY_PORT"
  done
  wait_for "$NODES" "$((NODES * SLOTS))"
}
# RAY_START_ATTEMPTS (1): a node's `ray start` gives up when its raylet has not registered within 30 s (fixed in
# Ray), which an overloaded node can miss; further attempts start the whole cluster again.
for ((attempt = 1; ; attempt++)); do
  if start_cluster; then break; fi
  if dry_run || ((attempt >= ${RAY_START_ATTEMPTS:-1})); then exit 3; fi
  echo "Ray cluster start failed (attempt $attempt of ${RAY_START_ATTEMPTS}); starting it again" >&2
  for pid in "${STEP_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${STEP_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  for node in "${NODE_NAMES[@]}"; do step_argv "$node" "${STOP[@]}"; "${STEP_ARGV[@]}" >> "$LOG_DIR/ray-stop.log" 2>&1 || true; done
  STEP_PIDS=() WATCH=()
  sleep 5
done
# Which folder each node's raylet logs to, recorded while it runs (the copies are made at exit).
for node in "${NODE_NAMES[@]}"; do
  step_argv "$node" "${RAY_LOGS[@]}" record --port "$RAY_PORT" --to "$KEPT_LOGS/$node"
  if dry_run; then run "${STEP_ARGV[@]}"; continue; fi
  timeout 60 "${STEP_ARGV[@]}" >> "$LOG_DIR/ray-logs.log" 2>&1 \
    || echo "warning: could not record where Ray logs on $node (see $LOG_DIR/ray-logs.log); its workers' output" \
            "will be only what job.log got" >&2
done

# The batch script runs on the head node: a dashboard on 127.0.0.1 is reachable from here.
DASHBOARD=$DASHBOARD_HOST; [[ $DASHBOARD != 0.0.0.0 ]] || DASHBOARD=$HEAD_IP
SUBMIT=("$COOPER_RAY" job submit --address="http://$DASHBOARD:$RAY_DASHBOARD_PORT" --submission-id="${SUBMISSION_ID:?}"
        --runtime-env-json="$RUNTIME_ENV" -- "${JOB_ARGV[@]}")
if dry_run; then
  run "${SUBMIT[@]}"
  echo "at exit (trap, also when the job fails): end the ray start steps, then on every node:"
  for node in "${NODE_NAMES[@]}"; do
    step_argv "$node" "${RAY_LOGS[@]}" keep --dir "$KEPT_LOGS/$node"; run "${STEP_ARGV[@]}"
    step_argv "$node" "${STOP[@]}"; run "${STEP_ARGV[@]}"
  done
  exit 0
fi

# The head's job agent can answer well after the node is listed (minutes on a loaded node): retry while it says so,
# for up to SUBMIT_TIMEOUT seconds (a count of tries would depend on how long each failed try takes).
submit_deadline=$((SECONDS + ${SUBMIT_TIMEOUT:-300}))
for ((attempt = 1; ; attempt++)); do
  status=0
  # shellcheck disable=SC2016  # expanded by the inner shell
  run_main bash -c 'set -o pipefail; log=$1; shift; "$@" 2>&1 | tee -a "$log"' submit "$LOG_DIR/job.log" "${SUBMIT[@]}" \
    || status=$?
  if [[ $status != 0 ]] && ((SECONDS < submit_deadline)) && tail -n 5 "$LOG_DIR/job.log" | grep -qi "no available agent"; then
    echo "ray job submit: no job agent yet (attempt $attempt, $((submit_deadline - SECONDS)) s left of SUBMIT_TIMEOUT);" \
         "retrying in 5 s" | tee -a "$LOG_DIR/job.log"
    sleep 5
    continue
  fi
  exit "$status"
done
