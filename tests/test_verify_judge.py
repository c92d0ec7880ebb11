"""LLM judge (prompt, reply parsing, batching) with a fake engine; the engines on SmolLM2-135M-Instruct."""

import pytest

from cooper_openrlhf.engines import ENGINE_KINDS, GenerationEngine, SamplingConfig, make_engine
from cooper_openrlhf.models import model_path
from cooper_openrlhf.verify.judge import JudgeVerdict, LLMJudge, build_judge_messages, parse_judgement


class ScriptedEngine:
    """Returns canned replies and records what it was asked."""

    def __init__(self, replies: list[str]):
        self.replies = replies
        self.calls: list[tuple[list, SamplingConfig]] = []

    def generate(self, prompts, sampling):
        self.calls.append((prompts, sampling))
        return self.replies[: len(prompts)]


@pytest.mark.parametrize(
    "reply, verdict",
    [
        ("Yes", JudgeVerdict.YES),
        ("The answers differ.\nNo", JudgeVerdict.NO),
        ("No wait, 0.5 equals 1/2. **Yes**.", JudgeVerdict.YES),  # the last one counts
        ("Yes, they match... actually no.", JudgeVerdict.NO),
        ("YES", JudgeVerdict.YES),
        ("Nothing matches; notably, yesterday's answer was None.", JudgeVerdict.UNDECIDED),  # no standalone word
        ("", JudgeVerdict.UNDECIDED),
        ("I cannot tell.", JudgeVerdict.UNDECIDED),
    ],
)
def test_parse_judgement(reply, verdict):
    assert parse_judgement(reply) == verdict


def test_prompt_shows_the_triple_and_asks_for_yes_or_no():
    system, user = build_judge_messages("What is 1+1?", "2", "1+1 = \\boxed{2}")
    assert system["role"] == "system" and user["role"] == "user"
    assert "Question:\nWhat is 1+1?" in user["content"]
    assert "Reference answer:\n2" in user["content"]
    assert "Student solution:\n1+1 = \\boxed{2}" in user["content"]
    assert user["content"].endswith("end your reply with one word on its own line: Yes or No.")


def test_long_completion_is_cut_like_the_rm_template():
    completion = "A" * 500 + "B" * 5000 + "Z" * 1000
    user = build_judge_messages("q", "r", completion)[1]["content"]
    assert "A" * 500 + "\n...\n" + "Z" * 1000 in user and "B" not in user


def test_judge_batches_in_order_with_greedy_short_sampling():
    engine = ScriptedEngine(["Yes", "No", "hmm"])
    assert isinstance(engine, GenerationEngine)
    judgements = LLMJudge(engine).judge(["q1", "q2", "q3"], ["1", "2", "3"], ["c1", "c2", "c3"])
    assert [j.verdict for j in judgements] == [JudgeVerdict.YES, JudgeVerdict.NO, JudgeVerdict.UNDECIDED]
    assert judgements[2].reply == "hmm"
    prompts, sampling = engine.calls[0]
    assert len(prompts) == 3 and "q2" in prompts[1][1]["content"]
    assert sampling.temperature == 0 and sampling.n == 1


def test_judge_rejects_bad_use():
    with pytest.raises(ValueError, match="n=2"):
        LLMJudge(ScriptedEngine([]), SamplingConfig(n=2))
    with pytest.raises(RuntimeError, match="1 replies for 2 prompts"):
        LLMJudge(ScriptedEngine(["Yes"])).judge(["a", "b"], ["1", "2"], ["c", "d"])
    with pytest.raises(ValueError, match="same length"):
        LLMJudge(ScriptedEngine([])).judge(["a"], [], [])


def test_make_engine_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="valid: \\['hf', 'vllm'\\]"):
        make_engine("sglang", "/nowhere")
    assert tuple(ENGINE_KINDS) == ("hf", "vllm")


def test_sampling_config_validates():
    with pytest.raises(ValueError):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError):
        SamplingConfig(n=0)


def smollm_path() -> str:
    # A missing folder fails (naming the install step that makes it): install always materialises it.
    return model_path("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def hf_engine():
    return make_engine("hf", smollm_path(), batch_size=4)


CHAT = [{"role": "user", "content": "What is 2+2? Answer with a number."}]


def test_hf_engine_left_padding_does_not_change_greedy_output(hf_engine):
    greedy = SamplingConfig(max_new_tokens=8)
    batched = hf_engine.generate([CHAT, "The capital of France is"], greedy)
    alone = hf_engine.generate(["The capital of France is"], greedy)
    assert len(batched) == 2 and all(isinstance(text, str) and text for text in batched)
    assert batched[1] == alone[0]
    assert "4" in batched[0]  # the chat template is applied: the instruct model answers


def test_hf_engine_sampling_is_seeded(hf_engine):
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0, n=3, seed=11)
    first = hf_engine.generate(["Once upon a time"], sampling)
    assert len(first) == 3
    assert first == hf_engine.generate(["Once upon a time"], sampling)


def test_judge_on_a_real_model(hf_engine):
    judgements = LLMJudge(hf_engine, SamplingConfig(max_new_tokens=16)).judge(["What is 2+3?"], ["5"], ["2+3 = \\boxed{5}"])
    # A 135M model is no reliable judge; what must hold is a reply and a verdict read from it.
    assert judgements[0].reply and judgements[0].verdict == parse_judgement(judgements[0].reply)


@pytest.mark.slow
def test_vllm_engine_matches_the_interface():
    pytest.importorskip("vllm")
    engine = make_engine("vllm", smollm_path(), max_model_len=512, enforce_eager=True)
    greedy = SamplingConfig(max_new_tokens=8)
    texts = engine.generate([CHAT, "The capital of France is"], greedy)
    assert len(texts) == 2 and "4" in texts[0]
    sampled = engine.generate(["Once upon a time"], SamplingConfig(max_new_tokens=6, temperature=1.0, n=2, seed=3))
    assert len(sampled) == 2
