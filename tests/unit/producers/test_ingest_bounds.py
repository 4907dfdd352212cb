"""`agentstream ingest` and the contract's bounds (issue #34): an out-of-bounds event in a log is a
rejection naming its line (or episode), the field, the value and the limit; never a crash, and the
rest of the file still lands."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from producers.adapters.ingest import convert_file
from schemas.limits import MAX_ID_CHARS, MAX_STEP_INDEX

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "adapters"
MTIME = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_step_index_over_the_bound_in_event_jsonl_is_rejected_with_its_line(tmp_path):
    lines = (FIXTURES / "agentstream/events.jsonl").read_text().splitlines()
    hostile = json.loads(next(line for line in lines if '"step.recorded"' in line))
    hostile.update(event_id="hostile", step_index=2**32)
    lines.insert(2, json.dumps(hostile))
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = convert_file(path, path.read_bytes(), MTIME)
    [rejection] = report.rejections
    assert rejection.where.endswith("line 3")
    assert "step_index" in rejection.reason and str(2**32) in rejection.reason
    assert str(MAX_STEP_INDEX) in rejection.reason
    assert len(report.events) == len(lines) - 1


def test_a_converted_episode_out_of_bounds_is_a_rejection_not_a_crash(tmp_path):
    path = tmp_path / "chat.json"
    tool = "t" * (MAX_ID_CHARS + 1)
    path.write_text(
        json.dumps(
            {"messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": tool, "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ]}
        )
    )  # fmt: skip
    report = convert_file(path, path.read_bytes(), MTIME)
    [rejection] = report.rejections
    assert "out of bounds" in rejection.reason and "tool" in rejection.reason
    assert f"at most {MAX_ID_CHARS} characters" in rejection.reason
    assert report.events == []
