"""The served environment's wire contract: a TimeStep of any JSON info comes back equal through the
wire (property), what JSON would alter is refused with its path, request bodies are checked field by
field, and the rollout config takes `--env-url` / `--env-args`."""

from __future__ import annotations

import functools
import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from producers.envs.errors import EnvServiceError
from producers.envs.protocol import TimeStep
from producers.envs.service.wire import (
    json_problem,
    parse_create,
    parse_env_args,
    parse_reset,
    parse_step,
    request_object,
    timestep_from_wire,
    timestep_to_wire,
)
from producers.errors import ProducerError
from producers.rollout.driver import RolloutConfig

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
timesteps = st.builds(
    TimeStep,
    observation=st.text(),
    reward=st.floats(allow_nan=False, allow_infinity=False) | st.integers(-1000, 1000),
    terminated=st.booleans(),
    truncated=st.booleans(),
    info=st.dictionaries(st.text(), json_values, max_size=5),
)


def through_the_wire(ts: TimeStep) -> TimeStep:
    return timestep_from_wire(orjson.loads(orjson.dumps(timestep_to_wire(ts))))


@given(timesteps)
def test_a_timestep_of_json_comes_back_equal_with_its_types(ts):
    back = through_the_wire(ts)
    assert back == ts
    assert type(back.reward) is type(ts.reward)
    assert math.copysign(1, back.reward) == math.copysign(1, ts.reward)  # -0.0 stays -0.0


@pytest.mark.parametrize(
    ("info", "path"),
    [
        ({"pair": (1, 2)}, "timestep.info.pair"),
        ({"a": {"b": [1, float("nan")]}}, "timestep.info.a.b[1]"),
        ({"a": {3: "x"}}, "timestep.info.a"),
        ({"big": 2**70}, "timestep.info.big"),
        ({"set": {1}}, "timestep.info.set"),
    ],
)
def test_what_json_would_alter_is_refused_naming_its_path(info, path):
    with pytest.raises(EnvServiceError) as refused:
        timestep_to_wire(TimeStep("x", info=info))
    assert (refused.value.status, refused.value.code, refused.value.field) == (500, "env_output", path)
    with pytest.raises(EnvServiceError, match=r"timestep\.reward"):
        timestep_to_wire(TimeStep("x", reward=True))
    deep: list = []
    for _ in range(70):
        deep = [deep]
    assert "deeper" in json_problem(deep, "task")[2]


def test_a_server_answer_off_the_contract_is_a_502_naming_the_field():
    good = timestep_to_wire(TimeStep("ok"))
    bad_ones = [
        ({**good, "extra": 1}, "extra"),
        ({**good, "reward": "1"}, "reward"),
        ({**good, "terminated": 1}, "terminated"),
        ({**good, "info": []}, "info"),
    ]
    for bad, field in bad_ones:
        with pytest.raises(EnvServiceError) as refused:
            timestep_from_wire(bad)
        assert (refused.value.status, refused.value.field) == (502, field)


def test_request_bodies_are_checked_field_by_field():
    assert request_object(b"", ("seed",)) == {} and request_object(b'{"seed": 1}', ("seed",)) == {"seed": 1}
    refusals = [
        (lambda: request_object(b'{"seed": 1, "sede": 2}', ("seed",)), "sede"),
        (lambda: request_object(b"[1]", ("seed",)), "body"),
        (lambda: request_object(b"{", ("seed",)), "body"),
        (lambda: parse_reset({"seed": 1.5}), "seed"),
        (lambda: parse_reset({"seed": 2**63}), "seed"),
        (lambda: parse_reset({"task": {"t": float("inf")}}), "task.t"),
        (lambda: parse_step({"action": {"tool": ""}}), "action.tool"),
        (lambda: parse_step({"action": {"tool": "x", "thought": 3}}), "action.thought"),
        (lambda: parse_step({"action": {"tool": "x"}, "timeout_s": True}), "timeout_s"),
        (lambda: parse_create({"env": "sandbox"}, "calc"), "env"),
        (lambda: parse_create({"kwargs": "difficulty=2"}, "calc"), "kwargs"),
        (lambda: parse_env_args("[1]", "--env-args"), "--env-args"),
        (lambda: parse_env_args("{", "--env-args"), "--env-args"),
    ]
    for refuse, field in refusals:
        with pytest.raises(EnvServiceError) as refused:
            refuse()
        assert refused.value.status == 400 and refused.value.field == field, refused.value
        assert field in str(refused.value)
    action = {"tool": "shell", "params": "not an object", "thought": None}
    assert parse_step({"action": action, "timeout_s": 2}) == (action, 2.0)  # the env answers bad params
    assert parse_reset({}) == (None, None) and parse_create({}, "calc") == {}


def test_the_rollout_config_takes_an_env_url_and_env_args():
    config = RolloutConfig(env_url="http://127.0.0.1:9", env_args='{"difficulty": 2}')
    assert config.env_url == "http://127.0.0.1:9"
    with pytest.raises(ProducerError, match="--env-url"):
        RolloutConfig(env_url="127.0.0.1:9")
    with pytest.raises(ProducerError, match="--env-args"):
        RolloutConfig(env_args='{"difficulty": ')
    import producers.envs  # noqa: F401  (registers calc)
    from producers.envs.tasks import Task

    env = RolloutConfig(env_args='{"difficulty": 4}').make_env(Task("t", "calc"))
    assert env.difficulty == 4


def test_what_only_the_operator_sets_is_refused_from_a_client_and_taken_from_env_args():
    import producers.envs  # noqa: F401  (registers sandbox)
    from producers.envs.errors import EnvError
    from producers.envs.registry import EnvSpec, spec
    from producers.envs.service.config import operator_kwargs, session_kwargs

    sandbox = spec("sandbox")
    operator = {"backend": "docker", "limits": None, "unisolated": True, "docker_host": "tcp://10.1.2.3:2375",
                "image": "attacker/image"}  # fmt: skip
    assert operator_kwargs(sandbox) == set(operator) and operator_kwargs(spec("calc")) == frozenset()
    for name, value in operator.items():  # on a server that set none of them, or all of them
        for fixed in ({}, operator):
            with pytest.raises(EnvServiceError) as refused:
                session_kwargs(sandbox, fixed, {"max_steps": 5, name: value})
            error = refused.value
            assert (error.status, error.code, error.field, error.value) == (
                400,
                "operator_kwarg",
                f"kwargs.{name}",
                value,
            )
            assert "--env-args" in str(error) and repr(value) in str(error)
    assert session_kwargs(sandbox, operator, {"max_steps": 5}) == {**operator, "max_steps": 5}

    class Misdeclared:
        operator_kwargs = frozenset({"backends"})

        def __init__(self, backend: str = "local"):
            self.backend = backend

    with pytest.raises(EnvError, match=r"operator_kwargs names \['backends'\]"):
        operator_kwargs(EnvSpec("mis", Misdeclared))
    Misdeclared.operator_kwargs = "backend"  # a string is not a set of names
    with pytest.raises(EnvError, match="frozenset of parameter names"):
        operator_kwargs(EnvSpec("mis", Misdeclared))
    Misdeclared.operator_kwargs = frozenset({"backend"})
    wrapped = EnvSpec("mis", functools.partial(functools.partial(Misdeclared), backend="docker"))
    assert operator_kwargs(wrapped) == {"backend"}  # a partial is looked through
