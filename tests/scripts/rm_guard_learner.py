"""The reward service's learner (`serve.learner.Learner`, built as `cooper serve --learn` builds it) with an RM
learning rate 30x the default, with and without the RM guard. Run as a separate process by
tests/test_rm_guard_service.py (torch.distributed and DeepSpeed state never leak into pytest).

The tiny RM is first warmed up to tell a worked right answer from "I do not know." and from a bare wrong
"\\boxed{N}" (the anchors). Then each round's groups teach it the policy's shortcut: the positives are bare right
"\\boxed{N}" answers and the negatives worked wrong ones, both labelled by the verifier, so every pair is a true
one, and at 3e-4 the RM learns "bare pays" within a few rounds: the anchors' wrong answers are paid like the right
ones (an AUC towards 0.5 and below). Scenarios (argv[1], comma-separated), each from the same warmed-up engine:
  watch      the guard measures and keeps every version (the guardless control)
  rollback   the guard (lower_lr): every version published is measured here again, independently
  resume     the guard (skip): after its first rollback the state is checkpointed (`serve/checkpoint.py`) and a
             new learner loads it, as a restarted service does
  nonfinite  no guard; the learning rate is made infinite, so the update's weights are not finite
  anchored   the guard watching, updates anchored (BCE on the anchors' rows at weight 1 beside the pairwise loss;
             the rows the guard reads here, to show the loss acts, where a run keeps them apart)
  export=DIR the warmed-up RM as a VerifyRM folder DIR/best, the anchors beside it as DIR/eval_split.jsonl (where
             the trainer's guard finds them by default) and the rounds' pairs as an --cooper.offline_pairs file
             DIR/pairs.jsonl (tests/test_rm_guard_e2e.py trains on them)
Prints one JSON line: {scenario: [per round: {...}], ...}.
"""

import dataclasses
import json
import sys
import tempfile

DEFAULT_LR = 1e-5  # --rm-lr's default
LR = 30 * DEFAULT_LR
ROUNDS = 12


def right(a: int, b: int) -> str:
    return f"{a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}."


def anchors():
    from cooper_openrlhf.rm.anchors import LABELLED
    from cooper_openrlhf.rm.probes import Probe

    wrong = lambda a, b: "I do not know." if b == 2 else f"\\boxed{{{a + b + 3}}}"  # noqa: E731
    return [Probe(LABELLED, f"What is {a} + {b}?", str(a + b), right(a, b) if ok else wrong(a, b), ok)
            for a in range(20, 28) for b in (2, 5) for ok in (False, True)]


def warm_up(trainer, steps: int = 30) -> None:
    from cooper_openrlhf.algo.pairs import PairBatch
    from cooper_openrlhf.rm.pairwise_update import pairwise_update

    problems = [(a, b) for a in range(20) for b in range(1, 9)]
    for step in range(steps):
        part = problems[(step * 8) % len(problems):][:8]
        negatives = ["I do not know." if i % 2 else f"\\boxed{{{a + b + 3}}}" for i, (a, b) in enumerate(part)]
        pairs = PairBatch([f"What is {a} + {b}?" for a, b in part], [str(a + b) for a, b in part],
                          [right(a, b) for a, b in part], negatives, [True] * len(part), [0] * len(part),
                          ["rollout"] * len(part))
        pairwise_update(trainer, pairs, len(part))


def round_groups(step: int) -> list:
    """4 prompts x 4 samples: two bare right answers, two worked wrong ones (verdicts as the verifier gives them)."""
    from cooper_openrlhf.serve.groups import Group, ScoredSample
    from cooper_openrlhf.serve.protocol import Sample
    from cooper_openrlhf.verify.rule import Verdict, VerifyOutcome

    groups = []
    for k in range(4):
        a, b = (step * 7 + k * 3) % 20, 1 + (step + k) % 8
        s, question = a + b, f"What is {a} + {b}?"
        samples = [(f"\\boxed{{{s}}}", Verdict.CORRECT, s)] * 2 + [
            (f"{a} + {b} = {s + d}. The answer is \\boxed{{{s + d}}}.", Verdict.INCORRECT, s + d) for d in (1, -1)]
        scored = [ScoredSample(Sample(question, question, str(s), text), 0.0, VerifyOutcome(verdict, str(x), 0.0), 0.5)
                  for text, verdict, x in samples]
        groups.append(Group(step * 4 + k, question, 0, 0.0, 4, scored))
    return groups


def weights_sum(trainer) -> float:
    return float(sum(p.double().sum() for p in trainer.model.module.parameters()))


def weights_finite(module) -> bool:
    from cooper_openrlhf.rm.snapshot import weights_finite as finite

    return finite(module)


def run(learner, rounds: int = ROUNDS, first: int = 0) -> list[dict]:
    out = []
    for step in range(first, first + rounds):
        before = weights_sum(learner.trainer)
        updated, metrics = learner.learn(round_groups(step), step)
        health = learner.health() if learner.anchors else None  # the engine's RM now: what `updated` publishes
        out.append({"updated": updated, **({"auc": health.auc, "right_pay": health.right_pay,
                                            "wrong_pay": health.wrong_pay} if health else {}),
                    "weights_unchanged": weights_sum(learner.trainer) == before,
                    "weights_finite": weights_finite(learner.trainer.model.module),
                    **{k.rsplit("/", 1)[-1]: v for k, v in metrics.items() if k.startswith("cooper/rm_health/")
                       and "attack" not in k},
                    **{k.split("/")[-1]: v for k, v in metrics.items() if k.startswith("cooper/rm_anchor_")}})
    return out


def export(trainer, folder: str) -> str:
    """The warmed-up RM, its anchors and the rounds' pairs, for a training run (module docstring)."""
    import os

    from cooper_openrlhf.rm.export import export_rm

    path = export_rm(trainer.model, trainer.tokenizer, os.path.join(folder, "best"),
                     template_version=trainer.template_version, max_length=trainer.max_length)
    with open(os.path.join(folder, "eval_split.jsonl"), "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps({"question": a.question, "reference": a.reference, "completion": a.completion,
                                      "label": int(a.correct)}) + "\n" for a in anchors())
    with open(os.path.join(folder, "pairs.jsonl"), "w", encoding="utf-8") as handle:
        for step in range(ROUNDS * 2):
            for group in round_groups(step):
                right_, wrong_ = group.scored[0].sample, group.scored[2].sample
                handle.write(json.dumps({"step": step, "question": right_.question, "reference": right_.reference,
                                         "positive": right_.completion, "negative": wrong_.completion}) + "\n")
    return str(path)


def main(scenarios: list[str]) -> None:
    from cooper_openrlhf.cli.serve import build_parser
    from cooper_openrlhf.core import GuardConfig, RMGuard
    from cooper_openrlhf.models import model_path
    from cooper_openrlhf.rm.snapshot import EngineSnapshot, scale_lr
    from cooper_openrlhf.serve.build import build_learner
    from cooper_openrlhf.serve.checkpoint import ServiceCheckpoint
    from cooper_openrlhf.serve.learner import Learner

    state_dir = tempfile.mkdtemp(prefix="rm_guard_")
    args = build_parser().parse_args(["--rm", str(model_path("tiny-qwen2-rm")), "--learn", "--state-dir", state_dir,
                                      "--groups-per-update", "4", "--group-size", "4", "--rm-lr", str(LR),
                                      "--rm-warmup-ratio", "0"])
    built, _ = build_learner(args)
    trainer = built.trainer
    warm_up(trainer)
    warm = EngineSnapshot.take(trainer)
    results = {}
    try:
        for scenario in scenarios:
            warm.restore()
            if scenario == "watch":
                learner = Learner(trainer, built.pair_builder, built.config, RMGuard(GuardConfig(mode="watch")),
                                  anchors())
                results[scenario] = run(learner)
            elif scenario == "rollback":
                learner = Learner(trainer, built.pair_builder, built.config, RMGuard(GuardConfig()), anchors())
                results[scenario] = run(learner)
            elif scenario == "resume":
                config = GuardConfig(response="skip", skip_steps=3)
                learner = Learner(trainer, built.pair_builder, built.config, RMGuard(config), anchors())
                rounds = []
                while not rounds or rounds[-1]["rollbacks"] < 1:
                    rounds += run(learner, 1, len(rounds))
                checkpoint = ServiceCheckpoint(trainer, state_dir)
                checkpoint.save({"version": len(rounds)})
                warm.restore()  # the restarted process starts from the RM it was launched with
                restarted = Learner(trainer, built.pair_builder, built.config, RMGuard(config), anchors())
                checkpoint.load()
                results[scenario] = {"before": rounds, "after": run(restarted, 4, len(rounds))}
            elif scenario == "anchored":
                config = dataclasses.replace(built.config, anchor_weight=1.0, anchor_batch=8)
                learner = Learner(trainer, built.pair_builder, config, RMGuard(GuardConfig(mode="watch")), anchors(),
                                  anchors())
                results[scenario] = run(learner)
            elif scenario.startswith("export="):
                results["export"] = export(trainer, scenario.split("=", 1)[1])
            elif scenario == "nonfinite":
                learner = Learner(trainer, built.pair_builder, built.config)  # no guard: finiteness alone
                scale_lr(trainer, float("inf"))
                results[scenario] = run(learner, 1)
    finally:
        built.pair_builder.close()
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1].split(","))
