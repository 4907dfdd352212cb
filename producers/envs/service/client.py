"""`RemoteEnv`: an `AgentEnv` whose env runs behind `agentstream env serve`, one session per instance,
so `RecorderWrapper`, the other wrappers and the rollout driver use it as they use an in-process one.

    with RemoteEnv("http://127.0.0.1:8765", "calc") as env:   # opens a session
        ts = env.reset(seed=7)
        ts = env.step({"tool": "calculator", "params": {"expression": "12*34"}})
        env.verify()
    # closed: the server closed the session's env

What the server refuses comes back as `EnvServiceError` (an `EnvError`) with the server's status,
code, field and value; a server that cannot be reached, or answers off the protocol, too (status 0
or 502). A `TimeoutWrapper` deadline set on this env is sent with each step as `timeout_s`, so the
server's env sees the same deadline. Not thread-safe: one episode, one caller, like any env.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from producers.envs.errors import EnvError, EnvServiceError
from producers.envs.protocol import Action, AgentEnv, TimeStep
from producers.envs.service.wire import API, preview, timestep_from_wire

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 900.0  # a sandbox step or verify can run tests for minutes


class RemoteEnv(AgentEnv):
    """A session of the env served at `url` (see the module docstring). `env`: the id the server
    must be serving; `kwargs`: keyword arguments for the session's env (those the server does not
    fix); `api_key`: sent as `Authorization: Bearer` when the server wants one."""

    def __init__(
        self,
        url: str,
        env: str,
        *,
        kwargs: dict[str, Any] | None = None,
        api_key: str | None = None,
        timeout_s: float = CALL_TIMEOUT_S,
    ):
        import httpx

        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise EnvError(f"env url: expected http(s)://host:port, got {url!r}")
        self.url, self.env_id = url.rstrip("/"), env
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S)
        self._http = httpx.Client(headers=headers, timeout=timeout, follow_redirects=False)
        self.session_id: str | None = None
        try:
            opened = self._call("POST", f"{API}/sessions", {"env": env, "kwargs": kwargs or {}})
        except BaseException:
            self._http.close()
            raise
        self.session_id = opened["session_id"]
        self.domain = opened["domain"]  # type: ignore[misc]  (an instance value, as ConversationEnv's)
        self.terminal_tools = frozenset(opened["terminal_tools"])  # type: ignore[misc]
        self._tools = list(opened["available_tools"])

    @property
    def available_tools(self) -> list[str]:
        return list(self._tools)

    def reset(self, *, task: Any = None, seed: int | None = None) -> TimeStep:
        answer = self._call("POST", self._path("reset"), {"task": task, "seed": seed})
        self._tools = list(answer.get("available_tools", self._tools))
        return timestep_from_wire(answer.get("timestep"))

    def step(self, action: Action) -> TimeStep:
        if not isinstance(action, dict):  # as `checked_action` answers it in-process
            raise EnvError(f"action: expected a dict with 'tool' and 'params', got {action!r}")
        body: dict[str, Any] = {"action": action}
        if self.step_deadline is not None:
            body["timeout_s"] = max(0.0, self.step_deadline - time.monotonic())
        return timestep_from_wire(self._call("POST", self._path("step"), body).get("timestep"))

    def verify(self) -> bool | None:
        verdict = self._call("POST", self._path("verify"), {}).get("verified")
        if verdict is not None and not isinstance(verdict, bool):
            raise EnvServiceError(
                502, "bad_response", f"verified: expected true, false or null, got {verdict!r}"
            )
        return verdict

    def last_timestep(self) -> TimeStep | None:
        """The server's copy of the last `TimeStep` (None before the first reset)."""
        found = self._call("GET", self._path("observation")).get("timestep")
        return None if found is None else timestep_from_wire(found)

    def close(self) -> None:
        """Close the session (the server closes its env); a session the server already closed (idle
        timeout, restart) is closed too. Idempotent."""
        if self.session_id is None:
            return
        try:
            self._call("DELETE", self._path(""))
        except EnvServiceError as exc:
            if exc.status != 404:
                raise
            log.info("env session %s at %s was already closed: %s", self.session_id, self.url, exc)
        finally:
            self.session_id = None
            self._http.close()

    def __repr__(self) -> str:
        return f"RemoteEnv({self.url!r}, {self.env_id!r}, session={self.session_id})"

    def _path(self, action: str) -> str:
        if self.session_id is None:
            raise EnvError(f"env session at {self.url}: closed; make a new RemoteEnv")
        return f"{API}/sessions/{self.session_id}" + (f"/{action}" if action else "")

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request; the answer's JSON object, or `EnvServiceError` with the server's error."""
        import httpx

        try:
            content = None if body is None else orjson.dumps(body)
        except orjson.JSONEncodeError as exc:  # a value JSON cannot carry: the server would refuse it
            raise EnvServiceError(400, "invalid_field", f"body: not JSON ({exc})", "body") from None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        try:
            reply = self._http.request(method, self.url + path, content=content, headers=headers)
        except httpx.HTTPError as exc:
            message = f"{method} {self.url}{path}: {type(exc).__name__}: {exc}"
            raise EnvServiceError(0, "unreachable", message, "url", self.url) from None
        try:
            answer = orjson.loads(reply.content)
        except orjson.JSONDecodeError:
            answer = None
        if reply.status_code >= 400:
            raise _server_error(method, self.url + path, reply.status_code, answer, reply.content)
        if not isinstance(answer, dict):
            message = f"{method} {self.url}{path}: expected a JSON object, got {preview(reply.text)!r}"
            raise EnvServiceError(502, "bad_response", message)
        return answer


def _server_error(method: str, where: str, status: int, answer: Any, raw: bytes) -> EnvServiceError:
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        text = raw[:300].decode("utf-8", "replace")
        return EnvServiceError(status, "http_error", f"{method} {where}: HTTP {status}: {text}")
    message = f"{method} {where}: {error.get('message')}"
    return EnvServiceError(status, str(error.get("code")), message, error.get("field"), error.get("value"))
