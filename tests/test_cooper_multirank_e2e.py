"""End to end with more than one rank per role: 2 RM ranks and 2 vLLM engines, on CPU (gloo), then a resume.

Every other end-to-end test runs one rank per role, where a collective cannot disagree with itself. Here the
RM's ZeRO-2 group has two ranks and the prompt batch is built so that rank 1 never gets a pair: the batch is the
whole prompt set (3 prompts, one per episode), and only one of its prompts can have a positive (the other two carry
references the policy never writes). So every RM update has one valid pair, on rank 0, while rank 1 backs up a zero
loss through the same collectives. The run must complete, log the loss of exactly the valid pairs, keep both
ranks' weights identical, and resume from its checkpoint with the RM's step counter, optimizer and schedule
continuing. The policy is the one test_cooper_e2e.py fine-tunes to answer its prompts.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

from test_cooper_e2e import _jsonl, _launch, _logits, _rm, _scalars

pytestmark = pytest.mark.slow

MULTI_RANK = ("--reward.num_gpus_per_node", "2", "--vllm.num_engines", "2", "--rollout.batch_size", "3",
              "--rollout.micro_batch_size", "3", "--train.batch_size", "12", "--train.micro_batch_size", "3",
              "--train.num_episodes", "3", "--ckpt.max_num", "2")


@pytest.fixture(scope="module")
def multirank_runs(tmp_path_factory, model_dir, answering_policy):
    root = tmp_path_factory.mktemp("cooper_multirank")
    policy, rows = answering_policy
    (root / "policy").symlink_to(policy)
    # One prompt the policy answers; two whose references it never writes (no positive, so no pair). The answered
    # one is the prompt the policy is surest of: a prompt it answers on a third of its samples went 12 samples
    # without a right answer once in CI, and then no step had a pair to test.
    answered = _surest_row(root / "policy", rows)
    others = [row for row in rows if row is not answered][:2]
    prompts = [answered] + [{**row, "label": str(int(row["label"]) + 1000)} for row in others]
    (root / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in prompts))
    first, resumed = root / "first", root / "resumed"
    _launch(first, root / "policy", model_dir("tiny-qwen2-rm"), *MULTI_RANK)
    for part in ("_actor", "_rm"):
        (resumed / "ckpt" / part).mkdir(parents=True)
        shutil.copytree(first / "ckpt" / part / "global_step2", resumed / "ckpt" / part / "global_step2")
        (resumed / "ckpt" / part / "latest").write_text("global_step2")
    _launch(resumed, root / "policy", model_dir("tiny-qwen2-rm"), *MULTI_RANK, "--ckpt.load_enable")
    return first, resumed


def _surest_row(policy: Path, rows: list[dict]) -> dict:
    """The row whose right answer, "The answer is <label>.", the policy gives with the highest probability."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(policy)
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    log_probs = []
    for row in rows:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": row["input"]}], tokenize=False,
                                               add_generation_prompt=True)
        prompt_ids = tokenizer(prompt)["input_ids"]
        target_ids = tokenizer(f"The answer is {row['label']}.", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt_ids + target_ids])).logits[0, len(prompt_ids) - 1 : -1]
        log_probs.append(logits.log_softmax(-1).gather(-1, torch.tensor(target_ids)[:, None]).sum().item())
    return rows[max(range(len(rows)), key=log_probs.__getitem__)]


def _rm_model_states(run: Path, step: int) -> dict:
    (model_file,) = (run / "ckpt" / "_rm" / f"global_step{step}").glob("*model_states.pt")
    return torch.load(model_file, map_location="cpu", weights_only=False)


def test_two_rm_ranks_one_without_pairs_train_on_exactly_the_valid_pairs(multirank_runs, model_dir):
    first, _ = multirank_runs
    scalars = _scalars(first)
    pairs = _jsonl(first / "samples" / "pairs.jsonl")
    updated = 0
    for step in (1, 2, 3):
        valid = [p for p in pairs if p["step"] == step and p["valid"]]
        assert len(valid) <= 1  # at most one pair: RM rank 1 never has one
        if not valid:
            assert scalars["train/cooper/rm_updated"][step] == 0.0
            continue
        updated += 1
        assert scalars["train/cooper/rm_valid_pairs"][step] == 1
        before = model_dir("tiny-qwen2-rm") if step == 1 else str(first / "ckpt" / f"global_step{step - 1}_rm_hf")
        rm = _rm(before)
        texts = ([p["question"] for p in valid], [p["reference"] for p in valid])
        margin = _logits(rm, *texts, [p["positive"] for p in valid]) - _logits(rm, *texts, [p["negative"] for p in valid])
        expected = -torch.nn.functional.logsigmoid(margin).mean().item()
        assert scalars["train/cooper/rm_loss"][step] == pytest.approx(expected, abs=1e-4), step
        # Both ranks applied the same all-reduced gradient: their weights are equal after every update.
        assert scalars["train/cooper/rm_rank_weight_spread"][step] == 0.0
    assert updated >= 1, "no step found a positive: the test's policy no longer answers its prompt"


def test_two_vllm_engines_and_two_rm_ranks_leave_one_checkpoint_unit_per_kept_step(multirank_runs):
    first, _ = multirank_runs
    tags = {part: sorted(p.name for p in (first / "ckpt" / part).iterdir() if p.is_dir()) for part in ("_actor", "_rm")}
    assert tags["_actor"] == tags["_rm"] == ["global_step2", "global_step3"]  # --ckpt.max_num 2 rotated step 1 out
    assert len(list((first / "ckpt" / "_rm" / "global_step3").glob("*optim_states.pt"))) == 2  # a partition per rank


def test_the_resumed_multirank_run_continues_the_rm_step_counter_optimizer_and_schedule(multirank_runs):
    first, resumed = multirank_runs
    scalars = _scalars(resumed)
    assert sorted(scalars["train/cooper/rm_optimizer_steps"]) == [3]  # it went on at step 3, not step 1
    saved_model, new_model = _rm_model_states(first, 2), _rm_model_states(resumed, 3)
    applied = int(scalars["train/cooper/rm_updated"][3])
    assert new_model["cooper_rm_counters"]["optimizer_steps"] == saved_model["cooper_rm_counters"]["optimizer_steps"] + applied
    assert new_model["lr_scheduler"]["last_epoch"] == saved_model["lr_scheduler"]["last_epoch"] + applied
    assert new_model["global_steps"] == saved_model["global_steps"] + applied
