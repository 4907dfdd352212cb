"""`agentstream sandbox-engine up|down|status`: the private Docker engine of the Docker sandbox
(`infra/sandbox_engine.py`), so the Docker backend runs without a system Docker.

`up` starts the engine (or finds it running), builds or reuses the sandbox image and prints the
`export DOCKER_HOST=...` line to use it; the engine then keeps running until `down`. `down` refuses
while a test session holds the engine, unless `--force`.
"""

from __future__ import annotations

from infra.options.env import add_option, command_parser, group_parser
from infra.sandbox_engine.engine import DEFAULT_STATE_DIR, STATE_DIR_ENV, SandboxEngine
from infra.sandbox_engine.errors import SandboxEngineError
from infra.terminal import output


def register(sub) -> None:
    """Add `agentstream sandbox-engine up|down|status` to the parser."""
    group = group_parser(sub, "sandbox-engine", "the private Docker engine of the Docker sandbox (root)")
    up_parser = command_parser(group, "up", up, "start the engine, build or reuse the sandbox image")
    add_option(
        up_parser,
        "--rebuild",
        action="store_true",
        env="AGENTSTREAM_SANDBOX_ENGINE_REBUILD",
        help="build the image even when it is there",
    )
    add_option(
        up_parser,
        "--image",
        action="store_true",
        default=True,
        env="AGENTSTREAM_SANDBOX_ENGINE_IMAGE",
        help="build or reuse the sandbox image (--no-image: the engine only)",
    )
    down_parser = command_parser(group, "down", down, "remove sandbox containers and stop the engine")
    add_option(
        down_parser,
        "--force",
        action="store_true",
        env="AGENTSTREAM_SANDBOX_ENGINE_FORCE",
        help="stop it even while a test session uses it",
    )
    status_parser = command_parser(group, "status", status, "say whether the engine runs and what it holds")
    for parser in (up_parser, down_parser, status_parser):
        add_option(
            parser,
            "--state-dir",
            env=STATE_DIR_ENV,
            default=str(DEFAULT_STATE_DIR),
            help="the engine's state directory (data root, socket, pid file, log)",
        )


def up(args) -> int:
    engine = SandboxEngine(args.state_dir)
    if args.rebuild and not args.image:
        raise SandboxEngineError("--rebuild with --no-image: choose one")
    image = "rebuild" if args.rebuild else "ensure" if args.image else "skip"
    engine.setup("user", progress=output.say, image=image)
    output.say(f"export DOCKER_HOST={engine.docker_host}")
    return 0


def down(args) -> int:
    engine = SandboxEngine(args.state_dir)
    lock = engine.control_lock()
    try:
        if engine.in_use() and not args.force:
            raise SandboxEngineError(
                f"{engine.state_dir}: a test session is using the engine (--force stops it anyway)"
            )
        output.say(f"engine {engine.stop(progress=output.say)} ({engine.state_dir})")
    finally:
        lock.release()
    return 0


def status(args) -> int:
    state = SandboxEngine(args.state_dir).status()
    if state["pid"] is None:
        output.say(f"not running ({state['state_dir']})")
    else:
        answers = "answers" if state["answers"] else "does NOT answer"
        output.say(f"dockerd pid {state['pid']} {answers} at {state['docker_host']}")
        output.say(f"started by: {state['owner'] or 'unknown'}")
        output.say(f"in use by a test session: {'yes' if state['in_use'] else 'no'}; image {state['image']}")
    for point in state["mounts"]:
        output.say(f"mounted: {point}")
    return 0 if state["pid"] is None or state["answers"] else 1
