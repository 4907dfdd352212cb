"""Naming the slots a trajectory lacks, for `trajectory.scored.missing`: `step.recorded[3]`, or,
past `MAX_LISTED_SLOTS` of a kind, one `step.recorded[7..99999]` entry per run of absent slots.

Why its own module: the number of slots comes from what a field *claims* (`episode.ended.total_steps`,
the highest `step_index` seen + 1), which a hostile producer sets; the work and the output here are
bounded by what arrived, never by that claim (issue #34: a claimed 2**32 grew the scoring role to
24 GB when every absent slot was a string).
"""

from __future__ import annotations

from collections.abc import Iterable

# Absent slots listed one by one per kind in `missing`; beyond it a run of them is one `name[a..b]`.
MAX_LISTED_SLOTS = 100


def absent_slots(name: str, n: int, present: Iterable[int], listed: int = MAX_LISTED_SLOTS) -> list[str]:
    """The slots `name[i]`, 0 <= i < n, not in `present`: one entry each for the first `listed`,
    then one `name[a..b]` entry per run of absent slots.

    Why: `n` is what a field claims (`episode.ended.total_steps`, the highest `step_index` seen + 1),
    which may be 2**32; work and output are bounded by what arrived (`present`), never by `n`.

    >>> absent_slots("step.recorded", 4, [0, 2])
    ['step.recorded[1]', 'step.recorded[3]']
    >>> absent_slots("step.recorded", 2**32, [0], listed=2)
    ['step.recorded[1..4294967295]']
    >>> absent_slots("s", 9, [2, 5], listed=3)
    ['s[0]', 's[1]', 's[3..4]', 's[6..8]']
    """
    out: list[str] = []
    start = 0
    for index in [*sorted({i for i in present if 0 <= i < n}), n]:
        if index > start:
            out += _run(name, start, index - 1, listed - len(out))
        start = index + 1
    return out


def _run(name: str, first: int, last: int, budget: int) -> list[str]:
    """A run of absent slots: listed one by one when `budget` allows it all, else as one range."""
    if last - first + 1 <= budget:
        return [f"{name}[{i}]" for i in range(first, last + 1)]
    return [f"{name}[{first}]" if first == last else f"{name}[{first}..{last}]"]
