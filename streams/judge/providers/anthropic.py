"""The Anthropic Messages API (`POST /v1/messages`) through the `anthropic` SDK's `AsyncAnthropic`.

`base_url` is the API root (the SDK appends `/v1/messages`): None for Anthropic's, or any
Messages-API endpoint (a gateway, tests/support/judge_servers/messages.py in the tests).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from streams.judge.config import JudgeConfig
from streams.judge.prompt import Prompt
from streams.judge.providers.base import Answer, Provider


class AnthropicProvider(Provider):
    name = "anthropic"

    def sdk(self) -> ModuleType:
        import anthropic

        return anthropic

    def make_client(self, config: JudgeConfig) -> Any:
        return self.sdk().AsyncAnthropic(
            api_key=config.effective_api_key(),
            base_url=config.base_url,
            timeout=config.timeout_s,
            max_retries=0,
        )

    async def send(self, client: Any, config: JudgeConfig, prompt: Prompt) -> Any:
        # temperature goes in the body only when configured: the SDK no longer types it and some
        # newer models refuse it.
        extra = {"temperature": config.temperature} if config.temperature is not None else None
        return await client.messages.create(
            model=config.model,
            max_tokens=config.max_tokens,
            system=prompt.system,
            messages=[{"role": "user", "content": prompt.user}],
            extra_body=extra,
        )

    def read(self, reply: Any) -> Answer:
        text = "".join(
            getattr(block, "text", "") for block in reply.content if getattr(block, "type", "") == "text"
        )
        usage = reply.usage
        return Answer(
            text=text,
            model=reply.model,
            input_tokens=int(getattr(usage, "input_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
            stop_reason=reply.stop_reason,
        )
