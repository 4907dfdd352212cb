"""Judge provider selection and configuration (no HTTP: the SDK objects are built, not called)."""

from __future__ import annotations

import doctest

import httpx
import openai
import pytest
from pydantic import ValidationError

import streams.judge.config as config_module
import streams.judge.providers as providers_module
import streams.judge.providers.base as base_module
import streams.judge.providers.openai as openai_module
from streams.judge.client import JudgeClient
from streams.judge.config import JudgeConfig, JudgeConfigError, read_config, resolve_config
from streams.judge.providers.anthropic import AnthropicProvider
from streams.judge.providers.openai import OpenAIProvider, sdk_base_url

KEYS = ("AGENTSTREAM_JUDGE_API_KEY", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "AGENTSTREAM_JUDGE_PROVIDER")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (*KEYS, "AGENTSTREAM_JUDGE_MODEL", "AGENTSTREAM_JUDGE_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def test_the_provider_comes_from_the_environment_and_picks_the_client(monkeypatch):
    assert JudgeConfig().provider == "anthropic"
    assert isinstance(JudgeClient(JudgeConfig()).provider, AnthropicProvider)
    monkeypatch.setenv("AGENTSTREAM_JUDGE_PROVIDER", "openai")
    monkeypatch.setenv("AGENTSTREAM_JUDGE_MODEL", "Qwen/Qwen2.5-7B-Instruct")
    config = JudgeConfig()
    assert (config.provider, config.model) == ("openai", "Qwen/Qwen2.5-7B-Instruct")
    assert isinstance(JudgeClient(config).provider, OpenAIProvider)


def test_an_unknown_provider_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_JUDGE_PROVIDER", "gemini")
    with pytest.raises(ValidationError, match="gemini"):
        JudgeConfig()


def test_openai_needs_the_served_model_name():
    with pytest.raises(ValidationError, match="provider='openai' needs model"):
        JudgeConfig(provider="openai", api_key="k")


def test_each_provider_uses_its_own_key_variable_and_the_judge_key_wins(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    assert not JudgeConfig().enabled  # an OpenAI key does not turn on the anthropic judge
    openai_config = JudgeConfig(provider="openai", model="m")
    assert openai_config.enabled and openai_config.effective_api_key() == "sk-openai"
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    assert JudgeConfig().effective_api_key() == "sk-ant"
    assert not JudgeConfig(provider="openai", model="m").enabled  # nor the other way round
    monkeypatch.setenv("AGENTSTREAM_JUDGE_API_KEY", "judge-key")
    assert JudgeConfig().effective_api_key() == "judge-key"
    assert JudgeConfig(provider="openai", model="m").effective_api_key() == "judge-key"
    assert JudgeConfig(provider="openai", model="m").key_variable == "OPENAI_API_KEY"


def test_an_empty_key_is_no_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "")
    assert not JudgeConfig(provider="openai", model="m").enabled


def test_the_openai_sdk_gets_the_key_base_url_and_no_retries_of_its_own():
    config = JudgeConfig(
        provider="openai", model="m", api_key="k", base_url="http://127.0.0.1:9/v1/chat/completions"
    )
    client = OpenAIProvider().make_client(config)
    assert client.api_key == "k" and client.max_retries == 0
    assert str(client.base_url) == "http://127.0.0.1:9/v1/"
    assert sdk_base_url("http://h:1/v1") == "http://h:1/v1" and sdk_base_url(None) is None


def _completion(finish_reason, content, usage):
    return openai.types.chat.ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "served-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": finish_reason,
                }
            ],
            "usage": usage,
        }
    )


def test_a_chat_completion_reads_as_the_messages_api_would():
    usage = {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}
    answer = OpenAIProvider().read(_completion("length", '{"scores": {}}', usage))
    assert (answer.text, answer.model) == ('{"scores": {}}', "served-model")
    assert (answer.input_tokens, answer.output_tokens, answer.stop_reason) == (120, 30, "max_tokens")
    empty = OpenAIProvider().read(_completion("stop", None, None))  # no content, no usage reported
    assert (empty.text, empty.input_tokens, empty.output_tokens, empty.stop_reason) == ("", 0, 0, "end_turn")


def _status_error(status: int, headers: dict[str, str]) -> openai.APIStatusError:
    response = httpx.Response(status, headers=headers, request=httpx.Request("POST", "http://h/v1"))
    return openai.APIStatusError("scripted", response=response, body=None)


@pytest.mark.parametrize(
    ("status", "headers", "retryable", "wait"),
    [
        (429, {"retry-after": "3"}, True, 3.0),
        (503, {"retry-after-ms": "250"}, True, 0.25),
        (500, {}, True, None),
        (400, {}, False, None),
        (404, {}, False, None),
    ],
)
def test_openai_errors_classify_like_anthropic_ones(status, headers, retryable, wait):
    failure = OpenAIProvider().classify(_status_error(status, headers))
    assert (failure.status, failure.retryable, failure.retry_after_s) == (status, retryable, wait)


def test_connection_errors_retry_and_bugs_are_not_call_errors():
    request = httpx.Request("POST", "http://h/v1")
    provider = OpenAIProvider()
    assert provider.classify(openai.APITimeoutError(request)).retryable
    assert provider.classify(openai.APIConnectionError(request=request)).status is None
    assert provider.classify(KeyError("a bug")) is None


@pytest.mark.parametrize("module", [config_module, providers_module, base_module, openai_module])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_an_invalid_setting_in_the_environment_is_one_line_naming_variable_and_value(monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_JUDGE_PROVIDER", "gemini")
    with pytest.raises(JudgeConfigError, match=r"AGENTSTREAM_JUDGE_PROVIDER: .*'openai' \(got 'gemini'\)"):
        read_config()
    monkeypatch.setenv("AGENTSTREAM_JUDGE_PROVIDER", "openai")
    with pytest.raises(JudgeConfigError, match=r"provider='openai' needs model \(AGENTSTREAM_JUDGE_MODEL\)"):
        resolve_config(None)  # the worker's path
    monkeypatch.setenv("AGENTSTREAM_JUDGE_MODEL", "m")
    monkeypatch.setenv("AGENTSTREAM_JUDGE_CONCURRENCY", "0")
    with pytest.raises(JudgeConfigError) as info:
        read_config()
    assert "\n" not in str(info.value) and "AGENTSTREAM_JUDGE_CONCURRENCY" in str(info.value)
    assert "(got '0')" in str(info.value)
