"""End to end: the lab at its smallest size (`cli.lab --preset tiny`: the warm-started tiny policy, a tiny VerifyRM
trained by `verifyrm train`, the static-RM and rule arms, 2 GRPO steps of 4 prompts x 4 rollouts each, a local
CPU Ray cluster with one CPU vLLM engine, DeepSpeed ZeRO-2 in the CPU's fast dtype).

The lab is run into one folder three times: first with `--arms rule` (which prepares the policy and no RM: no arm
is paid by one), then `--prepare-only` with the preset's arms (the RM), then with the preset's arms, which must skip
the finished rule run (resume) and run the static one. What is checked is what the runs leave on disk:
  starting RM the recipe's BCE RM, then the pair stage from 2 seeds; the probe's blindest is the starting RM
  static RM   every logged reward is sigmoid(logit) of the lab's starting RM scoring that rollout directly;
              the RM is never trained, checkpointed or exported, and its files are unchanged
  rule        every logged reward is the rollout's verified flag (1.0 / 0.0)
  the report  its table's numbers equal the tensorboard scalars, read here independently
"""

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cooper_openrlhf.runtime.dtype import torch_dtype

pytestmark = pytest.mark.slow

RM_MAX_LENGTH = 128  # the tiny preset's


def _lab(out: Path, *extra: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.lab", "--preset", "tiny", "--out", str(out), *extra],
                            capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    return result


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("lab_e2e")
    first = _lab(out, "--arms", "rule")
    rule_info = json.loads((out / "runs" / "rule_seed0" / "run_info.json").read_text())
    assert not (out / "verifyrm").exists() and "starting RM: none" in first.stdout  # a rule lab trains no RM
    prepared = _lab(out, "--prepare-only")
    chosen = json.loads((out / "verifyrm" / "pairs" / "chosen.json").read_text())
    rm = out / "verifyrm" / "pairs" / f"seed{chosen['seed']}"
    rm_before = _digest(rm)
    second = _lab(out)
    return {"out": out, "first": first, "prepared": prepared, "second": second, "rule_info": rule_info, "rm": rm, "rm_before": rm_before,
            "chosen": chosen, "static": out / "runs" / "static_seed0", "rule": out / "runs" / "rule_seed0"}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _scalars(run: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (log_dir,) = [p for p in (run / "tensorboard").iterdir() if p.is_dir()]
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


def test_the_captured_output_has_a_line_per_step_of_each_arm_and_of_each_preparation_stage(lab):
    """What a person watching the lab sees (lab/progress.py): each arm's line at every step with its reward, a
    finished run's line with how it ended, a run done earlier shown as such, and the preparation's stages."""
    def screen_lines(text: str) -> list[str]:  # what a terminal showed, one entry per redraw
        return [line.strip() for line in re.split(r"[\r\n]", re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "\n", text))
                if line.strip()]

    first, prepared, second = (screen_lines(lab[k].stderr) for k in ("first", "prepared", "second"))
    for lines, arm in ((first, "rule"), (second, "static")):  # each arm in the invocation that ran it
        for step in (1, 2):
            assert any(re.match(rf"{arm} seed 0: step {step}/2 .*\[\d\d:\d\d<\d\d:\d\d\], reward \d\.\d\d", line)
                       for line in lines), f"no line for {arm}'s step {step}:\n" + "\n".join(lines[-40:])
        assert any(re.match(rf"{arm} seed 0: step 2/2 .*, done in \d+ s$", line) for line in lines)
    assert any(re.match(r"rule seed 0: step 2/2 .*done earlier$", line) for line in second)
    assert any(line.startswith("preparation: warm start: ") for line in first)
    assert any(re.match(r"preparation: starting RM, BCE stage: step \d+/\d+ ", line) for line in prepared)
    assert any(line.startswith("preparation: starting RM, pair-stage candidates: 100%") for line in prepared)


def test_a_second_lab_invocation_keeps_the_finished_run_and_runs_the_rest(lab):
    assert json.loads((lab["rule"] / "run_info.json").read_text()) == lab["rule_info"]  # not redone
    assert "rule seed 0: done earlier, skipped" in lab["second"].stderr
    record = json.loads((lab["out"] / "lab.json").read_text())
    assert [(r["arm"], r["status"]) for r in record["runs"]] == [("static", "done"), ("rule", "done")]
    assert record["setup"]["policy"]["policy"] == "warm-start" and record["preset"] == "tiny"
    assert "lab tiny: 2/2 runs done" in lab["second"].stdout
    # the record names the code it ran (tests run from a checkout) and every run's time, the first invocation's too
    assert re.fullmatch(r"[0-9a-f]{40}(\+uncommitted)?", record["commit"])
    assert record["run_seconds"] == pytest.approx(sum(r["seconds"] for r in record["runs"]), abs=0.2)


def test_the_lab_records_and_prints_what_a_policy_maximising_its_starting_rm_would_write(lab):
    probe = json.loads((lab["out"] / "lab.json").read_text())["setup"]["rm_probe"]
    assert probe == json.loads((lab["out"] / "verifyrm" / "probe.json").read_text())
    assert probe["sentence"] == "The answer is {answer}." and probe["prompts"] > 0
    assert 0.0 <= probe["truth_reward"] <= probe["best_reward"] <= 1.0
    assert f"starting RM: {probe['verdict']}" in lab["second"].stdout


def test_the_starting_rm_is_the_pair_stage_candidate_that_pays_the_policy_most_for_not_answering(lab):
    from cooper_openrlhf.lab.pair_stage import climb_on_offer

    pairs, chosen = lab["out"] / "verifyrm" / "pairs", lab["chosen"]
    candidates = [json.loads((pairs / f"seed{k}.json").read_text()) for k in range(2)]  # the tiny preset's 2
    climbs = [climb_on_offer(c["probe"], chosen["policy_accuracy"]) for c in candidates]
    assert chosen["seed"] == climbs.index(max(climbs))
    assert [c["climb"] for c in chosen["candidates"]] == [round(x, 4) for x in climbs]
    assert all(c["last_step"]["valid"] == 4 for c in candidates)  # prompts_per_step pairs per step
    warm_start = json.loads((lab["out"] / "policy" / "warm_start.json").read_text())
    assert chosen["policy_accuracy"] == warm_start["train_accuracy"]
    assert chosen["bce_rm"] == str(lab["out"] / "verifyrm" / "best")
    assert json.loads((lab["out"] / "lab.json").read_text())["setup"]["rm_probe"]["rm"] == str(lab["rm"])
    assert f"chosen by the pair stage: seed {chosen['seed']} of 2" in lab["second"].stdout


def test_static_rm_rewards_are_the_frozen_rms_scores_and_the_rm_is_never_trained_or_saved(lab):
    from cooper_openrlhf.rm.model import load_rm, render_and_encode, rm_logits

    run, rm = lab["static"], lab["rm"]
    rollouts = _jsonl(run / "samples" / "rollouts.jsonl")
    assert sorted({r["step"] for r in rollouts}) == [1, 2] and len(rollouts) == 32
    model, tokenizer, version = load_rm(str(rm), dtype=torch_dtype("auto"))  # the run's dtype
    batch = render_and_encode(tokenizer, [r["question"] for r in rollouts], [r["reference"] for r in rollouts],
                              [r["completion"] for r in rollouts], RM_MAX_LENGTH, version)
    with torch.no_grad():
        expected = torch.sigmoid(rm_logits(model.eval(), batch).float())
    # Both steps, including step 2 after a policy update: the RM that scored them is the starting one.
    torch.testing.assert_close(torch.tensor([r["reward"] for r in rollouts]), expected, atol=2e-3, rtol=0)
    assert len({round(r["reward"], 4) for r in rollouts}) > 1  # real scores, not a constant

    scalars = _scalars(run)
    for step in (1, 2):
        rewards = [r["reward"] for r in rollouts if r["step"] == step]
        assert scalars["train/cooper/rm_reward_mean"][step] == pytest.approx(sum(rewards) / 16, abs=1e-5)
    assert "train/cooper/rm_loss" not in scalars and "train/cooper/rm_updated" not in scalars
    assert "train/cooper/rm_eval_accuracy" in scalars  # the RM's accuracy on the labelled held-out set
    assert not (run / "samples" / "pairs.jsonl").exists()  # no pairs are built for a frozen RM
    assert sorted(p.name for p in (run / "ckpt").iterdir()) == ["_actor"]  # policy checkpoints only
    assert not list(run.rglob("*_rm_hf")) and not (run / "final" / "rm").exists()
    assert _digest(rm) == lab["rm_before"]


def test_rule_arm_rewards_are_the_verified_flags_and_no_rm_metrics_exist(lab):
    run = lab["rule"]
    rollouts = _jsonl(run / "samples" / "rollouts.jsonl")
    assert sorted({r["step"] for r in rollouts}) == [1, 2] and len(rollouts) == 32
    assert [r["reward"] for r in rollouts] == [1.0 if r["verified"] else 0.0 for r in rollouts]
    assert {True, False} == {r["verified"] for r in rollouts}  # the warm-started policy is right and wrong
    scalars = _scalars(run)
    for step in (1, 2):
        verified = [r["verified"] for r in rollouts if r["step"] == step]
        assert scalars["train/cooper/verified_accuracy"][step] == pytest.approx(sum(verified) / 16, abs=1e-6)
        assert scalars["train/rollout/reward_mean"][step] == pytest.approx(sum(verified) / 16, abs=1e-6)
    assert not any(tag.startswith("train/cooper/rm_") or tag == "train/cooper/reward_hacking_gap" for tag in scalars)


def test_every_arm_of_a_seed_trains_on_the_same_prompts_at_each_step(lab):
    # The arms of one seed are a paired comparison: only the reward path differs, not which problems come when
    # (the two runs are separate lab invocations, so separate processes).
    def questions_per_step(run: Path) -> dict[int, list[str]]:
        rows = _jsonl(run / "samples" / "rollouts.jsonl")
        return {step: sorted(r["question"] for r in rows if r["step"] == step) for step in (1, 2)}

    assert questions_per_step(lab["static"]) == questions_per_step(lab["rule"])


def _final(heldout: dict[int, float]) -> float:
    """A run's final held-out accuracy as the report defines it: the mean of its last 3 evaluations."""
    last = [heldout[step] for step in sorted(heldout)[-3:]]
    return sum(last) / len(last)


def test_the_labs_report_gives_the_tensorboard_numbers(lab):
    out = lab["out"] / "report"
    for name in ("rewards_accuracy.png", "rm_pair_accuracy.png", "hacking_gap.png", "step_time.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    text = (out / "report.md").read_text()
    summary = {a["arm"]: a for a in json.loads((out / "summary.json").read_text())["arms"]}
    for arm in ("static", "rule"):
        heldout = _scalars(lab[arm])["eval/accuracy"]  # evaluated at steps 1 and 2
        assert sorted(heldout) == [1, 2]
        final, best = _final(heldout), max(heldout.values())
        assert f"| {arm} | held-out accuracy | {final:.4f} (n=1) | - | {best:.4f} (n=1) |" in text  # no CI of one seed
        assert summary[arm]["final_values"] == pytest.approx([final], abs=1e-7)
        assert summary[arm]["best_values"] == pytest.approx([best], abs=1e-7)
        first, last = heldout[1], heldout[2]
        assert f"held-out accuracy {first:.2f} -> {last:.2f}" in lab["second"].stdout  # the per-arm summary line
    static = _scalars(lab["static"])
    gap, heldout_gap = static["train/cooper/reward_hacking_gap"][2], static["eval/reward_hacking_gap"][2]
    assert f"| static | 0 | 2 (last 2) | {gap:+.4f} / {heldout_gap:+.4f} |" in text
    assert heldout_gap == pytest.approx(static["eval/rm_reward"][2] - static["eval/accuracy"][2], abs=1e-6)
    assert "| rule | 0 | 2 (last 2) | - |" in text
    assert "| static | 0 | 2 | 32 |" in text and "| rule | 0 | 2 | 32 |" in text  # rollout logs of both runs


def test_the_blindspot_sweep_puts_each_arm_at_its_starting_rms_climb_with_the_runs_final_accuracy(lab, tmp_path):
    from cooper_openrlhf.lab.pair_stage import climb_on_offer

    out = tmp_path / "sweep"
    result = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.blindspot", str(lab["out"]), "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "blindspot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    probe = json.loads((lab["out"] / "verifyrm" / "probe.json").read_text())
    climb = climb_on_offer(probe, lab["chosen"]["policy_accuracy"])
    static, rule = (_final(_scalars(lab[arm])["eval/accuracy"]) for arm in ("static", "rule"))
    table = (out / "blindspot.md").read_text()
    assert f"| {lab['out']} | {climb:+.3f} | {static:.3f} ± 0.000 ({static:.2f}) |" in table
    assert f"every folder's seeds pooled: {rule:.3f} ± 0.000 (1 runs)" in table
    assert table in result.stdout


def test_require_verifier_stops_before_the_pair_stage_and_the_arms_when_the_bce_rm_is_no_verifier(lab, tmp_path):
    """The tiny preset's BCE-trained RM is no verifier (accuracy at the majority-class rate on its held-out triples):
    with --require-verifier the lab says so and stops, leaving no pair stage and no run behind."""
    import shutil

    out = tmp_path / "lab"
    out.mkdir()
    for part in ("data", "policy", "lab_settings.json"):  # the fixture's finished stages: nothing is trained again
        copy = shutil.copytree if (lab["out"] / part).is_dir() else shutil.copy
        copy(lab["out"] / part, out / part)
    (out / "verifyrm").mkdir()
    for part in ("best", "train_summary.json"):
        copy = shutil.copytree if (lab["out"] / "verifyrm" / part).is_dir() else shutil.copy
        copy(lab["out"] / "verifyrm" / part, out / "verifyrm" / part)
    result = subprocess.run([sys.executable, "-m", "cooper_openrlhf.cli.lab", "--preset", "tiny", "--out", str(out),
                             "--require-verifier"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 3, (result.stdout + result.stderr)[-3000:]
    assert "is no verifier on its held-out triples" in result.stderr and "--require-verifier" in result.stderr
    assert not (out / "verifyrm" / "pairs").exists() and not (out / "runs").exists()
