"""OpenRLHF's own `train_ppo_ray` argument parser, reused rather than copied.

OpenRLHF 0.11.2 builds its ~400-line parser inline under `if __name__ == "__main__":` in
`openrlhf/cli/train_ppo_ray.py`, so it cannot be imported. `openrlhf_ppo_parser()` runs that block with
`ArgumentParser.parse_args` intercepted and returns the parser it built: every stock flag, default and help
text stays OpenRLHF's, and Cooper's flags are added to it (`--cooper.*`).
"""

import argparse
import runpy

from openrlhf.utils.config import hierarchize


class _ParserBuilt(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__("parser captured")
        self.parser = parser


def openrlhf_ppo_parser() -> argparse.ArgumentParser:
    """A fresh copy of the parser `python -m openrlhf.cli.train_ppo_ray` uses."""
    original_parse_args = argparse.ArgumentParser.parse_args

    def capture(parser, *args, **kwargs):
        raise _ParserBuilt(parser)

    argparse.ArgumentParser.parse_args = capture
    try:
        runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=False)
    except _ParserBuilt as built:
        return built.parser
    finally:
        argparse.ArgumentParser.parse_args = original_parse_args
    raise RuntimeError("openrlhf.cli.train_ppo_ray did not build an argument parser; is openrlhf 0.11.2 installed?")


def parse_openrlhf_args(argv: list[str], parser: argparse.ArgumentParser | None = None):
    """Parse `argv` with OpenRLHF's parser into its nested namespace (`args.ds.zero_stage`, ...)."""
    parser = parser or openrlhf_ppo_parser()
    return hierarchize(parser.parse_args(argv))
