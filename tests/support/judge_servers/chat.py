"""A local OpenAI-compatible chat-completions server on 127.0.0.1 for the judge's openai provider.

The real `openai` SDK talks to it over HTTP (`base_url=server.base_url`, i.e. `<url>/v1`;
`POST /v1/chat/completions`), as it would to vLLM, SGLang or the policy server. The scripted
behaviour (latency, script, failures, retry-after, the default scoring, token usage) is
tests/support/judge_servers/scripted.py's, shared with the Messages-API server; this module writes only
the chat-completions request and answer shapes (`choices[0].message.content`, `finish_reason`,
`usage.prompt_tokens` / `completion_tokens`, and OpenAI's error body).

Run alone: `python -m tests.support.judge_servers.chat --port 0 --latency 0.5` prints its URL.
"""

from __future__ import annotations

from tests.support.judge_servers.scripted import Reply, ScriptedServer, main, text_of

__all__ = ["ChatServer", "Reply"]

ERROR_TYPES = {429: "rate_limit_exceeded", 400: "invalid_request_error", 401: "authentication_error"}


class ChatServer(ScriptedServer):
    """`POST /v1/chat/completions` as the openai SDK expects it."""

    ROUTE = "/v1/chat/completions"

    @property
    def base_url(self) -> str:
        """What the openai SDK takes as `base_url` (it appends `/chat/completions`)."""
        return f"{self.url}/v1"

    def prompt_of(self, body: dict) -> tuple[str, str]:
        messages = body.get("messages", [])
        system = "".join(
            text_of(m.get("content")) for m in messages if m.get("role") in ("system", "developer")
        )
        user = "".join(text_of(m.get("content")) for m in messages if m.get("role") == "user")
        return system, user

    def error_body(self, status: int) -> dict:
        kind = ERROR_TYPES.get(status, "server_error")
        return {"error": {"message": "scripted", "type": kind, "param": None, "code": None}}

    def ok_body(self, body: dict, text: str, input_tokens: int, output_tokens: int) -> dict:
        return {
            "id": f"chatcmpl-{len(self.requests):08d}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "unknown"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": input_tokens,
                "completion_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens,
            },
        }


if __name__ == "__main__":
    main(ChatServer, "local OpenAI-compatible chat-completions server for judge tests")
