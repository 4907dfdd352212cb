"""Client-records mode: the episode's token context is kept, nothing is published, and the reply's
`agentstream` object carries the fields the server would have recorded (one code path: step_event)."""

from __future__ import annotations

import asyncio
import threading

from producers.policy.engine.sampling import Sample, SamplingParams
from producers.policy.requests import PolicyConfig
from producers.policy.server import create_app
from producers.policy.service import CLIENT_FIELDS, PolicyService


class CharTokenizer:
    def apply_chat_template(self, messages, **_):
        return "|".join(m["content"] for m in messages)

    def decode(self, token_ids, **_):
        return "#" * len(token_ids)

    def encode(self, text, **_):
        return [ord(c) % 50 for c in text]


class TwoTokenEngine:
    model_name, version, tokenizer_hash = "scripted", "v4", "hash"

    def __init__(self):
        self.tokenizer_lock = threading.Lock()
        self.tokenizer = CharTokenizer()

    def render(self, messages, tools=None):
        return [len(m["content"]) % 50 for m in messages]

    def generate(self, prompt_ids, params: SamplingParams):
        return [Sample([100, 2], [-0.5, -0.1], "stop", "done") for _ in range(params.n)]

    def decode(self, token_ids):
        return "x" * len(token_ids)


class Spool:
    def __init__(self):
        self.events = []

    def publish(self, event):
        self.events.append(event)
        return 1


async def _post(service, path, headers, messages):
    from aiohttp.test_utils import TestClient, TestServer

    async with TestClient(TestServer(create_app(PolicyConfig(), service))) as http:
        response = await http.post(path, json={"model": "policy", "messages": messages}, headers=headers)
        return response.status, await response.json()


def test_client_records_returns_the_step_fields_and_publishes_nothing():
    spool = Spool()
    service = PolicyService(TwoTokenEngine(), spool)
    headers = {"X-Agentstream-Record": "client"}
    first = [{"role": "user", "content": "go"}]
    status, body = asyncio.run(_post(service, "/v1/episodes/t-1/chat/completions", headers, first))
    assert status == 200 and spool.events == []
    fields = body["agentstream"]
    assert set(fields) == set(CLIENT_FIELDS)
    assert (fields["token_ids"], fields["logprobs"]) == ([100, 2], [-0.5, -0.1])
    assert fields["prompt_token_ids"] == [2] and fields["prompt_delta_start"] == 0
    assert (fields["token_continuity"], fields["policy_version"], fields["step_index"]) == ("first", "v4", 0)
    # the episode's context is kept: the next turn (named by header) is tracked against it
    second = [*first, {"role": "assistant", "content": "done"}, {"role": "user", "content": "more"}]
    headers |= {"X-Agentstream-Trajectory": "t-1"}
    status, body = asyncio.run(_post(service, "/v1/chat/completions", headers, second))
    assert status == 200 and spool.events == []
    assert body["agentstream"]["step_index"] == 1 and body["agentstream"]["token_continuity"] != "first"


def test_without_the_header_the_server_records_and_a_bad_value_is_a_400():
    spool = Spool()
    service = PolicyService(TwoTokenEngine(), spool)
    messages = [{"role": "user", "content": "go"}]
    status, body = asyncio.run(_post(service, "/v1/episodes/t-2/chat/completions", {}, messages))
    assert status == 200 and "agentstream" not in body and len(spool.events) == 1
    status, body = asyncio.run(
        _post(service, "/v1/episodes/t-2/chat/completions", {"X-Agentstream-Record": "both"}, messages)
    )
    assert status == 400 and "X-Agentstream-Record" in body["error"]["message"]
