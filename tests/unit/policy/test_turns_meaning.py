"""Token continuity by meaning (producers/policy/turns.py, tokens.py) with both built-in chat templates
and the real tiny tokenizer; the completions are scripted (no model): a tool call sampled in another
form than the template renders it stays `ok`, an edited history breaks where it was edited."""

from __future__ import annotations

import json
import threading

import pytest

from producers.policy.engine.sampling import Sample
from producers.policy.requests import parse_chat
from producers.policy.service import PolicyService
from producers.policy.tokens import first_difference, matched, meaning, tools_meaning
from producers.policy.tool_calls import parse
from producers.policy.turns import Episodes, build_prompt

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
SYSTEM = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "Read main.py, then test.py."}
# What the model wrote: the first call in another key order and spacing than either template renders;
# the second as the template renders it up to the path's value, then other spacing.
FIRST = '<tool_call>\n{"arguments":{"path":"main.py"},  "name":"read"}\n</tool_call>'
SECOND = {
    "tools": '<tool_call>\n{"name": "read", "arguments": {"path": "test.py", "lines":[1,2]}}\n</tool_call>',
    "chatml": '\n<tool_call>{"name": "read", "arguments": {"path": "test.py", "lines":[1,2]}}</tool_call>',
}


@pytest.fixture(scope="module", params=["chatml", "tools"])
def template(request):
    from consumers.tiny_model import train_tokenizer

    return request.param, train_tokenizer(chat_template=request.param)


class ScriptedEngine:
    """The tiny tokenizer and chat template; each call answers the next scripted completions, as
    text, tokenised with the stop token after them unless `cut` (cut by max_tokens)."""

    model_name, version, tokenizer_hash = "tiny", "v1", "hash"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.tokenizer_lock = threading.Lock()
        self.stop_ids = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        self.script: list[list[tuple[str, bool]]] = []
        self.prompts: list[list[int]] = []
        self.samples: list[list[Sample]] = []

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def render(self, messages, tools=None):
        return self.encode(self.text(messages, tools))

    def text(self, messages, tools=None, generation=True) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=generation, tokenize=False
        )

    def decode(self, token_ids, skip=True):
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip)

    def generate(self, prompt_ids, params):
        self.prompts.append(list(prompt_ids))
        samples = []
        for text, cut in self.script.pop(0):
            ids = self.encode(text) + ([] if cut else self.stop_ids)
            samples.append(Sample(ids, [-0.5] * len(ids), "length" if cut else "stop", text))
        self.samples.append(samples)
        return samples


class Spool:
    def __init__(self):
        self.events = []

    def publish(self, event):
        self.events.append(event)


class Agent:
    """A client of one episode: sends the conversation, appends the reply it chose."""

    def __init__(self, engine, trajectory_id="t-1"):
        self.engine, self.trajectory_id = engine, trajectory_id
        self.spool = Spool()
        self.service = PolicyService(engine, self.spool)
        self.messages = [SYSTEM, USER]

    def turn(self, *completions: str | tuple[str, bool], messages=None, n=1) -> dict:
        self.engine.script.append([c if isinstance(c, tuple) else (c, False) for c in completions])
        body = {"model": "policy", "messages": messages or self.messages, "tools": TOOLS, "n": n}
        request = parse_chat(body, self.service.models())
        return self.service.complete(request, self.trajectory_id).body

    @property
    def steps(self):
        return self.spool.events

    def context(self, step: int, sample: int = 0) -> list[int]:
        """What the model saw and wrote at `step` (prompt + sampled tokens)."""
        return [*self.engine.prompts[step], *self.engine.samples[step][sample].token_ids]


def reserialised(message: dict, as_object: bool = False) -> dict:
    """The reply as a client sends it back with its own JSON: keys sorted, other spacing."""
    sent = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        sent["tool_calls"] = []
        for call in message["tool_calls"]:
            arguments = json.loads(call["function"]["arguments"])
            if not as_object:
                arguments = json.dumps(arguments, sort_keys=True, indent=2)
            function = {"name": call["function"]["name"], "arguments": arguments}
            sent["tool_calls"].append({"id": call["id"], "type": "function", "function": function})
    return sent


def tool_result(message: dict, content: str) -> dict:
    return {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": content}


def test_a_tool_conversation_re_rendered_and_re_serialised_is_ok_on_every_turn(template):
    name, tokenizer = template
    engine = ScriptedEngine(tokenizer)
    agent = Agent(engine)
    first = agent.turn(FIRST)["choices"][0]["message"]
    assert first["tool_calls"][0]["function"] == {"name": "read", "arguments": '{"path": "main.py"}'}
    agent.messages += [reserialised(first), tool_result(first, "print('hi')")]
    second = agent.turn(SECOND[name])["choices"][0]["message"]
    agent.messages += [reserialised(second, as_object=True), tool_result(second, "assert True")]
    agent.turn("Both read.")
    agent.messages += [{"role": "assistant", "content": "Both read."}, {"role": "user", "content": "Thanks."}]
    agent.turn("Bye.")

    assert [s.token_continuity for s in agent.steps] == ["first", "ok", "ok", "ok"]
    assert all(s.token_rl_eligible and s.token_continuity_break is None for s in agent.steps)
    for step in (1, 2, 3):  # the model's own tokens, the stop token included, start the next prompt
        context = agent.context(step - 1)
        assert engine.prompts[step][: len(context)] == context
        assert agent.steps[step].prompt_delta_start == len(context)
        assert agent.steps[step].prompt_token_ids == engine.prompts[step][len(context) :]
    # what follows the reply is the rest of its end of turn and the tool result, as the template has them
    observation = {
        "tools": "\n<|im_start|>user\n<tool_response>\nprint('hi')\n</tool_response><|im_end|>\n",
        "chatml": "\n<|im_start|>tool\nprint('hi')<|im_end|>\n",
    }[name]
    assert (
        engine.decode(agent.steps[1].prompt_token_ids, skip=False) == observation + "<|im_start|>assistant\n"
    )
    # matching by text would have broken: the template renders the calls otherwise than sampled
    rendered = engine.text(agent.messages[:4], TOOLS)
    assert not rendered.startswith(engine.decode(agent.context(0), skip=False))


def test_an_edited_user_message_breaks_inside_that_message(template):
    _, tokenizer = template
    engine = ScriptedEngine(tokenizer)
    agent = Agent(engine)
    first = agent.turn(FIRST)["choices"][0]["message"]
    agent.messages += [reserialised(first), tool_result(first, "print('hi')")]
    edited = [SYSTEM, {"role": "user", "content": "Read setup.py, then test.py."}, *agent.messages[2:]]
    agent.turn("ok", messages=edited)

    step, context = agent.steps[1], agent.context(0)
    expected = first_difference(context, engine.render(edited, TOOLS))  # no reply before the edit
    assert step.token_continuity == "broken" and step.token_rl_eligible is False
    assert step.token_continuity_break == expected == step.prompt_delta_start
    assert engine.decode(context[:expected], skip=False).endswith("<|im_start|>user\nRead")
    assert [*context[:expected], *step.prompt_token_ids] == engine.prompts[1]  # exact reconstruction


def test_an_edited_argument_breaks_at_that_value_not_at_an_earlier_re_serialised_call(template):
    name, tokenizer = template
    engine = ScriptedEngine(tokenizer)
    agent = Agent(engine)
    first = agent.turn(FIRST)["choices"][0]["message"]
    agent.messages += [reserialised(first), tool_result(first, "print('hi')")]
    second = agent.turn(SECOND[name])["choices"][0]["message"]
    edited_call = reserialised(second)
    edited_call["tool_calls"][0]["function"]["arguments"] = '{"path": "tests.py", "lines": [1, 2]}'
    agent.messages += [edited_call, tool_result(second, "assert True")]
    agent.turn("ok")

    assert agent.steps[1].token_continuity == "ok"  # the first call, re-serialised, still says the same
    step = agent.steps[2]
    sampled = engine.samples[1][0].token_ids  # the second reply as the model wrote it
    at_value = first_difference(sampled, engine.encode(SECOND[name].replace("test.py", "tests.py")))
    expected = len(engine.prompts[1]) + at_value
    assert step.token_continuity == "broken" and step.token_continuity_break == expected
    assert 0 < at_value < len(sampled) - 3  # inside the call, past its start: at the edited value
    # up to the value, or into it while "test" and "tests" share tokens
    assert engine.decode(sampled[:at_value], skip=False).rstrip("tes").endswith('{"path": "')
    assert [*agent.context(1)[:expected], *step.prompt_token_ids] == engine.prompts[2]


def test_a_cut_completion_gets_the_end_of_turn_from_the_template(template):
    _, tokenizer = template
    engine = ScriptedEngine(tokenizer)
    agent = Agent(engine)
    cut = 'I will read <tool_call>\n{"name": "re'
    reply = agent.turn((cut, True))["choices"][0]["message"]
    assert reply["content"] == cut and reply["tool_call_malformed"] is True
    agent.messages += [
        {"role": "assistant", "content": reply["content"]},
        {"role": "user", "content": "Go on."},
    ]
    agent.turn("ok")

    step = agent.steps[1]
    assert step.token_continuity == "ok" and step.prompt_delta_start == len(agent.context(0))
    assert engine.decode(step.prompt_token_ids, skip=False) == (
        "<|im_end|>\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_any_of_n_samples_can_be_continued(template):
    _, tokenizer = template
    engine = ScriptedEngine(tokenizer)
    agent = Agent(engine)
    replies = agent.turn("Plan A.", FIRST, n=2)["choices"]
    chosen = replies[1]["message"]
    agent.messages += [reserialised(chosen), tool_result(chosen, "print('hi')")]
    agent.turn("ok")

    context = agent.context(0, sample=1)
    assert agent.steps[1].token_continuity == "ok"
    assert engine.prompts[1][: len(context)] == context and agent.steps[1].prompt_delta_start == len(context)


def test_a_forced_prefix_in_the_prompt_and_a_reply_that_starts_with_it_continue(template):
    """tool_choice may put forced tokens after the generation prompt: the reply as returned (prefix +
    sampled text) is what the next turn matches."""
    _, tokenizer = template
    engine = ScriptedEngine(tokenizer)
    episodes = Episodes()
    messages = [SYSTEM, USER]
    state = episodes.get("t")
    prompt = build_prompt(engine, messages, TOOLS, state.contexts, state.histories)
    forced, sampled = '<tool_call>\n{"name": "read", "arguments": ', '{"path":"a.py"}}\n</tool_call>'
    context = [*prompt.token_ids, *engine.encode(forced), *engine.encode(sampled), *engine.stop_ids]
    call = parse(forced + sampled).calls[0]
    reply = {"role": "assistant", "content": None, "tool_calls": [call.openai("c1")]}
    episodes.store("t", state, [context], [reply], prompt)

    later = build_prompt(
        engine, [*messages, reply, tool_result(reply, "x")], TOOLS, state.contexts, state.histories
    )
    assert later.delta.continuity == "ok" and later.token_ids[: len(context)] == context


def test_a_dropped_context_makes_the_next_turn_first_and_histories_go_with_it(template):
    _, tokenizer = template
    engine = ScriptedEngine(tokenizer)
    episodes = Episodes(token_budget=10)
    state = episodes.get("t")
    prompt = build_prompt(engine, [USER], None, [], None)
    episodes.store(
        "t", state, [[*prompt.token_ids, *engine.stop_ids]], [{"role": "assistant", "content": ""}], prompt
    )
    assert state.contexts == [] and state.histories == [] and episodes.tokens == 0
    again = build_prompt(
        engine, [USER, {"role": "assistant", "content": ""}], None, state.contexts, state.histories
    )
    assert again.delta.continuity == "first"


def test_meanings_ignore_json_form_but_not_content():
    def call(arguments, name="read"):
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": name, "arguments": arguments}}],
        }

    base = meaning(call('{"path": "a.py", "n": 1}'))
    assert meaning(call('{"n":1,\n "path":"a.py"}')) == base == meaning(call({"n": 1, "path": "a.py"}))
    assert meaning({**call('{"path": "a.py", "n": 1}'), "content": ""}) == base
    for other in (call('{"path": "b.py", "n": 1}'), call('{"path": "a.py", "n": true}'), call("{}", "write")):
        assert meaning(other) != base
    assert meaning(call("not json")) != meaning(call('"not json"'))
    deep = "[" * 100_000 + "]" * 100_000  # past what json parses: means only itself, no error
    assert meaning(call(deep)) != meaning(call("[[]]"))
    tool = {"role": "tool", "content": "x", "tool_call_id": "c1"}
    assert meaning(tool) != meaning({**tool, "tool_call_id": "c2"}) and meaning(tool) != meaning(
        {**tool, "role": "user"}
    )
    assert tools_meaning(None) == tools_meaning([]) != tools_meaning(TOOLS)
    assert tools_meaning([{"function": {"name": "a", "x": 1}}]) == tools_meaning(
        [{"function": {"x": 1, "name": "a"}}]
    )
    assert matched([b"a", b"b"], [b"a", b"b", b"c"]) == 2 and matched([b"x"], [b"a"]) == 0


def test_the_tools_template_lists_tools_and_masks_the_calls_for_training():
    from consumers.tiny_model import train_tokenizer

    tokenizer = train_tokenizer(chat_template="tools")
    call = {"type": "function", "function": {"name": "read", "arguments": {"path": "a.py"}}}
    messages = [SYSTEM, USER, {"role": "assistant", "content": "", "tool_calls": [call]}]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are an agent.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    out = tokenizer.apply_chat_template(
        messages, tools=TOOLS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    trained = [t for t, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(trained) == (
        '<tool_call>\n{"name": "read", "arguments": {"path": "a.py"}}\n</tool_call><|im_end|>'
    )
    with pytest.raises(ValueError, match=r"chat_template: .*'hermes'"):
        train_tokenizer(chat_template="hermes")
