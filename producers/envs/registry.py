"""The env registry: ids to factories, so a task file or a CLI option can name an env.

    register("calc", CalcEnv, domain="math", description="arithmetic with a calculator tool")
    env = make("calc", difficulty=3)
    list_envs(domain="math")  # ['calc']

Built-in envs are registered when `producers.envs` is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from producers.envs.errors import EnvError
from producers.envs.protocol import AgentEnv

EnvFactory = Callable[..., AgentEnv]


@dataclass(frozen=True)
class EnvSpec:
    """One registered env: its factory, default keyword arguments, domain and description."""

    id: str
    factory: EnvFactory
    kwargs: dict[str, Any] = field(default_factory=dict)
    domain: str = "generic"
    description: str = ""

    def make(self, **overrides: Any) -> AgentEnv:
        """A new env from the defaults merged with `overrides`."""
        return self.factory(**{**self.kwargs, **overrides})


_SPECS: dict[str, EnvSpec] = {}


def register(
    id: str, factory: EnvFactory, *, domain: str = "generic", description: str = "", **kwargs: Any
) -> EnvSpec:
    """Register `factory` under `id`; a taken id raises `EnvError` (unregister it first)."""
    if not isinstance(id, str) or not id:
        raise EnvError(f"env id: expected a non-empty string, got {id!r}")
    if id in _SPECS:
        raise EnvError(f"env id {id!r} is already registered; registered ids: {sorted(_SPECS)}")
    if not callable(factory):
        raise EnvError(f"env {id!r}: factory must be callable, got {factory!r}")
    _SPECS[id] = EnvSpec(id, factory, dict(kwargs), domain, description)
    return _SPECS[id]


def unregister(id: str) -> None:
    """Remove `id` (tests, re-registration); an unknown id raises `EnvError`."""
    _spec_or_raise(id)
    del _SPECS[id]


def make(id: str, **overrides: Any) -> AgentEnv:
    """A new env of `id`; an unknown id raises `EnvError` listing the registered ids."""
    return _spec_or_raise(id).make(**overrides)


def spec(id: str) -> EnvSpec | None:
    """The spec registered under `id`, or None."""
    return _SPECS.get(id)


def list_envs(domain: str | None = None) -> list[str]:
    """Registered ids, sorted; only those of `domain` when given."""
    return sorted(i for i, s in _SPECS.items() if domain is None or s.domain == domain)


def _spec_or_raise(id: str) -> EnvSpec:
    found = _SPECS.get(id)
    if found is None:
        raise EnvError(f"unknown env id {id!r}; registered ids: {sorted(_SPECS)}")
    return found
