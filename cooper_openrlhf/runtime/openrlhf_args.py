"""The one interception point of OpenRLHF 0.11.2's `train_ppo_ray` command line.

OpenRLHF builds its ~390-flag parser, and validates and normalises the parsed args, inline under
`if __name__ == "__main__":` in `openrlhf/cli/train_ppo_ray.py`; neither can be imported. Everything
this package takes from that block goes through `intercepted_train_ppo_ray()`, a context manager
under which the module is run as `__main__` (`runpy`) with `ArgumentParser.parse_args` intercepted:

  capture   (`openrlhf_ppo_parser`) the parser is handed back as soon as it is complete, nothing parsed;
  validate  (`validated_train_ppo_ray_args`) argv is parsed by the extended parser, the caller's checks run,
            then the stock block validates and normalises the args and stops where it would call `train(args)`:
            the module's `train` is replaced by a no-op in the globals of the frame that called `parse_args`
            (that frame is the block itself).

Both modes extend the parser in the same place (`extend_openrlhf_parser`): `--ds.param_dtype` also accepts
"auto" (the default: the device's fast dtype, see runtime/dtype.py) and "fp32" (CPU), plus the caller's
flags (Cooper's). The dtype is resolved once, right after parsing (`resolve_param_dtype`): every actor sees
the concrete name, and the run announces it for the processes started later (vLLM engines, Ray workers).
"""

import argparse
import contextlib
import logging
import runpy
import sys
from collections.abc import Callable

from cooper_openrlhf.runtime.dtype import DTYPE_CHOICES, DtypeError, announce_run_dtype, cpu_dtype_reason, resolve_dtype_name

logger = logging.getLogger(__name__)

TRAIN_PPO_RAY = "openrlhf.cli.train_ppo_ray"
PARAM_DTYPE_FLAG = "--ds.param_dtype"
_PARAM_DTYPE_DEST = "ds.param_dtype"


class _ParserBuilt(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__("parser captured")
        self.parser = parser


def extend_openrlhf_parser(parser: argparse.ArgumentParser,
                           extend: Callable[[argparse.ArgumentParser], object] | None = None):
    """The CPU dtypes join `--ds.param_dtype` (default "auto"); then `extend(parser)` adds the caller's flags."""
    action = parser._option_string_actions[PARAM_DTYPE_FLAG]
    action.choices = list(DTYPE_CHOICES)
    action.default = "auto"
    action.help = ("Model data type: 'auto' (default) = bf16 on GPU (OpenRLHF's default) and on a CPU with bf16 "
                   "units (AVX-512 BF16, AMX), fp32 on other CPUs, where bf16 and fp16 are emulated (tens of times "
                   "slower); 'bf16' / 'fp16' = bfloat16 / float16; 'fp32' = float32 (CPU only)")
    if extend is not None:
        extend(parser)
    return parser


def resolve_param_dtype(flat_args: argparse.Namespace, gpu_run: bool | None = None) -> argparse.Namespace:
    """Replace `--ds.param_dtype` (maybe "auto") by the concrete dtype of the run and announce it to the run.

    gpu_run: whether the models run on GPUs (default: this process sees CUDA)."""
    requested = getattr(flat_args, _PARAM_DTYPE_DEST)
    try:
        name = resolve_dtype_name(requested, cuda=gpu_run)
    except DtypeError as exc:
        raise DtypeError(f"{PARAM_DTYPE_FLAG} {requested}: {exc}") from None
    setattr(flat_args, _PARAM_DTYPE_DEST, name)
    announce_run_dtype(name)
    if requested != name:
        device = "GPU" if gpu_run or (gpu_run is None and _cuda()) else cpu_dtype_reason()
        logger.warning("%s %s -> %s (%s)", PARAM_DTYPE_FLAG, requested, name, device)
    return flat_args


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@contextlib.contextmanager
def intercepted_train_ppo_ray(argv: list[str] | None = None, extend=None, check=None, capture_parser: bool = False,
                              held_back: dict | None = None, gpu_run: bool | None = None):
    """While active, running `openrlhf.cli.train_ppo_ray` as `__main__` goes through this package's hooks.

    capture_parser: the extended parser is raised out of the module (`_ParserBuilt`) before parsing.
    Otherwise: `argv` (default sys.argv[1:]) is parsed, the dtype resolved, `check(hierarchized args)` run
    (before the stock block, which assumes a stock configuration), and the module's `train` made a no-op.
    held_back: {flat dest: None} of flags the stock block must not see (its assertions assume stock semantics for
    them); their parsed values are stored into this dict and the block sees None.
    gpu_run: whether the run's models are on GPUs, for the dtype (default: `ray_cluster.run_on_gpus()`).
    """
    from openrlhf.utils.config import hierarchize

    from cooper_openrlhf.runtime.ray_cluster import run_on_gpus

    original_parse_args = argparse.ArgumentParser.parse_args

    def parse_args(parser, args=None, namespace=None):
        extend_openrlhf_parser(parser, extend)
        if capture_parser:
            raise _ParserBuilt(parser)
        flat = resolve_param_dtype(original_parse_args(parser, argv if args is None else args, namespace),
                                   gpu_run=run_on_gpus() if gpu_run is None else gpu_run)
        if check is not None:
            check(hierarchize(flat))
        for dest in held_back or {}:
            held_back[dest] = getattr(flat, dest)
            setattr(flat, dest, None)
        # The block ends with `train(args)`, a global of the module being run, i.e. of our caller's frame.
        sys._getframe(1).f_globals["train"] = lambda validated_args: None
        return flat

    argparse.ArgumentParser.parse_args = parse_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original_parse_args


def _run_train_ppo_ray() -> dict:
    return runpy.run_module(TRAIN_PPO_RAY, run_name="__main__", alter_sys=False)


def openrlhf_ppo_parser(extend=None) -> argparse.ArgumentParser:
    """A fresh copy of the parser `python -m openrlhf.cli.train_ppo_ray` uses, with the CPU dtypes (+ `extend`)."""
    try:
        with intercepted_train_ppo_ray(extend=extend, capture_parser=True):
            _run_train_ppo_ray()
    except _ParserBuilt as built:
        return built.parser
    raise RuntimeError(f"{TRAIN_PPO_RAY} did not build an argument parser; is openrlhf 0.11.2 installed?")


def parse_openrlhf_args(argv: list[str], parser: argparse.ArgumentParser | None = None):
    """Parse `argv` with OpenRLHF's parser into its nested namespace (`args.ds.zero_stage`, ...), dtype resolved.

    No stock validation runs (for the pieces that need only a strategy: RM training, tests)."""
    from openrlhf.utils.config import hierarchize

    parser = parser or openrlhf_ppo_parser()
    return hierarchize(resolve_param_dtype(parser.parse_args(argv)))


def validated_train_ppo_ray_args(argv: list[str] | None, extend=None, check=None, hold_back: tuple[str, ...] = (),
                                 gpu_run: bool | None = None):
    """`argv` parsed and validated exactly as `python -m openrlhf.cli.train_ppo_ray` would -> hierarchized args.

    hold_back: flat dests ("eval.dataset") kept from the stock validation and put back into the result.
    gpu_run: whether the run's models are on GPUs (`intercepted_train_ppo_ray`)."""
    held_back = dict.fromkeys(hold_back)
    with intercepted_train_ppo_ray(argv, extend=extend, check=check, held_back=held_back, gpu_run=gpu_run):
        namespace = _run_train_ppo_ray()
    args = namespace["args"]
    for dest, value in held_back.items():
        group, name = dest.split(".", 1)
        setattr(getattr(args, group), name, value)
    return args
