"""Generation engines behind one interface (`base.GenerationEngine`), built by name with `make_engine`.

Implementations are imported only when asked for: transformers and vLLM are heavy.
"""

from cooper_openrlhf.runtime.registry import Registry
from cooper_openrlhf.engines.base import GenerationEngine, SamplingConfig

ENGINE_KINDS = Registry("engine kind")


@ENGINE_KINDS.register("hf")
def _hf(model_path: str, **kwargs) -> GenerationEngine:
    from cooper_openrlhf.engines.hf import HFEngine

    return HFEngine(model_path, **kwargs)


@ENGINE_KINDS.register("vllm")
def _vllm(model_path: str, **kwargs) -> GenerationEngine:
    from cooper_openrlhf.engines.vllm_offline import VLLMEngine

    return VLLMEngine(model_path, **kwargs)


def make_engine(kind: str, model_path: str, **kwargs) -> GenerationEngine:
    """An engine of `kind` ("hf": transformers, "vllm": in-process vLLM, GPU or CPU build) for `model_path`."""
    return ENGINE_KINDS[kind](model_path, **kwargs)


__all__ = ["ENGINE_KINDS", "GenerationEngine", "SamplingConfig", "make_engine"]
