"""Judge settings: provider, endpoint, model, concurrency, retries, circuit breaker, budget, prices,
rule files.

One `JudgeConfig` per process, read once in `main()` (or by the worker's app factory) and passed down.
Environment: `AGENTSTREAM_JUDGE_<FIELD>`. `provider` picks the API (streams/judge/providers/):
"anthropic" (the Messages API, the default) or "openai" (chat completions: OpenAI, vLLM, SGLang,
the policy server). The API key is `AGENTSTREAM_JUDGE_API_KEY`, else the provider's own variable
(`ANTHROPIC_API_KEY` or `OPENAI_API_KEY`; the other provider's is never used). Without a key the
judge is off (`enabled` is False) and no judge processor is registered. docs/judge.md has examples.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.errors import StreamsError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "claude-sonnet-4-6"
Provider = Literal["anthropic", "openai"]
KEY_VARIABLES = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


class JudgeConfigError(StreamsError):
    """A judge setting read from the environment is invalid (names the variable and the value)."""


class ModelPrice(BaseModel):
    """USD per million tokens."""

    model_config = ConfigDict(frozen=True)

    input_per_mtok: float = Field(ge=0.0)
    output_per_mtok: float = Field(ge=0.0)


# List prices (USD / Mtok) as known when written; VERIFY against the provider's price page and
# override with AGENTSTREAM_JUDGE_PRICES='{"model": {"input_per_mtok": x, "output_per_mtok": y}}'.
# Dated ids fall back to their family by prefix (see `price_for`).
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "claude-sonnet-4-6": ModelPrice(input_per_mtok=3.0, output_per_mtok=15.0),
    "claude-sonnet-4-5": ModelPrice(input_per_mtok=3.0, output_per_mtok=15.0),
    "claude-haiku-4-5": ModelPrice(input_per_mtok=1.0, output_per_mtok=5.0),
    "claude-opus-4-5": ModelPrice(input_per_mtok=5.0, output_per_mtok=25.0),
    "claude-opus-4-1": ModelPrice(input_per_mtok=15.0, output_per_mtok=75.0),
    "gpt-4.1": ModelPrice(input_per_mtok=2.0, output_per_mtok=8.0),
    "gpt-4.1-mini": ModelPrice(input_per_mtok=0.4, output_per_mtok=1.6),
    "gpt-4o": ModelPrice(input_per_mtok=2.5, output_per_mtok=10.0),
    "gpt-4o-mini": ModelPrice(input_per_mtok=0.15, output_per_mtok=0.6),
}


class JudgeConfig(BaseSettings):
    """Everything the judge processor needs besides the broker address."""

    # An empty variable is not given (AGENTSTREAM_JUDGE_RULES_PATH= means no rules file, not ".").
    model_config = SettingsConfigDict(
        env_prefix="AGENTSTREAM_JUDGE_", extra="ignore", frozen=True, env_ignore_empty=True
    )

    provider: Provider = Field(
        "anthropic",
        description="the judge's API: 'anthropic' (Messages API) or 'openai' (chat completions: "
        "OpenAI, vLLM, SGLang, the policy server)",
    )
    api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("AGENTSTREAM_JUDGE_API_KEY", "api_key"),
        description="the judge's API key; None = the provider's own variable (see `effective_api_key`)",
    )
    anthropic_api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("ANTHROPIC_API_KEY", "anthropic_api_key"),
        description="provider 'anthropic': the key when api_key is not given",
    )
    openai_api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("OPENAI_API_KEY", "openai_api_key"),
        description="provider 'openai': the key when api_key is not given",
    )
    base_url: str | None = Field(
        None,
        description="anthropic: the Messages-API root (None = Anthropic's); openai: the chat-completions "
        "base URL, e.g. http://host:8000/v1 (a URL ending in /chat/completions works too; None = OpenAI's)",
    )
    model: str = Field(
        DEFAULT_MODEL, description="the judge model; provider 'openai' needs it given (the served name)"
    )
    rules_path: Path | None = Field(
        None,
        description="judge rules file (YAML/JSON); None = the default rule (every trajectory, judged as a "
        "whole: selection.DEFAULT_RULE); a missing file is an error",
    )
    rubrics_path: Path | None = Field(
        None, description="rubric overrides per domain (YAML/JSON); None = built-ins; missing file = error"
    )
    max_tokens: int = Field(1024, ge=16)
    temperature: float | None = Field(None, ge=0.0, le=1.0, description="sent only when set")
    concurrency: int = Field(32, ge=1, description="judge calls in flight per worker")
    timeout_s: float = Field(60.0, gt=0.0, description="per HTTP attempt")
    max_attempts: int = Field(5, ge=1, description="attempts per call, first one included")
    backoff_base_s: float = Field(0.5, ge=0.0)
    backoff_max_s: float = Field(30.0, ge=0.0)
    max_retry_after_s: float = Field(
        120.0,
        ge=0.0,
        description="a retry-after longer than this fails the call instead of stalling the stream",
    )
    circuit_failures: int = Field(5, ge=1, description="consecutive failed calls that open the circuit")
    circuit_reset_s: float = Field(30.0, ge=0.0, description="open circuit: wait before one trial call")
    budget_usd_per_hour: float | None = Field(None, ge=0.0)
    budget_usd_per_day: float | None = Field(None, ge=0.0)
    prices: dict[str, ModelPrice] = Field(default_factory=lambda: dict(DEFAULT_PRICES))
    cache_entries: int = Field(100_000, ge=0, description="content-hash cache size (0 = off)")
    take_max: int = Field(256, ge=1, description="events taken from the stream per batch")
    take_within_s: float = Field(0.2, gt=0.0, description="max wait to fill a batch")
    group_wait_s: float = Field(120.0, gt=0.0, description="group mode: judge after this quiet period")
    state_ttl_s: float = Field(
        6 * 3600.0, gt=0.0, description="forget judged trajectories / groups after this long (bounded state)"
    )
    step_wait_s: float = Field(
        30.0,
        gt=0.0,
        description="step mode: judge a part-filled step batch after this long (batch_steps > 1)",
    )
    observation_chars: int = Field(2000, ge=100, description="observation text shown per step")

    @model_validator(mode="after")
    def _openai_needs_a_model(self) -> JudgeConfig:
        if self.provider == "openai" and "model" not in self.model_fields_set:
            raise ValueError(
                f"provider='openai' needs model (AGENTSTREAM_JUDGE_MODEL), the name the endpoint serves; "
                f"the default model={DEFAULT_MODEL!r} is Anthropic's"
            )
        return self

    @property
    def key_variable(self) -> str:
        """The provider's own API-key variable (`ANTHROPIC_API_KEY` or `OPENAI_API_KEY`)."""
        return KEY_VARIABLES[self.provider]

    def effective_api_key(self) -> str | None:
        """The key sent: `api_key` (AGENTSTREAM_JUDGE_API_KEY), else the provider's own variable's;
        None when neither is set (or both are empty).

        >>> JudgeConfig(provider="openai", model="m", api_key="k").effective_api_key()
        'k'
        >>> only_anthropic = {"api_key": None, "openai_api_key": None, "anthropic_api_key": "a"}
        >>> JudgeConfig(provider="openai", model="m", **only_anthropic).enabled
        False
        """
        own = self.openai_api_key if self.provider == "openai" else self.anthropic_api_key
        for secret in (self.api_key, own):
            if secret is not None and secret.get_secret_value():
                return secret.get_secret_value()
        return None

    @property
    def enabled(self) -> bool:
        return self.effective_api_key() is not None

    def price_for(self, model: str) -> ModelPrice | None:
        """The price of a model; a dated id falls back to its undated family (longest prefix)."""
        if model in self.prices:
            return self.prices[model]
        matches = [name for name in self.prices if model.startswith(name)]
        return self.prices[max(matches, key=len)] if matches else None


def resolve_config(config: object | None) -> JudgeConfig:
    """A `JudgeConfig` from what a caller passes: one itself, an object with a `.judge` attribute
    holding one, or None / anything else (read from the environment; a `judge_rules_path`
    attribute, as on the worker's config, overrides the rules file)."""
    if isinstance(config, JudgeConfig):
        return config
    nested = getattr(config, "judge", None)
    if isinstance(nested, JudgeConfig):
        return nested
    judge = read_config()
    # The worker's --judge-rules (WorkerConfig.judge_rules_path) wins over the environment, so the
    # assembler and the judge always read the same rules file.
    rules_path = getattr(config, "judge_rules_path", None)
    if rules_path is not None:
        judge = judge.model_copy(update={"rules_path": Path(rules_path)})
    return judge


def read_config() -> JudgeConfig:
    """`JudgeConfig` from the environment; an invalid setting is a `JudgeConfigError`, one line
    naming each variable and the value received (the CLI prints it without a traceback)."""
    try:
        return JudgeConfig()
    except ValidationError as exc:
        raise JudgeConfigError("invalid judge setting: " + "; ".join(map(_problem, exc.errors()))) from None


def _problem(error: dict) -> str:
    """One validation error as `VARIABLE: message (got value)`; secrets are never shown."""
    message = error["msg"].removeprefix("Value error, ")
    where = "_".join(str(part) for part in error["loc"]).upper()
    if not where:
        return message  # a check across fields: its message names them
    variable = where if where.endswith("API_KEY") else f"AGENTSTREAM_JUDGE_{where}"
    value = error.get("input")
    if "KEY" in where or isinstance(value, dict):
        return f"{variable}: {message}"
    return f"{variable}: {message} (got {value!r})"
