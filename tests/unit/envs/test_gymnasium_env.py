"""`GymnasiumEnv`: a Gymnasium-style env (reset/step tuples) behind the `AgentEnv` protocol, so the
one env recorder and the other wrappers take it (no broker)."""

from __future__ import annotations

import pytest

from producers.envs import EnvError, GymnasiumEnv, MaxStepsWrapper, env_action


class Walk:
    """Position starts at 0; the goal is reached at 2. Infos carry values the recorder cannot type."""

    def __init__(self):
        self.actions = []

    def reset(self, seed=None, options=None):
        self.pos = 0
        return {"pos": 0, "options": options}, {"seed": seed}

    def step(self, action):
        self.actions.append(action)
        self.pos += action[0]
        done = self.pos >= 2
        return {"pos": self.pos}, float(done), done, False, {"error": 3, "exit_code": True, "note": object()}


def test_reset_and_step_become_timesteps_with_text_observations():
    env = GymnasiumEnv(Walk(), domain="walk", decode_action=tuple)
    ts = env.reset(seed=4, task={"level": 1})
    assert ts.observation == '{"pos":0,"options":{"level":1}}' and ts.info == {"seed": 4}
    assert env.verify() is False  # nothing achieved before the first step
    ts = env.step(env_action([1]))
    assert env.env.actions == [(1,)]  # decode_action turned the recorded JSON list back
    assert (ts.observation, ts.reward, ts.done) == ('{"pos":1}', 0.0, False)
    assert "error" not in ts.info and "exit_code" not in ts.info  # not typed as the recorder needs
    assert isinstance(ts.info["note"], str)
    ts = env.step(env_action([1]))
    assert ts.terminated and ts.reward == 1.0 and env.verify() is True
    assert (env.domain, env.available_tools) == ("walk", ["env.step"])


def test_success_follows_is_success_over_the_reward():
    class Claims(Walk):
        def step(self, action):
            obs, reward, terminated, truncated, _ = super().step(action)
            return obs, reward, terminated, truncated, {"is_success": False}

    env = GymnasiumEnv(Claims())
    env.reset()
    env.step(env_action([2]))
    assert env.verify() is False


def test_an_action_without_params_is_refused_naming_it():
    env = GymnasiumEnv(Walk())
    env.reset()
    with pytest.raises(EnvError, match=r"action: expected .* got 1"):
        env.step(1)


def test_the_other_wrappers_take_it():
    env = MaxStepsWrapper(GymnasiumEnv(Walk()), max_steps=1)
    env.reset()
    assert env.step(env_action([0])).truncated
