"""Import-compatible names for OpenRLHF's `train_ppo_ray` parser; the interception lives in `cli/openrlhf_cli.py`."""

from cooper_openrlhf.cli.openrlhf_cli import openrlhf_ppo_parser, parse_openrlhf_args

__all__ = ["openrlhf_ppo_parser", "parse_openrlhf_args"]
