"""OTLP acceptance on the whole embedded stack (`agentstream up`'s supervisor: broker, rules, assembler,
sink, gateway): a multi-span agent trace (an LLM call, two tool calls, the final answer) exported by the
OpenTelemetry SDK's OTLP/HTTP exporter arrives in ClickHouse as one episode with the right steps, every
step gets its rule reward, the trajectory is assembled complete; the same batch sent again adds nothing."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.request

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan

from infra.stack import StackSupervisor, embedded_config
from tests.support.processes import free_port, wait_for

API_KEY = "otlp-stack-key"
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def agent_trace(tracer) -> None:
    with tracer.start_as_current_span(
        "invoke_agent fixer",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "fixer",
            "agentstream.domain": "coding",
            "agentstream.task": "make the failing test pass",
        },
    ):
        with tracer.start_as_current_span(
            "chat tiny",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "tiny",
                "gen_ai.usage.input_tokens": 120,
                "gen_ai.usage.output_tokens": 30,
            },
        ):
            time.sleep(0.01)
        for tool, args, result in (
            ("bash", {"command": "pytest -q"}, "1 failed, 11 passed"),
            ("read_file", {"path": "src/calc.py"}, "def add(a, b):\n    return a - b\n"),
        ):
            with tracer.start_as_current_span(
                f"execute_tool {tool}",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": tool,
                    "gen_ai.tool.call.arguments": json.dumps(args),
                    "gen_ai.tool.call.result": result,
                },
            ):
                time.sleep(0.01)
        with tracer.start_as_current_span(
            "chat tiny",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "tiny",
                "gen_ai.output.messages": json.dumps(
                    [
                        {
                            "role": "assistant",
                            "parts": [
                                {"type": "text", "content": "add() subtracts; it should return a + b."}
                            ],
                        }
                    ]
                ),
            },
        ):
            time.sleep(0.01)


@pytest.mark.timeout(180)
def test_an_exported_agent_trace_is_one_scored_episode_in_clickhouse(tmp_path):
    port = free_port()
    config = embedded_config(
        tmp_path / "stack",
        gateway=True,
        gateway_port=port,
        batch=False,
        extra_env={"AGENTSTREAM_GATEWAY_API_KEY_HASHES": hashlib.sha256(API_KEY.encode()).hexdigest()},
    )
    supervisor, stop = StackSupervisor(config), threading.Event()
    poller = threading.Thread(
        target=lambda: [supervisor.poll() or time.sleep(0.2) for _ in iter(stop.is_set, True)]
    )
    supervisor.start()
    poller.start()
    try:
        wait_for(lambda: _healthy(port), timeout_s=60, what="the gateway to answer /healthz")
        url = f"http://127.0.0.1:{port}/v1/traces"
        memory, provider = InMemorySpanExporter(), TracerProvider()
        exporter = OTLPSpanExporter(endpoint=url, headers={"Authorization": f"Bearer {API_KEY}"})
        provider.add_span_processor(BatchSpanProcessor(exporter))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        agent_trace(provider.get_tracer("fixer"))
        assert provider.force_flush(10_000)
        spans = list(memory.get_finished_spans())
        trace_id = format(spans[0].context.trace_id, "032x")
        query = config.query

        def scored():
            rows = query(
                "SELECT complete, total_steps FROM agentstream.trajectories FINAL "
                f"WHERE trajectory_id = '{trace_id}'"
            )
            return rows if rows and rows[0][0] else None

        assert wait_for(scored, timeout_s=60, interval_s=0.5, what="the trajectory to be scored") == [(1, 4)]
        steps = query(
            f"SELECT step_index, tool, params, observation, model, input_tokens, occurred_at "
            f"FROM agentstream.steps FINAL WHERE trajectory_id = '{trace_id}' ORDER BY step_index"
        )
        assert [(s[0], s[1]) for s in steps] == [(0, ""), (1, "bash"), (2, "read_file"), (3, "")]
        assert json.loads(steps[1][2]) == {"command": "pytest -q"} and steps[1][3] == "1 failed, 11 passed"
        assert (steps[0][4], steps[0][5]) == ("tiny", 120)
        first_start = min(s.start_time for s in spans if s.name == "chat tiny")
        assert abs(steps[0][6].timestamp() - first_start / 1e9) < 0.002  # the span's own timestamp
        rewards = query(
            f"SELECT step_index, score FROM agentstream.rule_rewards FINAL "
            f"WHERE trajectory_id = '{trace_id}' ORDER BY step_index"
        )
        assert [r[0] for r in rewards] == [0, 1, 2, 3] and all(r[1] is not None for r in rewards)
        episode = query(
            f"SELECT agent, domain, success, total_steps FROM agentstream.episodes FINAL "
            f"WHERE trajectory_id = '{trace_id}'"
        )
        assert episode == [("fixer", "coding", 1, 4)]
        # the exporter's retry of the same batch: nothing new anywhere
        before = query(f"SELECT count() FROM agentstream.events WHERE trajectory_id = '{trace_id}'")
        assert exporter.export(spans) == SpanExportResult.SUCCESS
        time.sleep(2)
        assert query(f"SELECT count() FROM agentstream.events WHERE trajectory_id = '{trace_id}'") == before
        _a_late_tool_span_is_a_fifth_step(provider.get_tracer("fixer"), spans, exporter, query, trace_id)
    finally:
        provider.shutdown()
        stop.set()
        poller.join()
        supervisor.stop()


def _a_late_tool_span_is_a_fifth_step(tracer, spans, exporter, query, trace_id: str) -> None:
    """A tool span of the trace exported after its root (another service's, or one that outlived the
    agent span): the next step, the episode ends again longer, a new revision is scored; no DLQ."""
    root = next(s for s in spans if s.parent is None)
    late = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(late))
    context = trace.set_span_in_context(NonRecordingSpan(root.context))
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "bash",
                  "gen_ai.tool.call.arguments": json.dumps({"command": "pytest -q"}),
                  "gen_ai.tool.call.result": "12 passed"}  # fmt: skip
    with provider.get_tracer("fixer").start_as_current_span(
        "execute_tool bash", context, attributes=attributes
    ):
        pass
    assert exporter.export(list(late.get_finished_spans())) == SpanExportResult.SUCCESS

    def five_steps():
        rows = query(
            "SELECT complete, total_steps, revision FROM agentstream.trajectories FINAL "
            f"WHERE trajectory_id = '{trace_id}'"
        )
        return rows if rows and rows[0][:2] == (1, 5) else None

    assert wait_for(five_steps, timeout_s=60, interval_s=0.5, what="a revision with the late step")[0][2] >= 1
    where = f"FINAL WHERE trajectory_id = '{trace_id}'"
    assert query(f"SELECT total_steps FROM agentstream.episodes {where}") == [(5,)]
    assert query(f"SELECT step_index, tool FROM agentstream.steps {where} AND step_index = 4") == [
        (4, "bash")
    ]
    rewarded = wait_for(
        lambda: query(f"SELECT count() FROM agentstream.rule_rewards {where}") == [(5,)],
        what="5 rule rewards",
    )
    assert rewarded and query("SELECT count() FROM agentstream.dead_letters") == [(0,)]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
