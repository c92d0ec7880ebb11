"""`python -m cooper_openrlhf.cli.demo` (`make demo`): the reward-hacking lab's quick preset.

One seed of the paper's three arms on a CPU machine -- rule reward, static RM, Cooper -- from the same
warm-started policy and the same starting VerifyRM, each a real `train_cooper` run; then the report
(figures and a table) and a three-line summary: per arm, its RM reward and held-out accuracy, first -> last.
Any `cli.lab` flag passes through (`--out`, `--steps`, `--arms`, ...); run it again to resume.
docs/lab.md describes the setup and the full preset.
"""

import sys

from cooper_openrlhf.cli import lab

DEMO_PRESET = "quick"


def demo_argv(argv: list[str]) -> list[str]:
    return ["--preset", DEMO_PRESET, *argv]


def main(argv: list[str] | None = None) -> int:
    return lab.main(demo_argv(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
