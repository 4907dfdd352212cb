"""OpenAI-compatible chat completions (`POST {base_url}/chat/completions`) through the `openai` SDK's
`AsyncOpenAI`: OpenAI itself, vLLM, SGLang, a self-hosted server, or our policy server.

`base_url` is the SDK's base URL, ending in `/v1` (e.g. `http://127.0.0.1:8000/v1`); a URL given
with the `/chat/completions` path is cut back to it. The prompt's system text is the first message
(role "system"), the prompt itself the user message. Tokens come from `usage.prompt_tokens` and
`usage.completion_tokens` (0 when the server reports no usage: such calls cost 0, say so in the
price table). `max_tokens` is sent as `max_tokens`, which vLLM, SGLang, the policy server and
OpenAI's non-reasoning models accept.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from streams.judge.config import JudgeConfig
from streams.judge.prompt import Prompt
from streams.judge.providers.base import Answer, Provider

SUFFIX = "/chat/completions"
# finish_reason -> the Messages API's stop_reason, so every judge reply reads the same
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def sdk_base_url(url: str | None) -> str | None:
    """The SDK's base URL for a configured endpoint URL.

    >>> sdk_base_url("http://127.0.0.1:8000/v1/chat/completions")
    'http://127.0.0.1:8000/v1'
    >>> sdk_base_url("http://127.0.0.1:8000/v1/")
    'http://127.0.0.1:8000/v1/'
    """
    if url and url.rstrip("/").endswith(SUFFIX):
        return url.rstrip("/")[: -len(SUFFIX)]
    return url


class OpenAIProvider(Provider):
    name = "openai"

    def sdk(self) -> ModuleType:
        import openai

        return openai

    def make_client(self, config: JudgeConfig) -> Any:
        return self.sdk().AsyncOpenAI(
            api_key=config.effective_api_key(),
            base_url=sdk_base_url(config.base_url),
            timeout=config.timeout_s,
            max_retries=0,
        )

    async def send(self, client: Any, config: JudgeConfig, prompt: Prompt) -> Any:
        extra = {"temperature": config.temperature} if config.temperature is not None else {}
        return await client.chat.completions.create(
            model=config.model,
            max_tokens=config.max_tokens,
            messages=[
                {"role": "system", "content": prompt.system},
                {"role": "user", "content": prompt.user},
            ],
            **extra,
        )

    def read(self, reply: Any) -> Answer:
        choice = reply.choices[0] if reply.choices else None
        text = (choice.message.content or "") if choice is not None and choice.message else ""
        usage = reply.usage
        finish = choice.finish_reason if choice is not None else None
        return Answer(
            text=text,
            model=reply.model or "",
            input_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            output_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
            stop_reason=STOP_REASONS.get(finish, finish) if finish else None,
        )
