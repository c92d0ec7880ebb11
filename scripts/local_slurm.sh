#!/bin/bash
# A real two-node Slurm cluster on this machine (Debian's slurm-wlm, built with MULTIPLE_SLURMD): nodes n1 and n2
# are two `slurmd -N` daemons on 127.0.0.1, each with its own port, spool, pid and log file.
#
#   scripts/local_slurm.sh up       install slurm-wlm + munge if missing (apt, root), write the config, start
#                                   munged, slurmctld, slurmd -N n1, slurmd -N n2; wait until both nodes are idle
#   scripts/local_slurm.sh down     stop what `up` started (by its pid files), nothing else
#   scripts/local_slurm.sh status   sinfo of the cluster, or why it is not up
#   scripts/local_slurm.sh env      the environment lines a shell needs to use it (eval "$(... env)")
#
# Everything lives in LOCAL_SLURM_DIR (default /tmp/cooper-local-slurm): slurm.conf, munge key and socket, spool,
# state, logs, pid files. The cluster's commands read it through SLURM_CONF (printed by `env`), so a system-wide
# Slurm configuration is neither read nor changed. Exit status 0 when up, 3 when it cannot run here (not root, no
# apt, daemons do not start), with the reason on stderr -- the tests skip with that reason.
# Notes on what makes it work: ../shared/notes/local-slurm.md.
set -euo pipefail

DIR=${LOCAL_SLURM_DIR:-/tmp/cooper-local-slurm}
CONF=$DIR/etc/slurm.conf
# Below 10000: the launchers' CPU mode gives the Ray nodes of a job ports from 10000-29999 (cluster/ports.py); a
# slurmd listening in that range once took a job's dashboard port and its Ray head could not start.
CTLD_PORT=${LOCAL_SLURM_CTLD_PORT:-9817}
NODE_PORTS=${LOCAL_SLURM_NODE_PORTS:-9818-9819}
UP_TIMEOUT=${LOCAL_SLURM_UP_TIMEOUT:-60}
EXIT_UNAVAILABLE=3

unavailable() { echo "local_slurm: cannot run a local Slurm cluster here: $*" >&2; exit "$EXIT_UNAVAILABLE"; }
log() { echo "local_slurm: $*" >&2; }

have_slurm() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
  && command -v sbatch >/dev/null; }

install_packages() {
  have_slurm && return 0
  [[ $(id -u) == 0 ]] || unavailable "slurm-wlm and munge are not installed and this is not root (apt-get needs root)"
  command -v apt-get >/dev/null || unavailable "slurm-wlm and munge are not installed and there is no apt-get"
  log "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q slurm-wlm munge > "$DIR/apt.log" 2>&1; then
    apt-get update -q >> "$DIR/apt.log" 2>&1 || true
    apt-get install -y -q slurm-wlm munge >> "$DIR/apt.log" 2>&1 \
      || unavailable "apt-get install slurm-wlm munge failed; see $DIR/apt.log"
  fi
  have_slurm || unavailable "slurm-wlm installed but slurmctld/slurmd/munged are not on PATH"
}

pid_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

env_lines() {
  echo "export SLURM_CONF=$CONF"
}

write_config() {
  local host cpus mem_mib
  host=$(hostname -s)
  cpus=$(nproc)
  # RealMemory: what the kernel reports, minus 1 GiB for the daemons and the system.
  mem_mib=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  mkdir -p "$DIR"/{etc,spool,state,log,run,munge}
  cat > "$CONF" <<EOF
# Written by scripts/local_slurm.sh: two nodes (n1, n2) on this host, one slurmd each (MULTIPLE_SLURMD).
ClusterName=cooperlocal
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: a step credential's lifetime, and how long a requeued job waits before it may start again
# (slurm.conf(5); 120 s by default). 30 s: the chain test's requeued arm idles half a minute, not two; still far
# longer than a step takes to start on a loaded host.
AuthInfo=socket=$DIR/munge/munge.socket,cred_expire=30
CryptoType=crypto/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
ReturnToService=2
JobRequeue=1
KillWait=10
# MinJobAge: how long slurmctld keeps a finished job (no slurmdbd here, so scontrol's view of a job is its
# record). A whole chain on a loaded 2-core machine outlasts 600 s after its first jobs end.
MinJobAge=3600
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
NodeName=n[1-2] NodeHostname=$host NodeAddr=127.0.0.1 Port=$NODE_PORTS CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  mkdir -p "$DIR/spool/n1" "$DIR/spool/n2"
}

start_munge() {
  local key=$DIR/munge/munge.key
  if pid_alive "$DIR/run/munged.pid"; then return; fi
  if [[ ! -s $key ]]; then
    dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
  fi
  chmod 700 "$DIR/munge"
  chmod 400 "$key"
  # As root with --force: munged refuses root otherwise; everything it touches is in our folder.
  munged --force --key-file="$key" --socket="$DIR/munge/munge.socket" --pid-file="$DIR/run/munged.pid" \
    --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munge.seed" \
    || unavailable "munged did not start; see $DIR/log/munged.log"
}

wait_idle() {  # both nodes up: idle on a fresh start; running jobs (mixed, allocated) when it was up already
  local deadline=$((SECONDS + UP_TIMEOUT)) states ready='(idle|mixed|allocated|completing)'
  while ((SECONDS < deadline)); do
    states=$(SLURM_CONF=$CONF sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | tr '\n' ' ') || true
    if [[ $states =~ n1\ $ready && $states =~ n2\ $ready ]]; then
      log "up: $states(SLURM_CONF=$CONF)"
      return 0
    fi
    sleep 1
  done
  unavailable "nodes not idle after ${UP_TIMEOUT} s (sinfo: ${states:-no answer}); logs in $DIR/log"
}

up() {
  mkdir -p "$DIR"
  install_packages
  if pid_alive "$DIR/run/slurmctld.pid" && pid_alive "$DIR/run/slurmd-n1.pid" && pid_alive "$DIR/run/slurmd-n2.pid"; then
    wait_idle
    return
  fi
  down_quiet
  trap 'down_quiet' EXIT   # a start that fails half-way leaves nothing running
  write_config
  start_munge
  export SLURM_CONF=$CONF
  slurmctld -f "$CONF" -i || unavailable "slurmctld did not start; see $DIR/log/slurmctld.log"
  for node in n1 n2; do
    slurmd -f "$CONF" -N "$node" || unavailable "slurmd -N $node did not start; see $DIR/log/slurmd-$node.log"
  done
  # A node that was down in saved state comes back as soon as its slurmd registers (ReturnToService=2).
  wait_idle
  trap - EXIT
}

stop_pid_file() {  # pid file, name: TERM, then KILL after 10 s
  local file=$1 name=$2 pid
  [[ -s $file ]] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    log "stopped $name (pid $pid)"
  fi
  rm -f "$file"
}

down_quiet() {
  [[ -d $DIR/run ]] || return 0
  stop_pid_file "$DIR/run/slurmd-n1.pid" "slurmd n1"
  stop_pid_file "$DIR/run/slurmd-n2.pid" "slurmd n2"
  stop_pid_file "$DIR/run/slurmctld.pid" slurmctld
  stop_pid_file "$DIR/run/munged.pid" munged
}

status() {
  if ! pid_alive "$DIR/run/slurmctld.pid"; then echo "local_slurm: not up ($DIR)" >&2; return 1; fi
  SLURM_CONF=$CONF sinfo -N
}

case "${1:-}" in
  up) up; env_lines ;;
  down) down_quiet ;;
  status) status ;;
  env) env_lines ;;
  *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
