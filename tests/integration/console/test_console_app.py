"""The console as a real process (`agentstream console`) on a real chDB: what each page shows, the
filters, the trajectory page against the CLI's numbers, bad input, injection attempts, API keys."""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from infra.clickhouse.analytics import leaderboard_rows
from infra.clickhouse.browse.trajectory_detail import trajectory_scores
from infra.clickhouse.sql import run
from producers.gateway.requests import hash_key
from tests.support.processes import AGENTSTREAM, Proc, free_port, wait_for

T0 = datetime(2026, 11, 20, 9, 0, 0, tzinfo=UTC)
DOMAINS = ("coding", "web", "chat")
KEY = "console-test-key"


class Console:
    def __init__(self, tmp: Path, *extra: str, env: dict | None = None):
        self.url_ch = f"chdb://{tmp / 'clickhouse'}"
        ready = tmp / "console.ready"
        self.proc = Proc(
            [*AGENTSTREAM, "console", "--port", str(free_port()), "--ready-file", str(ready), *extra],
            tmp / "console.log",
            env={
                "AGENTSTREAM_CLICKHOUSE_URL": self.url_ch,
                "AGENTSTREAM_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",  # nothing listens there
                "AGENTSTREAM_DATA_DIR": str(tmp),
                **(env or {}),
            },
        )
        wait_for(lambda: ready.exists() or not self.proc.alive(), timeout_s=60, what="console to listen")
        assert self.proc.alive(), self.proc.log_text()
        self.base = f"http://{ready.read_text()}"

    def get(self, path: str, headers: dict | None = None) -> tuple[int, str, dict]:
        request = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read().decode(), dict(response.headers)
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(), dict(error.headers)

    def client(self):
        from clients.clickhouse.client import connect

        return connect(self.url_ch, wait_s=10, role="writer")  # seeds rows: readers may not insert


@pytest.fixture(scope="module")
def console(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    server = Console(tmp, "--page-size", "10")
    client = server.client()
    try:
        seed(client)
        yield server
    finally:
        client.close()
        server.proc.stop()


def insert(client, table: str, rows: list[dict]) -> None:
    columns = list(rows[0])
    client.insert(f"agentstream.{table}", [[row[c] for c in columns] for row in rows], column_names=columns)


def seed(client) -> None:
    """30 trajectories over three domains, one of them with steps and every reward layer."""
    trajectories, episodes = [], []
    for i in range(30):
        ended = T0 + timedelta(minutes=i)
        common = {
            "trajectory_id": f"t{i:02d}",
            "task_id": f"task-{i % 5}",
            "task": f"Fix bug number {i}" + (" with the needle" if i == 7 else ""),
            "domain": DOMAINS[i % 3],
            "agent": f"agent-{i % 2}",
            "model": f"model-{i % 3}",
            "policy_version": f"v{i % 4}",
            "success": i % 2,
            "total_steps": 3,
            "started_at": ended - timedelta(minutes=1),
            "ended_at": ended,
        }
        trajectories.append(
            {
                **common,
                "revision": 2,
                "event_id": f"e{i}",
                "occurred_at": ended,
                "total_reward": round(i / 30, 3),
                "complete": 1,
                "missing": [],
            }
        )
        episodes.append({**common, "score": round(i / 30, 3)})
    old = {
        **trajectories[1],
        "revision": 1,
        "event_id": "e-old",
        "task": "old",
        "total_reward": 0.999,
        "complete": 0,
        "missing": ["judge"],
    }  # an older revision of t01 that FINAL must hide
    insert(client, "trajectories", [*trajectories, old])
    insert(client, "episodes", episodes)
    _seed_layers(client)
    _seed_training(client)


def _seed_training(client) -> None:
    version = {"policy_version": "v1", "previous_version": "v0", "event_id": "pv1", "occurred_at": T0}
    version |= {"method": "grpo", "step": 1, "batch_ids": ["b1"], "trajectory_ids": ["t00", "t01"]}
    insert(client, "policy_versions", [{**version, "source_ranges": "{}", "metrics": {"reward_mean": 0.4}}])
    batch = {"batch_id": "b1", "event_id": "bb1", "occurred_at": T0, "kind": "grpo", "row_count": 2}
    batch |= {"trajectory_ids": ["t00", "t01"], "source_offsets": '{"agent.events": [[0, 10]]}'}
    insert(client, "batches", [{**batch, "policy_versions": ["v0"]}])


def _seed_layers(client) -> None:
    insert(
        client,
        "steps",
        [
            {
                "event_id": f"s{i}",
                "trajectory_id": "t00",
                "step_index": i,
                "occurred_at": T0,
                "thought": f"thought {i}",
                "tool": "bash",
                "params": '{"command": "ls"}',
                "observation": "x" * (900 if i == 1 else 20),
                "exit_code": 1 if i == 1 else 0,
                "error": "boom" if i == 1 else None,
                "model": "model-0",
            }
            for i in range(3)
        ],
    )
    insert(
        client,
        "rule_rewards",
        [
            {
                "event_id": f"r{i}",
                "trajectory_id": "t00",
                "step_index": i,
                "occurred_at": T0,
                "score": 0.5 + i / 10,
                "domain": "coding",
                "reward_version": "rules-1",
            }
            for i in range(2)
        ],
    )
    judged = {"trajectory_id": "t00", "occurred_at": T0, "judge_model": "judge-m"}
    insert(
        client,
        "judge_scores",
        [
            {
                **judged,
                "event_id": "j0",
                "kind": "step",
                "step_index": 0,
                "scores": {"correctness": 0.8},
                "score": 0.8,
                "rationale": "Good first look.",
                "cost_usd": 0.0012,
                "failure_reason": "",
                "failure_kind": "",
            },
            {
                **judged,
                "event_id": "j1",
                "kind": "failed",
                "step_index": 1,
                "scores": {},
                "score": None,
                "rationale": "",
                "cost_usd": 0.0,
                "failure_reason": "rate limited for good",
                "failure_kind": "rate_limit",
            },
        ],
    )
    insert(
        client,
        "annotations",
        [
            {
                "event_id": "a0",
                "trajectory_id": "t00",
                "step_index": 2,
                "occurred_at": T0,
                "rubric": "helpful",
                "score": 0.25,
                "annotator": "ann@example.com",
                "comment": "meh",
            },
            {  # `agentstream annotate` on a step t00 never took: a stray label, never a step
                "event_id": "a7",
                "trajectory_id": "t00",
                "step_index": 7,
                "occurred_at": T0,
                "rubric": "stray-rubric",
                "score": 0.75,
                "annotator": "ann@example.com",
                "comment": "",
            },
        ],
    )
    insert(
        client,
        "dead_letters",
        [
            {
                "event_id": "d0",
                "trajectory_id": "t05",
                "occurred_at": T0,
                "stage": "sink",
                "reason": "steps.step_index: expected an integer, got 'x'",
                "error_type": "ValidationError",
                "source_topic": "agent.events",
                "source_partition": 2,
                "source_offset": 41,
            }
        ],
    )


def listed(html: str) -> list[str]:
    return re.findall(r'data-trajectory-id="([^"]+)"', html)


def test_the_list_is_newest_first_paginated_and_shows_the_latest_revision(console):
    status, html, headers = console.get("/trajectories")
    assert status == 200 and listed(html) == [f"t{i:02d}" for i in range(29, 19, -1)]
    assert (
        "30 found" in html and "page 1 of 3" in html and re.match(r"app;dur=[\d.]+", headers["Server-Timing"])
    )
    status, html, _ = console.get("/trajectories?page=3")
    assert listed(html)[-2:] == ["t01", "t00"] and "old" not in html.split("t01")[1][:300]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("domain=web", [i for i in range(30) if i % 3 == 1]),
        ("domain=web&success=false", [i for i in range(30) if i % 3 == 1 and i % 2 == 0]),
        ("reward_min=0.5&reward_max=0.6", [i for i in range(30) if 0.5 <= round(i / 30, 3) <= 0.6]),
        ("search=NEEDLE", [7]),
        (
            "agent=agent-1&model=model-0&policy_version=v1",
            [i for i in range(30) if i % 2 and not i % 3 and i % 4 == 1],
        ),
        ("since=2026-11-20T09:25:00&until=2026-11-20T09:27:00", [25, 26, 27]),
        ("domain=web&page_size=200", [i for i in range(30) if i % 3 == 1]),
    ],
)
def test_each_filter_selects_exactly_the_matching_trajectories(console, query, expected):
    status, html, _ = console.get(f"/trajectories?{query}&page_size=200")
    assert status == 200, html
    assert sorted(listed(html)) == sorted(f"t{i:02d}" for i in expected)


def test_the_trajectory_page_shows_every_layer_and_matches_the_cli(console):
    status, html, _ = console.get("/trajectories/t00")
    assert status == 200
    assert "Fix bug number 0" in html and "Good first look." in html and "judge-m" in html
    assert "judge failed" in html and "rate limited for good" in html  # a failure, not a number
    assert "<details" in html and "show all 900 characters" in html  # the long observation is folded
    assert "no judge" in html and "meh" in html
    _, body, _ = console.get("/trajectories/t00?format=json")
    page = json.loads(body)
    client = console.client()
    try:
        _, cli_steps = trajectory_scores(client, "t00")
    finally:
        client.close()
    assert [s["scores"] for s in page["steps"]] == json.loads(json.dumps(cli_steps, default=str))
    assert [s["scores"]["judge"] for s in page["steps"]] == [0.8, None, None]


def test_a_label_on_a_step_the_trajectory_does_not_have_is_shown_apart_not_as_a_step(console, capsys):
    from argparse import Namespace

    from infra.commands.clickhouse import trajectory_cmd

    _, body, _ = console.get("/trajectories/t00?format=json")
    page = json.loads(body)
    assert [s["index"] for s in page["steps"]] == [0, 1, 2]
    assert [(a["step_index"], a["rubric"], a["score"]) for a in page["stray_labels"]] == [
        (7, "stray-rubric", 0.75)
    ]
    _, html, _ = console.get("/trajectories/t00")
    assert 'data-step="7"' not in html and 'data-stray-step="7"' in html and "stray-rubric" in html
    args = Namespace(trajectory_id="t00", reward_version=None, clickhouse_url=console.url_ch)
    assert trajectory_cmd(Namespace(**vars(args), format="json")) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [s["step"] for s in shown["steps"]] == [0, 1, 2]
    assert [a["step_index"] for a in shown["episode"]["stray_labels"]] == [7]
    assert trajectory_cmd(Namespace(**vars(args), format="table")) == 0
    table = capsys.readouterr().out
    assert "human labels on steps this trajectory does not have" in table and "stray-rubric" in table


def test_the_leaderboard_page_shows_the_cli_numbers(console):
    status, html, _ = console.get("/leaderboard?by=agent")
    client = console.client()
    try:
        rows = leaderboard_rows(lambda sql: run(client, sql), "agent")
    finally:
        client.close()
    assert status == 200 and len(rows) == 6
    shown = re.findall(r'data-field="mean_reward">([^<]+)<', html)
    assert shown == [f"{r['mean_reward']:.3f}" for r in rows]


def test_the_overview_says_kafka_is_down_and_still_shows_clickhouse(console):
    status, html, _ = console.get("/")
    assert status == 200 and ("unreachable" in html or "not answering" in html)
    assert 'data-field="counts.trajectories">30<' in html
    assert "steps.step_index: expected an integer" in html and "agent.events[2]@41" in html
    status, body, _ = console.get("/api/overview")
    assert status == 200 and json.loads(body)["counts"]["dead_letters"] == 1


def test_the_training_page_shows_versions_with_their_lineage_batches_and_the_curve(console):
    status, html, _ = console.get("/training")
    assert status == 200 and 'href="/training/versions/v1"' in html and "reward_mean 0.400" in html
    assert "<svg" in html and "Learning curve" in html and "bb1" not in html and "grpo" in html
    status, html, _ = console.get("/training/versions/v1")
    assert (
        status == 200
        and "b1" in html
        and 'href="/trajectories/t00"' in html
        and 'href="/trajectories/t01"' in html
    )
    assert "agent.events" in html and "step events by the version that produced them: (none) 3" in html
    assert 'data-testid="gate">— (no gate ran)</dd>' in html  # published without --gate
    status, html, _ = console.get("/training/versions/v404")
    assert status == 404 and "No policy version &#39;v404&#39; was published." in html


@pytest.mark.parametrize(
    ("path", "status", "text"),
    [
        ("/trajectories/no-such-id", 404, "no trajectory with id &#39;no-such-id&#39;"),
        ("/trajectories?reward_min=abc", 400, "reward_min=&#39;abc&#39;: must be a number"),
        ("/trajectories?page=0", 400, "page=&#39;0&#39;"),
        ("/trajectories?since=soon", 400, "since=&#39;soon&#39;"),
        ("/leaderboard?by=nope", 400, "by=&#39;nope&#39;"),
        ("/leaderboard?since=2026-99-01", 400, "since=&#39;2026-99-01&#39;"),
        ("/nowhere", 404, "Nothing is served at /nowhere"),
        ("/api/overview?x=1", 200, "counts"),
    ],
)
def test_bad_input_gets_a_clear_page_never_a_stack_trace(console, path, status, text):
    got, html, _ = console.get(path)
    assert got == status and text in html and "Traceback" not in html


INJECTIONS = [
    "x' OR 1=1 --",
    "'); DROP TABLE agentstream.steps; --",
    "web' UNION SELECT name FROM system.tables --",
    "{x:String}",
    "%' OR '1'='1",
    "\\'; SELECT 1; --",
]


def test_injection_attempts_reach_no_sql(console):
    from urllib.parse import quote

    client = console.client()
    try:
        before = run(client, "SELECT count() FROM agentstream.steps")[0][0]
        for payload in INJECTIONS:
            for name in (
                "domain",
                "agent",
                "model",
                "policy_version",
                "search",
                "since",
                "reward_min",
                "page",
            ):
                status, html, _ = console.get(f"/trajectories?{name}={quote(payload)}")
                assert status in (200, 400) and "Traceback" not in html, (name, payload, status)
                if status == 200:
                    assert listed(html) == [], (name, payload)
            for path in (f"/trajectories/{quote(payload, safe='')}", f"/leaderboard?domain={quote(payload)}"):
                status, html, _ = console.get(path)
                assert status in (200, 404) and "Traceback" not in html, (path, status)
        assert run(client, "SELECT count() FROM agentstream.steps")[0][0] == before
        assert run(client, "SELECT count() FROM agentstream.trajectories FINAL")[0][0] == 30
    finally:
        client.close()


def test_assets_are_served_by_the_app_and_nothing_comes_from_elsewhere(console):
    for path in ("/", "/trajectories", "/trajectories/t00", "/leaderboard", "/training"):
        _, html, _ = console.get(path)
        for url in re.findall(r'(?:src|href)="([^"]+)"', html):
            assert url.startswith(("/", "#")), (path, url)
    for asset in re.findall(r'(?:src|href)="(/static/[^"]+)"', console.get("/")[1]):
        status, body, headers = console.get(asset)
        assert (
            status == 200
            and body
            and headers["Content-Type"].startswith(("text/css", "text/javascript", "application/javascript"))
        )


def test_with_api_keys_configured_every_page_asks_for_one(tmp_path):
    server = Console(tmp_path, env={"AGENTSTREAM_GATEWAY_API_KEY_HASHES": hash_key(KEY)})
    try:
        status, _, headers = server.get("/trajectories")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
        assert server.get("/trajectories", {"Authorization": "Bearer wrong"})[0] == 401
        assert server.get("/trajectories", {"Authorization": f"Bearer {KEY}"})[0] == 200
        basic = "Basic " + base64.b64encode(f"me:{KEY}".encode()).decode()
        assert server.get("/trajectories", {"Authorization": basic})[0] == 200
        assert server.get("/healthz")[0] == 200
    finally:
        server.proc.stop()


def test_a_console_beyond_loopback_without_keys_refuses_to_start(tmp_path):
    proc = Proc(
        [*AGENTSTREAM, "console", "--host", "0.0.0.0", "--port", "0"],
        tmp_path / "log",
        env={"AGENTSTREAM_CLICKHOUSE_URL": f"chdb://{tmp_path / 'ch'}"},
    )
    try:
        assert proc.popen.wait(timeout=60) != 0
        assert "host='0.0.0.0'" in proc.log_text() and "--allow-anonymous" in proc.log_text()
    finally:
        proc.stop()
