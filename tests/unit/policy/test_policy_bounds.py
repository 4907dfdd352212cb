"""The policy server's bounds without a model (issue #34): episode contexts by tokens, the key rule
off loopback, the Host rule, tiny sampling values, and redaction that reaches the token ids."""

from __future__ import annotations

import pytest

from producers.errors import ProducerError
from producers.policy.engine.sampling import SamplingParams, filter_logits, pick_rows
from producers.policy.engine.tokenizer import context_length
from producers.policy.requests import PolicyConfig, parse_chat
from producers.policy.server import host_allowed
from producers.policy.turns import Episodes
from producers.redaction import Redactor
from schemas.events import StepRecorded, utc_now


def test_episode_contexts_stay_within_the_token_budget_least_recently_used_first():
    episodes = Episodes(limit=100, token_budget=1_000)
    for n in range(50):
        state = episodes.get(f"t{n}")
        episodes.store(f"t{n}", state, [list(range(90))] * 2)  # 180 tokens each
        assert episodes.tokens <= 1_000
    kept = [n for n in range(50) if episodes.get(f"t{n}").contexts]
    assert kept == list(range(45, 50)) and episodes.tokens == 900
    assert episodes.get("t0").next_step == 0 and episodes.dropped_contexts == 45


def test_one_episode_over_the_whole_budget_keeps_no_context():
    episodes = Episodes(token_budget=10)
    episodes.store("big", episodes.get("big"), [list(range(11))])
    assert episodes.get("big").contexts == [] and episodes.tokens == 0


def test_the_server_refuses_a_non_loopback_address_without_keys():
    with pytest.raises(ProducerError, match="needs API keys"):
        PolicyConfig().check_exposure("0.0.0.0")
    PolicyConfig().check_exposure("127.0.0.1")
    PolicyConfig(api_key_hashes="a" * 64).check_exposure("0.0.0.0")


@pytest.mark.parametrize(
    ("host", "ok"),
    [("127.0.0.1:8000", True), ("[::1]:8000", True), ("LOCALHOST:8000", True), ("10.0.0.5:8000", True),
     ("localhost", False), ("attacker.example:8000", False), ("", False), ("[::1]", False)],
)  # fmt: skip
def test_the_host_header_must_name_this_server(host, ok):
    assert host_allowed(host, "10.0.0.5", 8000, ()) is ok


def test_tiny_temperature_is_greedy_and_tiny_top_p_keeps_the_best_token():
    import torch

    body = {"model": "policy", "messages": [{"role": "user", "content": "x"}]}
    assert parse_chat({**body, "temperature": 1e-300}, {"policy"}).sampling.temperature == 0.0
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    kept = filter_logits(logits, SamplingParams(top_p=1e-300))
    assert torch.isfinite(kept).tolist() == [[False, True, False]]
    assert pick_rows(logits, [(SamplingParams(temperature=1e-300), None, 1)]).tolist() == [1]


def test_the_context_length_is_the_real_limit():
    class Config:
        max_position_embeddings = 4096

    class Tokenizer:
        model_max_length = int(1e30)  # transformers' "not set"

    assert context_length(Tokenizer(), Config()) == 4096
    Tokenizer.model_max_length = 2048
    assert context_length(Tokenizer(), Config()) == 2048
    assert context_length(object(), None) is None


def test_a_redacted_step_from_any_producer_loses_its_token_ids():
    step = StepRecorded(
        event_id="e", trajectory_id="t", occurred_at=utc_now(), producer="sdk", step_index=0,
        thought="key sk-ant-" + "a" * 30, token_ids=[1, 2], logprobs=[-0.1, -0.2], prompt_token_ids=[3],
        token_rl_eligible=True,
    )  # fmt: skip
    out = Redactor.default().redact_event(step)
    assert (out.token_ids, out.logprobs, out.prompt_token_ids, out.token_rl_eligible) == (
        None,
        None,
        None,
        False,
    )
    clean = step.model_copy(update={"thought": "nothing secret"})
    assert Redactor.default().redact_event(clean).token_ids == [1, 2]
