"""A scripted vLLM-like upstream on 127.0.0.1 (a free port) for the recording proxy's unit tests:
`GET /v1/models`, token-in `POST /v1/completions` and the runtime LoRA API
(`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`), answering as vLLM does (404 for a model it does
not serve, 400 for a name already loaded without `load_inplace`). Every request is kept in `calls`.

Completions answer `tokens` with `logprobs`; with `logprobs: k > 1` each token's `top_logprobs` is
`{"token_id:N": logprob}` with k + 1 entries (vLLM adds the sampled token), the best last, so an
order the proxy must sort. `hold` (an Event) makes completions wait until it is set; `drop` makes the
next completion close the connection without an answer; `refuse[name] = (status, text)` refuses that
adapter's load.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class ScriptedUpstream:
    url: str  # http://127.0.0.1:PORT, no /v1
    base: str
    max_model_len: int | None
    loaded: dict[str, str] = field(default_factory=dict)  # adapter name -> path
    calls: list[tuple[str, dict]] = field(default_factory=list)
    refuse: dict[str, tuple[int, str]] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=lambda: [5, 6, 7])
    logprobs: list[float] = field(default_factory=lambda: [-0.5, -1.25, -0.75])
    finish_reason: str = "length"
    owned_by: str = "vllm"
    headers: dict[str, str] = field(default_factory=dict)
    hold: threading.Event | None = None
    drop: bool = False
    started: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def paths(self) -> list[str]:
        return [path for path, _ in self.calls]

    def bodies(self, path: str) -> list[dict]:
        return [body for p, body in self.calls if p == path]

    def answer(self, path: str, body: dict) -> tuple[int, object]:
        """(status, JSON body or text) for a POST; None status: drop the connection."""
        if path == "/v1/load_lora_adapter":
            return self._load(body)
        if path == "/v1/unload_lora_adapter":
            if self.loaded.pop(body.get("lora_name"), None) is None:
                return 404, {
                    "error": {"message": f"The lora adapter '{body.get('lora_name')}' cannot be found."}
                }
            return 200, "Success"
        if path != "/v1/completions":
            return 404, {"error": {"message": f"no route {path}"}}
        self.started.release()
        if self.hold is not None:
            self.hold.wait(30)
        if self.drop:
            self.drop = False
            return 0, None
        if body.get("model") not in (self.base, *self.loaded):
            return 404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}}
        return 200, {"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                     "choices": [self._choice(i, body) for i in range(body.get("n", 1))]}  # fmt: skip

    def _load(self, body: dict) -> tuple[int, object]:
        name = body.get("lora_name")
        if name in self.refuse:
            return self.refuse[name]
        if name in self.loaded and not body.get("load_inplace"):
            return 400, {"error": {"message": f"The lora adapter '{name}' has already been loaded."}}
        self.loaded[name] = body.get("lora_path")
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def _choice(self, index: int, body: dict) -> dict:
        k = body.get("logprobs") or 0
        top = [
            {f"token_id:{t + 100 + j}": lp - 1 - j for j in range(k, 0, -1)} | {f"token_id:{t}": lp}
            for t, lp in zip(self.tokens, self.logprobs, strict=True)
        ]
        logprobs = {
            "tokens": [f"token_id:{t}" for t in self.tokens],
            "token_logprobs": list(self.logprobs),
            "top_logprobs": top,
        }
        return {"index": index, "text": "xyz", "token_ids": list(self.tokens), "logprobs": logprobs,
                "finish_reason": self.finish_reason}  # fmt: skip

    def models(self) -> dict:
        data = [
            {"id": self.base, "object": "model", "owned_by": self.owned_by, "root": self.base, "parent": None}
        ]
        if self.max_model_len:
            data[0]["max_model_len"] = self.max_model_len
        data += [{"id": n, "object": "model", "root": p, "parent": self.base} for n, p in self.loaded.items()]
        return {"object": "list", "data": data}


@contextmanager
def scripted_upstream(
    base: str = "tiny-base", adapters: dict[str, str] | None = None, max_model_len: int | None = None
) -> Iterator[ScriptedUpstream]:
    """A `ScriptedUpstream` serving `base` (and `adapters`, name -> path, loaded before the proxy starts)."""
    state = ScriptedUpstream("", base, max_model_len, dict(adapters or {}))
    connections: list = []  # closed at the end too: a kept-alive connection would outlive the server

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            connections.append(self.connection)

        def do_GET(self) -> None:
            state.calls.append((self.path, {}))
            if self.path == "/v1/models":
                self._send(200, state.models())
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            state.calls.append((self.path, body))
            status, answer = state.answer(self.path, body)
            if not status:
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self._send(status, answer)

        def _send(self, status: int, body: object) -> None:
            data = (json.dumps(body) if not isinstance(body, str) else body).encode()
            self.send_response(status)
            kind = "application/json" if not isinstance(body, str) else "text/plain"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            for name, value in state.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="upstream-stub", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        if state.hold is not None:
            state.hold.set()
        server.shutdown()
        server.server_close()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        thread.join(timeout=5)
