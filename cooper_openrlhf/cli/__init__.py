"""Command-line entry points (`python -m cooper_openrlhf.cli.<name>`)."""
