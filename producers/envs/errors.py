"""Exceptions of `producers.envs`: the environment protocol, the registry, the wrappers, the task files.

    ProducerError                   (producers.errors)
    └── EnvError                    an unknown or duplicate env id, a bad task file line, a step
        │                           before reset() or after the episode ended
        └── ExpressionError         an arithmetic expression the calculator refuses (producers.envs.calc)

Messages name the id, the file and line, or the value received.
"""

from __future__ import annotations

from producers.errors import ProducerError


class EnvError(ProducerError):
    """An environment, its registry or its task file was used wrongly."""


class ExpressionError(EnvError):
    """An expression the safe calculator refuses or cannot evaluate (the message says why)."""
