"""Command-line entry points: `cooper SUBCOMMAND` (cli/main.py) or `python -m cooper_openrlhf.cli.<name>`."""
