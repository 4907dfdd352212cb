"""One `generate` call as the scheduler sees it (`Job`): its rows (one per choice; one for greedy,
whose choices are all the same), its own `torch.Generator`, what each row sampled so far, and when a
row ends (a stop token, a stop string in its decoded text, `max_tokens`).

The scheduler picks the tokens of all rows at once (`sampling.pick_rows`, each job's rows drawn from
its own generator, in its own row order) and hands each job its rows' tokens (`record`). A job must
not touch the model or the batch (the scheduler owns those).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from producers.policy.engine.sampling import Sample, SamplingParams, cut_at_stop, is_greedy

OnToken = Callable[[int, int], None]


@dataclass
class Row:
    """What one choice sampled so far."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "length"
    text: str | None = None  # decoded when stop strings are watched


class Job:
    """One `generate` call: rows sampled with its own generator; `wait()` returns its samples."""

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        adapter: str | None,
        stop_ids: list[int],
        decode: Callable[[list[int]], str],
        on_token: OnToken | None = None,
        device: str = "cpu",
    ):
        import torch

        self.prompt_ids = prompt_ids
        self.params = params
        self.adapter = adapter
        self.stop_ids = frozenset(stop_ids)
        self.decode = decode
        self.on_token = on_token
        self.rows = 1 if is_greedy(params) else params.n  # greedy rows would all be the same
        self.results = [Row() for _ in range(self.rows)]
        self.alive = list(range(self.rows))  # rows still sampling, in batch order
        self.generator = None
        if params.seed is not None:
            self.generator = torch.Generator(device=device).manual_seed(params.seed)
        self.error: BaseException | None = None
        self._done = threading.Event()

    def record(
        self, tokens: list[int], logprobs: list[float], tops: list[list[tuple[int, float]]] | None
    ) -> list[bool]:
        """The tokens sampled for the live rows (in order), their raw logprobs and, when asked, their
        alternatives; returns which rows ended. A row's end and the job's end are recorded here."""
        ended = []
        for k, (row, token, logprob) in enumerate(zip(self.alive, tokens, logprobs, strict=True)):
            result = self.results[row]
            result.tokens.append(token)
            result.logprobs.append(logprob)
            if tops is not None:
                result.top.append(tops[k])
            self._announce(row, token)
            ended.append(self._ends(result, token))
        self.alive = [row for row, end in zip(self.alive, ended, strict=True) if not end]
        if not self.alive:
            self._done.set()
        return ended

    def _announce(self, row: int, token: int) -> None:
        if self.on_token is None:
            return
        for choice in range(self.params.n) if self.rows == 1 else (row,):
            self.on_token(choice, token)

    def _ends(self, result: Row, token: int) -> bool:
        if token in self.stop_ids:
            result.finish_reason = "stop"
            return True
        if self.params.stop:
            result.text = self.decode(result.tokens)
            if cut_at_stop(result.text, self.params.stop)[1]:
                result.finish_reason = "stop"
                return True
        return len(result.tokens) >= self.params.max_tokens

    def fail(self, error: BaseException) -> None:
        """End the job with `error` (raised to the caller by `wait`)."""
        if self.error is None:
            self.error = error
        self.alive = []
        self._done.set()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self) -> list[Sample]:
        self._done.wait()
        if self.error is not None:
            raise self.error
        if self.rows == 1:  # greedy: every choice is the one row (each Sample its own lists)
            return [self._sample(self.results[0]) for _ in range(self.params.n)]
        return [self._sample(result) for result in self.results]

    def _sample(self, result: Row) -> Sample:
        text = result.text if result.text is not None else self.decode(result.tokens)
        text = cut_at_stop(text, self.params.stop)[0]
        top = result.top if self.params.top_logprobs else None
        return Sample(
            list(result.tokens), list(result.logprobs), result.finish_reason, text, top_logprobs=top
        )
