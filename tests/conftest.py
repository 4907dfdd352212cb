"""Shared fixtures: a real broker over TCP, a ClickHouse URL, a scratch data directory.

`pytest` runs against the embedded stack (our broker process + chDB). `pytest --engine docker` runs the
same integration tests against Apache Kafka and ClickHouse server containers started through the
Docker SDK; without a reachable engine those runs skip with the reason. Tests that kill or restart the
broker itself only make sense for the embedded broker and skip under docker, saying so.
"""

from __future__ import annotations

import pytest

from tests.support.broker import BrokerHandle, start_broker

# The private Docker engine: the lazy `sandbox_engine` fixture, the `engine` marker, skips as failures in CI;
# a real vLLM: the module-scoped `vllm_server` fixture (marked `engine` the same way).
pytest_plugins = ["tests.support.sandbox_engine", "tests.support.vllm_server"]


def pytest_addoption(parser):
    parser.addoption(
        "--engine",
        choices=["embedded", "docker"],
        default="embedded",
        help="run integration tests against the embedded broker + chDB (default) or Docker containers",
    )


@pytest.fixture(scope="session")
def engine(request) -> str:
    return request.config.getoption("--engine")


@pytest.fixture(scope="session")
def docker_stack(engine):
    if engine != "docker":
        yield None
        return
    from infra.docker_engine import engine_unavailable_reason, start_docker_stack

    reason = engine_unavailable_reason()
    if reason:
        pytest.skip(f"--engine docker: {reason}")
    stack = start_docker_stack(name="agentstream-tests")
    yield stack
    stack.stop()


class ExternalBroker:
    """A Kafka we did not start (docker): same `.bootstrap`, no restart."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap

    def restart(self, kill9: bool = False):
        pytest.skip(
            "restarting the broker is a test of the embedded broker; not applicable under --engine docker"
        )

    def stop(self) -> None:
        pass


def _reset_external(bootstrap: str) -> None:
    """Fresh registry topics for each test on a shared external Kafka."""
    from kafka import KafkaAdminClient

    from clients.kafka import ensure_topics
    from schemas.topics import TOPICS

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        existing = [t for t in admin.list_topics() if t in TOPICS]
        if existing:
            admin.delete_topics(existing)
    finally:
        admin.close()
    ensure_topics(bootstrap)


@pytest.fixture
def data_dir(tmp_path):
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def broker(tmp_path, docker_stack):
    """A fresh embedded broker process for this test (stopped by PID afterwards)."""
    if docker_stack is not None:
        _reset_external(docker_stack.bootstrap_servers)
        yield ExternalBroker(docker_stack.bootstrap_servers)
        return
    handle = start_broker(tmp_path / "broker")
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def shared_broker(tmp_path_factory, docker_stack) -> BrokerHandle:
    """One broker for tests that only need *a* broker and use their own topic names."""
    if docker_stack is not None:
        yield ExternalBroker(docker_stack.bootstrap_servers)
        return
    handle = start_broker(tmp_path_factory.mktemp("shared-broker"))
    yield handle
    handle.stop()


@pytest.fixture
def clickhouse_url(tmp_path, docker_stack) -> str:
    """An embedded ClickHouse (chDB) location for this test, or the docker ClickHouse server."""
    if docker_stack is not None:
        import clickhouse_connect

        client = clickhouse_connect.get_client(dsn=docker_stack.clickhouse_url)
        client.command("DROP DATABASE IF EXISTS agentstream SYNC")
        client.close()
        return docker_stack.clickhouse_url
    return f"chdb://{tmp_path / 'clickhouse'}"
