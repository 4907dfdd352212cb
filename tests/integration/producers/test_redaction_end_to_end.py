"""Redaction on real components (issue #18): a step whose observation holds an AWS key, a GitHub
token, a bearer header and a private key block, recorded through the SDK, posted to the gateway or
ingested from a log file, reaches neither the broker (raw record bytes) nor ClickHouse (the sink
into chDB) with any of them; the typed placeholders and the `redactions` count are there."""

from __future__ import annotations

import asyncio
import subprocess
import uuid

import aiohttp
import orjson
import pytest

from clients.kafka import read_to_end
from producers.gateway.requests import hash_key
from producers.sdk.recorder import AgentRecorder
from schemas.events import StepRecorded, utc_now
from schemas.topics import AGENT_EVENTS, DLQ
from tests.support.processes import AGENTSTREAM, REPO, Proc, wait_for
from tests.support.readback import count_records
from tests.support.sink_harness import reader, rows, scalar, start_sink

pytestmark = pytest.mark.integration

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
GITHUB = "ghp_" + "a1B2c3D4e5" * 3 + "f6G7h8"
BEARER = "abc123def456ghi789jkl"
KEY_BODY = "MIIEowIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgHcTz6sE2I2yPB"
SECRETS = (AWS_KEY, GITHUB, BEARER, KEY_BODY)
OBSERVATION = (
    f"$ env\nAWS_ACCESS_KEY_ID={AWS_KEY}\nGITHUB_TOKEN={GITHUB}\n"
    f"$ curl -v https://api.internal\n> Authorization: Bearer {BEARER}\n"
    f"$ cat id_rsa\n-----BEGIN RSA PRIVATE KEY-----\n{KEY_BODY}\n-----END RSA PRIVATE KEY-----\n"
)
PLACEHOLDERS = tuple(
    f"[REDACTED:{name}]" for name in ("aws_access_key", "github_token", "bearer_token", "private_key")
)


def _raw_values(bootstrap: str, topic: str, min_records: int) -> list[bytes]:
    wait_for(lambda: count_records(bootstrap, topic) >= min_records, timeout_s=30, what=f"{topic} records")
    return [r.value for r in read_to_end(bootstrap, [topic])]


def _assert_redacted(raw: bytes) -> dict:
    for secret in SECRETS:
        assert secret.encode() not in raw
    value = orjson.loads(raw)
    for placeholder in PLACEHOLDERS:
        assert placeholder in value["observation"]
    assert value["redactions"] == 4
    return value


def test_sdk_step_with_secrets_reaches_neither_broker_nor_clickhouse(broker, clickhouse_url, tmp_path):
    with AgentRecorder(broker.bootstrap, tmp_path / "sdk", agent="a") as rec:
        with rec.episode(task_id="t", trajectory_id="traj-secret") as ep:
            ep.step(tool="bash", params={"cmd": "env"}, observation=OBSERVATION, exit_code=0)
            ep.step(tool="bash", params={"cmd": "ls"}, observation="a.py b.py", exit_code=0)
            ep.end(success=True)
        assert rec.flush(timeout=30)
    steps = [v for v in _raw_values(broker.bootstrap, AGENT_EVENTS, 4) if b'"step.recorded"' in v]
    secret_step = _assert_redacted(steps[0])
    assert secret_step["observation"].startswith("$ env\nAWS_ACCESS_KEY_ID=[REDACTED:aws_access_key]\n")
    assert orjson.loads(steps[1])["redactions"] == 0
    spooled = b"".join(p.read_bytes() for p in (tmp_path / "sdk").rglob("*") if p.is_file())
    assert b"[REDACTED:aws_access_key]" in spooled and not [s for s in SECRETS if s.encode() in spooled]

    sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
    try:
        client = reader(clickhouse_url)
        where = "FINAL WHERE trajectory_id = 'traj-secret'"
        wait_for(
            lambda: scalar(client, f"SELECT count() FROM agentstream.steps {where}") == 2, what="2 steps"
        )
        got = rows(
            client,
            f"SELECT step_index, redactions, observation FROM agentstream.steps {where} ORDER BY step_index",
        )
        assert [(i, n) for i, n, _ in got] == [(0, 4), (1, 0)]
        assert all(p in got[0][2] for p in PLACEHOLDERS)
        raw = scalar(
            client, "SELECT groupArray(raw) FROM agentstream.events WHERE trajectory_id = 'traj-secret'"
        )
        stored = "\n".join(raw) + "\n".join(o for _, _, o in got)
        assert not [s for s in SECRETS if s in stored]
    finally:
        sink.proc.stop()


def test_settings_file_in_the_data_dir_adds_a_pattern_and_turns_a_detector_off(broker, tmp_path):
    data = tmp_path / "sdk"
    data.mkdir()
    (data / "settings.yaml").write_text(
        "redaction:\n  detectors:\n    email: false\n"
        "  patterns:\n    - name: ticket\n      regex: 'TICKET-\\d{6}'\n"
    )
    with AgentRecorder(broker.bootstrap, data) as rec:
        with rec.episode(task_id="t", trajectory_id="traj-settings") as ep:
            ep.step(tool="mail", observation=f"ops@example.com TICKET-123456 {AWS_KEY}")
            ep.end(success=True)
        assert rec.flush(timeout=30)
    step = orjson.loads(
        next(v for v in _raw_values(broker.bootstrap, AGENT_EVENTS, 3) if b'"step.recorded"' in v)
    )
    assert step["observation"] == "ops@example.com [REDACTED:ticket] [REDACTED:aws_access_key]"
    assert step["redactions"] == 2


# --- the gateway and ingest ------------------------------------------------------------------------


def _post(url: str, items: list[dict]) -> tuple[int, dict]:
    async def go():
        headers = {"Content-Type": "application/json", "Authorization": "Bearer gw-key"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=orjson.dumps(items), headers=headers) as r,
        ):
            return r.status, await r.json()

    return asyncio.run(go())


def test_gateway_redacts_events_and_dead_letters(broker, tmp_path):
    ready = tmp_path / "gateway.ready"
    args = [
        *AGENTSTREAM,
        "gateway",
        "--bootstrap-servers",
        broker.bootstrap,
        "--port",
        "0",
        "--ready-file",
        str(ready),
    ]
    proc = Proc(
        args, tmp_path / "gateway.log", env={"AGENTSTREAM_GATEWAY_API_KEY_HASHES": hash_key("gw-key")}
    )
    try:
        address = wait_for(lambda: proc.alive() and ready.exists() and ready.read_text(), what="the gateway")
        step = StepRecorded(
            event_id=str(uuid.uuid4()), trajectory_id="traj-gw", occurred_at=utc_now(), producer="test/1",
            step_index=0, tool="bash", observation=OBSERVATION,
        ).model_dump(mode="json")  # fmt: skip
        status, body = _post(f"http://{address}/v1/events", [step])
        assert status == 202 and body["event_ids"] == [step["event_id"]]
        _assert_redacted(_raw_values(broker.bootstrap, AGENT_EVENTS, 1)[0])

        status, _ = _post(f"http://{address}/v1/events", [{**step, "step_index": -1}])
        assert status == 400
        letter = orjson.loads(_raw_values(broker.bootstrap, DLQ, 1)[0])
        assert "[REDACTED:aws_access_key]" in letter["payload"]
        assert not [s for s in SECRETS if s in letter["payload"]]
    finally:
        proc.stop()


def test_ingest_redacts_a_log_file(broker, tmp_path):
    log = tmp_path / "events.jsonl"
    started = {"event_id": "i-start", "type": "episode.started", "trajectory_id": "traj-ingest",
               "occurred_at": "2026-01-01T00:00:00Z", "producer": "sdk/0.1.0", "task_id": "t"}  # fmt: skip
    step = {**started, "event_id": "i-s0", "type": "step.recorded", "step_index": 0, "tool": "bash",
            "observation": OBSERVATION}  # fmt: skip
    del step["task_id"]
    log.write_text("\n".join(orjson.dumps(e).decode() for e in (started, step)) + "\n")
    done = subprocess.run(
        [*AGENTSTREAM, "ingest", str(log), "--bootstrap-servers", broker.bootstrap, "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [v for v in _raw_values(broker.bootstrap, AGENT_EVENTS, 2) if b'"step.recorded"' in v]
    _assert_redacted(steps[0])


def test_gateway_otlp_route_redacts_span_text(broker, tmp_path):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    ready = tmp_path / "gateway.ready"
    args = [
        *AGENTSTREAM,
        "gateway",
        "--bootstrap-servers",
        broker.bootstrap,
        "--port",
        "0",
        "--ready-file",
        str(ready),
    ]
    proc = Proc(
        args, tmp_path / "gateway.log", env={"AGENTSTREAM_GATEWAY_API_KEY_HASHES": hash_key("gw-key")}
    )
    try:
        address = wait_for(lambda: proc.alive() and ready.exists() and ready.read_text(), what="the gateway")
        exporter = OTLPSpanExporter(
            endpoint=f"http://{address}/v1/traces", headers={"Authorization": "Bearer gw-key"}
        )
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("agent")
        with tracer.start_as_current_span(
            "invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}
        ):
            tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "bash"}
            with tracer.start_as_current_span(
                "execute_tool bash", attributes=tool | {"gen_ai.tool.call.result": OBSERVATION}
            ):
                pass
        assert provider.force_flush(10_000)
        provider.shutdown()
        steps = [v for v in _raw_values(broker.bootstrap, AGENT_EVENTS, 3) if b'"step.recorded"' in v]
        _assert_redacted(steps[0])
    finally:
        proc.stop()
