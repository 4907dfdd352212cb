"""The HTTP gateway: pure request checks, and the real `agentstream gateway` process against the
embedded broker (accepted events arrive; 400/401/413/415 with field-level messages; nothing of a
rejected request is written; invalid events reach the DLQ; /openapi.json; /healthz)."""

from __future__ import annotations

import asyncio
import json
import uuid

import aiohttp
import pytest

from producers.errors import ProducerError, RequestRejected
from producers.gateway.requests import (
    GatewayConfig,
    check_events,
    hash_key,
    key_allowed,
    parse_body,
    parse_key_hashes,
)
from schemas.events import EpisodeStarted, StepRecorded, utc_now
from schemas.topics import AGENT_EVENTS, DLQ
from tests.support.broker import start_broker
from tests.support.processes import AGENTSTREAM, Proc, wait_for
from tests.support.readback import read_topic

KEY = "s3cret-key"


def step_json(trajectory_id: str, index: int, **overrides) -> dict:
    event = StepRecorded(event_id=str(uuid.uuid4()), trajectory_id=trajectory_id, occurred_at=utc_now(),
                         producer="test/1", step_index=index, tool="bash", observation="ok")  # fmt: skip
    return {**event.model_dump(mode="json"), **overrides}


def started_json(trajectory_id: str) -> dict:
    event = EpisodeStarted(event_id=str(uuid.uuid4()), trajectory_id=trajectory_id, occurred_at=utc_now(),
                           producer="test/1", task_id="task")  # fmt: skip
    return event.model_dump(mode="json")


# --- pure checks -----------------------------------------------------------------------------------


def test_api_keys_are_checked_against_sha256_hashes():
    hashes = parse_key_hashes(f"{hash_key('other')}, {hash_key(KEY).upper()}")
    assert key_allowed(KEY, hashes)
    assert not key_allowed("wrong", hashes) and not key_allowed(None, hashes) and not key_allowed("", hashes)
    with pytest.raises(ProducerError, match="no API key hashes configured"):
        GatewayConfig(bootstrap_servers="x")
    with pytest.raises(ProducerError, match="expected sha256 hex digests"):
        GatewayConfig(bootstrap_servers="x", api_key_hashes=frozenset({"not-a-hash"}))


def test_malformed_json_names_line_column_and_byte():
    with pytest.raises(RequestRejected) as caught:
        parse_body(b'[{"type": "step.recorded",\n  "x": }]', max_events=10)
    error = caught.value.body["errors"][0]
    assert caught.value.status == 400 and error["field"] == "$"
    assert "line 2 column 8 (byte 34)" in error["message"]


def test_body_shape_and_count_limits():
    for body, status, message in [
        (b'{"type": "step.recorded"}', 400, "expected a JSON array of events"),
        (b"[]", 400, "the array is empty"),
        (b"[1, 2, 3]", 413, "3 events exceed the limit of 2 per request"),
    ]:
        with pytest.raises(RequestRejected) as caught:
            parse_body(body, max_events=2)
        assert caught.value.status == status and caught.value.body["errors"][0]["message"] == message


def test_every_invalid_field_of_every_event_is_reported():
    good = step_json("t1", 0)
    wrong_types = step_json("t1", 1, step_index="two", exit_code=[1])
    unknown_field = {**step_json("t1", 2), "colour": "blue"}
    not_accepted = {**good, "type": "trajectory.scored", "task_id": "x"}
    naive_time = step_json("t1", 3, occurred_at="2026-01-01T00:00:00")
    too_big = step_json("t1", 4, observation="x" * 3000)
    items = [good, wrong_types, unknown_field, not_accepted, naive_time, "text", too_big]
    events, errors = check_events(items, max_event_bytes=3000)
    assert [e.event_id for e in events] == [good["event_id"]]
    found = {(e["index"], e["field"]) for e in errors}
    assert {
        (1, "step_index"),
        (1, "exit_code"),
        (2, "colour"),
        (3, "type"),
        (4, "occurred_at"),
        (5, "$"),
        (6, "$"),
    } <= found
    by_field = {(e["index"], e["field"]): e for e in errors}
    assert by_field[(1, "step_index")]["value"] == "two"
    assert "unknown field" in by_field[(2, "colour")]["message"]
    assert "timezone" in by_field[(4, "occurred_at")]["message"]
    assert "not accepted by the gateway" in by_field[(3, "type")]["message"]
    assert "exceeds the limit of 3000 bytes per event" in by_field[(6, "$")]["message"]


# --- the real gateway process ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """A broker and an `agentstream gateway` process (2 KB body limit) in front of it."""
    root = tmp_path_factory.mktemp("gateway")
    broker = start_broker(root / "broker")
    ready = root / "gateway.ready"
    # The key hash comes from the environment: the option's AGENTSTREAM_* fallback is what a deployment uses.
    args = [*AGENTSTREAM, "gateway", "--bootstrap-servers", broker.bootstrap, "--port", "0",
            "--max-body-bytes", "4000", "--ready-file", str(ready)]  # fmt: skip
    env = {"AGENTSTREAM_GATEWAY_API_KEY_HASHES": hash_key(KEY)}
    proc = Proc(args, root / "gateway.log", env=env)

    def listening():
        if not proc.alive():
            raise RuntimeError(f"gateway exited: {proc.log_text()[-2000:]}")
        return ready.exists() and ready.read_text()

    try:
        address = wait_for(listening, timeout_s=30, what="the gateway to listen")
        yield f"http://{address}", broker
    finally:
        proc.stop()
        broker.stop()


def post(url: str, body: bytes | str, key: str | None = KEY, content_type: str = "application/json"):
    async def go():
        headers = {"Content-Type": content_type}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=body, headers=headers) as response,
        ):
            return response.status, await response.json()

    return asyncio.run(go())


def get(url: str):
    async def go():
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return response.status, await response.json()

    return asyncio.run(go())


def events_of(
    bootstrap: str, trajectory_id: str, topic: str = AGENT_EVENTS, min_records: int = 0
) -> list[dict]:
    return [
        r["value"]
        for r in read_topic(bootstrap, topic, min_records)
        if r["value"]["trajectory_id"] == trajectory_id
    ]


@pytest.mark.integration
def test_accepted_events_arrive_after_202(gateway):
    url, broker = gateway
    traj = f"traj-{uuid.uuid4()}"
    batch = [started_json(traj), step_json(traj, 0), step_json(traj, 1)]
    status, body = post(f"{url}/v1/events", json.dumps(batch))
    assert status == 202, body
    assert body["accepted"] == 3 and body["event_ids"] == [e["event_id"] for e in batch]
    arrived = events_of(broker.bootstrap, traj, min_records=3)
    assert [e["event_id"] for e in arrived] == body["event_ids"]  # in order, keyed by trajectory id


@pytest.mark.integration
def test_auth_media_type_and_size_are_enforced(gateway):
    url, _ = gateway
    body = json.dumps([step_json("t", 0)])
    assert post(f"{url}/v1/events", body, key=None)[0] == 401
    status, answer = post(f"{url}/v1/events", body, key="wrong")
    assert status == 401 and "API key" in answer["message"]
    status, answer = post(f"{url}/v1/events", body, content_type="text/plain")
    assert status == 415 and answer["errors"][0]["field"] == "Content-Type"
    status, answer = post(f"{url}/v1/events", json.dumps([step_json("t", 0, observation="x" * 5000)]))
    assert status == 413 and "exceeds the limit of 4000 bytes" in answer["errors"][0]["message"]


@pytest.mark.integration
def test_a_mixed_request_is_rejected_whole_and_its_invalid_events_go_to_the_dlq(gateway):
    url, broker = gateway
    traj = f"traj-{uuid.uuid4()}"
    valid = step_json(traj, 0)
    invalid = step_json(traj, 1, step_index=-1, latency_ms="slow")
    status, body = post(f"{url}/v1/events", json.dumps([valid, invalid]))
    assert status == 400
    assert body["accepted"] == 0 and body["valid_not_written"] == 1 and body["rejected"] == 1
    assert body["policy"].startswith("all-or-nothing")
    assert {(e["index"], e["field"]) for e in body["errors"]} == {(1, "step_index"), (1, "latency_ms")}
    assert body["dead_lettered"] is True
    letters = events_of(broker.bootstrap, traj, topic=DLQ, min_records=1)
    assert len(letters) == 1 and letters[0]["stage"] == "gateway" and letters[0]["source_topic"] is None
    assert (
        "step_index" in letters[0]["reason"]
        and json.loads(letters[0]["payload"])["event_id"] == invalid["event_id"]
    )
    status, _ = post(f"{url}/v1/events", json.dumps([started_json("marker")]))  # a later request lands...
    assert status == 202
    assert events_of(broker.bootstrap, traj, min_records=1) == []  # ...but nothing of the rejected one did


@pytest.mark.integration
def test_malformed_json_gets_400_naming_the_position(gateway):
    url, _ = gateway
    status, body = post(f"{url}/v1/events", '[{"type": "step.recorded",}]')
    assert status == 400 and body["error"] == "malformed JSON"
    assert "line 1 column 26 (byte 25): trailing comma" in body["errors"][0]["message"]  # the comma


@pytest.mark.integration
def test_openapi_document_embeds_the_event_schemas_and_healthz(gateway):
    import jsonschema

    url, _ = gateway
    status, doc = get(f"{url}/openapi.json")
    assert status == 200 and doc["openapi"] == "3.1.0"
    schemas = doc["components"]["schemas"]
    assert {"episode.started", "step.recorded", "episode.ended", "feedback.annotation"} <= set(schemas)
    request = doc["paths"]["/v1/events"]["post"]
    assert set(request["responses"]) >= {"202", "400", "401", "413", "415", "503"}
    validator = jsonschema.Draft202012Validator(schemas["step.recorded"])
    assert validator.is_valid(step_json("t", 0))
    assert not validator.is_valid(step_json("t", 0, step_index=-1))
    status, health = get(f"{url}/healthz")
    assert status == 200 and health["status"] == "ok"


def test_broker_down_gets_503_naming_the_unacknowledged_events_and_healthz_503():
    """In-process app (aiohttp test server), broker address with nothing listening."""
    from aiohttp.test_utils import TestClient, TestServer

    from producers.gateway.server import create_app
    from tests.support.processes import free_port

    config = GatewayConfig(
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        api_key_hashes=frozenset({hash_key(KEY)}),
        ack_timeout_s=2,
    )
    event = step_json("t-down", 0)

    async def go():
        async with TestClient(TestServer(create_app(config))) as client:
            headers = {"Authorization": f"Bearer {KEY}"}
            response = await client.post("/v1/events", json=[event], headers=headers)
            body = await response.json()
            health = await client.get("/healthz")
            return response.status, response.headers.get("Retry-After"), body, health.status

    status, retry_after, body, health_status = asyncio.run(go())
    assert status == 503 and retry_after == "1"
    assert body["accepted"] == 0 and body["partial"] is False
    assert body["unacknowledged_event_ids"] == [event["event_id"]] and body["acknowledged_event_ids"] == []
    assert health_status == 503


@pytest.mark.integration
def test_the_aiokafka_publisher_delivers_too(gateway):
    from aiohttp.test_utils import TestClient, TestServer

    from producers.gateway.server import create_app

    _, broker = gateway
    config = GatewayConfig(
        bootstrap_servers=broker.bootstrap, api_key_hashes=frozenset({hash_key(KEY)}), client="aiokafka"
    )
    traj = f"traj-{uuid.uuid4()}"
    batch = [started_json(traj), step_json(traj, 0)]

    async def go():
        async with TestClient(TestServer(create_app(config))) as client:
            response = await client.post("/v1/events", json=batch, headers={"X-API-Key": KEY})
            return response.status, await response.json()

    status, body = asyncio.run(go())
    assert status == 202 and body["accepted"] == 2
    assert [e["event_id"] for e in events_of(broker.bootstrap, traj, min_records=2)] == body["event_ids"]
