"""A minimal ClickHouse-HTTP-compatible endpoint in front of an embedded chDB data path.

Why: chDB runs ClickHouse inside one process and locks its data directory (`status` file), so a
second process cannot open the same `chdb:///path` while the sink writes to it. The process that
owns the path (the sink, or `agentstream db serve`) exposes the engine here on 127.0.0.1, and
writes the address to an endpoint file beside the data directory. `clients.clickhouse.client.connect`
finds that file and talks to the endpoint with clickhouse-connect's ordinary HTTP client, so every
caller runs the same code whether the URL is `chdb:///path` or `http://host:8123`.

Who may use it: every request but `GET /ping` carries a credential in a header (HTTP Basic, or
`X-ClickHouse-User` / `X-ClickHouse-Key`), never in the URL. The owner generates two keys, `reader`
and `writer`, in `<path>.endpoint.key` (mode 0600, beside the endpoint file, which holds no key).
A writer runs anything on the owner's session. A reader runs on a second chDB session opened with
`readonly=1` and server-side limits (`ReaderLimits`; the sessions are clients/clickhouse/engine.py),
so the engine itself refuses writes, DDL, table functions and settings changes and cancels a query
past its time or memory limit; what that session does not refuse (`INTO OUTFILE`, `file()`, several
statements, `DESCRIBE url(...)`) is refused on the engine's canonical text of the query
(clients/clickhouse/statement.py). Each session has its own lock, so a
reader's query never delays a writer's insert. A browser cannot use it: the Host header must name
the loopback address, a request with `Origin` or `Sec-Fetch-*` headers (a web page's) is refused,
form content types are refused, and a cross-origin page cannot send the credential header without
a CORS preflight, which is refused (no `Access-Control-*` is ever sent).

What it speaks (the subset clickhouse-connect and curl use): `GET /ping`; `POST /` with the
statement in the `query` parameter and/or the body; `INSERT ... FORMAT <fmt>` followed by data in the
body (optionally Content-Encoding lz4/zstd/gzip/deflate); `database`, `default_format` and
`param_<name>` query-parameter bindings; ClickHouse-style errors (HTTP 500, `X-ClickHouse-Exception-Code`,
`Code: N. DB::Exception: ...` body). Per-request server settings are accepted and ignored (the
session's settings apply; a reader cannot lift its limits). It must never bind a non-loopback address.
"""

from __future__ import annotations

import base64
import gzip
import hmac
import json
import logging
import os
import re
import secrets
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlparse

from clients.clickhouse.engine import EmbeddedEngine, ReaderLimits, Statement

log = logging.getLogger(__name__)

ENDPOINT_SUFFIX = ".endpoint.json"
KEY_SUFFIX = ".endpoint.key"
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
    """Where the owner of chDB data path `path` advertises its HTTP endpoint (no credential in it)."""
    path = Path(os.path.realpath(path))
    return path.with_name(path.name + ENDPOINT_SUFFIX)


def key_file(path: str | Path) -> Path:
    """Where the owner of chDB data path `path` keeps the endpoint's keys (mode 0600)."""
    path = Path(os.path.realpath(path))
    return path.with_name(path.name + KEY_SUFFIX)


def with_credential(url: str, role: str, key: str) -> str:
    """
    >>> with_credential("http://127.0.0.1:8123", "reader", "k")
    'http://reader:k@127.0.0.1:8123'
    """
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{role}:{quote(key, safe='')}@{rest}"


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


class _Handler(BaseHTTPRequestHandler):
    server: _EndpointServer
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: the reply goes out as headers, then body, on a kept-alive connection; with Nagle's
    # algorithm the body of a small reply waits for the client's delayed ACK of the headers, 40 ms on
    # Linux. Measured through clickhouse-connect: `SELECT 1` 44.6 ms -> 1.5 ms per query.
    disable_nagle_algorithm = True
    # Seconds a connection may stay silent (slow headers, a body that stops, an idle keep-alive):
    # then it is closed, so slow clients cannot hold the server's threads; clients reconnect.
    timeout = 30

    def log_message(self, format: str, *args) -> None:
        log.debug("http %s", format % args)

    def do_GET(self) -> None:
        if self._refused_browser():
            return
        if urlparse(self.path).path in ("/ping", "/ping/"):
            return self._reply(200, b"Ok.\n", {})
        self._refuse(405, "only POST runs a query (GET answers /ping only)", {"Allow": "POST"})

    def do_POST(self) -> None:
        if self._refused_browser():
            return
        self._handle()

    def do_OPTIONS(self) -> None:
        # a CORS preflight: refused, with no Access-Control-* header, so no page may send the request
        self._refuse(403, "cross-origin requests are refused")

    def _refused_browser(self) -> bool:
        """Refuse what a web page can send: a foreign Host (DNS rebinding), a browser's request."""
        hosts = self.headers.get_all("Host") or []
        host = hosts[0].lower() if len(hosts) == 1 else ""
        if not self.path.startswith("/"):  # absolute-form (`POST http://evil/`): a proxy's request
            self._refuse(400, "the request target must be a path (origin-form)")
            return True
        if host not in self.server.allowed_hosts:  # none, several, or a foreign one
            self._refuse(
                403,
                f"Host {hosts!r} is refused (allowed: one of {', '.join(sorted(self.server.allowed_hosts))})",
            )
            return True
        if self.headers.get("Origin") is not None or any(
            h.lower().startswith("sec-fetch-") for h in self.headers
        ):
            self._refuse(403, "requests from a web page (Origin / Sec-Fetch-* headers) are refused")
            return True
        return False

    def _handle(self) -> None:
        url = urlparse(self.path)
        if url.path not in ("", "/"):
            return self._refuse(404, f"no handler for {url.path}")
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type not in ("", "text/plain", "application/octet-stream"):
            return self._refuse(
                415, f"Content-Type {content_type!r} is refused (form bodies are not queries)"
            )
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        if "password" in params or "user" in params:
            return self._refuse(403, "credentials in the URL are refused: send them in a header")
        role = self.server.keys.role_of(self.headers)
        if role is None:
            return self._refuse(
                401, "a reader or writer credential is required", {"X-ClickHouse-Exception-Code": "516"}
            )
        try:
            raw_body = self._read_body()
        except ValueError as exc:
            return self._refuse(400, str(exc))
        try:
            body = decompress(raw_body, self.headers.get("Content-Encoding"))
            statement = parse_request(
                params.get("query", ""), body, params.get("default_format", "TabSeparated")
            )
            binds = {k[6:]: v for k, v in params.items() if k.startswith("param_")}
            output = self.server.engine.execute(statement, params.get("database"), binds, role)
        except Exception as exc:
            return self._error(exc)
        headers = {"X-ClickHouse-Summary": json.dumps({"read_rows": "0", "written_rows": "0"})}
        if output or statement.insert_data is None:
            headers["X-ClickHouse-Format"] = statement.fmt
        self._reply(200, output, headers)

    def _refuse(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        self.close_connection = True  # the body, if any, was not read
        self._reply(status, f"{reason}\n".encode(), headers or {})

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        text = (self.headers.get("Content-Length") or "0").strip()
        if not (text.isascii() and text.isdigit()):
            raise ValueError(f"Content-Length {text[:40]!r} is not a byte count")
        length = int(text)
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        parts = []
        while True:
            line = self.rfile.readline(1024).split(b";")[0].strip() or b"0"
            try:
                size = int(line, 16)
            except ValueError:
                raise ValueError(f"chunk size {line[:40]!r} is not hexadecimal") from None
            if size < 0:
                raise ValueError(f"chunk size {line[:40]!r} is negative")
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


class EndpointKeys:
    """The reader and writer keys of one served path, kept in `<path>.endpoint.key` (mode 0600)."""

    ROLES = ("reader", "writer")

    def __init__(self, keys: dict[str, str]):
        self.keys = keys

    @classmethod
    def load_or_create(cls, file: Path) -> EndpointKeys:
        """The keys in `file`, created first when missing (kept across restarts, so a client that
        outlives the server, like a sink writing through `db serve`, reconnects with them)."""
        try:
            keys = json.loads(file.read_text())
            if all(isinstance(keys.get(role), str) and len(keys[role]) >= 32 for role in cls.ROLES):
                os.chmod(file, 0o600)
                return cls(keys)
        except (FileNotFoundError, ValueError):
            pass
        keys = {role: secrets.token_urlsafe(32) for role in cls.ROLES}
        tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(keys, out)
        os.replace(tmp, file)
        return cls(keys)

    def role_of(self, headers) -> str | None:
        """The role whose key the request carries (Basic auth or X-ClickHouse-User/-Key), or None."""
        user, key = headers.get("X-ClickHouse-User"), headers.get("X-ClickHouse-Key")
        auth = headers.get("Authorization") or ""
        if auth[:6].lower() == "basic ":
            try:
                user, _, key = base64.b64decode(auth[6:].strip(), validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
        expected = self.keys.get(user or "")
        if expected and key and hmac.compare_digest(expected.encode(), key.encode()):
            return user
        return None


class _EndpointServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], engine: EmbeddedEngine, keys: EndpointKeys):
        self.engine = engine
        self.keys = keys
        super().__init__(address, _Handler)
        port = self.server_address[1]
        self.allowed_hosts = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}


class Endpoint:
    """The running endpoint: `.url` is its address (no credential), `.dsn(role)` what
    clickhouse-connect connects with; `close()` stops it."""

    def __init__(
        self, path: str | Path, host: str = "127.0.0.1", port: int = 0, limits: ReaderLimits | None = None
    ):
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"host {host!r}: the embedded endpoint only binds loopback addresses")
        self.engine = EmbeddedEngine(path, limits)
        self.keys = EndpointKeys.load_or_create(key_file(path))
        self._server = _EndpointServer((host, port), self.engine, self.keys)
        self.host, self.port = self._server.server_address[:2]
        self.url = f"http://{self.host}:{self.port}"
        self._file = endpoint_file(path)
        self._thread = threading.Thread(target=self._server.serve_forever, name="chdb-http", daemon=True)

    def dsn(self, role: str = "reader") -> str:
        """The URL with `role`'s credential in it: pass it to clickhouse-connect, never log it."""
        return with_credential(self.url, role, self.keys.keys[role])

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
