"""Cost of a judge call in USD, from the usage tokens and the price table in `JudgeConfig.prices`,
and the check that a budgeted judge knows its model's price.

A model without a price would cost 0 and never trip the budget, so with a budget set the judge
refuses to start until the price is given (`require_prices`). Dated ids (`claude-x-4-5-20250929`)
fall back to their family by prefix (`JudgeConfig.price_for`).

>>> from streams.judge.config import ModelPrice
>>> cost_usd(ModelPrice(input_per_mtok=3.0, output_per_mtok=15.0), 1000, 200)
0.006
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from streams.errors import StreamsError
from streams.judge.config import JudgeConfig, ModelPrice

log = logging.getLogger(__name__)
_warned: set[str] = set()

PRICES_ENV = "AGENTSTREAM_JUDGE_PRICES"


class JudgePriceError(StreamsError):
    """A spend budget is set but a judge model has no price (the message names the model and
    the variable to set)."""


def cost_usd(price: ModelPrice | None, input_tokens: int, output_tokens: int) -> float:
    """USD for the tokens; 0.0 when the model has no price (logged once per model by `call_cost`)."""
    if price is None:
        return 0.0
    total = input_tokens * price.input_per_mtok + output_tokens * price.output_per_mtok
    return round(total / 1_000_000, 9)


def call_cost(config: JudgeConfig, model: str, input_tokens: int, output_tokens: int) -> float:
    """The cost of one call by `model` (the model the endpoint reports, else the configured one)."""
    price = config.price_for(model) or config.price_for(config.model)
    if price is None and model not in _warned:
        _warned.add(model)
        log.warning("judge: no price for model %r in the price table; cost_usd will be 0", model)
    return cost_usd(price, input_tokens, output_tokens)


def budget_set(config: JudgeConfig) -> bool:
    return config.budget_usd_per_hour is not None or config.budget_usd_per_day is not None


def require_prices(config: JudgeConfig, models: Iterable[str] = ()) -> None:
    """With a budget set, every model the judge may call (the configured one and `models`, e.g.
    from rules) must have a price; raises `JudgePriceError` naming the first one that has none.

    >>> from streams.judge.config import JudgeConfig
    >>> try:
    ...     require_prices(JudgeConfig(model="my-model", budget_usd_per_hour=1.0))
    ... except JudgePriceError as exc:
    ...     print(str(exc)[:62])
    judge model 'my-model' has no price, and a spend budget is set
    """
    if not budget_set(config):
        return
    for model in dict.fromkeys([config.model, *models]):
        if model and config.price_for(model) is None:
            example = f'{{"{model}": {{"input_per_mtok": 3.0, "output_per_mtok": 15.0}}}}'
            raise JudgePriceError(
                f"judge model {model!r} has no price, and a spend budget is set "
                f"(budget_usd_per_hour={config.budget_usd_per_hour}, "
                f"budget_usd_per_day={config.budget_usd_per_day}): an unpriced call would cost 0 "
                f"and never reach the cap. Give its price in {PRICES_ENV}, e.g. "
                f"{PRICES_ENV}='{example}' (USD per million tokens; the variable replaces the "
                "whole table, so list every model you use)"
            )
    smallest = min(c for c in (config.budget_usd_per_hour, config.budget_usd_per_day) if c is not None)
    if 0 < smallest < max_output_cost(config):
        log.warning(
            "judge: the budget cap %.6f USD is below the cost of one reply of max_tokens=%d "
            "(%.6f USD); every call reserves at least that, so nothing will be judged",
            smallest,
            config.max_tokens,
            max_output_cost(config),
        )


def max_output_cost(config: JudgeConfig) -> float:
    """What the longest reply the judge allows (`max_tokens`) costs: the least any call reserves."""
    return cost_usd(config.price_for(config.model), 0, config.max_tokens)
