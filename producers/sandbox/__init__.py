"""Sandboxes an agent's tools run in: a private workspace with file, shell, search and git tools.

    from producers.sandbox import make_sandbox
    with make_sandbox("local") as box:
        box.run("file_write", {"path": "a.py", "content": "print(1)\n"})
        box.run("shell", {"command": ["python", "a.py"], "timeout_s": 5})

`LocalSandbox` runs commands as child processes under rlimits (and, where the kernel allows, in
a user + network namespace); `DockerSandbox` runs them in a container. Exports resolve lazily.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DockerSandbox", "Limits", "LocalSandbox", "Sandbox", "SandboxError", "ToolResult", "make_sandbox"]

_WHERE = {
    "Sandbox": "base",
    "ToolResult": "base",
    "SandboxError": "errors",
    "Limits": "local",
    "LocalSandbox": "local",
    "DockerSandbox": "docker",
    "make_sandbox": "docker",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'producers.sandbox' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"producers.sandbox.{_WHERE[name]}"), name)
