"""Streaming, stop strings, tool_choice and top_logprobs through the policy service and its aiohttp app,
with a stand-in engine that samples scripted texts as the tiny tokenizer's tokens (calling `on_token`
per token, stopping at stop strings as the engine contract says). No model."""

from __future__ import annotations

import asyncio
import threading

import orjson
import pytest

from producers.policy.engine.sampling import Sample, cut_at_stop
from producers.policy.requests import PolicyConfig, parse_chat, parse_completion
from producers.policy.server import create_app
from producers.policy.service import PolicyService, Stream

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
USER = [{"role": "user", "content": "go"}]
CALL = 'Listing.\n<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    from consumers.tiny_model import train_tokenizer

    return train_tokenizer()


class TokenEngine:
    """Answers with the scripted texts in turn, token by token (the tiny tokenizer's)."""

    model_name, version, tokenizer_hash = "scripted", "v3", "hash"
    context_length = 4096

    def __init__(self, tokenizer, *texts: str):
        self.tokenizer, self.texts, self.prompts = tokenizer, list(texts), []
        self.tokenizer_lock = threading.Lock()

    def render(self, messages, tools=None):
        with self.tokenizer_lock:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )

    def decode(self, token_ids):
        with self.tokenizer_lock:
            return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def generate(self, prompt_ids, params, on_token=None):
        self.prompts.append(list(prompt_ids))
        return [self._sample(choice, params, on_token) for choice in range(params.n)]

    def _sample(self, choice, params, on_token) -> Sample:
        with self.tokenizer_lock:
            ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)
        kept, finish = [], "length"
        for token in ids:
            kept.append(token)
            if on_token is not None:
                on_token(choice, token)
            if cut_at_stop(self.decode(kept), params.stop)[1]:
                finish = "stop"
                break
        top = [[(t, -0.25), (t + 1, -2.5), (t + 2, -3.0)][: params.top_logprobs] for t in kept]
        text = cut_at_stop(self.decode(kept), params.stop)[0]
        return Sample(
            kept, [-0.5] * len(kept), finish, text, top_logprobs=top if params.top_logprobs else None
        )


class Spool:
    def __init__(self):
        self.events = []

    def publish(self, event):
        self.events.append(event)
        return 1


def post(service, body: dict, path: str = "/v1/episodes/t-1/chat/completions"):
    """(status, JSON body or the list of SSE data items) of one request to the app."""

    async def go():
        from aiohttp.test_utils import TestClient, TestServer

        async with TestClient(TestServer(create_app(PolicyConfig(), service))) as http:
            response = await http.post(path, json={"model": "policy", **body})
            raw = await response.read()
            if response.content_type != "text/event-stream":
                return response.status, orjson.loads(raw)
            events = [line[len(b"data: ") :] for line in raw.split(b"\n\n") if line]
            return response.status, [e.decode() if e == b"[DONE]" else orjson.loads(e) for e in events]

    return asyncio.run(go())


def contents(chunks: list, index: int = 0) -> list[str]:
    return [
        c["delta"]["content"]
        for chunk in chunks[:-1]
        for c in chunk["choices"]
        if c["index"] == index and c["delta"].get("content")
    ]


def test_a_stream_sends_the_role_then_deltas_that_join_to_the_plain_answer_and_records_once(tokenizer):
    text = "Hello wörld 🙂, the tests pass: 4 of 4. Done."
    spool = Spool()
    service = PolicyService(TokenEngine(tokenizer, text, text), spool)
    status, plain = post(service, {"messages": USER, "seed": 1}, "/v1/episodes/plain/chat/completions")
    status, chunks = post(
        service, {"messages": USER, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert status == 200 and chunks[-1] == "[DONE]"
    assert chunks[0]["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    ]
    deltas = contents(chunks)
    assert "".join(deltas) == plain["choices"][0]["message"]["content"] == text and len(deltas) > 3
    assert all(c["object"] == "chat.completion.chunk" and c["policy_version"] == "v3" for c in chunks[:-1])
    finishes = [c["finish_reason"] for chunk in chunks[:-2] for c in chunk["choices"]]
    assert (
        finishes[-1] == plain["choices"][0]["finish_reason"] == "length"
        and finishes.count(None) == len(finishes) - 1
    )
    usage = chunks[-2]
    assert usage["choices"] == [] and usage["usage"] == plain["usage"]
    assert all(chunk["usage"] is None for chunk in chunks[:-2])
    plain_step, stream_step = spool.events
    assert stream_step.trajectory_id == "t-1" and stream_step.token_ids == plain_step.token_ids
    assert stream_step.thought == text and len(spool.events) == 2


def test_a_stop_string_is_never_sent_not_even_in_part(tokenizer):
    text = "The answer is 42. ENDING here, never sent"
    service = PolicyService(TokenEngine(tokenizer, text), Spool())
    _, chunks = post(service, {"messages": USER, "stream": True, "stop": ["END", "42!"]})
    final = "The answer is 42. "
    sent = ""
    for delta in contents(chunks):
        sent += delta
        assert final.startswith(sent), sent  # nothing sent is ever taken back
    assert sent == final
    assert [c["finish_reason"] for c in chunks[-2]["choices"]] == ["stop"]


def test_a_streamed_tool_call_comes_as_tool_calls_at_the_end_never_as_text(tokenizer):
    service = PolicyService(TokenEngine(tokenizer, CALL), Spool())
    _, chunks = post(service, {"messages": USER, "tools": TOOLS, "stream": True})
    assert "".join(contents(chunks)) == "Listing." and all("<" not in d for d in contents(chunks))
    (calls,) = [
        c["delta"]["tool_calls"]
        for chunk in chunks[:-1]
        for c in chunk["choices"]
        if "tool_calls" in c["delta"]
    ]
    assert calls[0]["index"] == 0 and calls[0]["function"] == {"name": "bash", "arguments": '{"cmd": "ls"}'}
    assert calls[0]["id"].startswith("call_") and chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_n_streamed_choices_each_start_with_their_role_and_keep_their_index(tokenizer):
    service = PolicyService(TokenEngine(tokenizer, "first answer", "second answer"), Spool())
    _, chunks = post(service, {"messages": USER, "stream": True, "n": 2})
    roles = [c["index"] for chunk in chunks[:2] for c in chunk["choices"] if c["delta"].get("role")]
    assert roles == [0, 1]
    assert ("".join(contents(chunks, 0)), "".join(contents(chunks, 1))) == ("first answer", "second answer")
    finishes = [c["index"] for chunk in chunks[:-1] for c in chunk["choices"] if c["finish_reason"]]
    assert finishes == [0, 1]


def test_an_error_before_the_first_token_is_a_plain_json_error(tokenizer):
    engine = TokenEngine(tokenizer, "never")
    engine.context_length = 8  # the rendered prompt does not fit
    status, body = post(PolicyService(engine, Spool()), {"messages": USER, "stream": True, "max_tokens": 4})
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"


def test_a_completion_whose_client_left_is_not_recorded_and_the_step_is_asked_again(tokenizer):
    spool = Spool()
    service = PolicyService(TokenEngine(tokenizer, "left", "again"), spool)
    chat = parse_chat({"model": "policy", "messages": USER, "stream": True}, service.models())
    stream = Stream()
    stream.abandoned.set()
    result = service.complete(chat, "t-left", None, False, stream)
    assert not result.recorded and spool.events == []
    state = service.episodes.get("t-left")
    assert (state.next_step, state.contexts) == (0, [])
    service.complete(chat, "t-left")
    assert [(e.step_index, e.thought, e.token_continuity) for e in spool.events] == [(0, "again", "first")]


@pytest.mark.parametrize(
    ("choice", "sampled", "opening"),
    [
        ({"type": "function", "function": {"name": "bash"}}, '{"cmd": "ls"}}</tool_call>',
         '\n<tool_call>{"name": "bash", "arguments": '),
        ("required", 'bash", "arguments": {"cmd": "ls"}}</tool_call>', '\n<tool_call>{"name": "'),
    ],
)  # fmt: skip
def test_a_forced_call_opens_in_the_prompt_and_the_answer_is_opening_plus_sample(
    tokenizer, choice, sampled, opening
):
    spool = Spool()
    engine = TokenEngine(tokenizer, sampled, sampled)
    service = PolicyService(engine, spool)
    _, body = post(service, {"messages": USER, "tools": TOOLS, "tool_choice": choice})
    forced = tokenizer.encode(opening, add_special_tokens=False)
    assert engine.prompts[0][-len(forced) :] == forced and engine.prompts[0][: -len(forced)] == engine.render(
        USER, TOOLS
    )
    message = body["choices"][0]["message"]
    assert message["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"cmd": "ls"}'}
    (step,) = spool.events
    assert step.prompt_token_ids[-len(forced) :] == forced and (step.tool, step.params) == (
        "bash",
        {"cmd": "ls"},
    )
    assert step.token_ids == tokenizer.encode(
        sampled, add_special_tokens=False
    )  # the opening was not sampled
    _, chunks = post(service, {"messages": USER, "tools": TOOLS, "tool_choice": choice, "stream": True})
    assert contents(chunks) == []  # a forced answer is a call: sent whole when it ends
    assert any("tool_calls" in c["delta"] for chunk in chunks[:-1] for c in chunk["choices"])


def test_tool_choice_none_keeps_the_tools_in_the_prompt_and_returns_a_call_as_text(tokenizer):
    spool = Spool()
    engine = TokenEngine(tokenizer, CALL)
    _, body = post(PolicyService(engine, spool), {"messages": USER, "tools": TOOLS, "tool_choice": "none"})
    (choice,) = body["choices"]
    assert (
        choice["message"] == {"role": "assistant", "content": CALL}
        and choice["finish_reason"] != "tool_calls"
    )
    assert engine.prompts[0] == engine.render(USER, TOOLS) and spool.events[0].tool == ""


def test_top_logprobs_are_the_engines_alternatives_in_the_answer_and_the_stream(tokenizer):
    service = PolicyService(TokenEngine(tokenizer, "ok then", "ok then"), Spool())
    body = {"messages": USER, "logprobs": True, "top_logprobs": 2}
    _, plain = post(service, body)
    content = plain["choices"][0]["logprobs"]["content"]
    first = content[0]
    assert [a["logprob"] for a in first["top_logprobs"]] == [-0.25, -2.5]
    token_id = tokenizer.encode("ok then", add_special_tokens=False)[0]
    assert first["top_logprobs"][1]["token"] == tokenizer.decode([token_id + 1])
    assert first["top_logprobs"][1]["bytes"] == list(first["top_logprobs"][1]["token"].encode())
    _, chunks = post(service, {**body, "stream": True})
    (last,) = [c for chunk in chunks[:-1] for c in chunk["choices"] if c["finish_reason"]]
    assert last["logprobs"] == plain["choices"][0]["logprobs"]


def test_token_in_completions_honour_logprobs_token_ids_and_special_tokens(tokenizer):
    text = "fine<|im_end|>"
    service = PolicyService(TokenEngine(tokenizer, text, text, text))
    ids = tokenizer.encode(text, add_special_tokens=False)

    def complete(**fields):
        body = {"model": "policy", "prompt": [1, 2], **fields}
        return service.complete_tokens(parse_completion(body, service.models(), len(tokenizer))).body

    keyed = complete(logprobs=2, return_tokens_as_token_ids=True)["choices"][0]
    assert keyed["token_ids"] == ids and keyed["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids]
    assert keyed["logprobs"]["top_logprobs"][0] == {
        f"token_id:{ids[0]}": -0.25,
        f"token_id:{ids[0] + 1}": -2.5,
    }
    assert keyed["text"] == "fine"
    bare = complete(return_token_ids=False, skip_special_tokens=False)
    assert "token_ids" not in bare["choices"][0] and "prompt_token_ids" not in bare
    assert bare["choices"][0]["text"] == text and bare["choices"][0]["logprobs"]["top_logprobs"] is None
    assert complete()["prompt_token_ids"] == [1, 2]
