"""An input too large to carry whole in a dead letter (issue #34): the sink's dead letter of it is a
bounded summary (a prefix, the whole input's size and SHA-256) that fits in one broker message,
and it lands in `dead_letters` with those columns (migration 0012)."""

from __future__ import annotations

import hashlib

import pytest

from schemas.limits import MAX_DEAD_LETTER_PAYLOAD_BYTES
from schemas.topics import AGENT_EVENTS, DLQ
from tests.support.processes import wait_for
from tests.support.sink_harness import publish, reader, rows, scalar, start_sink

pytestmark = pytest.mark.integration


def test_an_oversized_poison_record_is_dead_lettered_as_a_bounded_summary(broker, clickhouse_url, tmp_path):
    big = b'{"type": "step.recorded", "trajectory_id": "t-big", "thought": "' + b"x" * 900_000
    sink = start_sink(broker.bootstrap, clickhouse_url, tmp_path / "sink")
    try:
        publish(broker.bootstrap, [], raw=[(AGENT_EVENTS, b"t-big", big)])
        client = reader(clickhouse_url)
        wait_for(
            lambda: scalar(client, "SELECT count() FROM agentstream.dead_letters FINAL") == 1,
            timeout_s=30,
            what="the dead letter of the oversized record",
        )
        [(payload_len, size, sha, truncated, source_topic)] = rows(
            client,
            "SELECT length(payload), payload_bytes, payload_sha256, payload_truncated, source_topic "
            "FROM agentstream.dead_letters FINAL",
        )
        assert (size, sha, truncated, source_topic) == (
            len(big),
            hashlib.sha256(big).hexdigest(),
            1,
            AGENT_EVENTS,
        )
        assert payload_len <= MAX_DEAD_LETTER_PAYLOAD_BYTES
        # the sink published it to the DLQ topic (one broker message) and read it back from there
        wait_for(
            lambda: (
                scalar(client, f"SELECT count() FROM agentstream.events FINAL WHERE topic = '{DLQ}'") == 1
            ),
            timeout_s=30,
            what="the dead letter read back from the DLQ topic",
        )
        assert sink.proc.alive()
        client.close()
    finally:
        sink.proc.stop()
