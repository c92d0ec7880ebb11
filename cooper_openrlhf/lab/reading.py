"""What a lab's curves say next to the paper's claim, in sentences a newcomer can read (the lab's last lines).

The paper (arXiv 2508.05613, Qwen2.5-1.5B-Instruct): a static RM is hacked (training reward -> ~1.0 while
accuracy collapses: 38.91 against the base's 54.93), and Cooper ends level with the rule reward (58.02 against
57.48). A lab run is read against those two claims from its seed-mean curves: the static arm is "hacked" when its
RM reward rose and its held-out accuracy fell, each by more than MOVE; Cooper "holds" when it ends within MOVE of
the rule arm's held-out accuracy. With fewer than RELIABLE_SEEDS seeds per arm it says so and points to the full
lab's published figure: one held-out evaluation has a standard error near 0.04, one seed's curve is one draw.
"""

from collections.abc import Mapping, Sequence

MOVE = 0.05  # a change worth naming: above one evaluation's noise at the lab's 128 graded samples
RELIABLE_SEEDS = 3
FULL_LAB_FIGURE = "docs/results/batch33b/main/rewards_accuracy.png"

Curve = Sequence[tuple[int, float]]


def _ends(curve: Curve) -> tuple[float, float] | None:
    return (curve[0][1], curve[-1][1]) if len(curve) >= 2 else None


def reading(rm_reward: Mapping[str, Curve], heldout: Mapping[str, Curve], seeds: Mapping[str, int]) -> list[str]:
    """Sentences on the static, Cooper and rule arms' seed-mean curves (arm -> [(step, value)]), as far as they exist."""
    lines = []
    static_rm, static_acc = _ends(rm_reward.get("static", [])), _ends(heldout.get("static", []))
    if static_rm and static_acc:
        hacked = static_rm[1] - static_rm[0] > MOVE and static_acc[0] - static_acc[1] > MOVE
        lines.append(f"Static RM: reward {static_rm[0]:.2f} -> {static_rm[1]:.2f} while held-out accuracy "
                     f"{static_acc[0]:.2f} -> {static_acc[1]:.2f}: "
                     + ("hacked, as the paper's static RM is." if hacked else
                        f"not hacked in this run (it takes a rise in reward and a fall in held-out accuracy of more "
                        f"than {MOVE} each; the paper's static RM is hacked, but a policy has to find the blind spot)."))
    cooper, rule = _ends(heldout.get("cooper", [])), _ends(heldout.get("rule", []))
    if cooper and rule:
        level = abs(cooper[1] - rule[1]) <= MOVE
        verdict = ("level with the rule reward, as in the paper" if level else
                   ("above" if cooper[1] > rule[1] else "below") + " the rule reward here (the paper has them level)")
        fell = [name for name, (first, last) in (("Cooper", cooper), ("the rule arm", rule)) if first - last > MOVE]
        if fell:  # the paper's arms gain accuracy; a small preset's policy may lose it whatever its reward
            verdict += f"; {' and '.join(fell)} lost held-out accuracy in this run, which the paper's do not"
        lines.append(f"Cooper: held-out accuracy {cooper[0]:.2f} -> {cooper[1]:.2f}, the rule-reward arm's {rule[0]:.2f} "
                     f"-> {rule[1]:.2f}: {verdict}.")
    if lines and min(seeds.get(arm, 0) for arm in ("static", "cooper", "rule") if arm in seeds) < RELIABLE_SEEDS:
        lines.append(f"One seed per arm cannot show this reliably (a held-out evaluation's standard error is near "
                     f"0.04 and one seed is one draw); the full lab over 8 seeds per arm, with a control for an RM "
                     f"that just trains longer: {FULL_LAB_FIGURE} (docs/results.md).")
    return lines
