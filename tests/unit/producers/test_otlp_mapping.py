"""OTLP spans -> episodes and steps (producers.gateway.otlp.mapping,
producers.gateway.otlp.endpoint.decode_request): agent traces
written with the real OpenTelemetry SDK in both conventions (GenAI `gen_ai.*`, OpenInference span
kinds), encoded by the SDK's own OTLP encoder; no broker."""

from __future__ import annotations

import json
import random

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from producers.errors import RequestRejected
from producers.gateway.otlp.endpoint import decode_request
from producers.gateway.otlp.mapping import map_spans
from producers.gateway.otlp.spans import request_to_json, spans_of
from producers.gateway.otlp.step_cursor import StepCursor
from schemas.events import EpisodeEnded, EpisodeStarted, StepRecorded


def _messages(*parts: dict, role: str = "assistant") -> str:
    return json.dumps([{"role": role, "parts": list(parts)}])


def genai_trace(tracer, fail_tool: bool = False) -> None:
    """An agent: one LLM call asking for two tools, the two tool calls, a final answer."""
    question = _messages({"type": "text", "content": "Weather in Paris and Rome?"}, role="user")
    agent = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "weather-bot",
        "gen_ai.conversation.id": "conv-7",
        "gen_ai.input.messages": question,
    }
    with tracer.start_as_current_span("invoke_agent weather-bot", attributes=agent):
        calls = _messages(
            {"type": "tool_call", "id": "c1", "name": "get_weather", "arguments": {"city": "Paris"}},
            {"type": "tool_call", "id": "c2", "name": "get_weather", "arguments": {"city": "Rome"}},
        )
        _chat(tracer, calls, 50, 12, "tool_calls")
        for city, result in (("Paris", "18C sunny"), ("Rome", "22C cloudy")):
            tool = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "get_weather",
                "gen_ai.tool.call.arguments": json.dumps({"city": city}),
                "gen_ai.tool.call.result": result,
            }
            with tracer.start_as_current_span("execute_tool get_weather", attributes=tool) as span:
                if fail_tool and city == "Rome":
                    span.set_status(Status(StatusCode.ERROR, "timeout after 5 s"))
        _chat(tracer, _messages({"type": "text", "content": "Paris 18C, Rome 22C."}), 80, 9, "stop")


def _chat(tracer, output: str, tokens_in: int, tokens_out: int, finish: str) -> None:
    attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "tiny-1",
        "gen_ai.response.model": "tiny-1-0501",
        "gen_ai.usage.input_tokens": tokens_in,
        "gen_ai.usage.output_tokens": tokens_out,
        "gen_ai.output.messages": output,
        "gen_ai.response.finish_reasons": [finish],
    }
    with tracer.start_as_current_span("chat tiny-1", attributes=attrs):
        pass


def openinference_trace(tracer) -> None:
    """The same agent in OpenInference: AGENT > CHAIN > LLM, TOOL, TOOL, LLM."""
    with (
        tracer.start_as_current_span(
            "agent",
            attributes={
                "openinference.span.kind": "AGENT",
                "session.id": "s-1",
                "input.value": "Weather in Paris and Rome?",
            },
        ),
        tracer.start_as_current_span("plan", attributes={"openinference.span.kind": "CHAIN"}),
    ):
        prefix = "llm.output_messages.0.message.tool_calls"
        first = {
            "openinference.span.kind": "LLM",
            "llm.model_name": "tiny-1",
            "llm.token_count.prompt": 50,
            "llm.token_count.completion": 12,
            f"{prefix}.0.tool_call.function.name": "get_weather",
            f"{prefix}.0.tool_call.function.arguments": '{"city": "Paris"}',
            f"{prefix}.1.tool_call.function.name": "get_weather",
            f"{prefix}.1.tool_call.function.arguments": '{"city": "Rome"}',
        }
        with tracer.start_as_current_span("ChatCompletion", attributes=first):
            pass
        for city, result in (("Paris", "18C sunny"), ("Rome", "22C cloudy")):
            tool = {
                "openinference.span.kind": "TOOL",
                "tool.name": "get_weather",
                "input.value": json.dumps({"city": city}),
                "output.value": result,
            }
            with tracer.start_as_current_span("get_weather", attributes=tool):
                pass
        final = {
            "openinference.span.kind": "LLM",
            "llm.model_name": "tiny-1",
            "llm.token_count.prompt": 80,
            "llm.token_count.completion": 9,
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.content": "Paris 18C, Rome 22C.",
        }
        with tracer.start_as_current_span("ChatCompletion", attributes=final):
            pass


def finished_spans(write, **kwargs) -> list:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    write(provider.get_tracer("test"), **kwargs)
    provider.shutdown()
    return list(exporter.get_finished_spans())


def request_bytes(spans) -> bytes:
    return encode_spans(spans).SerializeToString()


def events_of(body: bytes, media: str = "protobuf", cursor: StepCursor | None = None):
    mapped = map_spans(spans_of(decode_request(body, media)), cursor or StepCursor())
    return mapped.events, mapped.unmappable


def steps(events) -> list[StepRecorded]:
    return sorted((e for e in events if isinstance(e, StepRecorded)), key=lambda e: e.step_index)


@pytest.mark.parametrize("write", [genai_trace, openinference_trace])
def test_an_agent_trace_is_one_episode_with_its_llm_and_tool_steps_in_order(write):
    spans = finished_spans(write)
    events, unmappable = events_of(request_bytes(spans))
    assert unmappable == []
    trace_id = format(spans[0].context.trace_id, "032x")
    assert {e.trajectory_id for e in events} == {trace_id}
    started = next(e for e in events if isinstance(e, EpisodeStarted))
    ended = next(e for e in events if isinstance(e, EpisodeEnded))
    assert started.task == "Weather in Paris and Rome?" and ended.success and ended.total_steps == 4
    assert started.model.startswith("tiny-1")
    assert started.metadata["session_id"] in ("conv-7", "s-1")
    got = steps(events)
    assert [s.step_index for s in got] == [0, 1, 2, 3]
    assert [s.tool for s in got] == ["", "get_weather", "get_weather", ""]
    assert got[0].params["tool_calls"] == [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "arguments": {"city": "Rome"}},
    ]
    assert [s.params for s in got[1:3]] == [{"city": "Paris"}, {"city": "Rome"}]
    assert [s.observation for s in got[1:3]] == ["18C sunny", "22C cloudy"]
    assert got[3].thought == "Paris 18C, Rome 22C." and (got[3].input_tokens, got[3].output_tokens) == (80, 9)
    assert got[0].model.startswith("tiny-1") and got[1].model == ""
    by_id = {format(s.context.span_id, "016x"): s for s in spans}
    for step in got:  # span timestamps are kept: occurred_at is the span's start, latency its duration
        span = next(s for s in spans if s.start_time // 1000 == int(step.occurred_at.timestamp() * 1e6))
        assert step.latency_ms == pytest.approx((span.end_time - span.start_time) / 1e6, abs=0.01)
    assert started.metadata["otlp"]["root_span_id"] in by_id


def test_protobuf_and_json_give_identical_events():
    request = encode_spans(finished_spans(genai_trace))
    from_protobuf, _ = events_of(request.SerializeToString(), "protobuf")
    from_json, _ = events_of(request_to_json(request), "json")
    assert [e.model_dump() for e in from_protobuf] == [e.model_dump() for e in from_json]
    assert b'"traceId":"' + format(
        request.resource_spans[0].scope_spans[0].spans[0].trace_id.hex()
    ).encode() in (request_to_json(request))


def test_spans_in_any_order_within_a_request_give_the_same_events():
    spans = finished_spans(openinference_trace)
    expected, _ = events_of(request_bytes(spans))
    for seed in range(5):
        shuffled = random.Random(seed).sample(spans, len(spans))
        again, _ = events_of(request_bytes(shuffled))
        assert sorted(e.model_dump_json() for e in again) == sorted(e.model_dump_json() for e in expected)


def test_a_trace_over_several_requests_gets_contiguous_indexes_and_a_resend_is_the_same_events():
    spans = finished_spans(genai_trace)  # in end order: chat, tool, tool, chat, agent (the root last)
    cursor = StepCursor()
    first, _ = events_of(request_bytes(spans[1:3]), cursor=cursor)  # the two tools arrive first
    second, _ = events_of(request_bytes([spans[4], spans[0], spans[3]]), cursor=cursor)
    assert [(s.tool, s.step_index) for s in steps(first + second)] == [
        ("get_weather", 0),
        ("get_weather", 1),
        ("", 2),
        ("", 3),
    ]
    assert next(e for e in second if isinstance(e, EpisodeEnded)).total_steps == 4
    resent, unmappable = events_of(request_bytes(spans), cursor=cursor)  # the exporter retries everything
    assert unmappable == [] and {e.event_id: e for e in resent} == {e.event_id: e for e in first + second}


def test_what_cannot_be_mapped_is_returned_with_the_span_and_the_reason():
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("root"):
        with tracer.start_as_current_span("GET /health"):  # an HTTP client span: no GenAI attributes
            pass
        with tracer.start_as_current_span("embeddings", attributes={"gen_ai.operation.name": "embeddings"}):
            pass
        with tracer.start_as_current_span(
            "chat", attributes={"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": -3}
        ):
            pass
    cursor = StepCursor()
    events, unmappable = events_of(request_bytes(list(exporter.get_finished_spans())), cursor=cursor)
    reasons = {span.name: reason for span, reason in unmappable}
    assert (
        "not a GenAI span" in reasons["GET /health"] and "'embeddings' is not mapped" in reasons["embeddings"]
    )
    assert "input_tokens: Input should be greater than or equal to 0" in reasons["chat"]
    ended = next(e for e in events if isinstance(e, EpisodeEnded))
    assert ended.total_steps == 0  # a rejected step takes no index: no hole for the rules to wait on


def test_a_failed_span_is_a_step_error_and_a_failed_root_a_failed_episode():
    events, _ = events_of(request_bytes(finished_spans(genai_trace, fail_tool=True)))
    assert steps(events)[2].error == "timeout after 5 s" and steps(events)[1].error is None
    provider, exporter = TracerProvider(), InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with (
        pytest.raises(RuntimeError),
        provider.get_tracer("t").start_as_current_span(
            "agent", attributes={"gen_ai.operation.name": "invoke_agent"}
        ),
    ):
        raise RuntimeError("model quota exceeded")
    events, _ = events_of(request_bytes(list(exporter.get_finished_spans())))
    ended = next(e for e in events if isinstance(e, EpisodeEnded))
    assert not ended.success and "model quota exceeded" in ended.error


@pytest.mark.parametrize(
    ("body", "media", "reason"),
    [
        (b"\xff\xff\xff", "protobuf", "not an OTLP protobuf ExportTraceServiceRequest"),
        (b'{"resourceSpans": [', "json", "OTLP JSON body: not valid JSON (unexpected end of data: line 1"),
        (b"[1]", "json", "expected a JSON object"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz"}]}]}]}',
            "json",
            "resourceSpans[0].scopeSpans[0].spans[0].traceId: expected a hex id",
        ),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}',
            "json",
            "not an OTLP json ExportTraceServiceRequest",
        ),
    ],
)
def test_malformed_payloads_are_rejected_with_a_reason(body, media, reason):
    with pytest.raises(RequestRejected) as caught:
        decode_request(body, media)
    assert caught.value.status == 400 and reason in caught.value.body["message"]


def test_the_cursor_is_bounded():
    cursor = StepCursor(max_traces=2)
    for trace in ("a", "b", "c"):
        cursor.trace(trace)
    assert list(cursor.traces) == ["b", "c"]


def test_a_span_whose_parent_is_in_another_process_is_the_episode_span_and_a_second_root_is_refused():
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    upstream = SpanContext(0xAB * (2**120 // 0xFF), 0x1234, is_remote=True, trace_flags=TraceFlags(1))
    provider, exporter = TracerProvider(), InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("service")
    for name in ("invoke_agent first", "invoke_agent second"):  # two requests of one upstream trace
        attrs = {"gen_ai.operation.name": "invoke_agent"}
        with trace.use_span(NonRecordingSpan(upstream)), tracer.start_as_current_span(name, attributes=attrs):
            _chat(tracer, _messages({"type": "text", "content": "hi"}), 5, 1, "stop")
    spans = list(exporter.get_finished_spans())
    cursor = StepCursor()
    events, unmappable = events_of(request_bytes(spans[:2]), cursor=cursor)  # the first request's spans
    ended = next(e for e in events if isinstance(e, EpisodeEnded))
    assert ended.total_steps == 1 and not unmappable
    later, unmappable = events_of(request_bytes(spans), cursor=cursor)
    assert [s.name for s, _ in unmappable] == ["invoke_agent second"]
    # the second service's LLM call is still a step of the trace's episode, which now ends longer
    assert [s.step_index for s in steps(later)] == [0, 1]
    assert [e.total_steps for e in later if isinstance(e, EpisodeEnded)] == [2]
    assert any("a second root span in the trace" in reason for _, reason in unmappable)


def test_a_step_span_after_its_root_is_the_next_step_and_the_episode_ends_again_longer():
    spans = finished_spans(genai_trace)
    root, children = spans[-1], spans[:-1]
    cursor = StepCursor()
    first, _ = events_of(request_bytes([root, *children[:2]]), cursor=cursor)
    ended = next(e for e in first if isinstance(e, EpisodeEnded))
    assert [s.step_index for s in steps(first)] == [0, 1] and ended.total_steps == 2
    late, unmappable = events_of(request_bytes(children[2:]), cursor=cursor)  # after the root
    assert unmappable == []
    assert [s.step_index for s in steps(late)] == list(range(2, len(children)))
    again = [e for e in late if isinstance(e, EpisodeEnded)]
    assert len(again) == 1 and again[0].total_steps == len(children)
    assert again[0].event_id != ended.event_id  # another event: both reach the topic
    same = {k: v for k, v in again[0].model_dump().items() if k not in ("event_id", "total_steps")}
    assert same == {k: v for k, v in ended.model_dump().items() if k not in ("event_id", "total_steps")}
    # resending everything (root included) changes nothing: the same events again
    resent, _ = events_of(request_bytes(spans), cursor=cursor)
    assert {e.event_id for e in resent} <= {e.event_id for e in first + late}
    assert next(e for e in resent if isinstance(e, EpisodeEnded)) == again[0]
