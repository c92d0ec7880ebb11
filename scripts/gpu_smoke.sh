#!/usr/bin/env bash
# The first command on a GPU machine: the GPU-only paths of Cooper training and VerifyRM, small. Expect 10-20
# minutes, most of it fixed costs (five vLLM engine starts with CUDA-graph capture on one GPU, DeepSpeed's fused
# Adam built on first use); no GPU has run it yet, so that is an estimate, not a measurement.
#
#   bash scripts/gpu_smoke.sh [OUT_DIR]      # default OUT_DIR: ./gpu_smoke
#
# It first materialises the small models its stages use (models/materialize.py). Stages (PASS/FAIL with its log,
# SKIP with its reason): the trainable RM actor in bf16 + flash attention; verifyrm train under
# deepspeed; verifyrm annotate with vLLM judge + generator on one GPU; then, from a policy taught to answer, a
# colocated Cooper run (sleep modes, CUDA IPC weight sync), the same run with each role on its own GPU (NCCL
# broadcast; 3 GPUs, else SKIP) and a run requeued after a best checkpoint. The two Cooper runs pass only when their
# logs show pairs, rewrites, an RM update and the next step paid by the updated RM; the requeued one when it
# resumed with the RM of its best checkpoint (docs/cluster.md). On a machine
# without CUDA, vLLM's GPU build or flash-attn's kernels it stops at once, naming what is missing.
# Python: $COOPER_PYTHON, else the install's venv, else python3.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${COOPER_VENV:-$HOME/.cache/cooper_openrlhf/venv}"
PY="${COOPER_PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x "$VENV/bin/python" ]; then PY="$VENV/bin/python"; else PY="python3"; fi
fi
cd "$REPO"
# The models its stages start from (seconds when already there; README's GPU steps install their PyPI packages)
HF_HUB_OFFLINE=1 "$PY" -m cooper_openrlhf.models.materialize tiny-qwen2-policy tiny-qwen2-rm smollm2-135m-instruct
exec "$PY" -m cooper_openrlhf.cli.gpu_smoke --out "${1:-gpu_smoke}"
