"""What each console page shows, as plain dicts: the I/O shell around `infra.clickhouse.browse`,
`infra.clickhouse.analytics` (the CLI's queries) and `infra.status` (the CLI's Kafka status).

Blocking; the web app calls it from a thread pool. ClickHouse is reached the way every reader
reaches it (`clients.clickhouse.client`): through the endpoint of the process that owns an embedded
path (the sink under `agentstream up`), or, when nobody serves it, by opening and serving it here.
A query that fails because the endpoint went away (the sink restarted) reconnects once.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from infra.clickhouse.analytics import BOOTSTRAP_RESAMPLES, BY_CHOICES, leaderboard_report
from infra.clickhouse.browse.filters import EARLIEST, LATEST, parse_filter
from infra.clickhouse.browse.overview import COUNTS_SQL, dead_letters_sql, reward_by_step_sql
from infra.clickhouse.browse.training import training_page
from infra.clickhouse.browse.trajectory_detail import trajectory_detail
from infra.clickhouse.browse.trajectory_list import trajectory_page
from infra.clickhouse.sql import run, run_dicts
from infra.clickhouse.versions import reward_versions
from infra.console.config import ConsoleConfig
from infra.errors import FilterError

log = logging.getLogger(__name__)
KAFKA_WAIT_S = 3.0  # a page waits this long for the broker's numbers
KAFKA_RETRY_S = 10.0  # after a failure, ask the broker again this much later


class ClickHouseReader:
    """One clickhouse-connect HTTP client, reconnected when its endpoint goes away."""

    def __init__(self, url: str, wait_s: float = 30.0):
        self.url = url
        self.wait_s = wait_s
        self._owned = None  # (client, endpoint) when this process serves an embedded path
        self._client = None
        self._lock = threading.Lock()

    def client(self):
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            return self._client

    def _connect(self):
        import clickhouse_connect

        from clients.clickhouse.client import chdb_path, connect, live_endpoint, open_and_serve
        from clients.clickhouse.migrate import migrate

        path = chdb_path(self.url)
        if path is not None and live_endpoint(path) is None and self._owned is None:
            owner, endpoint = open_and_serve(self.url, wait_s=self.wait_s, prepare=migrate)
            if endpoint is not None:
                self._owned = (owner, endpoint)
                log.info("console serves %s at %s", self.url, endpoint.url)
                return clickhouse_connect.get_client(
                    dsn=endpoint.dsn("reader"), autogenerate_session_id=False
                )
            owner.close()
        return connect(self.url, wait_s=self.wait_s, autogenerate_session_id=False)

    def call(self, fn, *args):
        """`fn(client, *args)`, retried once on a fresh connection when the first one is gone."""
        try:
            return fn(self.client(), *args)
        except Exception as exc:
            if not _connection_lost(exc):
                raise
            log.warning("ClickHouse connection lost (%s); reconnecting", exc)
            self.reset()
            return fn(self.client(), *args)

    def reset(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
            self._client = None

    def close(self) -> None:
        self.reset()
        if self._owned is not None:
            owner, endpoint = self._owned
            endpoint.close()
            owner.close()
            self._owned = None


def _connection_lost(exc: Exception) -> bool:
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(s in text for s in ("connection refused", "max retries", "operationalerror", "timed out"))


class ConsoleData:
    """The numbers behind every page."""

    def __init__(self, config: ConsoleConfig):
        from infra.status import StatusSampler

        self.config = config
        self.clickhouse = ClickHouseReader(config.clickhouse_url)
        self._sampler = StatusSampler(config.bootstrap_servers)
        self._sampler_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kafka-status")
        self._pending: Future | None = None
        self._retry_at = 0.0
        self._last_error = ""

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._sampler.close()
        self.clickhouse.close()

    # --- overview ------------------------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        """Kafka: records and rate per topic, lag per consumer group, DLQ records; ClickHouse:
        row counts and the latest dead letters with their reason and source coordinates."""
        counts = self.clickhouse.call(lambda c: run_dicts(c, COUNTS_SQL)[0])
        letters = self.clickhouse.call(run_dicts, dead_letters_sql(self.config.dead_letters_shown))
        return {"kafka": self._kafka(), "counts": counts, "dead_letters": letters, "at": time.time()}

    def _kafka(self) -> dict[str, Any]:
        """The sampler's latest answer, waiting `KAFKA_WAIT_S` at most: a broker that is down or
        restarting makes the page say so (and is asked again after `KAFKA_RETRY_S`), never hang."""
        with self._sampler_lock:
            now = time.monotonic()
            if self._pending is None and now >= self._retry_at:
                self._pending = self._pool.submit(self._sampler.sample)
            pending = self._pending
        if pending is None:
            return self._kafka_error(self._last_error)
        try:
            status = pending.result(timeout=KAFKA_WAIT_S)
        except FutureTimeout:
            return self._kafka_error(f"Kafka at {self.config.bootstrap_servers} is not answering yet")
        except Exception as exc:  # the broker is down or restarting: say so, keep the page
            with self._sampler_lock:
                self._pending, self._retry_at = None, time.monotonic() + KAFKA_RETRY_S
                self._last_error = f"Kafka at {self.config.bootstrap_servers} unreachable: {exc}"
            return self._kafka_error(self._last_error)
        with self._sampler_lock:
            self._pending = None
        topics = [
            {"topic": t, "records": n, "rate": status.rates.get(t)}
            for t, n in sorted(status.end_offsets.items())
        ]
        groups = [
            {
                "group": g.group,
                "topics": ", ".join(g.topics),
                "lag": g.lag,
                "rate": status.group_rates.get(g.group),
            }
            for g in status.groups
        ]
        return {"topics": topics, "groups": groups, "dlq": status.dlq_count, "error": None}

    @staticmethod
    def _kafka_error(message: str) -> dict[str, Any]:
        return {"topics": [], "groups": [], "dlq": None, "error": message}

    # --- trajectories --------------------------------------------------------------------------

    def trajectories(self, query: dict[str, str]) -> dict[str, Any]:
        page_filter = parse_filter(query, page_size=self.config.page_size)
        return {"filter": page_filter, **self.clickhouse.call(trajectory_page, page_filter)}

    def trajectory(self, trajectory_id: str, reward_version: str | None = None) -> dict[str, Any] | None:
        if not trajectory_id or len(trajectory_id) > 200:
            return None
        version = (reward_version or "").strip() or None
        return self.clickhouse.call(trajectory_detail, trajectory_id, version)

    # --- leaderboard and training --------------------------------------------------------------

    def leaderboard(self, query: dict[str, str]) -> dict[str, Any]:
        by = query.get("by") or "model"
        if by not in BY_CHOICES:
            raise FilterError("by", by, f"must be one of {', '.join(BY_CHOICES)}")
        domain = (query.get("domain") or "").strip() or None
        since = (query.get("since") or "").strip() or None
        if since is not None:
            _check_day(since)
        requested = (query.get("reward_version") or "").strip() or None
        choice, rows = self.clickhouse.call(
            lambda c: leaderboard_report(
                lambda sql: run(c, sql), by, domain, since, BOOTSTRAP_RESAMPLES, requested
            )
        )
        known = self.clickhouse.call(lambda c: reward_versions(lambda sql: run(c, sql)))
        by_step = self.clickhouse.call(run_dicts, reward_by_step_sql(domain))
        version = {**choice.as_dict(), "text": choice.describe(), "requested": requested}
        return {
            "by": by, "domain": domain, "since": since, "rows": rows, "reward_by_step": by_step,
            "version": version, "versions": [k["reward_version"] for k in known],
        }  # fmt: skip

    def training(self) -> dict[str, Any]:
        return self.clickhouse.call(training_page)

    def lineage(self, version: str) -> dict[str, Any] | None:
        """What trained `version` (`agentstream lineage`'s walk); None for an unknown version."""
        from clients.clickhouse import ClickHouseError
        from infra.lineage import collect

        if not version or len(version) > 200:
            return None
        try:
            return self.clickhouse.call(lambda c: collect(lambda sql: run_dicts(c, sql), version))
        except ClickHouseError as exc:
            if "not in" in str(exc):
                return None
            raise


def _check_day(text: str) -> None:
    """`since` of the leaderboard: a day ClickHouse's Date holds (it would saturate any other)."""
    from datetime import date

    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise FilterError("since", text, "must be a day, e.g. 2026-11-25") from None
    if not EARLIEST.date() <= day <= LATEST.date():
        raise FilterError("since", text, f"must be from {EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d}")
