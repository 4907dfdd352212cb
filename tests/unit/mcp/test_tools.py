"""The tool functions that need no store, and the MCP wiring: names, descriptions, annotations and
how failures reach the client."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from infra.mcp import data_tools, env_tools, reward_tools
from infra.mcp.config import McpConfig
from infra.mcp.errors import McpToolError
from infra.mcp.server import build_server, tool_errors, tool_names
from tests.support.processes import free_port

CONFIG = McpConfig(clickhouse_url="http://127.0.0.1:1", bootstrap_servers="127.0.0.1:1")
READ = {"tool": "read_file", "params": {"file_path": "a.py"}, "observation": "see src/b.py"}
EDIT = {"tool": "edit_file", "params": {"file_path": "src/b.py", "old_string": "a", "new_string": "b"}}


def run_of(tid: str, steps: list[dict], success: bool) -> dict:
    return {
        "trajectory_id": tid,
        "task_id": "t",
        "domain": "coding",
        "steps": steps,
        "outcome": {"success": success},
    }


def test_the_server_lists_every_tool_with_a_description_and_hints():
    server = build_server(CONFIG)
    tools = {t.name: t for t in anyio.run(server.list_tools)}
    assert list(tools) == tool_names(CONFIG) and len(tools) == 12
    assert all(len(t.description) > 40 for t in tools.values())
    assert tools["sql"].annotations.read_only_hint is True
    assert tools["annotate"].annotations.read_only_hint is False
    assert tools["sql"].input_schema["required"] == ["query"]
    resources = {str(r.uri) for r in anyio.run(server.list_resources)}
    assert "schema://events/episode.started" in resources and "schema://events" in resources


def test_expected_failures_reach_the_client_as_their_message():
    from mcp.server.mcpserver.exceptions import ToolError

    def refuses(query: str) -> dict:
        raise McpToolError(f"query: {query} is refused")

    with pytest.raises(ToolError, match="query: DROP is refused"):
        tool_errors(refuses)("DROP")

    def crashes() -> dict:
        raise KeyError("a bug")

    with pytest.raises(KeyError):  # a bug stays a bug: the SDK logs it and answers generically
        tool_errors(crashes)()


def test_an_empty_or_oversized_query_never_reaches_the_engine():
    # nothing listens on port 1: a query that got that far would fail to connect instead (the
    # statement itself is read by ClickHouse's parser: tests/integration/mcp/test_sql_hostile.py)
    with pytest.raises(McpToolError, match="non-empty"):
        data_tools.sql(CONFIG, "  ")
    with pytest.raises(McpToolError, match="the limit is 100000"):
        data_tools.sql(CONFIG, "SELECT 1 " + "-" * 100_000)


def test_config_binds_only_loopback_and_checks_limits():
    with pytest.raises(McpToolError, match=r"host='0\.0\.0\.0'.*no authentication"):
        McpConfig(host="0.0.0.0")
    with pytest.raises(McpToolError, match="sql_max_rows=0"):
        McpConfig(sql_max_rows=0)
    with pytest.raises(McpToolError, match="sql_timeout_s=0"):
        McpConfig(sql_timeout_s=0)


def test_list_rubrics_gives_the_catalogue():
    coding = reward_tools.list_rubrics(CONFIG, "coding")
    assert {r["id"] for r in coding["rubrics"] if r["evaluator"] == "rule"} == {
        "info_utilization",
        "non_redundancy",
    }
    assert reward_tools.list_rubrics(CONFIG, "crew")["resolved_domain"] == "generic"
    everything = reward_tools.list_rubrics(CONFIG)
    assert {"coding", "conversation", "generic"} <= set(everything["domains"])
    assert all(abs(sum(r["weight"] for r in rs) - 1.0) < 1e-9 for rs in everything["domains"].values())


def test_score_trajectory_returns_the_scored_body():
    body = reward_tools.score_trajectory(CONFIG, run_of("a", [READ, READ], True))
    assert [s["redundancy"] for s in body["steps"]] == [1.0, 0.0]
    assert body["outcome_score"] == 1.0 and "event_id" not in body and body["trajectory_id"] == "a"


def test_build_preferences_from_json_at_both_levels():
    good, bad = run_of("good", [READ, EDIT], True), run_of("bad", [READ, READ], False)
    pairs = data_tools.build_preferences(CONFIG, [good, bad])
    assert [(p["chosen_trajectory_id"], p["rejected_trajectory_id"]) for p in pairs["pairs"]] == [
        ("good", "bad")
    ]
    assert pairs["pairs"][0]["margin"] > 0.05 and pairs["pairs"][0]["prompt"]
    steps = data_tools.build_preferences(CONFIG, [good, bad], level="step")
    assert [p["step_index"] for p in steps["pairs"]] == [1]  # the runs diverge at their second step
    assert steps["pairs"][0]["chosen"][0]["tool_calls"][0]["function"]["name"] == "edit_file"
    with pytest.raises(McpToolError, match="--dpo-min-margin: must be >= 0"):
        data_tools.build_preferences(CONFIG, [good, bad], min_margin=-1)


def test_a_scored_trajectory_event_is_taken_as_it_is():
    from infra.mcp.json_trajectory import score_json_trajectory

    event = score_json_trajectory(run_of("x", [READ], True)).model_dump(mode="json")
    [again] = data_tools.scored_from_json([event])
    assert again.model_dump(mode="json") == event


def test_list_environments_and_bad_rollout_input():
    envs = env_tools.list_environments(CONFIG)["environments"]
    assert {"calc", "sandbox", "conversation"} <= {e["id"] for e in envs}
    with pytest.raises(McpToolError, match="env 'nope': unknown environment"):
        env_tools.list_environments(CONFIG, "nope")
    config = dataclasses.replace(CONFIG, policy_urls=("http://127.0.0.1:1/v1",))
    with pytest.raises(McpToolError, match=r"task_ids: \['nope'\] are not built-in tasks of 'calc'"):
        env_tools.rollout(config, "http://127.0.0.1:1/v1", task_ids=["nope"])
    with pytest.raises(McpToolError, match="episodes per call"):
        env_tools.rollout(config, "http://127.0.0.1:1/v1", group_size=100)


def test_rollout_says_clearly_when_no_policy_server_answers():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(McpToolError, match=r"no policy server answers there.*agentstream policy"):
        env_tools.rollout(dataclasses.replace(CONFIG, policy_urls=(url,)), url)


def test_sandbox_run_limits_its_timeout():
    with pytest.raises(McpToolError, match="timeout_s"):
        env_tools.sandbox_run(CONFIG, "true", timeout_s=10_000)
