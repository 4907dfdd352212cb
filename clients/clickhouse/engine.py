"""The chDB sessions behind the embedded endpoint (clients/clickhouse/endpoint.py): the owner's
writer session and a reader session that the engine itself keeps read-only and inside
`ReaderLimits`. This module runs statements; it does not speak HTTP or check credentials.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Statement:
    """One request, parsed: the SQL to run, the output format, and insert data if any."""

    sql: str
    fmt: str
    insert_data: bytes | None = None


@dataclass(frozen=True)
class ReaderLimits:
    """What the engine enforces on a reader's session: it cancels the query past these and frees it."""

    max_execution_time_s: int = 30
    max_memory_usage: int = 2 * 1024**3
    max_result_bytes: int = 1024**3
    # half the cores at most: a reader's scan must leave the writer's inserts a core
    max_threads: int = field(default_factory=lambda: max(1, (os.cpu_count() or 2) // 2))

    def connection_suffix(self) -> str:
        """chDB connection-string settings of the reader's session (`readonly=1`: nothing can lift them).

        `join_use_nulls=1` too: the project's views are written for it (`SETTINGS join_use_nulls = 1`
        in their definitions), and under `readonly=1` the engine ignores a view's own SETTINGS, so an
        unmatched LEFT JOIN column would read as its type's default (a replay "completed" in 1970).

        >>> ReaderLimits(5, 100, 10, 1).connection_suffix()
        '?readonly=1&join_use_nulls=1&max_execution_time=5&max_memory_usage=100&max_result_bytes=10&max_threads=1'
        """
        return (
            f"?readonly=1&join_use_nulls=1&max_execution_time={self.max_execution_time_s}"
            f"&max_memory_usage={self.max_memory_usage}&max_result_bytes={self.max_result_bytes}"
            f"&max_threads={self.max_threads}"
        )


class ReaderRefused(Exception):
    """A reader asked for something only a writer may do (ClickHouse's READONLY, code 164)."""

    def __init__(self, reason: str):
        super().__init__(f"Code: 164. DB::Exception: {reason}. (READONLY)")


class SessionOutOfStep(Exception):
    """A chDB session still hands back a failed query's output; nothing runs on it until it does not."""


class _Session:
    """One chDB connection, serialised by its own lock (a chDB connection is not thread-safe).

    Why `run` and not `conn.query`: when a query fails while writing its output (a memory limit hit
    by the output format), chDB 4.4 keeps what was written (a `...WithNames` header, a JSON prefix)
    and returns it ahead of the next query's own output. A reader chose that text (a column name),
    it came back as the next query's canonical text and ran as two statements the check read as one
    (INTO OUTFILE; `file()` of the key file).
    After any failure the session is drained: a query must answer exactly its random marker before
    another runs."""

    DRAIN_TRIES = 3

    def __init__(self, spec: str):
        import chdb

        self.conn = chdb.connect(spec)
        self.lock = threading.Lock()
        self.database: str | None = None
        self.dirty = False

    def run(self, sql: str, fmt: str, params: dict[str, str] | None = None) -> bytes:
        """`sql`'s output and nothing else (call with `lock` held)."""
        if self.dirty:
            self._drain()
        try:
            return self.conn.query(sql, fmt, params=params or {}).bytes() or b""
        except BaseException:
            self.dirty = True
            raise

    def _drain(self) -> None:
        for _ in range(self.DRAIN_TRIES):
            marker = secrets.token_hex(8)
            try:
                out = self.conn.query(f"SELECT '{marker}'", "TabSeparatedRaw").bytes()
            except Exception:
                continue
            if out == f"{marker}\n".encode():
                self.dirty = False
                return
        raise SessionOutOfStep(
            f"Code: 1002. DB::Exception: the chDB session still returns a failed query's output after "
            f"{self.DRAIN_TRIES} tries; retry later"
        )

    def use(self, database: str | None) -> None:
        if database and database != self.database:
            self.run(f"USE `{database.replace('`', '')}`", "TabSeparated")
            self.database = database


class EmbeddedEngine:
    """The writer's chDB session on `path` and a read-only one under `ReaderLimits`."""

    def __init__(self, path: str | Path, limits: ReaderLimits | None = None):
        self.path = os.path.realpath(path)
        self.limits = limits or ReaderLimits()
        self._writer = _Session(self.path)
        self._reader = _Session(self.path + self.limits.connection_suffix())
        self._canonical: dict[str, str] = {}  # reader query text -> the engine's canonical text

    def execute(
        self, statement: Statement, database: str | None, params: dict[str, str], role: str = "writer"
    ) -> bytes:
        if role != "writer":
            return self._read(statement, database, params)
        session = self._writer
        with session.lock:
            session.use(database)
            if statement.insert_data is not None:
                return self._insert(statement)
            return session.run(statement.sql, statement.fmt, params)

    def _read(self, statement: Statement, database: str | None, params: dict[str, str]) -> bytes:
        if statement.insert_data is not None:
            raise ReaderRefused("INSERT is refused for a reader")
        session = self._reader
        with session.lock:
            session.use(database or "default")  # one reader's `database` is not the next one's
            sql = self._checked(statement.sql)
            return session.run(sql, statement.fmt, params)

    def _checked(self, sql: str) -> str:
        """The engine's canonical text of a reader's `sql`, refused unless a reader may run it."""
        from clients.clickhouse.statement import format_query_sql, reader_refusal

        canonical = self._canonical.get(sql)
        if canonical is None:
            # the marker proves that the text is this formatQuery's answer and nothing else's
            marker = secrets.token_hex(8)
            out = self._reader.run(format_query_sql(sql, marker), "TabSeparatedRaw").decode()
            if not out.startswith(marker):
                self._reader.dirty = True
                raise SessionOutOfStep("Code: 1002. DB::Exception: the chDB session is out of step; retry")
            canonical = out[len(marker) :].rstrip("\n")
            if len(self._canonical) >= 1024:
                self._canonical.clear()
            self._canonical[sql] = canonical
        reason = reader_refusal(canonical)
        if reason:
            raise ReaderRefused(reason)
        return canonical

    def _insert(self, statement: Statement) -> bytes:
        with tempfile.NamedTemporaryFile(suffix=".data", delete=False) as tmp:
            tmp.write(statement.insert_data or b"")
        try:
            quoted = tmp.name.replace("\\", "\\\\").replace("'", "\\'")
            self._writer.run(f"{statement.sql} FROM INFILE '{quoted}' FORMAT {statement.fmt}", "TabSeparated")
        finally:
            os.unlink(tmp.name)
        return b""

    def close(self) -> None:
        for session in (self._reader, self._writer):
            with session.lock:
                session.conn.close()
