"""The executor's row source (pure, no broker): `batch.rows` chunks assembled and checked against
`batch.built`, refused with their coordinates when missing or tampered with, the commit held at a
batch still being assembled, memory bounded in bytes as received, and a batch set aside past the
bound read again from the log (a fake log here), not lost."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from clients.kafka.consume import Refused, refusal
from clients.kafka.poison import is_poison
from clients.kafka.ranges import ReadIncomplete
from consumers.batching.row_chunks import chunk_events
from consumers.errors import ConsumerConfigError
from consumers.training.batch_rows import BatchRowsAssembler, ChunksUnavailable
from consumers.training.config import TrainRunConfig
from consumers.training.follow import BatchTrainer
from schemas.codec import decode, encode
from schemas.events import BatchBuilt, utc_now
from schemas.records import Record
from schemas.topics import TRAINING_BATCHES

ROWS = [{"trajectory_id": f"t{i}", "prompt": "p" * 400, "reward": i / 3} for i in range(40)]


def _batch(batch_id="grpo-1", rows=ROWS, chunk_bytes=2000):
    chunks = chunk_events(batch_id, "grpo", rows, utc_now(), "trainer", chunk_bytes=chunk_bytes)
    built = BatchBuilt(
        event_id=f"built-{batch_id}", trajectory_id=batch_id, occurred_at=utc_now(), producer="trainer",
        batch_id=batch_id, kind="grpo", path="/elsewhere/none.jsonl", row_count=len(rows),
        chunks=len(chunks), rows_sha256=chunks[0].rows_sha256,
    )  # fmt: skip
    return chunks, built


def _record(event, offset: int) -> Record:
    return Record(TRAINING_BATCHES, 0, offset, event.trajectory_id.encode(), encode(event))


class FakeExecutor:
    def __init__(self):
        self.state = type("State", (), {"batches": set()})()
        self.trained: list[tuple[str, list]] = []

    def train_batch(self, rows, method, batch_id, source_ranges=None):
        self.trained.append((batch_id, rows))
        self.state.batches.add(batch_id)
        return None  # no version: nothing to publish


def test_chunks_in_any_order_with_duplicates_assemble_to_the_batch_and_release_the_hold():
    chunks, built = _batch()
    assert len(chunks) > 5
    arrivals = [*chunks, chunks[2], chunks[0]]
    random.Random(1).shuffle(arrivals)
    assembler = BatchRowsAssembler()
    for offset, chunk in enumerate(arrivals, start=10):
        assembler.add(chunk, _record(chunk, offset))
    assert assembler.holds() == {(TRAINING_BATCHES, 0): 10} and assembler.duplicates == 2
    assert assembler.take(built, _record(built, 99)) == ROWS
    assert assembler.holds() == {} and assembler.held == 0


def test_a_missing_chunk_is_refused_naming_the_chunks_and_their_offsets():
    chunks, built = _batch()
    assembler = BatchRowsAssembler()
    for offset, chunk in enumerate(chunks):
        if chunk.index != 3:
            assembler.add(chunk, _record(chunk, offset))
    with pytest.raises(Refused) as refused:
        assembler.take(built, _record(built, 50))
    assert refused.value.error_type == "MissingChunks"
    assert "missing [3]" in refused.value.reason and "2@2, 4@4" in refused.value.reason
    assert f"{TRAINING_BATCHES}[0]@50" in refused.value.reason
    assert assembler.holds() == {}, "a refused batch holds nothing back"


def test_no_chunk_at_all_is_refused():
    _, built = _batch()
    with pytest.raises(Refused, match=r"none of its \d+ batch\.rows chunks"):
        BatchRowsAssembler().take(built, _record(built, 0))


def test_tampered_rows_fail_the_checksum_and_a_wrong_count_is_named():
    chunks, built = _batch()
    tampered = chunks[1].model_copy(
        update={"rows": [{**chunks[1].rows[0], "reward": 99.0}, *chunks[1].rows[1:]]}
    )
    assembler = BatchRowsAssembler()
    for offset, chunk in enumerate([chunks[0], tampered, *chunks[2:]]):
        assembler.add(chunk, _record(chunk, offset))
    with pytest.raises(Refused) as refused:
        assembler.take(built, _record(built, 50))
    assert refused.value.error_type == "ChecksumMismatch" and built.rows_sha256 in refused.value.reason
    assembler = BatchRowsAssembler()
    for offset, chunk in enumerate(chunks):
        assembler.add(chunk, _record(chunk, offset))
    with pytest.raises(Refused, match="row_count 41, the chunks hold 40"):
        assembler.take(built.model_copy(update={"row_count": 41}), _record(built, 50))


def test_an_index_past_the_chunk_count_is_refused():
    chunks, _ = _batch()
    bad = chunks[0].model_copy(update={"index": chunks[0].chunks})
    with pytest.raises(Refused, match="is not below chunks"):
        BatchRowsAssembler().add(bad, _record(bad, 0))


def test_a_batch_cut_short_keeps_its_hold_while_a_later_batch_trains_and_its_republish_completes():
    a_chunks, a_built = _batch("grpo-a")
    b_chunks, b_built = _batch("grpo-b", ROWS[:5])
    assembler = BatchRowsAssembler()
    assembler.add(a_chunks[0], _record(a_chunks[0], 0))  # the trainer died after one chunk of A
    for offset, chunk in enumerate(b_chunks, start=1):
        assembler.add(chunk, _record(chunk, offset))
    assert assembler.take(b_built, _record(b_built, 20)) == ROWS[:5]
    assert assembler.holds() == {(TRAINING_BATCHES, 0): 0}, "A's first chunk is still held"
    for offset, chunk in enumerate(a_chunks, start=21):  # the restarted trainer re-publishes A whole
        assembler.add(chunk, _record(chunk, offset))
    assert assembler.take(a_built, _record(a_built, 40)) == ROWS
    assert assembler.holds() == {} and assembler.held == 0


def test_memory_is_bounded_in_batches_and_in_bytes_as_received():
    assembler = BatchRowsAssembler(max_open=2)
    for n in range(3):
        chunks, _ = _batch(f"grpo-{n}")
        assembler.add(chunks[0], _record(chunks[0], n))
    assert [a.batch_id for a in assembler.open.values()] == ["grpo-1", "grpo-2"] and assembler.set_aside == 1
    assert assembler.held == sum(len(encode(_batch(f"grpo-{n}")[0][0])) for n in (1, 2))
    assert assembler.holds() == {(TRAINING_BATCHES, 0): 0}, "the batch set aside keeps its hold"
    chunks, _ = _batch("grpo-big")
    small = BatchRowsAssembler(max_bytes=len(encode(chunks[0])) + 10)
    small.add(chunks[0], _record(chunks[0], 0))
    with pytest.raises(Refused) as refused:
        small.add(chunks[1], _record(chunks[1], 1))
    assert refused.value.error_type == "BatchTooLarge" and "grpo-big" in refused.value.reason
    assert "--max-assembly-mb" in refused.value.reason


def test_chunks_are_held_as_received_not_decoded_until_their_batch_is_complete():
    rows = [{"trajectory_id": f"t{i}", "prompt": "p q " * 50, "values": [i / 7] * 40} for i in range(400)]
    chunks, built = _batch("grpo-mem", rows, chunk_bytes=64 * 1024)
    records = [_record(chunk, offset) for offset, chunk in enumerate(chunks)]
    raw = sum(len(r.value) for r in records)
    trainer = BatchTrainer(FakeExecutor(), producer=None, kinds=("grpo",))
    tracemalloc.start()
    try:
        for record in records:
            trainer.handle(record, 0.0)
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert trainer.assembler.held == raw
    # the values are the records' own bytes: what stays is bookkeeping (decoded rows: about 4x raw)
    assert kept < raw / 10, (kept, raw)
    trainer.handle(_record(built, len(chunks)), 0.0)
    assert trainer.executor.trained == [("grpo-mem", rows)]


class FakeLog:
    """`Reread` over a list of records (one partition), counting its reads."""

    def __init__(self, records: list[Record], fail: bool = False):
        self.records, self.fail, self.reads = records, fail, []

    def __call__(self, topic, partition, start, stop):
        self.reads.append((topic, partition, start, stop))
        if self.fail:
            raise ReadIncomplete("read 0 records of ['training.batches'] but not to their end in 60s")
        return [
            r
            for r in self.records
            if r.topic == topic and r.partition == partition and start <= r.offset < stop
        ]


def _flooded(fakes: int = 40, interleaved: bool = True):
    """A legitimate batch, `fakes` batch ids that never complete (interleaved with its chunks, or all
    after them), then its batch.built: the records before it, its record and the event."""
    chunks, built = _batch()
    per_chunk = [fakes * (n + 1) // len(chunks) - fakes * n // len(chunks) for n in range(len(chunks))]
    if not interleaved:
        per_chunk = [0] * (len(chunks) - 1) + [fakes]
    records, fake = [], 0
    for chunk, count in zip(chunks, per_chunk, strict=True):
        records.append(_record(chunk, len(records)))
        for _ in range(count):
            event = _batch(f"fake-{fake}", ROWS[:3])[0][0]
            records.append(_record(event, len(records)))
            fake += 1
    return records, _record(built, len(records)), built


def _feed(trainer_or_assembler, records):
    for record in records:
        if isinstance(trainer_or_assembler, BatchTrainer):
            trainer_or_assembler.handle(record, 0.0)
        else:
            trainer_or_assembler.add(decode(record.value), record)


def test_a_flood_of_fake_batch_ids_costs_a_reread_not_the_batch():
    records, built_record, _ = _flooded()
    log = FakeLog([*records, built_record])
    executor = FakeExecutor()
    assembler = BatchRowsAssembler(max_open=4, reread=log)
    trainer = BatchTrainer(executor, producer=None, kinds=("grpo",), assembler=assembler)
    _feed(trainer, records)
    assert assembler.set_aside > 30 and assembler.holds() == {(TRAINING_BATCHES, 0): 0}
    trainer.handle(built_record, 0.0)
    assert executor.trained == [("grpo-1", ROWS)], "trained from the chunks read again"
    assert log.reads == [(TRAINING_BATCHES, 0, 0, built_record.offset)]
    assert assembler.holds() == {(TRAINING_BATCHES, 0): 1}, "released up to the first fake batch"
    assert assembler.held == sum(a.size for a in assembler.open.values())


def test_a_flood_of_large_chunks_sets_aside_by_bytes_and_the_reread_stays_in_the_bound():
    records, built_record, built = _flooded(fakes=12)
    legitimate = sum(len(r.value) for r in records if r.key == built.batch_id.encode())
    assembler = BatchRowsAssembler(max_bytes=legitimate + 100, reread=FakeLog([*records, built_record]))
    _feed(assembler, records)
    assert len(assembler.open) < 16 and assembler.set_aside > 0, "set aside by bytes, not by count"
    assert assembler.take(built, built_record) == ROWS
    assert assembler.held <= assembler.max_bytes


def test_a_set_aside_batch_without_a_readable_log_is_retryable_and_keeps_its_hold():
    records, built_record, built = _flooded()
    for reread in (None, FakeLog(records, fail=True)):
        assembler = BatchRowsAssembler(max_open=4, reread=reread)
        _feed(assembler, records)
        with pytest.raises(ChunksUnavailable) as unavailable:
            assembler.take(built, built_record)
        assert not is_poison(unavailable.value) and refusal(unavailable.value, "x") is None, (
            "not dead-lettered"
        )
        assert f"{TRAINING_BATCHES}[0]@0" in str(unavailable.value)
        assert assembler.holds()[(TRAINING_BATCHES, 0)] == 0, "the restart reads from the first chunk"


def test_past_the_set_aside_bound_the_oldest_is_forgotten_and_its_batch_refused_with_the_reason():
    records, built_record, built = _flooded(fakes=10, interleaved=False)
    assembler = BatchRowsAssembler(max_open=2, max_set_aside=4, reread=FakeLog([*records, built_record]))
    _feed(assembler, records)
    assert assembler.forgotten > 0 and len(assembler.aside) == 4
    assert assembler.holds()[(TRAINING_BATCHES, 0)] > 0, "the forgotten batch's hold is released"
    with pytest.raises(Refused) as refused:
        assembler.take(built, built_record)
    assert refused.value.error_type == "MissingChunks" and "set aside and forgotten" in refused.value.reason


def test_a_forged_batch_built_does_not_close_the_legitimate_batch():
    chunks, built = _batch()
    assembler = BatchRowsAssembler()
    for offset, chunk in enumerate(chunks):
        assembler.add(chunk, _record(chunk, offset))
    forged = built.model_copy(update={"event_id": "forged", "rows_sha256": "0" * 64})
    with pytest.raises(Refused, match="none of its"):
        assembler.take(forged, _record(forged, 30))
    assert assembler.take(built, _record(built, 31)) == ROWS


def test_max_assembly_mb_is_an_option_of_the_run():
    assert TrainRunConfig(follow=True).max_assembly_mb == 256
    with pytest.raises(ConsumerConfigError, match=r"--max-assembly-mb: must be >= 1, got 0"):
        TrainRunConfig(follow=True, max_assembly_mb=0)


def test_the_follower_trains_on_assembled_rows_and_holds_its_commit_while_assembling():
    chunks, built = _batch()
    executor = FakeExecutor()
    trainer = BatchTrainer(executor, producer=None, kinds=("grpo",))
    for offset, chunk in enumerate(chunks, start=7):
        trainer.handle(_record(chunk, offset), 0.0)
    consumed = {(TRAINING_BATCHES, 0): 7 + len(chunks)}
    assert trainer.commit_positions(consumed) == {(TRAINING_BATCHES, 0): 7}, "held at the first chunk"
    trainer.handle(_record(built, 7 + len(chunks)), 0.0)
    assert executor.trained == [("grpo-1", ROWS)]
    consumed = {(TRAINING_BATCHES, 0): 8 + len(chunks)}
    assert trainer.commit_positions(consumed) == consumed
    # a replay: the batch is trained already, so its chunks are not even kept
    for offset, chunk in enumerate(chunks):
        trainer.handle(_record(chunk, offset), 0.0)
    trainer.handle(_record(built, len(chunks)), 0.0)
    assert trainer.assembler.open == {} and len(executor.trained) == 1


def test_chunks_of_a_kind_not_followed_are_not_kept():
    chunks, _ = _batch()
    trainer = BatchTrainer(FakeExecutor(), producer=None, kinds=("sft",))
    trainer.handle(_record(chunks[0], 0), 0.0)
    assert trainer.assembler.open == {} and trainer.commit_positions({(TRAINING_BATCHES, 0): 1}) == {
        (TRAINING_BATCHES, 0): 1
    }
