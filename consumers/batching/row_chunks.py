"""A batch's rows as `batch.rows` events (since 1.5): the canonical checksum, the chunking, the events.

Pure: no I/O. The trainer consumer publishes `chunk_events(...)` before the batch's `batch.built`;
the executor (`consumers.training.batch_rows`) assembles them and checks `rows_sha256`.

- Canonical form: each row as compact JSON (orjson) plus a newline, concatenated; its sha256 is the
  batch's `rows_sha256`, which equals the file's `sha256` for a jsonl batch (the same bytes).
- Chunks: rows in batch order, cut so that a chunk's rows take at most `CHUNK_BYTES` in canonical
  form; a row larger than that travels alone. A row that cannot fit in one event at all (over
  `MAX_ROW_BYTES`, the event limit less room for the envelope) is a `TrainerError` naming the batch,
  the row and both sizes: a batch is never published without one of its rows. The batch builder
  finds such rows first (`oversize_rows`, `row_trajectory_ids`) and leaves their trajectories (a
  group's, for a grouped kind) out of the batch, dead-lettered (`consumers.batching.consumer`), so
  the error is a last guard, not a loop on the same input.
- Event ids depend only on the batch id, `rows_sha256` and the chunk's index, so a re-publish after
  a crash is a duplicate the executor drops.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import orjson

from consumers.errors import TrainerError
from schemas.codec import encode
from schemas.events import BatchRows
from schemas.ids import derived_event_id
from schemas.limits import MAX_EVENT_BYTES

# A chunk's rows, in canonical bytes: a quarter of Kafka's default message limit, so a chunk is one
# record batch of the producer's 256 KiB and a consumer's fetch holds several.
CHUNK_BYTES = 256 * 1024
# Room for the envelope and the chunk's own fields (ids are at most 256 characters each).
ENVELOPE_ROOM = 16 * 1024
MAX_ROW_BYTES = MAX_EVENT_BYTES - ENVELOPE_ROOM


def canonical_lines(rows: Iterable[dict[str, Any]]) -> list[bytes]:
    """Each row as one canonical JSONL line.

    >>> canonical_lines([{"a": 1, "b": [0.5]}])
    [b'{"a":1,"b":[0.5]}\\n']
    """
    return [orjson.dumps(row) + b"\n" for row in rows]


def rows_sha256(rows: Iterable[dict[str, Any]]) -> str:
    """sha256 of the rows' canonical JSONL (the file's own sha256 for a jsonl batch).

    >>> rows_sha256([]) == hashlib.sha256(b"").hexdigest()
    True
    """
    digest = hashlib.sha256()
    for line in canonical_lines(rows):
        digest.update(line)
    return digest.hexdigest()


# The row columns that name the trajectories a row was built from (every builder writes one).
LINEAGE_KEYS = ("trajectory_id", "chosen_trajectory_id", "rejected_trajectory_id")


def oversize_rows(rows: Iterable[dict[str, Any]], max_row_bytes: int = MAX_ROW_BYTES) -> dict[int, int]:
    """Index -> canonical size of every row over `max_row_bytes` (no `batch.rows` event can carry it).

    >>> oversize_rows([{"x": "a"}, {"x": "a" * 50}, {"x": "b"}], max_row_bytes=20)
    {1: 59}
    """
    sizes = (len(line) for line in canonical_lines(rows))
    return {index: size for index, size in enumerate(sizes) if size > max_row_bytes}


def row_trajectory_ids(row: dict[str, Any]) -> set[str]:
    """The trajectories a row was built from, by its lineage columns (a DPO pair names two).

    >>> sorted(row_trajectory_ids({"chosen_trajectory_id": "a", "rejected_trajectory_id": "b"}))
    ['a', 'b']
    """
    return {row[key] for key in LINEAGE_KEYS if isinstance(row.get(key), str)}


def chunk_rows(
    rows: list[dict[str, Any]],
    batch_id: str,
    chunk_bytes: int = CHUNK_BYTES,
    max_row_bytes: int = MAX_ROW_BYTES,
) -> list[list[dict[str, Any]]]:
    """Rows cut into chunks of at most `chunk_bytes` canonical bytes (a larger row alone).

    >>> [len(c) for c in chunk_rows([{"x": "a" * 10}] * 5, "b1", chunk_bytes=40)]
    [2, 2, 1]
    >>> chunk_rows([], "b1")
    []
    """
    chunks: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    size = 0
    for index, (row, line) in enumerate(zip(rows, canonical_lines(rows), strict=True)):
        if len(line) > max_row_bytes:
            raise TrainerError(
                f"batch {batch_id}: row {index} takes {len(line)} bytes as JSON, over the "
                f"{max_row_bytes} one batch.rows event can carry (MAX_EVENT_BYTES less the envelope); "
                "shorten the trajectories that make such rows"
            )
        if current and size + len(line) > chunk_bytes:
            chunks.append(current)
            current, size = [], 0
        current.append(row)
        size += len(line)
    if current:
        chunks.append(current)
    return chunks


def chunk_events(
    batch_id: str,
    kind: str,
    rows: list[dict[str, Any]],
    occurred_at: datetime,
    producer: str,
    chunk_bytes: int = CHUNK_BYTES,
) -> list[BatchRows]:
    """The `batch.rows` events of one batch, in index order; each checked to fit in one event."""
    digest = rows_sha256(rows)
    chunks = chunk_rows(rows, batch_id, chunk_bytes)
    events = [
        BatchRows(
            event_id=derived_event_id("batch.rows", batch_id, digest, index),
            trajectory_id=batch_id,
            occurred_at=occurred_at,
            producer=producer,
            batch_id=batch_id,
            kind=kind,
            index=index,
            chunks=len(chunks),
            rows_sha256=digest,
            rows=chunk,
        )
        for index, chunk in enumerate(chunks)
    ]
    for event in events:
        size = len(encode(event))
        if size > MAX_EVENT_BYTES:
            raise TrainerError(
                f"batch {batch_id}: chunk {event.index} encodes to {size} bytes, over MAX_EVENT_BYTES "
                f"({MAX_EVENT_BYTES}); a smaller chunk size is needed"
            )
    return events
