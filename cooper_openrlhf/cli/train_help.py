"""`cooper train --help` as a user reads it: Cooper's flags first, then OpenRLHF's, every default shown.

OpenRLHF's `train_ppo_ray` parser (~390 flags, built inline in its script) is extended, never copied
(`runtime/openrlhf_args.py`): here only its help is arranged. argparse prints argument groups in the order they were
created, so Cooper's group, added last, is moved to the front; OpenRLHF's own flags follow under one heading.
Defaults are printed as argparse's ArgumentDefaultsHelpFormatter does, except where they say nothing (None, a switch's
False) or where the help already gives one, and also for OpenRLHF's flags that have no help text.
"""

import argparse
import re

OPENRLHF_TITLE = "OpenRLHF train_ppo_ray flags"
_SAYS_DEFAULT = re.compile(r"\(default\b", re.I)


def shows_default(action: argparse.Action) -> bool:
    """Whether "(default: ...)" adds to this flag's help: an option whose default is a value, not told already."""
    return (bool(action.option_strings) and action.default not in (None, False, argparse.SUPPRESS)
            and not _SAYS_DEFAULT.search(action.help or ""))


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """argparse's help, with "(default: X)" after each flag `shows_default` picks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        return f"{help_text} (default: %(default)s)".lstrip() if shows_default(action) else help_text


def arrange_help(parser: argparse.ArgumentParser, first_group: str) -> argparse.ArgumentParser:
    """The group titled `first_group` printed first, OpenRLHF's flags after it, defaults shown; returns `parser`."""
    (first,) = [group for group in parser._action_groups if group.title == first_group]
    # argparse has no public way to order groups: its help walks this list.
    parser._action_groups.remove(first)
    parser._action_groups.insert(0, first)
    parser._optionals.title = OPENRLHF_TITLE
    for action in parser._actions:
        if action.help is None and shows_default(action):  # argparse prints nothing after a flag without help
            action.help = "(default: %(default)s)"
    parser.formatter_class = DefaultsHelpFormatter
    return parser
