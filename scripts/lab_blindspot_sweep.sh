#!/usr/bin/env bash
# The lab at several blind-spot sizes: one lab folder per pair-stage candidate, all from one preparation.
#
#   bash scripts/lab_blindspot_sweep.sh runs/sweep 3 4      # candidates 3 and 4 of the full preset
#   python -m cooper_openrlhf.cli.blindspot runs/sweep/candidate* --out runs/sweep/figure
#
# The full preset's pair stage trains 32 candidate starting RMs from one BCE RM (lab/pair_stage.py); by default the
# lab starts every RM arm from the blindest. Here each named candidate gets its own lab folder
# (PREFIX/candidate<K>, `--rm-candidate K`), sharing the warm start and the candidates of PREFIX/prep (copied in,
# so they are trained once); every other setting is the full preset's. Re-run the same line to resume.
# ARMS and SEEDS (environment) choose the arms and seeds; the rule arm does not read the RM, so one folder's is
# every candidate's. LAB_FLAGS (environment) go to every lab command: runs 11-15 (docs/lab.md) ran before the
# full preset's starting RM changed (run 19), so LAB_FLAGS="--no-rm-answerless-data --rm-pair-candidates 8".
set -euo pipefail
prefix=${1:?usage: lab_blindspot_sweep.sh PREFIX CANDIDATE...}
shift
arms=${ARMS:-static,cooper,cooper_rollout_answerless}
seeds=${SEEDS:-3}
read -r -a lab_flags <<< "${LAB_FLAGS:-}"
py=${COOPER_VENV:-$HOME/.cache/cooper_openrlhf/venv}/bin/python
export HF_HUB_OFFLINE=1

"$py" -m cooper_openrlhf.cli.lab --preset full "${lab_flags[@]}" --prepare-only --out "$prefix/prep"
for k in "$@"; do
  out="$prefix/candidate$k"
  mkdir -p "$out"
  [ -d "$out/policy" ] || cp -r "$prefix/prep/policy" "$prefix/prep/verifyrm" "$out/"
  "$py" -m cooper_openrlhf.cli.lab --preset full "${lab_flags[@]}" --rm-candidate "$k" --arms "$arms" --seeds "$seeds" --out "$out" \
    || echo "lab at candidate $k: some runs failed (its report lists them)"
done
