"""Exceptions of `producers.envs`: the environment protocol, the registry, the wrappers, the task files.

    ProducerError                   (producers.errors)
    └── EnvError                    an unknown or duplicate env id, a bad task file line, a step
        │                           before reset() or after the episode ended
        ├── ExpressionError         an arithmetic expression the calculator refuses (producers.envs.calc)
        └── EnvServiceError         a served env's request refused or failed, with its HTTP status,
                                    code, field and value (producers.envs.service)

Messages name the id, the file and line, or the value received.
"""

from __future__ import annotations

from producers.errors import ProducerError


class EnvError(ProducerError):
    """An environment, its registry or its task file was used wrongly."""


class ExpressionError(EnvError):
    """An expression the safe calculator refuses or cannot evaluate (the message says why)."""


class EnvServiceError(EnvError):
    """A served environment's request refused or failed (`producers.envs.service`): the HTTP
    `status`, a stable `code`, and the `field` and `value` at fault (None when no one field is).
    The server answers it as `{"error": {...}}`; the client raises it again from that body."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None, value=None):
        super().__init__(message)
        self.status, self.code, self.message, self.field, self.value = status, code, message, field, value

    def body(self) -> dict:
        """The error as the wire carries it (docs/environment-protocol.md)."""
        error = {"code": self.code, "message": self.message, "field": self.field, "value": self.value}
        return {"error": error}
