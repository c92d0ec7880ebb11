"""The `cooper` command: one entry point for every command-line tool of the package.

    cooper SUBCOMMAND [ARGS...]           # e.g. cooper demo, cooper train ..., cooper serve --rm DIR
    cooper inspect TOOL [ARGS...]         # the research tools (blind spot, RM probe, rollouts, ...)
    cooper SUBCOMMAND --help              # that tool's own help

Each subcommand is `cooper_openrlhf.cli.<module>.main(ARGS)`, unchanged: `python -m cooper_openrlhf.cli.<module>`
runs the same thing (the launchers and older notes use that form). The one-line descriptions `cooper --help`
lists are the first lines of those modules' docstrings, read from their source so that listing them imports
nothing (train_cooper imports OpenRLHF, Ray and torch).
"""

import ast
import importlib
import importlib.util
import sys

# What a user runs: training, the service, the lab, reports, the VerifyRM recipe, evaluation, the launchers' checks.
COMMANDS = {
    "train": "train_cooper",
    "serve": "serve",
    "demo": "demo",
    "lab": "lab",
    "report": "report",
    "verifyrm": "verifyrm",
    "evaluate": "evaluate",
    "preflight": "preflight",
    "gpu-smoke": "gpu_smoke",
}

# Research tools: they look into finished runs, RMs and verifiers, or re-run the lab's pre-registered batches and
# stock OpenRLHF for comparison; the lab notebook (docs/lab/notebook.md) uses them, a first-time user does not.
INSPECT_TOOLS = {
    "blindspot": "blindspot",
    "probe-rm": "probe_rm",
    "rollouts": "rollouts",
    "replay-monitor": "replay_monitor",
    "eval-verifier": "eval_verifier",
    "stock-openrlhf": "stock_openrlhf",
    "batch": "batch",
    "serve-parity": "serve_parity",
}

INSPECT = "inspect"
HELP_FLAGS = ("-h", "--help")
EXIT_USAGE = 2


def summary(module: str) -> str:
    """The first line of `cooper_openrlhf.cli.<module>`'s docstring, without importing the module."""
    path = importlib.util.find_spec(f"cooper_openrlhf.cli.{module}").origin
    with open(path, encoding="utf-8") as source:
        docstring = ast.get_docstring(ast.parse(source.read())) or ""
    return docstring.splitlines()[0] if docstring else ""


def overview(prog: str, commands: dict[str, str], tail: str = "") -> str:
    width = max(len(name) for name in commands) + 2
    lines = [f"usage: {prog} SUBCOMMAND [ARGS...]   ({prog} SUBCOMMAND --help for its flags)", "", "subcommands:"]
    lines += [f"  {name:<{width}}{summary(module)}" for name, module in commands.items()]
    return "\n".join(lines + ([tail] if tail else []))


def top_level_help() -> str:
    text = overview("cooper", COMMANDS,
                    f"  {INSPECT:<{max(map(len, COMMANDS)) + 2}}research tools: {', '.join(INSPECT_TOOLS)}")
    return f"{__doc__.splitlines()[0]}\n\n{text}"


def dispatch(argv: list[str], prog: str, commands: dict[str, str], help_text) -> int:
    if not argv or argv[0] in HELP_FLAGS:
        print(help_text())
        return 0 if argv else EXIT_USAGE
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"{prog}: error: unknown subcommand {name!r}; valid: {', '.join(commands)}", file=sys.stderr)
        return EXIT_USAGE
    module = importlib.import_module(f"cooper_openrlhf.cli.{commands[name]}")
    return module.main(rest)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == INSPECT:
        return dispatch(argv[1:], f"cooper {INSPECT}", INSPECT_TOOLS,
                        lambda: overview(f"cooper {INSPECT}", INSPECT_TOOLS))
    # `inspect` is handled above; it joins the table only so that a mistyped name's error lists it.
    return dispatch(argv, "cooper", {**COMMANDS, INSPECT: ""}, top_level_help)


if __name__ == "__main__":
    sys.exit(main())
