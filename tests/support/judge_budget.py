"""Judge replicas under a shared budget, for tests/integration/judge/test_budget_workers.py.

- `ChargingServer`: the local Messages-API server, counting the tokens it served (what a provider
  would bill).
- `python -m tests.support.judge_budget --bootstrap-servers B --data-dir D --judge-rules R
  [--clock-offset-s S]`: one judge worker process, as `agentstream worker --roles judge` runs it,
  with the judge's shared budget and reply cache (`streams.judge.ledger.share_state`, which the
  role sets up) and its budget clock shifted by S seconds (so a test picks where in the hour it
  runs, and can move to the next hour).
- `replica(...)`: such a process (a `Proc`, stopped by PID).
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.support.judge_servers.messages import MessagesServer
from tests.support.processes import Proc


class ChargingServer(MessagesServer):
    """Counts the usage tokens of every answered call (HTTP 200)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.input_tokens = 0
        self.output_tokens = 0

    def ok_body(self, body: dict, text: str, input_tokens: int, output_tokens: int) -> dict:
        with self._lock:
            self.input_tokens += input_tokens
            self.output_tokens += output_tokens
        return super().ok_body(body, text, input_tokens, output_tokens)

    def billed_usd(self, input_per_mtok: float, output_per_mtok: float) -> float:
        return (self.input_tokens * input_per_mtok + self.output_tokens * output_per_mtok) / 1e6


def replica(bootstrap: str, data_dir: Path, rules: Path, log_path: Path, env: dict, offset_s: float) -> Proc:
    args = [sys.executable, "-m", "tests.support.judge_budget", "--bootstrap-servers", bootstrap]
    args += ["--data-dir", str(data_dir), "--judge-rules", str(rules), "--clock-offset-s", str(offset_s)]
    return Proc(args, log_path, env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--judge-rules", type=Path, required=True)
    parser.add_argument("--clock-offset-s", type=float, default=0.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from streams import app as stream_app
    from streams import worker
    from streams.config import WorkerConfig
    from streams.judge import role

    offset = timedelta(seconds=args.clock_offset_s)

    def register(app, config):
        processor = role.register(app, config)  # shares the budget and cache (share_state)
        if processor is not None:
            processor.calls.budget.clock = lambda: datetime.now(UTC) + offset
        return processor

    stream_app.ROLE_REGISTRARS["judge"] = register
    config = WorkerConfig(
        bootstrap_servers=args.bootstrap_servers,
        data_dir=args.data_dir,
        roles=("judge",),
        judge_rules_path=args.judge_rules,
    )
    return worker.main(config)


if __name__ == "__main__":
    sys.exit(main())
