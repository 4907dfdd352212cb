"""A scripted OpenAI-compatible policy endpoint on 127.0.0.1 (a free port), for tests that run a real
`agentstream rollout` child without a model: each chat completion is what `script(messages)`
answers, `(content, tool call or None)`. `calc_solver` computes a `calc` task's expression with the
calculator tool, then answers what the tool said (so every calc episode is solved in two turns).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Reply = tuple[str, tuple[str, dict] | None]
Script = Callable[[list[dict]], Reply]


def calc_solver(messages: list[dict]) -> Reply:
    """Turn 1: the calculator on the task's expression (the last quoted text of the prompt); then
    the tool's answer as the final answer."""
    if messages[-1].get("role") == "tool":
        return str(messages[-1].get("content", "")), None
    prompt = next(str(m.get("content")) for m in messages if m.get("role") == "user")
    return "computing", ("calculator", {"expression": prompt.rsplit('"', 2)[1]})


@contextmanager
def scripted_openai(script: Script = calc_solver) -> Iterator[tuple[str, list[dict]]]:
    """Yields (the base URL `http://127.0.0.1:PORT/v1`, the chat requests it got, in order)."""
    requests: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args) -> None:
            pass

        def do_GET(self) -> None:
            self._json({"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "tests"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            requests.append(body)
            content, call = script(body.get("messages") or [])
            message: dict = {"role": "assistant", "content": content}
            if call is not None:
                function = {"name": call[0], "arguments": json.dumps(call[1])}
                message["tool_calls"] = [
                    {"id": f"call-{len(requests)}", "type": "function", "function": function}
                ]
            finish = "tool_calls" if call is not None else "stop"
            self._json({
                "id": f"r{len(requests)}", "object": "chat.completion", "created": 0, "model": "policy",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            })  # fmt: skip

        def _json(self, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="openai-stub", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
