"""The at-scale path on one machine: Kafka + ClickHouse containers through the Docker SDK.

Skips, with the reason, when no Docker engine is reachable, and when the engine lacks the Kafka and
ClickHouse images: our machines reach no image registry, so they cannot be pulled (the private engine
of the sandbox tests holds only the sandbox image). Not an `engine` test: Kafka and ClickHouse servers
cannot be had here.
"""

from __future__ import annotations

import pytest

from infra.docker_engine import (
    CLICKHOUSE_IMAGE,
    KAFKA_IMAGE,
    DockerUnavailable,
    docker_client,
    engine_unavailable_reason,
)


def test_missing_engine_is_reported_clearly():
    reason = engine_unavailable_reason()
    if reason is None:
        pytest.skip("a Docker engine is reachable here; the no-engine message is not observable")
    with pytest.raises(DockerUnavailable) as info:
        docker_client()
    assert "Docker" in str(info.value) or "docker" in str(info.value)


@pytest.mark.docker
def test_containers_serve_kafka_and_clickhouse():
    reason = engine_unavailable_reason()
    if reason:
        pytest.skip(f"needs a Docker engine: {reason}")
    missing = _missing_images(KAFKA_IMAGE, CLICKHOUSE_IMAGE)
    if missing:
        pytest.skip(
            f"the engine lacks {', '.join(missing)} and no image registry is reachable here to pull them"
        )
    import clickhouse_connect
    from kafka import KafkaConsumer, KafkaProducer

    from infra.docker_engine import start_docker_stack

    stack = start_docker_stack(name="agentstream-smoke")
    try:
        producer = KafkaProducer(bootstrap_servers=stack.bootstrap_servers)
        producer.send("smoke", b"hello").get(timeout=30)
        producer.close()
        consumer = KafkaConsumer(
            "smoke",
            bootstrap_servers=stack.bootstrap_servers,
            auto_offset_reset="earliest",
            consumer_timeout_ms=10000,
        )
        assert [m.value for m in consumer] == [b"hello"]
        consumer.close()
        client = clickhouse_connect.get_client(dsn=stack.clickhouse_url)
        assert client.query("SELECT 1").result_rows == [(1,)]
    finally:
        stack.stop()


def _missing_images(*images: str) -> list[str]:
    import docker

    client = docker_client()
    try:
        missing = []
        for image in images:
            try:
                client.images.get(image)
            except docker.errors.ImageNotFound:
                missing.append(image)
        return missing
    finally:
        client.close()
