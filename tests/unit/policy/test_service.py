"""One completion through the policy service with a stand-in engine: the OpenAI response and the
recorded step for tool calls, malformed calls and n > 1 (the tiny model never writes a tool call)."""

from __future__ import annotations

import threading

from producers.policy.engine.sampling import Sample, SamplingParams
from producers.policy.requests import parse_chat
from producers.policy.service import PolicyService


class PlainTokenizer:
    """Text in, text out: the history never matches, so later turns fall back to `render`."""

    def apply_chat_template(self, messages, **_):
        return "|".join(m["content"] for m in messages)

    def decode(self, token_ids, **_):
        return "#" * len(token_ids)

    def encode(self, text, **_):
        return [ord(c) % 50 for c in text]


class ScriptedEngine:
    """Renders one token per message and answers with the scripted completions, in turn."""

    model_name, version, tokenizer_hash = "scripted", "v7", "hash"

    def __init__(self, *texts: str):
        self.texts = list(texts)
        self.tokenizer_lock = threading.Lock()
        self.tokenizer = PlainTokenizer()

    def render(self, messages, tools=None):
        return [len(m["content"]) % 50 for m in messages]

    def generate(self, prompt_ids, params: SamplingParams):
        return [Sample([100 + i, 2], [-0.5, -0.1], "stop", self.texts.pop(0)) for i in range(params.n)]

    def decode(self, token_ids):
        return "".join(chr(65 + t % 26) for t in token_ids)


class Spool:
    def __init__(self):
        self.events = []

    def publish(self, event):
        self.events.append(event)
        return 1


def complete(engine, body, trajectory_id="t-1"):
    recorder = Spool()
    service = PolicyService(engine, recorder)
    result = service.complete(parse_chat({"model": "policy", **body}, service.models()), trajectory_id)
    return result, recorder.events


def test_a_tool_call_is_returned_as_tool_calls_and_recorded_as_the_steps_tool():
    text = 'Listing.\n<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>'
    result, (step,) = complete(ScriptedEngine(text), {"messages": [{"role": "user", "content": "go"}]})
    (choice,) = result.body["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Listing."
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"cmd": "ls"}'}
    assert (step.tool, step.params, step.thought, step.finish_reason) == (
        "bash",
        {"cmd": "ls"},
        "Listing.",
        "tool_calls",
    )
    assert step.tool_call_malformed is False and step.policy_version == "v7" == result.policy_version
    assert (step.token_ids, step.logprobs, step.token_continuity) == ([100, 2], [-0.5, -0.1], "first")


def test_a_malformed_tool_call_comes_back_as_text_with_a_flag():
    text = '<tool_call>{"name": "bash", "arguments": {"cmd": </tool_call>'
    result, (step,) = complete(ScriptedEngine(text), {"messages": [{"role": "user", "content": "go"}]})
    message = result.body["choices"][0]["message"]
    assert (
        message["content"] == text and "tool_calls" not in message and message["tool_call_malformed"] is True
    )
    assert step.tool == "" and step.tool_call_malformed is True and step.finish_reason == "stop"


def test_n_samples_are_choices_and_the_step_keeps_the_others():
    engine = ScriptedEngine("one", "two", "three")
    result, (step,) = complete(
        engine, {"messages": [{"role": "user", "content": "go"}], "n": 3, "logprobs": True}
    )
    assert [c["message"]["content"] for c in result.body["choices"]] == ["one", "two", "three"]
    assert [t["logprob"] for t in result.body["choices"][0]["logprobs"]["content"]] == [-0.5, -0.1]
    assert step.thought == "one" and [s["text"] for s in step.samples] == ["two", "three"]
    assert result.body["usage"]["completion_tokens"] == 6


def test_a_request_without_an_episode_is_served_and_not_recorded():
    result, events = complete(ScriptedEngine("hi"), {"messages": [{"role": "user", "content": "go"}]}, None)
    assert result.body["choices"][0]["message"]["content"] == "hi" and events == [] and not result.recorded


def test_the_client_can_give_the_step_index_and_the_count_goes_on_from_it():
    recorder, engine = Spool(), ScriptedEngine("a", "b", "c")
    service = PolicyService(engine, recorder)
    chat = parse_chat({"model": "policy", "messages": [{"role": "user", "content": "go"}]}, service.models())
    service.complete(chat, "t-9", 5)  # e.g. after a restart of the server, the agent knows it is at step 5
    service.complete(chat, "t-9")
    service.complete(chat, "t-other")
    assert [(e.trajectory_id, e.step_index) for e in recorder.events] == [
        ("t-9", 5),
        ("t-9", 6),
        ("t-other", 0),
    ]
