"""The arms, and the one function that writes an arm's `train_cooper` command.

An arm is where the policy's reward comes from: the rule verifier, a frozen VerifyRM, or a VerifyRM that Cooper
trains each step (on pairs from the policy's rollouts, or from a file). `ARMS` is the one table of them;
`train_cooper_argv` turns an arm and the rest of a run's command into its argv. The lab (lab/runner.py), the cluster
launcher (cluster/stage_plans.py) and the GPU smoke test (cli/gpu_smoke.py) build every train_cooper command
with it, so an arm means the same flags wherever it runs; what differs between them (sizes, devices, folders) is
the `shared` part each passes in.
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
    pairs: an RM-training arm whose pairs come from a file instead of the policy's rollouts, and which file the
        lab writes for it: "offline" (pairs of the pair stage's kind), "stale" (Cooper's, from the starting policy)
        or "oracle" (the style's hedge against its exploit form, lab/arm_pairs.py `write_oracle_pairs`).
    assistant: who rewrites a positive into a negative: None, the policy being trained (its own vLLM engines, the
        lab's default); "starting_policy", the lab's warm start, frozen, on a dedicated engine
        (`--cooper.assistant model`).
    flags: the arm's further train_cooper flags."""

    reward: str
    trains_rm: bool = False
    negative_source: str = "assistant"
    pairs: str | None = None
    assistant: str | None = None
    flags: tuple[str, ...] = ()


ASSISTANTS = (None, "starting_policy")
PAIR_FILES = ("offline", "stale", "oracle")


_COOPER = Arm("rm", trains_rm=True)
ARMS: Registry[Arm] = Registry("arm", {
    "rule": Arm("rule"),
    "static": Arm("rm"),
    "cooper": _COOPER,
    # The policy's own proven-wrong rollouts as negatives, one picked at random per prompt: negatives in the exploit's
    # form as often as the policy writes it. (The "hardest" pick, the wrong rollout the RM pays most, would pick the
    # exploit whenever a group holds one: a stronger arm, and another question; `cooper_rollout_hardest`.)
    "cooper_rollout": Arm("rm", trains_rm=True, negative_source="rollout",
                          flags=("--cooper.rollout_negative_pick", "random")),
    "cooper_rollout_hardest": Arm("rm", trains_rm=True, negative_source="rollout",
                                  flags=("--cooper.rollout_negative_pick", "hardest")),
    # Cooper with the frozen warm start as the assistant instead of the policy being trained: the nearest this lab
    # has to the paper's separate assistant model. A policy that drifts cannot then drift its own negatives.
    "cooper_frozen_assistant": Arm("rm", trains_rm=True, assistant="starting_policy"),
    # Not the paper's: answerless rollouts may be negatives too. The paper's negatives always carry a wrong answer,
    # so a policy drifting to answerless text is never shown to the RM as wrong, and from a nearly flat starting
    # RM the RM arms, Cooper's too, could collapse to it.
    "cooper_rollout_answerless": Arm("rm", trains_rm=True, negative_source="rollout",
                                     flags=("--cooper.answerless_negatives",)),
    # The paper's arm with the official recipe's negative rule: a rewrite counts unless proved equal to the
    # positive, answerless ones included (`cooper` keeps the strict rule: a proved-different answer).
    "cooper_official": Arm("rm", trains_rm=True, flags=("--cooper.negative_validity", "official")),
    # A control: does Cooper's RM gain from pairs of the policy's current outputs, or only from training longer on
    # pairs of any kind? Cooper's RM update, step for step, on fresh pairs of the pair stage's kind from a file
    # (the lab writes one per seed, lab/prepare.py) instead of pairs from the policy's rollouts.
    "offline_pairs": Arm("rm", trains_rm=True, pairs="offline"),
    # The style lab's second control: Cooper's pairs, but made from the *starting* policy's rollouts and rewrites
    # before the run (lab/arm_pairs.py `write_stale_pairs`), fed as the offline_pairs arm is fed. Against cooper it asks
    # whether co-training gains by tracking the policy as it moves or only by covering the styles it starts with.
    "cooper_stale": Arm("rm", trains_rm=True, pairs="stale"),
    # A positive control: the RM update on pairs from a file whose negatives are the exploit itself (the style's
    # hedge stating the reference first and a slip last, with and without a trailing fragment) against the right
    # hedge. If even this RM's policy does not exploit less than static's, the lab cannot show an RM closing a
    # blind spot in its step budget, and no Cooper arm's failure to do so means anything.
    "oracle": Arm("rm", trains_rm=True, pairs="oracle"),
    # The RM guard's pilot (core/rm_health.py): `cooper` runs with the guard as shipped (a version whose anchor
    # health leaves its bounds is rolled back); cooper_unguarded measures and logs the same health but keeps every
    # version; cooper_anchored adds BCE on labelled anchor rows to every RM update, the guard on. Co-training broke
    # RMs (right and wrong answers paid alike) that nothing flagged: do the guard and the anchors prevent it, and at
    # what cost?
    "cooper_unguarded": Arm("rm", trains_rm=True, flags=("--cooper.rm_guard", "watch")),
    "cooper_anchored": Arm("rm", trains_rm=True, flags=("--cooper.rm_anchor_weight", "1.0")),
})
for _name, _arm in ARMS.items():  # a typo in the table fails at import, not in a run hours later
    if _arm.pairs not in (None, *PAIR_FILES) or _arm.assistant not in ASSISTANTS:
        raise ValueError(f"arm {_name}: pairs {_arm.pairs!r} (one of {PAIR_FILES}), assistant {_arm.assistant!r} "
                         f"(one of {ASSISTANTS})")
# The paper's three arms (arXiv 2508.05613, Table 1): the ones the cluster launcher runs (ARM=...).
PAPER_ARMS = ("cooper", "static", "rule")


def train_cooper_argv(arm: str, shared: Sequence[str], *, rm: str | None = None, rm_eval: str | None = None,
                      pairs: str | None = None, negative_source: str | None = None, rm_training: Sequence[str] = (),
                      assistant_model: str | None = None, python: str = sys.executable) -> list[str]:
    """`python -m cooper_openrlhf.cli.train_cooper *shared` and then the arm's flags:
    the reward (`--cooper.reward_source rule`, or the VerifyRM folder `rm` with its labelled held-out set `rm_eval`
    when given), and for an RM-training arm `--remote_rm_trainable`, its negatives (`negative_source`: the arm's
    own unless given), its further flags, its pairs file (`pairs`), the RM update's settings (`rm_training`) and a
    dedicated assistant model (`assistant_model`: an arm whose assistant is the starting policy needs it). Inputs
    an arm does not use are ignored; one it needs and lacks raises ValueError."""
    spec = ARMS[arm]
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
