"""`agentstream batch` builds batches (`train` trains); `trainer`, its old name, still runs it for one
release after a one-line note on stderr."""

from __future__ import annotations

from infra.cli.main import build_parser, main
from infra.commands import batch_train as commands


def test_batch_runs_the_batch_builder_quietly(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(commands, "run_batch", lambda args: calls.append(args._command) or 0)
    assert main(["batch", "--group-size", "6"]) == 0
    assert calls == ["batch"]
    assert capsys.readouterr().err == ""


def test_the_old_name_runs_batch_after_a_one_line_note(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(commands, "run_batch", lambda args: calls.append(args.group_size) or 0)
    assert main(["trainer", "--group-size", "6"]) == 0
    assert calls == [6]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`trainer` is now `batch`" in err


def test_help_says_which_builds_and_which_trains():
    sub = next(a for a in build_parser()._actions if a.dest == "_command")
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    assert helps["batch"] == "build SFT / DPO / GRPO batches from trajectory.scored"
    assert helps["train"].startswith("train on batches")
    assert "deprecated" in helps["trainer"]


def test_the_stack_runs_batch_and_up_takes_flag_pairs(tmp_path):
    from infra.stack import components, embedded_config

    names = {c.name: c.args for c in components(embedded_config(tmp_path))}
    assert names["batch"][0] == "batch" and "trainer" not in names
    args = build_parser().parse_args(["up", "--no-batch", "--no-console"])
    assert (args.batch, args.console) == (False, False)
    args = build_parser().parse_args(["up"])
    assert (args.batch, args.console) == (True, True)
