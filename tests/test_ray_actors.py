"""OpenRLHF's stock Ray actors on a local CPU cluster: the reward-model group and CPU vLLM engines."""

import os
import time

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.slow


def _rm_args(model_path: str):
    from cooper_openrlhf.runtime.openrlhf_args import parse_openrlhf_args

    return parse_openrlhf_args(["--ds.zero_stage", "0", "--ds.attn_implementation", "eager",
                                "--reward.model_name_or_path", model_path,
                                "--train.micro_batch_size", "1", "--train.batch_size", "2"])


def test_reward_model_actor_group_of_two_ranks_matches_a_direct_forward(ray_cluster, model_dir):
    from openrlhf.models import get_llm_for_sequence_regression
    from openrlhf.trainer.ray.launcher import RayActorGroup, RewardModelActor
    from openrlhf.utils import get_strategy
    from transformers import AutoTokenizer

    path = model_dir("tiny-qwen2-rm")
    group = RayActorGroup(1, 2, RewardModelActor, num_gpus_per_actor=1)
    try:
        ray_cluster.get(group.async_init_model_from_pretrained(get_strategy(_rm_args(path)), path))
        tokenizer = AutoTokenizer.from_pretrained(path)
        texts = ["What is 2 + 3? 5", "What is 2 + 3? The answer is 7.", "hello", "What is 10 - 4? It is 6."]
        encoded = [tokenizer(t, return_tensors="pt") for t in texts]
        chunks = ray_cluster.get(group.async_run_method_batch(
            "forward", sequences=[e["input_ids"] for e in encoded], attention_mask=[e["attention_mask"] for e in encoded]
        ))
    finally:
        for actor in group._actor_handlers:
            ray_cluster.kill(actor)
    from_actors = torch.cat([reward for chunk in chunks for reward in chunk]).float()

    from cooper_openrlhf.runtime.dtype import resolve_dtype_name

    model = get_llm_for_sequence_regression(path, "reward", param_dtype=resolve_dtype_name("auto"),
                                            attn_implementation="eager").eval()
    with torch.no_grad():
        direct = torch.cat([model(e["input_ids"], e["attention_mask"]) for e in encoded]).float()

    assert len(chunks) == 2 and [len(c) for c in chunks] == [2, 2]  # both ranks served half the batch
    assert from_actors.shape == (4,)
    torch.testing.assert_close(from_actors, direct, atol=1e-2, rtol=0)
    assert from_actors.unique().numel() == 4  # real scores, not a constant


def _engine(model_path: str, max_model_len: int = 512):
    from openrlhf.trainer.ray.vllm_engine import create_vllm_engines

    return create_vllm_engines(1, 1, model_path, seed=0, full_determinism=False, enable_prefix_caching=False,
                               enforce_eager=True, max_model_len=max_model_len, gpu_memory_utilization=0.9)[0]


def _chat_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer(text)["input_ids"]


@pytest.mark.parametrize("run_dtype", ["fp32", "bf16"])
def test_cpu_vllm_engine_generates_and_takes_weight_updates_over_gloo(ray_cluster, model_dir, monkeypatch, run_dtype):
    """The engine is created in the run's announced dtype (stock hard-codes bfloat16) and takes the actor's weights
    in it: after a sync the engine computes with exactly the synced weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams

    from cooper_openrlhf.runtime.dtype import DTYPES, RUN_DTYPE_ENV
    from cooper_openrlhf.runtime.gloo_weight_sync import GlooBroadcastGroup

    monkeypatch.setenv(RUN_DTYPE_ENV, run_dtype)  # what train_cooper's start-up announces
    path = model_dir("tiny-qwen2-policy")
    engine = _engine(path)
    try:
        # The CPU runtime keeps the engine's worker in its engine-core process (runtime/ray_env.py): the actor has
        # one vLLM process below it, not two, and weight sync reaches the worker there.
        import psutil

        actor_pid = ray_cluster.get(engine.__ray_call__.remote(lambda actor: os.getpid()))
        titles = [" ".join(child.cmdline()) for child in psutil.Process(actor_pid).children(recursive=True)]
        assert [t for t in titles if t.startswith("VLLM::EngineCore")] and not [t for t in titles if "Worker" in t], titles
        prompt = _chat_ids(AutoTokenizer.from_pretrained(path), "What is 2 + 3?")
        greedy = SamplingParams(temperature=0.0, max_tokens=12)

        def generate() -> list[int]:
            return list(ray_cluster.get(engine.generate.remote(prompt, greedy)).outputs[0].token_ids)

        original = generate()
        assert len(original) == 12

        # OpenRLHF's sync protocol: the trainer is rank 0 of a stateless group with the engine's workers. The
        # trainer's store listens before the engine is told its port: a port probed free and then closed can be
        # taken meanwhile (a CI run failed on EADDRINUSE), and a client dialling a closed local port can even
        # connect to itself on it.
        store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
        joined = engine.init_process_group.remote("127.0.0.1", store.port, 1, 2, "openrlhf", "gloo", False)
        group = GlooBroadcastGroup(store, rank=0, world_size=2, timeout_s=60)  # a hung sync fails the test in 60 s
        ray_cluster.get(joined)

        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[run_dtype])  # the actor, in the run dtype
        # A trainer in the other dtype: stock OpenRLHF trains in bf16 whatever the run announced, so an engine
        # holding fp32 (the run dtype on a CPU without bf16 units) receives bf16 weights, and the other way round.
        other = torch.bfloat16 if run_dtype == "fp32" else torch.float32

        def sync_weights(dtype):
            for name, param in model.named_parameters():
                done = engine.update_weight.remote(name, dtype=dtype, shape=param.shape)
                group.broadcast(param.data.to(dtype), src=0)
                ray_cluster.get(done)

        saved = {name: p.detach().clone() for name, p in model.named_parameters()}
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=generator).to(p.dtype) * 0.5)
        sync_weights(other)
        perturbed = generate()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(saved[name])
        sync_weights(DTYPES[run_dtype])
        restored = generate()

        # A weight the engine cannot load fails that sync at once with the engine's error: the engine joined the
        # broadcast before loading, so the trainer's send returns instead of waiting out the transport's timeout.
        name, param = next(iter(model.named_parameters()))
        done = engine.update_weight.remote("model.no_such_weight", dtype=param.dtype, shape=param.shape)
        start = time.monotonic()
        group.broadcast(param.data, src=0)
        with pytest.raises(ray_cluster.exceptions.RayTaskError, match="no_such_weight"):
            ray_cluster.get(done)
        assert time.monotonic() - start < 60
    finally:
        ray_cluster.kill(engine)

    assert perturbed != original  # the engine computes with the synced weights...
    assert restored == original  # ...all of them, exactly: syncing the originals back restores its output


def test_smollm2_answers_simple_arithmetic_greedily_on_a_cpu_vllm_engine(ray_cluster, model_dir):
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    path = model_dir("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token not in (None, tokenizer.eos_token)
    engine = _engine(path, max_model_len=1024)
    try:
        output = ray_cluster.get(engine.generate.remote(
            _chat_ids(tokenizer, "What is 2 + 3?"), SamplingParams(temperature=0.0, max_tokens=32)
        )).outputs[0]
    finally:
        ray_cluster.kill(engine)
    assert "5" in output.text
    assert output.finish_reason == "stop"  # stopped at <|im_end|>, not at the token limit
