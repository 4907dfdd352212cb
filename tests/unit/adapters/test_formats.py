"""Each log adapter: a fixture in the agent's real format converts to the expected events."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from producers.adapters.ingest import FileReport, convert_file

FIXTURES = Path(__file__).resolve().parents[2] / "data" / "adapters"
MTIME = datetime(2026, 1, 1, tzinfo=UTC)


def convert(relative: str, fmt: str = "auto") -> FileReport:
    path = FIXTURES / relative
    report = convert_file(path, path.read_bytes(), MTIME, fmt)
    assert report.rejections == [], report.rejections
    return report


def episodes(report: FileReport) -> list[tuple]:
    """(started, [steps], ended) per trajectory, in file order."""
    out, current = [], None
    for event in report.events:
        if event.type == "episode.started":
            current = (event, [], None)
        elif event.type == "step.recorded":
            current[1].append(event)
        else:
            out.append((current[0], current[1], event))
    return out


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# --- OpenHands ------------------------------------------------------------------------------------


def test_openhands_trajectory_array():
    report = convert("openhands/session_trajectory.json")
    assert report.format == "openhands"
    [(started, steps, ended)] = episodes(report)
    assert started.task == "Fix the failing test in calc.py: add(2, 2) returns 5."
    assert (started.agent, started.model, started.domain) == (
        "openhands/CodeActAgent",
        "claude-3-5-sonnet-20241022",
        "coding",
    )
    assert started.task_id == "session_trajectory"
    assert started.metadata["skipped_events"] == {"observation:recall": 1, "recall": 1, "system": 1}
    assert started.metadata["naive_timestamps_read_as_utc"] is True
    assert [s.tool for s in steps] == ["bash", "read_file", "edit_file", "edit_file", "bash", "finish"]
    run, read, bad_edit, good_edit, rerun, finish = steps
    assert run.params == {"command": "cd /workspace && python -m pytest -q"}
    assert run.thought == "Let me run the tests first."
    assert run.exit_code == 1 and "assert 5 == 4" in run.observation
    assert (run.input_tokens, run.output_tokens) == (5920, 40)
    assert run.occurred_at == utc("2025-04-30T16:32:57.821635")
    assert read.params == {"path": "/workspace/calc.py", "start": 0, "end": -1, "command": "view"}
    assert "return a + b + 1" in read.observation
    assert bad_edit.params == {
        "path": "/workspace/calc.py",
        "command": "str_replace",
        "old_str": "return a + b  + 1",
        "new_str": "return a + b",
    }
    assert bad_edit.error.startswith("ERROR:\nNo replacement was performed")
    assert good_edit.error is None and "has been edited" in good_edit.observation
    assert rerun.exit_code == 0 and rerun.observation == ".\n1 passed in 0.01s"
    assert finish.params["task_completed"] == "true"
    assert (ended.success, ended.score, ended.outcome_source) == (True, None, "finish.task_completed")
    assert ended.total_steps == 6 and ended.terminated and not ended.truncated
    assert (ended.input_tokens, ended.output_tokens) == (5920 + 6100 + 6300 + 6500 + 6700 + 6800, 220)
    assert started.occurred_at == utc("2025-04-30T16:32:54.707474")
    assert ended.occurred_at == utc("2025-04-30T16:33:12.100000")


def test_openhands_jsonl_events_old_style_and_chat_reply():
    report = convert("openhands/events.jsonl")
    [(started, steps, ended)] = episodes(report)
    assert started.task == "How many Python files are in /repo?"
    assert [s.tool for s in steps] == ["bash", "message", "finish"]
    assert steps[0].exit_code == 0 and steps[0].observation == "42"  # extras.exit_code, paired without cause
    assert steps[1].params == {"content": "There are 42 Python files in /repo."}
    assert steps[1].observation == "Thanks, that's all."  # the user's reply
    assert ended.success and ended.outcome_source == "finish_action"


def test_openhands_eval_output_one_episode_per_instance():
    report = convert("openhands/eval_output.jsonl")
    (s1, steps1, e1), (s2, _, e2) = episodes(report)
    assert (s1.task_id, s2.task_id) == ("ponylang__ponyc-4595", "ponylang__ponyc-4583")
    assert s1.task.startswith("<uploaded_files>")
    assert s1.model == "openai/openrouter-llama-4-maverick"
    assert [s.tool for s in steps1] == ["bash", "finish"]
    assert (e1.success, e1.score, e1.outcome_source) == (True, 1.0, "test_result.report.resolved")
    assert (e2.success, e2.score) == (False, 0.0)
    assert (e1.input_tokens, e1.output_tokens, e1.cost_usd) == (565158, 2558, 0.12)
    assert s1.trajectory_id != s2.trajectory_id


def test_openhands_older_edit_refused_call_and_iteration_limit():
    report = convert("openhands/older_edit_refused_call.json")
    [(_, steps, ended)] = episodes(report)
    create, refused = steps
    # args held an empty `content`; the model's tool call in tool_call_metadata has the real arguments
    assert create.tool == "write_file"
    assert create.params["command"] == "create"
    assert create.params["file_text"] == "<!DOCTYPE html>\n<title>Todo</title>\n"
    assert refused.tool == "invalid" and refused.error.startswith("Parameter 'command' is expected")
    assert (ended.success, ended.truncated, ended.outcome_source) == (False, True, "unknown")
    assert ended.error.startswith("RuntimeError: Agent reached maximum iteration")


# --- SWE-agent ------------------------------------------------------------------------------------


def test_swe_agent_traj():
    report = convert("swe_agent/marshmallow-code__marshmallow-1867.traj")
    assert report.format == "swe-agent"
    [(started, steps, ended)] = episodes(report)
    assert started.task_id == "marshmallow-code__marshmallow-1867"
    assert started.task.startswith("TimeDelta serialization precision")
    assert (started.agent, started.model, started.domain) == ("swe-agent", "gpt-4o", "coding")
    assert [s.tool for s in steps] == [
        "write_file",
        "edit_file",
        "bash",
        "search",
        "read_file",
        "edit_file",
        "submit",
    ]
    assert steps[0].params == {"command": "create reproduce.py", "path": "reproduce.py"}
    assert steps[1].params["path"] == "/testbed/reproduce.py"  # edit acts on the open file
    assert steps[2].params == {"command": "python reproduce.py"} and steps[2].observation == "344"
    assert steps[4].params["path"] == "src/marshmallow/fields.py"
    assert steps[6].observation.startswith("diff --git")
    assert steps[2].thought == "Run it to see the bug."
    assert all(s.exit_code is None for s in steps)  # SWE-agent logs no exit codes
    assert (ended.success, ended.score, ended.outcome_source) == (True, None, "info.exit_status")
    assert (ended.input_tokens, ended.output_tokens, ended.cost_usd) == (27510, 612, 0.0832)
    # no timestamps in a .traj: mtime + index (ms), and metadata says so
    assert started.metadata["timestamps"] == "derived_from_mtime"
    assert [s.occurred_at.microsecond for s in steps] == [1000 * (i + 1) for i in range(7)]
    assert started.metadata["exit_status"] == "submitted"


@pytest.mark.parametrize(
    ("status", "success", "truncated", "error"),
    [
        ("submitted", True, False, None),
        ("submitted (exit_cost)", False, True, None),
        ("exit_context", False, True, None),
        ("exit_format", False, False, "exit_status=exit_format"),
    ],
)
def test_swe_agent_exit_status_rule(tmp_path, status, success, truncated, error):
    import orjson

    data = orjson.loads((FIXTURES / "swe_agent/marshmallow-code__marshmallow-1867.traj").read_bytes())
    data["info"]["exit_status"] = status
    path = tmp_path / "x.traj"
    path.write_bytes(orjson.dumps(data))
    [(_, _, ended)] = episodes(convert_file(path, path.read_bytes(), MTIME))
    assert (ended.success, ended.truncated, ended.error, ended.score) == (success, truncated, error, None)


# --- mini-swe-agent -------------------------------------------------------------------------------


def test_mini_swe_agent_v2_tool_calls():
    report = convert("mini_swe_agent/django__django-11099.traj.json")
    assert report.format == "mini-swe-agent"
    [(started, steps, ended)] = episodes(report)
    assert started.task_id == "django__django-11099"
    assert started.model == "anthropic/claude-sonnet-4-5-20250929"
    assert [s.tool for s in steps] == ["bash", "bash", "bash", "submit"]
    assert steps[0].params == {"command": "grep -n regex django/contrib/auth/validators.py"}
    assert steps[0].thought == "Let me find the validators."
    assert steps[0].exit_code == 0 and '"returncode": 0' in steps[0].observation
    assert steps[2].exit_code == 1
    assert steps[3].observation.startswith("diff --git")  # the exit message carries the submission
    assert steps[0].occurred_at == datetime.fromtimestamp(1761000000.0, UTC)
    assert (steps[0].input_tokens, steps[0].output_tokens) == (2100, 60)
    assert (ended.success, ended.outcome_source, ended.cost_usd) == (True, "info.exit_status", 0.0302)
    assert started.metadata["timestamps"] == "log"


def test_mini_swe_agent_v1_text_actions_and_format_error():
    report = convert("mini_swe_agent/v1_textbased.traj.json")
    [(started, steps, ended)] = episodes(report)
    assert started.task.startswith("Please solve this issue")
    assert [s.tool for s in steps] == ["bash", "invalid", "bash"]
    assert steps[0].params == {"command": "ls -la"} and steps[0].thought == "THOUGHT: First I list the files."
    assert steps[0].exit_code == 0  # parsed from <returncode>
    assert steps[1].error.startswith("FormatError") and "EXACTLY ONE action" in steps[1].observation
    assert steps[2].exit_code == 1
    assert (ended.success, ended.truncated, ended.terminated) == (False, True, False)


# --- OpenAI / Anthropic ---------------------------------------------------------------------------


def test_openai_tool_calls():
    report = convert("openai/weather_tools.json")
    assert report.format == "openai"
    [(started, steps, ended)] = episodes(report)
    assert (started.task_id, started.model, started.domain) == (
        "weather-paris-bogota",
        "gpt-4o-2024-08-06",
        "generic",
    )
    assert started.task == "What's the weather like in Paris and Bogotá today?"
    assert [s.tool for s in steps] == ["get_weather", "get_weather", "message"]
    assert steps[0].params == {"location": "Paris, France"}  # arguments JSON string decoded
    assert steps[1].observation == '{"temperature_c": 18, "conditions": "rain"}'  # paired by tool_call_id
    assert steps[0].thought == "I'll look up both cities." and steps[1].thought == ""
    assert steps[2].observation == "Thanks!"
    assert (ended.success, ended.outcome_source) == (True, "record.success")


def test_openai_finetune_jsonl_one_episode_per_line():
    report = convert("openai/finetune.jsonl")
    (s1, steps1, e1), (s2, steps2, e2) = episodes(report)
    assert (s1.task_id, s1.domain) == ("finetune-0", "conversation")
    assert [s.tool for s in steps1] == ["message"] and steps1[0].params == {"content": "4"}
    assert (e1.success, e1.score, e1.outcome_source) == (False, None, "unknown")
    assert s2.task_id == "ls-tmp"
    assert steps2[0].tool == "bash" and steps2[0].observation == "a.txt\nb.txt"
    assert (e2.score, e2.outcome_source) == (0.5, "metadata.score")


def test_openai_invalid_arguments_are_kept_with_an_error(tmp_path):
    path = tmp_path / "chat.json"
    path.write_text(
        '{"messages": [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [{"id": "c1", '
        '"type": "function", "function": {"name": "bash", "arguments": "{\\"command\\": "}}]}, '
        '{"role": "tool", "tool_call_id": "c1", "content": "?"}]}'
    )
    [(_, [step], _)] = episodes(convert_file(path, path.read_bytes(), MTIME))
    assert step.params == {"arguments": '{"command": '}
    assert step.error.startswith("arguments are not valid JSON")


def test_anthropic_messages_transcript():
    report = convert("anthropic/messages_transcript.json")
    assert report.format == "anthropic"
    [(started, steps, ended)] = episodes(report)
    assert started.model == "claude-sonnet-4-5-20250929"
    assert started.metadata["system_prompt"].startswith("You are a coding agent")
    assert [s.tool for s in steps] == ["bash", "read_file", "edit_file", "message"]
    assert steps[0].thought == "I should run the tests first.\nLet me run the tests."
    assert steps[0].params == {"command": "pytest -q tests/test_calc.py"}
    assert steps[0].observation == "E   assert 5 == 4\n1 failed"
    assert steps[1].observation.startswith("1: def add(a, b):")  # block-list tool_result content
    assert steps[2].error == "No replacement was performed: old_str not found"  # is_error
    assert steps[1].error is None
    assert (ended.success, ended.score, ended.outcome_source) == (False, None, "unknown")


def test_claude_code_session():
    report = convert("anthropic/claude_code_session.jsonl")
    [(started, steps, ended)] = episodes(report)
    assert (started.task_id, started.agent, started.domain) == (
        "95e6f011-ec33-4b37-91ad-5d242b40ae3d",
        "claude-code",
        "coding",
    )
    assert started.task == "Fix the off-by-one in calc.py"
    assert started.model == "claude-opus-4-5-20251101"
    assert [s.tool for s in steps] == ["read_file", "edit_file", "message"]
    assert steps[0].thought == "I'll read the file first."  # text and tool_use split over two entries
    assert steps[0].params == {"file_path": "/home/dev/calc/calc.py"}
    assert steps[0].input_tokens == 4 + 1200 + 9000 and steps[0].output_tokens == 85
    assert steps[1].observation == "The file /home/dev/calc/calc.py has been updated."
    assert steps[0].occurred_at == datetime(2026, 1, 20, 11, 57, 20, 100000, UTC)
    assert started.occurred_at == datetime(2026, 1, 20, 11, 57, 17, 716000, UTC)
    assert started.metadata["skipped_entries"] == {"meta": 1, "queue-operation": 1}
    assert (ended.success, ended.outcome_source) == (False, "unknown")  # Claude Code states no outcome
    assert ended.output_tokens == 85 + 140 + 12


def test_agentstream_jsonl_keeps_ids():
    report = convert("agentstream/events.jsonl")
    assert report.format == "jsonl"
    assert [e.event_id for e in report.events] == ["e-start", "e-s0", "e-s1", "e-end"]
    assert (report.episodes, report.steps) == (1, 2)


def test_agentstream_jsonl_rejects_a_bad_line_keeps_the_rest(tmp_path):
    lines = (FIXTURES / "agentstream/events.jsonl").read_text().splitlines()
    lines.insert(2, '{"event_id": "x", "type": "step.recorded", "trajectory_id": "t", "occurred_at": "nope"}')
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = convert_file(path, path.read_bytes(), MTIME)
    assert len(report.events) == 4
    [rejection] = report.rejections
    assert rejection.where.endswith("line 3") and "occurred_at" in rejection.reason


def test_later_user_messages_are_kept_in_metadata(tmp_path):
    import orjson

    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    messages = [
        {"role": "user", "content": "count files"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "a b"},
        {"role": "user", "content": "also hidden ones"},
    ]
    path = tmp_path / "chat.json"
    path.write_bytes(orjson.dumps({"messages": messages}))
    [(started, [step], _)] = episodes(convert_file(path, path.read_bytes(), MTIME))
    assert step.observation == "a b" and step.params == {"command": "ls"}
    assert started.metadata["later_user_messages"] == ["also hidden ones"]


def test_swe_agent_retry_attempts_are_one_episode_each(tmp_path):
    import orjson

    data = orjson.loads((FIXTURES / "swe_agent/marshmallow-code__marshmallow-1867.traj").read_bytes())
    retry = {
        "attempts": [
            data,
            {**data, "trajectory": data["trajectory"][:2], "info": {"exit_status": "exit_cost"}},
        ]
    }
    path = tmp_path / "retry.traj"
    path.write_bytes(orjson.dumps(retry))
    report = convert_file(path, path.read_bytes(), MTIME)
    assert report.format == "swe-agent" and report.rejections == []
    (s1, steps1, e1), (s2, steps2, e2) = episodes(report)
    assert (len(steps1), len(steps2)) == (7, 2)
    assert (e1.success, e2.success, e2.truncated) == (True, False, True)
    assert s1.trajectory_id != s2.trajectory_id
