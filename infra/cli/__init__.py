"""The `agentstream` command line: `main` (infra/cli/main.py) builds one parser from the command
modules in infra/commands/. The top floor of `infra`: nothing in the product imports it."""

from infra.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
