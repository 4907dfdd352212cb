"""Judge providers: one small module per API, each writing only what differs (the SDK, the request,
the reply). The retry policy, circuit breaker and failure kinds are `streams.judge.client`'s.

- `anthropic`: the Messages API (`anthropic` SDK), the default;
- `openai`: OpenAI-compatible chat completions (`openai` SDK): OpenAI, vLLM, SGLang, the policy server.

`JudgeConfig.provider` picks one (`AGENTSTREAM_JUDGE_PROVIDER`); docs/judge.md shows each set up.
"""

from __future__ import annotations

from streams.judge.providers.anthropic import AnthropicProvider
from streams.judge.providers.base import Provider
from streams.judge.providers.openai import OpenAIProvider

PROVIDERS: dict[str, type[Provider]] = {"anthropic": AnthropicProvider, "openai": OpenAIProvider}

__all__ = ["PROVIDERS", "provider_for"]


def provider_for(name: str) -> Provider:
    """The provider called `name` ("anthropic" or "openai"); an unknown name is a ValueError naming it.

    >>> provider_for("openai").name
    'openai'
    """
    try:
        return PROVIDERS[name]()
    except KeyError:
        raise ValueError(f"judge provider {name!r} is unknown (known: {sorted(PROVIDERS)})") from None
