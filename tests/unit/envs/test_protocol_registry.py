"""The env protocol (TimeStep, AgentEnv, EnvWrapper) and the registry's errors and listing."""

from __future__ import annotations

import pytest

import producers.envs as envs
from producers.envs import AgentEnv, CalcEnv, EnvError, EnvWrapper, TimeStep
from producers.errors import ProducerError


class EchoEnv(AgentEnv):
    domain = "test"
    terminal_tools = frozenset({"finish"})

    def __init__(self, greeting: str = "hi", loud: bool = False):
        self.greeting, self.loud, self.closed = greeting, loud, False

    @property
    def available_tools(self) -> list[str]:
        return ["echo", "finish"]

    def reset(self, *, task=None, seed=None) -> TimeStep:
        return TimeStep(self.greeting.upper() if self.loud else self.greeting)

    def step(self, action) -> TimeStep:
        return TimeStep(str(action["params"]), terminated=action["tool"] == "finish")

    def verify(self) -> bool | None:
        return True

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def registered():
    envs.register("test/echo", EchoEnv, domain="test", description="echoes", greeting="hello")
    yield "test/echo"
    envs.unregister("test/echo")


def test_timestep_done_is_terminated_or_truncated():
    assert not TimeStep().done
    assert TimeStep(terminated=True).done and TimeStep(truncated=True).done
    assert TimeStep().info == {} and TimeStep().info is not TimeStep().info


def test_env_is_a_context_manager_that_closes():
    with EchoEnv() as env:
        assert env.reset().observation == "hi"
    assert env.closed and env.unwrapped is env


def test_wrapper_passes_everything_through():
    inner = EchoEnv()
    wrapped = EnvWrapper(EnvWrapper(inner))
    assert wrapped.domain == "test" and wrapped.terminal_tools == {"finish"}
    assert wrapped.available_tools == ["echo", "finish"] and wrapped.unwrapped is inner
    assert wrapped.reset().observation == "hi"
    assert wrapped.step({"tool": "finish", "params": {"a": 1}}).terminated
    assert wrapped.verify() is True
    with wrapped:
        pass
    assert inner.closed


def test_make_merges_registered_kwargs_with_overrides(registered):
    assert envs.make(registered).reset().observation == "hello"
    assert envs.make(registered, loud=True, greeting="hey").reset().observation == "HEY"
    s = envs.spec(registered)
    assert (s.id, s.domain, s.description, s.kwargs) == (registered, "test", "echoes", {"greeting": "hello"})
    assert envs.spec("nope") is None


def test_duplicate_id_names_it_and_lists_the_registered_ids(registered):
    with pytest.raises(EnvError, match=r"'test/echo' is already registered; registered ids: \[.*'calc'"):
        envs.register(registered, EchoEnv)


def test_unknown_id_lists_the_registered_ids(registered):
    with pytest.raises(EnvError, match=r"unknown env id 'nope'; registered ids: \[.*'calc'.*'test/echo'"):
        envs.make("nope")
    assert issubclass(EnvError, ProducerError)


def test_list_envs_is_sorted_and_filters_by_domain(registered):
    envs.register("test/a-first", EchoEnv, domain="test")
    try:
        assert envs.list_envs(domain="test") == ["test/a-first", "test/echo"]
        assert envs.list_envs() == sorted(envs.list_envs())
        assert envs.list_envs(domain="math") == ["calc"]
    finally:
        envs.unregister("test/a-first")


def test_calc_is_registered_on_import():
    assert isinstance(envs.make("calc", difficulty=2), CalcEnv)
    assert envs.spec("calc").domain == "math"


def test_bad_registrations_are_refused():
    with pytest.raises(EnvError, match="non-empty string"):
        envs.register("", EchoEnv)
    with pytest.raises(EnvError, match="factory must be callable"):
        envs.register("test/x", "EchoEnv")
    with pytest.raises(EnvError, match="unknown env id 'test/x'"):
        envs.unregister("test/x")
