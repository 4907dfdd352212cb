"""One base model, one setting: `agentstream policy`, `train` and `batch` all read `--base-model` /
AGENTSTREAM_BASE_MODEL; the server's old variable AGENTSTREAM_POLICY_BASE_MODEL still works for one
release after a one-line note."""

from __future__ import annotations

import pytest

from consumers.batching.config import BatchBuilderConfig
from consumers.training.config import TrainRunConfig
from infra.cli.main import main
from infra.commands import batch_train
from infra.commands import policy as policy_commands
from infra.options.configs import config_from_args
from producers.policy.requests import PolicyConfig

COMMANDS = {
    "policy": (policy_commands, "run_policy", ["policy"], PolicyConfig),
    "train": (batch_train, "run_train", ["train", "--follow"], TrainRunConfig),
    "batch": (batch_train, "run_batch", ["batch"], BatchBuilderConfig),
}


@pytest.fixture(autouse=True)
def _no_base_variables(monkeypatch):
    for name in ("AGENTSTREAM_BASE_MODEL", "AGENTSTREAM_POLICY_BASE_MODEL"):
        monkeypatch.delenv(name, raising=False)


def base_of(monkeypatch, command: str, *argv: str) -> str:
    """The base model the command would run on, parsed as `main` parses it."""
    module, handler, words, config = COMMANDS[command]
    seen = []
    monkeypatch.setattr(module, handler, lambda args: seen.append(args) or 0)
    assert main([*words, *argv]) == 0
    built = config_from_args(config, seen[0])
    return built.train.base_model if command == "train" else built.base_model


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_part_reads_the_one_variable(command, monkeypatch, tmp_path, capsys):
    assert base_of(monkeypatch, command) == "tiny"
    monkeypatch.setenv("AGENTSTREAM_BASE_MODEL", str(tmp_path))
    assert base_of(monkeypatch, command) == str(tmp_path)
    assert base_of(monkeypatch, command, "--base-model", "/elsewhere") == "/elsewhere"  # the flag wins
    assert capsys.readouterr().err == ""


def test_the_servers_old_variable_still_works_after_a_one_line_note(monkeypatch, capsys):
    monkeypatch.setenv("AGENTSTREAM_POLICY_BASE_MODEL", "/old")
    assert base_of(monkeypatch, "policy") == "/old"
    note = "agentstream: AGENTSTREAM_POLICY_BASE_MODEL is now AGENTSTREAM_BASE_MODEL; the old name goes in"
    assert capsys.readouterr().err.startswith(note)
    monkeypatch.setenv("AGENTSTREAM_BASE_MODEL", "/new")  # the new one wins, quietly
    assert base_of(monkeypatch, "policy") == "/new" and capsys.readouterr().err == ""
