"""The paper's arms, and the one function that writes an arm's `train_cooper` command.

An arm is where the policy's reward comes from: the rule verifier, a frozen VerifyRM, or a VerifyRM that Cooper
trains each step (on pairs from the policy's rollouts, or from a file). `ARMS` holds the paper's three (arXiv
2508.05613, Table 1), the arms the product runs; `train_cooper_argv` turns an arm and the rest of a run's command
into its argv. The cluster launcher (cluster/rl_plan.py), the GPU smoke test (cli/gpu_smoke.py) and the
reward-hacking lab (lab/arms.py, whose table adds its research arms to these) build every train_cooper command with
it, so an arm means the same flags wherever it runs; what differs between them (sizes, devices, folders) is the
`shared` part each passes in.
"""

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from cooper_openrlhf.algo.registry import NEGATIVE_SOURCES
from cooper_openrlhf.runtime.registry import Registry

TRAIN_COOPER = "cooper_openrlhf.cli.train_cooper"


@dataclass(frozen=True)
class Arm:
    """reward: "rule" (the rule verifier pays, no RM) or "rm" (a VerifyRM pays).
    trains_rm: the RM is Cooper's, updated each step (`--remote_rm_trainable`); else it stays frozen.
    negative_source: an RM-training arm's negatives (`--cooper.negative_source`).
    pairs: an RM-training arm whose pairs come from a file instead of the policy's rollouts: the kind of file (the
        lab names the kinds and writes the files, lab/arms.py); `train_cooper_argv` then needs the file's path.
    assistant: who rewrites a positive into a negative: None, the policy being trained (its own vLLM engines);
        else a frozen model on a dedicated engine (`--cooper.assistant model`), named for what it is (the lab's
        "starting_policy"); `train_cooper_argv` then needs its folder.
    flags: the arm's further train_cooper flags."""

    reward: str
    trains_rm: bool = False
    negative_source: str = "assistant"
    pairs: str | None = None
    assistant: str | None = None
    flags: tuple[str, ...] = ()


ARMS: Registry[Arm] = Registry("arm", {
    "rule": Arm("rule"),
    "static": Arm("rm"),
    "cooper": Arm("rm", trains_rm=True),
})
# The paper's three arms in the order the launchers name them (ARM=..., the first the default).
PAPER_ARMS = ("cooper", "static", "rule")


def train_cooper_argv(arm: str, shared: Sequence[str], *, rm: str | None = None, rm_eval: str | None = None,
                      pairs: str | None = None, negative_source: str | None = None, rm_training: Sequence[str] = (),
                      assistant_model: str | None = None, python: str = sys.executable,
                      arms: Registry[Arm] = ARMS) -> list[str]:
    """`python -m cooper_openrlhf.cli.train_cooper *shared` and then the flags of `arms[arm]`:
    the reward (`--cooper.reward_source rule`, or the VerifyRM folder `rm` with its labelled held-out set `rm_eval`
    when given), and for an RM-training arm `--remote_rm_trainable`, its negatives (`negative_source`: the arm's
    own unless given), its further flags, its pairs file (`pairs`), the RM update's settings (`rm_training`) and a
    dedicated assistant model (`assistant_model`: an arm whose assistant is a frozen model needs it). Inputs an arm
    does not use are ignored; one it needs and lacks raises ValueError. arms: the table the arm is looked up in
    (the lab passes its own, which holds these and its research arms)."""
    spec = arms[arm]
    argv = [python, "-m", TRAIN_COOPER, *shared]
    if spec.reward == "rule":
        return [*argv, "--cooper.reward_source", "rule"]
    if not rm:
        raise ValueError(f"the {arm} arm is paid by a VerifyRM: give its folder (rm)")
    argv += ["--reward.model_name_or_path", rm, *(["--cooper.rm_eval_dataset", rm_eval] if rm_eval else [])]
    if not spec.trains_rm:
        return argv
    argv += ["--remote_rm_trainable", "--cooper.negative_source",
             NEGATIVE_SOURCES.check(negative_source or spec.negative_source), *spec.flags]
    if spec.pairs:
        if not pairs:
            raise ValueError(f"the {arm} arm trains its RM on pairs from a file ({spec.pairs}): give its path (pairs)")
        argv += ["--cooper.offline_pairs", pairs]
    argv += list(rm_training)
    if spec.assistant and not assistant_model:
        raise ValueError(f"the {arm} arm's assistant is the {spec.assistant.replace('_', ' ')}: give its folder "
                         "(assistant_model)")
    if assistant_model:
        argv += ["--cooper.assistant", "model", "--cooper.assistant_model_path", assistant_model]
    return argv
