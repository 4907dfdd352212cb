"""The rollout driver's episode loop with a scripted policy and a recorder stand-in: tool calls
reach the env, the observation goes back as the tool's answer, success comes from the verifier."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import producers.envs  # noqa: F401  (registers calc)
from producers.envs.tasks import Task
from producers.errors import ProducerError
from producers.rollout.driver import (
    RolloutConfig,
    TrainingLoopControls,
    action_from,
    run_episode,
    tool_specs,
)


def reply(content: str = "", call: tuple[str, dict] | None = None):
    calls = None
    if call is not None:
        function = SimpleNamespace(name=call[0], arguments=json.dumps(call[1]))
        calls = [
            SimpleNamespace(id="c1", function=function, model_dump=lambda: {"id": "c1", "type": "function"})
        ]
    message = SimpleNamespace(content=content, tool_calls=calls)
    return SimpleNamespace(choices=[SimpleNamespace(message=message)])


class ScriptedPolicy:
    def __init__(self, *replies):
        self.replies, self.requests = list(replies), []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **request):
        self.requests.append(request)
        return self.replies.pop(0)


class Recorder:
    def __init__(self):
        self.steps, self.ended, self.started = [], [], []

    def episode(self, **started):
        self.started.append(started)
        recorder = self

        class Episode:
            trajectory_id = "t-1"

            def step(self, **step):
                recorder.steps.append(step)

            def end(self, success, score=None, **extra):
                recorder.ended.append((success, extra))

        return Episode()


TASK = Task("calc-add", "calc", {"expression": "3 + 4"})


def test_a_tool_call_then_a_correct_answer_solves_the_episode():
    policy = ScriptedPolicy(reply("let me compute", ("calculator", {"expression": "3 + 4"})), reply("7"))
    recorder = Recorder()
    result = run_episode(policy, RolloutConfig(), TASK, recorder, "g-1", seed=0)
    assert (result.success, result.turns, result.truncated, result.group_id) == (True, 2, False, "g-1")
    assert [s["tool"] for s in recorder.steps] == ["calculator", "submit"]
    assert recorder.steps[1]["params"] == {"answer": "7"}
    assert recorder.started[0]["group_id"] == "g-1" and recorder.started[0]["task_id"] == "calc-add"
    second = policy.requests[1]["messages"]
    assert second[3] == {"role": "tool", "tool_call_id": "c1", "content": recorder.steps[0]["observation"]}
    assert {t["function"]["name"] for t in policy.requests[0]["tools"]} == {"calculator", "submit"}


def test_a_wrong_claim_is_not_a_success_and_the_horizon_truncates():
    result = run_episode(ScriptedPolicy(reply("8, surely right")), RolloutConfig(), TASK, Recorder(), "g", 0)
    assert result.success is False and result.turns == 1
    looping = ScriptedPolicy(*[reply("", ("calculator", {"expression": "1 + 1"}))] * 3)
    cut = run_episode(looping, RolloutConfig(max_turns=3), TASK, Recorder(), "g", 0)
    assert (cut.success, cut.turns, cut.truncated) == (False, 3, True)


def test_actions_and_tool_specs():
    assert action_from(reply("42").choices[0], "submit") == (
        {"tool": "submit", "params": {"answer": "42"}},
        None,
    )
    action, call_id = action_from(reply("hm", ("calculator", {"expression": "2"})).choices[0], "submit")
    assert (
        action == {"tool": "calculator", "params": {"expression": "2"}, "thought": "hm"} and call_id == "c1"
    )
    assert tool_specs(["calculator"])[0]["function"]["name"] == "calculator"


def looping_policy(n: int = 10) -> ScriptedPolicy:
    return ScriptedPolicy(*[reply("", ("calculator", {"expression": "1 + 1"}))] * n)


def test_the_horizon_cuts_the_episode_at_the_scheduled_turn_and_grows_with_progress():
    config = RolloutConfig(max_turns=8, horizon="0=2,100=4,200=16")
    recorder = Recorder()
    early = run_episode(looping_policy(), config, TASK, recorder, "g", 0, progress=0)
    assert (early.turns, early.truncated, early.success, early.horizon) == (2, True, False, 2)
    assert len(recorder.steps) == 2 and recorder.ended[-1][0] is False
    assert recorder.started[-1]["metadata"]["horizon"] == 2
    later = run_episode(looping_policy(), config, TASK, Recorder(), "g", 0, progress=150)
    assert (later.turns, later.truncated, later.horizon) == (4, True, 4)
    capped = run_episode(looping_policy(), config, TASK, Recorder(), "g", 0, progress=500)
    assert (capped.turns, capped.horizon) == (8, 8)  # never beyond max_turns


def test_an_episode_that_ends_before_the_horizon_is_judged_on_what_happened():
    policy = ScriptedPolicy(reply("", ("calculator", {"expression": "3 + 4"})), reply("7"))
    result = run_episode(policy, RolloutConfig(horizon="0=2"), TASK, Recorder(), "g", 0)
    assert (result.success, result.turns, result.truncated, result.horizon) == (True, 2, False, 2)


def test_without_a_schedule_max_turns_applies_and_a_bad_schedule_fails_early():
    assert RolloutConfig(max_turns=5).turn_limit(10**6) == 5
    with pytest.raises(ProducerError, match="'8:12'"):
        RolloutConfig(horizon="8:12")
    with pytest.raises(ProducerError, match="--max-staleness"):
        RolloutConfig(max_staleness=-1)


def test_controls_wait_for_the_gate_then_read_the_step():
    calls = []
    progress = SimpleNamespace(step=lambda: calls.append("step") or 120, close=lambda: None)
    gate = SimpleNamespace(wait=lambda: calls.append("wait"), backlog=SimpleNamespace(close=lambda: None))
    controls = TrainingLoopControls(progress, gate)
    assert controls.before_episode() == 120 and calls == ["wait", "step"]
    assert TrainingLoopControls.from_config(RolloutConfig(), None).before_episode() == 0
    with pytest.raises(ProducerError, match="broker"):
        TrainingLoopControls.from_config(RolloutConfig(horizon="0=2"), None)
