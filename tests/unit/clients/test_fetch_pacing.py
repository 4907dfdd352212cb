"""clients/fetch_pacing.py: the sizing a paced fetch takes after a full or an empty one, and where
pacing does not apply. The fetches themselves, against the real broker: tests/integration/clients."""

from __future__ import annotations

import asyncio
import logging

import pytest

from clients.fetch_pacing import FetchPacing, pace_fetches
from consumers.errors import ConsumerConfigError
from consumers.sink.runner import SinkConfig
from streams.config import WorkerConfig
from streams.errors import WorkerConfigError


def test_after_a_quarter_second_of_empty_fetches_the_next_waits_for_the_first_byte():
    pacing = FetchPacing(busy=(65536, 25), idle=(1, 500))
    assert [pacing.after(False, t / 1000) for t in (0, 25, 100, 225)] == [(65536, 25)] * 4
    assert pacing.after(False, 0.250) == (1, 500)
    assert pacing.after(False, 0.750) == (1, 500)
    assert pacing.after(True, 0.800) == (65536, 25)  # records put the configured sizing back
    assert pacing.after(False, 0.825) == (65536, 25)  # and a new quiet spell starts counting
    assert (pacing.fetches, pacing.empty) == (8, 7)


def test_a_trickle_keeps_the_configured_sizing():
    pacing = FetchPacing(busy=(65536, 25), idle=(1, 500))
    sizes = [pacing.after(i % 3 == 0, i * 0.025) for i in range(40)]  # records in every third fetch
    assert set(sizes) == {(65536, 25)}


class _Fetcher:
    def __init__(self, min_bytes: int, max_wait_ms: int):
        self._fetch_min_bytes, self._fetch_max_wait_ms = min_bytes, max_wait_ms

    async def _proc_fetch_request(self, assignment, node_id, request):
        return request == "records"


class _Consumer:
    def __init__(self, fetcher):
        self._fetcher = fetcher


def test_the_fetcher_is_resized_after_each_response():
    fetcher = _Fetcher(65536, 25)
    pacing = pace_fetches(_Consumer(fetcher), idle_wait_ms=500)
    assert pacing is not None
    pacing.quiet_s = 0  # the first empty fetch is quiet enough
    assert asyncio.run(fetcher._proc_fetch_request(None, 0, "nothing")) is False
    assert (fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms) == (1, 500)
    assert asyncio.run(fetcher._proc_fetch_request(None, 0, "records")) is True
    assert (fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms) == (65536, 25)


@pytest.mark.parametrize("idle_wait_ms", [0, 25, 10])
def test_no_pacing_when_the_idle_wait_is_off_or_no_longer_than_the_sized_wait(idle_wait_ms):
    fetcher = _Fetcher(65536, 25)
    assert pace_fetches(_Consumer(fetcher), idle_wait_ms) is None
    assert fetcher._proc_fetch_request.__name__ == "_proc_fetch_request"


def test_an_aiokafka_without_the_names_it_relies_on_is_left_alone_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="clients.fetch_pacing"):
        assert pace_fetches(_Consumer(object()), 500) is None
    assert "not paced" in caplog.text


def test_the_idle_wait_is_an_option_of_the_sink_and_the_worker_and_refuses_negatives():
    assert SinkConfig().fetch_idle_wait_ms == 500
    assert WorkerConfig().fetch_idle_wait_ms == 500
    with pytest.raises(ConsumerConfigError, match="--fetch-idle-wait-ms: must be >= 0, got -1"):
        SinkConfig(fetch_idle_wait_ms=-1)
    with pytest.raises(WorkerConfigError, match="--fetch-idle-wait-ms: must be >= 0, got -1"):
        WorkerConfig(fetch_idle_wait_ms=-1)
