"""A stage's plan: the commands a launcher runs (`Plan`) and the entry points' parsers every one passes through.

The parsers live in cli/, a layer above this one (cli/launch_plans.py passes them in as `EntryPoints`);
`parse_or_fail` turns a parser's exit into a `PreflightError`. The stages' plans are `cluster/rl_plan.py` (the RL
arms) and `cluster/stage_plans.py` (the others, and the registry of all).
"""

import argparse
import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass, field

from cooper_openrlhf.cluster.checks import Env, PreflightError
from cooper_openrlhf.cluster.placement import Placement
from cooper_openrlhf.runtime.secrets import WANDB_KEY_FROM_ENV


@dataclass
class Plan:
    """commands: one argv per task (one for single jobs). notes: what the user should know (printed)."""

    stage: str
    commands: list[list[str]]
    notes: list[str] = field(default_factory=list)
    placement: Placement | None = None
    runtime_env: dict | None = None


@dataclass(frozen=True)
class EntryPoints:
    """The parsers every planned command passes through: its entry point's own, in cli/ (cli/launch_plans.py).

    check_train_cooper(argv, gpus_per_node): train_cooper's parse of `argv` (the words after `python -m ...`) for
        the job's nodes; raises PreflightError naming what it rejects.
    verifyrm_parser(), evaluate_parser(): the `verifyrm` and `evaluate` CLIs' argparse parsers."""

    check_train_cooper: Callable[[list[str], int], None]
    verifyrm_parser: Callable[[], argparse.ArgumentParser]
    evaluate_parser: Callable[[], argparse.ArgumentParser]


def parse_or_fail(what: str, parse) -> object:
    """Run a parser; argparse's exit becomes a PreflightError carrying its message."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return parse()
    except SystemExit as exc:
        message = captured.getvalue().strip().splitlines()
        raise PreflightError(f"{what}: {message[-1] if message else f'parser exited with {exc.code}'}") from None


def wandb_flags(env: Env) -> list[str]:
    """Weights & Biases on when WANDB_API_KEY is set, as wandb itself reads it: the key stays in the environment
    (which the job and every Ray node inherit), never on a command line, in a log or in launch.json."""
    return ["--logger.wandb.key", WANDB_KEY_FROM_ENV] if env.get("WANDB_API_KEY") else []
