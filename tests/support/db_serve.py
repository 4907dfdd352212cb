"""`agentstream db serve` over a fresh chDB path, for the tests that attack its endpoint: started as
a real process, stopped by PID."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.processes import AGENTSTREAM, Proc, wait_for


@contextmanager
def served_chdb(tmp: Path, reader_timeout_s: int, reader_max_memory_mb: int = 256) -> Iterator[str]:
    """Yields the `chdb://` URL of a path served with these reader limits."""
    url = f"chdb://{tmp / 'clickhouse'}"
    args = [*AGENTSTREAM, "db", "serve", "--clickhouse-url", url, "--port", "0"]
    args += ["--reader-timeout-s", str(reader_timeout_s), "--reader-max-memory-mb", str(reader_max_memory_mb)]
    proc = Proc(args, tmp / "serve.log")
    try:
        wait_for(lambda: "serving" in proc.log_text(), timeout_s=60, what="agentstream db serve")
        yield url
    finally:
        proc.stop()
