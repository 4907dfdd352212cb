"""The `agentstream` command line: `main` (infra/cli/main.py), options generated from config
dataclasses (configs.py) over options with environment fallbacks (options.py), and the one module
that prints (output.py)."""

from infra.cli.main import build_parser, main
from infra.cli.options import apply_env_defaults

__all__ = ["apply_env_defaults", "build_parser", "main"]
