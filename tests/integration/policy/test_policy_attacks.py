"""The policy server as an attacker and a careless client try it (issue #34, items 9, 10, 12, 16):
one real server on 127.0.0.1 for the module, driven with the `openai` SDK and, for what a browser
or a fuzzer sends, raw httpx requests. Every answer is checked for OpenAI's error shape."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid

import httpx
import openai
import pytest

from schemas.limits import MAX_STEP_INDEX
from tests.support.policy import policy_server, recorded_steps
from tests.support.processes import AGENTSTREAM, wait_for

CONTEXT = 4096  # the tiny model's max_position_embeddings
BUDGET = 2000  # --episode-context-tokens for this module's server
SECRET = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"  # a GitHub token shape (github_token detector)
SMALL = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(tmp_path_factory, shared_broker, tiny):
    root = tmp_path_factory.mktemp("policy-attacks")
    extra = ("--episode-context-tokens", str(BUDGET), "--allowed-hosts", "policy.test")
    with policy_server(root, shared_broker.bootstrap, tiny, *extra) as (url, _proc):
        yield url


def api(url: str, trajectory_id: str | None = None) -> openai.OpenAI:
    base = f"{url}/v1/episodes/{trajectory_id}" if trajectory_id else f"{url}/v1"
    return openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=60)


def post(url: str, body=None, path: str = "/v1/chat/completions", **kwargs) -> httpx.Response:
    if body is not None:
        kwargs["json"] = body
    return httpx.post(url + path, timeout=60, **kwargs)


def openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


# --- item 9: the prompt is capped at the model's context ----------------------------------------------


def test_a_150k_token_prompt_is_refused_at_once_and_a_small_request_is_not_held_up(server, tokenizer):
    text = "hello world " * 14_000
    assert len(tokenizer.encode(text)) > 150_000
    small: dict = {}

    def small_request():
        time.sleep(0.2)  # after the big one is in
        started = time.monotonic()
        api(server).chat.completions.create(**SMALL)
        small["s"] = time.monotonic() - started

    thread = threading.Thread(target=small_request)
    thread.start()
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as info:
        api(server).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": text}], max_tokens=8
        )
    refused_s = time.monotonic() - started
    thread.join(timeout=60)
    error = info.value.body
    assert info.value.status_code == 400
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert str(CONTEXT) in error["message"] and "8 for the completion" in error["message"]
    assert refused_s < 10, f"refused after {refused_s:.1f}s: the model ran on it"
    assert small["s"] < 10, f"a small request waited {small['s']:.1f}s behind it"


def test_a_body_sized_prompt_is_refused_before_it_is_tokenised(server):
    started = time.monotonic()
    error = openai_error(
        post(server, {**SMALL, "messages": [{"role": "user", "content": "x" * 3_000_000}]}), 400
    )
    assert error["code"] == "context_length_exceeded" and time.monotonic() - started < 5


def test_the_prompt_and_max_tokens_must_fit_together(server, tokenizer):
    content = "hello world " * 330  # about 3,650 tokens: fits alone, not with 600 more
    assert 3_000 < len(tokenizer.encode(content)) < CONTEXT - 300
    body = {"model": "policy", "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    assert post(server, body).status_code == 200
    error = openai_error(post(server, {**body, "max_tokens": 600}), 400)
    assert error["code"] == "context_length_exceeded" and "600 for the completion" in error["message"]


def test_token_in_completions_are_capped_too(server):
    error = openai_error(
        post(server, {"model": "policy", "prompt": [5] * CONTEXT, "max_tokens": 1}, "/v1/completions"), 400
    )
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"


def test_episode_contexts_are_bounded_in_tokens(server):
    for _ in range(12):  # each keeps about 4 x 40 tokens: 12 of them are over the budget
        episode = api(server, f"budget-{uuid.uuid4().hex}")
        episode.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "count " * 30}], max_tokens=4, n=4
        )
    health = httpx.get(f"{server}/healthz", timeout=30).json()
    assert 0 < health["episode_context_tokens"] <= BUDGET


# --- item 10: defaults a web page cannot get past ----------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "multipart/form-data; boundary=x"},
        {},
    ],
    ids=["text-plain", "form", "multipart", "none"],
)
def test_a_post_that_is_not_json_is_a_415(server, headers):
    import orjson

    response = post(server, content=orjson.dumps(SMALL), headers=headers)
    error = openai_error(response, 415)
    assert error["param"] == "Content-Type"


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "localhost:1", "127.0.0.2:{port}"])
def test_a_foreign_host_header_is_a_421(server, host):
    port = server.rsplit(":", 1)[1]
    error = openai_error(post(server, SMALL, headers={"Host": host.format(port=port)}), 421)
    assert error["param"] == "Host"


@pytest.mark.parametrize("host", ["localhost:{port}", "127.0.0.1:{port}", "policy.test", "policy.test:1"])
def test_loopback_names_with_our_port_and_configured_names_are_served(server, host):
    port = server.rsplit(":", 1)[1]
    assert post(server, SMALL, headers={"Host": host.format(port=port)}).status_code == 200


def test_health_answers_whatever_the_host(server):
    assert httpx.get(f"{server}/healthz", headers={"Host": "probe.example"}, timeout=30).status_code == 200


def test_off_loopback_the_server_refuses_to_start_without_a_key(tmp_path):
    args = [*AGENTSTREAM, "policy", "--host", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path),
            "--bootstrap-servers", "127.0.0.1:9"]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "0.0.0.0" in done.stderr and "needs API keys" in done.stderr
    assert "listening" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        (b"\xc2\xb2", False),  # `²`: str.isdigit says yes, int() says no (a 500 before)
        (b"100000000000000000000", False),
        (str(MAX_STEP_INDEX + 1).encode(), False),
        (b"-1", False),
        (b"1.0", False),
        (b"0x1", False),
        (str(MAX_STEP_INDEX).encode(), True),
    ],
)
def test_the_step_index_header_is_bounded(server, value, accepted):
    headers = {"X-Agentstream-Step-Index": value, "X-Agentstream-Record": "client"}
    response = post(server, SMALL, f"/v1/episodes/idx-{uuid.uuid4().hex}/chat/completions", headers=headers)
    if accepted:
        assert response.status_code == 200 and response.json()["agentstream"]["step_index"] == MAX_STEP_INDEX
    else:
        assert openai_error(response, 400)["param"] == "X-Agentstream-Step-Index"


def test_trajectory_ids_are_bounded(server):
    error = openai_error(post(server, SMALL, headers={"X-Agentstream-Trajectory": "t" * 300}), 400)
    assert error["param"] == "X-Agentstream-Trajectory" and "300 characters" in error["message"]
    error = openai_error(post(server, SMALL, f"/v1/episodes/{'t' * 300}/chat/completions"), 400)
    assert error["param"] == "trajectory_id"


# --- item 12: every bad value is a 400 naming the field ----------------------------------------------------


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"messages": [{"role": "user", "content": [1, {"text": 5}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": "garbage"}]},
         "messages[1].tool_calls"),
        ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 5}}]}]},
         "messages[0].tool_calls[0]"),
        ({"messages": [{"role": "tool", "content": "ok", "tool_call_id": 5}]}, "messages[0].tool_call_id"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -2}, "top_k"),  # -1 is vLLM's "off", read as 0
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 17}, "n"),
        ({"seed": 1.5}, "seed"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools[0]"),
    ],
)  # fmt: skip
def test_a_bad_value_is_a_400_naming_it(server, change, param):
    error = openai_error(post(server, {**SMALL, **change}), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "change", [{"temperature": 1e-300}, {"top_p": 1e-300}, {"temperature": 1e-300, "n": 3}]
)
def test_tiny_temperatures_and_top_p_sample_greedily_instead_of_crashing(server, change):
    response = api(server).chat.completions.create(**{**SMALL, **change})
    assert response.choices[0].finish_reason in ("stop", "length")


FIELDS = ["model", "messages", "tools", "temperature", "top_p", "top_k", "max_tokens",
          "max_completion_tokens", "seed", "n", "logprobs", "top_logprobs"]  # fmt: skip
WRONG = [1, 1.5, -1, "x", "", True, [], [1], {}, {"a": 1}, [{"text": 5}], 10**30]


def test_wrong_types_in_every_documented_field_are_never_a_500(server):
    def message_bodies(value):
        yield {**SMALL, "messages": [value]}
        for field in ("role", "content", "tool_calls", "tool_call_id"):
            yield {**SMALL, "messages": [{"role": "assistant", "content": "x", field: value}]}

    seen = set()
    with httpx.Client(timeout=60) as http:
        for value in WRONG:
            bodies = [{**SMALL, field: value} for field in FIELDS]
            for body in [*bodies, *message_bodies(value)]:
                response = http.post(f"{server}/v1/chat/completions", json=body)
                assert response.status_code in (200, 400, 404), (body, response.text)
                if response.status_code != 200:
                    error = response.json()["error"]
                    assert error["param"] and error["type"] in ("invalid_request_error", "not_found_error")
                seen.add(response.status_code)
        for value in WRONG:  # the token-in route too
            body = {"model": value, "prompt": value} if value else {"model": "policy", "prompt": value}
            response = http.post(f"{server}/v1/completions", json=body)
            assert response.status_code in (400, 404), (body, response.text)
        body = post(server, content=b"{not json", headers={"Content-Type": "application/json"})
        assert openai_error(body, 400)["param"] == "body"
    assert {200, 400} <= seen


# --- item 16: redaction reaches the tokens ------------------------------------------------------------------


def _all_token_ids(step) -> list[int]:
    ids = [*(step.token_ids or []), *(step.prompt_token_ids or [])]
    for sample in step.samples or []:
        ids += sample.get("token_ids") or []
    return ids


def test_a_secret_in_a_message_survives_in_no_recorded_token_ids(server, shared_broker, tokenizer):
    secret_episode, clean_episode = f"secret-{uuid.uuid4().hex}", f"clean-{uuid.uuid4().hex}"
    messages = [{"role": "user", "content": f"deploy with {SECRET} please"}]
    first = api(server, secret_episode).chat.completions.create(
        model="policy", messages=messages, max_tokens=4, n=2, temperature=1.0
    )
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": "and again"}]  # fmt: skip
    api(server, secret_episode).chat.completions.create(model="policy", messages=messages, max_tokens=4)
    api(server, clean_episode).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "deploy please"}], max_tokens=4
    )
    steps = wait_for(
        lambda: (s := recorded_steps(shared_broker.bootstrap, secret_episode)) and len(s) == 2 and s,
        what="2 steps of the secret episode",
    )
    for step in steps:
        assert step.token_ids is None and step.prompt_token_ids is None and step.logprobs is None
        assert step.token_rl_eligible is False and step.redactions >= 1
        assert all("token_ids" not in sample for sample in step.samples or [])
        assert SECRET not in tokenizer.decode(_all_token_ids(step))
        assert SECRET not in step.model_dump_json()
    clean = wait_for(lambda: recorded_steps(shared_broker.bootstrap, clean_episode), what="the clean step")
    assert clean[0].token_ids and clean[0].prompt_token_ids and clean[0].token_rl_eligible is True
    assert "deploy please" in tokenizer.decode(clean[0].prompt_token_ids)  # what the check would see
    assert httpx.get(f"{server}/healthz", timeout=30).json()["steps_tokens_withheld"] >= 2


def test_client_records_replies_carry_no_token_ids_of_a_secret(server):
    headers = {"X-Agentstream-Record": "client"}
    body = {**SMALL, "messages": [{"role": "user", "content": f"token {SECRET}"}]}
    fields = post(
        server, body, f"/v1/episodes/cr-{uuid.uuid4().hex}/chat/completions", headers=headers
    ).json()
    fields = fields["agentstream"]
    assert fields["token_ids"] is None and fields["prompt_token_ids"] is None and fields["logprobs"] is None
    assert fields["token_rl_eligible"] is False
