"""One answer to "poison or outage" and one dead letter, for the stream roles and the consume loop
alike (clients/kafka/poison.py, clients/kafka/dead_letters.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from clients.kafka.consume import refusal
from clients.kafka.poison import is_poison
from schemas import topics
from schemas.records import Record
from streams.batch import BatchResult, decode_record, is_retryable, poison_letter
from streams.errors import BatchFailed

SOURCE_MS = 1_700_000_000_123  # the source record's broker timestamp


def _failures():
    from aiokafka.errors import KafkaConnectionError
    from kafka.errors import BrokerNotAvailableError, KafkaTimeoutError

    from streams.judge.ledger import JudgeLedgerError

    poison = [
        FileNotFoundError("batch.parquet"),  # the file a record points to is not there
        PermissionError("batch.parquet"),
        MemoryError(),  # one allocation sized by the input
        RecursionError("deep"),
        KeyError("step_index"),
        ValueError("bad value"),
    ]
    outage = [
        OSError("disk full"),
        ConnectionError("refused"),
        TimeoutError(),
        KafkaTimeoutError(),
        BrokerNotAvailableError(),
        KafkaConnectionError(),
        JudgeLedgerError("ledger topic did not answer"),  # `retryable = True`
    ]
    return [
        pytest.param(e, p, id=f"{type(e).__name__}-{'poison' if p else 'outage'}")
        for e, p in [(e, True) for e in poison] + [(e, False) for e in outage]
    ]


@pytest.mark.parametrize(("exc", "poison"), _failures())
def test_the_stream_shell_and_the_consume_loop_sort_every_failure_the_same_way(exc, poison):
    assert is_poison(exc) is poison
    assert is_retryable(exc) is not poison  # the stream roles' batch shell
    assert (refusal(exc, "cannot handle") is not None) is poison  # the consume loop


def test_the_shells_own_batch_failure_is_an_outage_for_the_stream_roles():
    assert is_retryable(BatchFailed("an output was not acknowledged"))


def _record(value: bytes, timestamp_ms: int | None = SOURCE_MS) -> Record:
    return Record(topics.AGENT_EVENTS, 2, 41, b"t-1", value, timestamp_ms)


def test_a_stream_roles_dead_letter_carries_the_coordinates_and_the_source_time():
    """A replay re-creates the identical letter (same id, same time), as the consumers' letters do."""
    result = BatchResult()
    assert decode_record("rules", _record(b"{not json"), result) is None
    letter = poison_letter("rules", _record(b"x"), ValueError("v" * 5_000))
    for dead in (result.dead[0], letter):
        assert (dead.source_topic, dead.source_partition, dead.source_offset) == (topics.AGENT_EVENTS, 2, 41)
        assert dead.occurred_at == datetime.fromtimestamp(SOURCE_MS / 1000, UTC)
    assert len(letter.reason) <= 2_003 and letter.error_type == "ValueError"
    replayed = poison_letter("rules", _record(b"x"), ValueError("v" * 5_000))
    assert replayed.model_dump() == letter.model_dump()
