"""`POST /v1/traces` on the real `agentstream gateway` process and the embedded broker, with the real
OpenTelemetry SDK and its OTLP/HTTP exporter as the client; the topics are read back."""

from __future__ import annotations

import asyncio
import gzip
import json

import aiohttp
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from producers.gateway.otlp.spans import request_to_json
from producers.gateway.requests import hash_key
from schemas.topics import AGENT_EVENTS, DLQ
from tests.support.broker import start_broker
from tests.support.processes import AGENTSTREAM, Proc, free_port, wait_for
from tests.support.readback import count_records, read_topic

KEY = "otlp-key"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A broker and an `agentstream gateway` process (64 KB body limit, 50 spans per request)."""
    root = tmp_path_factory.mktemp("otlp")
    broker = start_broker(root / "broker")
    ready = root / "gateway.ready"
    args = [
        *AGENTSTREAM,
        "gateway",
        "--bootstrap-servers",
        broker.bootstrap,
        "--port",
        "0",
        "--max-body-bytes",
        "65536",
        "--max-events",
        "50",
        "--ready-file",
        str(ready),
        "--data-dir",
        str(root),
    ]
    proc = Proc(args, root / "gateway.log", env={"AGENTSTREAM_GATEWAY_API_KEY_HASHES": hash_key(KEY)})

    def listening():
        if not proc.alive():
            raise RuntimeError(f"gateway exited: {proc.log_text()[-2000:]}")
        return ready.exists() and ready.read_text()

    try:
        yield f"http://{wait_for(listening, timeout_s=30, what='the gateway to listen')}", broker
    finally:
        proc.stop()
        broker.stop()


def agent_trace(tracer, tag: str) -> None:
    """GenAI conventions: an agent span around an LLM call, two tool calls and the final answer."""
    with tracer.start_as_current_span(
        "invoke_agent travel",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "travel",
            "agentstream.task": tag,
        },
    ):
        with tracer.start_as_current_span(
            "chat tiny",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "tiny",
                "gen_ai.usage.input_tokens": 40,
                "gen_ai.usage.output_tokens": 7,
            },
        ):
            pass
        for city in ("Oslo", "Lima"):
            with tracer.start_as_current_span(
                "execute_tool get_weather",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "get_weather",
                    "gen_ai.tool.call.arguments": json.dumps({"city": city}),
                    "gen_ai.tool.call.result": f"{city}: 12C",
                },
            ):
                pass
        with tracer.start_as_current_span(
            "chat tiny",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": "tiny",
                "gen_ai.output.messages": json.dumps(
                    [
                        {
                            "role": "assistant",
                            "parts": [{"type": "text", "content": "Oslo and Lima are both 12C."}],
                        }
                    ]
                ),
            },
        ):
            pass


def openinference_trace(tracer, tag: str) -> None:
    with (
        tracer.start_as_current_span(
            "agent", attributes={"openinference.span.kind": "AGENT", "input.value": tag}
        ),
        tracer.start_as_current_span("chain", attributes={"openinference.span.kind": "CHAIN"}),
    ):
        with tracer.start_as_current_span(
            "llm", attributes={"openinference.span.kind": "LLM", "llm.model_name": "tiny"}
        ):
            pass
        for city in ("Oslo", "Lima"):
            with tracer.start_as_current_span(
                "get_weather",
                attributes={
                    "openinference.span.kind": "TOOL",
                    "tool.name": "get_weather",
                    "input.value": json.dumps({"city": city}),
                    "output.value": f"{city}: 12C",
                },
            ):
                pass
        with tracer.start_as_current_span(
            "llm",
            attributes={
                "openinference.span.kind": "LLM",
                "llm.model_name": "tiny",
                "output.value": "both 12C",
            },
        ):
            pass


def export(url: str, write, tag: str, batch: bool = False, **exporter_kwargs):
    """Run `write` under a TracerProvider exporting to the gateway; returns the finished spans."""
    exporter = OTLPSpanExporter(
        endpoint=f"{url}/v1/traces", headers={"Authorization": f"Bearer {KEY}"}, **exporter_kwargs
    )
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    write(provider.get_tracer("agent"), tag)
    assert provider.force_flush(10_000)
    provider.shutdown()
    return list(memory.get_finished_spans())


def trace_events(bootstrap: str, trace_id: str, min_records: int) -> list[dict]:
    return [
        r["value"] for r in read_topic(bootstrap, AGENT_EVENTS, min_records) if r["key"] == trace_id.encode()
    ]


def post(
    url: str, body: bytes, content_type: str, key: str | None = KEY, **headers
) -> tuple[int, bytes, str]:
    async def go():
        sent = {"Content-Type": content_type, **headers} | ({"Authorization": f"Bearer {key}"} if key else {})
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}/v1/traces", data=body, headers=sent) as r,
        ):
            return r.status, await r.read(), r.content_type

    return asyncio.run(go())


def hex_trace(spans) -> str:
    return format(spans[0].context.trace_id, "032x")


@pytest.mark.parametrize(
    ("write", "batch", "compression"),
    [
        (agent_trace, False, Compression.NoCompression),  # one request per span, in end order: the root last
        (openinference_trace, True, Compression.Gzip),  # one gzip request with every span
    ],
)
def test_an_exported_agent_trace_arrives_as_one_episode_with_its_steps(gateway, write, batch, compression):
    url, broker = gateway
    before = count_records(broker.bootstrap, AGENT_EVENTS)
    spans = export(url, write, f"trip {write.__name__}", batch=batch, compression=compression)
    events = trace_events(broker.bootstrap, hex_trace(spans), before + 6)
    by_type = {}
    for event in events:
        by_type.setdefault(event["type"], []).append(event)
    assert len(by_type["episode.started"]) == 1 and len(by_type["episode.ended"]) == 1
    assert by_type["episode.ended"][0]["total_steps"] == 4 and by_type["episode.ended"][0]["success"]
    assert by_type["episode.started"][0]["task"] == f"trip {write.__name__}"
    got = sorted(by_type["step.recorded"], key=lambda e: e["step_index"])
    assert [(s["step_index"], s["tool"]) for s in got] == [
        (0, ""),
        (1, "get_weather"),
        (2, "get_weather"),
        (3, ""),
    ]
    assert [s["params"] for s in got[1:3]] == [{"city": "Oslo"}, {"city": "Lima"}]
    assert [s["observation"] for s in got[1:3]] == ["Oslo: 12C", "Lima: 12C"] and got[0]["model"] == "tiny"
    starts = sorted(s.start_time for s in spans if s.parent is not None and s.name not in ("chain",))
    assert [s["occurred_at"] for s in got] == [_iso(ns) for ns in starts]


def _iso(ns: int) -> str:
    from datetime import UTC, datetime, timedelta

    return (
        (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ns // 1000))
        .isoformat()
        .replace("+00:00", "Z")
    )


def test_the_same_batch_twice_adds_nothing_and_json_gives_identical_events(gateway, tmp_path):
    url, broker = gateway
    spans = export(url, agent_trace, "twice", batch=True)
    trace_id = hex_trace(spans)
    first = trace_events(broker.bootstrap, trace_id, count_records(broker.bootstrap, AGENT_EVENTS))
    assert len(first) == 6
    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", headers={"Authorization": f"Bearer {KEY}"})
    total = count_records(broker.bootstrap, AGENT_EVENTS)
    assert exporter.export(spans) == SpanExportResult.SUCCESS  # the exporter's retry of the whole batch
    assert count_records(broker.bootstrap, AGENT_EVENTS) == total
    # the same spans as OTLP JSON, to a second gateway (its own step cursor): byte-identical events
    other = _second_gateway(broker.bootstrap, tmp_path)
    try:
        status, body, _ = post(other, request_to_json(encode_spans(spans)), "application/json")
        assert status == 200 and json.loads(body) == {}
        again = trace_events(broker.bootstrap, trace_id, total + 6)
    finally:
        other.proc.stop()  # type: ignore[attr-defined]
    assert len(again) == 12 and sorted(map(json.dumps, again[6:])) == sorted(map(json.dumps, first))


class _Url(str):
    proc: Proc


def _second_gateway(bootstrap: str, root, name: str = "gateway2") -> _Url:
    ready = root / f"{name}.ready"
    ready.unlink(missing_ok=True)
    args = [
        *AGENTSTREAM,
        "gateway",
        "--bootstrap-servers",
        bootstrap,
        "--port",
        str(free_port()),
        "--ready-file",
        str(ready),
        "--otlp-cursor-path",
        str(root / f"{name}.sqlite"),
    ]
    proc = Proc(args, root / f"{name}.log", env={"AGENTSTREAM_GATEWAY_API_KEY_HASHES": hash_key(KEY)})
    address = wait_for(lambda: ready.exists() and ready.read_text(), timeout_s=30, what="a second gateway")
    url = _Url(f"http://{address}")
    url.proc = proc
    return url


def test_a_span_keeps_its_step_index_across_a_gateway_killed_and_restarted(gateway, tmp_path):
    """The exporter resends after a crash: two steps first, then, to a restarted gateway, every span
    again with the root. Each step is one event at one index; the episode counts each once."""
    _, broker = gateway
    spans = _spans(agent_trace, "restart")
    trace_id = hex_trace(spans)
    # the later two steps arrive first (a batch of their own), so start order alone would renumber them
    children = sorted((s for s in spans if s.parent is not None), key=lambda s: s.start_time)[2:]
    first = _second_gateway(broker.bootstrap, tmp_path, "crashing")
    try:
        status, _, _ = post(first, encode_spans(children).SerializeToString(), "application/x-protobuf")
        assert status == 200
    finally:
        first.proc.kill9()
        first.proc.stop()
    before = count_records(broker.bootstrap, AGENT_EVENTS)
    again = _second_gateway(broker.bootstrap, tmp_path, "crashing")
    try:
        status, _, _ = post(again, encode_spans(spans).SerializeToString(), "application/x-protobuf")
        assert status == 200
    finally:
        again.proc.stop()
    events = trace_events(broker.bootstrap, trace_id, before + 2)
    steps = {}
    for event in (e for e in events if e["type"] == "step.recorded"):
        steps.setdefault(event["event_id"], set()).add(event["step_index"])
    assert len(steps) == 4 and all(len(indexes) == 1 for indexes in steps.values())
    assert sorted(i for (i,) in steps.values()) == [0, 1, 2, 3]
    [ended] = [e for e in events if e["type"] == "episode.ended"]
    assert ended["total_steps"] == 4


def test_malformed_payloads_get_400_with_a_reason_and_land_in_no_topic(gateway):
    url, broker = gateway
    counts = (count_records(broker.bootstrap, AGENT_EVENTS), count_records(broker.bootstrap, DLQ))
    for body, content_type, headers, reason in [
        (b"\x0a\xff\xff", "application/x-protobuf", {}, "not an OTLP protobuf ExportTraceServiceRequest"),
        (b'{"resourceSpans": [', "application/json", {}, "not valid JSON (unexpected end of data: line 1"),
        (
            b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"}]}]}]}',
            "application/json",
            {},
            "traceId: expected a hex id",
        ),
        (b"not gzip at all", "application/x-protobuf", {"Content-Encoding": "gzip"}, "cannot read the body"),
    ]:
        status, answer, _ = post(url, body, content_type, **headers)
        assert status == 400 and reason in json.loads(answer)["message"], answer
    assert (count_records(broker.bootstrap, AGENT_EVENTS), count_records(broker.bootstrap, DLQ)) == counts


def test_auth_media_type_and_size_limits_are_those_of_v1_events(gateway):
    url, _ = gateway
    request = encode_spans(_spans(lambda t, tag: agent_trace(t, tag), "limits")).SerializeToString()
    assert post(url, request, "application/x-protobuf", key=None)[0] == 401
    assert post(url, request, "application/x-protobuf", key="wrong")[0] == 401
    assert post(url, request, "text/plain")[0] == 415
    assert post(url, request, "application/x-protobuf", **{"Content-Encoding": "compress"})[0] == 415
    status, answer, _ = post(url, b"\x00" * 70_000, "application/x-protobuf")
    assert status == 413 and "exceeds the limit of 65536 bytes" in json.loads(answer)["errors"][0]["message"]
    inflated = gzip.compress(b"\x00" * 70_000)  # small on the wire, over the limit once decompressed
    assert post(url, inflated, "application/x-protobuf", **{"Content-Encoding": "gzip"})[0] == 413
    many = encode_spans(
        _spans(lambda t, tag: [agent_trace(t, tag) for _ in range(11)], "many")
    ).SerializeToString()
    status, answer, _ = post(url, many, "application/x-protobuf")
    assert status == 413 and "55 spans exceed the limit of 50" in answer.decode()


def _spans(write, tag: str) -> list:
    memory, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    write(provider.get_tracer("t"), tag)
    return list(memory.get_finished_spans())


def test_unmappable_spans_land_in_the_dlq_with_trace_and_span_ids(gateway):
    url, broker = gateway

    def with_http_span(tracer, tag):
        with tracer.start_as_current_span("agent", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with tracer.start_as_current_span("POST /api", attributes={"http.request.method": "POST"}):
                pass
            with tracer.start_as_current_span(
                "chat", attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"}
            ):
                pass

    spans = _spans(with_http_span, "dlq")
    trace_id, bad = hex_trace(spans), next(s for s in spans if s.name == "POST /api")
    dead_before = count_records(broker.bootstrap, DLQ)
    status, body, content_type = post(url, encode_spans(spans).SerializeToString(), "application/x-protobuf")
    answer = ExportTraceServiceResponse.FromString(body)
    assert status == 200 and content_type == "application/x-protobuf"
    assert (
        answer.partial_success.rejected_spans == 1
        and "not a GenAI span" in answer.partial_success.error_message
    )
    letters = [r for r in read_topic(broker.bootstrap, DLQ, dead_before + 1) if r["key"] == trace_id.encode()]
    assert len(letters) == 1
    letter = letters[0]["value"]
    assert letter["stage"] == "gateway" and letter["trajectory_id"] == trace_id
    assert f"otlp trace {trace_id} span {format(bad.context.span_id, '016x')}" in letter["reason"]
    assert json.loads(letter["payload"])["span"]["name"] == "POST /api"
    events = trace_events(broker.bootstrap, trace_id, count_records(broker.bootstrap, AGENT_EVENTS))
    assert sorted(e["type"] for e in events) == ["episode.ended", "episode.started", "step.recorded"]


def test_the_openai_instrumentation_calling_the_policy_server_is_an_episode(gateway, tmp_path):
    """The OpenTelemetry instrumentation of the `openai` SDK (GenAI spans) around real calls to the
    policy server (`agentstream policy`, the tiny model, its own recording off): the exporter's spans
    become the episode's LLM steps with the model, token usage and latency."""
    pytest.importorskip(
        "opentelemetry.instrumentation.openai_v2", reason="opentelemetry-instrumentation-openai-v2"
    )
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    from consumers.tiny_model import tiny_model_dir
    from tests.support.policy import policy_server

    url, broker = gateway
    tiny = tiny_model_dir(tmp_path / "models")
    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", headers={"Authorization": f"Bearer {KEY}"})
    provider, memory = TracerProvider(), InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        with policy_server(tmp_path / "policy", broker.bootstrap, tiny, "--no-record") as (policy, _):
            api = openai.OpenAI(base_url=f"{policy}/v1", api_key="none", max_retries=0, timeout=120)
            tracer = provider.get_tracer("agent")
            with tracer.start_as_current_span(
                "invoke_agent tiny-agent", attributes={"gen_ai.operation.name": "invoke_agent"}
            ):
                for question in ("What is 2 + 2?", "And 3 + 3?"):
                    api.chat.completions.create(
                        model="policy", messages=[{"role": "user", "content": question}], max_tokens=8, seed=7
                    )
    finally:
        instrumentor.uninstrument()
        provider.shutdown()
    spans = list(memory.get_finished_spans())
    chats = sorted(
        (s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"), key=lambda s: s.start_time
    )
    assert len(chats) == 2, [(s.name, dict(s.attributes)) for s in spans]
    events = trace_events(broker.bootstrap, hex_trace(spans), count_records(broker.bootstrap, AGENT_EVENTS))
    steps = sorted((e for e in events if e["type"] == "step.recorded"), key=lambda e: e["step_index"])
    assert [s["step_index"] for s in steps] == [0, 1] and all(s["tool"] == "" for s in steps)
    for step, span in zip(steps, chats, strict=True):
        assert step["model"] == span.attributes.get(
            "gen_ai.response.model", span.attributes["gen_ai.request.model"]
        )
        assert step["input_tokens"] == span.attributes["gen_ai.usage.input_tokens"] > 0
        assert step["output_tokens"] == span.attributes["gen_ai.usage.output_tokens"] > 0
        assert step["latency_ms"] == pytest.approx((span.end_time - span.start_time) / 1e6, abs=0.01)
    ended = next(e for e in events if e["type"] == "episode.ended")
    assert ended["total_steps"] == 2 and ended["success"]
