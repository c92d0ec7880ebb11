# The two commands of README.md. Both install what they need first (scripts/install.sh; seconds when warm).
VENV ?= $(or $(COOPER_VENV),$(HOME)/.cache/cooper_openrlhf/venv)
PY := $(VENV)/bin/python
export COOPER_VENV := $(VENV)
export HF_HUB_OFFLINE := 1

.PHONY: install test demo

install:
	bash scripts/install.sh

# The test suite: every layer, on the real OpenRLHF/DeepSpeed/vLLM/Ray code paths, on CPU.
test: install
	$(PY) -m pytest

# The main job: the reward-hacking lab's quick preset (rule / static RM / Cooper, one seed) and its report.
demo: install
	$(PY) -m cooper_openrlhf.cli.demo
