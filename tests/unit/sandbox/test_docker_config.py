"""`DockerConfig` refuses values the Docker sandbox cannot honour, naming the field and the value
(sizes go into tmpfs option strings, so only plain sizes pass); no engine needed."""

from __future__ import annotations

import sys

import pytest

from producers.sandbox.docker import DockerConfig, DockerSandbox
from producers.sandbox.errors import SandboxError
from producers.sandbox.image import SANDBOX_IMAGE


def test_the_defaults_are_the_project_image_and_a_non_root_user():
    config = DockerConfig()
    assert config.image == SANDBOX_IMAGE and config.docker_host is None
    assert (config.uid, config.gid) == (65534, 65534)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tmp_size", "64m,uid=0"),  # would smuggle a mount option into the tmpfs
        ("workspace_size", "0"),
        ("memory", "lots"),
        ("shm_size", 64),
        ("pids_limit", 0),
        ("pids_limit", 12.5),
        ("cpus", -1),
        ("timeout_s", True),
        ("output_bytes", "1000"),
        ("user", "0:0"),
        ("user", "65534:0"),
        ("user", "nobody"),
        ("image", ""),
        ("docker_host", ""),
    ],
)
def test_a_bad_field_is_refused_by_name(field, value):
    with pytest.raises(SandboxError, match=f"DockerConfig.{field} must be .*{value!r}"):
        DockerConfig(**{field: value})


def test_without_the_docker_package_construction_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "docker", None)  # `import docker` now raises ImportError
    with pytest.raises(SandboxError, match=r"needs the `docker` Python package: pip install"):
        DockerSandbox(DockerConfig(docker_host="unix:///nonexistent/docker.sock"))
