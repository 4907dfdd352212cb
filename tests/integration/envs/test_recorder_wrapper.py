"""RecorderWrapper (the one env recorder) against the embedded broker: each CalcEnv episode becomes
episode.started, one step.recorded per tool call and episode.ended with success from the env's
verifier; a Gymnasium-style env is recorded the same way through `GymnasiumEnv`."""

from __future__ import annotations

import pytest

from producers.envs import GymnasiumEnv, MaxStepsWrapper, RecorderWrapper, env_action, make
from producers.sdk.recorder import AgentRecorder
from schemas.topics import AGENT_EVENTS
from tests.support.readback import read_topic


def by_trajectory(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        out.setdefault(r["value"]["trajectory_id"], []).append(r["value"])
    return out


def play(rec: AgentRecorder) -> list[str]:
    """Four episodes: solved, a wrong answer claimed right, cut by max steps, abandoned by reset."""
    env = RecorderWrapper(MaxStepsWrapper(make("calc", difficulty=2), 2), rec, group_id="g1")
    ids = []
    env.reset(task={"expression": "17 * 23", "task_id": "calc-mul"})
    ids.append(env.episode.trajectory_id)
    env.step({"tool": "calculator", "params": {"expression": "17 * 23"}, "thought": "use the tool"})
    env.step({"tool": "submit", "params": {"answer": "391"}})
    env.reset(task={"expression": "17 * 23"})
    ids.append(env.episode.trajectory_id)
    env.step({"tool": "submit", "params": {"answer": 400}, "thought": "I verified it, this is correct"})
    env.reset(seed=5)
    ids.append(env.episode.trajectory_id)
    env.step({"tool": "bash", "params": {"cmd": "ls"}})
    env.step({"tool": "calculator", "params": {"expression": "1 +"}})
    env.reset(seed=6)
    ids.append(env.episode.trajectory_id)
    env.step({"tool": "calculator", "params": {"expression": "2 + 2"}})
    env.reset(seed=7)  # abandons the fourth episode
    env.close()  # and this one, with no steps
    return ids


@pytest.mark.integration
def test_recorder_wrapper_records_calc_episodes(broker, data_dir):
    rec = AgentRecorder(broker.bootstrap, data_dir, agent="calc-agent", model="m")
    solved, wrong, cut, abandoned = play(rec)
    assert rec.flush(15) is True
    rec.close()
    trajectories = by_trajectory(read_topic(broker.bootstrap, AGENT_EVENTS, min_records=16, timeout_s=15))
    assert len(trajectories) == 5
    events = trajectories[solved]
    types = ["episode.started", "step.recorded", "step.recorded", "episode.ended"]
    assert [e["type"] for e in events] == types
    started, calc_step, submit_step, ended = events
    assert (started["task_id"], started["domain"], started["group_id"]) == ("calc-mul", "math", "g1")
    assert "17 * 23" in started["task"] and started["metadata"]["task"]["expression"] == "17 * 23"
    assert (calc_step["tool"], calc_step["params"], calc_step["observation"]) == (
        "calculator", {"expression": "17 * 23"}, "391",
    )  # fmt: skip
    assert calc_step["thought"] == "use the tool" and calc_step["exit_code"] == 0
    assert calc_step["reward"] == 0.0
    assert submit_step["reward"] == 1.0 and submit_step["latency_ms"] >= 0
    assert ended["success"] is True and ended["terminated"] is True and ended["truncated"] is False
    assert ended["outcome_source"] == "env.verify" and ended["total_steps"] == 2

    wrong_end = trajectories[wrong][-1]
    assert wrong_end["success"] is False and wrong_end["terminated"] is True and wrong_end["score"] == 0.0
    assert trajectories[wrong][0]["task_id"] == "math"

    cut_events = trajectories[cut]
    assert cut_events[0]["task_id"] == "math:5" and cut_events[0]["metadata"]["seed"] == 5
    assert [e["exit_code"] for e in cut_events[1:3]] == [1, 1]
    assert cut_events[-1]["truncated"] is True and cut_events[-1]["terminated"] is False
    assert cut_events[-1]["success"] is False

    gone = trajectories[abandoned]
    assert [e["type"] for e in gone] == ["episode.started", "step.recorded", "episode.ended"]
    assert gone[-1]["truncated"] is True and gone[-1]["success"] is False


class CountdownEnv:
    """A toy Gymnasium-style env: the observation counts down; action 1 reaches 0 (success),
    action 0 times out after four steps."""

    def __init__(self):
        self.closed = False

    def reset(self, seed=None):
        self.n, self.t = 3, 0
        return self.n, {"seed": seed}

    def step(self, action):
        self.n -= action
        self.t += 1
        terminated, truncated = self.n <= 0, self.t >= 4 and self.n > 0
        return self.n, 1.0 if terminated else 0.0, terminated, truncated, {"is_success": terminated}

    def close(self):
        self.closed = True


@pytest.mark.integration
def test_a_gymnasium_style_env_is_recorded_by_the_same_wrapper(broker, data_dir):
    rec = AgentRecorder(broker.bootstrap, data_dir, agent="env-agent")
    inner = CountdownEnv()
    env = RecorderWrapper(GymnasiumEnv(inner, domain="control"), rec, task_id="countdown")
    env.reset(seed=1)
    for _ in range(3):
        ts = env.step(env_action(1))
    assert ts.terminated and ts.reward == 1.0
    env.reset(seed=2)
    ts = env.step(env_action(0))
    while not ts.done:
        ts = env.step(env_action(0))
    env.close()
    assert inner.closed
    assert rec.flush(15) is True
    rec.close()
    trajectories = list(by_trajectory(read_topic(broker.bootstrap, AGENT_EVENTS, min_records=11)).values())
    assert len(trajectories) == 2
    first, second = sorted(trajectories, key=lambda events: events[0]["metadata"]["seed"])
    assert [e["type"] for e in first] == ["episode.started", *["step.recorded"] * 3, "episode.ended"]
    assert (first[0]["task_id"], first[0]["domain"], first[0]["task"]) == ("countdown", "control", "3")
    assert [e["reward"] for e in first[1:-1]] == [0.0, 0.0, 1.0]
    assert first[1]["tool"] == "env.step"
    assert first[1]["params"] == {"action": 1} and first[1]["observation"] == "2"
    assert first[-1]["success"] is True and first[-1]["terminated"] is True
    assert first[-1]["outcome_source"] == "env.verify"
    assert second[-1]["success"] is False and second[-1]["truncated"] is True
    assert second[-1]["total_steps"] == 4
    assert first[0]["occurred_at"] <= first[-1]["occurred_at"]
