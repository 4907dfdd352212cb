"""The MCP wiring: every tool of infra/mcp/*_tools.py and the event contract's JSON Schemas, served
by the official `mcp` SDK's `MCPServer` (FastMCP in mcp 1.x) over stdio or streamable HTTP.

Only signatures, descriptions and error translation live here; the work is in the plain tool
functions, which take the `McpConfig` first. A tool's docstring below is what the client's model
reads. Errors: an `AgentstreamError` (bad input, an unknown id, a refused query, an unreachable
service) or a ClickHouse error becomes an MCP tool error whose text is the one-line message; any
other exception is a bug, logged with its traceback, and reaches the client as a generic failure.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from typing import Any, Literal

from infra.mcp import data_tools, env_tools, reward_tools
from infra.mcp.config import McpConfig
from schemas.errors import AgentstreamError

log = logging.getLogger(__name__)

SERVER_NAME = "agentstream"
INSTRUCTIONS = (
    "agentstream: agent trajectories, their rewards (rules, LLM judge, human labels) and training data. "
    "Read with sql (read-only ClickHouse), leaderboard and trajectory; score a trajectory's steps with "
    "score_trajectory; build DPO pairs with build_preferences; label with annotate; run environments "
    "with sandbox_run and rollout. Event JSON Schemas are resources under schema://events/."
)
SCHEMA_URI = "schema://events/{event_type}"
READ_ONLY = {"read_only_hint": True, "destructive_hint": False, "open_world_hint": False}
WRITES = {"read_only_hint": False, "destructive_hint": False}


def tool_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with expected failures raised as the SDK's ToolError, so the client sees the reason."""
    from mcp.server.mcpserver.exceptions import ToolError

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AgentstreamError as exc:
            raise ToolError(str(exc)) from None
        except Exception as exc:
            if not type(exc).__module__.startswith("clickhouse_connect"):
                raise
            raise ToolError(f"ClickHouse: {exc}") from None

    return wrapper


def build_server(config: McpConfig):
    """An `MCPServer` with every tool and resource bound to `config`."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer(SERVER_NAME, instructions=INSTRUCTIONS)
    for fn, hints in [*_data_tools(config), *_reward_tools(config), *_env_tools(config)]:
        server.add_tool(tool_errors(fn), annotations=ToolAnnotations(**hints))
    _add_schema_resources(server)
    return server


def tool_names(config: McpConfig | None = None) -> list[str]:
    """The names of the tools `build_server` registers, in order."""
    config = config or McpConfig()
    return [fn.__name__ for fn, _ in [*_data_tools(config), *_reward_tools(config), *_env_tools(config)]]


def _data_tools(config: McpConfig) -> list[tuple[Callable[..., Any], dict]]:
    """Long: the ClickHouse tools; one closure each, its docstring the tool's description."""

    def sql(query: str) -> dict[str, Any]:
        """Run one read-only ClickHouse query (SELECT, WITH, SHOW, DESCRIBE) on the agentstream
        database (tables: episodes, steps, rule_rewards, judge_scores, annotations, trajectories,
        events, batches, policy_updates; views: episode_outcomes, ...). Anything else is refused.
        Returns columns, rows (objects), row_count and truncated (the row limit was hit)."""
        return data_tools.sql(config, query)

    def leaderboard(by: str = "model", domain: str | None = None, since: str | None = None) -> dict[str, Any]:
        """Success rate and mean reward per model, agent or policy_version (by) within each domain,
        with a 95% bootstrap CI and Holm-corrected Welch p-values against the domain's best.
        since: a date (YYYY-MM-DD)."""
        return data_tools.leaderboard(config, by, domain, since)

    def trajectory(trajectory_id: str, detail: bool = False) -> dict[str, Any]:
        """One trajectory: its episode and per-step scores of every layer (rule, judge, human,
        process). detail=true adds every step's text, judge verdicts with rationales and annotations."""
        return data_tools.trajectory(config, trajectory_id, detail)

    def build_preferences(
        trajectories: list[dict[str, Any]] | None = None,
        task_id: str | None = None,
        level: Literal["trajectory", "step"] = "trajectory",
        min_margin: float = 0.05,
        strategy: Literal["best_vs_worst", "all_pairs"] = "best_vs_worst",
        max_pairs: int = 8,
    ) -> dict[str, Any]:
        """DPO preference pairs (TRL's prompt/chosen/rejected) per task, from trajectories given as
        JSON (trajectory.scored events, or trajectories as score_trajectory takes them, which are
        scored first) or, without them, from the scored trajectories in ClickHouse (of task_id).
        level=step pairs the first step where two runs of a task diverge. Evaluation episodes
        (purpose eval) are never offered."""
        return data_tools.build_preferences(
            config, trajectories, task_id, level, min_margin, strategy, max_pairs
        )

    def export_dataset(
        kind: Literal["sft", "dpo", "dpo_step", "grpo"] = "sft",
        out_dir: str | None = None,
        fmt: Literal["jsonl", "parquet", "hf"] = "jsonl",
        source: Literal["clickhouse", "batches"] = "clickhouse",
        split: str = "0.8,0.1,0.1",
        seed: int = 0,
        min_reward: float | None = None,
        require_success: bool = True,
    ) -> dict[str, Any]:
        """Write a training dataset (TRL rows: sft, dpo, dpo_step or grpo) from the scored
        trajectories in ClickHouse (or the trainer's batch files) as jsonl, parquet or a Hub-style
        directory, split by task into train/validation/test (a task never spans two splits), and
        validate it. A relative out_dir lies under <data dir>/exports/. Returns rows per split, the
        files written and any problems the validation found."""
        return data_tools.export_dataset(
            config, kind, out_dir, fmt, source, split, seed, min_reward, require_success
        )

    return [
        (sql, READ_ONLY),
        (leaderboard, READ_ONLY),
        (trajectory, READ_ONLY),
        (build_preferences, READ_ONLY),
        (export_dataset, WRITES),
    ]


def _reward_tools(config: McpConfig) -> list[tuple[Callable[..., Any], dict]]:
    """Long: the reward-model tools; one closure each, its docstring the tool's description."""

    def score_trajectory(trajectory: dict[str, Any]) -> dict[str, Any]:
        """Score a trajectory with the rule layer (redundancy, regression, information use per step),
        its outcome and efficiency, as the stream workers would. trajectory: {domain, task_id,
        reference_steps?, steps: [{tool, params, observation, thought?, exit_code?, error?}],
        outcome?: {success, score?, tests_passed?, tests_failed?}}. Returns the trajectory.scored
        body: per-step scores, process/outcome/efficiency scores and total_reward."""
        return reward_tools.score_trajectory(config, trajectory)

    def list_rubrics(domain: str | None = None) -> dict[str, Any]:
        """The built-in rubrics per domain: id, weight, evaluator (rule, model or human) and what
        each asks. With domain, that domain's set (unknown domains use generic)."""
        return reward_tools.list_rubrics(config, domain)

    def annotate(
        trajectory_id: str,
        score: float,
        rubric: str = "overall",
        step_index: int | None = None,
        annotator: str = "",
        comment: str = "",
    ) -> dict[str, Any]:
        """Publish a human label (score 0..1) for a trajectory, or for one step with step_index, to
        the feedback.human topic; the assembler folds it into the trajectory's rewards."""
        return reward_tools.annotate(config, trajectory_id, score, rubric, step_index, annotator, comment)

    def calibration_report(
        domain: str | None = None, min_pairs: int = 10, source: Literal["clickhouse", "topics"] = "clickhouse"
    ) -> dict[str, Any]:
        """How well the LLM judge agrees with human labels per (domain, rubric): Pearson, Spearman,
        Kendall, pairwise agreement, MAE before and after the isotonic map it would fit. Read-only:
        maps are not published (agentstream calibrate --publish does that)."""
        return reward_tools.calibration_report(config, domain, min_pairs, source)

    return [
        (score_trajectory, READ_ONLY),
        (list_rubrics, READ_ONLY),
        (annotate, WRITES),
        (calibration_report, READ_ONLY),
    ]


def _env_tools(config: McpConfig) -> list[tuple[Callable[..., Any], dict]]:
    """Long: the environment tools; one closure each, its docstring the tool's description."""

    def list_environments(env: str | None = None) -> dict[str, Any]:
        """The registered agent environments: id, domain, description, terminal tools and built-in
        task ids (what rollout can run)."""
        return env_tools.list_environments(config, env)

    def sandbox_run(
        command: str | list[str], files: dict[str, str] | None = None, timeout_s: float = 10.0
    ) -> dict[str, Any]:
        """Run a command in a fresh, private local sandbox (a shell script string, or an argv list),
        after writing files (relative path -> text) into its workspace. Commands run under CPU,
        memory, file-size and process limits and a wall-clock timeout, without network where the
        kernel allows (isolation says what was enforced). The workspace is deleted afterwards."""
        return env_tools.sandbox_run(config, command, files, timeout_s)

    def rollout(
        policy_url: str | None = None,
        env: str = "calc",
        task_ids: list[str] | None = None,
        group_size: int = 1,
        max_turns: int = 4,
        model: str = "policy",
        max_tasks: int = 1,
    ) -> dict[str, Any]:
        """Run episodes of an environment's built-in tasks against a policy server (an
        OpenAI-compatible URL such as http://127.0.0.1:8000/v1 from `agentstream policy`), recorded
        to the broker like `agentstream rollout`. policy_url must be one of the policy endpoints
        configured for the stack (default: the stack's own); any other URL is refused. Fails
        clearly when no policy server answers."""
        return env_tools.rollout(config, policy_url, env, task_ids, group_size, max_turns, model, max_tasks)

    return [
        (list_environments, READ_ONLY),
        (sandbox_run, {"read_only_hint": False, "destructive_hint": False, "open_world_hint": False}),
        (rollout, {**WRITES, "open_world_hint": True}),
    ]


def _add_schema_resources(server) -> None:
    """One resource per event type (`schema://events/<type>`) and an index at `schema://events`."""
    from mcp.server.mcpserver.resources import FunctionResource

    from schemas.events import EVENT_MODELS

    for event_type in EVENT_MODELS:
        server.add_resource(
            FunctionResource.from_function(
                fn=functools.partial(_schema_text, event_type),
                uri=SCHEMA_URI.format(event_type=event_type),
                name=event_type,
                description=f"JSON Schema (draft 2020-12) of the {event_type} event",
                mime_type="application/schema+json",
            )
        )

    @server.resource("schema://events", name="event-types", mime_type="application/json")
    def event_types() -> str:
        """Every event type of the contract and the URI of its JSON Schema."""
        return json.dumps({t: SCHEMA_URI.format(event_type=t) for t in EVENT_MODELS}, indent=2)


def _schema_text(event_type: str) -> str:
    from schemas.export import json_schema

    return json.dumps(json_schema(event_type), indent=2, sort_keys=True)


# --- serving ----------------------------------------------------------------------------------------


def serve(
    config: McpConfig, ready_file: str | None = None, on_listening: Callable[[str], None] | None = None
):
    """Serve until the client goes away (stdio) or the process is stopped (HTTP)."""
    server = build_server(config)
    if config.transport == "stdio":
        server.run("stdio")
        return
    import anyio

    anyio.run(_serve_http, server, config, ready_file, on_listening)


async def _serve_http(server, config: McpConfig, ready_file: str | None, on_listening) -> None:
    """Streamable HTTP at `http://host:port/mcp`; the socket is bound first, so port 0 works and the
    ready file names the real port."""
    import socket
    from pathlib import Path

    import uvicorn

    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    sock.listen(128)  # clients that connect before uvicorn accepts wait in the backlog
    port = sock.getsockname()[1]
    app = server.streamable_http_app(host=config.host)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    url = f"http://{config.host}:{port}/mcp"
    if on_listening is not None:
        on_listening(url)
    if ready_file:
        Path(ready_file).write_text(f"{config.host}:{port}")
    await uv.serve(sockets=[sock])
