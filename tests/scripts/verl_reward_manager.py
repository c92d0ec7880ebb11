"""verl's own reward managers score rollouts through `cooper_openrlhf/clients/verl.py` (run with the verl venv's
python, scripts/verl_venv.sh; tests/test_serve_clients.py starts the service and runs this).

    python verl_reward_manager.py URL TOKENIZER_DIR JSON_BATCHES

JSON_BATCHES: {"loop": {"question", "answer", "responses"}, "legacy": {...}}, one rollout batch for each path:
  - "loop": verl 0.9.1's trainer path. The config is verl's own `ppo_trainer` composed with the overrides a user
    passes (`reward.custom_reward_function.*`), a `RewardLoopWorker` loads the registered reward manager ("naive")
    and the custom function through `load_reward_manager`, scores the batch sample by sample as the Ray actor does
    (`compute_score_batch` on the worker's event loop), and `assemble_rm_scores` makes the token-level rewards as
    `RewardLoopManager.compute_rm_score` does. Ray itself is not started: the worker is the class Ray wraps.
  - "legacy": `verl.workers.reward_manager.BatchRewardManager` (still shipped in 0.9.1, no longer what its trainer
    calls) with `compute_score_batch` loaded by verl's `get_custom_reward_fn`: one request per batch.
Each batch is a DataProto laid out as verl's agent loop lays out its output (`_agent_loop_postprocess`): prompts
left-padded to the prompt length, responses right-padded, attention masks concatenated; the dataset row's columns
(data_source, reward_model.ground_truth, extra_info.question, raw_prompt) as non-tensor fields.

Prints one JSON line: for each path, the token-level reward rows (`rewards`), the position of the last response
token (`last`) and the reward_extra_info verl logs.
"""

import json
import os
import sys

import numpy as np
import torch

PROMPT_LENGTH, RESPONSE_LENGTH = 64, 16


def rollout_batch(tokenizer, question: str, answer: str, responses: list[str]):
    from verl import DataProto

    def padded(ids: list[int], length: int, side: str) -> dict:
        tokenizer.padding_side = side
        return tokenizer.pad({"input_ids": [ids]}, padding="max_length", max_length=length, return_tensors="pt")

    raw_prompt = [{"role": "user", "content": question}]
    prompt_ids = tokenizer.apply_chat_template(raw_prompt, add_generation_prompt=True, tokenize=True,
                                               return_dict=False)
    prompt = padded(list(prompt_ids), PROMPT_LENGTH, "left")
    rows = []
    for text in responses:
        response = padded(tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id],
                          RESPONSE_LENGTH, "right")
        attention_mask = torch.cat([prompt["attention_mask"], response["attention_mask"]], dim=1)
        rows.append({"prompts": prompt["input_ids"], "responses": response["input_ids"],
                     "input_ids": torch.cat([prompt["input_ids"], response["input_ids"]], dim=1),
                     "attention_mask": attention_mask,
                     "position_ids": torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0)})
    tensors = {key: torch.cat([row[key] for row in rows]) for key in rows[0]}
    n = len(responses)
    non_tensors = {
        "data_source": np.array(["openai/gsm8k"] * n, dtype=object),
        "reward_model": np.array([{"ground_truth": answer, "style": "rule"} for _ in range(n)], dtype=object),
        "extra_info": np.array([{"question": question, "split": "train", "index": 0} for _ in range(n)],
                               dtype=object),
        "raw_prompt": np.array([raw_prompt] * n, dtype=object),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def verl_config(tokenizer_dir: str, url: str, name: str):
    """verl's own trainer config with the overrides docs/serve.md gives for the custom reward function."""
    from hydra import compose, initialize_config_dir

    import cooper_openrlhf.clients.verl as shipped
    import verl

    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                               version_base=None):
        return compose("ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={tokenizer_dir}",
            f"reward.custom_reward_function.path={shipped.__file__}",
            f"reward.custom_reward_function.name={name}",
            f"+reward.custom_reward_function.reward_kwargs.url={url}",
        ])


def loop_path(tokenizer_dir: str, url: str, data) -> dict:
    from verl.experimental.reward_loop import RewardLoopWorker

    worker = RewardLoopWorker(verl_config(tokenizer_dir, url, "compute_score"))
    outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
    rewards = worker.reward_manager.assemble_rm_scores(data, [out["reward_score"] for out in outputs])
    return {"manager": type(worker.reward_manager).__module__ + "." + type(worker.reward_manager).__name__,
            "rewards": rewards.tolist(), "extra": [out["reward_extra_info"] for out in outputs]}


def legacy_path(tokenizer, tokenizer_dir: str, url: str, data) -> dict:
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.workers.reward_manager import BatchRewardManager

    manager = BatchRewardManager(tokenizer, num_examine=0,
                                 compute_score=get_custom_reward_fn(verl_config(tokenizer_dir, url,
                                                                                "compute_score_batch")))
    result = manager(data, return_dict=True)
    return {"manager": type(manager).__module__ + "." + type(manager).__name__,
            "rewards": result["reward_tensor"].tolist(), "extra": dict(result["reward_extra_info"])}


def main(url: str, tokenizer_dir: str, batches_json: str) -> None:
    from verl.utils import hf_tokenizer

    tokenizer = hf_tokenizer(tokenizer_dir)
    batches = json.loads(batches_json)
    out = {}
    for path, spec in batches.items():
        data = rollout_batch(tokenizer, spec["question"], spec["answer"], spec["responses"])
        prompt_length = data.batch["prompts"].shape[1]
        last = (data.batch["attention_mask"][:, prompt_length:].sum(dim=1) - 1).tolist()
        scored = loop_path(tokenizer_dir, url, data) if path == "loop" else legacy_path(tokenizer, tokenizer_dir,
                                                                                        url, data)
        out[path] = {**scored, "last": last}
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:4])
