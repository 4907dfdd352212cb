"""The policy server over HTTP with the real `openai` SDK, recording into the embedded broker."""

from __future__ import annotations

import openai
import pytest

from producers.policy.tokens import first_difference, reconstruct
from tests.support.policy import make_checkpoint, policy_server, publish_policy, recorded_steps
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
SAMPLING = {"max_tokens": 12, "temperature": 1.0, "seed": 7}


@pytest.fixture(scope="module")
def local_engine(tiny):
    from producers.policy.engine.local import LocalEngine

    return LocalEngine(tiny, device="cpu")


@pytest.fixture
def server(tmp_path, broker, tiny):
    with policy_server(tmp_path, broker.bootstrap, tiny) as (url, proc):
        yield url, proc


def client(url: str, trajectory_id: str | None = None, api_key: str = "none"):
    base = f"{url}/v1/episodes/{trajectory_id}" if trajectory_id else f"{url}/v1"
    return openai.OpenAI(base_url=base, api_key=api_key, max_retries=0, timeout=120)


def assistant_turn(choice) -> dict:
    """The assistant message as an agent framework sends it back (content and tool calls)."""
    message = {"role": "assistant", "content": choice.message.content or ""}
    if choice.message.tool_calls:
        message["tool_calls"] = [call.model_dump() for call in choice.message.tool_calls]
    return message


def test_a_three_turn_tool_conversation_is_recorded_token_exact(server, broker, local_engine):
    url, _ = server
    api = client(url, "t-three")
    messages = [
        {"role": "system", "content": "You are an agent. Call one tool per turn."},
        {"role": "user", "content": "List the files, then read main.py."},
    ]
    seen = []
    for turn, observation in enumerate(["main.py\nREADME.md", "print('ok')", None]):
        raw = api.chat.completions.with_raw_response.create(
            model="policy", messages=messages, tools=TOOLS, **SAMPLING
        )
        response = raw.parse()
        assert raw.headers["x-agentstream-policy-version"] == "base" == response.policy_version
        seen.append(
            local_engine.tokenizer.apply_chat_template(
                messages, tools=TOOLS, add_generation_prompt=True, tokenize=False
            )
        )
        messages.append(assistant_turn(response.choices[0]))
        if observation is not None:
            messages.append({"role": "tool", "tool_call_id": f"call-{turn}", "content": observation})

    steps = wait_for(
        lambda: (s := recorded_steps(broker.bootstrap, "t-three")) and len(s) == 3 and s, what="3 steps"
    )
    assert [s.step_index for s in steps] == [0, 1, 2]
    assert [s.token_continuity for s in steps] == ["first", "ok", "ok"]
    assert all(s.token_rl_eligible and s.tokenizer_hash == local_engine.tokenizer_hash for s in steps)
    assert steps[0].sampling["seed"] == 7 and steps[0].sampling["max_tokens"] == 12
    sequences = reconstruct([(s.prompt_delta_start, s.prompt_token_ids, s.token_ids) for s in steps])
    for step, sequence, text in zip(steps, sequences, seen, strict=True):
        prompt = sequence[: len(sequence) - len(step.token_ids)]
        # the prompt the model saw is the conversation the client sent, and its completion follows it
        assert local_engine.tokenizer.decode(prompt, skip_special_tokens=False) == text
        assert len(prompt) == step.input_tokens and len(step.token_ids) == step.output_tokens
        fresh = local_engine.score(prompt, step.token_ids)
        assert max(abs(a - b) for a, b in zip(fresh, step.logprobs, strict=True)) < 1e-4
    assert steps[1].prompt_delta_start == len(sequences[0])  # only the new tokens are stored
    assert steps[2].prompt_delta_start == len(sequences[1])


def test_a_client_that_rerenders_history_differently_is_flagged_broken(server, broker, local_engine):
    url, _ = server
    api = client(url, "t-broken")
    messages = [{"role": "user", "content": "Run the tests."}]
    first = api.chat.completions.create(model="policy", messages=messages, **SAMPLING)
    content = first.choices[0].message.content or ""
    edited = [
        *messages,
        {"role": "assistant", "content": "I will " + content},
        {"role": "user", "content": "go on"},
    ]
    api.chat.completions.create(model="policy", messages=edited, **SAMPLING)

    steps = wait_for(
        lambda: (s := recorded_steps(broker.bootstrap, "t-broken")) and len(s) == 2 and s, what="2 steps"
    )
    context = [*steps[0].prompt_token_ids, *steps[0].token_ids]
    expected = first_difference(context, local_engine.render(edited))
    assert steps[1].token_continuity == "broken" and steps[1].token_rl_eligible is False
    assert steps[1].token_continuity_break == expected == steps[1].prompt_delta_start
    assert expected >= len(steps[0].prompt_token_ids)  # it breaks in the assistant turn, not before
    prompt = [*context[:expected], *steps[1].prompt_token_ids]
    assert prompt == local_engine.render(edited)


def test_openai_features_n_samples_logprobs_models_and_unrecorded_requests(server, broker, local_engine):
    url, _ = server
    api = client(url)
    assert {m.id for m in api.models.list().data} == {local_engine.model_name, "policy"}
    response = api.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], n=3, logprobs=True, **SAMPLING
    )
    assert len(response.choices) == 3
    for choice in response.choices:
        assert choice.finish_reason in ("stop", "length", "tool_calls")
        assert all(t.logprob <= 0 for t in choice.logprobs.content)
    again = api.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], n=3, logprobs=True, **SAMPLING
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in response.choices]
    greedy = api.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
        temperature=0,
        extra_body={"top_k": 1},
    )
    assert greedy.usage.completion_tokens <= 5


def test_bad_requests_get_openai_errors_naming_the_field(server):
    url, _ = server
    api = client(url)
    ok = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(**ok, temperature=5)
    assert "temperature" in str(info.value) and "5" in str(info.value)
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(model="policy", messages=[{"role": "robot", "content": "x"}])
    assert "messages[0].role" in str(info.value) and "robot" in str(info.value)
    with pytest.raises(openai.NotFoundError) as info:
        api.chat.completions.create(**{**ok, "model": "gpt-9"})
    assert "gpt-9" in str(info.value)
    with pytest.raises(openai.APIStatusError) as info:
        api.chat.completions.create(**{**ok, "messages": [{"role": "user", "content": "x" * 5_000_000}]})
    assert info.value.status_code == 413


def test_an_api_key_is_required_when_configured(tmp_path, broker, tiny):
    from producers.gateway.requests import hash_key

    env = {"AGENTSTREAM_POLICY_API_KEY_HASHES": hash_key("s3cret")}
    with policy_server(tmp_path, broker.bootstrap, tiny, env=env) as (url, _):
        with pytest.raises(openai.AuthenticationError):
            client(url, api_key="wrong").models.list()
        assert client(url, api_key="s3cret").models.list().data


def test_policy_updated_switches_the_version_under_load_without_mixing(tmp_path, server, broker, tiny):
    import threading
    import time

    url, proc = server
    checkpoint = make_checkpoint(tiny, tmp_path / "checkpoints", "v1")
    answers, stop = [], threading.Event()

    def agent(worker: int) -> None:
        api = client(url, f"t-load-{worker}")
        while not stop.is_set():
            raw = api.chat.completions.with_raw_response.create(
                model="policy",
                messages=[{"role": "user", "content": f"go {worker}"}],
                max_tokens=4,
                seed=worker,
            )
            answers.append(
                (time.monotonic(), raw.headers["x-agentstream-policy-version"], raw.parse().policy_version)
            )

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(answers) >= 8, timeout_s=60, what="load before the update")
        published = time.monotonic()
        publish_policy(broker.bootstrap, "v1", checkpoint, previous="base")
        wait_for(lambda: any(v == "v1" for _, v, _ in answers), timeout_s=60, what="the new version served")
        switched = min(t for t, v, _ in answers if v == "v1") - published
        wait_for(
            lambda: sum(v == "v1" for _, v, _ in answers) >= 8, timeout_s=60, what="load after the update"
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    assert switched < 30
    assert all(header == body for _, header, body in answers)  # one version per response
    served = [v for _, v, _ in sorted(answers)]
    assert served[0] == "base" and served[-1] == "v1"

    # a second update loads while v1 serves
    publish_policy(
        broker.bootstrap, "v2", make_checkpoint(tiny, tmp_path / "checkpoints", "v2", seed=2), "v1"
    )

    def version_now():
        reply = client(url).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
        return reply.policy_version == "v2"

    wait_for(version_now, timeout_s=60, what="the second update served")

    # a corrupt checkpoint keeps v2 serving and logs one clear error naming it (not retried)
    broken = tmp_path / "checkpoints" / "v3"
    (broken / "adapter").mkdir(parents=True)
    (broken / "adapter" / "adapter_config.json").write_text("{not json")
    publish_policy(broker.bootstrap, "v3", broken, previous="v2")
    wait_for(lambda: "v3 not served" in proc.log_text(), timeout_s=60, what="the reload error")
    assert str(broken) in proc.log_text()
    after = client(url).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=2
    )
    assert after.policy_version == "v2"
    assert proc.log_text().count("v3 not served") == 1

    steps = [s for s in recorded_steps(broker.bootstrap) if s.trajectory_id.startswith("t-load-")]
    versions = {s.policy_version for s in steps}
    assert versions == {"base", "v1"}
    for worker in range(4):  # per episode, the recorded versions switch once, from base to v1
        mine = [s.policy_version for s in steps if s.trajectory_id == f"t-load-{worker}"]
        assert mine == sorted(mine, key=lambda v: v == "v1")


def test_broker_down_while_serving_loses_no_step(tmp_path, broker, tiny):
    with policy_server(tmp_path, broker.bootstrap, tiny) as (url, _):
        api = client(url, "t-down")
        messages = [{"role": "user", "content": "start"}]
        api.chat.completions.create(model="policy", messages=messages, max_tokens=4, seed=1)
        wait_for(lambda: len(recorded_steps(broker.bootstrap, "t-down")) == 1, what="the first step")
        broker.proc.kill9()
        for index in range(3):  # the broker is down: responses still return
            response = api.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": f"turn {index}"}],
                max_tokens=4,
                seed=index,
            )
            assert response.choices[0].finish_reason in ("stop", "length")
        broker.restart()
        steps = wait_for(
            lambda: (s := recorded_steps(broker.bootstrap, "t-down")) and len(s) >= 4 and s,
            timeout_s=120,
            what="the spooled steps after the broker is back",
        )
    assert sorted(s.step_index for s in steps) == [0, 1, 2, 3]  # none lost, none twice
    assert len({s.event_id for s in steps}) == 4


def test_proxy_mode_records_the_same_fields_as_the_built_in_backend(tmp_path, broker, tiny, local_engine):
    upstream_root, proxy_root = tmp_path / "upstream", tmp_path / "proxy"
    upstream_root.mkdir(), proxy_root.mkdir()
    with policy_server(upstream_root, broker.bootstrap, tiny, "--no-record") as (upstream, _):
        proxy_args = ("--upstream", f"{upstream}/v1", "--no-follow")
        with policy_server(proxy_root, broker.bootstrap, tiny, *proxy_args) as (url, _):
            api = client(url, "t-proxy")
            messages = [{"role": "user", "content": "List the files."}]
            for observation in ("a.py", None):
                raw = api.chat.completions.with_raw_response.create(
                    model="tiny", messages=messages, tools=TOOLS, logprobs=True, **SAMPLING
                )
                response = raw.parse()
                assert raw.headers["x-agentstream-policy-version"] == "base" == response.policy_version
                messages.append(assistant_turn(response.choices[0]))
                if observation:
                    messages.append({"role": "tool", "tool_call_id": "c1", "content": observation})
            steps = wait_for(
                lambda: (s := recorded_steps(broker.bootstrap, "t-proxy")) and len(s) == 2 and s,
                what="2 steps",
            )
    assert [s.token_continuity for s in steps] == ["first", "ok"]
    assert all(s.tokenizer_hash == local_engine.tokenizer_hash and s.policy_version == "base" for s in steps)
    assert all(s.producer == "policy-server" and s.sampling["seed"] == 7 for s in steps)
    sequences = reconstruct([(s.prompt_delta_start, s.prompt_token_ids, s.token_ids) for s in steps])
    for step, sequence in zip(steps, sequences, strict=True):
        prompt = sequence[: len(sequence) - len(step.token_ids)]
        fresh = local_engine.score(prompt, step.token_ids)
        assert max(abs(a - b) for a, b in zip(fresh, step.logprobs, strict=True)) < 1e-4
