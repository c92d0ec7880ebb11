"""The launchers' stage plans (cluster/stage_plans.py, cluster/rl_plan.py) with the entry points' own parsers, which live here in cli/.

`plan_stage(stage, env)` and one `plan_<stage>(env)` per stage: what `cli/preflight.py` runs. Every planned command
passes through the parser of the entry point that will run it (`ENTRY_POINTS`), imported only when a plan is made:
train_cooper's imports OpenRLHF and torch, which the other stages' checks do without.
"""

from functools import partial

from cooper_openrlhf.cluster import rl_plan, stage_plans
from cooper_openrlhf.cluster.checks import PreflightError
from cooper_openrlhf.cluster.plan import EntryPoints, parse_or_fail

__all__ = ["ENTRY_POINTS", "plan_annotate", "plan_evaluate", "plan_report", "plan_rl", "plan_stage", "plan_verifyrm_train",
           "validate_train_cooper_argv"]


def validate_train_cooper_argv(argv: list[str], gpus_per_node: int) -> None:
    """train_cooper's own parse: OpenRLHF's parser and validation block plus Cooper's cross-checks, with the device
    flags judged for the nodes the job runs on (GPUS_PER_NODE), not for the node the preflight runs on: a login
    node without a GPU would refuse fp16 and accept gloo weight sync for a GPU job."""
    from cooper_openrlhf.cli.cooper_args import CooperArgsError
    from cooper_openrlhf.cli.train_cooper import parse_args
    from cooper_openrlhf.runtime import install_cpu_runtime
    from cooper_openrlhf.runtime.dtype import DtypeError

    install_cpu_runtime()  # OpenRLHF's modules import flash-attn's CUDA kernels; a no-op where CUDA exists

    nodes = f"the job's {'GPU' if gpus_per_node else 'CPU'} nodes (GPUS_PER_NODE={gpus_per_node})"
    try:
        parse_or_fail("train_cooper flags (launcher defaults + command-line arguments)",
                      lambda: parse_args(argv, gpu_run=gpus_per_node > 0))
    except CooperArgsError as exc:
        raise PreflightError(f"train_cooper rejects the flags for {nodes}: {'; '.join(exc.problems)}") from None
    except (DtypeError, AssertionError) as exc:
        raise PreflightError(f"train_cooper rejects the flags for {nodes}: {exc}") from None


def _verifyrm_parser():
    from cooper_openrlhf.cli.verifyrm import build_parser

    return build_parser()


def _evaluate_parser():
    try:
        from cooper_openrlhf.cli.evaluate import build_parser
    except ImportError as exc:
        raise PreflightError(f"cooper_openrlhf.cli.evaluate cannot be imported ({exc}); update the package") from None
    return build_parser()


ENTRY_POINTS = EntryPoints(check_train_cooper=validate_train_cooper_argv, verifyrm_parser=_verifyrm_parser,
                           evaluate_parser=_evaluate_parser)


# Each stage's plan with these parsers, as cli/preflight.py and the tests call them: plan_rl(env, extra_args).
plan_stage = partial(stage_plans.plan_stage, entry=ENTRY_POINTS)
plan_rl = partial(rl_plan.plan_rl, entry=ENTRY_POINTS)
plan_annotate = partial(stage_plans.plan_annotate, entry=ENTRY_POINTS)
plan_verifyrm_train = partial(stage_plans.plan_verifyrm_train, entry=ENTRY_POINTS)
plan_evaluate = partial(stage_plans.plan_evaluate, entry=ENTRY_POINTS)
plan_report = partial(stage_plans.plan_report, entry=ENTRY_POINTS)
