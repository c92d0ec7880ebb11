"""Generation engines behind one interface (`base.GenerationEngine`), built by name with `make_engine`.

Implementations are imported only when asked for: transformers and vLLM are heavy.
"""

from cooper_openrlhf.engines.base import GenerationEngine, SamplingConfig

ENGINE_KINDS = ("hf", "vllm")


def make_engine(kind: str, model_path: str, **kwargs) -> GenerationEngine:
    """An engine of `kind` ("hf": transformers, "vllm": in-process vLLM, GPU or CPU build) for `model_path`."""
    if kind == "hf":
        from cooper_openrlhf.engines.hf import HFEngine

        return HFEngine(model_path, **kwargs)
    if kind == "vllm":
        from cooper_openrlhf.engines.vllm_offline import VLLMEngine

        return VLLMEngine(model_path, **kwargs)
    raise KeyError(f"unknown engine kind {kind!r}; valid: {list(ENGINE_KINDS)}")


__all__ = ["ENGINE_KINDS", "GenerationEngine", "SamplingConfig", "make_engine"]
