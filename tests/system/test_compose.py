"""docker-compose.yml for the at-scale path: structure checked always; the engine part skips without one."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from infra.cli.main import build_parser
from tests.support.processes import REPO

COMPOSE = REPO / "docker-compose.yml"
AGENTSTREAM_SERVICES = {"worker", "judge", "sink", "batch", "gateway", "migrate", "topics"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_services_images_and_kraft(compose):
    services = compose["services"]
    assert AGENTSTREAM_SERVICES | {"kafka", "clickhouse"} <= set(services)
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    assert "controller" in kafka["environment"]["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert services["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    assert services["worker"]["deploy"]["replicas"] >= 2
    for name in ("kafka", "clickhouse", "gateway"):
        assert "healthcheck" in services[name], name
    assert {"kafka-data", "clickhouse-data", "agentstream-data"} <= set(compose["volumes"])


def test_published_ports_bind_loopback_only(compose):
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond 127.0.0.1"


def test_agentstream_services_are_configured_by_environment(compose):
    for name in AGENTSTREAM_SERVICES - {"topics"}:
        env = compose["services"][name]["environment"]
        assert env["AGENTSTREAM_BOOTSTRAP_SERVERS"] == "kafka:9092", name
        assert env["AGENTSTREAM_CLICKHOUSE_URL"] == "http://clickhouse:8123", name
    assert compose["services"]["judge"]["environment"]["ANTHROPIC_API_KEY"].startswith("${")


def test_every_service_command_is_a_real_cli_command(compose):
    parser = build_parser()
    for name in AGENTSTREAM_SERVICES:
        command = compose["services"][name]["command"]
        assert command[0] == "agentstream", name
        parser.parse_args(command[1:])  # exits (SystemExit) on an unknown command or option


def _compose_cli() -> tuple[list[str] | None, list[str]]:
    """A compose client that answers `version`, and why each candidate was not one."""
    why_not = []
    for candidate in (["docker", "compose"], ["docker-compose"]):
        path = shutil.which(candidate[0])
        if path is None:
            why_not.append(f"no {candidate[0]} on PATH")
            continue
        probe = subprocess.run([*candidate, "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return candidate, why_not
        said = (probe.stderr or probe.stdout).strip().splitlines()
        why_not.append(
            f"`{' '.join(candidate)} version` ({path}) failed: {said[0] if said else probe.returncode}"
        )
    return None, why_not


def test_docker_compose_config_accepts_the_file():
    # A `docker` CLI without its compose plugin (as Debian's docker.io ships it) cannot check the file.
    cli, why_not = _compose_cli()
    if cli is None:
        pytest.skip("no Docker compose client on this machine: " + "; ".join(why_not))
    result = subprocess.run(
        [*cli, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
