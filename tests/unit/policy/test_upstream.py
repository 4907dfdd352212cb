"""The recording proxy's engine against a scripted vLLM-like upstream (tests/support/upstream_stub.py):
the `--upstream` URL forms, what a completion asks and records, top logprobs and stop strings, and the
errors a client gets when the upstream fails (nothing recorded then)."""

from __future__ import annotations

import shutil
import socket

import pytest

from producers.policy.engine.errors import EngineError
from producers.policy.engine.sampling import SamplingParams
from producers.policy.requests import parse_chat
from producers.policy.service import PolicyService
from producers.policy.upstream import UpstreamEngine
from producers.policy.upstream_api import UpstreamError, api_base
from tests.support.upstream_stub import scripted_upstream

PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from consumers.tiny_model import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("models"))


@pytest.fixture
def upstream():
    with scripted_upstream() as server:
        yield server


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_the_upstream_is_taken_with_or_without_v1(tokenizer_dir, upstream, suffix):
    engine = UpstreamEngine(upstream.url + suffix, tokenizer_dir)
    engine.generate(PROMPT, SamplingParams(max_tokens=3))
    assert engine.upstream == f"{upstream.url}/v1"
    assert upstream.paths() == ["/v1/models", "/v1/completions"]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://127.0.0.1:8000", "http:// or https://"),
        ("127.0.0.1:8000", "http:// or https://"),
        ("http://", "names no host"),
        ("http://127.0.0.1:8000/v1?model=x", "no query or fragment"),
        ("http://127.0.0.1:8000/v1#x", "no query or fragment"),
        ("http://127.0.0.1:port/v1", "not a URL"),
        ("http://127.0.0.1:8000/ v1", "without spaces"),
    ],
)
def test_a_bad_upstream_url_is_an_error_naming_the_option_and_the_value(url, says):
    with pytest.raises(EngineError) as refused:
        api_base(url)
    assert str(refused.value).startswith("--upstream: ") and says in str(refused.value)
    assert repr(url) in str(refused.value)


def test_a_url_with_credentials_is_refused_without_echoing_the_password():
    with pytest.raises(EngineError, match="credentials") as refused:
        api_base("http://user:s3cret@127.0.0.1:8000/v1")
    assert "s3cret" not in str(refused.value)


def test_a_completion_asks_for_token_ids_and_logprobs_and_records_base(tokenizer_dir, upstream):
    engine = UpstreamEngine(upstream.url, tokenizer_dir)
    samples = engine.generate(PROMPT, SamplingParams(max_tokens=3, seed=7, n=2, temperature=0.5, top_k=4))
    (body,) = upstream.bodies("/v1/completions")
    assert body["model"] == "tiny-base" == engine.model_name and body["prompt"] == PROMPT
    sent = (body["seed"], body["n"], body["temperature"], body["top_k"], body["max_tokens"])
    assert sent == (7, 2, 0.5, 4, 3)
    assert body["return_token_ids"] is True and body["return_tokens_as_token_ids"] is True
    assert body["logprobs"] == 1 and "stop" not in body
    # not the model's generation_config.json defaults that vLLM would apply to fields left out
    assert (body["repetition_penalty"], body["min_p"], body["presence_penalty"]) == (1.0, 0.0, 0.0)
    assert [s.token_ids for s in samples] == [[5, 6, 7]] * 2
    assert samples[0].logprobs == [-0.5, -1.25, -0.75] and samples[0].finish_reason == "length"
    assert {s.policy_version for s in samples} == {"base"} and samples[0].top_logprobs is None
    assert samples[0].text == engine.decode([5, 6, 7])


def test_an_agentstream_upstream_reports_the_version_it_serves_and_gets_only_its_fields(
    tokenizer_dir, upstream
):
    upstream.headers["x-agentstream-policy-version"] = "v9"
    upstream.owned_by = "agentstream"
    engine = UpstreamEngine(upstream.url, tokenizer_dir)
    assert engine.generate(PROMPT, SamplingParams(max_tokens=3))[0].policy_version == "v9"
    (body,) = upstream.bodies("/v1/completions")
    assert "repetition_penalty" not in body and "top_k" not in body


def test_top_logprobs_are_the_k_best_token_ids_and_text_is_cut_at_a_stop_string(tokenizer_dir, upstream):
    engine = UpstreamEngine(upstream.url, tokenizer_dir)
    full = engine.decode([5, 6, 7])
    stop = full[len(full) // 2 :][:2]
    (sample,) = engine.generate(PROMPT, SamplingParams(max_tokens=3, top_logprobs=2, stop=(stop,)))
    (body,) = upstream.bodies("/v1/completions")
    assert body["logprobs"] == 2 and body["stop"] == [stop]
    # the stub answers k + 1 entries, the sampled token's the best and last: sorted, cut to k
    assert sample.top_logprobs == [
        [(5, -0.5), (106, -2.5)],
        [(6, -1.25), (107, -3.25)],
        [(7, -0.75), (108, -2.75)],
    ]
    assert sample.text == full[: full.index(stop)] and sample.token_ids == [5, 6, 7]


def test_on_token_gets_every_token_of_every_choice_once_the_reply_is_in(tokenizer_dir, upstream):
    engine = UpstreamEngine(upstream.url, tokenizer_dir)
    seen = []
    engine.generate(PROMPT, SamplingParams(max_tokens=3, n=2), on_token=lambda i, t: seen.append((i, t)))
    assert seen == [(0, 5), (0, 6), (0, 7), (1, 5), (1, 6), (1, 7)]


def test_the_context_length_is_the_smaller_of_the_models_and_the_upstreams(tokenizer_dir):
    with scripted_upstream(max_model_len=100) as upstream:
        assert UpstreamEngine(upstream.url, tokenizer_dir).context_length == 100


def test_the_base_model_id_is_unknown_for_a_tokenizer_only_directory(tokenizer_dir, upstream, tmp_path):
    for file in tokenizer_dir.iterdir():  # the tokenizer and its template, no weights, no config
        if file.suffix not in (".safetensors", ".bin") and file.name != "config.json":
            shutil.copy(file, tmp_path / file.name)
    only = UpstreamEngine(upstream.url, tmp_path)
    full = UpstreamEngine(upstream.url, tokenizer_dir)
    assert only.base_model_id == "" and len(full.base_model_id) == 16
    assert only.tokenizer_hash == full.tokenizer_hash


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_upstream_failures_reach_the_client_as_openai_errors_naming_it(tokenizer_dir, upstream):
    engine = UpstreamEngine(upstream.url, tokenizer_dir)
    upstream.drop = True
    with pytest.raises(UpstreamError) as dropped:
        engine.generate(PROMPT, SamplingParams(max_tokens=3))
    upstream.finish_reason = "abort"
    with pytest.raises(UpstreamError) as bad:
        engine.generate(PROMPT, SamplingParams(max_tokens=3))
    upstream.base = "gone"  # the upstream no longer serves that model: its 404
    with pytest.raises(UpstreamError) as refused:
        engine.generate(PROMPT, SamplingParams(max_tokens=3))
    assert dropped.value.status == 502 and bad.value.status == 502 and refused.value.status == 502
    assert "finish_reason 'abort'" in bad.value.message and "HTTP 404" in refused.value.message
    for error in (dropped, bad, refused):
        assert f"upstream {upstream.url}/v1" in error.value.message
        assert error.value.body()["error"]["type"] == "server_error"


def test_an_upstream_gone_after_the_start_is_a_503(tokenizer_dir):
    with scripted_upstream() as upstream:
        engine = UpstreamEngine(upstream.url, tokenizer_dir)
    with pytest.raises(UpstreamError) as down:  # its port is closed now
        engine.generate(PROMPT, SamplingParams(max_tokens=3))
    assert down.value.status == 503 and f"upstream {upstream.url}/v1: unreachable" in down.value.message


def test_an_upstream_that_cannot_list_its_models_stops_the_start(tokenizer_dir):
    with pytest.raises(EngineError, match=r"--upstream http://127\.0\.0\.1:\d+/v1: cannot list its models"):
        UpstreamEngine(f"http://127.0.0.1:{_closed_port()}", tokenizer_dir)


class Spool:
    def __init__(self):
        self.events = []

    def publish(self, event):
        self.events.append(event)
        return 1


def test_a_failed_upstream_call_records_no_step_and_does_not_count_one(tokenizer_dir, upstream):
    recorder = Spool()
    service = PolicyService(UpstreamEngine(upstream.url, tokenizer_dir), recorder)
    request = parse_chat(
        {"model": "tiny-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        service.models(),
    )
    upstream.drop = True
    with pytest.raises(UpstreamError):
        service.complete(request, "t-1")
    assert recorder.events == []
    service.complete(request, "t-1")
    (step,) = recorder.events
    assert step.step_index == 0 and step.policy_version == "base" and step.token_ids == [5, 6, 7]
    assert step.model == "tiny-base" and step.logprobs == [-0.5, -1.25, -0.75]
