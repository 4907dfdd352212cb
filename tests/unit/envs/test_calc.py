"""CalcEnv: the safe calculator, seeded tasks, difficulty, the verifier, submit and truncation."""

from __future__ import annotations

import re

import pytest

from producers.envs import CalcEnv, EnvError, ExpressionError
from producers.envs.arithmetic import parse_number, safe_eval


def calc(env: CalcEnv, expression: str):
    return env.step({"tool": "calculator", "params": {"expression": expression}})


def submit(env: CalcEnv, answer):
    return env.step({"tool": "submit", "params": {"answer": answer}, "thought": "I am sure"})


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os')", "function calls are not allowed"),
        ("__import__('os').system('true')", "not allowed"),
        ("(1).real", "attribute access is not allowed"),
        ("x + 1", "names are not allowed"),
        ("().__class__", "attribute access is not allowed"),
        ("9 ** 9 ** 9", "exponent 387420489 too large"),
        ("10 ** 64 ** 2", "too large"),
        ("99999 ** 60", "more than 100 digits"),
        ("1 / 0", "division by zero"),
        ("'a' * 3", "only numbers are allowed"),
        ("[1, 2]", "List is not allowed"),
        ("1 << 5", "operator LShift is not allowed"),
        ("lambda: 1", "Lambda is not allowed"),
        ("1 +", "not an arithmetic expression"),
        ("1" + " + 1" * 300, "at most 500"),
        ("(-8) ** 0.5", "not a real number"),
    ],
)
def test_safe_eval_refuses(expression, reason):
    with pytest.raises(ExpressionError, match=re.escape(reason)):
        safe_eval(expression)


def test_safe_eval_computes_arithmetic():
    assert safe_eval("2 + 3 * (4 - 1)") == 11
    assert safe_eval("7 // 2 + 7 % 3 + 2 ** 10") == 1028
    assert safe_eval("-(3 - 10) / 2") == 3.5
    assert safe_eval("2 ** -1") == 0.5


def test_calculator_tool_answers_values_and_errors_without_ending():
    env = CalcEnv(difficulty=2)
    env.reset(task={"expression": "12 * 34"})
    ok = calc(env, "12*34")
    assert (ok.observation, ok.info["exit_code"], ok.done) == ("408", 0, False)
    bad = calc(env, "__import__('os').system('echo pwned')")
    assert bad.info["exit_code"] == 1 and bad.observation.startswith("error: calculator:") and not bad.done
    assert calc(env, "1/3").observation == "0.333333333333"
    missing = env.step({"tool": "calculator", "params": {}})
    assert missing.info["exit_code"] == 1 and "expected a string" in missing.observation


def test_same_seed_same_task_and_different_seeds_differ():
    first, again = CalcEnv(difficulty=3).reset(seed=11), CalcEnv(difficulty=3).reset(seed=11)
    assert first.observation == again.observation and first.info["expression"] == again.info["expression"]
    expressions = {CalcEnv(difficulty=3).reset(seed=s).info["expression"] for s in range(20)}
    assert len(expressions) > 15
    drawn = CalcEnv().reset()
    assert isinstance(drawn.info["seed"], int)
    assert CalcEnv().reset(seed=drawn.info["seed"]).info["expression"] == drawn.info["expression"]


def operands(expression: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", expression)]


def test_difficulty_controls_operands_and_magnitude():
    for seed in range(30):
        easy = CalcEnv(difficulty=1).reset(seed=seed).info["expression"]
        assert len(operands(easy)) == 2 and max(operands(easy)) < 10 and re.fullmatch(r"\d [+-] \d", easy)
        hard = CalcEnv(difficulty=4).reset(seed=seed).info["expression"]
        assert len(operands(hard)) == 5
    assert max(max(operands(CalcEnv(difficulty=4).reset(seed=s).info["expression"])) for s in range(30)) > 999


def test_verifier_uses_the_env_state_not_the_agent_claim():
    env = CalcEnv()
    env.reset(task={"expression": "3 + 4"})
    ts = env.step({"tool": "submit", "params": {"answer": 8}, "thought": "the answer is correct"})
    assert ts.terminated and ts.reward == 0.0 and env.verify() is False
    env.reset(task={"expression": "3 + 4"})
    assert env.verify() is False  # nothing submitted yet
    assert CalcEnv().verify() is None  # no task yet


@pytest.mark.parametrize("answer", [7, "7", " 7 ", 7.0, "7.0000000001"])
def test_submit_correct(answer):
    env = CalcEnv()
    env.reset(task={"expression": "3 + 4"})
    ts = submit(env, answer)
    assert ts.terminated and not ts.truncated and ts.reward == 1.0 and env.verify() is True
    assert ts.observation.startswith("submitted 7") and ts.observation.endswith(": correct")


def test_submit_division_compares_with_tolerance_and_integers_exactly():
    env = CalcEnv()
    env.reset(task={"expression": "1234 / 7"})
    assert submit(env, "176.285714").reward == 1.0
    env.reset(task={"expression": "2 ** 60"})
    assert submit(env, 2**60 + 1).reward == 0.0


@pytest.mark.parametrize("answer", ["seven", None, True, "3 + 4", [7]])
def test_submit_unreadable_answer_ends_incorrect(answer):
    env = CalcEnv()
    env.reset(task={"expression": "3 + 4"})
    ts = submit(env, answer)
    assert ts.terminated and ts.reward == 0.0 and ts.info["exit_code"] == 1 and env.verify() is False


def test_unknown_tool_is_an_error_observation_not_the_end():
    env = CalcEnv()
    env.reset(seed=1)
    ts = env.step({"tool": "bash", "params": {"cmd": "ls"}})
    assert ts.info["exit_code"] == 1 and "unknown tool 'bash'" in ts.observation and not ts.done
    bad_params = env.step({"tool": "calculator", "params": "1+1"})
    assert bad_params.info["exit_code"] == 1 and not bad_params.done


def test_truncated_at_max_turns_and_no_step_after_the_end():
    env = CalcEnv(max_turns=3)
    env.reset(task={"expression": "3 + 4"})
    results = [calc(env, "3 + 4") for _ in range(3)]
    assert [r.truncated for r in results] == [False, False, True] and results[-1].info["turn"] == 3
    assert env.verify() is False
    with pytest.raises(EnvError, match="after the episode ended"):
        submit(env, 7)
    env.reset(task={"expression": "3 + 4"})
    calc(env, "1")
    calc(env, "2")
    last = submit(env, 7)
    assert last.terminated and not last.truncated  # submitting on the last turn is not a truncation


def test_bad_configuration_and_tasks_are_refused():
    with pytest.raises(EnvError, match="difficulty: expected an integer from 1 to 5, got 9"):
        CalcEnv(difficulty=9)
    with pytest.raises(EnvError, match=r"step\(\) before reset"):
        CalcEnv().step({"tool": "submit", "params": {"answer": 1}})
    with pytest.raises(EnvError, match=r"task expression 'os\.system\(1\)'"):
        CalcEnv().reset(task={"expression": "os.system(1)"})
    with pytest.raises(EnvError, match="task: expected"):
        CalcEnv().reset(task={"question": "1+1"})


def test_the_reset_observation_states_the_task_and_the_tools():
    ts = CalcEnv().reset(task="6 * 7")
    assert "6 * 7" in ts.observation and "calculator" in ts.observation and "submit" in ts.observation
    assert ts.info["available_tools"] == ["calculator", "submit"] and ts.info["max_turns"] == 8


def test_parse_number_refuses_infinity():
    with pytest.raises(ExpressionError, match="finite"):
        parse_number("inf")
