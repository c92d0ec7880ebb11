"""A preemption at any moment of a checkpoint save: the next attempt resumes at the newest step the policy and the RM
both hold whole, and says in one line where it resumed and which save was cut.

Over real folders: each save writes what DeepSpeed and OpenRLHF write, in their order (OpenRLHF's `save_ckpt`
removes the older best before a new best; DeepSpeed creates the tag folder, writes the model states, then the
optimizer states, then `latest`; OpenRLHF then writes the metric file), and the saves of a step go in the trainer's
order (`ray/checkpoints.py`: policy, RM, marker). A preemption ends the run at a named moment; what is on disk then
is what a killed job leaves. The resume is the real one: train_cooper's `settle_resume_point` (what the requeued
driver runs before the models load) and the launchers' preflight (`check_last_checkpoint`).
"""

import json
import logging
import shutil
from pathlib import Path

import pytest

from cooper_openrlhf.cli.train_cooper import settle_resume_point
from cooper_openrlhf.cluster.checks import PreflightError
from cooper_openrlhf.cluster.launch_record import check_last_checkpoint
from cooper_openrlhf.ray.checkpoint_tags import (
    NoWholeCheckpoint,
    latest_tag,
    mark_pair_whole,
    resume_point,
    tag_step,
    unmark_pair,
)

MODEL_STATES = "mp_rank_00_model_states.pt"  # what DeepSpeed writes per rank, first
OPTIM_STATES = "zero_pp_rank_0_mp_rank_00_optim_states.pt"  # ZeRO's optimizer shard, after it


class Preempted(Exception):
    """The job was killed here: nothing after this moment reached the disk."""


class Run:
    """The file effects of a Cooper run's checkpoint saves under `ckpt`, stopped by a preemption at `stop_at`
    ((moment, tag): a moment of `ray/checkpoints.py`'s hook, or `during_<model dir>_save` between DeepSpeed's
    files)."""

    def __init__(self, ckpt: Path, stop_at: tuple[str, str] | None = None):
        self.ckpt, self.stop_at = ckpt, stop_at

    def moment(self, name: str, tag: str) -> None:
        if (name, tag) == self.stop_at:
            raise Preempted(f"{name} {tag}")

    def deepspeed_save(self, model: str, tag: str, step: int) -> None:
        folder = self.ckpt / model
        folder.mkdir(parents=True, exist_ok=True)
        if tag.startswith("best_"):  # OpenRLHF's save_ckpt: the older best goes before the new one is written
            for old in folder.glob("best_*"):
                if old.name != tag:
                    shutil.rmtree(old)
        (folder / tag).mkdir(exist_ok=True)
        (folder / tag / MODEL_STATES).write_text(json.dumps({"global_step": step}))
        self.moment(f"during_{model}_save", tag)
        (folder / tag / OPTIM_STATES).write_text("optimizer")
        (folder / "latest").write_text(tag)
        (folder / tag / "ckpt_metric.json").write_text(json.dumps({"metric_value": step}))

    def pair(self, tag: str) -> None:
        """One step's save of both models, as `CheckpointUnit.begin_pair` / `finish_pair` order it."""
        step = tag_step(tag)
        unmark_pair(str(self.ckpt), tag)
        self.moment("before_policy_save", tag)
        self.deepspeed_save("_actor", tag, step)
        self.moment("before_rm_save", tag)
        self.deepspeed_save("_rm", tag, step)
        self.moment("before_marker", tag)
        mark_pair_whole(str(self.ckpt), tag)
        self.moment("after_marker", tag)

    def steps(self, first: int, last: int, best_at=(1, 2)) -> None:
        """Steps first..last with a save every step (SAVE_STEPS=1) and an evaluation after it; the evaluations of
        `best_at` were the best so far (OpenRLHF's fit: scheduled save, then evaluation and best save)."""
        for step in range(first, last + 1):
            self.pair(f"global_step{step}")
            if step in best_at:
                self.pair(f"best_global_step{step}")


def preempted_run(ckpt: Path, stop_at) -> None:
    with pytest.raises(Preempted):
        Run(ckpt, stop_at).steps(1, 3)


def resume(ckpt: Path, caplog) -> list[str]:
    """The requeued attempt's resume: the driver settles the `latest` files, the preflight names the folders. Returns
    the driver's log lines."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cooper_openrlhf.train_cooper"):
        settle_resume_point(str(ckpt))
    return [record.getMessage() for record in caplog.records if record.name == "cooper_openrlhf.train_cooper"]


def loaded_steps(ckpt: Path) -> dict[str, int]:
    """The step of the model states DeepSpeed's load reads in each model (the tag its `latest` names)."""
    return {model: json.loads((ckpt / model / latest_tag(str(ckpt / model)) / MODEL_STATES).read_text())["global_step"]
            for model in ("_actor", "_rm")}


# Step 1: global_step1, best_global_step1; step 2: global_step2, best_global_step2; step 3: global_step3.
MOMENTS = [
    # (the preemption, the tag both models resume from, the save named as cut)
    (("before_policy_save", "global_step2"), "best_global_step1", None),
    (("during__actor_save", "global_step2"), "best_global_step1", "global_step2"),
    (("before_rm_save", "global_step2"), "best_global_step1", "global_step2"),
    (("during__rm_save", "global_step2"), "best_global_step1", "global_step2"),
    (("before_marker", "global_step2"), "global_step2", None),  # both `latest` name it: whole in both
    (("after_marker", "global_step2"), "global_step2", None),
    # around a best save: the new best's save removes the older best first
    (("before_policy_save", "best_global_step2"), "global_step2", None),
    (("during__actor_save", "best_global_step2"), "global_step2", "best_global_step2"),
    (("before_rm_save", "best_global_step2"), "global_step2", "best_global_step2"),
    (("during__rm_save", "best_global_step2"), "global_step2", "best_global_step2"),
    (("before_marker", "best_global_step2"), "best_global_step2", None),
    (("during__rm_save", "global_step3"), "best_global_step2", "global_step3"),
]


@pytest.mark.parametrize("stop_at, tag, cut", MOMENTS, ids=[f"{m}-{t}" for (m, t), _, _ in MOMENTS])
def test_a_preemption_at_each_moment_of_a_save_resumes_at_the_newest_whole_pair(tmp_path, caplog, stop_at, tag, cut):
    ckpt = tmp_path / "ckpt"
    preempted_run(ckpt, stop_at)

    (line,) = resume(ckpt, caplog)
    step = tag_step(tag)
    assert line.startswith(f"resuming at step {step} from the policy's {tag} and the RM's {tag}"), line
    assert (f"the save of {cut} was cut" in line) if cut else ("cut" not in line), line
    assert {latest_tag(str(ckpt / model)) for model in ("_actor", "_rm")} == {tag}
    assert loaded_steps(ckpt) == {"_actor": step, "_rm": step}
    assert check_last_checkpoint(str(ckpt))[0] == [str(ckpt / model / tag) for model in ("_actor", "_rm")]

    # The requeued attempt goes on from there, saving over what the cut save left, to the end of the run.
    Run(ckpt).steps(step + 1, 3)
    (line,) = resume(ckpt, caplog)
    assert line == "resuming at step 3 from the policy's global_step3 and the RM's global_step3"


def test_a_preemption_in_the_first_save_leaves_no_whole_pair_and_the_resume_is_refused(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    preempted_run(ckpt, ("before_rm_save", "global_step1"))
    with pytest.raises(NoWholeCheckpoint, match="no tag both models saved whole"):
        resume(ckpt, caplog)
    with pytest.raises(PreflightError, match=f"OUT={tmp_path}: no step of its checkpoints is whole in both models"):
        check_last_checkpoint(str(ckpt))
    assert latest_tag(str(ckpt / "_actor")) == "global_step1", "nothing was rewritten"


def test_a_preemption_before_anything_was_saved_starts_afresh(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    preempted_run(ckpt, ("before_policy_save", "global_step1"))
    assert resume(ckpt, caplog) == [] and resume_point(str(ckpt)).policy_tag is None


def pre_marker_layout(ckpt: Path, policy_step2_whole: bool) -> None:
    """A run folder written by the trainer before the pair markers existed, as a preemption left it: step 1's
    scheduled and best saves whole in both models; at step 2 the RM's save (started beside the policy's) finished
    and moved the RM's `latest`, and the job was killed while the policy's was still writing (or,
    `policy_step2_whole`, just after)."""
    run = Run(ckpt)
    for model in ("_actor", "_rm"):
        for tag in ("global_step1", "best_global_step1"):
            run.deepspeed_save(model, tag, 1)
    run.deepspeed_save("_rm", "global_step2", 2)
    if policy_step2_whole:
        run.deepspeed_save("_actor", "global_step2", 2)
    else:
        with pytest.raises(Preempted):
            Run(ckpt, ("during__actor_save", "global_step2")).deepspeed_save("_actor", "global_step2", 2)
    assert not (ckpt / "whole_pairs").exists()


def test_the_pre_marker_layout_resumes_at_step_1_naming_the_cut_save(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    pre_marker_layout(ckpt, policy_step2_whole=False)
    assert (latest_tag(str(ckpt / "_actor")), latest_tag(str(ckpt / "_rm"))) == ("best_global_step1", "global_step2")

    # The preflight that refused it ("the models' last checkpoints are of different steps") now names the resume.
    loads, point = check_last_checkpoint(str(ckpt))
    assert loads == [str(ckpt / "_actor" / "best_global_step1"), str(ckpt / "_rm" / "best_global_step1")]
    (line,) = resume(ckpt, caplog)
    assert line == point.describe() == (
        "resuming at step 1 from the policy's best_global_step1 and the RM's best_global_step1: the save of "
        "global_step2 was cut (the policy's `latest` named best_global_step1, the RM's global_step2)")
    assert loaded_steps(ckpt) == {"_actor": 1, "_rm": 1}


def test_the_pre_marker_layout_with_both_step_2_saves_whole_resumes_at_step_2(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    pre_marker_layout(ckpt, policy_step2_whole=True)
    (line,) = resume(ckpt, caplog)
    assert line == "resuming at step 2 from the policy's global_step2 and the RM's global_step2"
    assert loaded_steps(ckpt) == {"_actor": 2, "_rm": 2}
