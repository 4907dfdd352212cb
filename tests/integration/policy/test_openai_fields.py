"""Every OpenAI field honoured or refused (issue #36), with the real `openai` SDK against one real
`agentstream policy` process on the tiny model: streaming (the deltas are the plain answer, the step
is recorded once; a client that leaves mid-stream leaves no step), stop strings, each tool_choice,
top_logprobs, and the 400s for response_format JSON modes and unknown fields on both endpoints."""

from __future__ import annotations

import time
import uuid

import httpx
import openai
import pytest

from tests.support.policy import policy_server, recorded_steps
from tests.support.processes import wait_for

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]
USER = [{"role": "user", "content": "List the files, then read main.py."}]
SAMPLING = {"max_tokens": 24, "temperature": 1.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory, shared_broker, tiny):
    root = tmp_path_factory.mktemp("policy-fields")
    with policy_server(root, shared_broker.bootstrap, tiny) as (url, _proc):
        yield url


def api(url: str, trajectory_id: str | None = None) -> openai.OpenAI:
    base = f"{url}/v1/episodes/{trajectory_id}" if trajectory_id else f"{url}/v1"
    return openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=300)


def episode(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:12]}"


def one_step(bootstrap: str, trajectory_id: str):
    steps = wait_for(
        lambda: recorded_steps(bootstrap, trajectory_id), timeout_s=60, what=f"{trajectory_id}'s step"
    )
    assert len(steps) == 1, [s.step_index for s in steps]
    return steps[0]


def streamed(stream) -> tuple[dict[int, list[str]], list]:
    """The content deltas per choice index, and every chunk."""
    chunks = list(stream)
    deltas: dict[int, list[str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.delta.content:
                deltas.setdefault(choice.index, []).append(choice.delta.content)
    return deltas, chunks


def test_a_stream_is_the_plain_answer_token_by_token_recorded_once(server, shared_broker):
    plain_id, stream_id = episode("plain"), episode("stream")
    plain = api(server, plain_id).chat.completions.create(model="policy", messages=USER, seed=5, **SAMPLING)
    deltas, chunks = streamed(
        api(server, stream_id).chat.completions.create(
            model="policy",
            messages=USER,
            seed=5,
            stream=True,
            stream_options={"include_usage": True},
            **SAMPLING,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(deltas[0]) == plain.choices[0].message.content and len(deltas[0]) > 1
    finishes = [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
    assert finishes == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == plain.usage.model_dump()
    assert all(chunk.usage is None for chunk in chunks[:-1])
    recorded, expected = (
        one_step(shared_broker.bootstrap, stream_id),
        one_step(shared_broker.bootstrap, plain_id),
    )
    assert (
        recorded.token_ids == expected.token_ids and len(recorded.token_ids) == plain.usage.completion_tokens
    )
    assert recorded.prompt_token_ids == expected.prompt_token_ids and recorded.thought == expected.thought
    assert max(abs(a - b) for a, b in zip(recorded.logprobs, expected.logprobs, strict=True)) < 1e-4


def test_n_streamed_choices_keep_their_index_and_text(server):
    body = {"model": "policy", "messages": USER, "seed": 9, "n": 2, **SAMPLING}
    plain = api(server).chat.completions.create(**body)
    deltas, _ = streamed(api(server).chat.completions.create(**body, stream=True))
    assert ["".join(deltas.get(i, [])) for i in (0, 1)] == [c.message.content for c in plain.choices]
    assert plain.choices[0].message.content != plain.choices[1].message.content


def test_a_stop_string_ends_the_answer_and_is_never_returned_nor_streamed(server):
    body = {"model": "policy", "messages": USER, "seed": 11, **SAMPLING}
    free = api(server).chat.completions.create(**body).choices[0].message.content
    assert len(free) >= 12, free
    stop = free[8:11]
    expected = free[: free.find(stop)]
    stopped = api(server).chat.completions.create(**body, stop=[stop, "never-there"])
    assert (stopped.choices[0].message.content, stopped.choices[0].finish_reason) == (expected, "stop")
    deltas, _ = streamed(api(server).chat.completions.create(**body, stop=stop, stream=True))
    assert "".join(deltas.get(0, [])) == expected


@pytest.mark.parametrize(
    ("choice", "opening"),
    [
        ({"type": "function", "function": {"name": "bash"}}, '\n<tool_call>{"name": "bash", "arguments": '),
        ("required", '\n<tool_call>{"name": "'),
    ],
)
def test_a_forced_tool_choice_opens_the_call_in_the_prompt(server, shared_broker, tokenizer, choice, opening):
    trajectory_id = episode("forced")
    reply = api(server, trajectory_id).chat.completions.create(
        model="policy", messages=USER, tools=TOOLS, tool_choice=choice, seed=3, **SAMPLING
    )
    message = reply.choices[0].message
    if message.tool_calls:  # the tiny model rarely closes a call; when it does, it is this function's
        assert choice == "required" or message.tool_calls[0].function.name == "bash"
    else:
        assert message.content.startswith(opening) and message.model_extra["tool_call_malformed"] is True
    step = one_step(shared_broker.bootstrap, trajectory_id)
    forced = tokenizer.encode(opening, add_special_tokens=False)
    assert step.prompt_token_ids[-len(forced) :] == forced  # the opening is the prompt's, not sampled
    assert (
        len(step.token_ids) == reply.usage.completion_tokens
        and step.input_tokens == reply.usage.prompt_tokens
    )
    # the answer sent back as the client got it continues the episode token for token
    back = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        back["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    api(server, trajectory_id).chat.completions.create(
        model="policy",
        messages=[*USER, back, {"role": "user", "content": "go on"}],
        tools=TOOLS,
        max_tokens=2,
    )
    steps = wait_for(
        lambda: (s := recorded_steps(shared_broker.bootstrap, trajectory_id)) and len(s) == 2 and s
    )
    assert steps[1].token_continuity == "ok", steps[1].token_continuity_break


def test_tool_choice_none_and_auto_see_the_same_prompt_and_none_returns_no_calls(server, shared_broker):
    ids = {choice: episode(f"choice-{choice}") for choice in ("none", "auto")}
    for choice, trajectory_id in ids.items():
        reply = api(server, trajectory_id).chat.completions.create(
            model="policy", messages=USER, tools=TOOLS, tool_choice=choice, seed=4, **SAMPLING
        )
        if choice == "none":
            assert (
                reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason != "tool_calls"
            )
    none, auto = (one_step(shared_broker.bootstrap, ids[c]) for c in ("none", "auto"))
    assert none.prompt_token_ids == auto.prompt_token_ids and none.tool == ""
    with pytest.raises(openai.BadRequestError) as info:
        api(server).chat.completions.create(
            model="policy",
            messages=USER,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "rm"}},
        )
    assert info.value.body["param"] == "tool_choice" and "'rm'" in info.value.body["message"]


def test_top_logprobs_are_real_alternatives_in_the_answer_and_the_stream(server):
    body = {"model": "policy", "messages": USER, "seed": 6, "logprobs": True, "top_logprobs": 3, **SAMPLING}
    content = api(server).chat.completions.create(**body).choices[0].logprobs.content
    assert content and all(len(t.top_logprobs) == 3 for t in content)
    for token in content:
        values = [alt.logprob for alt in token.top_logprobs]
        assert values == sorted(values, reverse=True) and values[0] < 0
        same = [alt.logprob for alt in token.top_logprobs if alt.token == token.token]
        # the sampled token is among the alternatives with its own logprob, or less likely than all
        assert (same and abs(same[0] - token.logprob) < 1e-5) or token.logprob <= values[-1] + 1e-5
    assert len({alt.token for t in content for alt in t.top_logprobs}) > 3  # not one fixed list
    _, chunks = streamed(api(server).chat.completions.create(**body, stream=True))
    (final,) = [c for chunk in chunks for c in chunk.choices if c.finish_reason]
    assert [t.model_dump() for t in final.logprobs.content] == [t.model_dump() for t in content]


def test_response_format_json_and_unknown_fields_are_400s_naming_them(server):
    cases = [
        ({"response_format": {"type": "json_object"}}, "response_format", "json_object is not supported"),
        ({"extra_body": {"guided_regex": "a+"}}, "guided_regex", "unknown field"),
        ({"extra_body": {"min_p": 0.1}}, "min_p", "only 0"),
        ({"frequency_penalty": 0.5}, "frequency_penalty", "only 0"),
        ({"parallel_tool_calls": False, "tools": TOOLS}, "parallel_tool_calls", "only true"),
        ({"user": "someone"}, "user", "not supported"),
    ]
    for fields, param, says in cases:
        with pytest.raises(openai.BadRequestError) as info:
            api(server).chat.completions.create(model="policy", messages=USER, max_tokens=2, **fields)
        assert info.value.body["param"] == param and says in info.value.body["message"], info.value.body
    ok = api(server).chat.completions.create(
        model="policy", messages=USER, max_tokens=2, frequency_penalty=0, response_format={"type": "text"}
    )
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_token_in_completions_refuse_unknown_fields_and_key_alternatives_by_id(server):
    response = httpx.post(
        f"{server}/v1/completions",
        json={"model": "policy", "prompt": [5, 6, 7], "max_tokens": 2, "guided_regex": "a+"},
        timeout=60,
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "guided_regex"
    reply = api(server).completions.create(
        model="policy", prompt=[5, 6, 7], max_tokens=4, seed=1, logprobs=2,
        extra_body={"return_tokens_as_token_ids": True},
    )  # fmt: skip
    choice = reply.choices[0]
    ids = choice.model_extra["token_ids"]
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in ids]
    assert all(
        len(top) == 2 and all(k.startswith("token_id:") for k in top) for top in choice.logprobs.top_logprobs
    )


def test_a_client_that_leaves_mid_stream_leaves_no_step(server, shared_broker):
    trajectory_id = episode("left")
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "temperature": 0,
            "max_tokens": 600, "stream": True}  # fmt: skip
    url = f"{server}/v1/episodes/{trajectory_id}/chat/completions"
    started = time.monotonic()
    with httpx.stream("POST", url, json=body, timeout=300) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # one content delta arrived: the client goes
    left_after = time.monotonic() - started
    # the same episode's next turn waits for the abandoned one, then is its step 0
    again = httpx.post(
        url,
        json={"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"X-Agentstream-Record": "client"},
        timeout=300,
    )
    assert again.status_code == 200 and again.json()["agentstream"]["step_index"] == 0
    assert again.json()["agentstream"]["token_continuity"] == "first"
    marker = episode("after-left")  # recorded after the abandoned completion ended
    api(server, marker).chat.completions.create(model="policy", messages=USER, max_tokens=2)
    one_step(shared_broker.bootstrap, marker)
    assert recorded_steps(shared_broker.bootstrap, trajectory_id) == [], f"left after {left_after:.1f}s"
