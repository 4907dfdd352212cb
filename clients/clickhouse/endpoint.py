"""A minimal ClickHouse-HTTP-compatible endpoint in front of an embedded chDB data path.

Why: chDB runs ClickHouse inside one process and locks its data directory (`status` file), so a
second process cannot open the same `chdb:///path` while the sink writes to it. The process that
owns the path (the sink, or `agentstream db serve`) exposes the engine here on 127.0.0.1, and
writes the address to an endpoint file beside the data directory. `clients.clickhouse.client.connect`
finds that file and talks to the endpoint with clickhouse-connect's ordinary HTTP client, so every
caller runs the same code whether the URL is `chdb:///path` or `http://host:8123`.

What it speaks (the subset clickhouse-connect and curl use): `GET /ping`; `GET|POST /` with the
statement in the `query` parameter and/or the body; `INSERT ... FORMAT <fmt>` followed by data in the
body (optionally Content-Encoding lz4/zstd/gzip/deflate); `database`, `default_format` and
`param_<name>` query-parameter bindings; ClickHouse-style errors (HTTP 500, `X-ClickHouse-Exception-Code`,
`Code: N. DB::Exception: ...` body). Per-request server settings are accepted and ignored (the
embedded engine's defaults apply). It must never bind a non-loopback address.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import tempfile
import threading
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlparse

log = logging.getLogger(__name__)

ENDPOINT_SUFFIX = ".endpoint.json"
_INSERT_DATA = re.compile(
    rb"^\s*(INSERT\s+INTO\s+.+?)\s+FORMAT\s+([A-Za-z0-9_]+)[ \t]*\r?\n?", re.IGNORECASE | re.DOTALL
)
_TRAILING_FORMAT = re.compile(r"\bFORMAT\s+([A-Za-z0-9_]+)\s*;?\s*$", re.IGNORECASE)
_ERROR_CODE = re.compile(r"Code:\s*(\d+)")
# Parameters that steer the HTTP exchange rather than the query.
_TRANSPORT_PARAMS = {
    "query",
    "database",
    "default_format",
    "query_id",
    "session_id",
    "session_timeout",
    "session_check",
    "compress",
    "decompress",
    "enable_http_compression",
    "wait_end_of_query",
    "send_progress_in_http_headers",
    "http_headers_progress_interval_ms",
    "client_protocol_version",
    "user",
    "password",
}


def endpoint_file(path: str | Path) -> Path:
    """Where the owner of chDB data path `path` advertises its HTTP endpoint."""
    path = Path(os.path.realpath(path))
    return path.with_name(path.name + ENDPOINT_SUFFIX)


@dataclass(frozen=True)
class Statement:
    """One request, parsed: the SQL to run, the output format, and insert data if any."""

    sql: str
    fmt: str
    insert_data: bytes | None = None


def parse_request(query_param: str, body: bytes, default_format: str = "TabSeparated") -> Statement:
    """Split a ClickHouse HTTP request into SQL, output format and insert data.

    >>> parse_request("", b"INSERT INTO t (a) FORMAT CSV\\n1\\n2\\n")
    Statement(sql='INSERT INTO t (a)', fmt='CSV', insert_data=b'1\\n2\\n')
    >>> parse_request("SELECT 1 FORMAT JSON", b"").fmt
    'JSON'
    """
    text = query_param.encode() + (b"\n" if query_param and body else b"") + body
    match = _INSERT_DATA.match(text)
    if match:
        return Statement(match.group(1).decode(), match.group(2).decode(), text[match.end() :])
    sql = text.decode("utf-8").strip().rstrip(";")
    found = _TRAILING_FORMAT.search(sql)
    return Statement(sql, found.group(1) if found else default_format)


def decompress(body: bytes, encoding: str | None) -> bytes:
    """Undo the request's Content-Encoding (what clickhouse-connect may send for inserts)."""
    encoding = (encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    if encoding == "lz4":
        import lz4.frame

        return lz4.frame.decompress(body)
    if encoding == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    raise ValueError(f"Content-Encoding {encoding!r} is not supported (use lz4, zstd, gzip or deflate)")


class EmbeddedEngine:
    """One chDB connection on `path`, serialised by a lock (a chDB connection is not thread-safe)."""

    def __init__(self, path: str | Path):
        import chdb

        self.path = os.path.realpath(path)
        self._conn = chdb.connect(self.path)
        self._lock = threading.Lock()
        self._database: str | None = None

    def execute(self, statement: Statement, database: str | None, params: dict[str, str]) -> bytes:
        with self._lock:
            self._use(database)
            if statement.insert_data is not None:
                return self._insert(statement)
            result = self._conn.query(statement.sql, statement.fmt, params=params)
            return result.bytes() or b""

    def _use(self, database: str | None) -> None:
        if database and database != self._database:
            self._conn.query(f"USE `{database.replace('`', '')}`", "TabSeparated")
            self._database = database

    def _insert(self, statement: Statement) -> bytes:
        with tempfile.NamedTemporaryFile(suffix=".data", delete=False) as tmp:
            tmp.write(statement.insert_data or b"")
        try:
            quoted = tmp.name.replace("\\", "\\\\").replace("'", "\\'")
            self._conn.query(f"{statement.sql} FROM INFILE '{quoted}' FORMAT {statement.fmt}", "TabSeparated")
        finally:
            os.unlink(tmp.name)
        return b""

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class _Handler(BaseHTTPRequestHandler):
    server: _EndpointServer
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: the reply goes out as headers, then body, on a kept-alive connection; with Nagle's
    # algorithm the body of a small reply waits for the client's delayed ACK of the headers, 40 ms on
    # Linux. Measured through clickhouse-connect: `SELECT 1` 44.6 ms -> 1.5 ms per query.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args) -> None:
        log.debug("http %s", format % args)

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def _handle(self) -> None:
        url = urlparse(self.path)
        if url.path in ("/ping", "/ping/"):
            return self._reply(200, b"Ok.\n", {})
        if url.path not in ("", "/"):
            return self._reply(404, f"no handler for {url.path}\n".encode(), {})
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        try:
            body = decompress(self._read_body(), self.headers.get("Content-Encoding"))
            statement = parse_request(
                params.get("query", ""), body, params.get("default_format", "TabSeparated")
            )
            binds = {k[6:]: v for k, v in params.items() if k.startswith("param_")}
            output = self.server.engine.execute(statement, params.get("database"), binds)
        except Exception as exc:
            return self._error(exc)
        headers = {"X-ClickHouse-Summary": json.dumps({"read_rows": "0", "written_rows": "0"})}
        if output or statement.insert_data is None:
            headers["X-ClickHouse-Format"] = statement.fmt
        self._reply(200, output, headers)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        parts = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                self.rfile.readline()
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    def _error(self, exc: Exception) -> None:
        message = str(exc)
        code = _ERROR_CODE.search(message)
        code_text = code.group(1) if code else "1000"
        if not message.startswith("Code:"):
            message = f"Code: {code_text}. DB::Exception: {message}"
        self._reply(500, (message + "\n").encode(), {"X-ClickHouse-Exception-Code": code_text})

    def _reply(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=UTF-8")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("X-ClickHouse-Timezone", "UTC")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)


class _EndpointServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], engine: EmbeddedEngine):
        self.engine = engine
        super().__init__(address, _Handler)


class Endpoint:
    """The running endpoint: `.url` is what clickhouse-connect connects to; `close()` stops it."""

    def __init__(self, path: str | Path, host: str = "127.0.0.1", port: int = 0):
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"host {host!r}: the embedded endpoint only binds loopback addresses")
        self.engine = EmbeddedEngine(path)
        self._server = _EndpointServer((host, port), self.engine)
        self.host, self.port = self._server.server_address[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._file = endpoint_file(path)
        self._thread = threading.Thread(target=self._server.serve_forever, name="chdb-http", daemon=True)

    def start(self) -> Endpoint:
        self._thread.start()
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": self.url, "pid": os.getpid(), "path": self.engine.path}))
        tmp.replace(self._file)
        log.info("chDB %s served at %s", self.engine.path, self.url)
        return self

    def close(self) -> None:
        try:
            if json.loads(self._file.read_text()).get("pid") == os.getpid():
                self._file.unlink()
        except (FileNotFoundError, ValueError):
            pass
        self._server.shutdown()
        self._server.server_close()
        self.engine.close()

    def __enter__(self) -> Endpoint:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
