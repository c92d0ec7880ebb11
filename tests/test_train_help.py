"""`cooper train --help`: Cooper's flags first, OpenRLHF's after them, and the defaults printed (cli/train_help.py)."""

import argparse

from cooper_openrlhf.cli.train_help import OPENRLHF_TITLE, arrange_help


def _toy_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toy")
    parser.add_argument("--stock.steps", type=int, default=3, help="steps to run")
    parser.add_argument("--stock.name", default="x")  # no help text: OpenRLHF has such flags
    parser.add_argument("--stock.path", default=None, help="a path")
    group = parser.add_argument_group("Cooper", "co-training")
    group.add_argument("--cooper.rm_lr", type=float, default=1e-5, help="RM learning rate")
    group.add_argument("--cooper.gate", action="store_true", default=False, help="a switch")
    group.add_argument("--cooper.dtype", default="auto", help="'auto' (default) = picked per device")
    return parser


def test_the_named_group_comes_first_and_every_telling_default_is_printed_once():
    text = arrange_help(_toy_parser(), "Cooper").format_help()
    listing = text.split("\n\n", 1)[1]  # past the usage line
    assert (listing.index("Cooper:") < listing.index("--cooper.rm_lr") < listing.index(f"{OPENRLHF_TITLE}:")
            < listing.index("--stock.steps"))
    flat = " ".join(text.split())
    assert "RM learning rate (default: 1e-05)" in flat and "steps to run (default: 3)" in flat
    assert "--stock.name STOCK.NAME (default: x)" in flat  # a flag without help text shows its default too
    assert "(default: None)" not in flat and "(default: False)" not in flat  # defaults that say nothing
    assert flat.count("default") == 4  # rm_lr, steps, name, and the dtype's own "(default)", not doubled


def test_cooper_train_help_leads_with_cooper_flags_and_shows_their_defaults():
    from cooper_openrlhf.cli.train_cooper import add_train_cooper_args
    from cooper_openrlhf.runtime.openrlhf_args import openrlhf_ppo_parser

    lines = openrlhf_ppo_parser(extend=add_train_cooper_args).format_help().splitlines()
    headings = [i for i, line in enumerate(lines) if line and not line.startswith(" ") and line.endswith(":")]
    assert [lines[i] for i in headings[:2]] == ["Cooper:", f"{OPENRLHF_TITLE}:"] and headings[0] < 10
    cooper = " ".join(" ".join(lines[headings[0]:headings[1]]).split())
    assert "--remote_rm_trainable" in cooper and "--cooper.negative_source {assistant,mixed,rollout}" in cooper
    assert "(default: 1e-05)" in cooper and "(default: assistant)" in cooper
    assert "--ref.num_nodes" not in cooper and "--ref.num_nodes" in "\n".join(lines[headings[1]:])
