"""A local Messages-API server on 127.0.0.1 for judge tests, the judge benchmark and offline demos.

The real `anthropic` SDK talks to it over HTTP (`base_url=server.url`, `POST /v1/messages`). The
scripted behaviour (latency, script, failures, the default scoring, token usage) is
tests/support/judge_servers/scripted.py's, shared with the chat-completions server; this module writes
only the Messages API's request and answer shapes.

Run alone: `python -m tests.support.judge_servers.messages --port 0 --latency 0.5` prints its URL.
"""

from __future__ import annotations

from tests.support.judge_servers.scripted import (
    Reply,
    ScriptedServer,
    main,
    outside_blocks,
    rubric_score,
    score_prompt,
    text_of,
)

__all__ = ["MessagesServer", "Reply", "outside_blocks", "rubric_score", "score_prompt"]

ERROR_TYPES = {
    429: "rate_limit_error",
    529: "overloaded_error",
    500: "api_error",
    400: "invalid_request_error",
}


class MessagesServer(ScriptedServer):
    """`POST /v1/messages` as the anthropic SDK expects it."""

    ROUTE = "/v1/messages"

    def prompt_of(self, body: dict) -> tuple[str, str]:
        system = body.get("system") or ""
        user = "".join(text_of(m.get("content")) for m in body.get("messages", []))
        return text_of(system), user

    def error_body(self, status: int) -> dict:
        return {
            "type": "error",
            "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": "scripted"},
        }

    def ok_body(self, body: dict, text: str, input_tokens: int, output_tokens: int) -> dict:
        return {
            "id": f"msg_{len(self.requests):08d}",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "model": body.get("model", "unknown"),
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }


if __name__ == "__main__":
    main(MessagesServer, "local Messages-API server for judge tests/benchmarks")
