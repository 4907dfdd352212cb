"""The workspace of the Docker sandbox as a tar, both ways: a host directory packed for `reset`
(sent to `tar -x` inside the container) and the container's `tar -c` unpacked for `snapshot`.

Packing reads a directory the caller trusts (a task's repository); unpacking reads what the agent
made, so it goes through tarfile's "data" filter and a member the filter refuses (a link out of the
target, a device) is skipped and logged. Both spool to temp files, never to memory.
"""

from __future__ import annotations

import logging
import os
import tarfile
import tempfile
from pathlib import Path
from typing import IO

from producers.sandbox.errors import SandboxError

__all__ = ["pack", "unpack"]

log = logging.getLogger(__name__)


def pack(root: Path, uid: int, limit: int) -> IO[bytes]:
    """A tar of the host directory `root` (regular files, dirs, symlinks and hard links; modes
    kept, owned by `uid`) in a temp file, at most `limit` bytes."""
    if not root.is_dir():
        raise SandboxError(f"reset snapshot_dir {str(root)!r} is not a directory")
    skipped: list[str] = []

    def own(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not (info.isreg() or info.isdir() or info.issym() or info.islnk()):
            skipped.append(info.name)
            return None
        info.uid = info.gid = uid
        info.uname = info.gname = ""
        return info

    spool = tempfile.TemporaryFile()  # noqa: SIM115 - returned open to the caller, closed on error
    try:
        with tarfile.open(fileobj=spool, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(os.path.realpath(root), arcname=".", filter=own)
        if spool.tell() > limit:
            size = spool.tell()
            raise SandboxError(
                f"reset snapshot_dir {str(root)!r} is larger than the workspace ({size} > {limit} bytes)"
            )
    except BaseException:
        spool.close()
        raise
    if skipped:
        log.warning("sandbox reset: %d special file(s) of %s not copied: %s", len(skipped), root, skipped[:5])
    spool.seek(0)
    return spool


def unpack(spool: IO[bytes], target: Path) -> None:
    """Extract the workspace tar (hostile) into the new directory `target` with the "data" filter;
    a member it refuses is skipped and logged rather than failing the whole copy."""
    skipped: list[str] = []

    def data(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        try:
            return tarfile.data_filter(member, path)
        except tarfile.FilterError as exc:
            skipped.append(f"{member.name!r}: {exc}")
            return None

    target.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=spool, mode="r:") as tar:
            tar.extractall(target, filter=data)
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise SandboxError(
            f"snapshot: the workspace archive could not be extracted into {target}: {exc}"
        ) from exc
    if skipped:
        log.warning(
            "sandbox snapshot: %d member(s) refused by the data filter: %s", len(skipped), skipped[:5]
        )
