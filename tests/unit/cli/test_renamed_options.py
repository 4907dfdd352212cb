"""`trainer` meant the batch builder and sat beside `train` (the training executor): its user-facing
names are `batch` now. The old spellings still work for one release, each with a one-line note on
stderr: `up --trainer / --no-trainer` and `AGENTSTREAM_TRAINER`, replay's `--trainer-idle-s`,
`--trainer-flush-s`, `--trainer-kinds` and its role `trainer`."""

from __future__ import annotations

import pytest

from infra.cli.main import build_parser, main
from infra.commands import replay as replay_commands
from infra.commands import stack as stack_commands
from infra.replay import ReplayError, ReplayPlan, current_roles


@pytest.fixture(autouse=True)
def _no_stack_variables(monkeypatch):
    for name in ("AGENTSTREAM_BATCH", "AGENTSTREAM_TRAINER", "AGENTSTREAM_CONSOLE"):
        monkeypatch.delenv(name, raising=False)


def run(monkeypatch, module, handler: str, argv: list[str]):
    """`main(argv)` with the command's handler replaced by one that keeps its arguments."""
    seen = []
    monkeypatch.setattr(module, handler, lambda args: seen.append(args) or 0)
    assert main(argv) == 0
    return seen[0]


def up(monkeypatch, *argv: str):
    return run(monkeypatch, stack_commands, "up_command", ["up", *argv])


def test_batch_switches_the_batch_builder_quietly(monkeypatch, capsys, tmp_path):
    assert up(monkeypatch).batch is True
    args = up(monkeypatch, "--no-batch", "--data-dir", str(tmp_path))
    assert args.batch is False
    assert stack_commands._stack_config(args).batch is False
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("old", "new", "value"), [("--no-trainer", "--no-batch", False), ("--trainer", "--batch", True)]
)
def test_the_old_switch_still_works_after_a_one_line_note(old, new, value, monkeypatch, capsys):
    monkeypatch.setenv("AGENTSTREAM_BATCH", str(not value).lower())  # the command line beats it
    assert up(monkeypatch, old).batch is value
    err = capsys.readouterr().err
    assert err == f"agentstream: {old} is now {new}; the old name goes in the next release\n"


def test_the_old_variable_still_works_after_a_one_line_note(monkeypatch, capsys):
    monkeypatch.setenv("AGENTSTREAM_TRAINER", "false")
    assert up(monkeypatch).batch is False
    note = "agentstream: AGENTSTREAM_TRAINER is now AGENTSTREAM_BATCH; the old name goes in the next release"
    assert capsys.readouterr().err == note + "\n"


def test_the_new_variable_wins_over_the_old_one_without_a_note(monkeypatch, capsys):
    monkeypatch.setenv("AGENTSTREAM_TRAINER", "false")
    monkeypatch.setenv("AGENTSTREAM_BATCH", "true")
    assert up(monkeypatch).batch is True
    assert capsys.readouterr().err == ""


def test_up_help_shows_the_new_switch_only():
    sub = next(a for a in build_parser()._actions if a.dest == "_command").choices["up"]
    text = sub.format_help()
    assert "--batch, --no-batch" in text and "AGENTSTREAM_BATCH" in text
    assert "--trainer" not in text and "--train, --no-train" in text


def replay(monkeypatch, *argv: str):
    return run(monkeypatch, replay_commands, "run_replay", ["replay", "--reward-version", "v", *argv])


def test_the_batch_options_reach_the_replayed_batch_builder(monkeypatch, capsys):
    args = replay(monkeypatch, "--batch-idle-s", "3", "--batch-flush-s", "0.5", "--batch-kinds", "grpo")
    assert capsys.readouterr().err == ""
    argv = replay_commands._worker_args(args, ReplayPlan(("batch",), "v", "p"), "batch")
    assert argv[:3] == ("batch", "--group-id", "p-batch")
    assert argv[argv.index("--idle-exit-s") + 1] == "3.0"
    assert argv[argv.index("--flush-interval-s") + 1] == "0.5"
    assert argv[-2:] == ("--kinds", "grpo")


def test_the_old_replay_options_still_work_after_a_note_each(monkeypatch, capsys):
    args = replay(monkeypatch, "--trainer-idle-s", "3", "--trainer-flush-s", "0.5", "--trainer-kinds", "sft")
    assert (args.batch_idle_s, args.batch_flush_s, args.batch_kinds) == (3.0, 0.5, "sft")  # typed alike
    notes = capsys.readouterr().err.splitlines()
    assert notes == [
        f"agentstream: --trainer-{name} is now --batch-{name}; the old name goes in the next release"
        for name in ("idle-s", "flush-s", "kinds")
    ]


def test_the_old_replay_role_name_is_the_batch_role_with_a_note():
    assert current_roles(("scoring", "batch")) == (("scoring", "batch"), [])
    roles, notes = current_roles(("trainer", "scoring", "trainer"))
    assert roles == ("batch", "scoring", "batch")
    assert notes == [
        "agentstream: replay role `trainer` is now `batch`; the old name goes in the next release"
    ]


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (["--no-from-beginning"], "--no-from-beginning: give --since TIME"),
        (["--from-beginning", "--since", "2026-11-25T00:00:00"], "--from-beginning and --since: give one"),
    ],
)
def test_where_a_replay_starts_is_said_once(argv, refusal, monkeypatch):
    monkeypatch.delenv("AGENTSTREAM_FROM_BEGINNING", raising=False)
    with pytest.raises(ReplayError, match=refusal):
        replay_commands.check_start(replay(monkeypatch, *argv))


@pytest.mark.parametrize("argv", [[], ["--from-beginning"], ["--since", "2026-11-25T00:00:00"]])
def test_the_beginning_or_a_time_is_a_start(argv, monkeypatch):
    monkeypatch.delenv("AGENTSTREAM_FROM_BEGINNING", raising=False)
    replay_commands.check_start(replay(monkeypatch, *argv))  # no refusal


def test_replay_expect_judge_is_a_flag_pair(monkeypatch):
    monkeypatch.delenv("AGENTSTREAM_EXPECT_JUDGE", raising=False)
    plan = ReplayPlan(("scoring",), "v", "p")
    on = replay(monkeypatch, "--expect-judge")
    assert "--expect-judge" in replay_commands._worker_args(on, plan, "scoring")
    off = replay(monkeypatch, "--expect-judge", "--no-expect-judge")
    assert "--expect-judge" not in replay_commands._worker_args(off, plan, "scoring")
