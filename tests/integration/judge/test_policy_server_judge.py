"""The judge's openai provider against our own policy server (`agentstream policy`, the tiny model
built locally): the request it sends is one the server accepts, and the usage it reads is the
server's. The tiny model writes no JSON, so the call ends as a paid `parse` failure."""

from __future__ import annotations

import asyncio

import pytest

from streams.judge.client import JudgeClient
from streams.judge.config import JudgeConfig, ModelPrice
from streams.judge.processor import JudgeProcessor
from streams.judge.rubrics import RubricCatalog
from streams.judge.selection import DEFAULT_RULES
from tests.support.judge_events import T0, trajectory
from tests.support.policy import policy_server, recorded_steps

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from consumers.tiny_model import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("models"))


def test_the_policy_server_answers_the_judge_with_usage_and_records_nothing(tmp_path, broker, tiny):
    with policy_server(tmp_path, broker.bootstrap, tiny) as (url, _proc):
        config = JudgeConfig(
            provider="openai",
            model="policy",
            api_key="none",
            base_url=f"{url}/v1",
            max_tokens=16,
            max_attempts=1,
            prices={"policy": ModelPrice(input_per_mtok=1.0, output_per_mtok=2.0)},
        )
        processor = JudgeProcessor(
            config, DEFAULT_RULES, RubricCatalog(), JudgeClient(config), now=lambda: T0
        )

        async def go():
            try:
                return await processor.process_events(trajectory("judged-by-policy", n=1))
            finally:
                await processor.client.close()

        (event,) = asyncio.run(go()).outputs
    # the tiny model's 16 tokens are not the JSON asked for: a parse failure, its tokens paid
    assert event.type == "reward.judge.failed" and event.kind == "parse", event
    assert event.judge_model == "policy" and event.input_tokens > 100
    assert 1 <= event.output_tokens <= 16
    assert event.cost_usd == pytest.approx((event.input_tokens * 1.0 + event.output_tokens * 2.0) / 1e6)
    assert recorded_steps(broker.bootstrap) == []  # a judge call names no episode: not a step
