"""`up --roles`: the stream roles of the stack, one process per role and worker slot; by default the
`scoring` role (the rules and the assembler in one consumer)."""

from __future__ import annotations

import pytest

from infra.errors import InfraError
from infra.replay import ReplayError, check_roles
from infra.stack import components, embedded_config, stack_roles


def names(tmp_path, **kwargs):
    return [c.name for c in components(embedded_config(tmp_path, **kwargs))]


def test_the_default_stack_runs_one_scoring_process_per_worker_slot(tmp_path):
    assert names(tmp_path) == ["broker", "scoring", "sink", "trainer"]
    assert names(tmp_path, workers=2)[1:3] == ["scoring-0", "scoring-1"]
    assert names(tmp_path, roles=("rules", "assembler"))[1:3] == ["rules", "assembler"]
    scoring = next(c for c in components(embedded_config(tmp_path)) if c.name == "scoring")
    assert scoring.args == ("worker", "--roles", "scoring")


def test_up_roles_are_checked_with_the_value_named():
    assert stack_roles("scoring") == ("scoring",)
    assert stack_roles(" rules , assembler ") == ("rules", "assembler")
    for bad in ("", "scoring,rules", "rules,rules", "judge", "rules,x"):
        with pytest.raises(InfraError, match="--roles"):
            stack_roles(bad)


def test_a_replay_of_the_scoring_role_says_what_to_run_instead():
    with pytest.raises(ReplayError, match="--roles rules,assembler"):
        check_roles(("scoring",))
