"""A broker outage does not flood the application's log (#34 item 15): the Kafka client's per-retry
lines logged from the SDK's delivery thread are written once per kind and window, nothing
acknowledged is lost, and the application's own client lines pass untouched."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from producers.sdk.delivery import ClientLogLimiter
from producers.sdk.recorder import AgentRecorder
from schemas.topics import AGENT_EVENTS
from tests.support.broker import start_broker
from tests.support.readback import read_topic

pytestmark = pytest.mark.integration

OUTAGE_S = 8.0
STEP_EVERY_S = 0.05
# Before the limiter, aiokafka wrote about 40 lines a second while a send waited for the broker
# (about 320 in this outage); now each kind of line once (3 kinds seen), plus room for timing.
MAX_OUTAGE_LINES = 15


def _record_for(ep, seconds: float, first: int) -> int:
    """Record steps at a steady rate for `seconds`; returns the next step index."""
    i, deadline = first, time.monotonic() + seconds
    while time.monotonic() < deadline:
        ep.step(tool="bash", params={"i": i}, observation="ok")
        i += 1
        time.sleep(STEP_EVERY_S)
    return i


def _client_and_sdk_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.split(".")[0] in ("aiokafka", "kafka", "producers")]


def test_a_broker_outage_writes_a_bounded_number_of_lines_and_loses_nothing(tmp_path, data_dir, caplog):
    caplog.set_level(logging.INFO)  # what logging.basicConfig(level=INFO) shows a user
    broker = start_broker(tmp_path / "broker")
    rec = AgentRecorder(broker.bootstrap, data_dir, agent="a", close_timeout_s=5)
    try:
        with rec.episode(task_id="outage") as ep:
            n = _record_for(ep, 1.0, 0)
            assert rec.flush(15), "the broker was up: the first steps must be delivered"
            broker.stop()
            caplog.clear()
            n = _record_for(ep, OUTAGE_S, n)
            during = _client_and_sdk_lines(caplog)
            # a line the application's own Kafka client logs from another thread is never held back
            for _ in range(3):
                logging.getLogger("aiokafka").error("the application's own client line")
            broker = broker.restart()
            assert rec.flush(60), f"{rec.pending} events undelivered 60 s after the broker came back"
        assert rec.close(10)
        own = [r for r in caplog.records if r.getMessage() == "the application's own client line"]
        assert len(own) == 3, "lines logged from the application's threads must pass untouched"
        kinds = sorted({r.getMessage()[:80] for r in during})
        assert len(during) <= MAX_OUTAGE_LINES, f"{len(during)} lines in an {OUTAGE_S:.0f} s outage: {kinds}"
        records = read_topic(broker.bootstrap, AGENT_EVENTS, n + 2)
        steps = [r["value"]["step_index"] for r in records if r["value"]["type"] == "step.recorded"]
        assert sorted(steps) == list(range(n)), "every step accepted during the outage is delivered once"
        assert n > OUTAGE_S / STEP_EVERY_S / 2
    finally:
        rec.close(1)
        broker.stop()


def test_the_limiter_writes_each_kind_once_per_window_and_counts_the_rest():
    limiter = ClientLogLimiter(window_s=60)
    logger = logging.getLogger("aiokafka")

    def record(msg: str, level: int = logging.ERROR, created: float = 1000.0, thread: int | None = None):
        rec = logger.makeRecord("aiokafka", level, __file__, 1, msg, ("127.0.0.1", 9092), None)
        rec.created, rec.thread = created, limiter.thread_id if thread is None else thread
        return rec

    assert limiter.filter(record("Unable connect to node %s:%s"))
    assert not limiter.filter(record("Unable connect to node %s:%s", created=1030.0))
    assert limiter.filter(record("Unable to update metadata from %s %s", created=1030.0))
    assert limiter.filter(record("Unable connect to node %s:%s", created=1061.0)), "a new window"
    assert limiter.filter(record("Unable connect to node %s:%s", logging.DEBUG, 1062.0)), "DEBUG passes"
    other = threading.get_ident() + 1
    assert limiter.filter(record("Unable connect to node %s:%s", created=1062.0, thread=other))
    assert limiter.suppressed == 1
