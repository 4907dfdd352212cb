"""`--seed` reaches the warm start, the executor, the rollouts and the evaluation; the warm-start cache
hits on the same configuration, rebuilds damaged entries, and keys on what decides the model; the
`bench learn` figures (mean gain interval, control left out of the means)."""

from __future__ import annotations

import doctest
import json

import pytest

import infra.bench.learn as bench_learn
import infra.learn.loop as loop
import infra.learn.warmstart as warmstart
from infra.bench.learn import mean_interval, parse_seeds, summarize
from infra.learn.heldout import evaluate, load_engine
from infra.learn.loop import CONTROL_LEARNING_RATE, LearnConfig, rollout_args, stack_config
from infra.learn.tasks import split_expressions
from infra.learn.warmstart import WarmStartConfig, build_warm_model, cached_warm_model, warm_start_key

TINY = {"hidden_size": 32, "layers": 1, "vocab_size": 600, "steps": 2, "batch_size": 4}
TRAIN = split_expressions(1, 400, 4, seed=0).train


def _weights(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def _same(a, b) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_docstring_examples():
    for module in (bench_learn, loop, warmstart):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_the_seed_reaches_the_warm_start_the_executor_and_the_rollouts(tmp_path):
    config = LearnConfig(seed=5)
    assert config.warm.seed == 5  # was WarmStartConfig's 0 whatever the seed
    with pytest.raises(ValueError, match=r"warm\.seed: 0 differs from seed 5"):
        LearnConfig(seed=5, warm=WarmStartConfig(seed=0))
    args = rollout_args(config, tmp_path / "t.jsonl", "http://x/v1", "127.0.0.1:1", tmp_path)
    assert args[args.index("--seed") + 1] == "5"
    stack = stack_config(config, tmp_path, tmp_path / "base")
    assert stack.extra_env["AGENTSTREAM_SEED"] == "5"  # the executor's TrainConfig.seed (LoRA init)
    train_args = list(stack.train_args)
    assert train_args[train_args.index("--learning-rate") + 1] == str(config.learning_rate)
    control = stack_config(LearnConfig(seed=5, control=True), tmp_path, tmp_path / "base").train_args
    assert list(control)[list(control).index("--learning-rate") + 1] == str(CONTROL_LEARNING_RATE)


def test_the_executor_reads_the_stacks_seed(monkeypatch, tmp_path):
    """AGENTSTREAM_SEED (what the learn stack sets) reaches `agentstream train`'s TrainConfig.seed: the
    option exists, so its environment variable is read (it was not an option before, and was ignored)."""
    from consumers.training.config import TrainRunConfig
    from infra.cli.main import build_parser
    from infra.options.configs import config_from_args
    from infra.options.env import apply_env_defaults

    monkeypatch.setenv("AGENTSTREAM_SEED", "5")
    parser = build_parser()  # as `main` reads a command line: parse, then the environment's defaults
    args = parser.parse_args(["train", "--batch", str(tmp_path / "b.jsonl")])
    apply_env_defaults(parser, args)
    assert config_from_args(TrainRunConfig, args).train.seed == 5


def test_two_seeds_give_different_warm_starts_and_one_seed_the_same(tmp_path):
    built = {
        name: build_warm_model(tmp_path / name, TRAIN, WarmStartConfig(**TINY, seed=seed), lambda _: None)
        for name, seed in (("a", 0), ("b", 0), ("c", 1))
    }
    a, b, c = (_weights(built[name]) for name in "abc")
    assert _same(a, b)
    assert not _same(a, c)
    heldout = split_expressions(1, 400, 4, seed=0).heldout
    first, again = (evaluate(load_engine(built[n], None, "base"), heldout, 2, 1.0, 2, seed=3) for n in "ab")
    assert first.outcomes == again.outcomes and len(first.outcomes) == 4 * 3


class ScriptedEngine:
    """Answers every calc task at once (no tool call), right or off by one."""

    version = "scripted"

    def __init__(self, expressions: tuple[str, ...], right: bool):
        from producers.envs.arithmetic import safe_eval
        from producers.envs.calc import format_number

        self.answers = {e: format_number(safe_eval(e) + (0 if right else 1)) for e in expressions}

    def render(self, messages, tools):
        return messages[1]["content"]

    def generate(self, observation, params):
        from types import SimpleNamespace

        (answer,) = [a for e, a in self.answers.items() if f'"{e}"' in observation]
        return [SimpleNamespace(text=answer)]


def test_the_evaluation_counts_what_the_verifier_accepts():
    heldout = ("3 + 4", "9 - 2", "8 + 8")
    right = evaluate(ScriptedEngine(heldout, right=True), heldout, 2, 1.0, 2, seed=0)
    wrong = evaluate(ScriptedEngine(heldout, right=False), heldout, 2, 1.0, 2, seed=0)
    assert (right.successes, right.episodes, right.greedy_successes, right.greedy_episodes) == (6, 6, 3, 3)
    assert (wrong.successes, wrong.greedy_successes) == (0, 0) and wrong.episodes == 6


def test_the_cache_hits_rebuilds_damaged_entries_and_keys_on_the_configuration(tmp_path, monkeypatch):
    builds: list[str] = []
    real_build = warmstart.build_warm_model

    def counting_build(out, train, config, say):
        builds.append(str(out))
        return real_build(out, train, config, say)

    monkeypatch.setattr(warmstart, "build_warm_model", counting_build)
    config, cache, lines = WarmStartConfig(**TINY), tmp_path / "cache", []
    entry = cached_warm_model(cache, TRAIN, config, lines.append)
    assert entry.name == warm_start_key(TRAIN, config) and len(builds) == 1
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # the partial dir was renamed

    lines.clear()
    assert cached_warm_model(cache, TRAIN, config, lines.append) == entry and len(builds) == 1
    assert lines == [f"warm start: cache hit {entry}"]

    weights = next(p for p in entry.iterdir() if p.suffix == ".safetensors")
    weights.write_bytes(weights.read_bytes()[:100])  # a torn write
    lines.clear()
    assert cached_warm_model(cache, TRAIN, config, lines.append) == entry and len(builds) == 2
    assert any(f"corrupt ({weights.name} missing or changed)" in line for line in lines), lines
    assert cached_warm_model(cache, TRAIN, config, lambda _: None) == entry and len(builds) == 2

    (entry / warmstart.MANIFEST).unlink()  # killed before the manifest: a partial entry
    cached_warm_model(cache, TRAIN, config, lambda _: None)
    assert len(builds) == 3 and json.loads((entry / warmstart.MANIFEST).read_text())["key"] == entry.name

    assert warm_start_key(TRAIN, WarmStartConfig(**{**TINY, "steps": 3})) != entry.name
    assert warm_start_key(TRAIN[1:], config) != entry.name
    monkeypatch.setattr(warmstart, "_PACKAGES", ("torch", "transformers", "not-installed-package"))
    assert warm_start_key(TRAIN, config) != entry.name  # the library versions are part of the key


def _run(v0: float, final: float, greedy: tuple[float, float] | None, reached: float | None) -> dict:
    return {
        "points": [{"minutes": 0.0}, {"minutes": 2.0}],
        "final_version": "v3",
        "v0_success": v0,
        "final_success": final,
        "gain_points": round(100 * (final - v0), 1),
        "v0_greedy_success": greedy and greedy[0],
        "final_greedy_success": greedy and greedy[1],
        "greedy_gain_points": greedy and round(100 * (greedy[1] - greedy[0]), 1),
        "minutes_to_20_points": reached,
        "minutes": 2.0,
        "final_vs_v0": {"mcnemar_p": 0.5},
        "harder": {"difficulty": 2, "v0": {"success": 0.0}, "final": {"success": 0.1}},
    }


def test_bench_figures_leave_the_control_out_of_the_means():
    runs = {
        "seed 0": _run(0.3, 0.6, (0.2, 0.9), 4.0),
        "seed 1": _run(0.4, 0.5, (0.3, 0.5), None),
        "control": _run(0.3, 0.1, (0.2, 0.2), None),
    }
    result = summarize(runs)
    # gains 30 and 10: mean 20, sd 14.14, t(1) 12.706 * 14.14 / sqrt(2) = 127.06
    assert result["mean_gain_points"] == {"n": 2, "mean": 20.0, "sd": 14.14, "low": -107.06, "high": 147.06}
    assert result["mean_greedy_gain_points"]["mean"] == 45.0
    assert result["control_gain_points"] == -20.0 and result["control_greedy_gain_points"] == 0.0
    assert result["reached_20_points"] == {"runs": 1, "of": 2, "median_minutes": 4.0}
    assert [row["run"] for row in result["rows"]] == ["seed 0", "seed 1", "control"]
    assert result["rows"][0]["gain"] == "+30.0" and result["rows"][0]["d2 final %"] == "10.0"


def test_bad_seeds_are_refused_naming_the_option():
    assert parse_seeds("3") == [3]
    for text in ("", "0,x", "1,1"):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(text)
    assert mean_interval([]) == {"n": 0, "mean": None, "sd": None, "low": None, "high": None}


def test_the_rollout_seed_moves_every_episode_sampling_seed(monkeypatch):
    from producers.envs.tasks import Task
    from producers.rollout import driver

    def record(controls, client, config, task, recorder, group_id, seed):
        return driver.EpisodeResult(task.task_id, group_id, "t", False, 1, False, 1, seed, 0.0)

    monkeypatch.setattr(driver, "_controlled_episode", record)
    tasks = [Task("a", "calc", {"expression": "1 + 2"}), Task("b", "calc", {"expression": "2 + 2"})]

    def seeds(seed: int) -> list[int]:
        config = driver.RolloutConfig(group_size=2, seed=seed)
        return sorted(r.seed for r in driver._run_rounds(None, config, tasks, None, None, None))

    assert seeds(0) == [0, 0, 1, 1]  # both tasks' groups, sample 0 and 1: as before 1.5
    assert seeds(3) == [3_000_000, 3_000_000, 3_000_001, 3_000_001]
