"""The lab's arms: the paper's three (cluster/arms.py) and the research arms the lab adds, in one table.

An arm is where the policy's reward comes from (cluster/arms.py `Arm`). `ARMS` is the one table of the lab's arms:
the product's, then the controls and variants the lab runs beside them. `train_cooper_argv` is the product's
builder over this table: the lab (lab/runner.py) writes every arm's train_cooper command with it, so an arm the
lab shares with the cluster launcher and the GPU smoke test means the same flags in all three.
"""

from collections.abc import Sequence

from cooper_openrlhf.cluster import arms as product_arms
from cooper_openrlhf.cluster.arms import Arm
from cooper_openrlhf.runtime.registry import Registry

# The lab's names for an arm's `Arm.assistant` (None: the policy being trained; "starting_policy": the lab's warm
# start, frozen, on a dedicated engine) and `Arm.pairs` files: "offline" (pairs of the pair stage's kind), "stale"
# (Cooper's, from the starting policy) or "oracle" (the style's hedge against its exploit form,
# lab/arm_pairs.py `write_oracle_pairs`).
ASSISTANTS = (None, "starting_policy")
PAIR_FILES = ("offline", "stale", "oracle")


ARMS: Registry[Arm] = Registry("arm", {
    **dict(product_arms.ARMS.items()),
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
    # The RM guard's pilot (core/rm_health.py): `cooper` runs as shipped (the guard rolls back a version whose anchor
    # health leaves its bounds; anchored updates, the default the pilot chose); cooper_unguarded is the paper's
    # update, the same health measured and logged but every version kept and no anchoring; cooper_anchored names
    # the anchoring the pilot tried (now the default). Co-training broke RMs (right and wrong answers paid alike)
    # that nothing flagged: do the guard and the anchors prevent it, and at what cost?
    "cooper_unguarded": Arm("rm", trains_rm=True, flags=("--cooper.rm_guard", "watch", "--cooper.rm_anchor_weight",
                                                          "0")),
    "cooper_anchored": Arm("rm", trains_rm=True, flags=("--cooper.rm_anchor_weight", "1.0")),
})
for _name, _arm in ARMS.items():  # a typo in the table fails at import, not in a run hours later
    if _arm.pairs not in (None, *PAIR_FILES) or _arm.assistant not in ASSISTANTS:
        raise ValueError(f"arm {_name}: pairs {_arm.pairs!r} (one of {PAIR_FILES}), assistant {_arm.assistant!r} "
                         f"(one of {ASSISTANTS})")


def train_cooper_argv(arm: str, shared: Sequence[str], **options) -> list[str]:
    """cluster/arms.py `train_cooper_argv` over the lab's table: the same arguments, any arm of `ARMS`."""
    return product_arms.train_cooper_argv(arm, shared, arms=ARMS, **options)
