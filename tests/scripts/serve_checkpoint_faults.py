"""`python tests/scripts/serve_checkpoint_faults.py STATE_DIR STAGE`: the learning service's checkpoints as
`cooper serve --learn` builds them (`serve.build.build_service`: the tiny RM on a DeepSpeed engine), one stage per
process, as one process of a service's life. Run by tests/test_serve_checkpoints.py (DeepSpeed and
torch.distributed state never leak into pytest). Prints one JSON line of what it saw.

Stages:
  publish   a fresh service saves a checkpoint of version 0, then publishes two trained versions and dies before
            checkpointing them (the test's kill -9: the process ends without a save)
  resume    the same state dir again: which version the restored weights are served as, and the next one published
  saves     interrupted saves' leftovers removed before a save; a save that fails midway leaves nothing; NaN or inf
            weights (the engine's, or a pinned version's in fp32, bf16 or fp16) are neither saved nor exported
"""

import copy
import json
import os
import sys


def build(state_dir: str):
    from cooper_openrlhf.cli.serve import build_parser
    from cooper_openrlhf.serve.build import build_service
    from cooper_openrlhf.models import model_path

    args = build_parser().parse_args(["--rm", str(model_path("tiny-qwen2-rm")), "--no-chat-template", "--learn",
                                      "--state-dir", state_dir, "--groups-per-update", "1", "--group-size", "2",
                                      "--verify-workers", "1", "--verify-lanes", "1"])
    return build_service(args)


def nudge(module, by: float) -> None:
    """Change the weights (what an RM update does)."""
    import torch

    with torch.no_grad():
        next(p for p in module.parameters() if p.dtype.is_floating_point).add_(by)


def fingerprint(module) -> float:
    return float(next(p for p in module.parameters() if p.dtype.is_floating_point).double().sum())


def main(state_dir: str, stage: str) -> dict:
    import torch

    from cooper_openrlhf.serve.checkpoint import SAVING_PREFIX, NonFiniteWeights

    service, checkpointer = build(state_dir)
    engine = service.learner.trainer.model.module
    seen = {"version": service.version}
    try:
        if stage == "publish":
            checkpointer.save(service.state())
            seen["checkpointed"] = fingerprint(engine)
            for k in (1, 2):
                nudge(engine, 0.5 * k)
                seen[f"published_{service.scorer.publish(engine)}"] = fingerprint(engine)
        elif stage == "resume":
            seen["served_weights"] = fingerprint(service.scorer.model_of(service.version))
            nudge(engine, 0.25)
            seen["next"] = service.scorer.publish(engine)
        elif stage == "saves":
            rm_dir = checkpointer.dir
            os.makedirs(rm_dir, exist_ok=True)
            for leftover in ("version7", "version2.1"):  # two attempts that failed or were killed
                os.makedirs(os.path.join(rm_dir, SAVING_PREFIX + leftover, "junk"))
            seen["first"] = checkpointer.save(service.state())
            seen["after_first"] = sorted(os.listdir(rm_dir))
            try:
                checkpointer.save({**service.state(), "unpicklable": lambda: None})  # fails midway, as a full disk
            except Exception as exc:
                seen["failed"] = type(exc).__name__
            seen["after_failed"] = sorted(os.listdir(rm_dir))
            seen["refused"] = {}
            for dtype in ("float32", "bfloat16", "float16"):
                for bad in ("nan", "inf"):
                    pinned = copy.deepcopy(engine).to(getattr(torch, dtype))
                    with torch.no_grad():
                        next(pinned.parameters()).view(-1)[3] = float(bad)
                    try:
                        checkpointer.save(service.state(), {0: pinned})
                        seen["refused"][f"pinned {dtype} {bad}"] = False
                    except NonFiniteWeights:
                        seen["refused"][f"pinned {dtype} {bad}"] = True
            with torch.no_grad():
                next(engine.parameters()).view(-1)[0] = float("nan")
            for what, call in (("save", lambda: checkpointer.save(service.state())),
                               ("export", lambda: checkpointer.export(os.path.join(state_dir, "final_rm")))):
                try:
                    call()
                    seen["refused"][f"engine {what}"] = False
                except NonFiniteWeights:
                    seen["refused"][f"engine {what}"] = True
            seen["after_refusals"] = sorted(os.listdir(rm_dir))
            seen["exported"] = os.path.exists(os.path.join(state_dir, "final_rm"))
    finally:
        for verifier in service.verifier_pools:
            verifier.close()
        service.learner.pair_builder.close()
    return seen


if __name__ == "__main__":
    from cooper_openrlhf.runtime import install_cpu_runtime
    from cooper_openrlhf.runtime.toolchain import put_tools_first_on_path

    put_tools_first_on_path()  # the ninja every process of the tests builds DeepSpeed's ops with (no rebuilds)
    install_cpu_runtime()
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
