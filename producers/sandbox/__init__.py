"""Sandboxes an agent's tools run in: a private workspace with file, shell, search and git tools.

    from producers.sandbox import make_sandbox
    with make_sandbox("local") as box:
        box.run("file_write", {"path": "a.py", "content": "print(1)\n"})
        box.run("shell", {"command": ["python", "a.py"], "timeout_s": 5})

`LocalSandbox` runs commands as child processes under rlimits (and, where the kernel allows, in
a user + network namespace); `DockerSandbox` runs them in a container. The parts import only the
standard library, so the package imports them directly.
"""

from __future__ import annotations

from producers.sandbox.base import Sandbox, ToolResult
from producers.sandbox.docker import DockerSandbox, make_sandbox
from producers.sandbox.errors import SandboxError
from producers.sandbox.local import Limits, LocalSandbox

__all__ = ["DockerSandbox", "Limits", "LocalSandbox", "Sandbox", "SandboxError", "ToolResult", "make_sandbox"]
