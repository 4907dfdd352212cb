"""Every OpenAI request field is honoured or refused (issue #36): the checks of both endpoints' bodies,
pure, no model. Also: the bodies our own callers send are accepted as they are."""

from __future__ import annotations

import pytest

from producers.policy.api_errors import ApiError
from producers.policy.openai_fields import CHAT, COMPLETIONS
from producers.policy.requests import parse_chat, parse_completion

MODELS = {"tiny", "policy"}
OK = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
TOKENS = {"model": "policy", "prompt": [1, 2, 3]}


def refused(body: dict, parser=None) -> ApiError:
    with pytest.raises(ApiError) as info:
        (parser or (lambda b: parse_chat(b, MODELS)))(body)
    assert info.value.status == 400 and info.value.body()["error"]["param"] == info.value.param
    return info.value


def test_every_honoured_chat_field_is_read_into_the_request():
    chat = parse_chat(
        {**OK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "bash"}},
         "n": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 4, "max_completion_tokens": 9, "max_tokens": 9,
         "seed": 3, "logprobs": True, "top_logprobs": 5, "stream": True, "stop": ["END", "\n\n"],
         "stream_options": {"include_usage": True}, "response_format": {"type": "text"}},
        MODELS,
    )  # fmt: skip
    assert set(CHAT.honoured) == {
        "model", "messages", "tools", "tool_choice", "n", "temperature", "top_p", "top_k", "max_tokens",
        "max_completion_tokens", "seed", "logprobs", "top_logprobs", "stream", "stream_options", "stop",
        "response_format",
    }  # fmt: skip
    assert (chat.tool_choice, chat.tool_name, chat.stream, chat.include_usage) == (
        "function",
        "bash",
        True,
        True,
    )
    assert (chat.sampling.stop, chat.sampling.top_logprobs, chat.top_logprobs) == (("END", "\n\n"), 5, 5)
    assert (chat.sampling.max_tokens, chat.sampling.n, chat.sampling.top_k, chat.logprobs) == (9, 2, 4, True)
    assert parse_chat({**OK, "stop": "\n"}, MODELS).sampling.stop == ("\n",)
    plain = parse_chat(OK, MODELS)
    assert (plain.tool_choice, plain.stream, plain.sampling.stop, plain.sampling.top_logprobs) == (
        "auto",
        False,
        (),
        0,
    )


@pytest.mark.parametrize("name", ["frequency_penalty", "min_p", "repetition_penalty", "guided_json", "Model"])
def test_an_unknown_or_unsupported_field_is_a_400_naming_it(name):
    error = refused({**OK, name: 0.5})
    assert error.param == name and name in error.message


@pytest.mark.parametrize(
    ("field", "default", "other"),
    [
        ("frequency_penalty", 0, 0.5),
        ("presence_penalty", 0.0, -1),
        ("logit_bias", {}, {"5": 100}),
        ("parallel_tool_calls", True, False),
        ("store", False, True),
        ("metadata", {}, {"k": "v"}),
        ("modalities", ["text"], ["text", "audio"]),
        ("service_tier", "auto", "flex"),
        ("min_p", 0, 0.05),
        ("repetition_penalty", 1.0, 1.05),
    ],
)
def test_a_no_op_field_is_accepted_at_its_default_only(field, default, other):
    assert parse_chat({**OK, field: default}, MODELS).sampling == parse_chat(OK, MODELS).sampling
    assert parse_chat({**OK, field: None}, MODELS).sampling == parse_chat(OK, MODELS).sampling
    error = refused({**OK, field: other})
    assert error.param == field and "only" in error.message and "supported" in error.message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("functions", [{"name": "bash"}]),
        ("function_call", "auto"),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("prediction", {"type": "content", "content": "x"}),
        ("reasoning_effort", "low"),
        ("web_search_options", {}),
        ("user", "u-1"),
        ("verbosity", "low"),
    ],
)
def test_an_openai_field_the_server_cannot_honour_is_refused_unless_null(field, value):
    assert parse_chat({**OK, field: None}, MODELS).model == "policy"
    error = refused({**OK, field: value})
    assert error.param == field and "not supported" in error.message


@pytest.mark.parametrize(
    ("change", "param", "says"),
    [
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "up to 4"),
        ({"stop": ""}, "stop", "1 to"),
        ({"stop": [1]}, "stop", "strings"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm"}}}, "tool_choice",
         "'rm'"),
        ({"tools": TOOLS, "tool_choice": "any"}, "tool_choice", "none, auto, required"),
        ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}, "tool_choice",
         "none"),
        ({"response_format": {"type": "json_object"}}, "response_format", "json_object is not supported"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
         "json_schema is not supported"),
        ({"response_format": "json"}, "response_format", "expected"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed with stream"),
        ({"stream": True, "stream_options": {"chunk": 1}}, "stream_options", "not supported"),
        ({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options",
         "not supported"),
        ({"stream": "yes"}, "stream", "true or false"),
        ({"top_logprobs": 3}, "top_logprobs", "needs logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_tokens", "differs"),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name",
         "not supported"),
        ({"messages": [{"role": "user", "content": "x", "weight": 1}]}, "messages[0].weight", "unknown"),
        ({"messages": [{"role": "assistant", "content": "", "refusal": "no"}]}, "messages[0].refusal", "not"),
        ({"tools": [{"type": "function", "function": {"name": "bash", "strict": True}}]},
         "tools[0].function.strict", "not supported"),
        ({"tools": [{"type": "custom", "custom": {"name": "bash"}}]}, "tools[0]", "expected"),
    ],
)  # fmt: skip
def test_bad_values_of_honoured_fields_are_a_400_naming_the_field(change, param, says):
    error = refused({**OK, **change})
    assert error.param == param and says in error.message, error.message


def test_top_k_minus_one_is_vllms_off_and_read_as_zero():
    for parse in (
        lambda b: parse_chat({**OK, **b}, MODELS),
        lambda b: parse_completion({**TOKENS, **b}, MODELS, 100),
    ):
        assert parse({"top_k": -1}).sampling.top_k == 0 == parse({}).sampling.top_k
        assert parse({"top_k": 7}).sampling.top_k == 7
    for value in (-2, 1.5, "-1", True):
        error = refused({**OK, "top_k": value})
        assert error.param == "top_k" and "[-1, " in error.message, error.message


def test_a_message_dumped_by_the_openai_sdk_is_accepted_with_its_null_fields():
    dumped = {"role": "assistant", "content": "ok", "refusal": None, "audio": None, "function_call": None,
              "annotations": [], "tool_calls": None, "name": None}  # fmt: skip
    chat = parse_chat({**OK, "messages": [*OK["messages"], dumped]}, MODELS)
    assert chat.messages[1] == {"role": "assistant", "content": "ok"}


def test_completions_honour_the_proxys_fields_and_refuse_the_rest():
    from producers.policy.engine.sampling import SamplingParams
    from producers.policy.upstream_api import completion_body

    proxy = completion_body(
        "policy", [1, 2, 3], SamplingParams(max_tokens=4, seed=7, stop=("!",), top_logprobs=3)
    )
    request = parse_completion(proxy, MODELS, 100)  # the neutral values it sends vLLM are no-ops here
    bare = completion_body("policy", [1, 2, 3], SamplingParams(max_tokens=4, seed=7), neutral=False)
    assert parse_completion(bare, MODELS, 100).sampling.seed == 7
    assert (request.logprobs, request.tokens_as_ids, request.return_token_ids) == (3, True, True)
    assert (request.sampling.stop, request.sampling.top_logprobs, request.sampling.seed) == (("!",), 3, 7)
    assert (
        parse_completion({**TOKENS, "skip_special_tokens": False}, MODELS, 100).skip_special_tokens is False
    )
    assert parse_completion({**TOKENS, "best_of": 2, "n": 2, "echo": False}, MODELS, 100).sampling.n == 2
    assert parse_completion(TOKENS, MODELS, 100).return_token_ids is True  # this server's default
    for change, param in [
        ({"suffix": "x"}, "suffix"),
        ({"echo": True}, "echo"),
        ({"stream": True}, "stream"),
        ({"best_of": 3}, "best_of"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"stop": ["a"] * 5}, "stop"),
        ({"messages": []}, "messages"),
        ({"return_token_ids": 1}, "return_token_ids"),
    ]:
        error = refused({**TOKENS, **change}, lambda b: parse_completion(b, MODELS, 100))
        assert error.param == param, (change, error.message)
    assert "model" in COMPLETIONS.honoured and "max_completion_tokens" not in COMPLETIONS.honoured


class Captured(Exception):
    pass


class CapturingCompletions:
    """`client.chat.completions` that keeps what it was asked (what the SDK sends) and stops there."""

    def __init__(self):
        self.kwargs: dict = {}

    def create(self, **kwargs):
        self.kwargs = kwargs
        raise Captured

    async def acreate(self, **kwargs):
        return self.create(**kwargs)


def sdk_body(kwargs: dict) -> dict:
    """The JSON body the openai SDK makes of `create(**kwargs)` (headers are not the body)."""
    return {name: value for name, value in kwargs.items() if not name.startswith("extra_")}


def test_the_rollout_drivers_request_is_accepted_as_it_is_sent():
    from types import SimpleNamespace

    from producers.rollout.driver import RolloutConfig, _turn

    completions = CapturingCompletions()
    client = SimpleNamespace(chat=SimpleNamespace(completions=completions))
    env = SimpleNamespace(available_tools=["calc", "submit"], episode=SimpleNamespace(trajectory_id="t-1"))
    with pytest.raises(Captured):
        _turn(client, RolloutConfig(), env, list(OK["messages"]), "submit", 7, 0)
    chat = parse_chat(sdk_body(completions.kwargs), MODELS | {RolloutConfig().model})
    assert [t["function"]["name"] for t in chat.tools] == ["calc", "submit"] and chat.sampling.seed == 7


def test_the_judges_and_the_benchmarks_requests_are_accepted_as_they_are_sent():
    import asyncio
    from types import SimpleNamespace

    from infra.bench.policy.client_load import chat_body
    from streams.judge.config import JudgeConfig
    from streams.judge.prompt import Prompt
    from streams.judge.providers.openai import OpenAIProvider

    completions = CapturingCompletions()
    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=completions.acreate)))
    config = JudgeConfig(provider="openai", model="policy", api_key="none", max_tokens=16, temperature=0.0)
    with pytest.raises(Captured):
        asyncio.run(OpenAIProvider().send(client, config, Prompt("judge", "the trajectory")))
    assert parse_chat(sdk_body(completions.kwargs), MODELS).sampling.max_tokens == 16
    assert parse_chat(chat_body(3, 16), MODELS).sampling.seed == 3  # `agentstream bench policy`
