"""Split assignment: a task is never in two splits, whatever the rows, their order, the fractions or
the seed; a task keeps its split when more data arrives; the sizes follow the fractions on many tasks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.export.errors import ExportError
from infra.export.splits import SPLITS, assign, parse_fractions, split_of

task_ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
fractions = st.tuples(*[st.integers(0, 10)] * 3).filter(sum).map(lambda t: tuple(x / sum(t) for x in t))


@settings(max_examples=300, deadline=None)
@given(tasks=st.lists(task_ids, min_size=1, max_size=60), fracs=fractions, seed=st.integers(0, 2**32))
def test_no_task_is_ever_in_two_splits(tasks, fracs, seed):
    rows = [{"task_id": t, "n": i} for i, t in enumerate(tasks)]
    splits = assign(rows, fracs, seed)
    homes: dict[str, set[str]] = {}
    for name, chosen in splits.items():
        for row in chosen:
            homes.setdefault(row["task_id"], set()).add(name)
    assert all(len(h) == 1 for h in homes.values())
    assert sorted(r["n"] for v in splits.values() for r in v) == list(range(len(rows)))  # none lost
    assert all(not splits[name] for name, f in zip(SPLITS, fracs, strict=True) if f == 0)


@settings(max_examples=200, deadline=None)
@given(old=st.lists(task_ids, max_size=30), new=st.lists(task_ids, max_size=30), seed=st.integers(0, 99))
def test_a_task_keeps_its_split_when_more_data_arrives(old, new, seed):
    before = assign([{"task_id": t} for t in old], seed=seed)
    after = assign([{"task_id": t} for t in reversed(new + old)], seed=seed)
    where = {r["task_id"]: name for name, rows in after.items() for r in rows}
    assert all(where[r["task_id"]] == name for name, rows in before.items() for r in rows)


def test_split_sizes_follow_the_fractions_on_many_tasks_and_the_seed_reshuffles():
    tasks = [f"task-{i}" for i in range(20000)]
    counts = {name: 0 for name in SPLITS}
    for t in tasks:
        counts[split_of(t, (0.8, 0.1, 0.1))] += 1
    assert counts["train"] / 20000 == pytest.approx(0.8, abs=0.01)
    assert counts["validation"] / 20000 == pytest.approx(0.1, abs=0.01)
    moved = sum(split_of(t, seed=0) != split_of(t, seed=1) for t in tasks[:2000])
    assert moved > 200  # another seed is another assignment


@pytest.mark.parametrize("text", ["0.8,0.1", "0.5,0.5,0.5", "a,b,c", "-0.2,0.6,0.6"])
def test_bad_fractions_are_refused_naming_the_option(text):
    with pytest.raises(ExportError, match="--split"):
        parse_fractions(text)


@pytest.mark.parametrize("task", [None, "", 7])
def test_a_row_without_a_task_id_is_an_error_naming_the_row(task):
    with pytest.raises(ExportError, match="row 1: no task_id"):
        assign([{"task_id": "a"}, {"task_id": task}])
