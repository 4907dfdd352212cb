"""The learning demo's pieces: disjoint task sets, demonstrations the env accepts, a warm start
that trains and saves a model the policy engine loads, a held-out evaluation, the curve PNG."""

from __future__ import annotations

import doctest
import json

import infra.learn.tasks as tasks_module
from infra.learn.curve import write_curve
from infra.learn.heldout import evaluate, load_engine
from infra.learn.tasks import TOOLS, demonstration, guess, split_expressions, warm_start_episodes, write_tasks
from infra.learn.warmstart import WarmStartConfig, build_warm_model, served_turns
from producers.envs.calc import CalcEnv
from producers.envs.tasks import load_tasks


def test_docstring_examples():
    assert doctest.testmod(tasks_module).failed == 0


def test_train_and_heldout_are_disjoint_and_fixed_by_the_seed():
    a, b = split_expressions(2, 2000, 40, seed=0), split_expressions(2, 2000, 40, seed=0)
    assert a == b and not set(a.train) & set(a.heldout) and len(a.heldout) == 40
    assert split_expressions(2, 2000, 40, seed=1).heldout != a.heldout


def test_a_demonstration_solves_its_task_in_the_env():
    for expression in split_expressions(2, 200, 5, seed=0).heldout:
        messages = demonstration(expression)
        env = CalcEnv(difficulty=2)
        assert env.reset(task={"expression": expression}).observation == messages[1]["content"]
        for message in messages[2::2]:
            call = message["tool_calls"][0]["function"]
            ts = env.step({"tool": call["name"], "params": json.loads(call["arguments"])})
        assert ts.terminated and env.verify()


def test_warm_start_trains_saves_and_the_engine_plays_heldout_tasks(tmp_path):
    split = split_expressions(1, 400, 4, seed=0)
    config = WarmStartConfig(hidden_size=32, layers=1, vocab_size=600, steps=3, batch_size=4)
    lines: list[str] = []
    base = build_warm_model(tmp_path / "warm", split.train, config, lines.append)
    assert (base / "config.json").exists() and (base / "tokenizer.json").exists()
    assert lines and "step 3/3" in lines[-1]
    score = evaluate(load_engine(base, None, "base"), split.heldout, 1, 1.0, 2, seed=0)
    assert score.episodes == 4 and score.version == "base"
    sampled = [o for o in score.outcomes if not o.greedy]
    assert [o.seed for o in sampled] == [0, 1000, 2000, 3000]  # the same seeds for every version
    assert score.successes == sum(o.success for o in sampled)  # scoring: test_seed_and_cache.py


def test_task_file_and_curve(tmp_path):
    split = split_expressions(1, 400, 4, seed=0)
    tasks = load_tasks(write_tasks(split.train[:3], tmp_path / "t.jsonl", "calc-train"))
    assert [t.task_id for t in tasks] == ["calc-train-0000", "calc-train-0001", "calc-train-0002"]
    points = [
        {"version": "base", "version_number": 0, "minutes": 1.0, "success": 0.2, "mean_reward": 0.3},
        {"version": "v1", "version_number": 1, "minutes": 2.5, "success": 0.5, "mean_reward": None},
    ]
    png = write_curve(points, tmp_path / "curve.png", "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_guess_submits_without_the_calculator_and_the_warm_start_mixes_both():
    episodes = warm_start_episodes(("3 + 4", "9 - 2"), guesses=1, seed=0)
    tools = [m["tool_calls"][0]["function"]["name"] for e in episodes for m in e if m["role"] == "assistant"]
    assert tools == ["calculator", "submit", "calculator", "submit", "submit", "submit"]
    assert guess("3 + 4", seed=0) == guess("3 + 4", seed=0) and episodes[2] == guess("3 + 4", seed=0)


def test_warm_start_turns_are_tokenized_as_the_policy_server_renders_them(tmp_path):
    """Each assistant turn's prompt is exactly the server's prompt ids for the conversation so far
    (the history re-rendered at once, not message by message), its labels the turn's own text."""
    split = split_expressions(1, 400, 4, seed=0)
    config = WarmStartConfig(hidden_size=32, layers=1, vocab_size=600, steps=1, batch_size=2)
    engine = load_engine(
        build_warm_model(tmp_path / "warm", split.train, config, lambda _: None), None, "base"
    )
    messages = demonstration("8 + 7")
    turns = served_turns(engine.tokenizer, messages, TOOLS)
    assert len(turns) == 2
    for k, turn in zip((2, 4), turns, strict=True):
        prompt = engine.render(messages[:k], TOOLS)
        assert turn.input_ids[: len(prompt)] == prompt
        assert turn.labels[: len(prompt)] == [-100] * len(prompt)
        completion = engine.tokenizer.decode(turn.labels[len(prompt) :])
        call = messages[k]["tool_calls"][0]["function"]
        assert call["name"] in completion and completion.endswith("<|im_end|>")
