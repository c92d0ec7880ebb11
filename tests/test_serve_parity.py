"""Learning parity: the reward service learns what the trainer learns from the same rollouts (`cli/serve_parity.py`).

Fast: the comparisons of `cli/serve_parity.py` on hand-made weights and pairs. Slow: a 3-step `train_cooper` run on CPU
(rollout negatives, picked at random with the run's seed; a linear LR schedule, so the schedule's mapping is tested
too; fp32), then its logged rollouts replayed through the service built as `cli.serve --learn` builds it: same
rewards, RM versions, verdicts, pairs, schedule and RM weights at every step; and a replay with a schedule the run did
not use is caught.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cooper_openrlhf.algo.pairs import PairBatch
from cooper_openrlhf.cli.serve_parity import (UPDATE_RTOL, WEIGHT_ATOL, StepParity, pair_differences,
                                          weight_difference)

STEPS = 3
ROUND = 4  # _launch's --rollout.batch_size (prompts per step) and --rollout.n_samples_per_prompt


# ------------------------------------------------------------------------------------------------ fast
def test_weight_difference_is_measured_against_the_trainers_update():
    before = {"w": torch.zeros(2, 2), "b": torch.zeros(2)}
    trainer = {"w": torch.tensor([[3.0, 0.0], [0.0, 0.0]]), "b": torch.tensor([0.0, 4.0])}  # update norm 5
    service = {"w": trainer["w"] + torch.tensor([[0.0, 0.01], [0.0, 0.0]]), "b": trainer["b"].clone()}
    max_abs, relative, update = weight_difference(service, trainer, before)
    assert update == pytest.approx(5.0)
    assert max_abs == pytest.approx(0.01)
    assert relative == pytest.approx(0.01 / 5.0)
    with pytest.raises(ValueError, match="different weights"):
        weight_difference({"w": service["w"]}, trainer, before)


def test_pair_differences_name_the_slot_and_the_field():
    built = PairBatch(["q1", "q2"], ["1", "2"], ["The answer is 1.", ""], ["The answer is 3.", ""], [True, False],
                      [0, -1], ["rollout", ""])
    logged = [{"question": "q1", "positive": "The answer is 1.", "negative": "The answer is 3.", "valid": True,
               "negative_source": "rollout"},
              {"question": "q2", "positive": "", "negative": "", "valid": False, "negative_source": ""}]
    assert pair_differences(built, logged) == []
    logged[0] = {**logged[0], "negative": "The answer is 4."}
    (line,) = pair_differences(built, logged)
    assert line.startswith("prompt 0: negative")
    assert pair_differences(built, logged[:1]) == ["2 pair slots in the service, 1 in the trainer"]


def test_a_step_within_the_tolerances_has_no_problems_and_each_breach_is_named():
    same = StepParity(2, 16, 0.0, 0, [], 0.0, 0.0, 0.4, 0.0, [1], 1, {"lr": (1e-3, 1e-3)})
    assert same.problems() == []
    # step 3 after a step without a valid pair: the trainer's RM and the service's are both still at version 1
    assert StepParity(3, 16, 0.0, 0, [], 0.0, 0.0, 0.4, 0.0, [1], 1, {"lr": (1e-3, 1e-3)}).problems() == []
    breaches = StepParity(2, 16, 0.0, 1, [], 2 * WEIGHT_ATOL, 2 * UPDATE_RTOL, 0.4, 2 * WEIGHT_ATOL, [0, 1],
                          1, {"lr": (1e-3, 5e-4)})
    text = "\n".join(breaches.problems())
    for part in ("verdicts differ", "weights differ", "of the step's update", "RM versions [0, 1]", "lr is 0.001",
                 "fp32 master weights differ"):
        assert part in text


@pytest.mark.parametrize("fallback", ["none", "last_number"])
def test_the_services_verifier_finds_answers_as_the_trainers_does(fallback):
    """A completion whose only answer is an unanchored last number: the trainer's pair actor judges it with
    --cooper.answer_fallback (default none: no answer, so neither a positive nor a rollout negative); the service
    built with the same value, and by default, judges it the same (the verifier's own default is last_number)."""
    import argparse

    from cooper_openrlhf.cli.cooper_args import add_cooper_args
    from cooper_openrlhf.cli.serve import build_parser
    from cooper_openrlhf.serve.build import verifier_config
    from cooper_openrlhf.verify.rule import RuleVerifierConfig, Verdict, verify_one

    trainer_default = getattr(add_cooper_args(argparse.ArgumentParser()).parse_args([]), "cooper.answer_fallback")
    serve_default = build_parser().parse_args(["--rm", "RM", "--no-chat-template"])
    assert verifier_config(serve_default) == RuleVerifierConfig(answer_fallback=trainer_default)
    service = verifier_config(build_parser().parse_args(["--rm", "RM", "--no-chat-template",
                                                         "--answer-fallback", fallback]))
    trainer = RuleVerifierConfig(answer_fallback=fallback)  # ray/pair_actor.py's
    for completion, reference in (("So I get 27", "27"), ("So I get 28", "27"), ("The answer is 27.", "27")):
        mine, theirs = verify_one(reference, completion, service), verify_one(reference, completion, trainer)
        assert (mine.verdict, mine.extracted) == (theirs.verdict, theirs.extracted)
    expected = Verdict.NO_ANSWER if fallback == "none" else Verdict.CORRECT
    assert verify_one("27", "So I get 27", service).verdict == expected


# ------------------------------------------------------------------------------------------------ slow
@pytest.fixture(scope="module")
def run(tmp_path_factory, answering_policy, model_dir) -> Path:
    """A 3-step train_cooper run with rollout negatives (tests/test_cooper_e2e.py's argv), fp32 on CPU."""
    from test_cooper_e2e import _launch

    root = tmp_path_factory.mktemp("serve_parity")
    policy, rows = answering_policy
    (root / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    _launch(root / "run", policy, model_dir("tiny-qwen2-rm"), "--cooper.negative_source", "rollout",
            "--cooper.rollout_negative_pick", "random", "--cooper.rm_lr_scheduler", "linear",
            "--ds.param_dtype", "fp32")
    return root / "run"


def _replay(run: Path, model_dir, *flags: str) -> tuple[int, list[dict], str]:
    """(exit code, per-step report, log) of `python -m cooper_openrlhf.cli.serve_parity` on the run, with the service
    flags that say what _launch's run did (docs/serve.md), then `flags` (argparse: the last one wins).

    One thread, as the run's RM actor (_launch's OMP_NUM_THREADS=1): the summation order of every matmul is then
    the trainer's."""
    report = run / f"parity_{len(list(run.glob('parity_*.json')))}.json"
    argv = [sys.executable, "-m", "cooper_openrlhf.cli.serve_parity", "--samples", str(run / "samples"),
            "--rm-checkpoints", str(run / "ckpt" / "_rm"), "--report", str(report),
            "--rm", model_dir("tiny-qwen2-rm"), "--dtype", "fp32", "--group-size", str(ROUND),
            "--groups-per-update", str(ROUND), "--seed", "0", "--rm-lr", "1e-3", "--rm-warmup-ratio", "0",
            "--rm-lr-scheduler", "linear", "--rm-schedule-rounds", str(STEPS), "--rm-max-length", "256",
            "--rm-micro-batch-size", "4", "--rollout-negative-pick", "random", "--checkpoint-every", "0", *flags]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    log = result.stdout + result.stderr
    assert report.exists(), log[-6000:]
    return result.returncode, json.loads(report.read_text()), log


@pytest.mark.slow
def test_the_service_learns_from_the_runs_rollouts_what_the_trainer_learned(run, model_dir):
    code, steps, log = _replay(run, model_dir)
    assert code == 0, log[-6000:]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    pairs = [json.loads(line) for line in (run / "samples" / "pairs.jsonl").read_text().splitlines()]
    assert any(p["valid"] for p in pairs)  # the RM learned something to compare
    for step in steps:
        assert step["samples"] == ROUND * ROUND
        assert step["pair_mismatches"] == [] and step["verdict_mismatches"] == 0
        # a step's version: one per earlier step whose update changed the trainer's RM (a step without a valid pair
        # publishes none)
        assert step["versions"] == [sum(s["update_norm"] > 0 for s in steps if s["step"] < step["step"])]
        assert step["weight_max_abs"] <= WEIGHT_ATOL and step["master_max_abs"] <= WEIGHT_ATOL
        if step["update_norm"] > 0:
            assert step["weight_rel_update"] <= UPDATE_RTOL
        assert step["schedule"]["optimizer_steps"][0] == pytest.approx(step["schedule"]["optimizer_steps"][1])
    assert sum(step["update_norm"] > 0 for step in steps) >= 1


@pytest.mark.slow
def test_a_replay_with_another_schedule_than_the_runs_is_caught(run, model_dir):
    """The service's default schedule (constant) against the run's linear one: the learning rates part after the
    first update, and the weights after the second."""
    code, steps, log = _replay(run, model_dir, "--rm-lr-scheduler", "constant_with_warmup")
    assert code == 1, log[-6000:]
    updated = [s for s in steps if s["schedule"]["optimizer_steps"][1] >= 1]
    assert updated, "the run never updated its RM"
    first = updated[0]
    assert first["schedule"]["lr"][0] != pytest.approx(first["schedule"]["lr"][1])
    later = [s for s in steps if s["schedule"]["optimizer_steps"][1] >= 2 and s["update_norm"] > 0]
    if later:
        assert later[0]["weight_max_abs"] > WEIGHT_ATOL
