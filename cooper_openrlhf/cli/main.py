"""The `cooper` command: one entry point for every command-line tool of the package.

    cooper SUBCOMMAND [ARGS...]           # e.g. cooper demo, cooper train ..., cooper serve --rm DIR
    cooper inspect TOOL [ARGS...]         # the read-only research tools (blind spot, RM probe, rollouts, ...)
    cooper SUBCOMMAND --help              # that tool's own help

Each subcommand is `cooper_openrlhf.<module>.main(ARGS)`, unchanged; the docs use `cooper`, and the launchers
(launch_scripts/, the lab's Ray and Slurm jobs) run the modules with `python -m`, which runs the same thing. The
one-line descriptions `cooper --help` lists are the first lines of those modules' docstrings, read from their source
so that listing them imports nothing (train_cooper imports OpenRLHF, Ray and torch).
"""

import ast
import importlib
import importlib.util
import sys

PACKAGE = "cooper_openrlhf"

# What a user runs: training, the service, the lab and its batches, reports, data and the VerifyRM recipe,
# evaluation, the launchers' checks, and the runs that compare Cooper with stock OpenRLHF and with the service.
COMMANDS = {
    "train": "cli.train_cooper",
    "serve": "cli.serve",
    "demo": "cli.demo",
    "lab": "cli.lab",
    "batch": "cli.batch",
    "report": "cli.report",
    "prompts": "cluster.prompts",
    "verifyrm": "cli.verifyrm",
    "evaluate": "cli.evaluate",
    "preflight": "cli.preflight",
    "gpu-smoke": "cli.gpu_smoke",
    "stock-openrlhf": "cli.stock_openrlhf",
    "serve-parity": "cli.serve_parity",
}

# Read-only research tools: they look into finished runs, RMs, verifiers and cluster sizes and write only what
# they print or the figures and tables asked for; the lab notebook (docs/lab/notebook.md) uses them.
INSPECT_TOOLS = {
    "blindspot": "cli.blindspot",
    "probe-rm": "cli.probe_rm",
    "rollouts": "cli.rollouts",
    "replay-monitor": "cli.replay_monitor",
    "eval-verifier": "cli.eval_verifier",
    "sizing": "cluster.sizing",
}

INSPECT = "inspect"
HELP_FLAGS = ("-h", "--help")
EXIT_USAGE = 2


def summary(module: str) -> str:
    """The first line of `cooper_openrlhf.<module>`'s docstring, without importing the module."""
    path = importlib.util.find_spec(f"{PACKAGE}.{module}").origin
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
                    f"  {INSPECT:<{max(map(len, COMMANDS)) + 2}}read-only research tools: {', '.join(INSPECT_TOOLS)}")
    return f"{__doc__.splitlines()[0]}\n\n{text}"


def dispatch(argv: list[str], prog: str, commands: dict[str, str], help_text) -> int:
    if not argv or argv[0] in HELP_FLAGS:
        print(help_text())
        return 0 if argv else EXIT_USAGE
    name, rest = argv[0], argv[1:]
    if prog == f"cooper {INSPECT}" and name in COMMANDS:  # `cooper inspect batch` and the like, from before
        print(f"{prog}: error: {name!r} runs things and is not an inspect tool: run `cooper {name} ...`",
              file=sys.stderr)
        return EXIT_USAGE
    if name not in commands:
        print(f"{prog}: error: unknown subcommand {name!r}; valid: {', '.join(commands)}", file=sys.stderr)
        return EXIT_USAGE
    module = importlib.import_module(f"{PACKAGE}.{commands[name]}")
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
