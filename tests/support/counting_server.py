"""A local HTTP server that counts the requests it gets: tests that a tool sends *no* request to a
URL it must refuse (the MCP `rollout` allow-list, `DESCRIBE url(...)` through the chDB endpoint).

Subclass `CountingHandler` and override `body()` for another answer; `redirect_to` makes every answer
a 302 there. Binds 127.0.0.1 on a free port and stops with the context manager.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class CountingHandler(BaseHTTPRequestHandler):
    hits: list[str]
    redirect_to: str | None = None

    def log_message(self, format, *args) -> None:
        pass

    def body(self) -> tuple[str, bytes]:
        """(content type, body) of a 200: a CSV that a schema inference would read columns from."""
        return "text/csv", b"secret,from\nthe,inside\n"

    def do_GET(self) -> None:
        self._answer()

    do_HEAD = do_GET

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer()

    def _answer(self) -> None:
        self.hits.append(f"{self.command} {self.path}")
        if self.redirect_to:
            self.send_response(302)
            self.send_header("Location", self.redirect_to + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        content_type, data = self.body()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


@contextmanager
def counting_server(
    handler: type[CountingHandler] = CountingHandler, redirect_to: str | None = None
) -> Iterator[tuple[str, list[str]]]:
    """Yields (base URL, the list of "METHOD path" it was sent)."""
    hits: list[str] = []
    bound = type("Handler", (handler,), {"hits": hits, "redirect_to": redirect_to})
    server = ThreadingHTTPServer(("127.0.0.1", 0), bound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
