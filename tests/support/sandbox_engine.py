"""The private Docker engine for the test session (a pytest plugin, loaded by `tests/conftest.py`).

`sandbox_engine` is session-scoped and lazy: the engine starts the first time a test asks for it,
never for a session that does not. It yields a `SandboxEngineHandle` (`.docker_host`, `.image`).
With `AGENTSTREAM_SANDBOX_DOCKER_HOST` and `AGENTSTREAM_SANDBOX_IMAGE` set, it uses that engine and
starts and stops nothing. Otherwise it starts the project's private engine (`infra/sandbox_engine/`)
and builds or reuses the image; at the end of the session (a finalizer, which also runs when tests
fail, on Ctrl-C and on SIGTERM, and an `atexit` guard for an abort past pytest's teardown) it stops
the engine,
unless the engine was already running before the session and was started by a user
(`agentstream sandbox-engine up`), or another session still uses it.

Skips are failures in CI: with `AGENTSTREAM_REQUIRE_ENGINES=1`, a skip of a test marked `engine`
(every test that uses `sandbox_engine` is marked so automatically) is reported as a failure, and the
fixture fails instead of skipping where the engine cannot be had.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from dataclasses import dataclass, field

import pytest

DOCKER_HOST_ENV = "AGENTSTREAM_SANDBOX_DOCKER_HOST"
IMAGE_ENV = "AGENTSTREAM_SANDBOX_IMAGE"
REQUIRE_ENV = "AGENTSTREAM_REQUIRE_ENGINES"
MARKER = "engine"


@dataclass(frozen=True)
class SandboxEngineHandle:
    """An engine the tests may use: `DOCKER_HOST`-style address and the sandbox image's tag."""

    docker_host: str
    image: str
    started_here: bool = False  # this session started the engine (and stops it at the end)
    setup: dict = field(default_factory=dict)  # timings and what was done (`infra.sandbox_engine.Setup`)


def engines_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") == "1"


def _skip(reason: str):
    """Skip with `reason`, or fail when engines are required (CI)."""
    if engines_required():
        pytest.fail(f"{REQUIRE_ENV}=1 and the sandbox engine cannot be had: {reason}", pytrace=False)
    pytest.skip(f"sandbox engine: {reason}")


def _from_env() -> SandboxEngineHandle | None:
    host, image = os.environ.get(DOCKER_HOST_ENV, ""), os.environ.get(IMAGE_ENV, "")
    if not host and not image:
        return None
    if not host or not image:
        pytest.fail(
            f"set both {DOCKER_HOST_ENV} and {IMAGE_ENV} to use an engine of your own "
            f"(got {DOCKER_HOST_ENV}={host!r}, {IMAGE_ENV}={image!r})",
            pytrace=False,
        )
    from infra.sandbox_engine.engine import check_engine
    from infra.sandbox_engine.errors import SandboxEngineError

    try:
        check_engine(host, image)
        problem = None
    except SandboxEngineError as exc:
        problem = str(exc)
    if problem:
        pytest.fail(f"{DOCKER_HOST_ENV}={host!r}: {problem}", pytrace=False)
    return SandboxEngineHandle(docker_host=host, image=image)


def _interrupt_on_sigterm():
    """A SIGTERM (`timeout`, a CI runner giving up) ends the session like Ctrl-C, so the finalizers
    stop the engine; by default Python would die at once and leave dockerd running. Installed
    whatever handler was there (code run earlier in the session may have left its own); the
    previous one is returned, to be put back at the end. None off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _progress(config):
    """Progress lines on the terminal (an image build takes a minute; the run should say why)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if reporter is not None:
            reporter.write_line(f"[sandbox-engine] {line}")

    return say


@pytest.fixture(scope="session")
def sandbox_engine(request):
    """A running Docker engine with the sandbox image (see the module docstring)."""
    external = _from_env()
    if external is not None:
        yield external
        return
    from infra.sandbox_engine.engine import SandboxEngine, unavailable_reason
    from infra.sandbox_engine.errors import EngineUnavailable, SandboxEngineError

    reason = unavailable_reason()
    if reason:
        _skip(reason)
    engine = SandboxEngine()
    lease = engine.acquire(owner="session")
    atexit.register(lease.release)
    previous_sigterm = _interrupt_on_sigterm()
    setup, unavailable, failed = None, None, None
    try:
        setup = lease.setup(progress=_progress(request.config))
    except EngineUnavailable as exc:
        unavailable = str(exc)
    except SandboxEngineError as exc:
        failed = str(exc)
    if setup is None:
        lease.release()
        atexit.unregister(lease.release)
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
        if unavailable:
            _skip(unavailable)
        pytest.fail(f"the sandbox engine did not come up: {failed}", pytrace=False)
    try:
        yield SandboxEngineHandle(
            docker_host=engine.docker_host,
            image=setup.image,
            started_here=setup.engine == "started",
            setup=setup.as_dict(),
        )
    finally:
        lease.release()
        atexit.unregister(lease.release)
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        f"{MARKER}: needs a real engine (the private Docker engine); a skip fails with {REQUIRE_ENV}=1",
    )


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "sandbox_engine" in getattr(item, "fixturenames", ()) and item.get_closest_marker(MARKER) is None:
            item.add_marker(MARKER)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and engines_required() and item.get_closest_marker(MARKER) is not None):
        return
    if hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"{REQUIRE_ENV}=1: a test that needs a real engine skipped ({reason})"
