"""ClickHouseSink: buffered, columnar inserts through clickhouse-connect (chDB or a server alike).

Retryable failures (the server or endpoint unreachable) are retried with exponential backoff for up to
`max_retry_s`, then raised so the worker exits non-zero with its offsets uncommitted (no loss). A
failed batch that is retried may have been partly written: ReplacingMergeTree deduplicates it. A
batch refused for its data is re-tried row by row; rows refused on their own are returned as
`Rejected` (the runner sends them to the DLQ). If every row of a table is refused by the server and
the table no longer has the columns written to, the problem is the table, not the rows: that is
raised, never dead-lettered.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

from clients.clickhouse import DATABASE
from consumers.errors import SinkError
from consumers.sink.base import Rejected, Sink
from consumers.sink.rows import COLUMNS
from schemas.records import Record

log = logging.getLogger(__name__)


class SinkUnavailable(SinkError):
    """ClickHouse stayed unreachable for longer than the retry budget (the worker exits 1)."""


def is_retryable(exc: BaseException) -> bool:
    """Connection-level failures are worth retrying; data and schema errors are not."""
    from clickhouse_connect.driver.exceptions import OperationalError

    return isinstance(exc, OperationalError | ConnectionError | TimeoutError)


def is_server_refusal(exc: BaseException) -> bool:
    """The server refused the statement (not a value the client could not serialise)."""
    from clickhouse_connect.driver.exceptions import DatabaseError, DataError

    return isinstance(exc, DatabaseError) and not isinstance(exc, DataError) and not is_retryable(exc)


Buffered = dict[str, tuple[list[tuple], list[Record]]]


class ClickHouseSink(Sink):
    """Buffers rows per table and inserts each table's rows as one columnar insert."""

    def __init__(
        self,
        client,
        *,
        database: str = DATABASE,
        max_retry_s: float = 300.0,
        backoff_s: float = 0.2,
    ):
        self.client = client
        self.database = database
        self.max_retry_s = max_retry_s
        self.backoff_s = backoff_s
        self._rows: dict[str, list[tuple]] = defaultdict(list)
        self._sources: dict[str, list[Record]] = defaultdict(list)
        self._contexts: dict[str, object] = {}
        self.rows_written = 0

    @property
    def pending(self) -> int:
        return sum(len(rows) for rows in self._rows.values())

    def add(self, table: str, row: tuple, source: Record) -> None:
        self._rows[table].append(row)
        self._sources[table].append(source)

    def take(self) -> Buffered:
        """Hand over everything buffered (to write, possibly on another thread) and start afresh."""
        taken = {
            table: (self._rows[table], self._sources[table]) for table in self._rows if self._rows[table]
        }
        self._rows, self._sources = defaultdict(list), defaultdict(list)
        return taken

    def write(self, batch: Buffered) -> list[Rejected]:
        """Insert a taken batch, one columnar insert per table; returns the rows refused for good."""
        rejected: list[Rejected] = []
        for table, (rows, sources) in batch.items():
            rejected += self._write_table(table, rows, sources)
        return rejected

    def flush(self) -> list[Rejected]:
        return self.write(self.take())

    def _write_table(self, table: str, rows: list[tuple], sources: list[Record]) -> list[Rejected]:
        try:
            self._insert_with_retry(table, rows)
        except SinkUnavailable:
            raise
        except Exception as exc:
            log.warning("insert into %s refused (%s); retrying %d rows one by one", table, exc, len(rows))
            return self._write_one_by_one(table, rows, sources)
        self.rows_written += len(rows)
        return []

    def _write_one_by_one(self, table: str, rows: list[tuple], sources: list[Record]) -> list[Rejected]:
        rejected, refusals = [], []
        for row, source in zip(rows, sources, strict=True):
            try:
                self._insert_with_retry(table, [row])
                self.rows_written += 1
            except SinkUnavailable:
                raise
            except Exception as exc:
                refusals.append(exc)
                rejected.append(
                    Rejected(table, source, f"insert into {table} failed: {exc}", type(exc).__name__)
                )
        every_row = refusals and len(refusals) == len(rows) and all(is_server_refusal(e) for e in refusals)
        if every_row and not self._table_answers(table):
            raise refusals[0]  # the table itself is broken: stop rather than dead-letter everything
        for item in rejected:
            log.error(
                "unwritable row for %s topic=%s partition=%d offset=%d: %s",
                table,
                item.source.topic,
                item.source.partition,
                item.source.offset,
                item.reason,
            )
        return rejected

    def _table_answers(self, table: str) -> bool:
        """Whether `table` still has every column the rows are written to. Why: when every row of a
        batch was refused, a broken table must stop the sink, but rows that are poison on their own
        (a batch of one poison record) must be dead-lettered, or they stop it at every restart."""
        columns = ", ".join(f"`{c}`" for c in COLUMNS[table])
        try:
            self.client.query(f"SELECT {columns} FROM `{self.database}`.`{table}` LIMIT 0")
        except Exception as exc:
            log.error("table %s does not answer (%s): its inserts are not the rows' fault", table, exc)
            return False
        return True

    def _insert_with_retry(self, table: str, rows: list[tuple]) -> None:
        deadline = time.monotonic() + self.max_retry_s
        delay = self.backoff_s
        while True:
            try:
                self._insert(table, rows)
                return
            except Exception as exc:
                if not is_retryable(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    raise SinkUnavailable(
                        f"ClickHouse unavailable for {self.max_retry_s:.0f}s: {exc}"
                    ) from exc
                log.warning("ClickHouse unavailable (%s); retrying %s insert in %.1fs", exc, table, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _insert(self, table: str, rows: list[tuple]) -> None:
        context = self._contexts.get(table)
        if context is None:
            context = self.client.create_insert_context(
                table=table, database=self.database, column_names=list(COLUMNS[table])
            )
            self._contexts[table] = context
        context.data = rows
        try:
            self.client.insert(context=context)
        except Exception:
            self._contexts.pop(table, None)  # rebuild it: a failed insert can leave it half-used
            raise

    def close(self) -> None:
        self.client.close()
