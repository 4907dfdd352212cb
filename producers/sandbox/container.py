"""The container of one Docker sandbox: connecting to the engine, starting, restarting, checking
that nothing is left running, and removing everything it created.

Each sandbox owns three engine objects, all labelled `agentstream.sandbox=1` and named
`agentstream-sandbox-<random>`: the worker container the tools exec into, a tmpfs volume mounted at
/workspace (its size is the workspace's cap) and a holder container that only keeps that volume
mounted. The engine unmounts a tmpfs volume when its last user stops, so without the holder a
restart (after a timeout, or to end processes a command left behind) would empty the workspace;
with it the worker can be killed and restarted and the files stay. The host never sees a path of
the workspace: every file goes in and out through exec inside the container.

The worker runs `sleep infinity` (the "keeper") under docker-init (tini) as PID 1, as uid 65533
(`KEEPER_USER`), a uid no command runs as: the agent's commands (uid 65534) can neither ptrace,
signal nor read the memory of PID 1 and the keeper, so they cannot be taken over to run something
that outlives every call. No network, every capability dropped, no-new-privileges, a read-only
root, a size-capped /tmp and /dev/shm, memory (no swap), pids and CPU limits.

It must not know the tools: `docker.py` says what runs; this module only runs it and cleans up.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
import weakref
from dataclasses import dataclass
from typing import Any

from producers.sandbox.errors import SandboxError

KEEPER_USER = "65533:65533"  # init, keeper and holder: never the uid the tools run as

__all__ = ["ENGINE_HELP", "LABEL", "Container", "connect", "engine_gaps"]

log = logging.getLogger(__name__)

LABEL = {"agentstream.sandbox": "1"}
ENGINE_HELP = (
    "`agentstream sandbox-engine up` starts a private engine, builds the image and prints its DOCKER_HOST"
)
CLEAN_CHECKS = 6  # looks at the container's processes before a leftover is believed (zombies being reaped)
HOLDER_LIMITS = {"mem_limit": "32m", "pids_limit": 4}


# `config` below is a `docker.DockerConfig`; not imported here, since docker.py imports this module.


def connect(config: Any) -> Any:
    """A docker client for `config.docker_host` (or DOCKER_HOST) that answers and holds the image."""
    try:
        import docker
    except ImportError as exc:
        raise SandboxError(
            "the Docker sandbox needs the `docker` Python package: pip install 'docker>=7'"
        ) from exc
    where = config.docker_host or os.environ.get("DOCKER_HOST") or "the default socket"
    try:
        if config.docker_host:
            client = docker.DockerClient(base_url=config.docker_host, timeout=config.api_timeout_s)
        else:
            client = docker.from_env(timeout=config.api_timeout_s)
        client.ping()
    except Exception as exc:  # the SDK raises many kinds for "no engine": all mean the same here
        raise SandboxError(
            f"no Docker engine answers at {where}: {type(exc).__name__}: {exc}; {ENGINE_HELP}"
        ) from exc
    try:
        client.images.get(config.image)
    except docker.errors.ImageNotFound as exc:
        client.close()
        raise SandboxError(f"the engine at {where} has no image {config.image!r}: {ENGINE_HELP}") from exc
    except docker.errors.DockerException as exc:
        client.close()
        raise SandboxError(f"the engine at {where} cannot look up image {config.image!r}: {exc}") from exc
    return client


def engine_gaps(client: Any) -> list[str]:
    """What this engine cannot enforce; raises for a limit the sandbox promises."""
    info = client.info()
    for key, what in (
        ("MemoryLimit", "a memory limit"),
        ("PidsLimit", "a pids limit"),
        ("CpuCfsQuota", "a CPU quota"),
    ):
        if info.get(key) is False:
            raise SandboxError(f"the Docker engine cannot enforce {what} (kernel cgroup support is missing)")
    missing = []
    if info.get("SwapLimit") is False:
        missing.append("swap: not limited (the kernel has no swap accounting)")
    if not any("seccomp" in opt for opt in info.get("SecurityOptions") or []):
        missing.append("seccomp: the engine applies no seccomp filter")
    return missing


@dataclass
class _Owned:
    """What one sandbox created in the engine, shared with its finalizer (which must not hold the
    sandbox itself, or it would never be collected)."""

    client: Any
    names: list[str]
    volume: str | None = None


def _remove_owned(owned: _Owned) -> None:
    """Remove the containers and the volume (force), then close the client; never raises."""
    for name in owned.names:
        try:
            owned.client.api.remove_container(name, force=True)
        except Exception as exc:  # gone already, or the engine is gone: nothing more to do
            log.debug("sandbox: removing container %s: %s", name, exc)
    if owned.volume:
        try:
            owned.client.api.remove_volume(owned.volume, force=True)
        except Exception as exc:
            log.debug("sandbox: removing volume %s: %s", owned.volume, exc)
    owned.names.clear()
    owned.volume = None
    owned.client.close()


class Container:
    """The worker container, its workspace volume and its holder; `remove()` deletes all three
    (also when the sandbox is collected or the interpreter exits)."""

    def __init__(self, client: Any, config: Any):
        self.client, self.config = client, config
        self.api = client.api
        self.name = f"agentstream-sandbox-{secrets.token_hex(6)}"
        self._owned = _Owned(client, [])
        self._finalizer = weakref.finalize(self, _remove_owned, self._owned)
        self.allowed: set[int] = set()  # host pids of docker-init and the keeper
        try:
            self._start()
        except Exception as exc:
            self.remove()
            if isinstance(exc, SandboxError):
                raise
            raise SandboxError(f"cannot start the sandbox container from {config.image!r}: {exc}") from exc

    def _start(self) -> None:
        from docker.types import Mount

        cfg = self.config
        self._owned.volume = self.name
        self.api.create_volume(
            self.name,
            driver="local",
            driver_opts={
                "type": "tmpfs",
                "device": "tmpfs",
                "o": f"size={cfg.workspace_size},uid={cfg.uid},gid={cfg.gid},mode=0755,nosuid,nodev",
            },
            labels=LABEL,
        )
        common = {
            "detach": True,
            "init": True,
            "network_mode": "none",
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "user": KEEPER_USER,
            "read_only": True,
            "labels": LABEL,
            # no_copy: the engine would otherwise give the empty volume the owner of the image's
            # mount point (root), and the sandbox user could not manage its own workspace root.
            "mounts": [Mount("/workspace", self.name, type="volume", no_copy=True)],
        }
        self._owned.names.append(f"{self.name}-holder")
        self.client.containers.run(
            cfg.image, ["sleep", "infinity"], name=f"{self.name}-holder", **common, **HOLDER_LIMITS
        )
        self._owned.names.append(self.name)
        self.container = self.client.containers.run(
            cfg.image,
            ["sleep", "infinity"],
            name=self.name,
            **common,
            tmpfs={"/tmp": f"rw,exec,nosuid,nodev,size={cfg.tmp_size},mode=1777"},
            shm_size=cfg.shm_size,
            mem_limit=cfg.memory,
            memswap_limit=cfg.memory,
            pids_limit=cfg.pids_limit,
            nano_cpus=int(cfg.cpus * 1e9),
            working_dir="/workspace",
        )
        self._learn_pids()

    def _learn_pids(self) -> None:
        """Record the host pids of docker-init and its one child (the keeper) after a start."""
        last: Exception | None = None
        for _ in range(200):
            self.container.reload()
            init = self.container.attrs["State"]["Pid"]
            try:
                children = [pid for pid, ppid, _stat in self._processes() if ppid == init]
            except Exception as exc:  # 409 "is not running": a busy engine is still starting it
                last, children = exc, []
            if init and len(children) == 1:
                self.allowed = {init, children[0]}
                return
            time.sleep(0.02)
        state = self.container.attrs.get("State", {})
        raise SandboxError(
            f"container {self.name} did not come up with one process under its init within 4 s "
            f"(status {state.get('Status')!r}, exit code {state.get('ExitCode')!r}; last error: {last})"
        )

    def _processes(self) -> list[tuple[int, int, str]]:
        """(host pid, host ppid, state) of every process in the container (the engine runs `ps`)."""
        top = self.api.top(self.name, ps_args="-o pid,ppid,stat")
        titles = top.get("Titles") or []
        if titles[:3] != ["PID", "PPID", "STAT"]:
            raise SandboxError(f"the engine's process list has columns {titles!r}, not PID PPID STAT")
        return [(int(row[0]), int(row[1]), str(row[2])) for row in top.get("Processes") or []]

    def restart(self) -> None:
        """Kill everything in the container and start it again; the workspace volume stays."""
        self.api.restart(self.name, timeout=0)
        self._learn_pids()

    def leftovers(self) -> list[int]:
        """Host pids of processes other than init and the keeper, looked at a few times so that
        processes already killed and being reaped are not counted. A container whose keeper or
        init is gone (the agent killed it; the container stops) gives [-1]."""
        found: list[int] = []
        for attempt in range(CLEAN_CHECKS):
            try:
                pids = {pid for pid, _ppid, _stat in self._processes()}
            except Exception as exc:  # 409: not running any more
                log.info("sandbox %s: cannot list processes (%s)", self.name, exc)
                return [-1]
            if not self.allowed <= pids:
                return [-1]
            found = sorted(pids - self.allowed)
            if not found:
                return []
            time.sleep(0.005 * 2**attempt)
        return found

    def oom_killed_since(self, since: float) -> bool:
        """Whether the kernel's OOM killer struck in this container since `since` (epoch seconds)."""
        events = self.client.events(
            since=f"{since:.9f}",
            until=f"{time.time():.9f}",
            filters={"container": self.container.id, "event": "oom"},
            decode=True,
        )
        try:
            return any(True for _ in events)
        finally:
            events.close()

    def remove(self) -> None:
        """Remove the containers and the volume, close the client (idempotent)."""
        self._finalizer()
