"""`up --roles`: the stream roles of the stack, one process per role and worker slot: the `scoring`
role (rule rewards and trajectory assembly in one consumer); the judge comes with `--judge`."""

from __future__ import annotations

import pytest

from infra.errors import InfraError
from infra.replay import ReplayError, check_roles
from infra.stack import components, embedded_config, stack_roles


def names(tmp_path, **kwargs):
    return [c.name for c in components(embedded_config(tmp_path, **kwargs))]


def test_the_default_stack_runs_one_scoring_process_per_worker_slot(tmp_path):
    assert names(tmp_path) == ["broker", "scoring", "sink", "batch"]
    assert names(tmp_path, workers=2)[1:3] == ["scoring-0", "scoring-1"]
    scoring = next(c for c in components(embedded_config(tmp_path)) if c.name == "scoring")
    assert scoring.args == ("worker", "--roles", "scoring")


def test_up_roles_are_checked_with_the_value_named():
    assert stack_roles(" scoring ") == ("scoring",)
    for bad in ("", "scoring,scoring", "judge", "x"):
        with pytest.raises(InfraError, match=f"--roles: {bad!r}"):
            stack_roles(bad)


@pytest.mark.parametrize("value", ["rules,assembler", "scoring,rules", "assembler"])
def test_up_refuses_the_roles_merged_into_scoring_saying_so(value):
    with pytest.raises(InfraError, match="is part of scoring now"):
        stack_roles(value)


def test_a_replay_of_the_merged_roles_says_to_replay_scoring():
    with pytest.raises(ReplayError, match="--roles scoring"):
        check_roles(("rules", "assembler"))
