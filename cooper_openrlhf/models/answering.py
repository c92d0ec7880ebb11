"""The tiny policy taught to answer its prompts, so that a short run reaches Cooper's own path.

The tiny random policy almost never writes a verifiable answer: no positives, so no rewrites and no RM update, and
a run passes on its exit code alone. `fine_tune_to_answer` fine-tunes it for `steps` full-batch AdamW steps (about
15 s on a CPU for 12 prompts) to write "The answer is N." with the prompt's true answer. Sampled at temperature 1
it is then right on a fair share of rollouts and wrong on others, so the rule verifier finds genuine positives and
the policy itself, as the default assistant, rewrites them into answers the verifier proves different. The
end-to-end tests (tests/test_cooper_e2e.py) and the GPU smoke test (cli/gpu_smoke.py) start from it.
"""

from pathlib import Path

import torch


def fine_tune_to_answer(source: str, out: Path, problems: list[tuple[str, str]], dtype: torch.dtype,
                        steps: int = 40, lr: float = 3e-3, seed: int = 0) -> Path:
    """Fine-tune the causal LM at `source` on (question, answer) pairs, in fp32 on the CPU; saved to `out` in
    `dtype` (the run's: the actor syncs it into vLLM unchanged) with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    encoded = []
    for question, answer in problems:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                               add_generation_prompt=True)
        target = f"The answer is {answer}.{tokenizer.eos_token}"
        encoded.append((tokenizer(prompt)["input_ids"], tokenizer(target, add_special_tokens=False)["input_ids"]))
    width = max(len(p) + len(t) for p, t in encoded)
    ids = torch.full((len(encoded), width), tokenizer.pad_token_id)
    labels = torch.full((len(encoded), width), -100)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, (prompt, target) in enumerate(encoded):
        ids[row, : len(prompt) + len(target)] = torch.tensor(prompt + target)
        mask[row, : len(prompt) + len(target)] = 1
        labels[row, len(prompt) : len(prompt) + len(target)] = torch.tensor(target)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.to(dtype).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return Path(out)
