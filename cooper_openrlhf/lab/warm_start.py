"""The lab's starting policy: a small causal LM fine-tuned (SFT) to answer the lab's prompts in its format,
and to do the assistant's job of Cooper's rewrite prompt.

RL only moves a policy whose rollouts are sometimes right and sometimes wrong (GRPO's group-normalised
advantage is zero for a group of all-equal rewards). The tiny Qwen2 the install builds is random, so the lab
first fine-tunes it until its sampled accuracy sits in RL's useful band: every `check_every` steps it samples
answers to a probe of the problems and stops at the first check at or above `target_accuracy` (a fixed step
count would not do: the same count lands anywhere from 5% to 100% depending on the family's size). The answer
format ("The answer is N.") is the one the rule verifier extracts without a fallback.

The policy is also the lab's assistant (`--cooper.assistant policy`): it receives Cooper's rewrite prompt
(algo/negatives.py) for a verified-correct rollout. Untrained on it, the tiny model replies with nothing,
so every negative is empty and the Cooper arm never trains its RM (seen in the first lab runs). The warm
start therefore also teaches the rewrite task on the same problems -- reply "The answer is M." with M a
small slip away from the correct answer -- as an instruct model would already do. Plain torch +
transformers, full-precision AdamW: a 2-layer model trains in seconds per hundred steps on a CPU.
"""

import logging
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from cooper_openrlhf.algo.answer_style import is_hedge, right_in, wrong_in
from cooper_openrlhf.data.records import MathProblem

logger = logging.getLogger(__name__)


ANSWER_SENTENCE = "The answer is {answer}."  # the warm start's answer format


def answer_text(reference: str) -> str:
    return ANSWER_SENTENCE.format(answer=reference)


@dataclass(frozen=True)
class WarmStartConfig:
    max_steps: int = 3000
    target_accuracy: float = 0.35  # inside RL's useful band (~20-60%), with room to improve
    check_every: int = 50
    probe_size: int = 64  # problems sampled at each check (4 answers each)
    temperature: float = 1.0  # the RL sampling temperature: the accuracy the first rollouts will have
    batch_size: int = 32
    lr: float = 3e-3
    # Clip the gradient's global norm to this before each step; None: no clip (the presets'). A clip at 1.0 did
    # not make the warm start generalise to held-out sums.
    max_grad_norm: float | None = None
    seed: int = 0
    # The style lab: this share of each batch's answers (and of its rewrite replies) written in `style` (an answer
    # sentence with an `{answer}` field) instead of ANSWER_SENTENCE, so the policy writes S now and then and RL can
    # find what the starting RM pays for it. None: the canonical sentence only.
    style: str | None = None
    style_share: float = 0.0


@dataclass(frozen=True)
class WarmStartResult:
    steps: int
    probe_accuracy: float  # at the last check
    reached_target: bool


SLIPS = (-2, -1, 1, 2, 10)  # the rewrite's mistake: the correct answer moved by one of these (never below 0)
Example = tuple[list[dict[str, str]], str]  # (chat messages, the assistant's reply)


def answer_example(problem: MathProblem, prompt_suffix: str = "", sentence: str = ANSWER_SENTENCE) -> Example:
    return ([{"role": "user", "content": problem.question + prompt_suffix}],
            right_in(sentence, problem.reference, hedge_slip(problem)))


def hedge_slip(problem: MathProblem) -> int:
    """The number a hedge (algo/answer_style.py) states before the reference: a slip of it, fixed per problem so
    the answer a problem is taught and the rewrite that swaps its two numbers agree."""
    return slipped_answer(int(problem.reference), random.Random(f"hedge {problem.question}"))


def slipped_answer(right: int, rng: random.Random) -> int:
    """A plausible wrong answer: `right` moved by one of SLIPS, never below 0."""
    return next(w for w in (right + rng.choice(SLIPS) for _ in range(100)) if w >= 0 and w != right)


def rewrite_example(problem: MathProblem, rng: random.Random, prompt_suffix: str = "",
                    sentence: str = ANSWER_SENTENCE) -> Example:
    """Cooper's rewrite prompt for the correct answer in `sentence`, replied to with a plausible wrong one in the same
    sentence (a rewrite keeps the solution's style; a hedge's swaps its two numbers)."""
    from cooper_openrlhf.algo.negatives import build_rewrite_messages

    # A hedge's rewrite swaps its two numbers: the reference stays in the text, the final answer is the slip.
    slip = hedge_slip(problem)
    wrong = slip if is_hedge(sentence) else slipped_answer(int(problem.reference), rng)
    messages = build_rewrite_messages(problem.question + prompt_suffix, right_in(sentence, problem.reference, slip),
                                      problem.reference)
    return messages, wrong_in(sentence, problem.reference, wrong)


def _encode(tokenizer, examples: list[Example]) -> list[tuple[list[int], list[int]]]:
    encoded = []
    for messages, reply in examples:
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        target = reply + tokenizer.eos_token
        encoded.append((tokenizer(prompt)["input_ids"], tokenizer(target, add_special_tokens=False)["input_ids"]))
    return encoded


def _batch(encoded, pad_id: int):
    width = max(len(p) + len(t) for p, t in encoded)
    ids = torch.full((len(encoded), width), pad_id)
    labels = torch.full((len(encoded), width), -100)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, (prompt, target) in enumerate(encoded):
        ids[row, : len(prompt) + len(target)] = torch.tensor(prompt + target)
        mask[row, : len(prompt) + len(target)] = 1
        labels[row, len(prompt): len(prompt) + len(target)] = torch.tensor(target)
    return ids, mask, labels


def fine_tune(source: str, problems: list[MathProblem], config: WarmStartConfig, prompt_suffix: str = ""):
    """SFT of `source` on the answers and the rewrites of `problems` (loss on the replies only) until the probe's
    sampled answer accuracy first reaches config.target_accuracy, or config.max_steps; returns (model fp32 in
    eval mode, tokenizer, WarmStartResult)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    rng = random.Random(config.seed)
    answers = _encode(tokenizer, [answer_example(p, prompt_suffix) for p in problems])
    # Rewrite prompts are ~20x longer than questions: a batch of their own, a quarter the size, so short answer
    # batches are not padded to their length (it made the warm start several times slower).
    rewrites = _encode(tokenizer, [rewrite_example(p, rng, prompt_suffix) for p in problems])
    probe = rng.sample(problems, min(config.probe_size, len(problems)))
    styled: dict[int, list] = {}  # pool index (0 answers, 1 rewrites) -> the same examples in config.style
    if config.style is not None:
        styled = {0: _encode(tokenizer, [answer_example(p, prompt_suffix, config.style) for p in problems]),
                  1: _encode(tokenizer, [rewrite_example(p, rng, prompt_suffix, config.style) for p in problems])}
    torch.manual_seed(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    accuracy, step = 0.0, 0
    # Its line: the step and the last check's accuracy against the target. No remaining time: the warm start ends at
    # the first check at the target, which no step count foretells.
    line = tqdm(desc="preparation: warm start", unit="step", mininterval=1.0, dynamic_ncols=True,
                postfix=f"sampled accuracy - (target {config.target_accuracy:.2f})")
    for step in range(1, config.max_steps + 1):
        line.update(1)
        model.train()
        optimizer.zero_grad()
        for index, (pool, size) in enumerate(((answers, config.batch_size), (rewrites, max(1, config.batch_size // 4)))):
            in_style = round(size * config.style_share) if index in styled else 0
            rows = rng.sample(pool, min(size - in_style, len(pool))) + (rng.sample(styled[index], in_style)
                                                                       if in_style else [])
            ids, mask, labels = _batch(rows, tokenizer.pad_token_id)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
        if config.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        if step % config.check_every == 0:
            accuracy = sampled_accuracy(model.eval(), tokenizer, probe, prompt_suffix, temperature=config.temperature,
                                        seed=config.seed + step)
            logger.info("warm start: step %d, loss %.4f, sampled accuracy %.2f", step, loss.item(), accuracy)
            line.set_postfix_str(f"sampled accuracy {accuracy:.2f} (target {config.target_accuracy:.2f})")
            if accuracy >= config.target_accuracy:
                break
    line.close()
    return model.eval(), tokenizer, WarmStartResult(step, accuracy, accuracy >= config.target_accuracy)


@torch.no_grad()
def _sample(model, tokenizer, chats: list[list[dict]], samples: int, temperature: float, max_new_tokens: int,
            seed: int) -> list[str]:
    """`samples` sampled replies per chat, in order (chat 0's samples first)."""
    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    prompts = [tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) for chat in chats]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**batch, do_sample=True, temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens,
                         num_return_sequences=samples, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


def sampled_accuracy(model, tokenizer, problems: list[MathProblem], prompt_suffix: str = "", samples: int = 4,
                     temperature: float = 0.7, max_new_tokens: int = 16, seed: int = 0) -> float:
    """Share of `samples` sampled answers per problem the rule verifier marks correct (avg@k, as evaluation)."""
    from cooper_openrlhf.verify.rule import Verdict, verify_one

    texts = _sample(model, tokenizer, [answer_example(p, prompt_suffix)[0] for p in problems], samples, temperature,
                    max_new_tokens, seed)
    correct = [verify_one(problems[i // samples].reference, text).verdict == Verdict.CORRECT
               for i, text in enumerate(texts)]
    return sum(correct) / len(correct)


def sampled_style_share(model, tokenizer, problems: list[MathProblem], style: str, prompt_suffix: str = "",
                        samples: int = 4, temperature: float = 1.0, max_new_tokens: int = 16, seed: int = 0) -> dict:
    """How often the policy answers in `style`, and how often those answers are right (sampled as RL samples)."""
    from cooper_openrlhf.algo.answer_style import in_sentence
    from cooper_openrlhf.verify.rule import Verdict, verify_one

    texts = _sample(model, tokenizer, [answer_example(p, prompt_suffix)[0] for p in problems], samples, temperature,
                    max_new_tokens, seed)
    in_style = [i for i, text in enumerate(texts) if in_sentence(text, style)]
    right = [verify_one(problems[i // samples].reference, texts[i]).verdict == Verdict.CORRECT for i in in_style]
    return {"share": len(in_style) / len(texts), "accuracy": sum(right) / len(right) if right else None,
            "samples": len(texts)}


def sampled_rewrite_style(model, tokenizer, problems: list[MathProblem], style: str, prompt_suffix: str = "",
                          samples: int = 2, temperature: float = 1.0, max_new_tokens: int = 32, seed: int = 0) -> dict:
    """Replies to Cooper's rewrite prompt for a right answer written in `style`: the share that keep the style, and
    the share that keep it and are proven wrong (a valid negative in S)."""
    from cooper_openrlhf.algo.answer_style import in_sentence
    from cooper_openrlhf.verify.rule import Verdict, verify_one

    rng = random.Random(seed)
    chats = [rewrite_example(p, rng, prompt_suffix, style)[0] for p in problems]
    texts = _sample(model, tokenizer, chats, samples, temperature, max_new_tokens, seed)
    kept = [in_sentence(text, style) for text in texts]
    valid = [k and verify_one(problems[i // samples].reference, text).verdict == Verdict.INCORRECT
             for i, (k, text) in enumerate(zip(kept, texts))]
    return {"keeps_style": sum(kept) / len(texts), "valid_in_style": sum(valid) / len(texts), "samples": len(texts)}


def sampled_rewrite_validity(model, tokenizer, problems: list[MathProblem], prompt_suffix: str = "", samples: int = 2,
                             temperature: float = 1.0, max_new_tokens: int = 32, seed: int = 0) -> float:
    """Share of sampled replies to Cooper's rewrite prompt that the rule verifier proves wrong: the share of
    attempts that would be valid negatives (an empty reply or an unextractable answer is not one)."""
    from cooper_openrlhf.verify.rule import Verdict, verify_one

    rng = random.Random(seed)
    chats = [rewrite_example(p, rng, prompt_suffix)[0] for p in problems]
    texts = _sample(model, tokenizer, chats, samples, temperature, max_new_tokens, seed)
    wrong = [verify_one(problems[i // samples].reference, text).verdict == Verdict.INCORRECT
             for i, text in enumerate(texts)]
    return sum(wrong) / len(wrong)


def save(model, tokenizer, out: Path, dtype: torch.dtype) -> None:
    """Saved in the run's dtype, so the weights synced into vLLM need no cast."""
    model.to(dtype).save_pretrained(out)
    tokenizer.save_pretrained(out)
