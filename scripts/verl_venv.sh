#!/usr/bin/env bash
# A second virtual environment with verl 0.9.1, for the test that runs verl's own reward manager against the reward
# service (tests/test_serve_clients.py, the verl test; docs/serve.md, "TRL and verl").
#
#   bash scripts/verl_venv.sh            # venv at $COOPER_VERL_VENV (default ~/.cache/cooper_openrlhf/verl-venv)
#
# Why a second venv: verl 0.9.1 requires transformers < 5.11 and the main venv's pinned stack has a newer one.
# What goes in, and why only that:
#   - torch, the same version as the main venv, first (the CPU wheel, as scripts/install.sh installs it: anything
#     that needs torch installed before it would pull CUDA torch);
#   - verl 0.9.1 without its dependencies: its own list pulls wandb, datasets, peft, accelerate, tensorboard and
#     ray[default]'s dashboard, none of which scoring needs;
#   - what importing verl and running its reward loop (`verl.experimental.reward_loop`: RewardLoopWorker, the
#     registered reward managers, DataProto) needs: ray, tensordict, omegaconf/hydra, transformers < 5.11, aiohttp,
#     codetiming and dill (imported at module level on that path);
#   - requests, which `cooper_openrlhf/clients/verl.py` uses. verl loads that file by path, and its one import
#     (`cooper_openrlhf.clients.http`) comes from this checkout through a .pth file: no install of the package
#     (whose pins need the main venv's transformers).
# Idempotent: a stamp keyed on this script skips the installs when nothing changed (a re-run takes well under a second).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${COOPER_VERL_VENV:-$HOME/.cache/cooper_openrlhf/verl-venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"  # scripts/install.sh's pin: the main venv's torch
VERL_VERSION="0.9.1"
STAMP="$VENV/.cooper_openrlhf_verl"
PTH="cooper_openrlhf_checkout.pth"
# verl 0.9.1's own bounds (its wheel's Requires-Dist) where it states them.
DEPS=(
  "transformers>=5.5.3,<5.11,!=5.6.0"
  "tensordict>=0.8.0,<=0.10.0,!=0.9.0"
  "ray==2.55.0"
  "numpy>=2.0.0"
  omegaconf hydra-core aiohttp requests packaging codetiming dill
)

say() { printf '[verl-venv] %s\n' "$*"; }
die() { printf '[verl-venv] error: %s\n' "$*" >&2; exit 1; }

key="$(sha256sum < "$REPO/scripts/verl_venv.sh" | cut -d' ' -f1)"
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$key" ]; then
  say "verl $VERL_VERSION already installed in $VENV"
else
  if [ ! -x "$VENV/bin/python" ]; then
    command -v "$PYTHON" >/dev/null || die "no '$PYTHON' on PATH; set PYTHON=/path/to/python3.11"
    "$PYTHON" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 12) else 1)' \
      || die "verl $VERL_VERSION needs Python 3.10-3.12; set PYTHON=/path/to/python3.11"
    say "creating virtual environment $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
  say "torch $TORCH_VERSION (CPU)"
  "${PIP[@]}" install -q "torch==$TORCH_VERSION"
  say "verl $VERL_VERSION and what its reward loop imports"
  "${PIP[@]}" install -q --no-deps "verl==$VERL_VERSION"
  # pip then lists the verl dependencies left out on purpose (wandb, datasets, peft, ...): expected.
  "${PIP[@]}" install -q "${DEPS[@]}" "torch==$TORCH_VERSION"
  "$VENV/bin/python" -c 'import importlib.metadata as m, sys; v = m.version("torch"); sys.exit(not v.startswith(sys.argv[1]))' \
    "$TORCH_VERSION" || die "something replaced torch $TORCH_VERSION; see pip's output above"
  rm -f "$STAMP"  # written below, once verl's reward loop imports
fi

# This checkout's clients on the path (see the top), re-pointed on every run (cheap).
echo "$REPO" > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/$PTH"
if [ ! -f "$STAMP" ]; then
  "$VENV/bin/python" - <<'PY' || die "verl's reward loop does not import; see the error above"
from verl.experimental.reward_loop import RewardLoopWorker  # noqa: F401
from verl.workers.reward_manager import BatchRewardManager  # noqa: F401
import cooper_openrlhf.clients.verl  # noqa: F401
PY
  echo "$key" > "$STAMP"
fi
say "done: $VENV"
