"""The bubblewrap command line of one local sandbox: what its namespace shows and hides.

It owns the view of the host a sandboxed command gets: `/usr` and the merged-usr links (`/bin`,
`/lib`, ...) read-only, a curated `/etc` (the loader cache, `alternatives`, Python's Debian config,
and `passwd`/`group`/`hosts`/`nsswitch.conf` written here, never the host's own files), a private
`/proc` and `/dev`, size-capped tmpfs mounts at `/workspace`, `/tmp` and `/dev/shm`, and new user,
pid, ipc, uts, cgroup and (unless asked) network namespaces, and no new user namespace inside. The
root and `/dev` are remounted read-only, so nothing but the three capped mounts can be written.
Nothing else of the host is mounted: not `/root`, `/home`, `/var`, `/run`, the host's `/tmp`, the
checkout or the data dir.

Pure: it builds argv lists and file contents from plain values; it starts nothing (`local` does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SANDBOX_GID", "SANDBOX_UID", "WORKSPACE", "NamespacePlan", "etc_files", "namespace_argv"]

SANDBOX_UID = 65534  # the uid commands have inside the namespace (never 0)
SANDBOX_GID = 65534
WORKSPACE = "/workspace"
TMP = "/tmp"
SHM = "/dev/shm"
HOSTNAME = "sandbox"
# Top-level names that merged-usr systems make links into /usr (a real directory is bound read-only).
USR_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Read-only pieces of the host's /etc that commands need and that say nothing about the host.
ETC_BINDS = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "python3")


@dataclass(frozen=True)
class NamespacePlan:
    """What one namespace gets: sizes of its writable mounts, network or not, and its program."""

    bwrap: str
    program: list[str]
    workspace_bytes: int
    tmp_bytes: int
    shm_bytes: int
    network: bool = False
    etc_fds: dict[str, int] = field(default_factory=dict)  # file name in /etc -> fd bwrap reads
    host_root: str = "/"


def namespace_argv(plan: NamespacePlan) -> list[str]:
    """The full bwrap argv: namespaces, mounts in order, then `--` and the program (run as PID 1).

    >>> plan = NamespacePlan("bwrap", ["/usr/bin/python3"], 10, 5, 2, host_root="/nonexistent")
    >>> argv = namespace_argv(plan)
    >>> argv[:3], argv[-2:]
    (['bwrap', '--unshare-all', '--new-session'], ['--', '/usr/bin/python3'])
    >>> "--share-net" in argv, argv[argv.index("/workspace") - 3 : argv.index("/workspace")]
    (False, ['--size', '10', '--tmpfs'])
    """
    argv = [plan.bwrap, "--unshare-all", "--new-session", "--as-pid-1", "--cap-drop", "ALL"]
    # a user namespace always (--unshare-all only tries), and none inside it: `unshare -r` would make
    # the agent root of a namespace of its own, opening much more of the kernel to it
    argv += ["--unshare-user", "--disable-userns"]
    if plan.network:
        argv.append("--share-net")
    argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--hostname", HOSTNAME]
    argv += ["--ro-bind", "/usr", "/usr", *usr_links(plan.host_root)]
    argv += _etc_args(plan.host_root, plan.etc_fds)
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for size, target in ((plan.workspace_bytes, WORKSPACE), (plan.tmp_bytes, TMP), (plan.shm_bytes, SHM)):
        argv += ["--size", str(size), "--tmpfs", target]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKSPACE, "--", *plan.program]
    return argv


def usr_links(host_root: str = "/") -> list[str]:
    """`/bin`, `/lib`, ... as the host has them: a link into usr/ is made a link, a directory is
    bound read-only, a missing one is left out.

    >>> usr_links("/nonexistent")
    []
    """
    args: list[str] = []
    for name in USR_LINKS:
        path = Path(host_root) / name
        if path.is_symlink():
            target = os.readlink(path)
            if target.lstrip("/").startswith("usr/"):
                args += ["--symlink", target.lstrip("/"), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    return args


def _etc_args(host_root: str, etc_fds: dict[str, int]) -> list[str]:
    args = ["--dir", "/etc"]
    etc = Path(host_root) / "etc"
    for name in ETC_BINDS:
        if (etc / name).exists():
            args += ["--ro-bind", str(etc / name), f"/etc/{name}"]
    for entry in sorted(etc.glob("python3.*")) if etc.is_dir() else []:
        args += ["--ro-bind", str(entry), f"/etc/{entry.name}"]
    for name, fd in sorted(etc_fds.items()):
        args += ["--ro-bind-data", str(fd), f"/etc/{name}"]
    return args


def etc_files() -> dict[str, bytes]:
    """The /etc files written for the namespace (never copied from the host): one user, one group,
    localhost only, files-only name lookup.

    >>> etc_files()["passwd"].decode().splitlines()[1]
    'sandbox:x:65534:65534:agent sandbox:/workspace:/bin/sh'
    """
    return {
        "passwd": (
            "root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
            f"sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:agent sandbox:{WORKSPACE}:/bin/sh\n"
        ).encode(),
        "group": f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\n".encode(),
        "hosts": f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost ip6-localhost\n".encode(),
        "nsswitch.conf": b"passwd: files\ngroup: files\nhosts: files\n",
        "hostname": f"{HOSTNAME}\n".encode(),
    }
