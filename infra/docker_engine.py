"""Apache Kafka and ClickHouse server containers through the Docker SDK for Python: the at-scale path
on one machine (`agentstream up --engine docker`, `pytest --engine docker`).

Owns container lifecycle only. Containers publish their ports on 127.0.0.1; callers get the
bootstrap address and the ClickHouse URL and use the same clients as the embedded mode.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from infra.errors import InfraError
from infra.stack import free_port

KAFKA_IMAGE = "apache/kafka:4.1.0"
CLICKHOUSE_IMAGE = "clickhouse/clickhouse-server:24.8"
LABEL = "dev.agentstream.stack"


class DockerUnavailable(InfraError):
    """No Docker engine is reachable (the message says why)."""


def docker_client():
    """A connected Docker client, or DockerUnavailable naming the reason."""
    try:
        import docker
    except ImportError as exc:
        raise DockerUnavailable("the 'docker' package is not installed (pip install docker)") from exc
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        raise DockerUnavailable(f"no Docker engine reachable: {exc}") from exc
    return client


def engine_unavailable_reason() -> str | None:
    """None when an engine is reachable, else why not (for pytest skips)."""
    try:
        docker_client().close()
    except DockerUnavailable as exc:
        return str(exc)
    return None


@dataclass
class DockerStack:
    bootstrap_servers: str
    clickhouse_url: str
    containers: list

    def stop(self) -> None:
        for container in self.containers:
            try:
                container.remove(force=True)
            except Exception:  # already gone is fine
                pass


def start_docker_stack(name: str = "agentstream", timeout_s: float = 180.0) -> DockerStack:
    """Start Kafka (KRaft, single node) and ClickHouse on free loopback ports; wait until both answer."""
    client = docker_client()
    kafka_port, ch_port = free_port(), free_port()
    kafka = _run_published(client, name, "kafka", KAFKA_IMAGE, "9094/tcp", kafka_port, _kafka_env(kafka_port))
    clickhouse = _run_published(
        client,
        name,
        "clickhouse",
        CLICKHOUSE_IMAGE,
        "8123/tcp",
        ch_port,
        {"CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT": "1", "CLICKHOUSE_PASSWORD": ""},
    )
    stack = DockerStack(f"127.0.0.1:{kafka_port}", f"http://127.0.0.1:{ch_port}", [kafka, clickhouse])
    try:
        _wait_kafka(stack.bootstrap_servers, timeout_s)
        _wait_http(f"{stack.clickhouse_url}/ping", timeout_s)
    except Exception:
        stack.stop()
        raise
    return stack


def _run_published(client, stack: str, role: str, image: str, port: str, host_port: int, environment: dict):
    """Start `image` detached, labelled as `stack`'s, its `port` published on 127.0.0.1:`host_port`."""
    return client.containers.run(
        image,
        name=f"{stack}-{role}-{host_port}",
        detach=True,
        labels={LABEL: stack},
        ports={port: ("127.0.0.1", host_port)},
        environment=environment,
    )


def _kafka_env(host_port: int) -> dict[str, str]:
    return {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "INTERNAL://:9092,HOST://:9094,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"INTERNAL://localhost:9092,HOST://127.0.0.1:{host_port}",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "INTERNAL:PLAINTEXT,HOST:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "INTERNAL",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }


def _wait_kafka(bootstrap: str, timeout_s: float) -> None:
    from clients.kafka import make_admin

    _wait_until(
        f"Kafka at {bootstrap}",
        timeout_s,
        lambda: make_admin(bootstrap, "agentstream-docker", request_timeout_ms=3000).close(),
    )


def _wait_http(url: str, timeout_s: float) -> None:
    import urllib.request

    _wait_until(f"ClickHouse at {url}", timeout_s, lambda: urllib.request.urlopen(url, timeout=3).close())


def _wait_until(what: str, timeout_s: float, probe) -> None:
    """Call `probe` once a second until it returns without raising; InfraError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            probe()
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise InfraError(f"{what} not ready after {timeout_s:.0f}s: {exc}") from exc
            time.sleep(1)
