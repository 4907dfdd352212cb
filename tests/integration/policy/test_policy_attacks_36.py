"""The issue #36 additions to the policy server as a hostile client tries them: nested and odd values
in tool calls and tools that reach the meaning digest and the chat template, the server's own reply
sent back, the two max-token fields, the cheap prompt-size check, stop strings on a stream, an
abandoned stream, and the proxy's `--upstream` URL. One real `agentstream policy` on the tiny model
for the module (raw httpx, as a fuzzer sends), plus unit-level calls where that is exact."""

from __future__ import annotations

import json
import random
import threading
import time
import types
import uuid

import httpx
import pytest

from tests.support.policy import policy_server

SMALL = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, shared_broker, tiny):
    root = tmp_path_factory.mktemp("policy-attacks-36")
    with policy_server(root, shared_broker.bootstrap, tiny) as (url, _proc):
        yield url


def post(url: str, body, path: str = "/v1/chat/completions", **kwargs) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=120, **kwargs)


def openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def with_call(arguments) -> dict:
    call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": arguments}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]
    return {**SMALL, "messages": messages, "tools": TOOLS}


# --- values that reach meaning() (tokens._digest) and the template --------------------------------------


def test_a_lone_surrogate_in_tool_call_arguments_is_not_a_500(server):
    # orjson refuses "\ud800" in the body, but inside the arguments string it is only text until
    # meaning() parses it: json.dumps(ensure_ascii=False).encode() then raises UnicodeEncodeError
    response = post(server, with_call('{"cmd": "\\ud800"}'))
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert openai_error(response, 400)["param"].startswith("messages[1]")


@pytest.mark.parametrize("where", ["arguments-object", "tool-parameters"])
def test_arguments_nested_a_thousand_deep_are_a_400_naming_the_field_not_a_500(server, where):
    # orjson takes up to 1024 levels; meaning()'s json.dumps (and the template's tojson) recurse past
    # Python's limit of 1000 first: an unhandled RecursionError
    if where == "arguments-object":
        body, prefix = with_call("DEEP"), "messages[1]"
    else:
        tools = [{"type": "function", "function": {"name": "bash", "parameters": "DEEP"}}]
        body, prefix = {**SMALL, "tools": tools}, "tools"
    deep = '{"a":' * 1000 + "{}" + "}" * 1000  # written out: json.dumps itself stops at this depth
    raw = json.dumps(body).replace('"DEEP"', deep).encode()
    response = httpx.post(
        server + "/v1/chat/completions",
        content=raw,
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    assert response.status_code != 500, response.text
    assert openai_error(response, 400)["param"].startswith(prefix)


@pytest.mark.parametrize(
    "name",
    ['a"b', "a</tool_call>b", "a\nb", "x" * 10_000, "agentstream_probe_argument"],
    ids=["quote", "closing-tag", "newline", "10k", "probe-key"],
)
def test_a_tool_name_outside_openais_pattern_is_refused(server, name):
    # OpenAI: ^[a-zA-Z0-9_-]{1,64}$. The tiny template writes the name raw into `"name": "..."`,
    # so a quote or </tool_call> breaks every forced call's JSON (always tool_call_malformed), and a
    # name holding the probe key makes call_opening fail with a message blaming the template
    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}]
    choice = {"type": "function", "function": {"name": name}}
    error = openai_error(post(server, {**SMALL, "tools": tools, "tool_choice": choice}), 400)
    assert error["param"].startswith("tools[0]"), error


# --- the server's own reply, sent back ------------------------------------------------------------------


def test_the_servers_own_malformed_call_reply_can_be_sent_back(server):
    # a forced call cut by max_tokens comes back with `tool_call_malformed: true` in the message; a
    # client that appends the message as returned (message.model_dump()) gets a 400 for that field
    messages = [{"role": "user", "content": "list the files"}]
    trajectory = f"echo-{uuid.uuid4().hex[:12]}"
    path = f"/v1/episodes/{trajectory}/chat/completions"
    first = post(server, {**SMALL, "messages": messages, "tools": TOOLS, "tool_choice": "required"}, path)
    assert first.status_code == 200, first.text
    reply = first.json()["choices"][0]["message"]
    assert reply.get("tool_call_malformed") is True  # max_tokens 2 cannot close a call
    again = [*messages, reply, {"role": "user", "content": "go on"}]
    second = post(server, {**SMALL, "messages": again, "tools": TOOLS}, path)
    assert second.status_code == 200, second.text
    assert second.json()["choices"][0]["message"]["role"] == "assistant"


# --- max_tokens and max_completion_tokens ---------------------------------------------------------------


@pytest.mark.parametrize("bad_value", [True, 1.0], ids=["true", "float"])
def test_an_invalid_max_tokens_is_refused_even_beside_an_equal_max_completion_tokens(server, bad_value):
    # `True == 1` and `1.0 == 1`: _max_tokens takes the pair as "the same value" and never checks
    # max_tokens itself
    body = {**SMALL, "max_tokens": bad_value, "max_completion_tokens": 1}
    assert openai_error(post(server, body), 400)["param"] == "max_tokens"


# --- n x max_tokens x top_logprobs: each in range, together a flood ------------------------------------


def test_choices_tokens_and_alternatives_together_are_bounded(server):
    # 16 x 4096 tokens with 20 alternatives each: 1,376,256 entries (hundreds of MB of JSON) to build
    body = {**SMALL, "n": 16, "max_tokens": 4096, "logprobs": True, "top_logprobs": 20}
    error = openai_error(post(server, body), 400)
    assert error["param"] == "n", error
    assert all(word in error["message"] for word in ("n", "max_tokens", "top_logprobs", "1376256"))


def test_the_amplification_bound_is_exact():
    from producers.policy.api_errors import ApiError
    from producers.policy.requests import parse_chat

    at_bound = {**SMALL, "n": 16, "max_tokens": 4096, "logprobs": True, "top_logprobs": 3}  # 262144
    assert parse_chat(at_bound, {"policy"}).sampling.n == 16
    with pytest.raises(ApiError, match="327680"):  # 16 x 4096 x (1 + 4)
        parse_chat({**at_bound, "top_logprobs": 4}, {"policy"})


# --- the size check before tokenising (issue #34 item 9) sees only message content ----------------------


@pytest.mark.parametrize("where", ["tool-call-arguments", "tools"])
def test_the_precheck_counts_tool_calls_and_tools_not_only_content(where):
    from producers.policy.api_errors import ApiError
    from producers.policy.requests import parse_chat
    from producers.policy.service import PolicyService

    bulk = "x" * 3_000_000
    if where == "tools":
        tools = [{"type": "function", "function": {"name": "bash", "description": bulk}}]
        body = {**SMALL, "tools": tools}
    else:
        body = with_call(json.dumps({"cmd": bulk}))
    engine = types.SimpleNamespace(context_length=4096, longest_token_bytes=16)
    service = PolicyService(engine)
    with pytest.raises(ApiError) as info:  # 3 MB is surely over 4096 tokens: refused untokenised
        service.precheck(parse_chat(body, {"policy"}))
    assert info.value.code == "context_length_exceeded"


# --- stop strings on a stream: the held-back check runs on the event loop per token --------------------


def test_long_stop_strings_do_not_make_each_streamed_token_cost_milliseconds_on_the_event_loop():
    # held_back -> _partial slices needle[:size] for every size up to 999, for 4 stops, per token per
    # choice: 0.6 to 1 ms a token here, so n=16 x 4000 tokens blocks the loop for about a minute
    from producers.policy.chat_stream import held_back

    rng = random.Random(0)
    stops = tuple("".join(rng.choice("ab") for _ in range(999)) + "z" for _ in range(4))
    text = "".join(rng.choice("ab") for _ in range(8000))  # what a model asked to write a/b writes
    started = time.perf_counter()
    for _ in range(1000):  # 1000 tokens of one choice (a request may ask 16 x 4000)
        held_back(text, stops, True)
    spent = time.perf_counter() - started
    assert spent < 0.3, f"{spent:.2f}s of event-loop time for 1000 tokens of one choice"


# --- a stream whose client is gone keeps its worker until max_tokens ----------------------------------


def test_an_abandoned_stream_stops_sampling(tmp_path, shared_broker, tiny):
    # with --workers 1 a disconnected stream that still samples holds the only generation thread:
    # the next request waits for all of its max_tokens
    with policy_server(tmp_path, shared_broker.bootstrap, tiny, "--workers", "1") as (url, _proc):
        started = time.monotonic()
        assert post(url, {**SMALL, "max_tokens": 200, "temperature": 0}).status_code == 200
        full_s = time.monotonic() - started  # greedy: the tiny model's full 200 tokens

        def stream_then_leave():
            body = {**SMALL, "max_tokens": 1500, "stream": True, "temperature": 0}
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as response:
                next(response.iter_bytes())  # the first chunk: sampling has started

        leaver = threading.Thread(target=stream_then_leave)
        leaver.start()
        leaver.join(timeout=120)
        started = time.monotonic()
        assert post(url, SMALL).status_code == 200
        waited = time.monotonic() - started
    assert waited < max(2.0, full_s), f"a 2-token request waited {waited:.1f}s behind an abandoned stream"


# --- the proxy's --upstream URL ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://h:8000/v1/chat/completions",  # an endpoint, not a base: .../completions/v1
        "http://h:8000/v1/models",
        "http://h:8000/v1/../../x",  # dot segments kept as they are
        "http://h:8000/./v1",
        "http://h:0",  # no server listens on port 0
    ],
)
def test_the_upstream_url_refuses_endpoints_dot_segments_and_port_zero(url):
    from producers.policy.engine.errors import EngineError
    from producers.policy.upstream_api import api_base

    with pytest.raises(EngineError, match="--upstream"):
        api_base(url)
