"""A rank's place from torchrun's environment, checked; the split of micro batches over ranks."""

from __future__ import annotations

import doctest
import re

import pytest

from consumers.errors import TrainerError
from consumers.training import distributed
from consumers.training.distributed import Ranks, plan_steps, ranks_from_env

GOOD = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_docstring_examples_hold():
    result = doctest.testmod(distributed)
    assert result.attempted >= 5 and result.failed == 0


def test_a_single_process_has_no_group(monkeypatch):
    assert ranks_from_env({}) is None and ranks_from_env(GOOD | {"WORLD_SIZE": "1", "RANK": "0"}) is None
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ranks = distributed.join_group("cpu")
    assert ranks == Ranks() and ranks.is_main and not ranks.distributed
    assert distributed.all_sum(ranks, {"a": 2}) == {"a": 2.0}
    assert distributed.broadcast_object(ranks, {"x": 1}) == {"x": 1}


@pytest.mark.parametrize(
    ("change", "variable", "value"),
    [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE", "'two'"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE", "'0'"),
        ({"RANK": "2"}, "RANK", "'2'"),
        ({"RANK": "-1"}, "RANK", "'-1'"),
        ({"LOCAL_RANK": "x"}, "LOCAL_RANK", "'x'"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT", "'70000'"),
        ({"MASTER_ADDR": " "}, "MASTER_ADDR", "' '"),
    ],
)
def test_bad_environment_names_the_variable_and_the_value(change, variable, value):
    with pytest.raises(TrainerError, match=rf"^{variable}: .*{value}"):
        ranks_from_env(GOOD | change)


def test_a_missing_variable_is_named():
    env = {k: v for k, v in GOOD.items() if k != "MASTER_PORT"}
    with pytest.raises(TrainerError, match=r"^MASTER_PORT: not set"):
        ranks_from_env(env)


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("accumulation", [1, 2])
@pytest.mark.parametrize("micro", [1, 2, 5, 7])
def test_every_micro_batch_is_trained_once_and_ranks_run_the_same_passes(world, accumulation, micro):
    plans = [plan_steps(micro, accumulation, Ranks(r, world, r)) for r in range(world)]
    assert len({len(p) for p in plans}) == 1  # the same number of optimizer steps
    seen = []
    for step in range(len(plans[0])):
        slots = {len(p[step][0]) for p in plans}
        counts = {p[step][1] for p in plans}
        assert len(slots) == 1 and len(counts) == 1  # same passes, same divisor on every rank
        mine = [i for p in plans for i in p[step][0] if i is not None]
        assert len(mine) == counts.pop() <= accumulation * world
        seen += mine
    assert sorted(seen) == list(range(micro))


@pytest.mark.parametrize("raw", [" 2", "2 ", "+2", "1_0", "\u0662", "2.0", ""])
def test_only_ascii_digits_make_a_number(raw):
    with pytest.raises(
        TrainerError,
        match="^WORLD_SIZE: expected a whole number in ASCII digits, got " + re.escape(repr(raw)),
    ):
        ranks_from_env(GOOD | {"WORLD_SIZE": raw})


@pytest.mark.parametrize("name", ["RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"])
def test_a_group_variable_without_world_size_is_refused(name):
    with pytest.raises(TrainerError, match=rf"^{name}: set \({name}={GOOD[name]!r}\) but WORLD_SIZE is not"):
        ranks_from_env({name: GOOD[name]})
    env = {k: v for k, v in GOOD.items() if k != "WORLD_SIZE"}
    with pytest.raises(TrainerError, match=r"^RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT: set"):
        ranks_from_env(env)


def test_world_size_1_is_rank_0():
    assert ranks_from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    with pytest.raises(TrainerError, match=r"^RANK: must be 0 when WORLD_SIZE is 1, got '1'"):
        ranks_from_env({"WORLD_SIZE": "1", "RANK": "1"})


@pytest.mark.parametrize("raw", ["0", "-1", "x", "inf", "nan"])
def test_a_bad_group_timeout_is_refused_naming_it(raw):
    assert distributed.group_timeout_s({distributed.TIMEOUT_ENV: "2.5"}) == 2.5
    with pytest.raises(
        TrainerError, match="^AGENTSTREAM_GROUP_TIMEOUT_S: expected seconds > 0, got " + re.escape(repr(raw))
    ):
        distributed.group_timeout_s({distributed.TIMEOUT_ENV: raw})
