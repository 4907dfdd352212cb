"""No loss, no duplicates: broker outages, kill -9 of the producer process, in-doubt chunks."""

from __future__ import annotations

import sys
from collections import Counter

import pytest
from kafka import KafkaProducer

from producers.sdk.delivery import DeliveryConfig, SpoolDelivery
from producers.sdk.recorder import AgentRecorder
from producers.sdk.spool import Spool, SpoolRecord
from producers.sdk.spool_cursor import Cursor, DeliveryIntent
from schemas.topics import AGENT_EVENTS
from tests.support.broker import start_broker
from tests.support.processes import Proc, free_port, wait_for
from tests.support.readback import count_records, read_topic

pytestmark = pytest.mark.integration

SCRIPT = [sys.executable, "-m", "tests.support.record_steps"]


def assert_exactly_once_in_order(records: list[dict], trajectories: int, steps: int) -> None:
    ids = Counter(r["value"]["event_id"] for r in records)
    duplicated = {i: n for i, n in ids.items() if n > 1}
    assert not duplicated, f"{len(duplicated)} event ids appear more than once"
    assert len(records) == trajectories * (steps + 2)
    per_trajectory: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        per_trajectory.setdefault(r["value"]["trajectory_id"], []).append(r["value"])
    assert len(per_trajectory) == trajectories
    for events in per_trajectory.values():
        assert [e["type"] for e in events] == ["episode.started", *["step.recorded"] * steps, "episode.ended"]
        assert [e["step_index"] for e in events[1:-1]] == list(range(steps))


def test_broker_down_then_up_delivers_1000_steps_exactly_once(tmp_path, data_dir):
    port = free_port()  # nothing listens here yet
    rec = AgentRecorder(f"127.0.0.1:{port}", data_dir, agent="a", connect_timeout_ms=500)
    for t in range(4):
        with rec.episode(task_id=f"task-{t}") as ep:
            for i in range(250):
                ep.step(tool="bash", params={"i": i}, observation="o" * 2048)
            ep.end(success=True)
    assert rec.flush(10, until="spooled"), "1,000 steps must be durable locally while the broker is down"
    assert rec.flush(0.5) is False
    broker = start_broker(tmp_path / "broker", port=port)
    try:
        assert rec.flush(60), f"{rec.pending} events still undelivered after the broker came back"
        assert rec.close()
        assert_exactly_once_in_order(
            read_topic(broker.bootstrap, AGENT_EVENTS, 1008), trajectories=4, steps=250
        )
    finally:
        broker.stop()


def test_kill9_of_the_producer_mid_delivery_loses_and_duplicates_nothing(tmp_path, data_dir):
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    recorder = Proc([*SCRIPT, "record", bootstrap, str(data_dir), "4", "250"], tmp_path / "record.log")
    wait_for(lambda: not recorder.alive(), timeout_s=60, what="the recording process to spool and exit")
    assert "SPOOLED" in recorder.log_text(), recorder.log_text()[-2000:]
    recorder.stop()
    broker = start_broker(tmp_path / "broker", port=port)
    try:
        # The first producer dies by SIGKILL after its 40th chunk of 10 was acknowledged by the broker
        # but before its spool cursor moved past it: those 10 events are in doubt.
        first = Proc(
            [*SCRIPT, "deliver", bootstrap, str(data_dir), "--die-after", "40"], tmp_path / "deliver-1.log"
        )
        wait_for(lambda: not first.alive(), timeout_s=60, what="the first producer to be killed")
        assert first.popen.returncode == -9 and "KILLING MYSELF after 400" in first.log_text(), (
            first.log_text()
        )
        first.stop()
        assert count_records(bootstrap, AGENT_EVENTS) == 400
        again = Proc([*SCRIPT, "deliver", bootstrap, str(data_dir)], tmp_path / "deliver-2.log")
        wait_for(lambda: not again.alive(), timeout_s=60, what="the restarted producer to finish")
        log = again.log_text()
        assert "DELIVERED" in log, log[-2000:]
        assert "recovering in-doubt records 390..399: 10 already in the topic, re-sending 0" in log, log[
            -2000:
        ]
        again.stop()
        assert_exactly_once_in_order(read_topic(bootstrap, AGENT_EVENTS, 1008), trajectories=4, steps=250)
    finally:
        broker.stop()


def test_an_in_doubt_chunk_is_completed_without_resending_what_landed(broker, tmp_path):
    """The broker stored half a chunk, then the producer died before moving its cursor."""
    from clients.kafka import ensure_topics
    from schemas.topics import TOPICS

    ensure_topics(broker.bootstrap, [TOPICS[AGENT_EVENTS]])
    spool = Spool(tmp_path / "spool")
    chunk = [
        SpoolRecord(AGENT_EVENTS, f"t{i % 3}".encode(), f"e{i}", b'{"event_id":"e%d"}' % i) for i in range(10)
    ]
    spool.append(chunk)
    delivery = SpoolDelivery(spool, DeliveryConfig(broker.bootstrap))
    offsets = delivery._lower_bounds({AGENT_EVENTS})
    spool.commit(Cursor(0, DeliveryIntent(0, 9, offsets)))
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for record in chunk[::2]:  # what the dead process got acknowledged
        producer.send(AGENT_EVENTS, key=record.key, value=record.value).get(10)
    producer.close()

    assert delivery.deliver_once() == 10
    assert spool.cursor == Cursor(10, None)
    assert delivery.deliver_once() == 0
    delivery.close()
    spool.close()
    ids = Counter(r["value"]["event_id"] for r in read_topic(broker.bootstrap, AGENT_EVENTS, 10))
    assert ids == Counter({f"e{i}": 1 for i in range(10)})


def test_spool_cli_reports_and_flushes_what_a_dead_recorder_left(tmp_path, data_dir):
    import subprocess

    from tests.support.processes import AGENTSTREAM

    port = free_port()
    recorder = Proc(
        [*SCRIPT, "record", f"127.0.0.1:{port}", str(data_dir), "2", "5"], tmp_path / "record.log"
    )
    wait_for(lambda: not recorder.alive(), timeout_s=60, what="the recording process to exit")
    recorder.stop()

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*AGENTSTREAM, "spool", *args, "--data-dir", str(data_dir)], capture_output=True, text=True
        )

    status = cli("status")
    assert status.returncode == 0 and "14 undelivered events" in status.stdout, status.stdout + status.stderr
    failed = cli("flush", "--bootstrap-servers", f"127.0.0.1:{port}", "--timeout-s", "2")
    assert failed.returncode == 1 and "14 events could not be delivered" in failed.stderr
    broker = start_broker(tmp_path / "broker", port=port)
    try:
        flushed = cli("flush", "--bootstrap-servers", broker.bootstrap)
        assert flushed.returncode == 0 and "delivered 14, 0 left" in flushed.stdout, (
            flushed.stdout + flushed.stderr
        )
        assert_exactly_once_in_order(read_topic(broker.bootstrap, AGENT_EVENTS, 14), trajectories=2, steps=5)
    finally:
        broker.stop()


def test_kill9_while_recording_keeps_every_step_the_caller_was_told_is_durable(broker, tmp_path, data_dir):
    """An external kill -9 at an arbitrary moment of recording + delivery, then a restart."""
    import re

    streamer = Proc([*SCRIPT, "stream", broker.bootstrap, str(data_dir)], tmp_path / "stream.log")

    def durable() -> int:
        counts = [int(n) for n in re.findall(r"DURABLE (\d+)", streamer.log_text())]
        return max(counts, default=0)

    def delivering() -> bool:
        return durable() >= 600 and count_records(broker.bootstrap, AGENT_EVENTS) >= 200

    wait_for(delivering, timeout_s=60, what="600 durable steps and 200 delivered")
    streamer.kill9()
    acknowledged = durable()
    again = Proc([*SCRIPT, "deliver", broker.bootstrap, str(data_dir)], tmp_path / "deliver.log")
    wait_for(lambda: not again.alive(), timeout_s=60, what="the restarted producer to finish")
    assert "DELIVERED" in again.log_text(), again.log_text()[-2000:]
    again.stop()
    events = [r["value"] for r in read_topic(broker.bootstrap, AGENT_EVENTS, acknowledged + 1)]
    ids = Counter(e["event_id"] for e in events)
    assert max(ids.values()) == 1, "an event was delivered twice"
    steps = sorted(e["step_index"] for e in events if e["type"] == "step.recorded")
    assert steps == list(range(len(steps))), "the delivered steps are not a gap-free prefix"
    assert len(steps) >= acknowledged, (
        f"{acknowledged} steps were confirmed durable, only {len(steps)} arrived"
    )
