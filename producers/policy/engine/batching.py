"""Continuous batching for one loaded model: `Scheduler` decodes every live request together.

One thread per loaded model (started on the first request, gone after `LINGER_S` idle) runs rounds:
1. admit the requests that arrived: the prompts of one adapter group are prefilled together (one
   forward pass, left-padded; `n` choices share their prompt's row), their first tokens sampled, and
   their rows join the batch of the group;
2. one decode step per adapter group: one forward pass over all rows of the group (`PaddedBatch`),
   the tokens of all rows picked at once (`sampling.pick_rows`), each request recording its own
   (`Job.record`), and finished rows leave.
So a request that arrives while others decode starts at the next round, not after them.

Adapters: rows are batched per adapter name (None: the base), and the groups take turns, one step
each per round, with the group's adapter activated for its step (`SharedModel.use`, under the
model's lock, which `score` takes too). One forward pass never mixes adapters, so a response is
sampled by one version from its first token to its last; a hot swap only changes which adapter
new requests name. peft's mixed-adapter batches would merge the groups; the turn-taking is simpler
and costs one step per extra live version, for the short time two versions overlap.

Reproducibility: each request draws one number per live row per step from its own
`torch.Generator`, in its own row order, and each row's token depends only on that draw and the
row's own logits, so a seed gives the same tokens alone or among others (up to float rounding of
batched matrix products, far below what changes a draw in practice). Logprobs are the raw fp32
log-softmax of each row's logits, as `LocalEngine.score` computes them; padded positions get no
attention weight, so a row's logits are those it has alone.

Limits: at most `max_rows` rows per group (later requests wait for rows to finish); a model whose
cache cannot be padded (`padded_batch.mergeable`) runs one request at a time. An error in a
request's callback fails that request; an error in a forward pass fails the requests of that group;
neither stops the thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from producers.policy.engine.errors import EngineError
from producers.policy.engine.jobs import Job
from producers.policy.engine.padded_batch import PaddedBatch, mergeable
from producers.policy.engine.sampling import pick_rows

log = logging.getLogger(__name__)

LINGER_S = 1.0  # an idle scheduler thread waits this long for a request before it ends
MAX_ROWS = 64  # rows decoded together per adapter group


class Scheduler:
    """The decode loop of one loaded model (`shared`: a `SharedModel`); `run(job)` blocks until
    the job's samples are ready."""

    def __init__(self, shared: Any, max_rows: int = MAX_ROWS):
        self.shared = shared
        self.max_rows = max_rows
        self._cond = threading.Condition()
        self._pending: list[Job] = []
        self._batches: dict[str | None, PaddedBatch] = {}
        self._thread: threading.Thread | None = None
        self._mergeable: bool | None = None  # learnt from the first prefill
        self.submitted = 0  # requests queued so far

    def run(self, job: Job) -> list:
        """Queue `job`, wait for it, return its samples (or raise its error)."""
        if threading.current_thread() is self._thread:
            raise EngineError("generate: called from the engine's decode thread (an on_token callback?)")
        with self._cond:
            self._pending.append(job)
            self.submitted += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="agentstream-decode", daemon=True)
                self._thread.start()
            self._cond.notify()
        return job.wait()

    def _loop(self) -> None:
        import torch

        try:
            with torch.inference_mode():
                while self._round():
                    pass
        except BaseException as exc:  # never leave a caller waiting
            log.exception("policy engine: the decode loop failed")
            self._fail_everything(exc)

    def _round(self) -> bool:
        with self._cond:
            if not self._pending and not self._batches:
                self._cond.wait(LINGER_S)
                if not self._pending and not self._batches:
                    self._thread = None
                    return False
            arrived, self._pending = self._pending, []
        waiting = []
        for adapter in dict.fromkeys(job.adapter for job in arrived):
            admitted = self._room(adapter, [job for job in arrived if job.adapter == adapter])
            waiting += [job for job in arrived if job.adapter == adapter and job not in admitted]
            if admitted:
                self._admit(adapter, admitted)
        if waiting:
            with self._cond:
                self._pending[:0] = waiting
        for adapter, batch in list(self._batches.items()):
            self._step(batch, adapter)
            if not batch:
                del self._batches[adapter]
        return True

    def _room(self, adapter: str | None, jobs: list[Job]) -> list[Job]:
        """The first of `jobs` that fit in the group's batch now (one alone until the cache is known
        to be mergeable, or while an unmergeable one runs)."""
        rows = len(self._batches.get(adapter) or ())
        if not self._mergeable:
            return jobs[:1] if rows == 0 else []
        admitted = []
        for job in jobs:
            if rows and rows + job.rows > self.max_rows:
                break
            admitted.append(job)
            rows += job.rows
        return admitted

    def _admit(self, adapter: str | None, jobs: list[Job]) -> None:
        """Prefill `jobs` together, sample their first tokens, add their live rows to the batch."""
        import torch

        rows = [k for k, job in enumerate(jobs) for _ in range(job.rows)]  # each row's prompt
        owners = [jobs[k] for k in rows]
        try:
            cache, mask, logits = self._prefill(adapter, [job.prompt_ids for job in jobs])
            tokens, ended = _sample(logits[torch.tensor(rows, device=logits.device)], _spans(owners))
        except Exception as exc:
            for job in jobs:
                job.fail(exc)
            return
        if self._mergeable is None:
            self._mergeable = mergeable(cache)
        live = [k for k, end in enumerate(ended) if not end]
        if live:
            batch = self._batches.setdefault(adapter, PaddedBatch())
            batch.admit(cache, mask, *([values[k] for k in live] for values in (rows, owners, tokens)))

    def _prefill(self, adapter: str | None, prompts: list[list[int]]) -> tuple[Any, Any, Any]:
        """One forward pass over `prompts`, left-padded: the cache, its bool mask, and the fp32
        logits of each prompt's next token."""
        import torch

        device = self.shared.device
        width = max(len(prompt) for prompt in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts], device=device)
        inputs = {"input_ids": ids, "use_cache": True, "logits_to_keep": 1}
        if len(prompts) > 1:
            inputs |= {"attention_mask": mask, "position_ids": (mask.cumsum(dim=1) - 1).clamp_(min=0)}
        with self.shared.use(adapter) as model:
            out = model(**inputs)
        return out.past_key_values, mask, out.logits[:, -1, :].float()

    def _step(self, batch: PaddedBatch, adapter: str | None) -> None:
        """One decode step of every row of `batch`, with `adapter` active."""
        try:
            with self.shared.use(adapter) as model:
                out = model(**batch.step_inputs(), use_cache=True, logits_to_keep=1)
            tokens, ended = _sample(out.logits[:, -1, :].float(), _spans(batch.owners))
        except Exception as exc:
            for job in batch.drop_all():
                job.fail(exc)
            return
        batch.stepped(tokens, ended)

    def _fail_everything(self, error: BaseException) -> None:
        with self._cond:
            jobs = self._pending + [job for batch in self._batches.values() for job in batch.drop_all()]
            self._pending, self._batches, self._thread = [], {}, None
        for job in jobs:
            job.fail(error)


def _sample(logits: Any, spans: list[tuple[Job, int, int]]) -> tuple[list[int], list[bool]]:
    """Pick a token for every row of `logits` (the rows of `spans`' jobs), let each job record its
    own; the tokens and which rows ended. A job whose recording fails (its `on_token` callback) is
    failed and its rows end."""
    import torch

    logprobs = torch.log_softmax(logits, dim=-1)
    picked = pick_rows(logits, [(job.params, job.generator, stop - start) for job, start, stop in spans])
    tokens = picked.tolist()
    chosen = logprobs.gather(-1, picked[:, None]).squeeze(-1).tolist()
    top = max(job.params.top_logprobs for job, _, _ in spans)
    tops = _alternatives(logprobs, top) if top else None
    ended: list[bool] = []
    for job, start, stop in spans:
        k = job.params.top_logprobs
        mine = [row[:k] for row in tops[start:stop]] if k and tops is not None else None
        try:
            ended += job.record(tokens[start:stop], chosen[start:stop], mine)
        except Exception as exc:  # its on_token callback, most likely
            job.fail(exc)
            ended += [True] * (stop - start)
    return tokens, ended


def _alternatives(logprobs: Any, k: int) -> list[list[tuple[int, float]]]:
    """Per row, the `k` most likely (token id, logprob), most likely first."""
    values, ids = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
    return [list(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]


def _spans(owners: list[Any]) -> list[tuple[Any, int, int]]:
    """(job, first row, end row) of each run of rows of one job."""
    spans: list[tuple[Any, int, int]] = []
    for row, job in enumerate(owners):
        if spans and spans[-1][0] is job:
            spans[-1] = (job, spans[-1][1], row + 1)
        else:
            spans.append((job, row, row + 1))
    return spans
