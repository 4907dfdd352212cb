"""The served environment's sessions: one env each, at most `max_sessions` open, ids nobody can guess
(uuid4), one env call at a time per session, idle ones found for closing. Lives on the server's event
loop (no thread touches the table); the envs themselves are called in worker threads.

A session counts against the limit from the moment its create request is accepted until its env is
closed, so a session whose step is still running (or whose env is still closing) keeps its slot and
the worker threads can never all be taken by fewer sessions than the limit.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from producers.envs.errors import EnvServiceError
from producers.envs.protocol import AgentEnv, TimeStep
from producers.envs.service.wire import preview


@dataclass
class Session:
    """One episode's env and what the server knows of it."""

    id: str
    env: AgentEnv | None = None
    last_used: float = field(default_factory=time.monotonic)
    last: TimeStep | None = None
    started: bool = False
    closing: bool = False
    running: bool = False
    """An env call of this session is in a worker thread (set and cleared on the event loop)."""
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while no env call runs: what closing waits for."""

    def __post_init__(self):
        self.settled.set()

    @property
    def done(self) -> bool:
        return self.last is not None and self.last.done

    def describe(self) -> dict[str, Any]:
        env = self.env
        assert env is not None
        return {
            "session_id": self.id,
            "domain": env.domain,
            "terminal_tools": sorted(env.terminal_tools),
            "available_tools": list(env.available_tools),
        }


class SessionTable:
    """Open sessions by id (see the module docstring)."""

    def __init__(self, max_sessions: int):
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def reserve(self) -> Session:
        """A new session's slot (its env is made next), or 429 when the limit is reached."""
        if len(self._sessions) >= self.max_sessions:
            raise EnvServiceError(
                429,
                "too_many_sessions",
                f"sessions: {len(self._sessions)} open, the limit is {self.max_sessions} "
                "(--max-sessions); close one or retry later",
                "sessions",
                len(self._sessions),
            )
        session = Session(uuid.uuid4().hex)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str) -> Session:
        """The open session `session_id`, or 404 (also for one being closed)."""
        session = self._sessions.get(session_id)
        if session is None or session.closing or session.env is None:
            raise EnvServiceError(
                404,
                "unknown_session",
                f"session_id: no open session {preview(session_id, 80)!r} "
                "(closed, timed out or never created)",
                "session_id",
                preview(session_id, 80),
            )
        return session

    def release(self, session: Session) -> None:
        """Forget `session` (its env is closed, or was never made)."""
        self._sessions.pop(session.id, None)

    def idle(self, timeout_s: float, now: float | None = None) -> list[Session]:
        """Sessions no request has used for `timeout_s`, none running a request."""
        now = time.monotonic() if now is None else now
        return [
            s
            for s in self._sessions.values()
            if s.env is not None and not s.closing and not s.running and now - s.last_used > timeout_s
        ]

    def all(self) -> list[Session]:
        return list(self._sessions.values())


def busy(session: Session) -> EnvServiceError:
    """409: the session is running another request (one at a time per session)."""
    return EnvServiceError(
        409,
        "session_busy",
        f"session_id: session {session.id} is running another request; one at a time per session",
        "session_id",
        session.id,
    )
