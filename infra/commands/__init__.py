"""One module per command family of `agentstream`: each has `register(subparsers)` and the handlers.

Handlers are argument plumbing only: they build a config, call into the package that does the work,
and report through `infra.terminal.output`. Heavy imports happen inside the handlers.
"""
