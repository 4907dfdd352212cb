"""The engine's continuous batching on the tiny model (CPU): requests sent from threads at once are
decoded together (one forward pass per step for all of them), and each gets what it gets alone:
the same tokens for the same seed, logprobs equal to a fresh forward pass (`score`), its own
adapter (no mixing of versions), its own `on_token` calls; a failing callback fails only its
request."""

from __future__ import annotations

import threading

import pytest

from producers.policy.engine import batching, padded_batch
from producers.policy.engine.local import LocalEngine
from producers.policy.engine.sampling import SamplingParams
from tests.support.processes import wait_for

TOL = 1e-4
ASKS = [  # user messages of different lengths, so the rows of a batch are padded differently
    "Fix it.",
    "List the files, then read main.py and tell me what it does.",
    "The tests fail with an AssertionError in add(). Find the bug, fix it, run the tests again.",
    "ls",
    "Run the tests and say which one failed and why; then propose a patch.",
    "Solve the task.",
    "Print 0123456789 and stop.",
    "def add(a, b): return a - b  # why does assert add(1, 2) == 3 fail?",
]
PARAMS = [  # one request each: seeds, n > 1, greedy, filters
    SamplingParams(seed=1, max_tokens=12),
    SamplingParams(seed=2, max_tokens=20, n=3),
    SamplingParams(temperature=0, max_tokens=9),
    SamplingParams(seed=4, max_tokens=16, top_k=20, top_p=0.9, temperature=0.7),
    SamplingParams(seed=5, max_tokens=6, n=2),
    SamplingParams(temperature=0, max_tokens=14, n=2),
    SamplingParams(seed=7, max_tokens=24),
    SamplingParams(seed=8, max_tokens=3),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from consumers.tiny_model import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("batching-tiny"))


@pytest.fixture(scope="module")
def engine(base):
    return LocalEngine(base, device="cpu")


@pytest.fixture(scope="module")
def prompts(engine):
    return [engine.render([{"role": "user", "content": ask}]) for ask in ASKS]


@pytest.fixture
def batch_sizes(monkeypatch):
    """The number of rows of every decode step."""
    sizes: list[int] = []
    step_inputs = padded_batch.PaddedBatch.step_inputs

    def recorded(self):
        sizes.append(len(self))
        return step_inputs(self)

    monkeypatch.setattr(padded_batch.PaddedBatch, "step_inputs", recorded)
    return sizes


@pytest.fixture
def prefill_sizes(monkeypatch):
    """The number of prompts of every prefill."""
    sizes: list[int] = []
    prefill = batching.Scheduler._prefill

    def recorded(self, adapter, prompts):
        sizes.append(len(prompts))
        return prefill(self, adapter, prompts)

    monkeypatch.setattr(batching.Scheduler, "_prefill", recorded)
    return sizes


def run_together(engine, calls: list) -> list:
    """Run each `call()` in its own thread; their results in order (an error is returned, not
    raised). The calls arrive before the scheduler prefills any of them: the model's lock is held
    until all of them are queued."""
    results: list = [None] * len(calls)

    def run(k: int) -> None:
        try:
            results[k] = calls[k]()
        except Exception as exc:  # handed to the test thread
            results[k] = exc

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(calls))]
    scheduler = engine._shared.scheduler
    with engine._shared.lock:
        before = scheduler.submitted
        for thread in threads:
            thread.start()
        wait_for(lambda: scheduler.submitted - before == len(calls), timeout_s=30, what="requests queued")
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a request never finished"
    return results


def assert_same_samples(got, expected) -> None:
    """The same tokens, ends and texts; logprobs equal up to float rounding (a batched matrix product
    sums in another order than a single row's)."""
    assert not isinstance(got, Exception), got
    assert [s.token_ids for s in got] == [s.token_ids for s in expected]
    assert [(s.finish_reason, s.text) for s in got] == [(s.finish_reason, s.text) for s in expected]
    for one, other in zip(got, expected, strict=True):
        assert one.logprobs == pytest.approx(other.logprobs, abs=TOL)


def _assert_logprobs_are_scores(engine, prompt_ids, samples):
    for sample in samples:
        assert len(sample.logprobs) == len(sample.token_ids) > 0
        assert engine.score(prompt_ids, sample.token_ids) == pytest.approx(sample.logprobs, abs=TOL)


def test_concurrent_requests_decode_together_and_match_sequential_calls(engine, prompts, batch_sizes):
    alone = [engine.generate(p, params) for p, params in zip(prompts, PARAMS, strict=True)]
    assert max(batch_sizes) == 3  # alone: at most one request's rows per step
    batch_sizes.clear()
    calls = [
        lambda p=p, params=params: engine.generate(p, params)
        for p, params in zip(prompts, PARAMS, strict=True)
    ]
    together = run_together(engine, calls)
    rows = sum(1 if params.temperature == 0 else params.n for params in PARAMS)
    assert max(batch_sizes) >= rows - 3  # decoded together (the first request may run one step alone)
    for params, one, other in zip(PARAMS, alone, together, strict=True):
        assert_same_samples(other, one)
        assert len(other) == params.n


def test_batched_logprobs_equal_a_fresh_forward_pass_whatever_the_neighbours(
    engine, prompts, batch_sizes, prefill_sizes
):
    calls = [
        lambda p=p, params=params: engine.generate(p, params)
        for p, params in zip(prompts, PARAMS, strict=True)
    ]
    together = run_together(engine, calls)
    assert max(batch_sizes) > 4
    # prompts of different lengths prefilled together (the decode thread may take the first few
    # before it waits for the lock, the others after)
    assert max(prefill_sizes) >= len(calls) // 2
    lengths = {len(s.token_ids) for samples in together for s in samples}
    assert len(lengths) > 3  # rows left the batch at different steps
    for prompt, samples in zip(prompts, together, strict=True):
        _assert_logprobs_are_scores(engine, prompt, samples)


def test_a_request_arriving_mid_decode_joins_the_running_batch(engine, prompts, batch_sizes, monkeypatch):
    monkeypatch.setattr(engine, "stop_ids", [])  # both requests run to max_tokens
    long = SamplingParams(seed=21, max_tokens=30, n=2)
    short = SamplingParams(seed=22, max_tokens=8)
    expected = engine.generate(prompts[1], short)
    batch_sizes.clear()
    started = threading.Event()
    tokens = []

    def on_token(choice: int, token: int) -> None:  # runs in the decode thread
        tokens.append(token)
        if len(tokens) == 12:  # six steps in: hold this step until the short request waits
            started.set()
            wait_for(lambda: engine._shared.scheduler._pending, timeout_s=30, what="the short request")

    result: list = []
    thread = threading.Thread(target=lambda: result.append(engine.generate(prompts[2], long, on_token)))
    thread.start()
    assert started.wait(60)
    joined = engine.generate(prompts[1], short)
    thread.join(60)
    assert_same_samples(joined, expected)
    assert 3 in batch_sizes  # the two rows of the long request and the newcomer, in one step
    assert [len(s.token_ids) for s in result[0]] == [30, 30]
    _assert_logprobs_are_scores(engine, prompts[2], result[0])


def test_versions_are_batched_apart_and_never_mixed(base, engine, prompts, tmp_path, batch_sizes):
    from infra.bench.policy.reload import make_checkpoint

    adapted = engine.with_checkpoint(make_checkpoint(base, tmp_path, "v1", scale=0.3), "v1")
    params = SamplingParams(seed=31, max_tokens=16, n=2)
    expected = {
        name: [e.generate(p, params) for p in prompts[:4]] for name, e in (("base", engine), ("v1", adapted))
    }
    assert expected["base"] != expected["v1"]
    batch_sizes.clear()
    calls = [lambda e=e, p=p: e.generate(p, params) for e in (engine, adapted) for p in prompts[:4]]
    together = run_together(engine, calls)
    for got, wanted in zip(together, expected["base"] + expected["v1"], strict=True):
        assert_same_samples(got, wanted)
    assert max(batch_sizes) == 8  # each version's four requests together, never more
    for e, prompt, samples in zip([engine] * 4 + [adapted] * 4, prompts[:4] * 2, together, strict=True):
        _assert_logprobs_are_scores(e, prompt, samples)


def test_on_token_sees_every_token_of_every_choice_in_order(engine, prompts):
    seen: list[tuple[int, int]] = []
    samples = engine.generate(
        prompts[0], SamplingParams(seed=41, max_tokens=10, n=3), lambda c, t: seen.append((c, t))
    )
    for choice, sample in enumerate(samples):
        assert [t for c, t in seen if c == choice] == sample.token_ids
    greedy_seen: list[tuple[int, int]] = []
    greedy = engine.generate(
        prompts[0], SamplingParams(temperature=0, max_tokens=5, n=2), lambda c, t: greedy_seen.append((c, t))
    )
    assert [t for c, t in greedy_seen if c == 1] == greedy[1].token_ids == greedy[0].token_ids
    assert len(greedy_seen) == 10


def test_a_failing_callback_fails_its_request_only(engine, prompts):
    params = SamplingParams(seed=51, max_tokens=12)
    expected = engine.generate(prompts[3], params)

    def broken(choice: int, token: int) -> None:
        raise ConnectionResetError("client went away")

    calls = [
        lambda: engine.generate(prompts[2], SamplingParams(seed=52, max_tokens=12), broken),
        lambda: engine.generate(prompts[3], params),
    ]
    failed, fine = run_together(engine, calls)
    assert isinstance(failed, ConnectionResetError)
    assert_same_samples(fine, expected)
    assert_same_samples(engine.generate(prompts[3], params), expected)  # the decode loop still runs
