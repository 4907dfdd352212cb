"""Auto-detection, deterministic ids, rejections with reasons, and `agentstream ingest --dry-run`."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from producers.adapters.contract import load_document
from producers.adapters.detect import ADAPTERS, FORMATS, detect_format, scores
from producers.adapters.ingest import convert_file
from tests.support.processes import AGENTSTREAM, REPO

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "adapters"
MTIME = datetime(2026, 1, 1, tzinfo=UTC)

EXPECTED_FORMAT = {
    "openhands/session_trajectory.json": "openhands",
    "openhands/events.jsonl": "openhands",
    "openhands/eval_output.jsonl": "openhands",
    "openhands/older_edit_refused_call.json": "openhands",
    "swe_agent/marshmallow-code__marshmallow-1867.traj": "swe-agent",
    "mini_swe_agent/django__django-11099.traj.json": "mini-swe-agent",
    "mini_swe_agent/v1_textbased.traj.json": "mini-swe-agent",
    "openai/weather_tools.json": "openai",
    "openai/finetune.jsonl": "openai",
    "anthropic/messages_transcript.json": "anthropic",
    "anthropic/claude_code_session.jsonl": "anthropic",
    "agentstream/events.jsonl": "jsonl",
}


def doc_of(relative: str):
    path = FIXTURES / relative
    return load_document(path, path.read_bytes(), MTIME)


@pytest.mark.parametrize(("relative", "expected"), sorted(EXPECTED_FORMAT.items()))
def test_auto_detection_picks_the_right_adapter(relative, expected):
    doc = doc_of(relative)
    assert detect_format(doc) == expected, scores(doc)


def test_every_adapter_has_a_fixture():
    assert set(EXPECTED_FORMAT.values()) == set(ADAPTERS)


@pytest.mark.parametrize(
    ("relative", "fragment"),
    [
        ("invalid/truncated.json", "not valid JSON"),
        ("invalid/unknown_shape.json", "unrecognised format: an object with keys [results, run_id]"),
        ("invalid/missing_action.traj", "trajectory[1].action must be a string, got nothing"),
    ],
)
def test_invalid_files_are_rejected_with_a_reason_naming_the_file(relative, fragment):
    path = FIXTURES / relative
    report = convert_file(path, path.read_bytes(), MTIME)
    [rejection] = report.rejections
    assert str(path) in rejection.reason and fragment in rejection.reason
    assert report.events == [] and not report.ok


def test_forced_format_that_does_not_fit_says_what_is_missing():
    path = FIXTURES / "openai/weather_tools.json"
    report = convert_file(path, path.read_bytes(), MTIME, fmt="swe-agent")
    [rejection] = report.rejections
    assert "trajectory must be a list of steps, got nothing" in rejection.reason


def test_same_bytes_give_the_same_ids_and_other_bytes_other_ids(tmp_path):
    path = FIXTURES / "swe_agent/marshmallow-code__marshmallow-1867.traj"
    first = convert_file(path, path.read_bytes(), MTIME)
    again = convert_file(path, path.read_bytes(), datetime(2030, 1, 1, tzinfo=UTC))  # touched, moved
    assert [e.event_id for e in first.events] == [e.event_id for e in again.events]
    assert len({e.event_id for e in first.events}) == len(first.events)
    assert len({e.trajectory_id for e in first.events}) == 1
    changed = convert_file(path, path.read_bytes() + b"\n", MTIME)
    assert changed.events[0].trajectory_id != first.events[0].trajectory_id


def test_overrides_replace_domain_agent_model():
    from producers.adapters.events import Overrides

    path = FIXTURES / "openai/finetune.jsonl"
    report = convert_file(path, path.read_bytes(), MTIME, overrides=Overrides("support", "bot-7", "m-1"))
    started = [e for e in report.events if e.type == "episode.started"]
    assert {(e.domain, e.agent, e.model) for e in started} == {("support", "bot-7", "m-1")}
    steps = [e for e in report.events if e.type == "step.recorded"]
    assert {s.model for s in steps} == {"m-1"}


def test_dry_run_cli_summary_and_exit_code(tmp_path):
    """One valid and one broken file: the summary counts both, names the reason, exit code 1."""
    shutil.copy(FIXTURES / "openai/weather_tools.json", tmp_path / "ok.json")
    shutil.copy(FIXTURES / "invalid/truncated.json", tmp_path / "bad.json")
    (tmp_path / "notes.txt").write_text("not a log")
    result = subprocess.run(
        [*AGENTSTREAM, "ingest", str(tmp_path), "--dry-run", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["files"], summary["files_ok"], summary["episodes"], summary["steps"]) == (2, 1, 1, 3)
    assert summary["events_published"] == 0 and summary["dry_run"] is True
    assert summary["skipped_by_suffix"] == [str(tmp_path / "notes.txt")]
    bad = next(f for f in summary["per_file"] if f["path"].endswith("bad.json"))
    assert "not valid JSON" in bad["rejected"][0]["reason"]


def test_dry_run_cli_all_valid_exits_zero():
    result = subprocess.run(
        [*AGENTSTREAM, "ingest", str(FIXTURES / "openhands"), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ingest: 4 files (4 ok, 0 with rejections), 5 episodes, 15 steps")
    assert "dry run: nothing published" in result.stdout


def test_cli_format_choices_match_the_adapters():
    from infra.cli.main import build_parser

    parser = build_parser()
    ingest = parser._subparsers._group_actions[0].choices["ingest"]
    [fmt] = [a for a in ingest._actions if a.dest == "format"]
    assert set(fmt.choices) == set(FORMATS)
