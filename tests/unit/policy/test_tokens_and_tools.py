"""Token continuity, tool-call parsing and request checks of the policy server: pure, no model."""

from __future__ import annotations

import pytest

from producers.policy.api_errors import ApiError
from producers.policy.requests import AUTO_WORKERS, PolicyConfig, parse_chat
from producers.policy.tokens import first_difference, prompt_delta, reconstruct
from producers.policy.tool_calls import parse

MODELS = {"tiny", "policy"}
OK = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


def test_a_prompt_that_extends_the_context_stores_only_the_new_tokens():
    delta = prompt_delta([5, 6, 7], [5, 6, 7, 8])
    assert (delta.start, delta.token_ids, delta.continuity, delta.rl_eligible) == (3, [8], "ok", True)


def test_a_rerendered_history_breaks_at_the_first_differing_position():
    delta = prompt_delta([5, 6, 7, 8], [5, 6, 9, 8, 1])
    assert (delta.start, delta.break_at, delta.continuity, delta.rl_eligible) == (2, 2, "broken", False)
    assert first_difference([1, 2, 3], [1, 2]) == 2  # a shorter prompt breaks where it ends


def test_stored_deltas_reconstruct_every_turn_also_after_a_break():
    turns = [(0, [1, 2], [3, 4]), (4, [5], [6]), (2, [9, 9], [7])]
    assert reconstruct(turns) == [[1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [1, 2, 9, 9, 7]]


def test_tool_calls_are_parsed_and_a_malformed_one_is_returned_as_text():
    parsed = parse('I will look.\n<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>')
    assert parsed.text == "I will look." and not parsed.malformed
    assert parsed.calls[0].openai("c1")["function"] == {"name": "bash", "arguments": '{"cmd": "ls"}'}
    string_args = parse('<tool_call>{"name": "bash", "arguments": "{\\"cmd\\": \\"ls\\"}"}</tool_call>')
    assert string_args.calls[0].arguments == {"cmd": "ls"}
    for text in (
        '<tool_call>{"name": "bash", "arguments": </tool_call>',
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>',
        'cut short <tool_call>{"name": "ba',
    ):
        parsed = parse(text)
        assert parsed.malformed and parsed.text == text and parsed.calls == []
    assert parse("plain text").calls == [] and not parse("plain text").malformed


def test_a_chat_request_is_checked_field_by_field():
    chat = parse_chat(
        {**OK, "temperature": 0, "top_p": 0.9, "top_k": 5, "n": 2, "seed": 3, "max_tokens": 9}, MODELS
    )
    assert (chat.sampling.temperature, chat.sampling.top_k, chat.sampling.n, chat.sampling.max_tokens) == (
        0.0,
        5,
        2,
        9,
    )
    assert parse_chat({**OK, "max_completion_tokens": 7}, MODELS).sampling.max_tokens == 7
    parts = parse_chat(
        {**OK, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}, MODELS
    )
    assert parts.messages == [{"role": "user", "content": "a"}]


@pytest.mark.parametrize(
    ("change", "status", "named"),
    [
        ({"temperature": 3}, 400, "temperature: expected a number in [0.0, 2.0], got 3"),
        ({"top_p": 0}, 400, "top_p"),
        ({"n": 0}, 400, "n: expected an integer in [1, 16], got 0"),
        ({"max_tokens": "many"}, 400, "max_tokens: expected an integer in [1, 4096], got 'many'"),
        ({"logprobs": "yes"}, 400, "logprobs: expected true or false, got 'yes'"),
        ({"messages": []}, 400, "messages: expected a non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
        ({"tools": [{"type": "function"}]}, 400, "tools[0]"),
        ({"model": "gpt-9"}, 404, "model: 'gpt-9' is not served here"),
    ],
)
def test_bad_fields_are_named_with_their_value(change, status, named):
    with pytest.raises(ApiError) as info:
        parse_chat({**OK, **change}, MODELS)
    assert info.value.status == status and named in info.value.message
    assert info.value.body()["error"]["message"] == info.value.message


def test_the_config_checks_key_hashes_and_workers():
    from producers.errors import ProducerError

    with pytest.raises(ProducerError, match="workers"):
        PolicyConfig(workers=-1)
    assert PolicyConfig(workers=0).generation_threads() == AUTO_WORKERS > 1  # 0: auto, never serialised
    assert PolicyConfig(workers=3).generation_threads() == 3
    with pytest.raises(ProducerError, match="sha256"):
        PolicyConfig(api_key_hashes="abc")
