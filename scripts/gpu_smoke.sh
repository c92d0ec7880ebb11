#!/usr/bin/env bash
# The first command on a GPU machine: every GPU-only path of cooper-openrlhf, small, in about five minutes.
#
#   bash scripts/gpu_smoke.sh [OUT_DIR]      # default OUT_DIR: ./gpu_smoke
#
# Stages (PASS/FAIL each, with its log): the trainable RM actor in bf16 + flash attention; verifyrm train under
# deepspeed; verifyrm annotate with vLLM judge + generator on one GPU; a colocated train_cooper run (sleep modes,
# NCCL weight sync) that resumes from its checkpoint. On a machine without CUDA, vLLM's GPU build or flash-attn's
# kernels it stops at once, naming what is missing. Python: $COOPER_PYTHON, else the install's venv, else python3.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${COOPER_VENV:-$HOME/.cache/cooper_openrlhf/venv}"
PY="${COOPER_PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$VENV/bin/python" ]; then PY="$VENV/bin/python"; else PY="python3"; fi
fi
cd "$REPO"
exec "$PY" -m cooper_openrlhf.cli.gpu_smoke --out "${1:-gpu_smoke}"
