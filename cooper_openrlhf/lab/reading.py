"""What a lab's curves show, in sentences a newcomer can read (the lab's last lines), and the committed result.

The paper (arXiv 2508.05613, Qwen2.5-1.5B-Instruct): a static RM is hacked (training reward -> ~1.0 while
accuracy collapses: 38.91 against the base's 54.93), and Cooper ends level with the rule reward (58.02 against
57.48). A lab's seed-mean curves are described in those terms -- the static arm shows the signature of a hacked
RM when its RM reward rose and its held-out accuracy fell, each by more than MOVE; Cooper ends level with the rule
arm when within MOVE of its held-out accuracy -- but never called the paper's finding: with fewer than
RELIABLE_SEEDS seeds per arm the lines say so (one held-out evaluation has a standard error near 0.04, one seed's
curve is one draw), and the last line is always the committed result (COMMITTED_RESULT: the pre-registered
batch's test, docs/results.md), which a few seeds on a laptop neither confirm nor overturn. A test holds
COMMITTED_RESULT to the committed verdict file.

The held-out problems share no trivially equivalent twin with the prompts the tiny policy was fine-tuned on, and
a 2-layer model mostly memorises its sums: its held-out accuracy can start near 0, where no fall can show. The
rule-verified accuracy of the arms' own training rollouts -- the true reward of what the policy writes, graded on
far more samples -- is read beside it, and what each RM pays the rollouts the verifier rejects (the paper's
mechanism), each as the means of its first and last VERIFIED_WINDOW steps against the same MOVE.
"""

from collections.abc import Mapping, Sequence

MOVE = 0.05  # a change worth naming: above one evaluation's noise at the lab's 128 graded samples
RELIABLE_SEEDS = 3
FULL_LAB_FIGURE = "docs/results/batch33b/main/rewards_accuracy.png"
# The committed verdict of the lab's pre-registered batch (COMMITTED_RESULT["verdict"], written by `cli.batch PLAN
# --verdict`): what the lab's last line states, whatever one run shows. A new batch's verdict replaces it.
COMMITTED_RESULT = {"batch": "33b", "verdict": "docs/results/batch33b/verdict.json", "seeds": 8,
                    "primary": ("cooper - offline_pairs", -0.014, (-0.060, 0.028), 0.570),
                    "static_rule": ("static - rule", -0.050, (-0.089, -0.014), 0.055)}
LOW_START = 0.10  # held-out accuracy below this at the first evaluation leaves a fall almost no room to show
VERIFIED_WINDOW = 10  # steps averaged at each end of a training-rollout curve (a step grades a few dozen rollouts)

Curve = Sequence[tuple[int, float]]


def _ends(curve: Curve) -> tuple[float, float] | None:
    return (curve[0][1], curve[-1][1]) if len(curve) >= 2 else None


def _window_ends(curve: Curve) -> tuple[float, float] | None:
    """Means of the first and the last VERIFIED_WINDOW points (of half the curve each when it is shorter)."""
    width = min(VERIFIED_WINDOW, len(curve) // 2)
    if width == 0:
        return None
    values = [value for _, value in curve]
    return sum(values[:width]) / width, sum(values[-width:]) / width


def verified_reading(rm_reward: Mapping[str, Curve], verified: Mapping[str, Curve]) -> list[str]:
    """A sentence on the arms' training rollouts: what the rule verifier grades of what each policy writes."""
    ends = {arm: _window_ends(verified.get(arm, [])) for arm in ("rule", "static", "cooper")}
    ends = {arm: pair for arm, pair in ends.items() if pair}
    if "static" not in ends or "rule" not in ends:
        return []
    names = {"rule": "rule", "static": "static", "cooper": "Cooper"}
    trend = ", ".join(f"{names[arm]} {first:.2f} -> {last:.2f}" for arm, (first, last) in ends.items())
    static_rm = _window_ends(rm_reward.get("static", []))
    static_first, static_last = ends["static"]
    fell = static_first - static_last > MOVE
    rose = static_rm is not None and static_rm[1] - static_rm[0] > MOVE
    verdict = ("the static RM's policy writes fewer verified answers while its RM reward rises: the signature of a "
               "hacked RM" if fell and rose else
               "the static RM's policy writes fewer verified answers, though its RM reward did not rise" if fell else
               "the static RM's policy ends below the rule arm's" if ends["rule"][1] - static_last > MOVE else
               "the static RM's policy keeps its verified accuracy")
    if "cooper" in ends:
        cooper_first, cooper_last = ends["cooper"]
        verdict += ("; Cooper's ends level with the rule arm's" if abs(cooper_last - ends["rule"][1]) <= MOVE else
                    "; Cooper's ends " + ("above" if cooper_last > ends["rule"][1] else "below") + " the rule arm's")
        if cooper_first - cooper_last > MOVE:
            verdict += f", though it fell by {cooper_first - cooper_last:.2f}"
    return [f"On the training prompts (the rule-verified accuracy of each arm's rollouts, means of the first and last "
            f"{VERIFIED_WINDOW} steps): {trend}: {verdict}."]


def wrong_pay_reading(wrong_reward: Mapping[str, Curve]) -> list[str]:
    """A sentence on what the static and Cooper RMs pay the rollouts the verifier rejects: the mechanism the paper
    names (a frozen RM keeps paying what the policy learns to write; a co-trained one is corrected)."""
    static, cooper = _window_ends(wrong_reward.get("static", [])), _window_ends(wrong_reward.get("cooper", []))
    if not static or not cooper:
        return []
    verdict = ("the static RM pays the policy's wrong answers more as it goes on" if static[1] - static[0] > MOVE else
               "the static RM's pay for wrong answers does not rise")
    verdict += ("; Cooper's RM, trained as it goes, ends paying them less than the static RM"
                if static[1] - cooper[1] > MOVE else
                "; Cooper's RM ends paying them more than the static RM" if cooper[1] - static[1] > MOVE else
                "; Cooper's RM ends paying them about as much")
    return [f"What each RM pays the rollouts the verifier marks wrong (first and last {VERIFIED_WINDOW} steps): static "
            f"{static[0]:.2f} -> {static[1]:.2f}, Cooper {cooper[0]:.2f} -> {cooper[1]:.2f}: {verdict}."]


def reading(rm_reward: Mapping[str, Curve], heldout: Mapping[str, Curve], seeds: Mapping[str, int],
            verified: Mapping[str, Curve] | None = None, wrong_reward: Mapping[str, Curve] | None = None) -> list[str]:
    """Sentences on the static, Cooper and rule arms' seed-mean curves (arm -> [(step, value)]), as far as they exist;
    `verified` (the arms' training-rollout accuracy) and `wrong_reward` (what each RM pays the verified-wrong ones)
    add a sentence each."""
    lines = []
    static_rm, static_acc = _ends(rm_reward.get("static", [])), _ends(heldout.get("static", []))
    if static_rm and static_acc:
        hacked = static_rm[1] - static_rm[0] > MOVE and static_acc[0] - static_acc[1] > MOVE
        lines.append(f"Static RM: reward {static_rm[0]:.2f} -> {static_rm[1]:.2f} while held-out accuracy "
                     f"{static_acc[0]:.2f} -> {static_acc[1]:.2f}: "
                     + ("the signature of a hacked RM in this run (reward up, held-out accuracy down, by more than "
                        f"{MOVE} each)." if hacked else
                        f"not hacked in this run (it takes a rise in reward and a fall in held-out accuracy of more "
                        f"than {MOVE} each; a policy has to find the blind spot)."))
    cooper, rule = _ends(heldout.get("cooper", [])), _ends(heldout.get("rule", []))
    if cooper and rule:
        level = abs(cooper[1] - rule[1]) <= MOVE
        verdict = ("level with the rule reward in this run" if level else
                   ("above" if cooper[1] > rule[1] else "below") + " the rule reward in this run")
        fell = [name for name, (first, last) in (("Cooper", cooper), ("the rule arm", rule)) if first - last > MOVE]
        if fell:  # the paper's arms gain accuracy; a small preset's policy may lose it whatever its reward
            verdict += f"; {' and '.join(fell)} lost held-out accuracy in this run"
        lines.append(f"Cooper: held-out accuracy {cooper[0]:.2f} -> {cooper[1]:.2f}, the rule-reward arm's {rule[0]:.2f} "
                     f"-> {rule[1]:.2f}: {verdict}.")
    starts = [curve[0][1] for arm, curve in heldout.items() if arm in ("static", "cooper", "rule") and curve]
    if lines and starts and max(starts) < LOW_START:
        lines.append(f"Held-out accuracy started at {max(starts):.2f} at most: the warm-started policy barely answers "
                     f"problems it never saw, so a fall has almost no room to show here.")
    lines += verified_reading(rm_reward, verified or {}) + wrong_pay_reading(wrong_reward or {})
    fewest = min((seeds[arm] for arm in ("static", "cooper", "rule") if arm in seeds), default=0)
    if lines and fewest < RELIABLE_SEEDS:
        lines.append(f"{'One seed' if fewest == 1 else f'{fewest} seeds'} per arm cannot show this reliably (a held-out "
                     f"evaluation's standard error is near 0.04 and one seed is one draw): none of the above is the "
                     f"paper's finding or the lab's; the full lab over 8 seeds per arm, with a control for an RM that "
                     f"just trains longer: {FULL_LAB_FIGURE} (docs/results.md).")
    return lines


def committed_result() -> list[str]:
    """The lab's committed result in words (COMMITTED_RESULT): the lab's last line, after any run's reading."""
    batch, seeds = COMMITTED_RESULT["batch"], COMMITTED_RESULT["seeds"]
    _, mean, (low, high), p = COMMITTED_RESULT["primary"]
    _, s_mean, (s_low, s_high), s_p = COMMITTED_RESULT["static_rule"]
    return [f"The committed result (batch {batch}, {seeds} seeds per arm, pre-registered; docs/results.md): Cooper did "
            f"not beat the control, an RM updated as Cooper's on fresh offline pairs that never saw the policy "
            f"(Cooper - control {mean:+.3f}, 95% CI [{low:+.3f}, {high:+.3f}], p {p:.3f}: within noise), and the "
            f"frozen RM's policy ended below the rule arm's by less than the plan's test can tell from noise "
            f"(static - rule {s_mean:+.3f} [{s_low:+.3f}, {s_high:+.3f}], p {s_p:.3f})."]


def read_runs(runs) -> list[str]:
    """`reading` of finished runs (report.runs.RunData): each arm's seed-mean curves, failed runs left out."""
    from cooper_openrlhf.algo.metric_keys import ACCURACY, RM_REWARD, WRONG_REWARD
    from cooper_openrlhf.report.aggregate import band, heldout_series

    by_arm: dict[str, list] = {}
    for run in runs:
        if not run.failed:
            by_arm.setdefault(run.arm, []).append(run.scalars)

    def curves(series_of) -> dict[str, list[tuple[int, float]]]:
        means = {arm: band([c for c in map(series_of, scalars) if c]) for arm, scalars in by_arm.items()}
        return {arm: list(zip(mean.steps, mean.mean)) for arm, mean in means.items()}

    return reading(curves(lambda s: s.get(RM_REWARD, [])), curves(heldout_series),
                   {arm: len(scalars) for arm, scalars in by_arm.items()},
                   verified=curves(lambda s: s.get(ACCURACY, [])),
                   wrong_reward=curves(lambda s: s.get(WRONG_REWARD, []))) + committed_result()
