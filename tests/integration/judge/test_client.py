"""The judge client with the real anthropic SDK against the local Messages-API server."""

from __future__ import annotations

import asyncio

import pytest

from streams.errors import JudgeCallError
from streams.judge.client import JudgeClient
from streams.judge.config import JudgeConfig
from streams.judge.prompt import Prompt
from tests.support.judge_servers.messages import MessagesServer, Reply

PROMPT = Prompt(
    "system", '## Rubrics (score each of these ids)\n- goal_progress (weight 0.30): x\n{"scores": {}}'
)


@pytest.fixture
def server():
    with MessagesServer() as srv:
        yield srv


def _client(server, **overrides) -> tuple[JudgeClient, list[float]]:
    config = JudgeConfig(api_key="test-key", base_url=server.url, **overrides)
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    return JudgeClient(config, sleep=fake_sleep, rng=lambda: 0.0), slept


def run(coro):
    return asyncio.run(coro)


def test_429_and_529_with_retry_after_are_retried_and_succeed(server):
    server.script = [
        Reply(429, headers={"retry-after": "2"}),
        Reply(529, headers={"retry-after-ms": "1500"}),
        Reply(503),
    ]
    client, slept = _client(server)

    async def go():
        try:
            return await client.complete(PROMPT)
        finally:
            await client.close()

    result = run(go())
    assert server.statuses == [429, 529, 503, 200]
    assert result.attempts == 4
    assert '"goal_progress"' in result.text
    assert result.input_tokens > 0 and result.output_tokens > 0
    # the server's retry-after is honoured (jitter is 0 here), then plain back-off
    assert slept[:2] == [2.0, 1.5]
    assert len(slept) == 3


def test_client_error_is_not_retried(server):
    server.script = [Reply(400)]
    client, slept = _client(server)

    async def go():
        try:
            await client.complete(PROMPT)
        finally:
            await client.close()

    with pytest.raises(JudgeCallError) as info:
        run(go())
    assert info.value.status == 400 and info.value.attempts == 1
    assert slept == [] and len(server.requests) == 1
    assert client.breaker.state == "closed"  # a bad request says nothing about the endpoint


def test_permanent_failure_opens_the_circuit_then_a_trial_closes_it(server):
    server.fail_status = 500
    now = [1000.0]
    config = JudgeConfig(
        api_key="k", base_url=server.url, max_attempts=2, circuit_failures=3, circuit_reset_s=30.0
    )

    async def no_sleep(_s):
        return None

    client = JudgeClient(config, sleep=no_sleep, clock=lambda: now[0], rng=lambda: 0.0)

    async def go():
        errors = []
        for _ in range(5):
            try:
                await client.complete(PROMPT)
            except JudgeCallError as exc:
                errors.append(exc.kind)
        requests_when_open = len(server.requests)
        now[0] += 31.0  # the circuit half-opens; the endpoint has recovered
        server.fail_status = None
        result = await client.complete(PROMPT)
        await client.close()
        return errors, requests_when_open, result

    errors, requests_when_open, result = run(go())
    assert errors == ["error", "error", "error", "circuit_open", "circuit_open"]
    assert requests_when_open == 3 * 2  # open circuit: no HTTP request at all
    assert result.text and client.breaker.state == "closed"


def test_a_retry_after_beyond_the_limit_fails_the_call_instead_of_stalling(server):
    server.script = [Reply(429, headers={"retry-after": "3600"})]
    client, slept = _client(server, max_retry_after_s=60.0)

    async def go():
        try:
            await client.complete(PROMPT)
        finally:
            await client.close()

    with pytest.raises(JudgeCallError, match="exceeds max_retry_after_s"):
        run(go())
    assert slept == []
