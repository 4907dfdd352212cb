"""The private `dockerd` of one state directory, the lease a test session holds on it, and the set-up
(engine + image) with its timings.

`SandboxEngine` starts `dockerd` with its own data root, exec root, socket and pid file, and with no
bridge, no iptables rules, no ip forwarding and no masquerading; it stops it by PID after removing
the sandbox's containers and volumes and unmounts what it left. `EngineLease` is one user's hold on
it (see the package docstring for the locks).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from infra.runtime import stop_child
from infra.sandbox_engine.errors import EngineUnavailable, SandboxEngineError
from infra.sandbox_engine.host import (
    LOCK_TIMEOUT_S,
    FileLock,
    descendants,
    log_tail,
    mounts_under,
    pid_alive,
    same_process,
    stop_pid,
    unmount,
)
from infra.sandbox_engine.image import Progress, ensure_image, quiet
from producers.sandbox.image import SANDBOX_IMAGE

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_STATE_DIR",
    "SANDBOX_LABEL",
    "STATE_DIR_ENV",
    "EngineLease",
    "SandboxEngine",
    "Setup",
    "check_engine",
    "measure_setup",
    "unavailable_reason",
]

DEFAULT_STATE_DIR = Path("/var/tmp/agentstream-sandbox-engine")
STATE_DIR_ENV = "AGENTSTREAM_SANDBOX_ENGINE_DIR"
SANDBOX_LABEL = "agentstream.sandbox"  # `=1` on the Docker sandbox's containers and volumes
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 20.0
IMAGE_CHOICES = ("ensure", "rebuild", "skip")


def unavailable_reason() -> str | None:
    """None when this machine can run the private engine, else why not (and how to get it)."""
    if os.geteuid() != 0:
        return "the private dockerd needs root: run as root (or point DOCKER_HOST at an engine of yours)"
    if shutil.which("dockerd") is None:
        return "dockerd is not installed: apt-get install docker.io (`make test` installs it)"
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the Python 'docker' package is not installed (pip install -e '.[dev]')"
    return None


def _client(docker_host: str, timeout: int = 60):
    import docker

    return docker.DockerClient(base_url=docker_host, timeout=timeout)


def check_engine(docker_host: str, image: str) -> None:
    """Raise SandboxEngineError unless an engine answers at `docker_host` and holds `image`."""
    import docker

    try:
        client = _client(docker_host, timeout=10)
    except docker.errors.DockerException as exc:
        raise SandboxEngineError(f"no engine at {docker_host!r}: {exc}") from exc
    try:
        client.ping()
        client.images.get(image)
    except docker.errors.ImageNotFound as exc:
        raise SandboxEngineError(f"the engine at {docker_host!r} has no image {image!r}") from exc
    except docker.errors.DockerException as exc:
        raise SandboxEngineError(f"no engine answers at {docker_host!r}: {exc}") from exc
    finally:
        client.close()


@dataclass(frozen=True)
class Setup:
    """What one set-up did and how long it took (the rollout bench reports these)."""

    docker_host: str
    image: str
    engine: str  # "started" | "running" (already up: reused)
    engine_s: float
    image_state: str  # "built" | "reused" | "skipped"
    image_s: float
    total_s: float

    def as_dict(self) -> dict:
        return asdict(self)


class SandboxEngine:
    """The private `dockerd` of one state directory."""

    def __init__(self, state_dir: Path | str | None = None):
        chosen = state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
        self.state_dir = Path(chosen).absolute()
        self.data_root = self.state_dir / "data"
        self.exec_root = self.state_dir / "exec"
        self.pidfile = self.state_dir / "dockerd.pid"
        self.socket = self.state_dir / "docker.sock"
        self.log = self.state_dir / "dockerd.log"
        self._owner_file = self.state_dir / "owner"
        self._popen: subprocess.Popen | None = None

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def argv(self) -> list[str]:
        return [
            "dockerd",
            f"--data-root={self.data_root}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={self.pidfile}",
            f"--host={self.docker_host}",
            "--bridge=none",
            "--iptables=false",
            "--ip-forward=false",
            "--ip-masq=false",
        ]

    def client(self, timeout: int = 60):
        return _client(self.docker_host, timeout=timeout)

    def pid(self) -> int | None:
        """The PID of this state directory's dockerd, or None (a stale pid file is not trusted)."""
        try:
            pid = int(self.pidfile.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return None
        ours = f"--pidfile={self.pidfile}".encode()
        if not cmdline or Path(cmdline[0].decode(errors="replace")).name != "dockerd" or ours not in cmdline:
            return None
        return pid if pid_alive(pid) else None

    def answers(self) -> bool:
        if not self.socket.exists():
            return False
        try:
            client = self.client(timeout=5)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except Exception:
            return False

    def owner(self) -> str | None:
        try:
            return self._owner_file.read_text().strip() or None
        except OSError:
            return None

    def set_owner(self, owner: str) -> None:
        if owner not in ("session", "user"):
            raise SandboxEngineError(f"owner={owner!r}: expected 'session' or 'user'")
        self._owner_file.write_text(owner + "\n")

    def _mkdirs(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o711)
        self.data_root.mkdir(exist_ok=True)
        self.exec_root.mkdir(exist_ok=True)

    def control_lock(self, timeout_s: float | None = LOCK_TIMEOUT_S) -> FileLock:
        """The exclusive lock held while starting, building or stopping (waits for another holder)."""
        self._mkdirs()
        lock = FileLock(self.state_dir / "control.lock")
        if not lock.acquire(FileLock.EX, timeout_s):
            raise SandboxEngineError(
                f"{lock.path}: another process has held the engine's lock for {timeout_s:.0f} s"
            )
        return lock

    def start(self, progress: Progress = quiet) -> str:
        """Start dockerd unless it runs; "started" or "running". Call under `control_lock`."""
        reason = unavailable_reason()
        if reason:
            raise EngineUnavailable(reason)
        if self.pid() is not None:
            self._wait_ready(time.monotonic() + READY_TIMEOUT_S)
            return "running"
        self._clean_leftovers()
        progress(f"starting dockerd (state in {self.state_dir})")
        with open(self.log, "ab") as log:
            self._popen = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C at the terminal reaches us, and we stop it in order
            )
        try:
            self._wait_ready(time.monotonic() + READY_TIMEOUT_S)
        except SandboxEngineError:
            stop_child(self._popen, grace_s=5)
            self._popen = None
            self._clean_leftovers()
            raise
        return "started"

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self._popen is not None and self._popen.poll() is not None:
                code = self._popen.returncode
                raise SandboxEngineError(
                    f"dockerd exited with code {code}; the end of {self.log}:\n{log_tail(self.log)}"
                )
            if self.answers():
                return
            time.sleep(0.1)
        raise SandboxEngineError(
            f"dockerd did not answer at {self.docker_host} within {READY_TIMEOUT_S:.0f} s; "
            f"the end of {self.log}:\n{log_tail(self.log)}"
        )

    def _clean_leftovers(self) -> None:
        """What a killed engine left: its containerd, its socket, its pid files and its mounts."""
        self._stop_stale_containerd()
        for point in mounts_under(self.state_dir):
            unmount(point)
        for path in (self.socket, self.pidfile):
            path.unlink(missing_ok=True)

    def _stop_stale_containerd(self) -> None:
        """dockerd reuses the containerd its pid file names while that PID exists, and times out when
        it is a dead one not yet reaped (a killed dockerd's child): stop it if it is ours, forget it."""
        pidfile = self.exec_root / "containerd" / "containerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        if pid_alive(pid) and str(self.exec_root).encode() in cmdline:
            stop_pid(pid, STOP_GRACE_S)
        pidfile.unlink(missing_ok=True)

    def stop(self, progress: Progress = quiet) -> str:
        """Remove the sandbox's containers and then its volumes, stop dockerd by PID, unmount what it
        left; "stopped" or "not running". Call under `control_lock`."""
        pid = self.pid()
        if pid is None and self._popen is None:
            self._clean_leftovers()
            self._owner_file.unlink(missing_ok=True)
            return "not running"
        containers, volumes = self._remove_sandbox_objects()
        if containers or volumes:
            progress(f"removed {containers} sandbox container(s) and {volumes} volume(s)")
        survivors = descendants(pid) if pid is not None else []
        progress(f"stopping dockerd (pid {pid})")
        if self._popen is not None:
            stop_child(self._popen, grace_s=STOP_GRACE_S)
            self._popen = None
        elif pid is not None:
            stop_pid(pid, STOP_GRACE_S)
        for child, start in survivors:  # containerd and shims, when dockerd had to be killed
            if same_process(child, start):
                stop_pid(child, 5.0)
        self._clean_leftovers()
        self._owner_file.unlink(missing_ok=True)
        return "stopped"

    def _remove_sandbox_objects(self) -> tuple[int, int]:
        """Remove the containers labelled as a sandbox's, then the volumes so labelled (a volume
        goes only once no container uses it); the counts removed. Never raises: an engine that
        does not answer is stopped by signal all the same."""
        try:
            client = self.client(timeout=30)
        except Exception:
            return 0, 0
        labelled = {"label": f"{SANDBOX_LABEL}=1"}
        try:
            containers = _remove_each(lambda: client.containers.list(all=True, filters=labelled), "container")
            volumes = _remove_each(lambda: client.volumes.list(filters=labelled), "volume")
            return containers, volumes
        finally:
            client.close()

    def setup(self, owner: str, progress: Progress = quiet, image: str = "ensure") -> Setup:
        """Start the engine (or find it running) and, under the control lock, the image: "ensure"
        (reuse or build), "rebuild" (build even when it is there) or "skip" (the engine only)."""
        if image not in IMAGE_CHOICES:
            raise SandboxEngineError(f"image={image!r}: expected one of {', '.join(IMAGE_CHOICES)}")
        began = time.monotonic()
        lock = self.control_lock()
        try:
            state = self.start(progress)
            if state == "started" or owner == "user":
                self.set_owner(owner)
            engine_s = time.monotonic() - began
            image_state, image_s = self._image(image, progress)
        finally:
            lock.release()
        total = time.monotonic() - began
        progress(f"engine {state} in {engine_s:.1f} s; image {image_state} in {image_s:.1f} s")
        return Setup(self.docker_host, SANDBOX_IMAGE, state, engine_s, image_state, image_s, total)

    def _image(self, choice: str, progress: Progress) -> tuple[str, float]:
        if choice == "skip":
            return "skipped", 0.0
        began = time.monotonic()
        client = self.client(timeout=600)
        try:
            state = ensure_image(client, progress, workdir=self.state_dir, rebuild=choice == "rebuild")
        finally:
            client.close()
        return state, time.monotonic() - began

    def acquire(self, owner: str = "session") -> EngineLease:
        """A lease on the engine for one user (a test session); `EngineLease.setup` brings it up."""
        return EngineLease(self, owner)

    def in_use(self) -> bool:
        """True while some session holds a lease (a shared lock on `users.lock`)."""
        if not self.state_dir.exists():
            return False
        probe = FileLock(self.state_dir / "users.lock")
        if probe.acquire(FileLock.EX, timeout_s=0):
            probe.release()
            return False
        return True

    def status(self) -> dict:
        pid = self.pid()
        return {
            "state_dir": str(self.state_dir),
            "docker_host": self.docker_host,
            "pid": pid,
            "answers": pid is not None and self.answers(),
            "owner": self.owner(),
            "in_use": self.in_use(),
            "image": SANDBOX_IMAGE,
            "mounts": mounts_under(self.state_dir) if self.state_dir.exists() else [],
        }


class EngineLease:
    """One user's hold on the engine: a shared lock on `users.lock` from `setup` to `release`."""

    def __init__(self, engine: SandboxEngine, owner: str):
        self.engine = engine
        self.owner = owner
        self._users: FileLock | None = None

    def setup(self, progress: Progress = quiet, image: str = "ensure") -> Setup:
        """Take the shared lock, then bring the engine (and the image, see `SandboxEngine.setup`) up."""
        self.engine._mkdirs()
        self._users = FileLock(self.engine.state_dir / "users.lock")
        if not self._users.acquire(FileLock.SH):
            raise SandboxEngineError(f"{self._users.path}: cannot take a shared lock")
        return self.engine.setup(self.owner, progress, image)

    def release(self) -> None:
        """Drop the lease; stop the engine when it was a session's and nobody else uses it. Idempotent."""
        if self._users is None:
            return
        self._users.release()
        self._users = None
        lock = self.engine.control_lock()
        try:
            if self.engine.owner() == "session" and not self.engine.in_use():
                self.engine.stop()
        finally:
            lock.release()


def measure_setup(progress: Progress = quiet) -> dict:
    """Cold and warm set-up on a scratch state directory, then removed: cold = a new engine and the
    image built from nothing; warm = the engine started again, the image reused. For the benchmarks."""
    state = Path(tempfile.mkdtemp(prefix="ase-bench-", dir="/var/tmp"))
    engine = SandboxEngine(state)
    try:
        cold = engine.setup("session", progress)
        _stop_locked(engine, progress)
        warm = engine.setup("session", progress)
    finally:
        _stop_locked(engine, progress)
        shutil.rmtree(state, ignore_errors=True)
    return {"cold": cold.as_dict(), "warm": warm.as_dict()}


def _remove_each(listing, kind: str) -> int:
    """Force-remove every object `listing()` returns; how many went (a failure is logged)."""
    removed = 0
    try:
        for found in listing():
            try:
                found.remove(force=True)
                removed += 1
            except Exception as exc:
                log.warning(
                    "sandbox engine: could not remove %s %s: %s", kind, getattr(found, "name", found), exc
                )
    except Exception as exc:
        log.warning("sandbox engine: could not list the sandbox %ss: %s", kind, exc)
    return removed


def _stop_locked(engine: SandboxEngine, progress: Progress) -> None:
    lock = engine.control_lock()
    try:
        engine.stop(progress)
    finally:
        lock.release()
