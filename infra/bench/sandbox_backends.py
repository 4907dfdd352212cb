"""The sandbox backends `bench rollout` measures, and the set-up time of the Docker one.

The local backend needs nothing. The Docker backend's engine comes from, in this order:

1. `--docker-host` (or `AGENTSTREAM_SANDBOX_DOCKER_HOST`, else `DOCKER_HOST`): an engine someone
   else runs; it must hold `--sandbox-image`. The bench starts and stops nothing there.
2. With `--engine-cold` (the full bench): a scratch state directory under `--engine-scratch-dir`.
   Cold = `SandboxEngine.setup` there (dockerd started, the image built with mmdebstrap); the
   engine is stopped; warm = the same set-up again (dockerd started, the image reused). The docker
   rows then run on that engine (unless one is named as in 1.), which is stopped and its directory
   removed at the end.
3. Otherwise the project's private engine (`infra.sandbox_engine`, its default state directory),
   taken with a lease: its set-up is reported as measured (engine started or already running, image
   reused or built) and the engine is stopped at the end when this run started it and nobody else
   uses it.

What was started is stopped also when the bench fails, on Ctrl-C and on SIGTERM (turned into
KeyboardInterrupt for the duration). Where the Docker backend cannot be had (no engine tools, not
root, no engine at the address, no image) `DockerTarget.unavailable` says why and the local rows
still run. It must not pick an engine a user did not name (the dev engine is not a default).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.options.env import add_option

log = logging.getLogger(__name__)

BACKENDS = ("local", "docker")
SETUP_COLUMNS = ("setup", "engine", "engine_s", "image", "image_s", "total_s", "note")


@dataclass
class DockerTarget:
    """The engine the docker rows run on (`config` a `DockerConfig`), or why there is none."""

    config: Any = None
    unavailable: str | None = None
    source: str = ""  # where the engine came from (see the module docstring)
    setup: dict[str, dict] = field(default_factory=dict)  # "cold" / "warm" -> figures, or a note


def add_arguments(parser) -> None:
    add_option(
        parser, "--backends", type=parse_backends, default="local,docker", help="sandbox backends to measure"
    )
    add_option(
        parser,
        "--docker-host",
        env="AGENTSTREAM_SANDBOX_DOCKER_HOST",  # the name the test suite's engine fixture reads too
        help="an engine to use for the docker rows, e.g. unix:///path/docker.sock "
        "(default: DOCKER_HOST, else the bench starts the private engine itself)",
    )
    add_option(parser, "--sandbox-image", help="the sandbox image on that engine (default: the project's)")
    add_option(
        parser,
        "--engine-cold",
        action="store_true",
        default=True,
        help="measure the cold set-up (a scratch engine, the image built: 45-90 s) and the warm one",
    )
    add_option(
        parser, "--engine-scratch-dir", default="/var/tmp", help="where the cold set-up's scratch state goes"
    )


def parse_backends(text: str) -> list[str]:
    """The backends named in `--backends`, in order.

    >>> parse_backends("docker, local")
    ['docker', 'local']
    """
    names = [part.strip() for part in str(text).split(",") if part.strip()]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {', '.join(BACKENDS)}, got {text!r}"
        )
    return list(dict.fromkeys(names))


@contextlib.contextmanager
def docker_target(args, wanted: bool) -> Iterator[DockerTarget]:
    """The Docker engine of this run (see the module docstring); what it started goes after the block."""
    target = DockerTarget()
    if not wanted:
        target.unavailable = "--backends leaves docker out"
        target.setup = _not_measured(target.unavailable)
        yield target
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(_sigterm_interrupts())
        host = args.docker_host or os.environ.get("DOCKER_HOST") or None
        image = args.sandbox_image or _default_image()
        if args.engine_cold:
            _cold_and_warm(stack, args, target, keep=host is None)
        elif host is None:
            _private_engine(stack, target)
        else:
            target.setup = _not_measured(f"the engine at {host} was not set up by this run")
        if host is not None:
            target.source = "--docker-host" if args.docker_host else "DOCKER_HOST"
            target.unavailable = _check(host, image)
            target.config = None if target.unavailable else _config(host, image)
        elif target.config is not None and args.sandbox_image and args.sandbox_image != _default_image():
            target.config, target.unavailable = None, "--sandbox-image needs --docker-host"
        yield target


def _default_image() -> str:
    from producers.sandbox.image import SANDBOX_IMAGE

    return SANDBOX_IMAGE


def _config(host: str, image: str):
    from producers.sandbox.docker import DockerConfig

    return DockerConfig(docker_host=host, image=image)


def _check(host: str, image: str) -> str | None:
    try:
        from infra.sandbox_engine.engine import check_engine
        from infra.sandbox_engine.errors import SandboxEngineError

        check_engine(host, image)
    except ImportError as exc:
        return f"the Python 'docker' package is not installed ({exc})"
    except SandboxEngineError as exc:
        return str(exc)
    return None


def _cold_and_warm(stack: contextlib.ExitStack, args, target: DockerTarget, keep: bool) -> None:
    """Cold then warm set-up on a scratch state directory; with `keep` the docker rows use it."""
    from infra.sandbox_engine.engine import SandboxEngine, unavailable_reason
    from infra.sandbox_engine.errors import EngineUnavailable

    reason = unavailable_reason()
    if reason:
        target.setup = _not_measured(reason)
        target.unavailable = reason
        return
    scratch = Path(tempfile.mkdtemp(prefix="asb-engine-", dir=args.engine_scratch_dir))
    stack.callback(_remove, scratch)
    engine = SandboxEngine(scratch)
    stack.callback(_stop, engine)
    try:
        cold = engine.setup("session", progress=_progress)
        _stop(engine)
        warm = engine.setup("session", progress=_progress)
    except EngineUnavailable as exc:
        target.setup = _not_measured(str(exc))
        target.unavailable = str(exc)
        return
    target.setup = {
        "cold": cold.as_dict() | {"note": f"scratch state dir {scratch}: nothing there before"},
        "warm": warm.as_dict() | {"note": "the same state dir, engine stopped before: image there"},
    }
    if keep:
        target.config, target.source = _config(engine.docker_host, cold.image), f"scratch engine {scratch}"
    else:
        _stop(engine)


def _private_engine(stack: contextlib.ExitStack, target: DockerTarget) -> None:
    """A lease on the project's private engine; its set-up as it happened (no cold build asked)."""
    from infra.sandbox_engine.engine import SandboxEngine, unavailable_reason
    from infra.sandbox_engine.errors import EngineUnavailable

    reason = unavailable_reason()
    if reason:
        target.setup, target.unavailable = _not_measured(reason), reason
        return
    engine = SandboxEngine()
    lease = engine.acquire(owner="session")
    stack.callback(lease.release)
    try:
        setup = lease.setup(progress=_progress).as_dict()
    except EngineUnavailable as exc:
        target.setup, target.unavailable = _not_measured(str(exc)), str(exc)
        return
    what = f"the private engine ({engine.state_dir}): engine {setup['engine']}, image {setup['image_state']}"
    cold = setup["image_state"] == "built"  # no image there: what was measured is a cold image build
    target.setup = {
        "cold": setup | {"note": what} if cold else {"note": "not measured: --no-engine-cold"},
        "warm": {"note": f"not measured: {what}"} if cold else setup | {"note": what},
    }
    target.config, target.source = _config(engine.docker_host, setup["image"]), str(engine.state_dir)


def _stop(engine) -> None:
    lock = engine.control_lock()
    try:
        engine.stop(progress=_progress)
    finally:
        lock.release()


def _remove(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    if directory.exists():
        log.warning("bench rollout: could not remove the scratch engine state %s entirely", directory)


def _progress(line: str) -> None:
    log.info("sandbox engine: %s", line)


def _not_measured(reason: str) -> dict[str, dict]:
    return {kind: {"note": f"not measured: {reason}"} for kind in ("cold", "warm")}


def setup_rows(setup: dict[str, dict]) -> list[dict]:
    """One table row per set-up kind (cold, warm): seconds, or the note saying why not."""
    rows = []
    for kind in ("cold", "warm"):
        figures = setup.get(kind, {})
        rows.append(
            {
                "setup": kind,
                "engine": figures.get("engine"),
                "engine_s": figures.get("engine_s"),
                "image": figures.get("image_state"),
                "image_s": figures.get("image_s"),
                "total_s": figures.get("total_s"),
                "note": figures.get("note"),
            }
        )
    return rows


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM ends the run like Ctrl-C while an engine is held, so it is stopped; by default
    Python would die at once and leave dockerd running."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
