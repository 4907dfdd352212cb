"""The `agentstream` command line: `main` (infra/cli/main.py) builds one parser from the command
modules in infra/commands/. The top floor of `infra`: nothing in the product imports it. The console
script is `infra.cli.main:main`; `python -m infra.cli` runs `__main__.py`."""
