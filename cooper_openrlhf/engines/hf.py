"""Transformers generation engine: batched, left-padded `generate` on CPU or one GPU.

Greedy when temperature is 0 (n > 1 then repeats the single greedy completion, which is what n
greedy samples would be). Sampling seeds torch's generator with `sampling.seed` at every call, so
the same prompts and config give the same completions.
"""

import logging

from cooper_openrlhf.engines.base import Prompt, SamplingConfig, prompt_token_ids

logger = logging.getLogger(__name__)


class HFEngine:
    """`AutoModelForCausalLM` behind the GenerationEngine interface.

    batch_size: prompts per `generate` call. dtype: "auto" (the device's fast dtype: bf16 on GPU and on a CPU
    with bf16 units, else fp32), "bf16", "fp16" (GPU) or "fp32" (CPU); see runtime/dtype.py.
    """

    def __init__(self, model_path: str, device: str = "cpu", dtype: str = "auto", batch_size: int = 8):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from cooper_openrlhf.runtime.dtype import torch_dtype

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        model_dtype = torch_dtype(dtype, cuda=device.startswith("cuda"))
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=model_dtype).to(device)
        self.model.eval()
        self.device = device
        self.batch_size = batch_size
        pad_id = self.tokenizer.pad_token_id
        self.pad_token_id = pad_id if pad_id is not None else self.tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise ValueError(f"tokenizer of {model_path} has neither a pad nor an eos token")

    def generate(self, prompts: list[Prompt], sampling: SamplingConfig) -> list[str]:
        import torch

        ids = [prompt_token_ids(self.tokenizer, prompt) for prompt in prompts]
        greedy = sampling.temperature == 0
        if not greedy:
            torch.manual_seed(sampling.seed)
        completions: list[str] = []
        for start in range(0, len(ids), self.batch_size):
            completions.extend(self._generate_batch(ids[start : start + self.batch_size], sampling, greedy))
        return completions

    @staticmethod
    def _left_pad(ids: list[list[int]], pad_id: int, device: str = "cpu"):
        import torch

        width = max(len(row) for row in ids)
        input_ids = torch.tensor([[pad_id] * (width - len(row)) + row for row in ids], device=device)
        attention_mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids], device=device)
        return input_ids, attention_mask

    def _generate_batch(self, ids: list[list[int]], sampling: SamplingConfig, greedy: bool) -> list[str]:
        import torch

        input_ids, attention_mask = self._left_pad(ids, self.pad_token_id, self.device)
        options = {"do_sample": False} if greedy else {
            "do_sample": True,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "num_return_sequences": sampling.n,
        }
        with torch.no_grad():
            output = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=sampling.max_new_tokens,
                pad_token_id=self.pad_token_id,
                **options,
            )
        texts = self.tokenizer.batch_decode(output[:, input_ids.shape[1] :], skip_special_tokens=True)
        # Sampled outputs are already grouped by prompt (num_return_sequences); greedy ones are repeated.
        return [text for text in texts for _ in range(sampling.n)] if greedy else texts
