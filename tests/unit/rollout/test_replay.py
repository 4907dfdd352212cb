"""`agentstream replay-trajectory`: a recorded trajectory replays cleanly in a fresh sandbox, an
altered recorded observation is reported at its step, and the sample SWE-agent trajectory (through
its ingest adapter) is replayed up to the step where it diverges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.cli.main import main
from producers.rollout.replay import ReplayError, load_steps, normalise, replay, replay_call
from producers.sandbox.local import LocalSandbox

SWE_AGENT_TRAJ = (
    Path(__file__).resolve().parents[2] / "data/adapters/swe_agent/marshmallow-code__marshmallow-1867.traj"
)
CALLS = [
    ("file_write", {"path": "notes/a.txt", "content": "alpha\nbeta\n"}),
    ("shell", {"command": ["cat", "notes/a.txt"]}),
    ("shell", {"command": "echo one; echo two"}),
    ("file_read", {"path": "notes/a.txt"}),
]


@pytest.fixture()
def recorded() -> list[dict]:
    """The steps as an agent run recorded them: each call's output, from a real sandbox."""
    with LocalSandbox() as box:
        return [{"tool": t, "params": p, "observation": box.run(t, p).output} for t, p in CALLS]


def test_an_unchanged_trajectory_replays_to_the_end(recorded):
    with LocalSandbox() as box:
        report = replay(recorded, box)
    assert (report.success, report.divergence_step, report.completed_steps, report.total_steps) == (
        True, None, 4, 4,
    )  # fmt: skip


def test_an_altered_observation_is_reported_at_its_step(recorded):
    recorded[2]["observation"] = "one\nthree\n"
    recorded[1]["observation"] = "  alpha   beta "  # only whitespace differs: still a match
    with LocalSandbox() as box:
        report = replay(recorded, box)
    assert (report.success, report.divergence_step, report.completed_steps, report.total_steps) == (
        False, 2, 2, 4,
    )  # fmt: skip
    assert report.details["recorded"] == "one\nthree\n" and normalise(report.details["replayed"]) == "one two"


def test_the_sample_swe_agent_trajectory_replays_until_it_diverges():
    steps = load_steps(SWE_AGENT_TRAJ)
    assert len(steps) == 7 and steps[0]["tool"] == "write_file"
    with LocalSandbox() as box:
        report = replay(steps, box)
    # `create reproduce.py` is a SWE-agent editor command, not a program here: the first step differs
    assert report.success is False and report.total_steps == 7
    assert report.divergence_step == 0 and report.completed_steps == 0
    assert report.details["sandbox_tool"] == "shell" and "reproduce.py" in report.details["recorded"]


def test_steps_without_a_sandbox_equivalent_stop_the_replay_there():
    steps = [{"tool": "shell", "params": {"command": "true"}, "observation": ""}]
    steps.append({"tool": "calculator", "params": {"expression": "1+1"}, "observation": "2"})
    with LocalSandbox() as box:
        report = replay(steps, box)
    assert (report.divergence_step, report.completed_steps) == (1, 1)
    assert "no sandbox equivalent" in report.details["reason"]
    assert replay_call({"tool": "bash", "params": {"command": "ls"}}) == ("shell", {"command": "ls"})


def test_the_command_prints_the_report_and_exits_non_zero_on_divergence(recorded, tmp_path, capsys):
    path = tmp_path / "traj.json"
    path.write_text(json.dumps({"steps": recorded}))
    assert main(["replay-trajectory", "--file", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["success"] is True
    recorded[3]["observation"] = "gamma"
    path.write_text(json.dumps(recorded))
    assert main(["replay-trajectory", "--file", str(path)]) == 1
    assert json.loads(capsys.readouterr().out)["divergence_step"] == 3


def test_an_unreadable_trajectory_is_an_error_naming_the_file(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ReplayError, match=r"nope\.json"):
        load_steps(missing)
    assert main(["replay-trajectory"]) != 0  # neither --file nor --trajectory-id
