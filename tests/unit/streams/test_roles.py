"""`--roles`: one stream topology. `scoring` (rule rewards and trajectory assembly in one consumer)
and `judge` are the roles; the `rules` and `assembler` roles of earlier releases are refused with
the value named and what to run instead, on the command line as in the config."""

from __future__ import annotations

import subprocess

import pytest

from streams.app import ROLE_REGISTRARS
from streams.config import DEFAULT_ROLES, ROLES, WorkerConfig
from streams.errors import WorkerConfigError
from tests.support.processes import AGENTSTREAM


def test_the_roles_are_scoring_and_the_judge_and_scoring_is_the_default():
    assert ROLES == ("scoring", "judge") and DEFAULT_ROLES == ("scoring",)
    assert set(ROLE_REGISTRARS) == set(ROLES)
    assert WorkerConfig(roles=("scoring", "judge")).roles == ("scoring", "judge")


@pytest.mark.parametrize("role", ["rules", "assembler"])
def test_a_merged_role_is_refused_naming_it_and_the_roles(role):
    with pytest.raises(WorkerConfigError) as refused:
        WorkerConfig(roles=("scoring", role))
    message = str(refused.value)
    assert f"{role!r} is no longer a role" in message and "--roles scoring" in message
    assert "(roles: scoring, judge)" in message


def test_an_unknown_or_missing_role_is_refused_with_the_roles():
    with pytest.raises(WorkerConfigError, match=r"unknown role 'nope' \(roles: scoring, judge\)"):
        WorkerConfig(roles=("nope",))
    with pytest.raises(WorkerConfigError, match="name at least one role"):
        WorkerConfig(roles=())


def test_the_worker_command_refuses_the_assembler_role_in_one_line():
    done = subprocess.run(
        [*AGENTSTREAM, "worker", "--roles", "assembler", "--bootstrap-servers", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--roles: 'assembler' is no longer a role" in done.stderr
    assert "(roles: scoring, judge)" in done.stderr
    assert "Traceback" not in done.stderr
