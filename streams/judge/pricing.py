"""Cost of a judge call in USD, from the usage tokens and the price table in `JudgeConfig.prices`.

>>> from streams.judge.config import ModelPrice
>>> cost_usd(ModelPrice(input_per_mtok=3.0, output_per_mtok=15.0), 1000, 200)
0.006
"""

from __future__ import annotations

import logging

from streams.judge.config import JudgeConfig, ModelPrice

log = logging.getLogger(__name__)
_warned: set[str] = set()


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
