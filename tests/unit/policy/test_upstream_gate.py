"""The proxy's load gate: an adapter load never runs beside a request at the upstream."""

from __future__ import annotations

import threading
import time

import pytest

from producers.policy.engine.errors import EngineError
from producers.policy.upstream import LoadGate


def test_a_load_waits_for_the_request_in_flight_and_holds_new_ones():
    gate, events = LoadGate(), []
    in_flight, release = threading.Event(), threading.Event()

    def request(name, hold=None):
        with gate.request():
            events.append(f"{name} start")
            if hold is not None:
                in_flight.set()
                hold.wait(5)
            events.append(f"{name} end")

    def load():
        with gate.load(timeout_s=5):
            events.append("load")
            time.sleep(0.2)  # a request arriving now must wait for the load to end
            events.append("load end")

    first = threading.Thread(target=request, args=("a", release))
    first.start()
    in_flight.wait(5)
    loader = threading.Thread(target=load)
    loader.start()
    time.sleep(0.2)
    assert "load" not in events  # still waiting for request a
    release.set()
    time.sleep(0.05)
    second = threading.Thread(target=request, args=("b",))
    second.start()
    for thread in (first, loader, second):
        thread.join(5)
    assert events.index("a end") < events.index("load")
    assert events.index("load end") < events.index("b start")


def test_a_load_that_cannot_drain_fails_and_lets_requests_go_on():
    gate = LoadGate()
    with (
        gate.request(),
        pytest.raises(EngineError, match="1 requests still in flight"),
        gate.load(timeout_s=0.2),
    ):
        pass
    with gate.request():  # not left closed
        assert gate.running == 1
