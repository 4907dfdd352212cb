"""Sandboxes an agent's tools run in: a private workspace with file, shell, search and git tools.

    from producers.sandbox.choice import make_sandbox
    with make_sandbox("auto") as box:        # local (bubblewrap), else Docker, else a refusal
        box.run("file_write", {"path": "a.py", "content": "print(1)\n"})
        box.run("shell", {"command": ["python3", "a.py"], "timeout_s": 5})

One boundary per sandbox (per episode), every tool call inside it. `LocalSandbox` is one bubblewrap
namespace whose PID 1 (`inside`) serves the calls over a pipe; `DockerSandbox` is one hardened
container with `exec` per call. Names live in their parts: `base` (Sandbox, ToolResult), `choice`
(make_sandbox, the documented order of "auto"), `local` (LocalSandbox, Limits) with `namespace`,
`bubblewrap`, `channel`, `confinement` and `inside`; `docker` (DockerSandbox, DockerConfig) with
`container`, `container_exec`, `container_programs` and `workspace_tar`; `image` (the Docker image's
recipe) and `errors` (SandboxError).
"""
