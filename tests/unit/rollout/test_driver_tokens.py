"""The driver asks the policy in client-records mode and hands the reply's `agentstream` fields to
the recorder wrapper: one step.recorded per turn with the observation and the token fields."""

from __future__ import annotations

from types import SimpleNamespace

import producers.envs  # noqa: F401  (registers calc)
from producers.envs.tasks import Task
from producers.rollout.driver import RolloutConfig, run_episode

FIELDS = {
    "token_ids": [5, 6],
    "logprobs": [-0.1, -0.2],
    "prompt_token_ids": [1, 2, 3],
    "prompt_delta_start": 0,
    "token_continuity": "first",
    "policy_version": "v3",
    "step_index": 0,
    "latency_ms": 2.0,
    "finish_reason": "stop",
}


class OurPolicy:
    """An endpoint that reports its version on /models and the step's fields in each reply."""

    def __init__(self, fields):
        self.fields, self.headers = fields, []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))
        raw = SimpleNamespace(list=lambda: SimpleNamespace(headers={"x-agentstream-policy-version": "v3"}))
        self.models = SimpleNamespace(with_raw_response=raw)

    def create(self, **request):
        self.headers.append(request["extra_headers"])
        message = SimpleNamespace(content="7", tool_calls=None)
        extra = {"agentstream": self.fields} if self.fields is not None else {}
        return SimpleNamespace(choices=[SimpleNamespace(message=message)], model_extra=extra)


class Recorder:
    def __init__(self):
        self.steps, self.started = [], []

    def episode(self, **started):
        self.started.append(started)
        steps = self.steps

        class Episode:
            trajectory_id = "t-1"

            def step(self, **step):
                steps.append(step)

            def end(self, success, score=None, **extra):
                pass

        return Episode()


TASK = Task("calc-add", "calc", {"expression": "3 + 4"})


def test_the_replys_token_fields_are_recorded_with_the_observation():
    policy, recorder = OurPolicy(FIELDS), Recorder()
    run_episode(policy, RolloutConfig(), TASK, recorder, "g-1", seed=0)
    assert policy.headers == [
        {"X-Agentstream-Trajectory": "t-1", "X-Agentstream-Step-Index": "0", "X-Agentstream-Record": "client"}
    ]
    assert recorder.started[0]["policy_version"] == "v3"
    (step,) = recorder.steps
    assert step["token_ids"] == [5, 6] and step["prompt_token_ids"] == [1, 2, 3]
    assert (step["token_continuity"], step["policy_version"]) == ("first", "v3")
    assert "step_index" not in step and step["latency_ms"] >= 2.0 and step["observation"]


def test_an_endpoint_that_is_not_ours_records_steps_without_token_ids():
    policy, recorder = OurPolicy(None), Recorder()
    policy.models = SimpleNamespace()  # no /models: the recorder's version is used
    run_episode(policy, RolloutConfig(), TASK, recorder, "g-1", seed=0)
    assert recorder.started[0]["policy_version"] is None
    (step,) = recorder.steps
    assert "token_ids" not in step and step["tool"] == "submit"
