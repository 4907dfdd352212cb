"""The sandbox engine's errors (under `infra.errors.InfraError`).

SandboxEngineError      the engine or its image could not be had (says why, with the log tail)
└── EngineUnavailable   a tool or permission it needs is missing here (names the apt package)
"""

from __future__ import annotations

from infra.errors import InfraError

__all__ = ["EngineUnavailable", "SandboxEngineError"]


class SandboxEngineError(InfraError):
    """The private engine or its image could not be had (the message says why, with the log tail)."""


class EngineUnavailable(SandboxEngineError):
    """A tool or permission the engine needs is missing here (names the apt package)."""
