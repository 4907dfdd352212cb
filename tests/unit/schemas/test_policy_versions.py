"""The one definition of the current policy (schemas.policy_versions): version numbers, the order,
ties, unknown formats, and that reading order never changes the answer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.events import PolicyUpdated
from schemas.policy_versions import current_policy, newer, version_number

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def update(version: str, step: int = 0, at: int = 0, event_id: str | None = None) -> PolicyUpdated:
    return PolicyUpdated(
        event_id=event_id or f"e-{version}-{step}-{at}",
        trajectory_id=version or "none",
        occurred_at=T0 + timedelta(seconds=at),
        producer="tests",
        policy_version=version,
        step=step,
    )


@pytest.mark.parametrize(
    ("version", "number"),
    [
        ("base", 0),
        ("v0", 0),
        ("v1", 1),
        ("v12", 12),
        ("v007", 7),
        ("7", 7),
        ("run3-v12", 12),
        ("r0-v3", 3),
        ("v1b", None),
        ("latest", None),
        ("Base", None),
        ("", None),
        (None, None),
    ],
)
def test_version_numbers(version, number):
    assert version_number(version) == number


def test_the_number_orders_not_the_string_nor_the_arrival():
    published = [update("v2"), update("v10"), update("v9"), update("v3")]
    assert current_policy(published).policy_version == "v10"  # "v9" > "v10" as strings


def test_an_older_version_published_late_is_not_current():
    late = update("v3", step=30, at=99)  # later in time and a higher step, but a lower number
    assert current_policy([update("v5", step=5, at=1), late]).policy_version == "v5"


def test_a_numbered_version_beats_base_and_base_beats_no_number():
    assert current_policy([update("v1"), update("base", step=9)]).policy_version == "v1"
    assert current_policy([update("latest", step=50, at=50), update("base")]).policy_version == "base"


def test_unknown_formats_rank_among_themselves_by_step_then_time():
    assert current_policy([update("beta", step=2), update("alpha", step=1)]).policy_version == "beta"
    assert current_policy([update("beta", at=1), update("alpha", at=2)]).policy_version == "alpha"


def test_ties_on_the_number_break_by_step_then_time_then_name_then_event_id():
    assert current_policy([update("v007", step=1), update("v7", step=2)]).policy_version == "v7"
    assert current_policy([update("v7", at=5), update("v007", at=4)]).policy_version == "v7"
    assert current_policy([update("v007"), update("v7")]).policy_version == "v7"  # "v7" > "v007"
    first, second = update("v7", event_id="a"), update("v7", event_id="b")  # a republished duplicate
    assert current_policy([second, first]) is second and current_policy([first, second]) is second


def test_nothing_is_no_current_policy():
    assert current_policy([]) is None
    event = update("v1")
    assert newer(None, event) is event


versions = st.one_of(
    st.integers(0, 30).map(lambda n: f"v{n}"),
    st.just("base"),
    st.sampled_from(["latest", "v1b", "x"]),
)
events = st.lists(
    st.builds(update, versions, st.integers(0, 5), st.integers(0, 5), st.uuids().map(str)),
    min_size=1,
    max_size=12,
)


@given(events, st.randoms())
def test_reading_order_never_changes_the_answer(published, random):
    shuffled = list(published)
    random.shuffle(shuffled)
    assert current_policy(shuffled) is current_policy(published)


@given(events)
def test_the_current_policy_has_the_highest_number_published(published):
    numbers = [n for e in published if (n := version_number(e.policy_version)) is not None]
    current = current_policy(published)
    assert version_number(current.policy_version) == (max(numbers) if numbers else None)
