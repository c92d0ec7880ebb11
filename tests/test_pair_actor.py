"""PairConstructionActor and OpenRLHFVLLMEngine on a local Ray cluster with real CPU vLLM engines."""

import time

import pytest

from cooper_openrlhf.algo.negatives import NegativeConfig, build_rewrite_messages
from cooper_openrlhf.algo.pairs import NO_POSITIVE
from cooper_openrlhf.core import PairConfig, RolloutTexts, build_pairs
from cooper_openrlhf.data.synthetic import make_arithmetic_problems
from cooper_openrlhf.engines.base import SamplingConfig, prompt_token_ids
from cooper_openrlhf.verify.extract import extract_answer
from cooper_openrlhf.verify.rule import answers_equivalent

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 1024  # the tiny tokenizer (vocab 512) spends ~600 tokens on a rewrite prompt


def _tiny_engine(ray_cluster, path: str):
    from openrlhf.trainer.ray.vllm_engine import create_vllm_engines

    return create_vllm_engines(1, 1, path, seed=0, full_determinism=False, enable_prefix_caching=False,
                               enforce_eager=True, max_model_len=MAX_MODEL_LEN, gpu_memory_utilization=0.9)[0]


def pairs_on(ray_cluster, actor, texts, verdicts, n: int, step: int):
    """The core's serial pair pipeline with the actor's assistant writing the rewrites (as the trainer composes it)."""
    def rewrite(questions, positives, prompts, step):
        return ray_cluster.get(actor.assistant_negatives.remote(questions, positives, prompts, step=step))

    return build_pairs(PairConfig(n), texts, verdicts, None, rewrite, step)


def _assert_negatives_verified_different(batch) -> None:
    for p, ok in enumerate(batch.valid):
        if not ok:
            assert batch.negatives[p] == "" or batch.positive_index[p] == NO_POSITIVE
            continue
        positive, negative = extract_answer(batch.positives[p]), extract_answer(batch.negatives[p])
        assert negative is not None and answers_equivalent(positive, negative) is False, (p, batch.negatives[p])


def test_a_dedicated_assistant_engine_defaults_to_no_more_positions_than_its_model_has(model_dir):
    """`--cooper.assistant model` leaves the length to this default; vLLM refuses one over the model's positions, so
    4096 on the tiny policy (2048 positions) failed every start of the frozen-assistant arm."""
    from cooper_openrlhf.ray.pair_actor import DEFAULT_ASSISTANT_MAX_MODEL_LEN, default_assistant_max_model_len

    assert default_assistant_max_model_len(str(model_dir("tiny-qwen2-policy"))) == 2048
    assert default_assistant_max_model_len(str(model_dir("smollm2-135m-instruct"))) == DEFAULT_ASSISTANT_MAX_MODEL_LEN


def test_openrlhf_vllm_engine_spreads_requests_round_robin_in_order_with_seeds(ray_cluster, model_dir):
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from cooper_openrlhf.engines.openrlhf_vllm import OpenRLHFVLLMEngine

    @ray_cluster.remote(num_cpus=0)
    class FakeRollout:
        """Stands in for RolloutRayActor.generate: echoes who served which seed."""

        def __init__(self, name):
            self.name, self.seen = name, []

        async def generate(self, prompt_token_ids, sampling_params):
            self.seen.append((len(prompt_token_ids), sampling_params.seed, sampling_params.max_tokens))
            return SimpleNamespace(outputs=[SimpleNamespace(text=f"{self.name}:{sampling_params.seed}")])

        def log(self):
            return self.seen

    tokenizer = AutoTokenizer.from_pretrained(model_dir("tiny-qwen2-policy"))
    prompts = ["one two", "word " * 300, "three four five six"]
    lengths = [len(prompt_token_ids(tokenizer, p)) for p in prompts]
    limit = lengths[2] + 5  # the long prompt has no room; the third gets 5 tokens, less than asked
    assert lengths[0] < lengths[2] < limit <= lengths[1]
    fakes = [FakeRollout.remote("e0"), FakeRollout.remote("e1")]
    try:
        engine = OpenRLHFVLLMEngine(fakes, tokenizer, max_model_len=limit, max_in_flight=2)
        texts = engine.generate(prompts, SamplingConfig(max_new_tokens=8, temperature=1.0, n=2, seed=10))
        logs = ray_cluster.get([fake.log.remote() for fake in fakes])
    finally:
        for fake in fakes:
            ray_cluster.kill(fake)
    # Flat, prompt-grouped; the too-long prompt's two samples are "" and were never sent.
    assert texts == ["e0:10", "e1:11", "", "", "e0:14", "e1:15"]
    assert sorted(logs[0]) == [(lengths[0], 10, 8), (lengths[2], 14, 5)]
    assert sorted(logs[1]) == [(lengths[0], 11, 8), (lengths[2], 15, 5)]


def test_pair_actor_end_to_end_with_the_tiny_policy_on_a_cpu_vllm_engine(ray_cluster, model_dir):
    from transformers import AutoTokenizer

    from cooper_openrlhf.engines.openrlhf_vllm import OpenRLHFVLLMEngine
    from cooper_openrlhf.ray.pair_actor import PairConstructionActor

    path = model_dir("tiny-qwen2-policy")
    engine = _tiny_engine(ray_cluster, path)
    config = NegativeConfig(retries=2, max_new_tokens=24, seed=0)
    actor = PairConstructionActor.remote(config, [engine], path, verifier_workers=1,
                                         assistant_max_model_len=MAX_MODEL_LEN)
    try:
        # 5 prompts x 2 rollouts: correct at rollout 1, 0, 0, 1 of prompts 0-3; prompt 4 has none. Four
        # ~600-token rewrite prompts exceed vLLM's 2048-token step, so one prefill is chunked (the CPU
        # shim for seeded generators is exercised).
        problems = make_arithmetic_problems(5, seed=0)
        questions = [p.question for p in problems for _ in range(2)]
        references = [p.reference for p in problems for _ in range(2)]
        right = [f"Working it out step by step gives {p.reference}.\n\\boxed{{{p.reference}}}" for p in problems]
        wrong = [f"I think it is \\boxed{{{int(p.reference) + 1}}}" for p in problems]
        completions = [wrong[0], right[0], right[1], wrong[1], right[2], right[2], wrong[3], right[3], wrong[4], "no idea"]
        verdicts, verify_metrics = ray_cluster.get(actor.verify.remote(references, completions))
        correct = verdicts.correct
        assert correct == [False, True, True, False, True, True, False, True, False, False]
        assert verdicts.proven_wrong == [True, False, False, True, False, False, True, False, True, False]
        assert verify_metrics["cooper/verified_accuracy"] == pytest.approx(5 / 10)
        assert verify_metrics["cooper/verify_no_answer"] == pytest.approx(1.0)

        args = (ray_cluster, actor, RolloutTexts(questions, references, completions), verdicts, 2)
        first, metrics = pairs_on(*args, step=0)
        again, metrics_again = pairs_on(*args, step=0)
        later, _ = pairs_on(*args, step=2)

        # The policy engine also serves a direct, seeded call: same seed, same text; new seed, new text.
        tokenizer = AutoTokenizer.from_pretrained(path)
        direct = OpenRLHFVLLMEngine([engine], tokenizer, max_model_len=MAX_MODEL_LEN)
        chat = [build_rewrite_messages(questions[1], completions[1])]
        sampling = SamplingConfig(max_new_tokens=16, temperature=1.0, n=2, seed=5)
        twice = [direct.generate(chat, sampling) for _ in range(2)]
        other_seed = direct.generate(chat, SamplingConfig(max_new_tokens=16, temperature=1.0, n=2, seed=6))
    finally:
        ray_cluster.get(actor.close.remote())
        ray_cluster.kill(actor)
        ray_cluster.kill(engine)

    assert first.questions == [p.question for p in problems] and first.references == [p.reference for p in problems]
    assert first.positive_index == [1, 2, 4, 7, NO_POSITIVE]
    assert first.positives == [right[0], right[1], right[2], right[3], ""]
    assert first.valid[4] is False and first.negatives[4] == ""
    assert first == again  # seeded by step: the same step gives the same negatives
    assert {k: v for k, v in metrics.items() if not k.startswith("timing/")} == pytest.approx(
        {k: v for k, v in metrics_again.items() if not k.startswith("timing/")})
    assert later.positives == first.positives
    _assert_negatives_verified_different(first)
    _assert_negatives_verified_different(later)
    valid = sum(first.valid)
    assert metrics["cooper/prompts_with_positive"] == pytest.approx(4.0)
    assert metrics["cooper/valid_pair_rate"] == pytest.approx(valid / 5)
    assert metrics["cooper/negative_success_rate"] == pytest.approx(valid / 4)
    assert 4 <= metrics["cooper/negative_attempts"] <= 8  # every positive once, the missing ones again

    print(f"\ntiny policy as assistant: {valid}/4 valid negatives, {metrics['cooper/negative_attempts']:.0f} rewrites")
    assert len(twice[0]) == 2 and twice[0] == twice[1]
    assert any(twice[0]) and other_seed != twice[0]


def test_smollm2_as_a_separate_assistant_rewrites_arithmetic_solutions(ray_cluster, model_dir):
    """The dedicated-engine path, with a real instruct model: it must write at least one valid negative for
    6 arithmetic solutions in 3 attempts (a floor well under what it does, so that an assistant path that
    silently never produces a pair fails here); the rate itself is printed.

    answer_fallback="none": a rewrite counts only with an anchored final answer (boxed, "####", "the
    answer is"); with "last_number" any reply holding a stray number would pass.
    """
    from ray.util import placement_group_table

    from cooper_openrlhf.ray.pair_actor import PairConstructionActor

    def live_placement_groups() -> int:
        return sum(pg["state"] != "REMOVED" for pg in placement_group_table().values())

    path = model_dir("smollm2-135m-instruct")
    groups_before = live_placement_groups()
    config = NegativeConfig(retries=3, max_new_tokens=64, temperature=0.7, seed=0)
    start = time.perf_counter()
    actor = PairConstructionActor.remote(config, None, path, verifier_workers=1, assistant_model_path=path,
                                         answer_fallback="none", assistant_max_model_len=MAX_MODEL_LEN)
    prompts = 6
    try:
        problems = make_arithmetic_problems(prompts, seed=1)
        questions = [p.question for p in problems]
        references = [p.reference for p in problems]
        completions = [f"Compute it carefully: the result is {p.reference}.\n\\boxed{{{p.reference}}}" for p in problems]
        verdicts, _ = ray_cluster.get(actor.verify.remote(references, completions))
        correct = verdicts.correct
        assert all(correct)
        ready = time.perf_counter()
        batch, metrics = pairs_on(ray_cluster, actor, RolloutTexts(questions, references, completions), verdicts, 1,
                                  step=0)
        done = time.perf_counter()
        assert live_placement_groups() == groups_before + 1  # the dedicated engine's own group
    finally:
        ray_cluster.get(actor.close.remote())
        ray_cluster.kill(actor)
    assert live_placement_groups() == groups_before  # close() removed it

    assert len(batch) == prompts and batch.positive_index == list(range(prompts))
    for p in range(prompts):
        if batch.valid[p]:
            negative = extract_answer(batch.negatives[p], fallback="none")
            assert negative is not None and answers_equivalent(references[p], negative) is False
    assert metrics["cooper/prompts_with_positive"] == pytest.approx(float(prompts))
    assert prompts <= metrics["cooper/negative_attempts"] <= 3 * prompts
    assert batch.num_valid >= 1, f"SmolLM2 wrote no valid negative for {prompts} prompts in 3 attempts: {metrics}"
    example = next((n for n in batch.negatives if n), "(none)")
    print(f"\nSmolLM2-135M-Instruct negative success rate: {metrics['cooper/negative_success_rate']:.3f} "
          f"({batch.num_valid}/{prompts} prompts, {metrics['cooper/negative_attempts']:.0f} rewrites; rejected: "
          f"{metrics['cooper/negative_rejected_no_answer']:.0f} no answer, "
          f"{metrics['cooper/negative_rejected_same_answer']:.0f} same answer, "
          f"{metrics['cooper/negative_rejected_undecided']:.0f} undecided); start-up {ready - start:.1f} s, "
          f"build_pairs {done - ready:.1f} s\nexample negative: {example!r}")
