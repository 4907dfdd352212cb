"""Small helpers around kafka-python shared by every component: topic creation from the registry.

Works against the embedded broker and Apache Kafka alike (only the bootstrap address differs).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from schemas.topics import TOPICS, TopicSpec

log = logging.getLogger(__name__)


def ensure_topics(
    bootstrap_servers: str, specs: Iterable[TopicSpec] | None = None, *, timeout_s: float = 30.0
):
    """Create every registry topic that does not exist yet (idempotent); returns the names created."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    specs = list(TOPICS.values() if specs is None else specs)
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap_servers,
        client_id="agentstream-admin",
        request_timeout_ms=int(timeout_s * 1000),
    )
    try:
        existing = set(admin.list_topics())
        missing = [s for s in specs if s.name not in existing]
        created = []
        for spec in missing:
            topic = NewTopic(spec.name, spec.partitions, 1, topic_configs=dict(spec.config))
            try:
                admin.create_topics([topic])
                created.append(spec.name)
            except TopicAlreadyExistsError:
                pass  # another process won the race; that is fine
        if created:
            log.info("created topics: %s", ", ".join(created))
        return created
    finally:
        admin.close()
