"""The console tried as an attacker would (issue 34, items 14 and 15), as a real process on a real
chDB: filters the store cannot hold are 400s naming the parameter and the value (not a 503 that
blames ClickHouse); a Host header that does not name the console is refused without keys (DNS
rebinding); every response (pages, API, errors, assets, refusals) carries the security headers; a
client that sends its request head too slowly is cut off; clients that hang up are not errors."""

from __future__ import annotations

import http.client
import socket
import time
from pathlib import Path

import pytest

from infra.console.app import SECURITY_HEADERS
from infra.console.charts import line_chart
from tests.support.processes import AGENTSTREAM, Proc, free_port, wait_for

pytestmark = pytest.mark.integration
HEADER_TIMEOUT_S = 1.5


class Console:
    def __init__(self, tmp: Path):
        ready = tmp / "console.ready"
        self.port = free_port()
        self.proc = Proc(
            [*AGENTSTREAM, "console", "--port", str(self.port), "--ready-file", str(ready)],
            tmp / "console.log",
            env={
                "AGENTSTREAM_CLICKHOUSE_URL": f"chdb://{tmp / 'clickhouse'}",
                "AGENTSTREAM_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",  # nothing listens there
                "AGENTSTREAM_DATA_DIR": str(tmp),
                "AGENTSTREAM_CONSOLE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
                "AGENTSTREAM_CONSOLE_ALLOWED_HOSTS": "console.example.com:443",
            },
        )
        wait_for(lambda: ready.exists() or not self.proc.alive(), timeout_s=60, what="console to listen")
        assert self.proc.alive(), self.proc.log_text()

    def get(self, path: str, host: str | None = None, method: str = "GET") -> tuple[int, str, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.putrequest(method, path, skip_host=True)
            conn.putheader("Host", host if host is not None else f"127.0.0.1:{self.port}")
            conn.endheaders()
            response = conn.getresponse()
            return response.status, response.read().decode(), dict(response.headers)
        finally:
            conn.close()


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    server = Console(tmp_path_factory.mktemp("console-attacks"))
    try:
        yield server
    finally:
        server.proc.stop()


BAD_FILTERS = [
    ("/trajectories?since=0001-01-01", "since", "0001-01-01"),  # was a 503 "ClickHouse is not answering"
    ("/trajectories?until=9999-12-31T23:59:59", "until", "9999-12-31T23:59:59"),
    ("/trajectories?since=garbage", "since", "garbage"),
    ("/trajectories?since=1970-01-01T01:00:00%2B02:00", "since", "1970-01-01T01:00:00+02:00"),
    ("/trajectories?reward_min=nan", "reward_min", "nan"),
    ("/trajectories?page=0", "page", "0"),
    ("/trajectories?page=99999999999999999999", "page", "99999999999999999999"),
    ("/trajectories?page_size=1000000", "page_size", "1000000"),
    ("/trajectories?success=maybe", "success", "maybe"),
    ("/leaderboard?since=0001-01-01", "since", "0001-01-01"),  # was saturated to 1970 silently
    ("/leaderboard?since=9999-12-31", "since", "9999-12-31"),
    ("/leaderboard?by=nope", "by", "nope"),
]


@pytest.mark.parametrize(("path", "name", "value"), BAD_FILTERS)
def test_a_filter_the_store_cannot_hold_is_a_400_naming_it(console, path, name, value):
    status, body, headers = console.get(path)
    assert status == 400, (status, body[:500])
    assert f"{name}=&#39;{value}&#39;" in body and "ClickHouse" not in body
    assert headers["Content-Security-Policy"] == SECURITY_HEADERS["Content-Security-Policy"]


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:{port}",  # a rebound name keeps its own Host
        "127.0.0.1.evil.example:{port}",
        "localhost@evil.example",
        "console.example.com:8443",  # configured with another port
        "",
    ],
)
def test_a_foreign_host_is_refused_without_keys(console, host):
    for path in ("/", "/api/overview", "/trajectories", "/healthz", "/static/console.js"):
        status, body, headers = console.get(path, host=host.format(port=console.port))
        assert status == 421, (path, status)
        assert "agentstream" not in body.lower() or "Host=" in body  # no page content
        assert headers["X-Frame-Options"] == "DENY"


def test_the_consoles_own_names_are_served(console):
    for host in (f"127.0.0.1:{console.port}", f"localhost:{console.port}", f"[::1]:{console.port}",
                 "LOCALHOST", "console.example.com:443"):  # fmt: skip
        status, _, _ = console.get("/healthz", host=host)
        assert status == 200, host


def test_every_response_carries_the_security_headers(console):
    for path, expected in [
        ("/", 200),
        ("/api/overview", 200),
        ("/trajectories", 200),
        ("/leaderboard", 200),
        ("/training", 200),
        ("/static/console.css", 200),
        ("/trajectories/no-such-id", 404),
        ("/nowhere", 404),
        ("/trajectories?since=garbage", 400),
    ]:
        status, body, headers = console.get(path)
        assert status == expected, (path, status, body[:300])
        for name, value in SECURITY_HEADERS.items():
            assert headers.get(name) == value, (path, name, headers.get(name))
    status, _, headers = console.get("/", method="POST")
    assert status == 405 and headers["X-Content-Type-Options"] == "nosniff"
    policy = SECURITY_HEADERS["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy


def test_pages_need_no_inline_script_or_style(console):
    for path in ("/", "/trajectories", "/leaderboard", "/training", "/trajectories?since=garbage"):
        _, body, _ = console.get(path)
        assert "<script>" not in body and "style=" not in body and " on" + "load=" not in body
        assert body.count("<script") == body.count("<script src=")
    chart = line_chart(["a", "b"], {"one": [0.1, 0.2], "two": [0.3, None]}, "t")
    assert "style=" not in chart and 'class="c1"' in chart  # legend colours are classes in console.css


def test_a_slow_request_head_is_cut_off(console):
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", console.port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed = False
        for _ in range(int(HEADER_TIMEOUT_S * 10 + 40)):  # a header line every 0.1 s, for 4 s at most
            try:
                sock.sendall(b"X-Slow: 1\r\n")
                sock.settimeout(0.1)
                if sock.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
    elapsed = time.monotonic() - started
    assert closed and HEADER_TIMEOUT_S - 0.5 <= elapsed <= HEADER_TIMEOUT_S + 3, elapsed


def test_clients_that_hang_up_are_not_errors(console):
    for path in ("/", "/trajectories", "/api/overview"):  # the overview waits for Kafka: gone by then
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", console.port), timeout=5) as sock:
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    time.sleep(4)  # the Kafka wait of the overview (3 s) has passed: every answer was written
    status, _, _ = console.get("/healthz")
    assert status == 200
    log = console.proc.log_text()
    assert " ERROR " not in log and "Traceback" not in log, log[-3000:]
