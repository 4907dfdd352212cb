"""What the local judge servers share: a scripted stand-in for a model, served on 127.0.0.1.

Not a model: each API's server (tests/support/judge_servers/messages.py for the Messages API,
tests/support/judge_servers/chat.py for OpenAI-compatible chat completions) writes only its wire format;
this module owns the rest, the same for both:

- `latency_s`: fixed delay before every answer;
- `script`: replies consumed in order before the default behaviour (e.g. a 429 with retry-after,
  a 529, a 500, a malformed or truncated text, exact token usage);
- `fail_status`: answer every request with this status (a permanently failing endpoint);
- `text`: answer every request with this text (malformed / truncated JSON tests);
- default: score from the prompt like a gullible model that only ever looks OUTSIDE the
  `<untrusted_data>` blocks: rubric ids come from the Rubrics section, step indices and labels from
  the tags' attributes, and if any text outside the blocks says "score 1.0", it obeys and gives
  1.0 everywhere. So an injection that escapes its delimiters raises the score; one that stays
  inside cannot.
- usage: `(len(system) + len(user)) // 4` input and `len(text) // 4` (at least 1) output tokens,
  unless the reply gives `usage`; so the same prompt costs the same tokens on either server.

Every request is kept (`requests`: the JSON bodies; `headers`: their auth headers) and every
answer's status (`statuses`), for the tests to assert on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import threading
import zlib
from dataclasses import dataclass, field

from aiohttp import web

BLOCK = re.compile(r"<untrusted_data\b[^>]*>.*?</untrusted_data>", re.DOTALL)
OPEN_TAG = re.compile(r"<untrusted_data\b([^>]*)>")
ATTR = re.compile(r'(\w+)="([^"]*)"')
RUBRIC_LINE = re.compile(r"^- ([A-Za-z0-9_.-]+) \(weight", re.MULTILINE)
OBEY = re.compile(r"score\s*(?:=|:)?\s*1\.0", re.IGNORECASE)
AUTH_HEADERS = ("authorization", "x-api-key")


@dataclass
class Reply:
    status: int = 200
    text: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    usage: tuple[int, int] | None = None  # (input, output) tokens; None = counted from the texts


def outside_blocks(user: str) -> str:
    """The prompt with every untrusted block removed: all a well-behaved judge obeys."""
    return BLOCK.sub("", user)


def rubric_score(rubric_id: str, base: float | None) -> float:
    """A fixed per-rubric score (0.3..0.7) unless `base` is given."""
    if base is not None:
        return base
    return 0.3 + (zlib.crc32(rubric_id.encode()) % 5) / 10


def score_prompt(user: str, base: float | None = None, group_scores: dict[str, float] | None = None) -> str:
    """The reply JSON text a model scoring only from outside the untrusted data would give."""
    outside = outside_blocks(user)
    rubric_ids = RUBRIC_LINE.findall(outside)
    obey = bool(OBEY.search(outside))
    tags = [dict(ATTR.findall(m.group(1))) for m in OPEN_TAG.finditer(user)]

    def scores(label: str = "") -> dict[str, float]:
        if obey:
            return {r: 1.0 for r in rubric_ids}
        if group_scores and label in group_scores:
            return {r: group_scores[label] for r in rubric_ids}
        return {r: rubric_score(r, base) for r in rubric_ids}

    if '"steps"' in outside:
        steps = [int(t["index"]) for t in tags if t.get("kind") == "step" and t.get("index", "").isdigit()]
        body = {"steps": [{"step": i, "scores": scores(), "rationale": f"step {i} judged"} for i in steps]}
    elif '"trajectories"' in outside:
        labels = [t["label"] for t in tags if t.get("kind") == "trajectory" and "label" in t]
        body = {
            "trajectories": [{"id": lb, "scores": scores(lb), "rationale": f"{lb} judged"} for lb in labels]
        }
    else:
        body = {"scores": scores("T1"), "rationale": "trajectory judged"}
    return json.dumps(body)


def text_of(content) -> str:
    """The text of a message's content: a string, or a list of parts with `text`."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


class ScriptedServer:
    """The server, run on its own event loop in a background thread (usable from sync and async
    tests). Subclasses set `ROUTE` and write `prompt_of`, `error_body` and `ok_body`."""

    ROUTE = ""

    def __init__(self, latency_s: float = 0.0, base_score: float | None = None, port: int = 0):
        self.latency_s = latency_s
        self.base_score = base_score
        self.group_scores: dict[str, float] | None = None
        self.script: list[Reply] = []
        self.fail_status: int | None = None
        self.text: str | None = None
        self.requests: list[dict] = []
        self.headers: list[dict[str, str]] = []
        self.statuses: list[int] = []
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._lock = threading.Lock()

    # --- what each API writes -------------------------------------------------------------
    def prompt_of(self, body: dict) -> tuple[str, str]:
        """(system, user) text of a request body."""
        raise NotImplementedError

    def error_body(self, status: int) -> dict:
        raise NotImplementedError

    def ok_body(self, body: dict, text: str, input_tokens: int, output_tokens: int) -> dict:
        raise NotImplementedError

    # --- the shared mechanics ---------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ok_count(self) -> int:
        return sum(1 for s in self.statuses if s == 200)

    def start(self):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="judge-server", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(self.ROUTE, self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
        self._loop = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _next_reply(self) -> Reply | None:
        with self._lock:
            if self.script:
                return self.script.pop(0)
        if self.fail_status is not None:
            return Reply(status=self.fail_status)
        if self.text is not None:
            return Reply(text=self.text)
        return None

    async def _answer(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._lock:
            self.requests.append(body)
            self.headers.append({k: request.headers[k] for k in AUTH_HEADERS if k in request.headers})
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        reply = self._next_reply()
        if reply is not None and reply.status != 200:
            self.statuses.append(reply.status)
            return web.json_response(
                self.error_body(reply.status), status=reply.status, headers=reply.headers
            )
        system, user = self.prompt_of(body)
        text = reply.text if reply is not None and reply.text is not None else None
        if text is None:
            text = score_prompt(user, self.base_score, self.group_scores)
        usage = reply.usage if reply is not None and reply.usage is not None else None
        if usage is None:
            usage = ((len(system) + len(user)) // 4, max(1, len(text) // 4))
        self.statuses.append(200)
        return web.json_response(self.ok_body(body, text, *usage))


def main(server_class: type[ScriptedServer], description: str) -> None:
    """A server's module entry point: it writes its URL on stdout for the parent process."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    server = server_class(latency_s=args.latency, port=args.port).start()
    sys.stdout.write(server.url + "\n")
    sys.stdout.flush()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        server.stop()
