"""The sandbox image, built without a registry: `mmdebstrap` makes a Debian root filesystem from the
machine's own apt sources (no mirror host is ever written into the project), trimmed of docs,
manuals and apt lists, and the Docker SDK imports it under `producers.sandbox.image.SANDBOX_IMAGE`.
An engine that holds the image reuses it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from infra.sandbox_engine.errors import EngineUnavailable, SandboxEngineError
from infra.sandbox_engine.host import log_tail
from producers.sandbox.image import SANDBOX_IMAGE, SANDBOX_PACKAGES, SANDBOX_SUITE

__all__ = ["Progress", "apt_sources_file", "ensure_image", "image_present", "quiet"]

APT_SOURCES = (Path("/etc/apt/sources.list.d"), Path("/etc/apt/sources.list"))
# Documentation, manuals, translations and apt's package lists are never needed inside the sandbox.
TRIM_DPKG = (
    "path-exclude=/usr/share/doc/*",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/lintian/*",
)
TRIM_HOOK = 'rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*.log'
Progress = Callable[[str], None]


def quiet(line: str) -> None:
    """A progress callback that says nothing."""


def apt_sources_file() -> Path:
    """The machine's apt sources (deb822 `.sources` first, then `sources.list`): mmdebstrap reads the
    mirror from it, so no mirror host is ever written into the project."""
    directory, legacy = APT_SOURCES
    candidates = sorted(directory.glob("*.sources")) if directory.is_dir() else []
    candidates += [legacy] if legacy.is_file() else []
    if not candidates:
        raise EngineUnavailable(
            f"no apt sources here ({directory}/*.sources, {legacy}): mmdebstrap needs a mirror"
        )
    return candidates[0]


def image_present(client, image: str = SANDBOX_IMAGE) -> bool:
    import docker

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    return True


def ensure_image(
    client, progress: Progress = quiet, workdir: Path | None = None, rebuild: bool = False
) -> str:
    """The sandbox image in the engine `client` talks to: "reused" when it is there, else "built"
    (mmdebstrap from the machine's apt sources, then an import through the SDK)."""
    if image_present(client) and not rebuild:
        progress(f"image {SANDBOX_IMAGE} is there: reused")
        return "reused"
    if shutil.which("mmdebstrap") is None:
        raise EngineUnavailable(
            "mmdebstrap is not installed: apt-get install mmdebstrap (`make test` installs it)"
        )
    with tempfile.TemporaryDirectory(prefix="image-", dir=workdir) as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        _build_rootfs(tarball, progress)
        progress(f"importing {tarball.stat().st_size / 1e6:.0f} MB as {SANDBOX_IMAGE}")
        repository, tag = SANDBOX_IMAGE.rsplit(":", 1)
        client.api.import_image_from_file(
            str(tarball), repository=repository, tag=tag, changes=["ENV LANG=C.UTF-8"]
        )
    if not image_present(client):
        raise SandboxEngineError(f"the import finished but the engine has no image {SANDBOX_IMAGE!r}")
    progress(f"image {SANDBOX_IMAGE} built")
    return "built"


def _build_rootfs(tarball: Path, progress: Progress) -> None:
    sources = apt_sources_file()
    argv = [
        "mmdebstrap",
        "--variant=minbase",
        f"--include={','.join(SANDBOX_PACKAGES)}",
        *(f"--dpkgopt={opt}" for opt in TRIM_DPKG),
        f"--customize-hook={TRIM_HOOK}",
        "--format=tar",
        SANDBOX_SUITE,
        str(tarball),
        str(sources),
    ]
    log = tarball.with_suffix(".log")
    packages = ", ".join(SANDBOX_PACKAGES)
    progress(f"building the {SANDBOX_SUITE} root filesystem with mmdebstrap ({packages}); ~20-90 s")
    began = time.monotonic()
    with open(log, "wb") as out:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if done.returncode != 0:
        raise SandboxEngineError(
            f"mmdebstrap exited with code {done.returncode}; the end of its log:\n{log_tail(log)}"
        )
    progress(f"root filesystem built in {time.monotonic() - began:.0f} s")
