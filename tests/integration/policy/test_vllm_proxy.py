"""The recording proxy in front of a real vLLM (CPU build, float32, LoRA on; tests/support/vllm_server.py
starts one per module): token-in sampling equals vLLM's own answer, a version published on
`policy.updates` is loaded into vLLM and recorded on the next steps, a corrupt adapter keeps the old
version serving, the OpenAI fields (streaming, stop strings, top_logprobs, a forced tool_choice, an
unknown field) work through it with the openai SDK, and a kill -9 of vLLM mid-episode gives the
client a clear error and records no half step (that test kills the module's vLLM: it stays the last
one)."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import threading
import time
import urllib.request

import httpx
import openai
import pytest

from tests.support.policy import policy_server, publish_policy, recorded_steps
from tests.support.processes import wait_for
from tests.support.vllm_server import make_lora_checkpoint

pytestmark = pytest.mark.timeout(600)
MESSAGES = [{"role": "user", "content": "List the files."}]


def chat(url: str, trajectory_id: str, **sampling):
    api = openai.OpenAI(
        base_url=f"{url}/v1/episodes/{trajectory_id}", api_key="none", max_retries=0, timeout=120
    )
    return api.chat.completions.create(model="policy", messages=MESSAGES, **sampling)


def serving(url: str) -> str:
    with urllib.request.urlopen(f"{url}/healthz", timeout=10) as reply:
        return json.loads(reply.read())["policy_version"]


def direct(vllm, model: str, prompt: list[int], **sampling) -> dict:
    """vLLM's own answer to a token-in completion (choice 0)."""
    body = {"model": model, "prompt": prompt, "return_token_ids": True, "return_tokens_as_token_ids": True,
            "temperature": 1.0, "top_p": 1.0, **sampling}  # fmt: skip
    response = httpx.post(f"{vllm.api}/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def scored(vllm, model: str, prompt: list[int], tokens: list[int]) -> list[float]:
    """vLLM's logprobs of `tokens` after `prompt` on `model`, teacher forced (`prompt_logprobs`): no
    draw, so the rounding that batching moves (~1e-5) cannot flip a token and change what follows."""
    body = {"model": model, "prompt": [*prompt, *tokens], "max_tokens": 1, "prompt_logprobs": 0}
    response = httpx.post(f"{vllm.api}/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    positions = response.json()["choices"][0]["prompt_logprobs"][len(prompt) :]
    assert len(positions) == len(tokens), (len(positions), tokens)
    return [position[str(token)]["logprob"] for position, token in zip(positions, tokens, strict=True)]


def one_step(bootstrap: str, trajectory_id: str):
    (step,) = wait_for(lambda: recorded_steps(bootstrap, trajectory_id), timeout_s=60, what=trajectory_id)
    return step


def test_token_in_sampling_through_the_proxy_equals_vllms_own_answer(tmp_path, broker, vllm_server):
    vllm = vllm_server
    with policy_server(tmp_path, broker.bootstrap, vllm.model_dir, "--upstream", vllm.url) as (url, _):
        sampling = {"max_tokens": 16, "temperature": 1.0, "seed": 11, "logprobs": 3}
        proxied = httpx.post(f"{url}/v1/completions", json={"model": "policy", "prompt": [5, 9, 12, 40],
                             "return_token_ids": True, "return_tokens_as_token_ids": True, **sampling},
                             timeout=120)  # fmt: skip
        assert proxied.status_code == 200, proxied.text
        chat(url, "t-equal", max_tokens=16, temperature=1.0, seed=11)
        step = one_step(broker.bootstrap, "t-equal")
    (ours,), theirs = proxied.json()["choices"], direct(vllm, vllm.model, [5, 9, 12, 40], **sampling)
    assert ours["token_ids"] == theirs["token_ids"] and len(ours["token_ids"]) == 16
    assert ours["logprobs"]["token_logprobs"] == theirs["logprobs"]["token_logprobs"]
    for mine, vllms in zip(ours["logprobs"]["top_logprobs"], theirs["logprobs"]["top_logprobs"], strict=True):
        assert mine == dict(sorted(vllms.items(), key=lambda kv: -kv[1])[:3])  # vLLM adds the sampled one
    # the chat turn: recorded with exactly what vLLM samples for that prompt
    assert step.policy_version == "base" and step.prompt_delta_start == 0 and step.token_continuity == "first"
    again = direct(
        vllm, vllm.model, step.prompt_token_ids, max_tokens=16, temperature=1.0, seed=11, logprobs=1
    )
    assert step.token_ids == again["token_ids"] and step.logprobs == again["logprobs"]["token_logprobs"]


def test_a_published_version_is_loaded_into_vllm_and_the_next_steps_carry_it(tmp_path, broker, vllm_server):
    vllm, checkpoints = vllm_server, tmp_path / "checkpoints"
    sampled: dict[str, tuple] = {}  # version -> (its step, vLLM's own answer on that name)
    with policy_server(tmp_path, broker.bootstrap, vllm.model_dir, "--upstream", f"{vllm.api}/") as (url, _):
        chat(url, "t-base", max_tokens=8, seed=3)
        base = one_step(broker.bootstrap, "t-base")
        for number, version in enumerate(("p1", "p2", "p3"), start=1):
            publish_policy(
                broker.bootstrap, version, make_lora_checkpoint(vllm, checkpoints, version, seed=number)
            )
            wait_for(lambda v=version: serving(url) == v, timeout_s=60, what=f"the proxy to serve {version}")
            chat(url, f"t-{version}", max_tokens=8, seed=3)
            step = one_step(broker.bootstrap, f"t-{version}")
            sampled[version] = (
                step,
                direct(vllm, version, step.prompt_token_ids, max_tokens=8, seed=3, logprobs=1),
            )
        loaded = vllm.models()
    assert base.policy_version == "base" and [s.policy_version for s, _ in sampled.values()] == [
        "p1",
        "p2",
        "p3",
    ]
    for step, on_adapter in sampled.values():  # sampled on the adapter: vLLM's answer for that name
        assert step.prompt_token_ids == base.prompt_token_ids
        assert (step.token_ids, step.logprobs) == (
            on_adapter["token_ids"],
            on_adapter["logprobs"]["token_logprobs"],
        )
        assert (step.token_ids, step.logprobs) != (base.token_ids, base.logprobs)  # not the base's
    # the window (2 by default): p1 was unloaded once p3 came, the serving p3 and p2 stay
    assert "p1" not in loaded and {"p2", "p3"} <= set(loaded), loaded


def test_a_switch_under_load_never_mixes_versions(tmp_path, broker, vllm_server):
    """Agents sample back to back while l1 is published: every recorded step's logprobs are vLLM's own
    for the version it names (teacher forced) and not the other version's, the client is told that
    version (header and body), and the versions go base, then l1."""
    vllm, answers, stop = vllm_server, [], threading.Event()
    with policy_server(tmp_path, broker.bootstrap, vllm.model_dir, "--upstream", vllm.url) as (url, _):

        def agent(worker: int) -> None:
            api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
            for turn in itertools.count():
                if stop.is_set():
                    return
                trajectory_id, started = f"t-load-{worker}-{turn}", time.monotonic()
                raw = api.chat.completions.with_raw_response.create(
                    model="policy", messages=MESSAGES, max_tokens=6, seed=100 * worker + turn,
                    extra_headers={"X-Agentstream-Trajectory": trajectory_id},
                )  # fmt: skip
                header, body = raw.headers["x-agentstream-policy-version"], raw.parse().model_extra
                answers.append((started, time.monotonic(), header, trajectory_id, body["policy_version"]))

        threads = [threading.Thread(target=agent, args=(w,)) for w in range(3)]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: len(answers) >= 6, timeout_s=120, what="load before the update")
            publish_policy(broker.bootstrap, "l1", make_lora_checkpoint(vllm, tmp_path / "checkpoints", "l1"))
            wait_for(lambda: sum(a[2] == "l1" for a in answers) >= 6, timeout_s=120, what="load after it")
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=120)
        steps = wait_for(
            lambda: (
                (s := [x for x in recorded_steps(broker.bootstrap) if x.trajectory_id.startswith("t-load-")])
                and len(s) == len(answers)
                and s
            ),
            timeout_s=60,
            what="every answer's step",
        )
        # teacher forced on each version: vLLM's logprobs of the recorded tokens after the recorded prompt
        gaps = []  # (max |recorded - scored| on the version it names, on the other one, what was compared)
        for step in steps:  # one-step trajectories: prompt_token_ids is the whole prompt
            assert step.prompt_delta_start == 0 and step.policy_version in ("base", "l1"), step
            assert len(step.logprobs) == len(step.token_ids) > 0, step
            on = {
                v: scored(vllm, m, step.prompt_token_ids, step.token_ids)
                for v, m in (("base", vllm.model), ("l1", "l1"))
            }
            gap = {v: max(abs(a - b) for a, b in zip(step.logprobs, s, strict=True)) for v, s in on.items()}
            other = "l1" if step.policy_version == "base" else "base"
            gaps.append((gap[step.policy_version], gap[other], step.trajectory_id, step.logprobs, on))
        # vLLM's own numbers for the version it names (batching moves them by ~0: 0.0 on every step not
        # in flight at the switch here), and clearly not the other version's (a mislabelled step)
        assert max(gaps)[0] < 1e-3, max(gaps)
        assert min(gaps, key=lambda g: g[1])[1] > 1e-2, min(gaps, key=lambda g: g[1])
        # what the client was told (header and body) is the version that sampled it, as recorded
        recorded = {step.trajectory_id: step.policy_version for step in steps}
        for _, _, header, trajectory_id, body_version in answers:
            assert header == body_version == recorded[trajectory_id], (trajectory_id, header, body_version)
    # base first, then l1 for every turn sent after the first l1 answer (a base turn in flight at the
    # switch may be answered after it)
    first_l1 = min(finished for _, finished, version, _, _ in answers if version == "l1")
    assert min(answers)[2] == "base" and {a[2] for a in answers} == {"base", "l1"}, sorted(answers)
    assert all(a[2] == "l1" for a in answers if a[0] > first_l1), sorted(answers)


def test_a_corrupt_adapter_keeps_the_old_version_and_a_newer_one_is_served(tmp_path, broker, vllm_server):
    vllm, checkpoints = vllm_server, tmp_path / "checkpoints"
    with policy_server(tmp_path, broker.bootstrap, vllm.model_dir, "--upstream", vllm.api) as (url, proc):
        publish_policy(broker.bootstrap, "c1", make_lora_checkpoint(vllm, checkpoints, "c1"))
        wait_for(lambda: serving(url) == "c1", timeout_s=60, what="the proxy to serve c1")
        corrupt = make_lora_checkpoint(vllm, checkpoints, "c2", seed=2)
        (corrupt / "adapter" / "adapter_model.safetensors").write_bytes(b"\x00garbage, not safetensors" * 64)
        publish_policy(broker.bootstrap, "c2", corrupt, previous="c1")
        line = wait_for(
            lambda: next((x for x in proc.log_text().splitlines() if "c2 not served" in x), None),
            timeout_s=60,
            what="the refused load of c2 in the proxy's log",
        )
        assert serving(url) == "c1" and "upstream" in line and "refused to load c2" in line, line
        chat(url, "t-after-corrupt", max_tokens=6, seed=1)
        publish_policy(broker.bootstrap, "c3", make_lora_checkpoint(vllm, checkpoints, "c3", seed=3), "c2")
        wait_for(
            lambda: serving(url) == "c3", timeout_s=60, what="the proxy to serve c3 after the corrupt c2"
        )
    assert one_step(broker.bootstrap, "t-after-corrupt").policy_version == "c1"
    assert vllm.proc.alive() and "c2" not in vllm.models()


def test_openai_fields_through_the_proxy_with_the_openai_sdk(tmp_path, broker, vllm_server):
    """Streaming, stop strings, top_logprobs, a forced tool_choice and an unknown field, with the real
    openai SDK through the proxy on vLLM."""
    from transformers import AutoTokenizer

    vllm, tokenizer = vllm_server, AutoTokenizer.from_pretrained(vllm_server.model_dir)
    user = [{"role": "user", "content": "List the files, then read main.py."}]
    body = {"model": "policy", "messages": user, "seed": 5, "max_tokens": 24, "temperature": 1.0}
    client_records = {"extra_headers": {"X-Agentstream-Record": "client"}}
    with policy_server(tmp_path, broker.bootstrap, vllm.model_dir, "--upstream", vllm.url) as (url, _):

        def api(trajectory_id: str) -> openai.OpenAI:  # a first turn each: its whole prompt in the reply
            base = f"{url}/v1/episodes/{trajectory_id}"
            return openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)

        plain = api("f-plain").chat.completions.create(**body, **client_records).choices[0].message.content
        stream = api("f-stream").chat.completions.create(**body, stream=True)
        deltas = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        # a stop string from the middle of the plain answer: the text ends before it, never streamed
        assert plain and len(plain) >= 11, plain
        stop = plain[8:11]
        expected = plain[: plain.find(stop)]
        stopped = api("f-stop").chat.completions.create(**body, stop=[stop], **client_records)
        streamed_stop = api("f-stop-stream").chat.completions.create(
            **body, stop=stop, stream=True, **client_records
        )
        stop_deltas = "".join(c.choices[0].delta.content or "" for c in streamed_stop if c.choices)
        alternatives = api("f-top").chat.completions.create(
            **body, logprobs=True, top_logprobs=3, **client_records
        )
        forced = api("f-forced").chat.completions.create(
            **body, tools=[{"type": "function", "function": {"name": "bash", "parameters": {}}}],
            tool_choice={"type": "function", "function": {"name": "bash"}}, **client_records,
        )  # fmt: skip
        with pytest.raises(openai.BadRequestError) as unknown:
            api("f-unknown").chat.completions.create(**body, extra_body={"guided_regex": "a+"})
        steps = wait_for(lambda: recorded_steps(broker.bootstrap, "f-stream"), timeout_s=60, what="f-stream")
        time.sleep(2)  # a second step of the stream would have been published by now
        steps = recorded_steps(broker.bootstrap, "f-stream")
    assert deltas == plain and len(steps) == 1 and steps[0].policy_version == "base", (deltas, plain, steps)
    choice, recorded = stopped.choices[0], stopped.model_extra["agentstream"]
    assert recorded["prompt_delta_start"] == 0  # its prompt_token_ids are the whole prompt
    assert (choice.message.content, choice.finish_reason) == (expected, "stop") and stop_deltas == expected
    theirs = direct(vllm, vllm.model, recorded["prompt_token_ids"], max_tokens=24, seed=5, stop=[stop])
    assert recorded["token_ids"] == theirs["token_ids"] and theirs["finish_reason"] == "stop", theirs
    # top_logprobs=3: vLLM's own three most likely tokens at each sampled position
    asked = alternatives.model_extra["agentstream"]
    theirs = direct(vllm, vllm.model, asked["prompt_token_ids"], max_tokens=24, seed=5, logprobs=3)
    assert asked["token_ids"] == theirs["token_ids"]
    content = alternatives.choices[0].logprobs.content
    assert len(content) == len(theirs["logprobs"]["top_logprobs"]) == len(asked["token_ids"])
    for token, vllms in zip(content, theirs["logprobs"]["top_logprobs"], strict=True):
        ours = [alt.logprob for alt in token.top_logprobs]
        assert ours == pytest.approx(sorted(vllms.values(), reverse=True)[:3], abs=1e-5), (ours, vllms)
        assert len(ours) == 3 and ours[0] >= token.logprob and sum(math.exp(lp) for lp in ours) <= 1 + 1e-5
    opening = '\n<tool_call>{"name": "bash", "arguments": '
    opening_ids = tokenizer.encode(opening, add_special_tokens=False)
    assert forced.model_extra["agentstream"]["prompt_token_ids"][-len(opening_ids) :] == opening_ids
    assert forced.choices[0].message.tool_calls or forced.choices[0].message.content.startswith(opening)
    assert unknown.value.body["param"] == "guided_regex" and "guided_regex" in unknown.value.message


def test_a_kill_9_of_vllm_mid_episode_is_a_clear_error_and_no_half_recorded_step(
    tmp_path, broker, vllm_server
):
    """The module's last test: it kills the module's vLLM. vLLM is stopped (SIGSTOP) while a turn is
    sent, so the turn is surely in flight when it is killed (a turn left running could end early on
    an end-of-sequence token)."""
    vllm = vllm_server
    with policy_server(tmp_path, broker.bootstrap, vllm.model_dir, "--upstream", vllm.url) as (url, proxy):
        api = openai.OpenAI(base_url=f"{url}/v1/episodes/t-kill", api_key="none", max_retries=0, timeout=120)
        first = api.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=8, seed=1)
        messages = [*MESSAGES, {"role": "assistant", "content": first.choices[0].message.content or ""},
                    {"role": "user", "content": "And now?"}]  # fmt: skip
        failed: list[Exception] = []

        def second_turn():
            try:
                api.chat.completions.create(model="policy", messages=messages, max_tokens=8, seed=2)
            except Exception as exc:
                failed.append(exc)

        os.killpg(vllm.pid, signal.SIGSTOP)
        turn = threading.Thread(target=second_turn)
        turn.start()
        time.sleep(2)  # the proxy has sent it: it waits on the stopped vLLM
        vllm.proc.kill9()
        turn.join(timeout=120)
        with pytest.raises(openai.APIStatusError) as after:
            api.chat.completions.create(model="policy", messages=messages, max_tokens=8, seed=3)
        assert proxy.alive()
    wait_for(lambda: recorded_steps(broker.bootstrap, "t-kill"), timeout_s=60, what="the first step")
    time.sleep(2)  # a half step would have been published by now
    steps = recorded_steps(broker.bootstrap, "t-kill")
    (mid,) = failed
    assert isinstance(mid, openai.APIStatusError) and mid.status_code == 502, mid
    assert after.value.status_code == 503 and "unreachable" in after.value.message
    for error in (mid, after.value):
        assert f"upstream {vllm.api}" in error.message and error.body["type"] == "server_error"
    assert [s.step_index for s in steps] == [0] and steps[0].token_ids
