"""A fixed-latency Messages-API endpoint on 127.0.0.1: what `agentstream bench judge` measures the
judge against, so the numbers are the judge's own and not a provider's.

It answers `POST /v1/messages` (the shape the `anthropic` SDK sends and reads) after `latency_s`,
with a well-formed judge reply: every rubric id the prompt's Rubrics section lists, scored `score`,
for every step the prompt asks about (or every trajectory, or the one trajectory). It reads only
our own parts of the prompt, never the text inside `<untrusted_data>` blocks. Usage counts
`len(text) // 4` tokens, so a longer prompt costs more, as with a real provider.

The Messages wire format (`prompt_of`, `message_body`, `error_body`) is shared with the scripted
judge double of the tests (tests/support/judge_servers/messages.py), which adds scripts, failures
and adversarial scoring on top.

Run alone: `python -m infra.bench.judge_endpoint --latency 0.5` prints its URL on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys

ROUTE = "/v1/messages"
ERROR_TYPES = {
    429: "rate_limit_error",
    529: "overloaded_error",
    500: "api_error",
    400: "invalid_request_error",
}
_BLOCK = re.compile(r"<untrusted_data\b[^>]*>.*?</untrusted_data>", re.DOTALL)
_OPEN_TAG = re.compile(r"<untrusted_data\b([^>]*)>")
_ATTR = re.compile(r'(\w+)="([^"]*)"')
_RUBRIC_LINE = re.compile(r"^- ([A-Za-z0-9_.-]+) \(weight", re.MULTILINE)


def text_of(content) -> str:
    """The text of a message's content: a string, or a list of parts with `text`.

    >>> text_of([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]), text_of(None)
    ('ab', '')
    """
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def prompt_of(body: dict) -> tuple[str, str]:
    """(system, user) text of a Messages request body."""
    user = "".join(text_of(m.get("content")) for m in body.get("messages", []))
    return text_of(body.get("system") or ""), user


def message_body(request: dict, text: str, input_tokens: int, output_tokens: int, message_id: str) -> dict:
    """A Messages API answer carrying `text`."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": request.get("model", "unknown"),
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def error_body(status: int, message: str = "endpoint error") -> dict:
    """A Messages API error body for an HTTP status."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def fixed_reply(user: str, score: float) -> str:
    """The judge reply scoring every listed rubric `score`, in the shape the prompt asks for.

    >>> data = '<untrusted_data kind="step" index="3">\\n- b (weight 1)\\n</untrusted_data>'
    >>> fixed_reply('- a (weight 0.5): x\\n' + data + ' "steps"', 0.5)
    '{"steps": [{"step": 3, "scores": {"a": 0.5}, "rationale": "fixed"}]}'
    """
    ours = _BLOCK.sub("", user)  # rubric lines inside the data are not rubrics
    scores = dict.fromkeys(_RUBRIC_LINE.findall(ours), score)
    tags = [dict(_ATTR.findall(m.group(1))) for m in _OPEN_TAG.finditer(user)]
    if '"steps"' in ours:
        steps = [int(t["index"]) for t in tags if t.get("kind") == "step" and t.get("index", "").isdigit()]
        body: dict = {"steps": [{"step": i, "scores": scores, "rationale": "fixed"} for i in steps]}
    elif '"trajectories"' in ours:
        labels = [t["label"] for t in tags if t.get("kind") == "trajectory" and "label" in t]
        body = {"trajectories": [{"id": label, "scores": scores, "rationale": "fixed"} for label in labels]}
    else:
        body = {"scores": scores, "rationale": "fixed"}
    return json.dumps(body)


def usage_of(system: str, user: str, text: str) -> tuple[int, int]:
    """(input, output) tokens counted from the texts, about four characters a token."""
    return (len(system) + len(user)) // 4, max(1, len(text) // 4)


class JudgeEndpoint:
    """The endpoint's aiohttp application: `latency_s` before every answer, `score` everywhere."""

    def __init__(self, latency_s: float = 0.0, score: float = 0.5):
        self.latency_s, self.score = latency_s, score
        self.answered = 0

    def app(self):
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(ROUTE, self._answer)
        return app

    async def _answer(self, request):
        from aiohttp import web

        body = await request.json()
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        system, user = prompt_of(body)
        text = fixed_reply(user, self.score)
        self.answered += 1
        return web.json_response(
            message_body(body, text, *usage_of(system, user, text), f"msg_{self.answered:08d}")
        )


async def serve(endpoint: JudgeEndpoint, port: int = 0) -> None:
    """Serve on 127.0.0.1:`port` (0: any free port), write the URL on stdout, run until stopped."""
    from aiohttp import web

    runner = web.AppRunner(endpoint.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    sys.stdout.write(f"http://127.0.0.1:{bound}\n")
    sys.stdout.flush()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fixed-latency Messages-API endpoint for `bench judge`")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free one)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before every answer")
    parser.add_argument("--score", type=float, default=0.5, help="the score of every rubric")
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(JudgeEndpoint(args.latency, args.score), args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
