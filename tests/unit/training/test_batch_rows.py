"""The executor's row source (pure, no broker): `batch.rows` chunks assembled and checked against
`batch.built`, refused with their coordinates when missing or tampered with, the commit held at a
batch still being assembled, and memory bounded."""

from __future__ import annotations

import random

import pytest

from clients.kafka.consume import Refused
from consumers.batching.row_chunks import chunk_events
from consumers.training.batch_rows import BatchRowsAssembler
from consumers.training.follow import BatchTrainer
from schemas.codec import encode
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


def test_a_batch_cut_short_is_abandoned_when_a_later_batch_built_overtakes_it_and_its_republish_completes():
    a_chunks, a_built = _batch("grpo-a")
    b_chunks, b_built = _batch("grpo-b", ROWS[:5])
    assembler = BatchRowsAssembler()
    assembler.add(a_chunks[0], _record(a_chunks[0], 0))  # the trainer died after one chunk of A
    for offset, chunk in enumerate(b_chunks, start=1):
        assembler.add(chunk, _record(chunk, offset))
    assert assembler.holds() == {(TRAINING_BATCHES, 0): 0}
    assert assembler.take(b_built, _record(b_built, 20)) == ROWS[:5]
    assert assembler.holds() == {} and assembler.abandoned == 1
    for offset, chunk in enumerate(a_chunks, start=21):  # the restarted trainer re-publishes A whole
        assembler.add(chunk, _record(chunk, offset))
    assert assembler.holds() == {(TRAINING_BATCHES, 0): 21}
    assert assembler.take(a_built, _record(a_built, 40)) == ROWS


def test_memory_is_bounded_in_batches_and_bytes():
    assembler = BatchRowsAssembler(max_open=2)
    for n in range(3):
        chunks, _ = _batch(f"grpo-{n}")
        assembler.add(chunks[0], _record(chunks[0], n))
    assert [a.batch_id for a in assembler.open.values()] == ["grpo-1", "grpo-2"] and assembler.abandoned == 1
    chunks, _ = _batch("grpo-big")
    small = BatchRowsAssembler(max_bytes=len(encode(chunks[0])) + 10)
    small.add(chunks[0], _record(chunks[0], 0))
    with pytest.raises(Refused) as refused:
        small.add(chunks[1], _record(chunks[1], 1))
    assert refused.value.error_type == "BatchTooLarge" and "grpo-big" in refused.value.reason


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
