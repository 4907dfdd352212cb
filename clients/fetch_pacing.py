"""Fetches that follow the load: sized for batches while records flow, one long poll while idle.

A consumer sizes its fetches for throughput: the broker answers once `fetch_min_bytes` (tens of
KiB) are ready or after `fetch_max_wait_ms` (tens of ms). With nothing to read, that is a fetch
every `fetch_max_wait_ms` all the same: 40 a second at 25 ms, each a request the broker decodes,
answers for every assigned partition and encodes, and the client sends, parses and schedules. An
idle `agentstream up` spent about 0.13 of a core, mostly that way (docs/benchmarks.md, sixth pass).

`pace_fetches(consumer)` makes the sizing follow what the fetches bring: once they have returned
nothing for `QUIET_MS` (250 ms), the next fetch waits for the first byte (`min_bytes` 1), up to
`idle_wait_ms`; the first fetch that returns records puts the configured sizing back. The first
record after a quiet spell is then answered as soon as it is appended, not at the end of a window,
and the records after it are batched as before. Under a trickle (an empty fetch now and then) the
sizing does not change: answering each record at its first byte would split the batches. Nothing
about what is read or committed changes; only when the broker answers. Works the same against
Apache Kafka, whose brokers hold a fetch the same way.

aiokafka reads its fetcher's `_fetch_min_bytes` / `_fetch_max_wait_ms` each time it builds a fetch
request and learns from `_proc_fetch_request` whether a response held records: those are the three
private names used here (checked, with a warning and no pacing where they are missing).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from schemas.config_fields import option

log = logging.getLogger(__name__)

IDLE_WAIT_MS = 500  # aiokafka's own default fetch_max_wait_ms
QUIET_MS = 250  # empty fetches for this long before the fetcher long-polls
FETCHER_ATTRIBUTES = ("_fetch_min_bytes", "_fetch_max_wait_ms", "_proc_fetch_request")
IDLE_WAIT_HELP = (
    f"once fetches have returned nothing for {QUIET_MS} ms, the next one waits for the first byte, "
    "up to this long, instead of polling every --fetch-max-wait-ms (0: always as sized)"
)


def min_bytes_option(default: int) -> Any:
    """The `fetch_min_bytes` field of a consumer's config (the sink's, the batch builder's)."""
    return option(
        default, "the broker answers a fetch once this many bytes are ready, or after the wait", ge=1
    )


def max_wait_option(default: int) -> Any:
    """The `fetch_max_wait_ms` field of a consumer's config (the sink's, the batch builder's)."""
    return option(default, "longest the broker holds a fetch waiting for --fetch-min-bytes", ge=0)


@dataclass
class FetchPacing:
    """The two sizings a paced fetcher alternates between, and what it did (for tests and logs)."""

    busy: tuple[int, int]  # (min_bytes, max_wait_ms) as configured
    idle: tuple[int, int]  # once quiet: the first byte, or idle_wait_ms
    quiet_s: float = QUIET_MS / 1000
    fetches: int = 0
    empty: int = 0
    quiet_since: float | None = None  # when the current run of empty fetches began

    def after(self, got_records: bool, now: float) -> tuple[int, int]:
        """The sizing of the next fetch, given whether this one (answered at `now`, monotonic
        seconds) returned records."""
        self.fetches += 1
        if got_records:
            self.quiet_since = None
            return self.busy
        self.empty += 1
        if self.quiet_since is None:
            self.quiet_since = now
        return self.idle if now - self.quiet_since >= self.quiet_s else self.busy


def pace_fetches(consumer, idle_wait_ms: int = IDLE_WAIT_MS) -> FetchPacing | None:
    """Pace a started `AIOKafkaConsumer`'s fetches (see the module docstring). Returns the pacing,
    or None where it does not apply: `idle_wait_ms` 0 or no longer than the configured wait, or an
    aiokafka without the names this relies on."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None or not all(hasattr(fetcher, name) for name in FETCHER_ATTRIBUTES):
        log.warning("this aiokafka's fetcher has none of %s: fetches are not paced", FETCHER_ATTRIBUTES)
        return None
    busy = (fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms)
    if idle_wait_ms <= busy[1]:
        return None
    pacing = FetchPacing(busy=busy, idle=(1, max(idle_wait_ms, busy[1])))
    original = fetcher._proc_fetch_request

    async def proc_fetch_request(assignment, node_id, request):
        got_records = await original(assignment, node_id, request)
        sizing = pacing.after(bool(got_records), time.monotonic())
        fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms = sizing
        return got_records

    fetcher._proc_fetch_request = proc_fetch_request
    consumer._agentstream_fetch_pacing = pacing
    return pacing
