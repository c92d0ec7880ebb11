"""Run the reward-hacking lab's quick preset: rule reward, static RM and Cooper, one seed, on this CPU.

    cooper demo   # = make demo = python -m cooper_openrlhf.cli.demo = cooper lab --preset quick

One seed of the paper's three arms on a CPU machine -- rule reward, static RM, Cooper -- from the same
warm-started policy and the same starting VerifyRM, each a real `train_cooper` run; then the report
(figures and a table) and a summary: where the arms started; per arm its policy's training and held-out accuracy,
first -> last; each RM judged by what it paid the policy's verified-right and verified-wrong training rollouts,
first -> last, with the AUC of right against wrong (lab/reading.py); and the pre-registered batches' verdicts.
Any `cli.lab` flag passes through (`--out`, `--steps`, `--arms`, ...); run it again to resume.
docs/lab.md describes the setup and the full preset.
"""

import sys

from cooper_openrlhf.cli import lab

DEMO_PRESET = "quick"


def demo_argv(argv: list[str]) -> list[str]:
    return ["--preset", DEMO_PRESET, *argv]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:  # lab's parser prints the flags; say first what this command is
        print(f"{__doc__.splitlines()[0]}\n"
              f"It is `cooper lab --preset {DEMO_PRESET}`; every `cooper lab` flag applies:\n")
    return lab.main(demo_argv(argv))


if __name__ == "__main__":
    sys.exit(main())
