"""`agentstream bench otlp`: OTLP spans/s into `agent.events` through the gateway's `POST /v1/traces`,
with p50/p99 time per request (request sent .. 200, which the gateway answers only after the broker
acknowledged every event of the request).

Requests of `--spans-per-request` spans (default 100): agent traces of 20 spans each (the agent span, then
LLM and tool spans taking turns; tool results of 512 bytes), built as `ExportTraceServiceRequest`
protobufs beforehand, fresh traces for every repeat (a resent span adds nothing, so reusing them would
measure the duplicate path). Rows: protobuf, protobuf + gzip, OTLP JSON, and the peer: the events those
spans map to, posted as a JSON array to `/v1/events` (ratios against JSON and the peer measured in the
same run). An `agentstream gateway` (kafka-python) and an embedded
broker run in a temporary directory and are stopped by PID.
"""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

from infra.bench.children import AGENTSTREAM, Child, scratch_broker

KEY = "bench-otlp-key"
SPANS_PER_TRACE = 20
RESULT = "r" * 512
FORMATS = {  # row name -> (content type, gzip)
    "protobuf": ("application/x-protobuf", False),
    "protobuf+gzip": ("application/x-protobuf", True),
    "json": ("application/json", False),
    "events": ("application/json", False),  # the peer: the same events as a JSON array to /v1/events
}


def add_arguments(parser) -> None:
    from infra.options.env import add_option

    add_option(parser, "--requests", type=int, default=200, help="requests per repeat and format")
    add_option(parser, "--spans-per-request", type=int, default=100, help="spans per request")
    add_option(parser, "--concurrency", type=int, default=8, help="requests in flight")


def trace_request(traces: int, seed: int):
    """An ExportTraceServiceRequest of `traces` agent traces of SPANS_PER_TRACE spans (GenAI conventions)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    now = time.time_ns()
    for t in range(traces):
        trace_id = (seed * 1_000_003 + t + 1).to_bytes(16, "big")
        root_id = os.urandom(8)
        for i in range(SPANS_PER_TRACE):
            span = spans.add(
                trace_id=trace_id, span_id=root_id if i == 0 else os.urandom(8), name=f"span {i}"
            )
            span.start_time_unix_nano, span.end_time_unix_nano = now + i * 1000, now + i * 1000 + 900
            if i == 0:
                span.end_time_unix_nano = now + SPANS_PER_TRACE * 1000
                _attrs(span, {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "bench"})
                continue
            span.parent_span_id = root_id
            _attrs(
                span, _CHAT if i % 2 else _TOOL | {"gen_ai.tool.call.arguments": f'{{"command": "ls {i}"}}'}
            )
    return request


_CHAT = {
    "gen_ai.operation.name": "chat",
    "gen_ai.request.model": "bench-model",
    "gen_ai.usage.input_tokens": 300,
    "gen_ai.usage.output_tokens": 40,
}
_TOOL = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "bash",
    "gen_ai.tool.call.result": RESULT,
}


def _as_events(request) -> bytes:
    """The events the gateway maps `request` to, as the JSON array `/v1/events` takes."""
    import orjson

    from producers.gateway.otlp.mapping import map_spans
    from producers.gateway.otlp.spans import spans_of
    from producers.gateway.otlp.step_cursor import StepCursor

    events = map_spans(spans_of(request), StepCursor()).events
    return orjson.dumps([e.model_dump(mode="json") for e in events])


def _attrs(span, values: dict) -> None:
    for key, value in values.items():
        kv = span.attributes.add(key=key)
        if isinstance(value, int):
            kv.value.int_value = value
        else:
            kv.value.string_value = value


def bodies(requests: int, spans_per_request: int, fmt: str, seed: int) -> list[bytes]:
    from producers.gateway.otlp.spans import request_to_json

    traces = max(1, spans_per_request // SPANS_PER_TRACE)
    out = []
    for r in range(requests):
        request = trace_request(traces, seed * 100_000 + r * traces)
        if fmt == "events":
            body = _as_events(request)
        else:
            body = request_to_json(request) if fmt == "json" else request.SerializeToString()
        out.append(gzip.compress(body) if FORMATS[fmt][1] else body)
    return out


async def load(url: str, payloads: list[bytes], fmt: str, concurrency: int) -> dict:
    """Post every payload with `concurrency` in flight; rate = spans / wall time."""
    from infra.bench.produce import post_all

    content_type, gzipped = FORMATS[fmt]
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": content_type}
    headers |= {"Content-Encoding": "gzip"} if gzipped else {}
    return await post_all(url, payloads, headers, 202 if fmt == "events" else 200, concurrency)


def run(args) -> dict:
    repeats = max(1, args.repeats)
    with scratch_broker("otlp") as (root, broker), _start_gateway(root, broker.address) as gateway:
        base = f"http://{gateway.address}"
        rows = [
            _row(f"{base}/v1/events" if fmt == "events" else f"{base}/v1/traces", fmt, args, repeats)
            for fmt in FORMATS
        ]
        events = _events_on(broker.address)
    spans = sum(r["spans"] * repeats + args.spans_per_request for r in rows)  # with each warm-up request
    expected = spans // SPANS_PER_TRACE * (SPANS_PER_TRACE + 1)
    ratio = rows[0]["spans_per_s"] / rows[2]["spans_per_s"]
    peer = rows[0]["spans_per_s"] / rows[3]["spans_per_s"]
    return {
        "rows": rows,
        "protobuf_vs_json": ratio,
        "protobuf_vs_events_route": peer,
        "events_on_topic": events,
        "events_expected": expected,
        "notes": [
            f"{args.spans_per_request} spans per request ({SPANS_PER_TRACE}-span agent traces: 19 steps + "
            f"episode start/end = 21 events per trace), {args.concurrency} requests in flight; "
            "p50/p99 per request",
            f"protobuf / OTLP JSON throughput ratio {ratio:.2f}; protobuf OTLP / the same events as JSON on "
            f"/v1/events {peer:.2f} (the events row counts its spans); agent.events holds {events} events "
            f"(expected {expected})",
            f"medians over {repeats} repeats; broker, gateway and load generator share this machine",
        ],
    }


def _start_gateway(root: Path, bootstrap: str) -> Child:
    from producers.gateway.requests import hash_key

    ready = root / "gateway.ready"  # --data-dir: its step cursor on disk under root, as in production
    args = [*AGENTSTREAM, "gateway", "--bootstrap-servers", bootstrap, "--port", "0", "--api-key-hashes",
            hash_key(KEY), "--max-body-bytes", str(64 * 1024 * 1024), "--ready-file", str(ready),
            "--data-dir", str(root)]  # fmt: skip
    return Child(args, root / "gateway.log", ready)


def _row(url: str, fmt: str, args, repeats: int) -> dict:
    import asyncio

    from infra.bench.report import median, percentile

    seed = 1_000 * (list(FORMATS).index(fmt) + 1)  # fresh trace ids for every format and repeat
    asyncio.run(load(url, bodies(1, args.spans_per_request, fmt, seed=seed), fmt, 1))  # warm-up
    runs = []
    for repeat in range(repeats):
        payloads = bodies(args.requests, args.spans_per_request, fmt, seed=seed + repeat + 1)
        runs.append(asyncio.run(load(url, payloads, fmt, args.concurrency)))
    spans = args.requests * args.spans_per_request
    latencies = [x for run in runs for x in run["latencies"]]
    return {
        "format": fmt,
        "spans": spans,
        "spans_per_s": median([spans / r["elapsed_s"] for r in runs]),
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "bytes_per_request": median([len(b) for b in bodies(1, args.spans_per_request, fmt, seed=1)]),
    }


def _events_on(bootstrap: str) -> int:
    from clients.kafka import make_consumer
    from clients.kafka.ranges import topic_partitions
    from schemas.topics import AGENT_EVENTS

    consumer = make_consumer(bootstrap, "agentstream-bench-otlp")
    try:
        tps = topic_partitions(consumer, [AGENT_EVENTS])
        return sum(consumer.end_offsets(tps).values()) if tps else 0
    finally:
        consumer.close()
