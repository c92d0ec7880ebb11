"""The hook of the patched stock route (patches/): `python -m openrlhf.cli.train_ppo_ray ... --remote_rm_trainable`.

The parser interception it shares with `train_cooper` lives in `runtime/openrlhf_args.py`.
"""

import argparse


def reject_cooper_flags_without_trainable(args) -> None:
    """For the patched stock `train_ppo_ray` (patches/): `--cooper.*` set without `--remote_rm_trainable` would run
    stock training and silently ignore them; fail at start-up naming the missing flag instead."""
    from cooper_openrlhf.cli.cooper_args import CooperArgsError, add_cooper_args

    defaults = vars(add_cooper_args(argparse.ArgumentParser()).parse_args([]))
    changed = [f"--{dest}" for dest, default in defaults.items()
               if dest.startswith("cooper.") and getattr(args.cooper, dest.removeprefix("cooper.")) != default]
    if changed and not args.remote_rm_trainable:
        raise CooperArgsError(
            f"{', '.join(changed)} given without --remote_rm_trainable: stock training would ignore them. Add "
            "--remote_rm_trainable for Cooper; the static-RM and rule-reward arms run with "
            "cooper train")
