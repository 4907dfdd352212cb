"""Connect to ClickHouse from a URL: the only thing that differs between embedded and at-scale runs.

- `http://host:8123` (or https): a ClickHouse server, through `clickhouse_connect.get_client`.
- `chdb:///abs/path`: embedded chDB through clickhouse-connect's own chDB backend. chDB locks its data
  directory to one process, so the process that owns it (the sink, or `agentstream db serve`) also
  serves it over a loopback ClickHouse-HTTP endpoint (`clients.clickhouse.endpoint`). `connect` looks
  for that endpoint first and, when it is alive, returns an ordinary HTTP client to it, with the
  credential of the role asked for (`reader` unless told: the engine refuses its writes, see
  `endpoint`) read from the owner's key file. Callers get the same clickhouse-connect `Client`
  (`query`, `insert`, `command`) either way.

This module opens connections; it does not create tables (see `migrate`).
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urlparse

from clients.clickhouse import ClickHouseError
from clients.clickhouse.endpoint import Endpoint, EndpointKeys, endpoint_file, key_file, with_credential
from clients.clickhouse.engine import ReaderLimits

log = logging.getLogger(__name__)


def chdb_path(url: str) -> str | None:
    """The data directory of a `chdb://` URL, or None for a server URL.

    >>> chdb_path("chdb:///var/lib/agentstream/clickhouse")
    '/var/lib/agentstream/clickhouse'
    >>> chdb_path("http://localhost:8123") is None
    True
    """
    parsed = urlparse(url)
    if parsed.scheme != "chdb":
        return None
    path = unquote(parsed.netloc + parsed.path) if parsed.netloc else unquote(parsed.path)
    if not path or path in ("memory", ":memory:"):
        raise ClickHouseError(f"clickhouse_url {url!r}: an on-disk path is required, e.g. chdb:///abs/path")
    return path


def live_endpoint(path: str, role: str = "reader") -> str | None:
    """The DSN (URL with `role`'s credential: never log it) of the process serving chDB data `path`,
    if one is alive and its key file is readable."""
    file = endpoint_file(path)
    try:
        info = json.loads(file.read_text())
        keys = json.loads(key_file(path).read_text())
    except (FileNotFoundError, PermissionError, ValueError):
        return None
    if not _pid_alive(int(info.get("pid", 0))) or not _pings(info.get("url", "")):
        return None
    if not isinstance(keys.get(role), str):
        raise ClickHouseError(f"role {role!r}: the endpoint of {path} has no such role (reader, writer)")
    return with_credential(info["url"], role, keys[role])


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pings(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ping", timeout=timeout_s) as response:
            return response.status == 200
    except OSError:
        return False


def connect(url: str, *, wait_s: float = 0.0, data_dir: object = None, role: str = "reader", **kwargs):
    """A clickhouse-connect client for `url` (see module docstring). `wait_s` retries while an
    embedded path is locked by a process that does not serve it yet (it is starting up).
    `role` is what a served embedded path lets the client do: `reader` (the engine refuses writes,
    with server-side time and memory limits) or `writer` (the sink, migrations). A client that
    opens the path itself owns it and may do anything; a server URL carries its own user.
    `data_dir` is accepted for callers that hold one; the endpoint is found from the URL alone."""
    import clickhouse_connect

    if role not in EndpointKeys.ROLES:
        raise ClickHouseError(f"role {role!r}: expected one of {', '.join(EndpointKeys.ROLES)}")
    path = chdb_path(url)
    if path is None:
        return _server_client(url, **kwargs)
    deadline = time.monotonic() + wait_s
    while True:
        served = live_endpoint(path, role)
        if served:
            return clickhouse_connect.get_client(dsn=served, **kwargs)
        if _locked_elsewhere(path) and time.monotonic() < deadline:
            time.sleep(0.2)  # its owner is starting; opening it now would only print chDB's lock error
            continue
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
            return clickhouse_connect.get_client(dsn=f"chdb://{os.path.realpath(path)}", **kwargs)
        except Exception as exc:  # chDB reports a lock held by another process as a generic error
            if time.monotonic() >= deadline:
                raise ClickHouseError(
                    f"clickhouse_url {url!r}: cannot open the chDB data directory ({exc}); is another "
                    "process using it without serving it (start it with `agentstream sink` or "
                    "`agentstream db serve`)?"
                ) from exc
            time.sleep(0.2)


def _locked_elsewhere(path: str) -> bool:
    """Whether another open of the chDB directory holds ClickHouse's lock on its `status` file."""
    import fcntl

    try:
        fd = os.open(os.path.join(path, "status"), os.O_RDONLY)
    except OSError:
        return False  # no status file: nobody has opened it yet
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _server_client(url: str, **kwargs):
    import clickhouse_connect

    try:
        return clickhouse_connect.get_client(dsn=url, **kwargs)
    except Exception as exc:
        raise ClickHouseError(f"clickhouse_url {url!r}: cannot connect ({exc})") from exc


def open_and_serve(
    url: str, *, wait_s: float = 30.0, port: int = 0, prepare=None, limits: ReaderLimits | None = None
):
    """Connect as the owner: for an embedded path nobody serves yet, open it and serve it over HTTP
    (readers under `limits`); when another process serves it, connect to it as a writer.

    `prepare(client)` (e.g. `migrate`) runs before the endpoint is advertised, so no reader finds a
    served path whose tables do not exist yet. Returns `(client, endpoint_or_None)`; close the
    endpoint (if any) after the client.
    """
    path = chdb_path(url)
    client = connect(url, wait_s=wait_s, role="writer")
    if prepare is not None:
        prepare(client)
    if path is None or not _is_chdb(client):
        return client, None
    endpoint = Endpoint(path, port=port, limits=limits).start()
    return client, endpoint


def _is_chdb(client) -> bool:
    return type(client).__name__ == "ChdbClient"
