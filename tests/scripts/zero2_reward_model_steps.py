"""Run a few ZeRO-2 training steps (bf16 or fp32) of the tiny reward model with OpenRLHF's DeepspeedStrategy (gloo, CPU).

Prints one JSON line: {"losses": [...], "rewards_before": [...], "rewards_after": [...]}. Run as a
separate process by tests/test_deepspeed_strategy.py so torch.distributed state never leaks into pytest.
"""

import json
import os
import sys

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")

from cooper_openrlhf.runtime import install_cpu_runtime  # noqa: E402

install_cpu_runtime()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from openrlhf.models import get_llm_for_sequence_regression  # noqa: E402
from openrlhf.utils import get_strategy  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from cooper_openrlhf.runtime.openrlhf_args import parse_openrlhf_args  # noqa: E402


def main(model_path: str, master_port: str, steps: int, param_dtype: str) -> None:
    os.environ["MASTER_PORT"] = master_port
    args = parse_openrlhf_args(
        ["--ds.zero_stage", "2", "--ds.param_dtype", param_dtype, "--ds.attn_implementation", "eager",
         "--train.micro_batch_size", "4", "--train.batch_size", "4"]
    )
    strategy = get_strategy(args)
    strategy.setup_distributed()
    model = get_llm_for_sequence_regression(
        model_path, "reward", param_dtype=args.ds.param_dtype, attn_implementation="eager",
        ds_config=strategy.get_ds_train_config(), init_value_head=True,
    )
    cfg = {"optim": "adam", "adam": {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0},
           "lr_scheduler": "constant", "lr_warmup_ratio": 0.0, "max_norm": 1.0, "scheduler_steps": steps}
    engine, _, _ = strategy.prepare((model, cfg))

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    texts = ["What is 2 + 3? The answer is 5.", "What is 2 + 3? The answer is 7.",
             "What is 10 - 4? The answer is 6.", "What is 10 - 4? The answer is 9."]
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0])
    batch = tokenizer(texts, return_tensors="pt", padding=True)

    def rewards():
        engine.eval()
        with torch.no_grad():
            out = engine(batch["input_ids"], batch["attention_mask"]).float()
        engine.train()
        return out.tolist()

    before, losses = rewards(), []
    for _ in range(steps):
        logits = engine(batch["input_ids"], batch["attention_mask"])
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
        strategy.backward(loss, engine, None)
        strategy.optimizer_step(None, engine, None)
        losses.append(loss.item())
    after = rewards()
    # A step on a NaN loss must leave the weights as they were (DeepSpeed drops steps with non-finite gradients).
    weights = [p.detach().clone() for p in engine.parameters()]
    logits = engine(batch["input_ids"], batch["attention_mask"])
    strategy.backward(F.binary_cross_entropy_with_logits(logits.float(), labels) * float("nan"), engine, None)
    strategy.optimizer_step(None, engine, None)
    nan_step_skipped = all(torch.equal(a, b) for a, b in zip(weights, engine.parameters()))
    print(json.dumps({"losses": losses, "rewards_before": before, "rewards_after": after,
                      "nan_step_skipped": nan_step_skipped,
                      "param_dtype": str(next(engine.parameters()).dtype), "zero_stage": engine.zero_optimization_stage()}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else "bf16")
