"""Poison or outage: the one answer to "is this failure the record's fault?" for every stage that
reads Kafka (the stream roles' batch shell, the consume loop of the sink, the trainer consumer and
the executor).

Poison fails the same way on every replay, so the record is dead-lettered with its coordinates and
its offset committed; an outage says nothing about the record, so the failure is raised, the process
exits and the record is read again after a restart. Must not build letters or talk to Kafka.

The decisions, and why they hold for a stream processor and a consumer alike:
- Kafka errors (any class from `kafka` or `aiokafka`) are outages: the broker or the network.
- `OSError` is an outage (the disk, a socket, a timeout: `ConnectionError` and `TimeoutError` are
  OSErrors), except the four that say a *path* is wrong: `FileNotFoundError`, `IsADirectoryError`,
  `NotADirectoryError`, `PermissionError`. A handler opens a file only because a record named it (the
  executor reads the file a `batch.built` points to); a stage's own files (configuration, rubrics,
  profiles) are read at start, before anything is consumed, and the stream roles' stores are written
  after processing, outside this predicate. So a path error while handling a record is the record's.
- `MemoryError` is poison. Python raises it when one allocation asks for more than the process may
  have, and the size of that allocation comes from the input (a claimed `step_index` of 2**32 once
  grew the assembler to 24 GB): the same record asks again on every replay. A machine that is really
  out of memory does not raise it (the kernel's OOM killer stops the process), and the stream shell
  re-runs a failed batch one record at a time, so a batch too large as a whole still goes through.
- An exception class may declare itself an outage with a true `retryable` attribute (the judge's
  shared ledger topics not answering).
- Everything else (a `KeyError`, a `ValueError`, a `RecursionError` from a parser's depth limit) is
  the record's.
"""

from __future__ import annotations

# A path the record named is not there, not a file, or not ours to read; any other OSError is the
# machine's.
POISON_OS_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)
KAFKA_PACKAGES = ("kafka", "aiokafka")


def is_poison(exc: BaseException) -> bool:
    """The record's fault: it fails the same way on every replay (see the module docstring).

    >>> is_poison(FileNotFoundError("x")), is_poison(ConnectionError()), is_poison(KeyError("prompt"))
    (True, False, True)
    >>> is_poison(MemoryError()), is_poison(OSError("disk full")), is_poison(TimeoutError())
    (True, False, False)
    """
    if isinstance(exc, POISON_OS_ERRORS):
        return True
    if isinstance(exc, OSError) or getattr(exc, "retryable", False) is True:
        return False
    return not any(cls.__module__.split(".", 1)[0] in KAFKA_PACKAGES for cls in type(exc).__mro__)
