"""What every role's pure batch logic returns, and the decoding every role shares: no faust, no I/O.

A role's processor turns consumed records (`schemas.records.Record`) into a `BatchResult`; the one
batch shell (streams/shell.py) publishes it, in this order: outputs, forwards and dead letters
(each acknowledged), then the state updates (changelog acknowledged, then the local store); only
then are the batch's offsets committed. A replay after a crash therefore reproduces the same
outputs (deterministic event ids), which every consumer drops by `event_id`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from clients.kafka.dead_letters import letter_for
from clients.kafka.poison import is_poison
from schemas.codec import decode
from schemas.errors import DecodeError
from schemas.events import DeadLetter, EventBase
from schemas.records import Record
from streams.errors import BatchFailed

STATE = "state"  # the table every role has: per-trajectory state

StateGetter = Callable[[bytes], bytes | None]


@dataclass
class BatchResult:
    """What one batch (or one timer tick) of a role produced.

    - `outputs`: events, each sent to its type's topic keyed by trajectory id.
    - `forwards`: (key, value) records for the role's own internal topic (re-keying, e.g. the
      judge's group members by group id).
    - `dead`: dead letters for the DLQ, with their source coordinates.
    - `tables`: table name -> {key: new raw state, or None to delete}; `updates` is the `state`
      table's.
    """

    outputs: list[EventBase] = field(default_factory=list)
    forwards: list[tuple[bytes, bytes]] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    tables: dict[str, dict[bytes, bytes | None]] = field(default_factory=dict)

    @property
    def updates(self) -> dict[bytes, bytes | None]:
        """The `state` table's updates (created on first use)."""
        return self.tables.setdefault(STATE, {})


def decode_records(
    stage: str, records: Iterable[Record], accepted: Mapping[str, set[str]], result: BatchResult
) -> Iterator[tuple[Record, EventBase]]:
    """Decode records; those that cannot be used become dead letters. Yields (record, event)."""
    for record in records:
        event = decode_record(stage, record, result)
        if event is None:
            continue
        if event.type not in accepted.get(record.topic, set()):
            reason = f"type: {event.type!r} is not expected on topic {record.topic!r} by {stage}"
            result.dead.append(letter_for(stage, record, reason, "UnexpectedType"))
            continue
        yield record, event


def decode_record(stage: str, record: Record, result: BatchResult) -> EventBase | None:
    """The record's event, or None with a dead letter in `result`. Whatever decoding raises is the
    record's fault (a `DecodeError`, or a parser's own limit such as a `RecursionError`): the same
    bytes fail the same way on every replay, so they must not stop the stage."""
    try:
        return decode(record.value if record.value is not None else b"")
    except DecodeError as exc:
        result.dead.append(letter_for(stage, record, str(exc), "DecodeError"))
    except Exception as exc:
        result.dead.append(letter_for(stage, record, f"not decodable: {exc!r}", type(exc).__name__))
    return None


def is_retryable(exc: BaseException) -> bool:
    """Whether a failure is the world's (the broker, the network, the disk, a shared ledger: the role
    exits and replays from its committed offsets) rather than the input's (poison: to the DLQ).
    Decided by `clients.kafka.poison.is_poison`, as for every consuming stage; the shell's own
    `BatchFailed` (an output not acknowledged, an offset gap) is the world's too.

    >>> is_retryable(ConnectionError("refused")), is_retryable(KeyError("step_index"))
    (True, False)
    """
    return isinstance(exc, BatchFailed) or not is_poison(exc)


def poison_letter(stage: str, record: Record, exc: BaseException) -> DeadLetter:
    """The dead letter of a record whose processing raised on its own (`BatchShell` isolates it)."""
    return letter_for(stage, record, f"processing failed: {exc!r}", type(exc).__name__)


class StateCache:
    """Decoded per-trajectory states, reused while the table still holds the very bytes they were
    decoded from (or stored as): a role then decodes a trajectory's state once, not once per batch.

    The check is identity (`is`) of the table's value with the cached one, so anything that replaced
    the value behind the role's back (changelog recovery after a rebalance handed the partition to
    another worker and back) is decoded again, never served stale. Least recently used states go
    first beyond `size`."""

    def __init__(self, decode: Callable[[bytes | None], Any], size: int = 100_000):
        self.decode, self.size = decode, size
        self._items: dict[bytes, tuple[bytes | None, Any]] = {}

    def get(self, key: bytes, get_state: StateGetter) -> Any:
        """The state of `key`: cached if the table's value is the one it came from, else decoded."""
        raw = get_state(key)
        hit = self._items.pop(key, None)
        fresh = hit is not None and raw is not None and hit[0] is raw
        state = hit[1] if fresh else self.decode(raw)
        self._items[key] = (raw, state)  # re-inserted: the dict's order is least recently used first
        if len(self._items) > self.size:
            del self._items[next(iter(self._items))]
        return state

    def stored(self, key: bytes, raw: bytes, state: Any) -> None:
        """`state` is what `raw` (about to be written to the table) holds."""
        self._items[key] = (raw, state)

    def clear(self) -> None:
        self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


class BatchPacing:
    """How long a role waits after a batch before taking the next one: under load, so that batches
    grow instead of multiplying; at a trickle, not at all.

    A role's cost is largely per batch (a fetch handed over from faust's consumer thread, a produce
    request per output topic and one for the changelog, each awaited, offsets acked and committed),
    and at 1,000 steps/s a batch every 10-20 ms held a handful of events. The pace follows the event
    rate (a moving average over the batches): no wait at `LOW_RATE` events/s and below, `max_period_s`
    from one batch's start to the next at `HIGH_RATE` and above, linear in between. Measured at 1,000
    steps/s with a fixed 40 ms: the stack's CPU per step 1.019 -> 0.913 ms (rules 0.171 -> 0.142,
    assembler 0.263 -> 0.237, broker 0.233 -> 0.197), rule reward p50 375 -> 442 ms."""

    LOW_RATE = 400.0
    HIGH_RATE = 1_200.0
    SMOOTHING = 0.2

    def __init__(self, max_period_s: float):
        self.max_period_s = max_period_s
        self.rate = 0.0  # events per second, a moving average over the batches
        self._last_start: float | None = None

    def pause(self, events: int, started: float, now: float) -> float:
        """Seconds to wait after a batch of `events` that started at `started` (monotonic), now `now`."""
        if self.max_period_s <= 0:
            return 0.0
        if self._last_start is not None:
            sample = events / max(started - self._last_start, 0.001)
            self.rate += self.SMOOTHING * (sample - self.rate)
        self._last_start = started
        load = min(max((self.rate - self.LOW_RATE) / (self.HIGH_RATE - self.LOW_RATE), 0.0), 1.0)
        return max(load * self.max_period_s - (now - started), 0.0)


def by_trajectory(pairs: Iterable[tuple[Record, Any]]) -> dict[str, list[tuple[Record, Any]]]:
    """(record, event) pairs grouped by the event's trajectory id, in arrival order."""
    groups: dict[str, list[tuple[Record, Any]]] = {}
    for record, event in pairs:
        groups.setdefault(event.trajectory_id, []).append((record, event))
    return groups
