"""The engine's OpenAI sampling fields on the tiny model (CPU): stop strings end a choice where its
decoded text first holds one (tokens kept up to the one that completed it, text cut before it);
`top_logprobs` are the real most likely alternatives of the raw log-softmax, sorted, holding the
sampled token when it is among them; both alone and among concurrent requests."""

from __future__ import annotations

import threading

import pytest

from producers.policy.engine.local import LocalEngine
from producers.policy.engine.sampling import SamplingParams, cut_at_stop

TOL = 1e-4


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from consumers.tiny_model import tiny_model_dir

    return LocalEngine(tiny_model_dir(tmp_path_factory.mktemp("fields-tiny")), device="cpu")


@pytest.fixture(scope="module")
def prompt(engine):
    return engine.render([{"role": "user", "content": "Write the answer, then say END."}])


@pytest.fixture
def no_stop_tokens(engine, monkeypatch):
    monkeypatch.setattr(engine, "stop_ids", [])  # choices run until max_tokens or a stop string


def _first_prefix_holding(engine, tokens: list[int], stop: str) -> int:
    return next(k for k in range(1, len(tokens) + 1) if stop in engine.decode(tokens[:k]))


def _a_stop_string(engine, tokens: list[int]) -> str:
    """Three printable characters the text of `tokens` first holds around its middle."""
    for k in range(len(tokens) // 2, len(tokens)):
        text = engine.decode(tokens[:k])
        candidate = text[-3:]
        if (
            len(candidate) == 3
            and candidate.isprintable()
            and candidate not in engine.decode(tokens[: k - 1])
        ):
            return candidate
    raise AssertionError(f"no stop string found in {engine.decode(tokens)!r}")


def test_a_stop_string_ends_the_choice_and_is_cut_from_its_text(engine, prompt, no_stop_tokens):
    free = engine.generate(prompt, SamplingParams(seed=61, max_tokens=40))[0]
    assert free.finish_reason == "length"
    stop = _a_stop_string(engine, free.token_ids)
    end = _first_prefix_holding(engine, free.token_ids, stop)
    assert end < len(free.token_ids)
    stopped = engine.generate(prompt, SamplingParams(seed=61, max_tokens=40, stop=(stop, "never in it")))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[:end]  # up to and including the completing token
    assert stopped.logprobs == pytest.approx(free.logprobs[:end], abs=TOL)
    assert stop not in stopped.text
    assert stopped.text == engine.decode(free.token_ids[:end]).split(stop)[0]
    assert free.text.startswith(stopped.text + stop)


def test_stop_strings_apply_per_choice_and_among_concurrent_requests(engine, prompt, no_stop_tokens):
    free = engine.generate(prompt, SamplingParams(seed=62, max_tokens=30, n=3))
    stop = _a_stop_string(engine, free[0].token_ids)
    params = SamplingParams(seed=62, max_tokens=30, n=3, stop=(stop,))
    alone = engine.generate(prompt, params)
    end = _first_prefix_holding(engine, free[0].token_ids, stop)
    # the choices share one generator: up to the first stop they draw as without stop strings
    assert min(len(s.token_ids) for s in alone) == end
    assert alone[0].token_ids == free[0].token_ids[:end] and alone[0].finish_reason == "stop"
    for sample in alone:
        assert stop not in sample.text
        assert sample.finish_reason == ("stop" if stop in engine.decode(sample.token_ids) else "length")
    results: list = [None] * 4
    other = SamplingParams(seed=63, max_tokens=25)

    def run(k: int) -> None:
        results[k] = engine.generate(prompt, params if k % 2 == 0 else other)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for got in results[0::2]:
        assert [(s.token_ids, s.finish_reason, s.text) for s in got] == [
            (s.token_ids, s.finish_reason, s.text) for s in alone
        ]
    assert all(len(s.token_ids) == 25 for got in results[1::2] for s in got)  # no stop strings asked


def test_top_logprobs_are_the_sorted_alternatives_of_a_fresh_forward_pass(engine, prompt):
    import torch

    sample = engine.generate(prompt, SamplingParams(seed=64, max_tokens=12, top_k=5, top_logprobs=5))[0]
    assert len(sample.top_logprobs) == len(sample.token_ids)
    model = engine._shared.model
    ids = [*prompt, *sample.token_ids]
    with torch.inference_mode():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
    for k, (token, logprob, top) in enumerate(
        zip(sample.token_ids, sample.logprobs, sample.top_logprobs, strict=True)
    ):
        assert len(top) == 5 and len({t for t, _ in top}) == 5
        values = [v for _, v in top]
        assert values == sorted(values, reverse=True)
        assert dict(top)[token] == pytest.approx(logprob, abs=1e-6)  # top_k=5: the sampled token is there
        fresh = logprobs[len(prompt) - 1 + k].topk(5)
        assert [t for t, _ in top] == fresh.indices.tolist()
        assert values == pytest.approx(fresh.values.tolist(), abs=TOL)


def test_top_logprobs_none_when_not_asked_and_the_argmax_first_when_greedy(engine, prompt):
    assert engine.generate(prompt, SamplingParams(seed=65, max_tokens=4))[0].top_logprobs is None
    for sample in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=6, n=2, top_logprobs=20)):
        assert [top[0][0] for top in sample.top_logprobs] == sample.token_ids
        assert all(len(top) == 20 for top in sample.top_logprobs)


def test_sampling_params_check_stop_and_top_logprobs():
    assert SamplingParams(stop="END").stop == ("END",)
    assert SamplingParams(stop=["a", "b"]).as_dict()["stop"] == ["a", "b"]
    for bad in (("a",) * 5, ("",), (3,)):
        with pytest.raises(ValueError, match=r"SamplingParams\.stop"):
            SamplingParams(stop=bad)
    for bad in (-1, 21, True):
        with pytest.raises(ValueError, match=r"SamplingParams\.top_logprobs"):
            SamplingParams(top_logprobs=bad)


def test_cut_at_stop_cuts_before_the_earliest_stop():
    assert cut_at_stop("x = 1\nEND\ny", ("END", "\n")) == ("x = 1", True)
    assert cut_at_stop("x = 1", ("END",)) == ("x = 1", False)
    assert cut_at_stop("ENDx", ("END",)) == ("", True)
    assert cut_at_stop("abc", ()) == ("abc", False)
