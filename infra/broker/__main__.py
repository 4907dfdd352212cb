"""`python -m infra.broker [options]` is `agentstream broker [options]`."""

from __future__ import annotations

import sys

from infra.cli import main

if __name__ == "__main__":
    sys.exit(main(["broker", *sys.argv[1:]]))
