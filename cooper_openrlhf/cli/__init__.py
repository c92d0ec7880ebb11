"""Command-line entry points: `cooper SUBCOMMAND` (cli/main.py); launchers run `python -m cooper_openrlhf.cli.X`."""
