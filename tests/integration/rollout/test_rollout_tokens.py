"""A rollout against the local policy server (tiny model, real `openai` SDK, embedded broker): the
policy answers in client-records mode, so each step is recorded once, by the rollout's recorder,
with the token ids, prompt delta, continuity and policy version the server reported."""

from __future__ import annotations

import pytest

import producers.envs  # noqa: F401  (registers calc)
from producers.envs.tasks import Task
from producers.rollout.driver import RolloutConfig, run
from producers.sdk.recorder import AgentRecorder
from tests.support.policy import policy_server, recorded_steps


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from consumers.tiny_model import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("models"))


def test_rollout_steps_carry_the_policy_servers_token_fields(tmp_path, broker, tiny):
    task = Task("calc-add", "calc", {"expression": "3 + 4"})
    config = RolloutConfig(group_size=2, concurrency=2, max_tokens=6, max_turns=2)
    with policy_server(tmp_path, broker.bootstrap, tiny) as (url, _proc):
        recorder = AgentRecorder(broker.bootstrap, tmp_path / "sdk", agent="rollout", model="policy")
        try:
            results = run(RolloutConfig(**{**config.__dict__, "policy_url": f"{url}/v1"}), [task], recorder)
            assert recorder.flush(timeout=30)
        finally:
            recorder.close(timeout=30)
    assert len(results) == 2
    for result in results:
        steps = recorded_steps(broker.bootstrap, result.trajectory_id)
        assert [s.step_index for s in steps] == list(range(result.turns))  # recorded once each
        assert {s.producer for s in steps} != {"policy-server"}
        for s in steps:
            assert s.token_ids and len(s.logprobs) == len(s.token_ids) and s.prompt_token_ids
            assert s.prompt_delta_start is not None and s.tokenizer_hash
            assert s.token_continuity in ("first", "ok") and s.policy_version == "base"
            assert s.observation  # the env's answer, in the same event
        assert steps[0].token_continuity == "first" and steps[0].prompt_delta_start == 0
