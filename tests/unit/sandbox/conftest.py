"""Fixtures of the sandbox tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def sandbox_python() -> str:
    """A Python the sandbox user can execute: as root, commands run as uid 65534, which cannot
    reach an interpreter under /root (pyenv, a venv linked there), so the system one is used."""
    if os.geteuid() == 0:
        for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
            if Path(candidate).exists():
                return candidate
        pytest.fail("running as root needs a system python3 the sandbox user can execute")
    return sys.executable
