"""The proxy's HTTP client (producers/policy/upstream_http.py) against the scripted upstream: kept-alive
connections reused, one per request in flight, an idle connection the upstream closed never reused,
a request never sent twice, and failures as the OpenAI-style errors naming the upstream."""

from __future__ import annotations

import threading

import pytest

from producers.policy.upstream_api import UpstreamError
from producers.policy.upstream_http import UpstreamHttp
from tests.support.upstream_stub import scripted_upstream

BODY = {"model": "tiny-base", "prompt": [1, 2], "max_tokens": 3, "logprobs": 1}


def test_sequential_requests_reuse_one_kept_alive_connection():
    with scripted_upstream() as upstream:
        client = UpstreamHttp(f"{upstream.url}/v1", timeout_s=30)
        replies = [client.post("/completions", BODY) for _ in range(5)]
        assert [r.json()["choices"][0]["token_ids"] for r in replies] == [[5, 6, 7]] * 5
        assert len(client._idle) == 1  # the same connection each time, back in the pool
        assert client.get("/models").json()["data"][0]["id"] == "tiny-base"
        client.close()
        assert client._idle == []


def test_requests_in_flight_together_each_get_their_own_connection():
    with scripted_upstream() as upstream:
        upstream.hold = threading.Event()
        client = UpstreamHttp(f"{upstream.url}/v1", timeout_s=30)
        replies: list = []
        threads = [
            threading.Thread(target=lambda: replies.append(client.post("/completions", BODY)))
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for _ in range(4):  # all four reached the upstream before any was answered: none queued
            assert upstream.started.acquire(timeout=10)
        upstream.hold.set()
        for thread in threads:
            thread.join(10)
        assert len(replies) == 4 and all(r.is_success for r in replies)
        assert len(client._idle) == 4
        client.close()


def test_a_dropped_request_is_a_502_and_never_sent_twice():
    with scripted_upstream() as upstream:
        client = UpstreamHttp(f"{upstream.url}/v1", timeout_s=30)
        client.post("/completions", BODY)  # a kept-alive connection in the pool
        upstream.drop = True
        with pytest.raises(UpstreamError) as dropped:
            client.post("/completions", BODY)
        assert dropped.value.status == 502 and f"upstream {upstream.url}/v1: the request failed" in str(
            dropped.value.message
        )
        assert len(upstream.bodies("/v1/completions")) == 2  # not retried
        assert client.post("/completions", BODY).is_success  # a fresh connection afterwards
        client.close()


def test_an_idle_connection_the_upstream_closed_is_not_reused():
    with scripted_upstream() as first:
        client = UpstreamHttp(f"{first.url}/v1", timeout_s=30)
        client.post("/completions", BODY)
        stale = client._idle[0]
    # the upstream is gone: its connections were closed; the pooled one is not used for the next request
    with pytest.raises(UpstreamError) as down:
        client.post("/completions", BODY)
    assert down.value.status == 503 and "unreachable" in down.value.message
    assert stale.sock is None  # closed by the client when found closed by the upstream
