"""The recorder's hand-off buffer batches a trickle (producers/sdk/pipeline.py `EventBuffer.take`): the
spool writer lingers briefly after a first event so one fsync covers several steps, and wakes at
once when a full batch is there."""

from __future__ import annotations

import threading
import time

import pytest

from producers.errors import ProducerError
from producers.sdk.pipeline import EventBuffer, LingerPacing, RecorderConfig


def test_without_linger_a_lone_item_is_taken_at_once():
    buf = EventBuffer(100, batch_items=10)
    buf.put("a")
    started = time.monotonic()
    assert buf.take(10, wait_s=1.0) == ["a"]
    assert time.monotonic() - started < 0.05


def test_a_trickle_is_gathered_for_the_linger_then_taken_together():
    buf = EventBuffer(100, batch_items=10)
    buf.put("a")
    threading.Timer(0.02, buf.put, args=("b",)).start()
    started = time.monotonic()
    assert buf.take(10, wait_s=1.0, linger_s=0.1) == ["a", "b"]
    assert 0.09 <= time.monotonic() - started < 0.5


def test_a_full_batch_ends_the_linger_early():
    buf = EventBuffer(100, batch_items=3)
    buf.put("a")

    def fill():
        buf.put("b")
        buf.put("c")

    threading.Timer(0.02, fill).start()
    started = time.monotonic()
    assert buf.take(10, wait_s=1.0, linger_s=5.0) == ["a", "b", "c"]
    assert time.monotonic() - started < 1.0


def test_closing_ends_the_linger():
    buf = EventBuffer(100, batch_items=10)
    buf.put("a")
    threading.Timer(0.02, buf.close).start()
    started = time.monotonic()
    assert buf.take(10, wait_s=1.0, linger_s=5.0) == ["a"]
    assert time.monotonic() - started < 1.0


def test_the_linger_is_bounded():
    with pytest.raises(ProducerError, match="spool_linger_ms"):
        RecorderConfig(spool_linger_ms=-1)


def _paced(pacing: LingerPacing, records_per_s: float, batches: int = 40, batch: int = 10) -> float:
    """Feed `batches` batches at `records_per_s`, after what it saw before; returns the linger then."""
    now = pacing._last or 0.0
    for _ in range(batches):
        now += batch / records_per_s
        pacing.observe(batch, now)
    return pacing.seconds


def test_the_linger_stays_short_at_a_trickle_and_grows_with_the_rate():
    assert _paced(LingerPacing(0.01, 0.04), 20) == 0.01  # below LOW_RATE: no added latency
    assert _paced(LingerPacing(0.01, 0.04), 1000) == pytest.approx(0.04)  # above HIGH_RATE: the most
    middle = (LingerPacing.LOW_RATE + LingerPacing.HIGH_RATE) / 2
    assert _paced(LingerPacing(0.01, 0.04), middle, batches=200) == pytest.approx(0.025, abs=0.001)


def test_the_linger_shrinks_again_when_the_load_goes():
    pacing = LingerPacing(0.01, 0.04)
    assert _paced(pacing, 1000) == pytest.approx(0.04)
    assert _paced(pacing, 5) == pytest.approx(0.01)


def test_the_linger_range_follows_the_config():
    assert RecorderConfig().linger_range_s == (0.01, 0.04)  # 4 x spool_linger_ms under load
    assert RecorderConfig(spool_linger_ms=0).linger_range_s == (0.0, 0.0)  # 0 still turns it off
    assert RecorderConfig(spool_linger_ms=5, spool_linger_max_ms=100).linger_range_s == (0.005, 0.1)
    assert RecorderConfig(spool_linger_ms=10, spool_linger_max_ms=10).linger_range_s == (0.01, 0.01)
    with pytest.raises(ProducerError, match=r"spool_linger_max_ms.*got 5"):
        RecorderConfig(spool_linger_ms=10, spool_linger_max_ms=5)
    with pytest.raises(ProducerError, match="spool_linger_max_ms"):
        RecorderConfig(spool_linger_max_ms=2000)
