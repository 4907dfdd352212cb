"""The chDB endpoint tried as an attacker would (issue 34, items 5 and 6): no credential, a web
page's requests and DNS rebinding are refused; a reader cannot write, read or write files, or lift
its limits; the engine cancels a reader's runaway query without delaying the writer's inserts."""

from __future__ import annotations

import base64
import http.client
import json
import os
import secrets
import socket
import stat
import statistics
import threading
import time
from urllib.parse import urlparse

import pytest

from clients.clickhouse.client import chdb_path, connect, live_endpoint
from clients.clickhouse.endpoint import endpoint_file, key_file
from tests.support.counting_server import counting_server
from tests.support.db_serve import served_chdb

pytestmark = pytest.mark.integration

TIMEOUT_S = 2  # the reader's max_execution_time in this module


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A fresh chDB path served by `agentstream db serve` with short reader limits."""
    tmp = tmp_path_factory.mktemp("endpoint-security")
    with served_chdb(tmp, TIMEOUT_S) as url:
        writer = connect(url, role="writer")
        writer.command(
            "CREATE TABLE IF NOT EXISTS agentstream.probe (x UInt64) ENGINE = MergeTree ORDER BY x"
        )
        writer.close()
        yield url, tmp


def _raw(url: str, method: str, body: bytes = b"", headers: dict | None = None, path: str = "/"):
    """One HTTP request as a browser or curl would send it; returns (status, body)."""
    info = json.loads(endpoint_file(chdb_path(url)).read_text())
    address = urlparse(info["url"])
    conn = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        headers = {"Host": address.netloc, **(headers or {})}
        conn.request(method, path, body=body or None, headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


def _basic(url: str, role: str) -> dict:
    key = json.loads(key_file(chdb_path(url)).read_text())[role]
    return {"Authorization": "Basic " + base64.b64encode(f"{role}:{key}".encode()).decode()}


def test_the_key_file_is_private_and_the_endpoint_file_holds_no_key(served):
    url, _ = served
    keys = key_file(chdb_path(url))
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o600
    secret = json.loads(keys.read_text())
    advertised = endpoint_file(chdb_path(url)).read_text()
    assert secret["reader"] not in advertised and secret["writer"] not in advertised
    assert secret["reader"] != secret["writer"]


@pytest.mark.parametrize(
    "headers",
    [
        {},  # no credential at all: the curl repro
        {"Authorization": "Basic " + base64.b64encode(b"writer:guess").decode()},
        {"X-ClickHouse-User": "reader", "X-ClickHouse-Key": "guess"},
        {"Authorization": "Basic !!!not-base64"},
    ],
)
def test_a_request_without_the_key_is_refused(served, headers):
    url, tmp = served
    target = tmp / "no-key-outfile"
    query = f"SELECT 'x' INTO OUTFILE '{target}' FORMAT TSV".encode()
    status, _ = _raw(url, "POST", query, {"Content-Type": "text/plain", **headers})
    assert status == 401
    assert not target.exists()


def test_credentials_in_the_url_are_refused(served):
    url, _ = served
    key = json.loads(key_file(chdb_path(url)).read_text())["reader"]
    status, body = _raw(url, "POST", b"SELECT 1", path=f"/?user=reader&password={key}")
    assert status == 403 and "header" in body


def test_browser_shaped_requests_are_refused_even_with_the_key(served):
    url, _ = served
    reader = _basic(url, "reader")
    assert _raw(url, "GET", path="/?query=SELECT%201", headers=reader)[0] == 405
    form = {"Content-Type": "application/x-www-form-urlencoded", **reader}
    assert _raw(url, "POST", b"query=SELECT+1", form)[0] == 415
    multipart = {"Content-Type": "multipart/form-data; boundary=x", **reader}
    assert _raw(url, "POST", b"--x--", multipart)[0] == 415
    page = {"Content-Type": "text/plain", "Origin": "http://evil.example", **reader}
    assert _raw(url, "POST", b"SELECT 1", page)[0] == 403
    fetch = {"Content-Type": "text/plain", "Sec-Fetch-Site": "cross-site", **reader}
    assert _raw(url, "POST", b"SELECT 1", fetch)[0] == 403
    rebound = {"Content-Type": "text/plain", "Host": "evil.example:80", **reader}
    assert _raw(url, "POST", b"SELECT 1", rebound)[0] == 403
    assert _raw(url, "POST", b"SELECT 1", {"Host": "localhost.:1", **reader})[0] == 403  # trailing dot
    preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    status, _ = _raw(url, "OPTIONS", headers=preflight)
    assert status == 403
    # what held: the same request from clickhouse-connect's shape (no Origin, key in a header) runs
    assert _raw(url, "POST", b"SELECT 41 + 1", {"Content-Type": "text/plain", **reader}) == (200, "42\n")
    assert _raw(url, "GET", path="/ping")[0] == 200  # liveness needs no key and says nothing


def _socket_request(url: str, head: bytes, body: bytes = b"SELECT 1") -> str:
    """A request written byte for byte (what http.client will not send); returns the status line."""
    address = urlparse(json.loads(endpoint_file(chdb_path(url)).read_text())["url"])
    key = json.loads(key_file(chdb_path(url)).read_text())["reader"]
    auth = base64.b64encode(f"reader:{key}".encode())
    head = head.replace(b"{HOST}", address.netloc.encode())
    request = head + b"Authorization: Basic " + auth + b"\r\nContent-Length: %d\r\n" % len(body)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(request + b"Connection: close\r\n\r\n" + body)
        return sock.makefile("rb").readline().decode().strip()


def test_a_second_host_header_or_an_absolute_target_is_refused(served):
    """A proxy-shaped or smuggled request is not a local client's: found running with the key."""
    url, _ = served
    one = _socket_request(url, b"POST / HTTP/1.1\r\nHost: {HOST}\r\n")
    assert one.endswith("200 OK")  # what held: the same request, plainly written
    twice = _socket_request(url, b"POST / HTTP/1.1\r\nHost: {HOST}\r\nHost: evil.example\r\n")
    assert " 403 " in twice
    proxied = _socket_request(url, b"POST http://evil.example/ HTTP/1.1\r\nHost: {HOST}\r\n")
    assert " 400 " in proxied
    assert " 403 " in _socket_request(url, b"POST / HTTP/1.0\r\n")  # no Host at all


def test_a_reader_cannot_fetch_a_url_through_describe(served):
    """Found: `DESCRIBE url(...)` passed readonly=1 (the engine infers the schema by fetching the
    URL, and a JSONEachRow error quoted the body), as did `s3`; `mysql` held the reader for 30 s."""
    url, _ = served
    reader = _basic(url, "reader")
    with counting_server() as (base, hits):
        for query in (
            f"DESCRIBE TABLE url('{base}/a', 'CSVWithNames')",
            f"desc url('{base}/b')",
            f"DESCRIBE s3('{base}/bucket/c', 'CSV')",
            f"DESCRIBE TABLE url('{base}/d', 'JSONEachRow', headers('X-A' = 'b'))",
            f"EXPLAIN TABLE OVERRIDE s3('{base}/bucket/e', 'CSV') COLUMNS (c1 String)",
        ):
            status, body = _raw(url, "POST", query.encode(), {"Content-Type": "text/plain", **reader})
            assert status == 500 and "is refused for a reader" in body, (query, status, body)
        assert hits == []  # not one request left the endpoint
    status, body = _raw(url, "POST", b"DESCRIBE TABLE agentstream.probe", reader)
    assert (status, body.split("\t")[0]) == (200, "x")  # what held: DESCRIBE of a table


def test_a_failed_querys_output_never_reaches_the_next_query(served):
    """Found: when a query failed while writing its output (a memory limit hit by the format),
    chDB handed what it had written (here the header line, a column name the reader chose) to the
    next query; the endpoint then checked and ran that text, two statements hidden from the
    check, and the reader wrote a file (or read the key file) as the serving process."""
    url, tmp = served
    target = tmp / "stale-outfile"
    payload = f"SELECT 1 /* ' */; SELECT 'pwned' INTO OUTFILE '{target}'; /* ' */"
    alias = payload.replace("\\", "\\\\").replace("'", "\\'")
    # 300 rows of 1 MB: over the module's 256 MB reader limit once the output buffer holds them
    bomb = (
        f"SELECT if(number = 0, '', repeat(char(0), 1000000)) AS `{alias}` FROM numbers(300) "
        "FORMAT TabSeparatedRawWithNames"
    )
    reader = {"Content-Type": "text/plain", **_basic(url, "reader")}
    for _ in range(2):
        status, body = _raw(url, "POST", bomb.encode(), reader)
        assert status == 500 and "MEMORY_LIMIT_EXCEEDED" in body
        fresh = secrets.randbelow(10**12)  # a text the endpoint has not seen (nothing cached)
        assert _raw(url, "POST", f"SELECT {fresh}".encode(), reader) == (200, f"{fresh}\n")
    assert not target.exists()


@pytest.mark.parametrize(
    "query",
    [
        "INSERT INTO agentstream.probe VALUES (1)",
        "INSERT INTO agentstream.probe SELECT number FROM numbers(3)",
        "CREATE TABLE agentstream.evil (x UInt8) ENGINE = Memory",
        "DROP TABLE agentstream.probe",
        "TRUNCATE TABLE agentstream.probe",
        "ALTER TABLE agentstream.probe DELETE WHERE 1",
        "SELECT * FROM file('/etc/hostname', 'LineAsString')",
        "SELECT * FROM `file`('/etc/hostname', 'LineAsString')",
        "SELECT file('/etc/hostname')",
        "SELECT \"file\"('/etc/hostname')",
        "SELECT * FROM url('http://127.0.0.1:9/x', 'CSV', 'a String')",
        "SELECT * FROM executable('id', 'TSV', 'a String')",
        "SET readonly = 0",
        "SELECT 1 SETTINGS readonly = 0",
        "SELECT 1 SETTINGS max_execution_time = 3600",
        "KILL QUERY WHERE 1",
        "SYSTEM FLUSH LOGS",
        "OPTIMIZE TABLE agentstream.probe FINAL",
        "USE system",
        "SELECT 1; DROP TABLE agentstream.probe",
    ],
)
def test_a_reader_cannot_write_reach_files_or_change_settings(served, query):
    url, _ = served
    client = connect(url)
    try:
        with pytest.raises(Exception, match=r"READONLY|refused|Multi-statements|Code: 164"):
            client.command(query)
    finally:
        client.close()
    check = connect(url)
    try:
        assert check.query("SELECT count() FROM agentstream.probe").result_rows == [(0,)]
        tables = check.query(
            "SELECT name FROM system.tables WHERE database = 'agentstream' AND name = 'evil'"
        )
        assert tables.result_rows == []
    finally:
        check.close()


@pytest.mark.parametrize(
    "template",
    [
        "SELECT 'x' INTO OUTFILE '{target}' FORMAT TSV",
        "SELECT 'x' /* c */ INTO   OUTFILE '{target}' TRUNCATE",
        "SHOW TABLES FROM agentstream INTO OUTFILE '{target}'",
        "SELECT $$x$$ INTO OUTFILE $t${target}$t$",
    ],
)
def test_a_reader_cannot_write_into_outfile(served, template):
    url, tmp = served
    target = tmp / "outfile.tsv"
    client = connect(url)
    try:
        with pytest.raises(Exception, match="INTO OUTFILE is refused"):
            client.command(template.format(target=target))
    finally:
        client.close()
    assert not target.exists()


def test_the_writer_writes_and_existing_readers_are_unchanged(served):
    url, _ = served
    writer = connect(url, role="writer")
    try:
        writer.command("CREATE TABLE agentstream.scratch (x UInt8) ENGINE = Memory")
        writer.insert("agentstream.scratch", [[1], [2]], column_names=["x"])
        writer.command("DROP TABLE agentstream.scratch")
    finally:
        writer.close()
    import clickhouse_connect

    # a caller that takes the served DSN as it is (tests/support/sink_harness.reader) still reads
    client = clickhouse_connect.get_client(dsn=live_endpoint(chdb_path(url)))
    try:
        answer = client.query("SELECT {n:UInt8} + 1 AS n, 'a;b' AS s", parameters={"n": 41})
        assert answer.result_rows == [(42, "a;b")]
    finally:
        client.close()


def _insert_ms(writer, n: int) -> list[float]:
    times = []
    for i in range(n):
        started = time.perf_counter()
        writer.insert("agentstream.probe_w", [[i]], column_names=["x"])
        times.append((time.perf_counter() - started) * 1000)
    return times


def test_the_engine_cancels_a_runaway_reader_without_delaying_the_writer(served):
    url, _ = served
    writer = connect(url, role="writer")
    writer.command("CREATE TABLE IF NOT EXISTS agentstream.probe_w (x UInt64) ENGINE = MergeTree ORDER BY x")
    normal = statistics.median(_insert_ms(writer, 8))
    outcome: dict = {}

    def runaway() -> None:
        client = connect(url, send_receive_timeout=60)
        started = time.monotonic()
        try:
            client.query("SELECT count() FROM numbers(1e12)")
            outcome["error"] = None
        except Exception as exc:
            outcome["error"] = str(exc)
        outcome["elapsed"] = time.monotonic() - started
        client.close()

    thread = threading.Thread(target=runaway)
    thread.start()
    time.sleep(0.3)
    during = statistics.median(_insert_ms(writer, 8))
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert outcome["error"] and "TIMEOUT_EXCEEDED" in outcome["error"]
    assert outcome["elapsed"] < TIMEOUT_S + 3  # cancelled by the engine, not run to its end
    assert during <= 2 * max(normal, 50.0), (normal, during)  # ms; floor: a loaded 2-core host
    # a memory bomb is cancelled by its memory limit, and the endpoint still answers after both
    reader = connect(url)
    try:
        with pytest.raises(Exception, match=r"MEMORY_LIMIT_EXCEEDED|memory limit"):
            reader.query("SELECT length(groupArray(number)) FROM numbers(1e9)")
        assert reader.query("SELECT 1").result_rows == [(1,)]
    finally:
        reader.close()
    writer.close()


def test_a_malformed_body_length_is_a_400_not_a_server_error(served):
    """Found by attacking: a negative Content-Length or a chunk size that is not hexadecimal was a 500."""
    url, _ = served
    negative = b"POST / HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: -5\r\n"
    assert " 400 " in _socket_request(url, negative, body=b"")
    chunked = b"POST / HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n"
    assert " 400 " in _socket_request(url, chunked, body=b"zz\r\nSELECT 1\r\n0\r\n\r\n")


def test_a_silent_client_is_disconnected(tmp_path, monkeypatch):
    """Slow headers or a body that stops (issue #34 item 15) cannot hold a server thread: after the
    handler's `timeout` seconds of silence the connection is closed (30 s; 1 s here)."""
    from clients.clickhouse import endpoint as module

    monkeypatch.setattr(module._Handler, "timeout", 1)
    with module.Endpoint(tmp_path / "clickhouse") as served_here:
        auth = base64.b64encode(f"reader:{served_here.keys.keys['reader']}".encode())
        head = b"POST / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Basic %s\r\n" % (
            served_here.port,
            auth,
        )
        for partial in (head[:30], head + b"Content-Length: 100\r\n\r\nSEL"):
            with socket.create_connection((served_here.host, served_here.port), timeout=10) as sock:
                sock.sendall(partial)
                started = time.monotonic()
                while sock.recv(4096):  # an error reply may come first; then the close
                    pass
                assert time.monotonic() - started < 5
