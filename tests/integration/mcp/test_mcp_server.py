"""`agentstream mcp` as a real process, driven by the official `mcp` SDK's client: over stdio every
tool is listed and called against a chDB holding a few scored trajectories (served by
`agentstream db serve`), the embedded broker (annotate, rollout) and a scripted OpenAI-compatible
policy on 127.0.0.1; `sql` refuses writes; the same server answers over streamable HTTP."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from clients.clickhouse.client import chdb_path, connect, live_endpoint
from consumers.sink.rows import COLUMNS, rows_for
from infra.mcp.json_trajectory import rule_layer, score_json_trajectory
from schemas.codec import encode
from schemas.events import FeedbackAnnotation, JudgeStep
from streams.rules.profiles import ProfileRegistry
from tests.support.openai_stub import scripted_openai
from tests.support.processes import AGENTSTREAM, REPO, Proc, free_port, wait_for

pytestmark = pytest.mark.integration

TOOLS = {
    "sql", "leaderboard", "trajectory", "build_preferences", "export_dataset", "score_trajectory",
    "list_rubrics", "annotate", "calibration_report", "list_environments", "sandbox_run", "rollout",
}  # fmt: skip
READ = {
    "tool": "read_file",
    "params": {"file_path": "src/app.py"},
    "observation": "def main(): see src/util.py",
}
EDIT = {"tool": "edit_file", "params": {"file_path": "src/util.py", "old_string": "a", "new_string": "b"}}
TEST = {"tool": "bash", "params": {"command": "pytest"}, "observation": "3 passed"}
DEAD_POLICY = f"http://127.0.0.1:{free_port()}/v1"  # configured, but nothing listens there


def trajectories() -> list[dict]:
    """Three runs of one coding task: a clean one, one that re-reads, one that fails."""
    base = {"task_id": "fix-util", "domain": "coding", "agent": "agent-a", "reference_steps": 3}
    return [
        {**base, "trajectory_id": "t-good", "model": "m-good", "steps": [READ, EDIT, TEST],
         "outcome": {"success": True, "tests_passed": 3, "tests_failed": 0}},
        {**base, "trajectory_id": "t-slow", "model": "m-good", "steps": [READ, READ, EDIT, TEST],
         "outcome": {"success": True, "tests_passed": 3, "tests_failed": 0}},
        {**base, "trajectory_id": "t-bad", "model": "m-bad", "steps": [READ, EDIT],
         "outcome": {"success": False, "tests_passed": 1, "tests_failed": 2}},
    ]  # fmt: skip


def judged(tid: str, step: int, score: float, human: float) -> list:
    common = {"trajectory_id": tid, "occurred_at": "2026-01-01T00:01:00Z", "producer": "tests"}
    return [
        JudgeStep(event_id=f"j-{tid}-{step}", step_index=step, score=score, scores={"goal_progress": score},
                  judge_model="judge", prompt_version="p1", **common),
        FeedbackAnnotation(event_id=f"h-{tid}-{step}", step_index=step, score=human, annotator="a", **common),
    ]  # fmt: skip


def seed(url: str) -> None:
    """Every event of the three trajectories, as the sink writes them, plus judge scores and labels."""
    profiles, events = ProfileRegistry(), []
    for data in trajectories():
        steps, rewards = rule_layer(data, profiles)
        events += [*steps, *rewards, score_json_trajectory(data, profiles)]
    events += judged("t-good", 0, 0.9, 1.0) + judged("t-good", 1, 0.8, 0.9) + judged("t-bad", 0, 0.3, 0.1)
    by_table: dict[str, list] = {}
    for offset, event in enumerate(events):
        for table, row in rows_for(event, encode(event), "tests", 0, offset):
            by_table.setdefault(table, []).append(row)
    client = connect(url, wait_s=10, role="writer")  # seeding writes; the tools read
    try:
        for table, rows in by_table.items():
            client.insert(f"agentstream.{table}", rows, column_names=list(COLUMNS[table]))
    finally:
        client.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A fresh chDB path served by `agentstream db serve`, holding the seeded data."""
    tmp = tmp_path_factory.mktemp("mcp-store")
    url = f"chdb://{tmp / 'clickhouse'}"
    proc = Proc([*AGENTSTREAM, "db", "serve", "--clickhouse-url", url, "--port", "0"], tmp / "serve.log")
    try:
        # "serving" is printed once the migrations ran (the endpoint answers before that)
        wait_for(lambda: "serving" in proc.log_text(), timeout_s=60, what="agentstream db serve")
        assert live_endpoint(chdb_path(url))
        seed(url)
        yield url
    finally:
        proc.stop()


def submit_seven(messages: list[dict]):
    """The scripted policy's every reply: submit 7 (the answer to the calc task `3 + 4`)."""
    return "", ("submit", {"answer": "7"})


def server_env(url: str, bootstrap: str, data_dir: Path) -> dict[str, str]:
    import os

    return {**os.environ, "AGENTSTREAM_CLICKHOUSE_URL": url, "AGENTSTREAM_BOOTSTRAP_SERVERS": bootstrap,
            "AGENTSTREAM_DATA_DIR": str(data_dir), "AGENTSTREAM_MCP_SQL_MAX_ROWS": "5"}  # fmt: skip


async def call(session, name: str, arguments: dict | None = None) -> dict:
    """A tool's structured result; fails the test with the server's message on a tool error."""
    result = await session.call_tool(name, arguments or {})
    assert not result.is_error, f"{name}: {result.content[0].text}"
    return result.structured_content


async def refused(session, name: str, arguments: dict) -> str:
    result = await session.call_tool(name, arguments)
    assert result.is_error, f"{name} {arguments} was not refused: {result.structured_content}"
    return result.content[0].text


def stdio_params(env: dict[str, str]):
    from mcp import StdioServerParameters

    return StdioServerParameters(command=sys.executable, args=[*AGENTSTREAM[1:], "mcp"], env=env, cwd=REPO)


def test_every_tool_over_stdio(store, broker, tmp_path):
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    async def drive(policy_url: str) -> None:
        with open(tmp_path / "mcp.stderr", "w") as errlog:
            env = server_env(store, broker.bootstrap, tmp_path / "data")
            env["AGENTSTREAM_MCP_POLICY_URLS"] = f"{policy_url},{DEAD_POLICY}"  # rollout calls only these
            params = stdio_params(env)
            async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                assert {t.name for t in (await s.list_tools()).tools} == TOOLS
                await check_resources(s)
                await check_sql(s)
                await check_analytics(s, tmp_path / "data" / "exports" / "sft-run")
                await check_rewards(s, broker.bootstrap)
                await check_environments(s, policy_url, broker.bootstrap)

    with scripted_openai(submit_seven) as (policy_url, _requests):
        anyio.run(drive, policy_url)


async def check_resources(s) -> None:
    uris = {str(r.uri) for r in (await s.list_resources()).resources}
    assert {"schema://events", "schema://events/step.recorded", "schema://events/trajectory.scored"} <= uris
    schema = json.loads((await s.read_resource("schema://events/step.recorded")).contents[0].text)
    assert schema["properties"]["type"]["const"] == "step.recorded" and "tool" in schema["properties"]
    index = json.loads((await s.read_resource("schema://events")).contents[0].text)
    assert index["feedback.annotation"] == "schema://events/feedback.annotation"


async def check_sql(s) -> None:
    expected = {d["trajectory_id"]: score_json_trajectory(d).total_reward for d in trajectories()}
    query = "SELECT trajectory_id, total_reward FROM agentstream.trajectories FINAL ORDER BY trajectory_id"
    result = await call(s, "sql", {"query": query})
    assert {r["trajectory_id"]: r["total_reward"] for r in result["rows"]} == expected
    assert result["truncated"] is False and result["columns"] == ["trajectory_id", "total_reward"]
    # an endless table: the limit holds in the engine, not after fetching (AGENTSTREAM_MCP_SQL_MAX_ROWS=5)
    endless = await call(s, "sql", {"query": "SELECT number FROM system.numbers"})
    assert [r["number"] for r in endless["rows"]] == [0, 1, 2, 3, 4] and endless["truncated"] is True
    shown = await call(s, "sql", {"query": "SHOW TABLES FROM agentstream"})
    assert shown["row_count"] == 5 and shown["truncated"] is True
    insert = await refused(
        s, "sql", {"query": "INSERT INTO agentstream.annotations (trajectory_id) VALUES ('x')"}
    )
    assert "INSERT is refused" in insert and "read-only" in insert
    drop = await refused(s, "sql", {"query": "  /* tidy up */ DROP TABLE agentstream.trajectories"})
    assert "DROP is refused" in drop
    sneaky = await refused(s, "sql", {"query": "SELECT 1; DROP TABLE agentstream.trajectories"})
    assert "one statement only" in sneaky
    count = await call(s, "sql", {"query": "SELECT count() AS n FROM agentstream.trajectories"})
    assert count["rows"] == [{"n": 3}]  # nothing was written or dropped
    bad = await refused(s, "sql", {"query": "SELECT nope FROM agentstream.trajectories"})
    assert "ClickHouse" in bad and "nope" in bad


async def check_analytics(s, out_dir: Path) -> None:
    board = await call(s, "leaderboard", {"by": "model"})
    assert [(r["domain"], r["model"]) for r in board["rows"]] == [("coding", "m-good"), ("coding", "m-bad")]
    assert board["rows"][0]["success_rate"] == 1.0 and board["rows"][1]["success_rate"] == 0.0
    slow = score_json_trajectory(trajectories()[1])
    shown = await call(s, "trajectory", {"trajectory_id": "t-slow"})
    assert [row["redundancy"] for row in shown["steps"]] == [step.redundancy for step in slow.steps]
    assert shown["steps"][1]["redundancy"] == 0.0 and shown["episode"]["total_reward"] == slow.total_reward
    detail = await call(s, "trajectory", {"trajectory_id": "t-good", "detail": True})
    assert detail["steps"][0]["text"]["tool"] == "read_file" and detail["header"]["success"] == 1
    assert detail["steps"][0]["judgements"][0]["score"] == 0.9
    assert "no such trajectory" in await refused(s, "trajectory", {"trajectory_id": "nowhere"})
    pairs = await call(s, "build_preferences", {"task_id": "fix-util"})
    assert [(p["chosen_trajectory_id"], p["rejected_trajectory_id"]) for p in pairs["pairs"]] == [
        ("t-good", "t-bad")
    ]
    from_json = await call(s, "build_preferences", {"trajectories": trajectories()})
    assert from_json["pairs"] == pairs["pairs"] and from_json["trajectories"] == 3
    export = await call(s, "export_dataset", {"kind": "sft", "out_dir": out_dir.name})  # under exports/
    assert export["rows"] == 2 and export["problems"] == []  # the two successful runs; none failed
    written = [Path(f) if Path(f).is_absolute() else out_dir / f for f in export["files"]]
    assert written and all(f.exists() for f in written)


async def check_rewards(s, bootstrap: str) -> None:
    from clients.kafka import read_to_end
    from schemas.codec import decode
    from schemas.topics import FEEDBACK_HUMAN

    body = await call(s, "score_trajectory", {"trajectory": trajectories()[1]})
    expected = score_json_trajectory(trajectories()[1])
    assert [step["redundancy"] for step in body["steps"]] == [1.0, 0.0, 1.0, 1.0]
    assert body["total_reward"] == expected.total_reward and body["efficiency_score"] == 0.75
    assert "steps[0].step_index" in await refused(
        s, "score_trajectory", {"trajectory": {"steps": [{"step_index": -1, "tool": "x"}]}}
    )
    rubrics = await call(s, "list_rubrics", {"domain": "coding"})
    assert {"id": "non_redundancy", "weight": 0.15, "evaluator": "rule",
            "description": "Does not repeat earlier work."} in rubrics["rubrics"]  # fmt: skip
    label = await call(
        s, "annotate", {"trajectory_id": "t-good", "score": 0.7, "step_index": 2, "comment": "ok"}
    )
    published = [decode(r.value) for r in read_to_end(bootstrap, [FEEDBACK_HUMAN], timeout_s=30)]
    assert [(e.event_id, e.score, e.step_index) for e in published] == [(label["event"]["event_id"], 0.7, 2)]
    assert "score" in await refused(s, "annotate", {"trajectory_id": "t-good", "score": 1.5})
    report = await call(s, "calibration_report", {"min_pairs": 2})
    assert [(r["domain"], r["rubric"], r["n"]) for r in report["rows"]] == [("coding", "overall", 3)]
    assert report["rows"][0]["spearman"] == 1.0 and len(report["maps"]) == 1


async def check_environments(s, policy_url: str, bootstrap: str) -> None:
    from clients.kafka import read_to_end
    from schemas.codec import decode
    from schemas.topics import AGENT_EVENTS

    envs = await call(s, "list_environments")
    calc = next(e for e in envs["environments"] if e["id"] == "calc")
    assert "calc-add-small" in calc["builtin_tasks"] and calc["terminal_tools"] == ["submit"]
    ran = await call(s, "sandbox_run", {"command": "python3 main.py", "files": {"main.py": "print(6 * 7)"}})
    assert (ran["output"].strip(), ran["exit_code"], ran["timed_out"]) == ("42", 0, False)
    assert ran["isolation"]["filesystem"] is True and ran["isolation"]["network"] is True
    # the isolated sandbox, never the host: the checkout (this test file) cannot be read from inside
    peek = await call(s, "sandbox_run", {"command": ["cat", __file__]})
    assert peek["exit_code"] != 0 and "No such file" in peek["output"], peek
    slow = await call(s, "sandbox_run", {"command": ["sleep", "5"], "timeout_s": 0.5})
    assert slow["timed_out"] is True
    episodes = await call(s, "rollout", {"policy_url": policy_url, "task_ids": ["calc-add-small"]})
    assert [(e["task_id"], e["success"], e["turns"]) for e in episodes["episodes"]] == [
        ("calc-add-small", True, 1)
    ]
    tid = episodes["episodes"][0]["trajectory_id"]
    recorded = [decode(r.value) for r in read_to_end(bootstrap, [AGENT_EVENTS], timeout_s=30)]
    kinds = [(e.type, getattr(e, "tool", None)) for e in recorded if e.trajectory_id == tid]
    assert kinds == [("episode.started", None), ("step.recorded", "submit"), ("episode.ended", None)]
    assert "no policy server answers" in await refused(s, "rollout", {"policy_url": DEAD_POLICY})


def test_streamable_http_on_loopback(store, tmp_path):
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    ready = tmp_path / "mcp.ready"
    env = server_env(store, f"127.0.0.1:{free_port()}", tmp_path / "data")
    env["AGENTSTREAM_MCP_SQL_TIMEOUT_S"] = "1"
    args = [*AGENTSTREAM, "mcp", "--transport", "http", "--port", "0", "--ready-file", str(ready)]
    proc = Proc(args, tmp_path / "mcp-http.log", env=env)

    async def drive(url: str) -> None:
        async with streamable_http_client(url) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            assert {t.name for t in (await s.list_tools()).tools} == TOOLS
            rows = await call(s, "sql", {"query": "SELECT count() AS n FROM agentstream.episodes FINAL"})
            assert rows["rows"] == [{"n": 3}]
            assert "DROP is refused" in await refused(s, "sql", {"query": "DROP DATABASE agentstream"})
            # the embedded endpoint ignores max_execution_time: the tool stops waiting (timeout 1 s here)
            slow = await refused(s, "sql", {"query": "SELECT sleepEachRow(0.5) FROM numbers(5)"})
            assert "gave up after the time limit of 1 s" in slow

    try:
        wait_for(lambda: ready.exists() or not proc.alive(), timeout_s=60, what="agentstream mcp (http)")
        assert proc.alive(), proc.log_text()
        host, port = ready.read_text().split(":")
        assert host == "127.0.0.1"
        anyio.run(drive, f"http://127.0.0.1:{port}/mcp")
    finally:
        proc.stop()


def test_http_refuses_a_non_loopback_address(tmp_path):
    import subprocess

    out = subprocess.run([*AGENTSTREAM, "mcp", "--transport", "http", "--host", "0.0.0.0"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 1 and "host='0.0.0.0'" in out.stderr and "Traceback" not in out.stderr
