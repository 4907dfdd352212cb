"""The judge's model client: one provider's SDK (streams/judge/providers/), with our own retry policy.

`JudgeConfig.provider` picks the API: the anthropic SDK's `AsyncAnthropic` (Messages API) or the
openai SDK's `AsyncOpenAI` (chat completions). The provider only sends a request and reads its
reply; everything below is this module's, the same for every provider:

- Bounded concurrency: a semaphore around each HTTP attempt (not around back-off sleeps).
- Timeouts: `timeout_s` per attempt (the SDK's timeout).
- Retries: the SDK's own retries are off (`max_retries=0`) so there is one policy, ours: up to
  `max_attempts` attempts on 408/409/429/5xx (529 "overloaded" included) and connection errors or
  timeouts, exponential back-off with full jitter, and never less than the server's `retry-after` /
  `retry-after-ms`. Other 4xx are not retried: the request itself is wrong.
- Circuit breaker: after `circuit_failures` consecutive failed calls the circuit opens and calls
  fail at once (kind "circuit_open") for `circuit_reset_s`; then one trial call is let through
  (half-open) and its outcome closes or re-opens the circuit.

Clock, sleep and randomness are injectable so tests run without real waiting.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from streams.errors import JudgeCallError
from streams.judge.config import JudgeConfig
from streams.judge.prompt import Prompt
from streams.judge.providers import provider_for
from streams.judge.providers.base import Answer, Failure, Provider

__all__ = ["CallResult", "CircuitBreaker", "JudgeClient", "backoff_delay"]

log = logging.getLogger(__name__)

# Request-specific errors: the endpoint is healthy, our request is not; they do not trip the breaker.
REQUEST_ERRORS = frozenset({400, 404, 413, 422})


@dataclass(frozen=True)
class CallResult:
    text: str
    model: str
    input_tokens: int
    output_tokens: int
    latency_ms: float
    attempts: int
    stop_reason: str | None = None


class CircuitBreaker:
    """Closed -> open after N consecutive failures -> half-open after `reset_s` -> closed on success."""

    def __init__(self, failures: int, reset_s: float, clock: Callable[[], float] = time.monotonic):
        self.threshold = failures
        self.reset_s = reset_s
        self.clock = clock
        self.consecutive = 0
        self.opened_at: float | None = None
        self.trial_in_flight = False

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half_open" if self.clock() - self.opened_at >= self.reset_s else "open"

    def allow(self) -> bool:
        """Whether a call may go out now (claims the single trial slot when half-open)."""
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self.trial_in_flight:
            self.trial_in_flight = True
            return True
        return False

    def record_success(self) -> None:
        if self.opened_at is not None:
            log.info("judge circuit closed after a successful trial call")
        self.consecutive = 0
        self.opened_at = None
        self.trial_in_flight = False

    def record_failure(self) -> None:
        self.consecutive += 1
        was_trial = self.trial_in_flight
        self.trial_in_flight = False
        if was_trial or (self.opened_at is None and self.consecutive >= self.threshold):
            self.opened_at = self.clock()
            log.warning("judge circuit open after %d consecutive failures", self.consecutive)


def backoff_delay(
    attempt: int, base_s: float, max_s: float, retry_after_s: float | None, rng=random.random
) -> float:
    """Seconds to wait before attempt `attempt + 1`: full jitter, at least the server's retry-after.

    >>> backoff_delay(1, 0.5, 30.0, None, rng=lambda: 1.0)
    0.5
    >>> backoff_delay(3, 0.5, 30.0, 2.5, rng=lambda: 0.0)
    2.5
    """
    ceiling = min(max_s, base_s * 2 ** (attempt - 1))
    jittered = ceiling * rng()
    if retry_after_s is not None:
        return max(retry_after_s, jittered)
    return jittered


class JudgeClient:
    """One judge endpoint (of `config.provider`'s API), used by every judge call of a worker."""

    def __init__(
        self,
        config: JudgeConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
        provider: Provider | None = None,
    ):
        self.config = config
        self.provider = provider or provider_for(config.provider)
        self.clock = clock
        self.sleep = sleep
        self.rng = rng
        self.breaker = CircuitBreaker(config.circuit_failures, config.circuit_reset_s, clock)
        self._semaphore: asyncio.Semaphore | None = None
        self._sdk = None
        self.calls = 0
        self.http_attempts = 0

    def _client(self):
        if self._sdk is None:
            self._sdk = self.provider.make_client(self.config)
            self._semaphore = asyncio.Semaphore(self.config.concurrency)
            _quiet_http_logs()
        return self._sdk

    async def close(self) -> None:
        if self._sdk is not None:
            await self._sdk.close()
            self._sdk = None

    async def complete(self, prompt: Prompt) -> CallResult:
        """One judge call with retries; raises JudgeCallError when it fails for good."""
        sdk = self._client()
        self.calls += 1
        started = self.clock()
        for attempt in range(1, self.config.max_attempts + 1):
            if not self.breaker.allow():
                raise JudgeCallError("circuit open: the judge endpoint keeps failing", kind="circuit_open")
            try:
                reply = await self._attempt(sdk, prompt)
            except Exception as exc:
                failure = self.provider.classify(exc)
                if failure is None:
                    raise  # a bug, not an endpoint failure: never turned into a failure event
                await self._after_failure(exc, failure, attempt)
                continue
            self.breaker.record_success()
            answer = self.provider.read(reply)
            return _result(answer, (self.clock() - started) * 1000.0, attempt)
        raise AssertionError("unreachable")  # the loop always returns or raises

    async def _after_failure(self, exc: Exception, failure: Failure, attempt: int) -> None:
        """Raise JudgeCallError when this failure is final; else wait the back-off before the next try."""
        wait = failure.retry_after_s
        too_long = wait is not None and wait > self.config.max_retry_after_s
        if not failure.retryable or too_long or attempt == self.config.max_attempts:
            self._record_final_failure(failure.status)
            reason = _describe(exc, failure.status, attempt)
            if too_long:
                reason += f" (retry-after {wait:.0f}s exceeds max_retry_after_s)"
            raise JudgeCallError(reason, attempts=attempt, status=failure.status) from None
        self.breaker.trial_in_flight = False  # a retry may claim the trial slot again
        delay = backoff_delay(attempt, self.config.backoff_base_s, self.config.backoff_max_s, wait, self.rng)
        log.info(
            "judge call attempt %d failed (%s); retrying in %.2fs", attempt, failure.status or exc, delay
        )
        await self.sleep(delay)

    async def _attempt(self, sdk, prompt: Prompt):
        assert self._semaphore is not None
        async with self._semaphore:
            self.http_attempts += 1
            return await self.provider.send(sdk, self.config, prompt)

    def _record_final_failure(self, status: int | None) -> None:
        if status in REQUEST_ERRORS:
            self.breaker.trial_in_flight = False
        else:
            self.breaker.record_failure()


def _quiet_http_logs() -> None:
    """The HTTP client logs every request at INFO; one line per judge call would drown a worker's
    log. Raise it to WARNING unless someone configured those loggers explicitly."""
    for name in ("httpx", "httpx2", "httpcore"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def _describe(exc: Exception, status: int | None, attempts: int) -> str:
    what = f"HTTP {status}" if status else type(exc).__name__
    detail = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{what} after {attempts} attempt(s): {detail}".rstrip(": ")


def _result(answer: Answer, latency_ms: float, attempts: int) -> CallResult:
    return CallResult(
        text=answer.text,
        model=answer.model,
        input_tokens=answer.input_tokens,
        output_tokens=answer.output_tokens,
        latency_ms=latency_ms,
        attempts=attempts,
        stop_reason=answer.stop_reason,
    )
