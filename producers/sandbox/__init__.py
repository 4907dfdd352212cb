"""Sandboxes an agent's tools run in: a private workspace with file, shell, search and git tools.

    from producers.sandbox.choice import make_sandbox
    with make_sandbox("local") as box:
        box.run("file_write", {"path": "a.py", "content": "print(1)\n"})
        box.run("shell", {"command": ["python", "a.py"], "timeout_s": 5})

`LocalSandbox` runs commands as child processes under rlimits (and, where the kernel allows, in
a user + network namespace); `DockerSandbox` runs them in a container. Names live in their parts:
`base` (Sandbox, ToolResult), `local` (LocalSandbox, Limits), `docker` (DockerSandbox),
`choice` (make_sandbox)
and `errors` (SandboxError).
"""
