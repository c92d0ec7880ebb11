# The two commands of README.md. Both install what they need first (scripts/install.sh; seconds when warm).
VENV ?= $(or $(COOPER_VENV),$(HOME)/.cache/cooper_openrlhf/venv)
PY := $(VENV)/bin/python
export COOPER_VENV := $(VENV)
export HF_HUB_OFFLINE := 1

.PHONY: install test test-nightly demo

install:
	bash scripts/install.sh

# The test suite: every layer, on the real OpenRLHF/DeepSpeed/vLLM/Ray code paths, on CPU. The fast tests on two
# processes; then the ones that start Ray, DeepSpeed, vLLM or Slurm jobs one at a time (two Ray clusters starting
# at once on 2 cores miss Ray's fixed start-up windows), every one's time listed (--durations=0: where CI's time goes).
# Both parts always run; either failing fails the target. The nightly tests (pytest.ini) are left to test-nightly.
test:
	COOPER_PREPARE_DEMO=0 bash scripts/install.sh
	@$(PY) -m pytest -m "not slow and not slurm and not nightly" -n 2 --dist loadfile; fast=$$?; \
	 $(PY) -m pytest -m "(slow or slurm) and not nightly" --durations=0; slow=$$?; \
	 [ $$fast -eq 0 ] && [ $$slow -eq 0 ]

# The nightly tests: whole chains and second configurations that `make test` leaves out (.ci/nightly runs them on a
# clean clone; docs/lab.md, "CI's time", says when).
test-nightly:
	COOPER_PREPARE_DEMO=0 bash scripts/install.sh
	$(PY) -m pytest -m nightly --durations=0

# The main job: the reward-hacking lab's quick preset (rule / static RM / Cooper, one seed) and its report. Its
# starting policy and RM are made by the install, once (lab/prepared.py); the demo copies them and runs the arms.
demo: install
	$(PY) -m cooper_openrlhf.cli.demo
