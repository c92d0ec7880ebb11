#!/bin/bash
# Batch 46 (docs/lab/batch46/plan.json), start to finish, resumable on any machine of the plan's kind:
#   setsid nohup bash scripts/run_registered_batch.sh >> /work/runs/batch46-driver.log 2>&1 &
# Every step keeps what is committed to this checkout, so a replaced machine loses only the runs in flight:
#   1. the worktree pinned at the plan's commit (made on first use);
#   2. each preparation, in the plan's order: gates 1-4 (scripts/style_lab_gates.py) unless
#      docs/results/batch46/<lab>/gates.json records them passed, and its fingerprint written there; where they do,
#      the first unfinished lab's preparation is remade (cli.lab --prepare-only; a later lab's is made by the batch
#      when it gets there, not on every machine it passes through) and compared with the fingerprint: a different
#      preparation, or a failed gate, stops the batch (the plan's replacement rule needs an amendment);
#   3. the published runs (and lab.json) unpacked into the run folder where it lacks them, so the lab skips them;
#      a finished lab's preparation is still remade once on a new machine (cli.lab prepares before it skips runs);
#   4. the batch (cli.batch --parallel-runs 2 at nice 19), and beside it a loop that every few minutes checks the
#      fingerprint of the lab whose runs are running (a mismatch that holds a minute later stops the batch before
#      anything of it is published), publishes and commits each finished run (this checkout's lab/batch.py: a
#      retried run replaces its failed archive) and kills what a finished run left behind (the pinned runner
#      predates lab/runner.py's _stop_leftovers).
# Stop it with SIGTERM to this script's process group; no primary is read by anything here.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PLAN="$REPO/docs/lab/batch46/plan.json"
PUB="$REPO/docs/results/batch46"
PY=${COOPER_VENV:-$HOME/.cache/cooper_openrlhf/venv}/bin/python
# This checkout's helpers run with -P: from the pinned worktree (the cwd) a plain `python -c`/`python -` puts the
# cwd first on sys.path, ahead of PYTHONPATH, and imports the pinned package, which predates them.
HERE=("$PY" -P)
COMMIT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["commit"])' "$PLAN")
OUT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["out"])' "$PLAN")
PINNED=${BATCH46_WORKTREE:-/work/batch46}
export COOPER_CPU_BF16=0 HF_HUB_OFFLINE=1
log() { echo "$(date -u +%FT%TZ) $*"; }

commit_paths() {  # path-limited: nothing else of this checkout is committed, whatever else is staged
  local message=$1; shift
  git -C "$REPO" add -- "$@" || { log "could not stage $* (left for the next try)"; return; }
  git -C "$REPO" diff --cached --quiet -- "$@" && return  # committed already
  if ! git -C "$REPO" commit -q --only -m "$message" -- "$@"; then
    log "could not commit $* (left for the next try)"
  fi
}

AUTOGROUP=${BATCH46_AUTOGROUP_FILE:-/proc/sys/kernel/sched_autogroup_enabled}  # a test's stand-in, not the host's
[ "$(cat "$AUTOGROUP" 2>/dev/null)" = 0 ] \
  || echo 0 > "$AUTOGROUP" 2>/dev/null \
  || log "sched_autogroup stays on: nice 19 will not yield the cores to other sessions' work"
[ -d "$PINNED" ] || git -C "$REPO" worktree add --detach "$PINNED" "$COMMIT" || exit 2
mkdir -p "$OUT" "$PUB"
cd "$PINNED" || exit 2

# 2. gates or remade preparation, then the fingerprint --------------------------------------------------------------
mapfile -t labs < <(python3 -c 'import json,sys
for lab in json.load(open(sys.argv[1]))["labs"]: print(lab["name"])' "$PLAN")
first_unfinished=$(PYTHONPATH=$REPO "${HERE[@]}" -c 'import json, sys
from pathlib import Path
from cooper_openrlhf.lab.batch import unfinished_labs
print(next(iter(unfinished_labs(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))), ""))' "$PLAN" "$PUB")
for lab in "${labs[@]}"; do
  seed=$(python3 -c 'import json,sys
lab = next(l for l in json.load(open(sys.argv[1]))["labs"] if l["name"] == sys.argv[2])
print(lab["args"][lab["args"].index("--preparation-seed") + 1])' "$PLAN" "$lab")
  if [ ! -f "$PUB/$lab/gates.json" ]; then
    log "gates 1-4, $lab (--preparation-seed $seed)"
    mkdir -p "$PUB/$lab"
    PYTHONPATH=$PINNED nice -n 19 "$PY" scripts/style_lab_gates.py "$OUT/$lab" --preparation-seed "$seed" \
      > "$OUT/gates-$lab.log" 2>&1
    status=$?
    log "gates $lab exit $status"
    [ $status -eq 0 ] || { log "$lab failed its gates (see $OUT/gates-$lab.log): the batch stops here"; exit 3; }
    cp "$OUT/$lab/gates.json" "$PUB/$lab/gates.json"
    grep -v ' INFO \| WARNING ' "$OUT/gates-$lab.log" > "$PUB/$lab/gates.log"
  elif [ ! -d "$OUT/$lab/policy" ] && [ "$lab" != "$first_unfinished" ]; then
    continue  # finished, or not reached yet: the batch makes it when it gets there, and the loop below checks it
  elif [ ! -d "$OUT/$lab/policy" ]; then
    log "remaking $lab's preparation (its gates passed on an earlier machine: $PUB/$lab/gates.json)"
    mapfile -t args < <(python3 -c 'import json,sys
print("\n".join(next(l for l in json.load(open(sys.argv[1]))["labs"] if l["name"] == sys.argv[2])["args"]))' \
      "$PLAN" "$lab")
    PYTHONPATH=$PINNED nice -n 19 "$PY" -m cooper_openrlhf.cli.lab "${args[@]}" --prepare-only --out "$OUT/$lab" \
      > "$OUT/prepare-$lab.log" 2>&1 || { log "$lab's preparation failed ($OUT/prepare-$lab.log)"; exit 3; }
  fi
  PYTHONPATH=$PINNED "$PY" -m cooper_openrlhf.cli.batch "$PLAN" --fingerprint "$PUB" 2>&1 | grep "^$lab:"
  [ "${PIPESTATUS[0]}" -eq 0 ] || { log "$lab is not the preparation its runs were published from: stopped"; exit 4; }
  commit_paths "batch46: $lab's gates and preparation fingerprint" "$PUB/$lab"
done

# 3. published runs back into the run folder (this checkout's lab/batch.py; the pinned run_batch predates it) ---
PYTHONPATH=$REPO "${HERE[@]}" - "$PUB" "$OUT" "${labs[@]}" <<'PY'
import sys
from pathlib import Path
from cooper_openrlhf.lab.batch import restore_missing_runs
pub, out, labs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
for lab in labs:
    if restored := restore_missing_runs(pub / lab / "runs", out / lab):
        print(f"{lab}: {len(restored)} published runs restored")
PY

# 4. the batch, with the publisher and the leftovers' watchdog beside it ------------------------------------------
leftovers() {  # processes of the batch adopted by init whose run (their process group's leader) has ended
  local pid pgid
  for pid in $(ps -eo pid=,ppid= | awk '$2 == 1 {print $1}'); do
    { tr '\0' '\n' < "/proc/$pid/environ"; } 2>/dev/null | grep -qx "PYTHONPATH=$PINNED" || continue  # or gone
    pgid=$(ps -o pgid= -p "$pid" | tr -d ' ')
    [ -n "$pgid" ] && [ "$pgid" != "$pid" ] && [ ! -d "/proc/$pgid" ] && echo "$pid"
  done
}
fingerprints_hold() {  # the starting models of the lab running runs, against the committed fingerprints
  PYTHONPATH=$PINNED "$PY" - "$OUT" "$PUB" "${labs[@]}" > "$OUT/fingerprint.log" 2>&1 <<'PY'
import json, sys
from pathlib import Path
from cooper_openrlhf.lab.batch import compare_fingerprints, preparation_fingerprint
out, pub, labs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
differs = False
def running(lab):  # its runs start after its preparation; a lab still preparing may hold a file mid-write
    infos = (out / lab / "runs").glob("*/run_info.json")
    return any(json.loads(info.read_text()).get("status") == "running" for info in infos)
for lab in labs:
    record = pub / lab / "preparation.json"
    if record.is_file() and running(lab):
        lines = compare_fingerprints(json.loads(record.read_text()), preparation_fingerprint(out / lab))
        print(f"{lab}: " + ("the committed preparation" if not lines else "differs:\n  " + "\n  ".join(lines)))
        differs |= bool(lines)
sys.exit(1 if differs else 0)
PY
}
publish_loop() {
  while sleep 300; do
    if ! fingerprints_hold && ! { sleep 60; fingerprints_hold; }; then  # twice: a file may be mid-write
      log "a preparation differs from its committed fingerprint ($OUT/fingerprint.log): the batch stops unpublished"
      kill -TERM "$batch"
      return
    fi
    for pid in $(leftovers); do
      log "killing $pid, left by a finished run: $({ tr '\0' ' ' < "/proc/$pid/cmdline"; } 2>/dev/null | cut -c1-120)"
      kill -9 "$pid" 2>/dev/null
    done
    PYTHONPATH=$REPO "${HERE[@]}" - "$OUT" "$PUB" "${labs[@]}" <<'PY'
import sys
from pathlib import Path
from cooper_openrlhf.lab.batch import publish_runs
out, pub, labs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
for lab in labs:
    if (out / lab / "runs").is_dir():
        publish_runs(out / lab, pub / lab)
PY
    # whatever is published and not committed yet, this loop's or the batch's (a commit that met git's lock)
    mapfile -t paths < <(git -C "$REPO" status --porcelain --untracked-files=all -- "$PUB" | cut -c4- \
                          | sed "s#^#$REPO/#")
    if [ ${#paths[@]} -gt 0 ]; then
      archives=$(printf '%s\n' "${paths[@]}" | grep -c 'tar.gz$')
      if [ "$archives" -gt 0 ]; then
        commit_paths "batch46: $archives run archive(s) published" "${paths[@]}"
      else  # a lab rewrites its report as it starts or resumes
        commit_paths "batch46: a lab's report rewritten" "${paths[@]}"
      fi
    fi
  done
}
log "batch: $PLAN from $PINNED"
PYTHONPATH=$PINNED nice -n 19 "$PY" -m cooper_openrlhf.cli.batch "$PLAN" --parallel-runs 2 \
  --publish "$PUB" --commit-to "$REPO" >> "$OUT/batch.log" 2>&1 &
batch=$!
publish_loop &
publisher=$!
trap 'kill $publisher 2>/dev/null' EXIT
trap 'kill -TERM $batch 2>/dev/null' TERM INT
wait $batch
status=$?
while kill -0 "$batch" 2>/dev/null; do  # a signal ended the wait, not the batch: it is stopping its runs
  wait $batch
  status=$?
done
log "batch exit $status"
exit $status
