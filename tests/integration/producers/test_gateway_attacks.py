"""The gateway tried as an attacker would (issue #34), against the real `agentstream gateway` process
and the embedded broker on 127.0.0.1: out-of-bounds steps and nesting get a 400 naming the field, the
value and the limit, and a dead letter; an oversized event or body leaves the gateway publishing
(the next request gets 202); `/v1/traces` refuses encodings it does not take with 415; a client that
sends its headers slowly is disconnected."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
import uuid
import zlib

import aiohttp
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from producers.gateway.requests import hash_key
from schemas.events import EpisodeEnded, EpisodeStarted, StepRecorded, utc_now
from schemas.limits import MAX_DEAD_LETTER_PAYLOAD_BYTES, MAX_JSON_DEPTH, MAX_STEP_INDEX
from schemas.topics import AGENT_EVENTS, DLQ
from tests.support.broker import start_broker
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.readback import read_topic

KEY = "attack-key"
HEADER_TIMEOUT_S = 2
BODY_TIMEOUT_S = 2


def _envelope(trajectory_id: str) -> dict:
    return {"event_id": str(uuid.uuid4()), "trajectory_id": trajectory_id, "occurred_at": utc_now(),
            "producer": "attacker/1"}  # fmt: skip


def step_json(trajectory_id: str, index: int = 0, **overrides) -> dict:
    event = StepRecorded(**_envelope(trajectory_id), step_index=index, tool="bash", observation="ok")
    return {**event.model_dump(mode="json"), **overrides}


def episode_json(trajectory_id: str) -> list[dict]:
    started = EpisodeStarted(**_envelope(trajectory_id), task_id="task").model_dump(mode="json")
    ended = EpisodeEnded(**_envelope(trajectory_id), success=True).model_dump(mode="json")
    return [started, ended]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A broker and an `agentstream gateway` (default body limit, short header timeout)."""
    root = tmp_path_factory.mktemp("attacks")
    broker = start_broker(root / "broker")
    ready = root / "gateway.ready"
    args = [*AGENTSTREAM, "gateway", "--bootstrap-servers", broker.bootstrap, "--port", "0",
            "--ready-file", str(ready), "--data-dir", str(root),
            "--header-timeout-s", str(HEADER_TIMEOUT_S), "--body-timeout-s", str(BODY_TIMEOUT_S)]  # fmt: skip
    proc = Proc(args, root / "gateway.log", env={"AGENTSTREAM_GATEWAY_API_KEY_HASHES": hash_key(KEY)})

    def listening():
        if not proc.alive():
            raise RuntimeError(f"gateway exited: {proc.log_text()[-2000:]}")
        return ready.exists() and ready.read_text()

    try:
        yield f"http://{wait_for(listening, timeout_s=30, what='the gateway to listen')}", broker, proc
    finally:
        proc.stop()
        broker.stop()


def post(url: str, body: bytes | str, content_type: str = "application/json", headers: dict | None = None):
    async def go():
        sent = {"Content-Type": content_type, "Authorization": f"Bearer {KEY}", **(headers or {})}
        async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=sent) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text  # a plain-text answer is itself a failure the tests name

    return asyncio.run(go())


def get(url: str):
    async def go():
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return response.status, await response.json()

    return asyncio.run(go())


def letters_for(bootstrap: str, trajectory_id: str, min_records: int = 1) -> list[dict]:
    """Dead letters whose trajectory id or payload names `trajectory_id`."""
    deadline = time.monotonic() + 30
    while True:
        found = [
            r["value"]
            for r in read_topic(bootstrap, DLQ, timeout_s=10)
            if r["value"]["trajectory_id"] == trajectory_id or trajectory_id in r["value"]["payload"]
        ]
        if len(found) >= min_records or time.monotonic() > deadline:
            return found
        time.sleep(0.3)


def assert_publishing(url: str, bootstrap: str) -> None:
    """A valid request right after gets 202 and its events reach the topic."""
    traj = f"ok-{uuid.uuid4()}"
    status, body = post(f"{url}/v1/events", json.dumps([*episode_json(traj), step_json(traj)]))
    assert status == 202, body
    arrived = [r for r in read_topic(bootstrap, AGENT_EVENTS, 1) if r["value"]["trajectory_id"] == traj]
    assert len(arrived) == 3


def nested(depth: int) -> str:
    """JSON text of a value `depth` arrays deep (written as text: Python's own json recurses)."""
    return "[" * depth + "1" + "]" * depth


@pytest.mark.integration
def test_a_step_index_of_2_pow_32_is_refused_naming_field_value_and_limit(gateway):
    url, broker, _ = gateway
    traj = f"idx-{uuid.uuid4()}"
    started, ended = episode_json(traj)
    body = [started, step_json(traj, step_index=2**32), ended]
    status, answer = post(f"{url}/v1/events", json.dumps(body))
    assert status == 400, answer
    (error,) = answer["errors"]
    assert (error["index"], error["field"], error["value"]) == (1, "step_index", 2**32)
    assert str(MAX_STEP_INDEX) in error["message"]
    assert answer["dead_lettered"] is True
    (letter,) = letters_for(broker.bootstrap, traj)
    assert "step_index" in letter["reason"] and letter["stage"] == "gateway"
    assert [
        r for r in read_topic(broker.bootstrap, AGENT_EVENTS) if r["value"]["trajectory_id"] == traj
    ] == []


@pytest.mark.integration
@pytest.mark.parametrize(
    ("field", "value"),
    [("input_tokens", 2**40), ("output_tokens", 2**32), ("exit_code", 2**63), ("token_ids", [5, -1])],
)
def test_a_number_the_store_would_wrap_is_refused_with_a_dead_letter(gateway, field, value):
    """These got 202 and ClickHouse stored them wrapped (2**40 tokens as 0, exit code 2**63 as -2**63);
    a negative token id would index an embedding table from its end."""
    url, broker, _ = gateway
    traj = f"wrap-{field}-{uuid.uuid4()}"
    status, answer = post(f"{url}/v1/events", json.dumps([step_json(traj, **{field: value})]))
    assert status == 400, answer
    (error,) = answer["errors"]
    assert error["field"] == field and error["index"] == 0, error
    assert answer["dead_lettered"] is True and letters_for(broker.bootstrap, traj)


@pytest.mark.integration
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, 254, 255, 300, 1000, 1019])
def test_deeply_nested_params_get_400_and_a_dead_letter(gateway, depth):
    """254-255 levels were accepted and then stopped the sink; 256-1022 got a plain-text 500."""
    url, broker, _ = gateway
    traj = f"deep{depth}-{uuid.uuid4()}"
    event = json.dumps(step_json(traj, params={"x": "NESTED"}))
    body = "[" + event.replace('"NESTED"', nested(depth)) + "]"  # the body nests depth + 3 levels
    status, answer = post(f"{url}/v1/events", body)
    assert status == 400, answer
    (error,) = answer["errors"]
    assert error["field"] == "params" and f"limit of {MAX_JSON_DEPTH}" in error["message"]
    assert len(json.dumps(error["value"])) < 300  # abbreviated
    assert answer["dead_lettered"] is True
    assert letters_for(broker.bootstrap, traj)


@pytest.mark.integration
def test_params_at_the_depth_limit_are_accepted(gateway):
    url, _, _ = gateway
    traj = f"edge-{uuid.uuid4()}"
    event = json.dumps(step_json(traj, params={"x": "NESTED"}))
    body = "[" + event.replace('"NESTED"', nested(MAX_JSON_DEPTH - 3)) + "]"  # event 1 + params 1 + 62
    status, answer = post(f"{url}/v1/events", body)
    assert status == 202, answer


@pytest.mark.integration
def test_an_oversized_event_gets_400_a_bounded_dead_letter_and_the_gateway_keeps_publishing(gateway):
    url, broker, _ = gateway
    traj = f"big-{uuid.uuid4()}"
    big = step_json(traj, observation="x" * 500_000, thought="y" * 500_000)
    status, answer = post(f"{url}/v1/events", json.dumps([big]))
    assert status == 400, answer
    assert "bytes" in answer["errors"][0]["message"] and answer["dead_lettered"] is True
    (letter,) = letters_for(broker.bootstrap, traj)
    assert letter["payload_truncated"] is True and letter["payload_bytes"] > 1_000_000
    assert len(letter["payload"]) <= MAX_DEAD_LETTER_PAYLOAD_BYTES and len(letter["payload_sha256"]) == 64
    assert_publishing(url, broker.bootstrap)
    assert get(f"{url}/healthz")[0] == 200


@pytest.mark.integration
def test_a_malformed_body_over_1_mb_is_dead_lettered_and_the_gateway_keeps_publishing(gateway):
    url, broker, _ = gateway
    marker = f"malformed-{uuid.uuid4()}"
    status, answer = post(f"{url}/v1/events", '[{"trajectory_id": "' + marker + '", "x": "' + "z" * 1_500_000)
    assert status == 400 and answer["error"] == "malformed JSON"
    (letter,) = letters_for(broker.bootstrap, marker)
    assert letter["payload_truncated"] is True
    assert_publishing(url, broker.bootstrap)


@pytest.mark.integration
def test_an_unmappable_span_over_1_mb_leaves_the_gateway_publishing(gateway):
    url, broker, _ = gateway
    trace_id = uuid.uuid4().hex
    span = {"traceId": trace_id, "spanId": "ab" * 8, "parentSpanId": "cd" * 8, "name": "chat",
            "startTimeUnixNano": "1000000000", "endTimeUnixNano": "2000000000",
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
                           {"key": "gen_ai.request.model", "value": {"stringValue": "m" * 1_200_000}}],
            }  # fmt: skip
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
    status, answer = post(f"{url}/v1/traces", json.dumps(body))
    assert status == 200, answer
    assert answer["partialSuccess"]["rejectedSpans"] == "1"
    assert letters_for(broker.bootstrap, trace_id)
    assert_publishing(url, broker.bootstrap)


@pytest.mark.integration
@pytest.mark.parametrize("encoding", ["deflate", "br"])
def test_otlp_refuses_encodings_it_does_not_take_with_415(gateway, encoding):
    url, _, _ = gateway
    payload = zlib.compress(b'{"resourceSpans": []}')
    status, answer = post(f"{url}/v1/traces", payload, headers={"Content-Encoding": encoding})
    assert status == 415, answer
    assert answer["errors"][0]["field"] == "Content-Encoding"


@pytest.mark.integration
def test_otlp_names_a_broken_gzip_stream(gateway):
    url, _, _ = gateway
    broken = gzip.compress(b'{"resourceSpans": []}')[:-12] + b"garbage!"
    status, answer = post(f"{url}/v1/traces", broken, headers={"Content-Encoding": "gzip"})
    assert status == 400, answer
    assert "gzip" in answer["message"]


@pytest.mark.integration
def test_a_client_that_sends_its_headers_slowly_is_disconnected(gateway):
    url, _, proc = gateway
    host, port = url.removeprefix("http://").rsplit(":", 1)
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=HEADER_TIMEOUT_S + 10) as sock:
        sock.sendall(b"POST /v1/events HTTP/1.1\r\nHost: x\r\n")
        closed = False
        while time.monotonic() - started < HEADER_TIMEOUT_S + 8:
            try:
                sock.sendall(b"X-Slow: 1\r\n")
                sock.settimeout(0.5)
                if sock.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
    assert closed, "the gateway kept a slow-header connection open"
    assert time.monotonic() - started < HEADER_TIMEOUT_S + 5
    assert "Traceback" not in proc.log_text()


@pytest.mark.integration
def test_a_body_that_does_not_arrive_gets_408_and_a_disconnect_is_no_error(gateway):
    url, _, proc = gateway
    host, port = url.removeprefix("http://").rsplit(":", 1)
    head = (f"POST /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n[")  # fmt: skip
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=BODY_TIMEOUT_S + 10) as sock:
        sock.sendall(head.encode())
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"did not arrive within" in answer and time.monotonic() - started < BODY_TIMEOUT_S + 5
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(head.encode())  # and goes away mid-body
    time.sleep(0.5)
    assert_publishing(url, gateway[1].bootstrap)
    log = proc.log_text()
    assert "Traceback" not in log and "Error handling request" not in log, log[-3000:]


@pytest.mark.integration
def test_a_producer_refused_by_the_broker_is_replaced_and_the_next_send_lands(gateway):
    """A record the broker refuses (over max.message.bytes) fails alone; the publisher drops that
    producer, and the next send goes through a fresh one."""
    from producers.gateway.publishers import KafkaPythonPublisher
    from producers.gateway.requests import GatewayConfig

    _, broker, _ = gateway
    config = GatewayConfig(bootstrap_servers=broker.bootstrap, allow_anonymous=True, ack_timeout_s=10)

    async def go():
        publisher = KafkaPythonPublisher(config)
        try:
            (refused,) = await publisher.send_all([(AGENT_EVENTS, b"k", b"x" * 2_000_000)])
            healthy_after_refusal = publisher.healthy
            (landed,) = await publisher.send_all([(AGENT_EVENTS, b"k", b"{}")])
            return refused, healthy_after_refusal, publisher.replaced, landed, publisher.healthy
        finally:
            await publisher.close()

    refused, healthy_after_refusal, replaced, landed, healthy = asyncio.run(go())
    assert refused is not None and not healthy_after_refusal and replaced == 1
    assert landed is None and healthy


# --- a bounded schemathesis run over the gateway's own OpenAPI document ---------------------------------


@pytest.mark.integration
def test_the_gateway_answers_its_openapi_document_without_5xx(gateway):
    """Generated requests (valid and invalid) to every operation get no 5xx and answers that conform
    to the document (status codes, content types, bodies). Bounded: a few examples per operation."""
    url, _, _ = gateway
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/events", "/v1/traces"}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
        def answers(case):
            case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"}, timeout=20)

        answers()
