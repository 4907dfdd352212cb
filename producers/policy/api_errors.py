"""The policy server's errors as OpenAI answers them: an HTTP status and the body
`{"error": {"message", "type", "param", "code"}}`, so that the real `openai` SDK raises its own
`BadRequestError` / `NotFoundError` / `AuthenticationError` with our message. Pure: no HTTP here.

    ApiError (ProducerError)    a request the server answers with an OpenAI-style error
"""

from __future__ import annotations

from typing import Any

from producers.errors import ProducerError


class ApiError(ProducerError):
    """A request the server answers with an OpenAI-style error."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}
        return {"error": error}


def bad(param: str, value: Any, expected: str) -> ApiError:
    """The 400 for a field whose value is not what it takes, naming both.

    >>> bad("n", 0, "an integer in [1, 16]").message
    'n: expected an integer in [1, 16], got 0'
    """
    return ApiError(400, f"{param}: expected {expected}, got {preview(value)}", param)


def preview(value: Any, limit: int = 120) -> str:
    """`repr(value)`, cut at `limit` characters: a hostile value is never echoed whole."""
    try:
        text = repr(value)
    except RecursionError:  # JSON nested past Python's limit (orjson reads 1024 levels)
        text = f"<a {type(value).__name__} nested too deep to show>"
    return text if len(text) <= limit else text[:limit] + "..."
