"""The acceptance point of environments as services: `calc` and a coding task (`sandbox`, local
backend) give the same recorded outcomes through `agentstream env serve` as in-process. The same
tasks with the same seeds and the same scripted policy run through the rollout driver's
`run_episode` twice, in-process and with `env_url`, recorded by the real `AgentRecorder` into the
embedded broker; read back, the two recordings agree event by event (task, observations, tool
results, rewards, exit codes, outcome, verifier), all but ids, clocks and latencies."""

from __future__ import annotations

import json
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

import producers.envs  # noqa: F401  (registers the built-in envs)
from infra.runtime import agentstream_argv
from producers.envs.tasks import Task, builtin_tasks
from producers.rollout.driver import RolloutConfig, run_episode
from producers.sdk.recorder import AgentRecorder
from schemas.topics import AGENT_EVENTS
from tests.support.processes import Proc, wait_for
from tests.support.readback import read_topic

VOLATILE = {"event_id", "trajectory_id", "occurred_at", "latency_ms"}  # ids, clocks, timings
LOCAL = json.dumps({"backend": "local"})


def reply(content: str = "", call: tuple[str, dict] | None = None):
    """A chat completion as the driver reads it (one choice, at most one tool call)."""
    calls = None
    if call is not None:
        function = SimpleNamespace(name=call[0], arguments=json.dumps(call[1]))
        dump = {
            "id": "c1",
            "type": "function",
            "function": {"name": call[0], "arguments": function.arguments},
        }
        calls = [SimpleNamespace(id="c1", function=function, model_dump=lambda d=dump: d)]
    message = SimpleNamespace(content=content, tool_calls=calls)
    return SimpleNamespace(choices=[SimpleNamespace(message=message)], model_extra={})


class ScriptedPolicy:
    """An OpenAI client stand-in: each turn, `script(turn, messages)` is the reply (deterministic,
    so both runs of a task see the same policy)."""

    def __init__(self, script):
        self.script, self.turn = script, 0
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **request):
        answer = self.script(self.turn, request["messages"])
        self.turn += 1
        return answer


def calc_solver(turn: int, messages: list[dict]):
    """Computes the task's expression with the tool, then answers what the tool said."""
    if turn == 0:
        return reply("computing", ("calculator", {"expression": messages[1]["content"].rsplit('"', 2)[1]}))
    return reply(messages[-1]["content"])


def calc_wanderer(turn: int, messages: list[dict]):
    """A wrong tool, a bad expression, then a wrong answer."""
    steps = [("bash", {"cmd": "ls"}), ("calculator", {"expression": "2 *"})]
    return reply("", steps[turn]) if turn < len(steps) else reply("-1")


def calc_looper(turn: int, messages: list[dict]):
    return reply("", ("calculator", {"expression": f"{turn} + 1"}))


def sandbox_fixer(patch: str):
    """Looks around, applies the task's reference fix with the file and git tools, submits."""
    steps = [
        ("shell", {"command": "ls"}),
        ("file_write", {"path": "fix.patch", "content": patch}),
        ("git", {"subcommand": "apply", "args": ["fix.patch"]}),
        ("shell", {"command": ["rm", "fix.patch"]}),
        ("git", {"subcommand": "status", "args": ["--short"]}),
    ]
    return lambda turn, messages: reply("", steps[turn]) if turn < len(steps) else reply("fixed")


def sandbox_reader(task: Task):
    """Reads a file, writes a note, misreads a missing one, then claims success without a fix."""
    first = sorted(task.task["files"])[0]
    steps = [
        ("file_read", {"path": first}),
        ("file_write", {"path": "NOTES.md", "content": "looked around\n"}),
        ("file_read", {"path": "no/such/file.py"}),
        ("search", {"pattern": "def "}),
    ]
    return lambda turn, messages: reply("", steps[turn]) if turn < len(steps) else reply("all tests pass now")


@contextmanager
def served(tmp_path: Path, name: str, *options: str):
    """`agentstream env serve NAME` as a child process; its URL."""
    ready = tmp_path / f"{name}.ready"
    argv = agentstream_argv("env", "serve", name, "--ready-file", str(ready), *options)
    proc = Proc(argv, tmp_path / f"{name}.log")
    try:
        wait_for(lambda: ready.exists() or not proc.alive(), timeout_s=60, what=f"env serve {name}")
        assert proc.alive(), proc.log_text()[-3000:]
        yield f"http://{ready.read_text()}"
    finally:
        assert proc.stop() == 0, proc.log_text()[-3000:]


def comparable(events: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if k not in VOLATILE} for e in events]


@pytest.mark.integration
def test_calc_and_a_coding_task_record_the_same_outcomes_served_and_in_process(broker, data_dir, tmp_path):
    calc = {t.task_id: t for t in builtin_tasks("calc")}
    coding = builtin_tasks("sandbox")
    fixable = next(t for t in coding if t.task.get("reference_patch"))
    other = next(t for t in coding if t is not fixable)
    episodes = [  # (task, policy script, env args, max turns, seed)
        (calc["calc-mixed"], lambda: calc_solver, "", 8, 11),
        (calc["calc-parens"], lambda: calc_wanderer, "", 8, 12),
        (calc["calc-mul"], lambda: calc_looper, "", 3, 13),
        (fixable, lambda: sandbox_fixer(fixable.task["reference_patch"]), LOCAL, 8, 21),
        (other, lambda: sandbox_reader(other), LOCAL, 8, 22),
    ]
    recorder = AgentRecorder(broker.bootstrap, data_dir, agent="rollout", model="scripted")
    pairs = []
    with ExitStack() as stack:
        urls = {
            "calc": stack.enter_context(served(tmp_path, "calc")),
            "sandbox": stack.enter_context(served(tmp_path, "sandbox", "--env-args", LOCAL)),
        }
        for task, script, env_args, max_turns, seed in episodes:
            runs = []
            for env_url in ("", urls[task.env]):
                config = RolloutConfig(env=task.env, env_url=env_url, max_turns=max_turns)
                if not env_url:
                    config = RolloutConfig(env=task.env, env_args=env_args, max_turns=max_turns)
                runs.append(
                    run_episode(ScriptedPolicy(script()), config, task, recorder, f"g-{task.task_id}", seed)
                )
            pairs.append(runs)
    assert recorder.flush(30) is True
    recorder.close()

    outcomes = [(local.success, local.turns, local.truncated) for local, _ in pairs]
    assert [(s.success, s.turns, s.truncated) for _, s in pairs] == outcomes
    assert outcomes == [
        (True, 2, False),
        (False, 3, False),
        (False, 3, True),
        (True, 6, False),
        (False, 5, False),
    ]

    count = sum(2 * (turns + 2) for _, turns, _ in outcomes)
    records = read_topic(broker.bootstrap, AGENT_EVENTS, min_records=count, timeout_s=30)
    by_trajectory: dict[str, list[dict]] = {}
    for r in sorted(records, key=lambda r: (r["partition"], r["offset"])):
        by_trajectory.setdefault(r["value"]["trajectory_id"], []).append(r["value"])
    for local, remote in pairs:
        here, there = by_trajectory[local.trajectory_id], by_trajectory[remote.trajectory_id]
        assert here[0]["type"] == "episode.started" and here[-1]["type"] == "episode.ended"
        assert comparable(there) == comparable(here), local.task_id
    fixed = by_trajectory[pairs[3][1].trajectory_id]
    assert fixed[-1]["success"] is True and fixed[-1]["outcome_source"] == "env.verify"
    assert [e.get("exit_code") for e in fixed[1:-1]] == [0, 0, 0, 0, 0, 0]
    misread = by_trajectory[pairs[4][1].trajectory_id]
    assert misread[3]["exit_code"] == 1 and misread[-1]["success"] is False  # a claim is not a fix
