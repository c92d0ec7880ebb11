#!/bin/bash
# Batch 46's gates before any Cooper or control run (docs/lab/batch46/plan.json "gates_before_arms"), from the worktree
# pinned at the plan's registration commit. Resumable: each step reuses what an earlier invocation finished.
#   nohup nice -n 19 bash scripts/batch46_gates_and_pilot.sh > /work/runs/batch46/driver.log 2>&1 &
# (nice: the gates run beside other work on 2 cores). The pinned worktree is made on first use.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PINNED=${BATCH46_WORKTREE:-/work/batch46}
[ -d "$PINNED" ] || git -C "$REPO" worktree add --detach "$PINNED" 3dab86b || exit 2
cd "$PINNED" || exit 2
export COOPER_CPU_BF16=0 HF_HUB_OFFLINE=1 PYTHONPATH=$PINNED
PY=${COOPER_VENV:-$HOME/.cache/cooper_openrlhf/venv}/bin/python
OUT=${BATCH46_OUT:-/work/runs/batch46}
mkdir -p "$OUT"
echo "$(date -u +%FT%TZ) gates 1-4, preparation 0"
$PY scripts/style_lab_gates.py $OUT/prep0 --preparation-seed 0 > $OUT/gates-prep0.log 2>&1
gates0=$?
echo "$(date -u +%FT%TZ) gates prep0 exit $gates0"
if [ $gates0 -eq 0 ]; then
  echo "$(date -u +%FT%TZ) pilot: rule, static, oracle on preparation 0, seeds 0-1"
  $PY -m cooper_openrlhf.cli.lab --preset style --arms rule,static,oracle --preparation-seed 0 --run-timeout 5400 \
      --require-verifier --seeds 2 --parallel-runs 2 --out $OUT/prep0 > $OUT/pilot-prep0.log 2>&1
  status=$?
  echo "$(date -u +%FT%TZ) pilot exit $status"
fi
for p in 1 2; do
  echo "$(date -u +%FT%TZ) gates 1-4, preparation $p"
  $PY scripts/style_lab_gates.py $OUT/prep$p --preparation-seed $p > $OUT/gates-prep$p.log 2>&1
  status=$?  # read before any other command: "$(date ...)" in the echo below would reset $? to 0
  echo "$(date -u +%FT%TZ) gates prep$p exit $status"
done
echo "$(date -u +%FT%TZ) done"
