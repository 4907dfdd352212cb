"""Token continuity of a tool conversation through the real `openai` SDK and a real `agentstream policy`
process, with both built-in chat templates (issue #36).

The tiny model is taught, in a few seconds, to answer every turn of these conversations with one tool
call that it writes in its own spacing (`"lines":[1,2]`, which the templates re-render as
`"lines": [1, 2]`), so the calls are really sampled. The client sends each call back re-serialised
(keys sorted, other spacing): every turn is still `ok`. An edited history is `broken` where it was
edited: in the user message, or at the edited argument's value, not at an earlier re-serialised call.
"""

from __future__ import annotations

import json

import openai
import pytest

from producers.policy.tokens import first_difference, reconstruct
from tests.support.policy import policy_server, recorded_steps
from tests.support.processes import wait_for

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "read lines of a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
SYSTEM = {"role": "system", "content": "You are an agent."}
USER = {"role": "user", "content": "Read main.py, then test.py."}
EDITED_USER = {"role": "user", "content": "Read setup.py, then test.py."}
# The call as each template renders it up to the path's value, then in the model's own spacing.
CALLS = {
    "tools": '<tool_call>\n{"name": "read", "arguments": {"path": "main.py", "lines":[1,2]}}\n</tool_call>',
    "chatml": '\n<tool_call>{"name": "read", "arguments": {"path": "main.py", "lines":[1,2]}}</tool_call>',
}
SAMPLING = {"max_tokens": 64, "temperature": 0}


def taught_to_call(base, out, call: str):
    """`base` fine-tuned until, after the assistant's generation prompt of conversations like these
    (whole, or only their last tokens), it writes `call` and its end of turn; saved to `out`."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tokenizer, model = AutoTokenizer.from_pretrained(base), AutoModelForCausalLM.from_pretrained(base)
    target = tokenizer.encode(call + "<|im_end|>", add_special_tokens=False)
    prefixes = []
    for user in (USER, EDITED_USER):
        messages = [SYSTEM, user]
        for observation in ("print('hi')", "assert True", "x = 1", "ok"):
            text = tokenizer.apply_chat_template(
                messages, tools=TOOLS, add_generation_prompt=True, tokenize=False
            )
            prefixes.append(tokenizer.encode(text, add_special_tokens=False))
            messages += [{"role": "assistant", "content": call}, {"role": "tool", "content": observation}]
    rng, optimizer = random.Random(0), torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(400):
        batch = [(p[-rng.choice([8, 16, 32, 64, len(p)]) :], target) for p in rng.choices(prefixes, k=8)]
        width = max(len(p) + len(t) for p, t in batch)
        ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        labels, mask = torch.full_like(ids, -100), torch.zeros_like(ids)
        for row, (prefix, completion) in enumerate(batch):
            ids[row, : len(prefix) + len(completion)] = torch.tensor(prefix + completion)
            labels[row, len(prefix) : len(prefix) + len(completion)] = torch.tensor(completion)
            mask[row, : len(prefix) + len(completion)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 1e-3:
            break
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    return out, tokenizer


@pytest.fixture(scope="module", params=["chatml", "tools"])
def caller(request, tmp_path_factory):
    """(template name, model dir, its tokenizer): the tiny model with that template, taught the call."""
    from consumers.tiny_model import tiny_model_dir

    root = tmp_path_factory.mktemp(f"models-{request.param}")
    base = tiny_model_dir(root, chat_template=request.param)
    path, tokenizer = taught_to_call(base, root / "caller", CALLS[request.param])
    return request.param, path, tokenizer


@pytest.fixture
def server(tmp_path, broker, caller):
    with policy_server(tmp_path, broker.bootstrap, caller[1]) as (url, _):
        yield url


def client(url: str, trajectory_id: str):
    return openai.OpenAI(
        base_url=f"{url}/v1/episodes/{trajectory_id}", api_key="none", max_retries=0, timeout=120
    )


def ask(api, messages) -> dict:
    """One turn; the reply as the client sends it back: its call re-serialised (keys sorted, indented)."""
    message = (
        api.chat.completions.create(model="policy", messages=messages, tools=TOOLS, **SAMPLING)
        .choices[0]
        .message
    )
    (call,) = message.tool_calls  # the model really wrote the call
    arguments = json.loads(call.function.arguments)
    assert (call.function.name, arguments) == ("read", {"path": "main.py", "lines": [1, 2]})
    function = {"name": "read", "arguments": json.dumps(arguments, sort_keys=True, indent=1)}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call.id, "type": "function", "function": function}],
    }


def observed(reply: dict, content: str) -> dict:
    return {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": content}


def steps_of(broker, trajectory_id: str, count: int):
    return wait_for(
        lambda: (s := recorded_steps(broker.bootstrap, trajectory_id)) and len(s) == count and s,
        what=f"{count} steps of {trajectory_id}",
    )


def test_a_tool_conversation_re_serialised_by_the_client_is_ok_on_every_turn(server, broker, caller):
    name, _, tokenizer = caller
    api = client(server, "t-tools")
    messages, sent = [SYSTEM, USER], []
    for observation in ("print('hi')", "assert True", "x = 1"):
        sent.append(list(messages))
        reply = ask(api, messages)
        messages += [reply, observed(reply, observation)]
    sent.append(list(messages))
    ask(api, messages)

    steps = steps_of(broker, "t-tools", 4)
    assert [s.token_continuity for s in steps] == ["first", "ok", "ok", "ok"]
    assert all(s.token_rl_eligible and s.token_continuity_break is None for s in steps)
    sequences = reconstruct([(s.prompt_delta_start, s.prompt_token_ids, s.token_ids) for s in steps])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for step in range(1, 4):
        # the model's own tokens (its call as it wrote it, its stop token) start the next prompt
        assert steps[step].prompt_delta_start == len(sequences[step - 1])
        assert steps[step - 1].token_ids == [*tokenizer.encode(CALLS[name], add_special_tokens=False), im_end]
        # the template renders the calls otherwise: matching by text would have broken every turn
        rendered = tokenizer.apply_chat_template(
            sent[step], tools=TOOLS, add_generation_prompt=True, tokenize=False
        )
        prompt = sequences[step][: len(sequences[step]) - len(steps[step].token_ids)]
        assert tokenizer.decode(prompt, skip_special_tokens=False) != rendered
        assert '"lines":[1,2]' in tokenizer.decode(prompt) and '"lines":[1,2]' not in rendered


def test_an_edited_history_is_broken_where_it_was_edited(server, broker, caller):
    _, _, tokenizer = caller
    # an edited user message: the break is in it
    api = client(server, "t-edit-user")
    reply = ask(api, [SYSTEM, USER])
    edited = [SYSTEM, EDITED_USER, reply, observed(reply, "print('hi')")]
    ask(api, edited)
    first, second = steps_of(broker, "t-edit-user", 2)
    context = [*first.prompt_token_ids, *first.token_ids]
    rendered = tokenizer.apply_chat_template(edited, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    expected = first_difference(context, tokenizer.encode(rendered, add_special_tokens=False))
    assert second.token_continuity == "broken" and second.token_rl_eligible is False
    assert second.token_continuity_break == expected == second.prompt_delta_start
    assert tokenizer.decode(context[:expected], skip_special_tokens=False).endswith("<|im_start|>user\nRead")

    # an edited argument of the second call, the first call re-serialised: the break is at that value
    api = client(server, "t-edit-arg")
    messages = [SYSTEM, USER]
    for observation in ("print('hi')", "assert True"):
        reply = ask(api, messages)
        messages += [reply, observed(reply, observation)]
    # the edited call is rendered by the template from the client's object: in the model's key order
    # (spacing does not count), the first token that differs from what the model wrote is the value's
    messages[4]["tool_calls"][0]["function"]["arguments"] = '{"path":"setup.py",\n"lines":[1, 2]}'
    ask(api, messages)
    steps = steps_of(broker, "t-edit-arg", 3)
    assert [s.token_continuity for s in steps] == ["first", "ok", "broken"]
    sequences = reconstruct([(s.prompt_delta_start, s.prompt_token_ids, s.token_ids) for s in steps])
    second_prompt = len(sequences[1]) - len(steps[1].token_ids)
    written = steps[1].token_ids  # the second call, as the model wrote it
    at_value = first_difference(
        written, tokenizer.encode(CALLS[caller[0]].replace("main.py", "setup.py"), add_special_tokens=False)
    )
    assert steps[2].token_continuity_break == second_prompt + at_value == steps[2].prompt_delta_start
    assert tokenizer.decode(written[:at_value]).endswith('{"path": "')
