"""The gate's in-process evaluator without a model: outcomes paired by key whatever their order, the
serving version scored once, bases that differ refused; and the task file checks of `--gate-tasks`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import infra.learn.heldout as heldout
from consumers.errors import ConsumerConfigError
from infra.evaluation.outcomes import Outcome
from infra.learn.heldout import HeldoutScore
from infra.training_gate import HeldoutGateEvaluator, gate_expressions
from schemas.events import PolicyUpdated, utc_now

# per version: the successes of (task, sample, greedy) keys; v2 lost "1 + 1" sample 1
RESULTS = {
    "base": {("1 + 1", 0, False): False, ("1 + 1", 1, False): True, ("1 + 1", 0, True): False},
    "v1": {("1 + 1", 0, False): True, ("1 + 1", 1, False): True, ("1 + 1", 0, True): True},
    "v2": {("1 + 1", 0, False): True, ("1 + 1", 1, False): False, ("1 + 1", 0, True): True},
}


class FakeEngine:
    def __init__(self, version: str = "base"):
        self.version = version

    def with_checkpoint(self, path: Path, version: str) -> FakeEngine:
        assert path == Path(f"/ckpt/{version}")
        return FakeEngine(version)


@pytest.fixture
def scored(monkeypatch):
    calls = []

    def evaluate(engine, expressions, samples, temperature, max_turns, seed, *, greedy=True):
        calls.append(engine.version)
        keys = sorted(RESULTS[engine.version], reverse=engine.version == "v2")  # another order
        outcomes = tuple(
            Outcome(t, s, seed + s, RESULTS[engine.version][(t, s, g)], 1.0, g) for t, s, g in keys
        )
        wins = sum(o.success for o in outcomes if not o.greedy)
        greedy_wins = sum(o.success for o in outcomes if o.greedy)
        return HeldoutScore(engine.version, 2, wins, 1, greedy_wins, outcomes)

    monkeypatch.setattr(heldout, "evaluate", evaluate)
    return calls


def _update(version: str, base_id: str = "") -> PolicyUpdated:
    return PolicyUpdated(
        event_id=f"pu-{version}", trajectory_id=version, occurred_at=utc_now(), producer="test",
        policy_version=version, checkpoint_path=f"/ckpt/{version}", base_model_id=base_id,
    )  # fmt: skip


def _evaluator() -> HeldoutGateEvaluator:
    return HeldoutGateEvaluator(Path("/base"), ("1 + 1",), 2, 0, _base=FakeEngine())


def test_outcomes_are_paired_by_key_and_the_serving_score_is_reused(scored):
    evaluator = _evaluator()
    first = evaluator(_update("v1"), None)
    assert first.serving_version == "base"
    assert (first.serving, first.candidate) == ((False, False, True), (True, True, True))  # by sorted key
    assert first.extra["candidate_greedy_rate"] == 1.0 and first.extra["serving_sampled_rate"] == 0.5
    second = evaluator(_update("v2"), _update("v1"))
    assert (second.serving, second.candidate) == ((True, True, True), (True, True, False))
    assert scored == ["base", "v1", "v2"]  # v1 scored once: as the candidate, then as the serving one


def test_versions_of_different_bases_are_not_compared(scored):
    with pytest.raises(ValueError, match="base_model_id 'aaaa'"):
        _evaluator()(_update("v2", "bbbb"), _update("v1", "aaaa"))
    assert _evaluator()(_update("v2", "bbbb"), _update("v1", "")).serving_version == "v1"  # '' unknown


def _tasks(tmp_path: Path, *rows: dict) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gate_tasks_are_calc_expressions(tmp_path):
    good = _tasks(tmp_path, {"task_id": "a", "env": "calc", "task": {"expression": "2 + 3"}})
    assert gate_expressions(good) == ("2 + 3",)
    for row, expected in (
        ({"task_id": "a", "env": "echo", "task": {}}, "task 'a': field 'env': the gate plays calc tasks"),
        ({"task_id": "a", "env": "calc", "task": {}}, "task 'a': field 'task.expression': expected a string"),
        ({"task_id": "a", "env": "calc", "task": {"expression": "2 +"}}, "field 'task.expression': '2 +'"),
        ({"env": "calc"}, "field 'task_id'"),
    ):
        with pytest.raises(ConsumerConfigError, match="--gate-tasks: ") as caught:
            gate_expressions(_tasks(tmp_path, row))
        assert expected in str(caught.value)
    with pytest.raises(ConsumerConfigError, match="has no task"):
        gate_expressions(_tasks(tmp_path))


def test_a_task_file_the_gate_would_miscount_is_refused_naming_file_line_and_field(tmp_path):
    a = {"task_id": "a", "env": "calc", "task": {"expression": "2 + 3"}}
    for rows, expected in (
        # outcomes are keyed by expression: a repeat under another task id would be played, not counted
        ((a, {**a, "task_id": "b"}), ":2: task 'b': field 'task.expression': '2 + 3' repeats line 1"),
        ((a, {**a, "task": {"expression": "2 + 4"}}), ":2: task_id 'a' repeats line 1"),
        (({**a, "answer": 5},), ":1: unknown key 'answer'"),
        (
            ({**a, "task": {"expression": "2 + 3", "difficulty": 2}},),
            ":1: task 'a': unknown key 'task.difficulty'",
        ),
    ):
        path = _tasks(tmp_path, *rows)
        with pytest.raises(ConsumerConfigError) as caught:
            gate_expressions(path)
        assert str(caught.value).startswith(f"--gate-tasks: {path}") and expected in str(caught.value)
    ok = _tasks(tmp_path, a, {**a, "task_id": "b", "task": {"expression": "2 + 4"}, "domain": "math"})
    assert gate_expressions(ok) == ("2 + 3", "2 + 4")


def test_gate_samples_that_would_share_seeds_are_refused_before_training(tmp_path):
    from consumers.training.config import TrainRunConfig
    from infra.training_gate import check_gate_options

    path = _tasks(tmp_path, {"task_id": "a", "env": "calc", "task": {"expression": "2 + 3"}})
    assert check_gate_options(TrainRunConfig(follow=True, gate=True, gate_tasks=path, gate_samples=999)) == (
        "2 + 3",
    )
    with pytest.raises(ConsumerConfigError, match=r"--gate-samples: must be between 1 and 999 .*, got 1000$"):
        check_gate_options(TrainRunConfig(follow=True, gate=True, gate_tasks=path, gate_samples=1000))
    assert (
        check_gate_options(TrainRunConfig(follow=True, gate=False, gate_samples=1000)) == ()
    )  # not used: not checked


def test_train_refuses_a_miscounting_gate_in_one_line_before_training(tmp_path, capsys):
    from infra.cli.main import main
    from infra.learn.tasks import write_tasks

    twice = write_tasks(("2 + 3", "2 + 3"), tmp_path / "twice.jsonl", "gate")
    good = write_tasks(("2 + 3",), tmp_path / "good.jsonl", "gate")
    argv = ["train", "--follow", "--gate", "--data-dir", str(tmp_path / "d")]
    for extra, expected in (
        (["--gate-tasks", str(twice)], f"--gate-tasks: {twice}:2: task 'gate-0001': field 'task.expression'"),
        (["--gate-tasks", str(good), "--gate-samples", "1000"], "--gate-samples: must be between 1 and 999"),
    ):
        assert main([*argv, *extra]) == 1
        assert expected in capsys.readouterr().err
