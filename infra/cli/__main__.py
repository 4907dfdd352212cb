"""`python -m infra.cli ...` is `agentstream ...`."""

import sys

from infra.cli.main import main

sys.exit(main())
