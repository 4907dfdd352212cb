"""A scripted Messages-API server on 127.0.0.1 for the judge tests.

The real `anthropic` SDK talks to it over HTTP (`base_url=server.url`, `POST /v1/messages`). The
scripted behaviour (latency, script, failures, the default scoring, token usage) is
tests/support/judge_servers/scripted.py's, shared with the chat-completions server; the Messages API's
request and answer shapes are the product's (infra/bench/judge_endpoint.py, the fixed-latency endpoint
of `agentstream bench judge`), so the double and the bench speak the same wire format.

Run alone: `python -m tests.support.judge_servers.messages --port 0 --latency 0.5` prints its URL.
"""

from __future__ import annotations

from infra.bench import judge_endpoint as messages_api
from tests.support.judge_servers.scripted import (
    Reply,
    ScriptedServer,
    main,
    outside_blocks,
    rubric_score,
    score_prompt,
)

__all__ = ["MessagesServer", "Reply", "outside_blocks", "rubric_score", "score_prompt"]


class MessagesServer(ScriptedServer):
    """`POST /v1/messages` as the anthropic SDK expects it."""

    ROUTE = messages_api.ROUTE

    def prompt_of(self, body: dict) -> tuple[str, str]:
        return messages_api.prompt_of(body)

    def error_body(self, status: int) -> dict:
        return messages_api.error_body(status, "scripted")

    def ok_body(self, body: dict, text: str, input_tokens: int, output_tokens: int) -> dict:
        return messages_api.message_body(
            body, text, input_tokens, output_tokens, f"msg_{len(self.requests):08d}"
        )


if __name__ == "__main__":
    main(MessagesServer, "local Messages-API server for judge tests")
