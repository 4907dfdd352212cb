"""Fixtures of the sandbox tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sandbox_python() -> str:
    """The python commands in a local sandbox find on their PATH: the system one under /usr (the
    namespace shows no other host directory, so a venv or pyenv python is not there)."""
    return "python3"
