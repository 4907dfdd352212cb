"""The recorder's hand-off buffer batches a trickle (producers/pipeline.py `EventBuffer.take`): the
spool writer lingers briefly after a first event so one fsync covers several steps, and wakes at
once when a full batch is there."""

from __future__ import annotations

import threading
import time

import pytest

from producers.errors import ProducerError
from producers.pipeline import EventBuffer, RecorderConfig


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
