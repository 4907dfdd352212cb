"""The sink's flush window adapts to the load (consumers/sink/runner.py `SinkHandler.due`): a full
batch or the long window always flushes; under light load rows go after the short window, once the
previous insert is done; under load they wait for the long window so inserts grow, not multiply."""

from __future__ import annotations

import time
from concurrent.futures import Future

from consumers.sink.runner import SinkConfig, SinkHandler, _InFlight
from schemas.records import Record

SOURCE = Record("agent.events", 0, 0, b"t", b"{}", None)


def worker(rows: int, waited_s: float, writing: bool = False, **config) -> SinkHandler:
    w = SinkHandler(SinkConfig(**config), client=None, producer=None)
    w.close()  # no write starts here: only the decision is tested
    for _ in range(rows):
        w.sink.add("events", (), SOURCE)
    if rows:
        w._positions[("agent.events", 0)] = rows
    w._last_write = time.monotonic() - waited_s
    if writing:
        w._inflight = _InFlight(Future(), {}, 0, 0)  # an insert still running
    return w


def test_nothing_buffered_is_never_due():
    assert not worker(0, waited_s=10).due(time.monotonic())


def test_a_trickle_goes_after_the_short_window_not_the_long_one():
    assert not worker(5, waited_s=0.1).due(time.monotonic())
    assert worker(5, waited_s=0.25).due(time.monotonic())


def test_a_trickle_waits_for_a_running_insert():
    assert not worker(5, waited_s=0.25, writing=True).due(time.monotonic())


def test_under_load_rows_wait_for_the_long_window():
    assert not worker(300, waited_s=0.3).due(time.monotonic())
    assert worker(300, waited_s=0.5).due(time.monotonic())


def test_a_full_batch_is_due_at_once():
    assert worker(50, waited_s=0, batch_rows=50).due(time.monotonic())


def test_the_short_window_can_be_turned_off():
    assert not worker(5, waited_s=0.3, light_load_rows=0).due(time.monotonic())
