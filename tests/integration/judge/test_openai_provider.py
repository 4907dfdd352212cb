"""The judge over OpenAI-compatible chat completions: the real openai SDK against the local
chat-completions server (tests/support/judge_servers/chat.py), through the same client (retries,
retry-after, circuit breaker) and processor (parsing, failure kinds, cost) as the anthropic path."""

from __future__ import annotations

import asyncio

import pytest

from streams.errors import JudgeCallError
from streams.judge.client import JudgeClient
from streams.judge.config import JudgeConfig, ModelPrice
from streams.judge.processor import JudgeProcessor
from streams.judge.prompt import Prompt
from streams.judge.rubrics import RubricCatalog
from streams.judge.selection import JudgeRule, JudgeRules
from tests.support.judge_events import T0, trajectory
from tests.support.judge_servers.chat import ChatServer, Reply
from tests.support.judge_servers.messages import MessagesServer

MODEL = "judge-model"
PRICES = {MODEL: ModelPrice(input_per_mtok=3.0, output_per_mtok=15.0)}
PROMPT = Prompt(
    "system", '## Rubrics (score each of these ids)\n- goal_progress (weight 0.30): x\n{"scores": {}}'
)
STEPS = JudgeRules(rules=[JudgeRule(mode="step", batch_steps=2)])


@pytest.fixture
def server():
    with ChatServer() as srv:
        yield srv


def _config(server, **overrides) -> JudgeConfig:
    values = {
        "provider": "openai",
        "model": MODEL,
        "api_key": "test-key",
        "base_url": server.base_url,
        "prices": PRICES,
        "backoff_base_s": 0.0,
        **overrides,
    }
    return JudgeConfig(**values)


def _client(config) -> tuple[JudgeClient, list[float]]:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    return JudgeClient(config, sleep=fake_sleep, rng=lambda: 0.0), slept


def _judge(config, events, rules=STEPS, client=None):
    processor = JudgeProcessor(config, rules, RubricCatalog(), client or JudgeClient(config), now=lambda: T0)

    async def go():
        try:
            return await processor.process_events(events)
        finally:
            await processor.client.close()

    return asyncio.run(go()).outputs, processor


async def _complete(client, prompt=PROMPT):
    try:
        return await client.complete(prompt)
    finally:
        await client.close()


def test_a_step_is_scored_with_tokens_from_usage_and_cost_from_the_price_table(server):
    outputs, _ = _judge(_config(server), trajectory("t1", n=2))
    assert [e.type for e in outputs] == ["reward.judge.step", "reward.judge.step"]
    for e in outputs:
        assert set(e.scores) == {"goal_progress", "tool_choice", "param_correctness"}
        assert e.score is not None and e.rationale and e.judge_model == MODEL
        assert e.input_tokens > 0 and e.output_tokens > 0
    first = outputs[0]
    assert first.cost_usd == pytest.approx((first.input_tokens * 3.0 + first.output_tokens * 15.0) / 1e6)
    request = server.requests[0]
    assert request["model"] == MODEL and request["max_tokens"] == 1024
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert "temperature" not in request  # sent only when configured
    assert server.headers[0]["authorization"] == "Bearer test-key"


def test_the_endpoint_url_may_name_the_chat_completions_path(server):
    config = _config(server, base_url=f"{server.base_url}/chat/completions", temperature=0.0)
    outputs, _ = _judge(config, trajectory("t1", n=1))
    assert outputs[0].type == "reward.judge.step"
    assert server.requests[0]["temperature"] == 0.0


def test_a_reply_that_is_not_json_is_a_parse_failure_with_its_cost(server):
    server.text = "I think the agent did fine."
    outputs, _ = _judge(_config(server), trajectory("t1", n=1))
    (failed,) = outputs
    assert failed.type == "reward.judge.failed" and failed.kind == "parse"
    assert failed.cost_usd > 0 and failed.judge_model == MODEL  # the call was paid for


def test_429_with_retry_after_and_5xx_are_retried_and_succeed(server):
    server.script = [Reply(429, headers={"retry-after": "2"}), Reply(500, headers={"retry-after-ms": "1500"})]
    server.script.append(Reply(503))
    client, slept = _client(_config(server))
    result = asyncio.run(_complete(client))
    assert server.statuses == [429, 500, 503, 200]
    assert result.attempts == 4 and '"goal_progress"' in result.text
    assert slept[:2] == [2.0, 1.5] and len(slept) == 3  # retry-after honoured (jitter is 0 here)


def test_a_client_error_is_not_retried_and_does_not_trip_the_breaker(server):
    server.script = [Reply(400)]
    client, slept = _client(_config(server))
    with pytest.raises(JudgeCallError) as info:
        asyncio.run(_complete(client))
    assert info.value.status == 400 and info.value.attempts == 1 and "HTTP 400" in info.value.reason
    assert slept == [] and len(server.requests) == 1 and client.breaker.state == "closed"


def test_a_retry_after_beyond_the_limit_fails_the_call(server):
    server.script = [Reply(429, headers={"retry-after": "3600"})]
    client, slept = _client(_config(server, max_retry_after_s=60.0))
    with pytest.raises(JudgeCallError, match="exceeds max_retry_after_s"):
        asyncio.run(_complete(client))
    assert slept == []


def test_an_always_failing_endpoint_gives_failed_events_then_an_open_circuit(server):
    server.fail_status = 500
    config = _config(server, max_attempts=2, circuit_failures=2)
    processor = JudgeProcessor(
        config,
        JudgeRules(rules=[JudgeRule(mode="step")]),
        RubricCatalog(),
        JudgeClient(config),
        now=lambda: T0,
    )

    async def go():
        first = await processor.process_events([*trajectory("a", n=1), *trajectory("b", n=1)])
        second = await processor.process_events(trajectory("c", n=1))
        await processor.client.close()
        return first.outputs, second.outputs

    first, second = asyncio.run(go())
    assert [(e.type, e.kind) for e in first] == [("reward.judge.failed", "error")] * 2
    assert [(e.type, e.kind) for e in second] == [("reward.judge.failed", "circuit_open")]
    assert "HTTP 500" in first[0].reason and first[0].attempts == 2
    assert processor.client.breaker.state == "open"
    assert len(server.requests) == 4  # 2 calls x 2 attempts; none once open


def test_the_budget_pauses_openai_calls_like_anthropic_ones(server):
    config = _config(server, budget_usd_per_hour=1e-6)
    outputs, _ = _judge(config, trajectory("t1", n=1))
    (paused,) = outputs
    assert paused.type == "reward.judge.failed" and paused.kind == "budget_paused" and paused.retry_at
    assert server.requests == []  # refused before any HTTP request


def test_the_same_tokens_cost_the_same_on_both_providers(server):
    """The same prompt answered with the same usage by each API's server: the same tokens, cost
    and scores in the events, whichever provider asked."""
    events = trajectory("t1", n=1)
    with MessagesServer() as messages:
        anthropic_config = JudgeConfig(
            api_key="k", base_url=messages.url, model=MODEL, prices=PRICES, backoff_base_s=0.0
        )
        messages.script = [Reply(usage=(1234, 56))]
        server.script = [Reply(usage=(1234, 56))]
        (via_anthropic,), _ = _judge(anthropic_config, events)
        (via_openai,), _ = _judge(_config(server), events)
    for e in (via_anthropic, via_openai):
        assert (e.input_tokens, e.output_tokens) == (1234, 56)
        assert e.cost_usd == pytest.approx((1234 * 3.0 + 56 * 15.0) / 1e6)
    assert via_openai.scores == via_anthropic.scores and via_openai.judge_model == via_anthropic.judge_model
    # without a script, the servers count the same prompt as the same tokens, too
    (again_openai,), _ = _judge(_config(server), trajectory("t2", n=1))
    with MessagesServer() as messages:
        config = JudgeConfig(api_key="k", base_url=messages.url, model=MODEL, prices=PRICES)
        (again_anthropic,), _ = _judge(config, trajectory("t2", n=1))
    assert again_openai.input_tokens == again_anthropic.input_tokens > 0
    assert again_openai.cost_usd == again_anthropic.cost_usd > 0
