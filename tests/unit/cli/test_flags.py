"""Flags are flags: a boolean option is `--x` / `--no-x` and takes no value, so it can stand anywhere
on the command line; its environment variable still says true/false/1/0."""

from __future__ import annotations

import argparse

import pytest

from infra.cli.main import build_parser
from infra.options.env import EnvFlag, RenamedOption, add_option, apply_env_defaults, parse_bool


def parse(argv: list[str]):
    parser = build_parser()
    args = parser.parse_args(argv)
    apply_env_defaults(parser, args)
    return args


@pytest.mark.parametrize(
    "argv",
    [
        ["ingest", "runs/x.traj", "--json"],
        ["ingest", "--json", "runs/x.traj"],
        ["ingest", "--dry-run", "--json", "runs/x.traj"],
        ["ingest", "--json", "--dry-run", "runs/x.traj"],
    ],
)
def test_a_flag_before_or_after_the_path_parses_alike(argv, monkeypatch):
    monkeypatch.delenv("AGENTSTREAM_JSON", raising=False)
    args = parse(argv)
    assert args.paths == ["runs/x.traj"]
    assert args.json is True


def test_the_no_form_turns_a_flag_off_and_the_last_one_wins(monkeypatch):
    monkeypatch.delenv("AGENTSTREAM_JSON", raising=False)
    assert parse(["ingest", "--no-json", "runs/x.traj"]).json is False
    assert parse(["ingest", "--json", "--no-json", "runs/x.traj"]).json is False
    assert parse(["ingest", "runs/x.traj"]).json is False  # the default


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("1", True), ("false", False), ("0", False)])
def test_the_environment_variable_still_says_true_or_false(value, expected, monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_JSON", value)
    assert parse(["ingest", "runs/x.traj"]).json is expected


def test_the_command_line_beats_the_environment(monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_JSON", "true")
    assert parse(["ingest", "--no-json", "runs/x.traj"]).json is False
    monkeypatch.setenv("AGENTSTREAM_JSON", "false")
    assert parse(["ingest", "--json", "runs/x.traj"]).json is True


def test_a_flag_given_a_value_is_refused(capsys, monkeypatch):
    monkeypatch.delenv("AGENTSTREAM_JSON", raising=False)
    args = parse(["ingest", "--json", "true"])  # `true` is read as a path, never as the flag's value
    assert args.paths == ["true"] and args.json is True
    with pytest.raises(SystemExit):
        parse(["ingest", "--json=true", "runs/x.traj"])
    assert "ignored explicit argument" in capsys.readouterr().err


def test_a_bad_environment_value_names_the_variable(capsys, monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_JSON", "maybe")
    with pytest.raises(SystemExit):
        parse(["ingest", "runs/x.traj"])
    assert "AGENTSTREAM_JSON='maybe'" in capsys.readouterr().err


def test_help_shows_both_forms():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "_command").choices["ingest"]
    text = sub.format_help()
    assert "--json, --no-json" in text and "--json | --no-json" in text


def plain_booleans(parser: argparse.ArgumentParser) -> list[str]:
    """Every boolean option of `parser` and its subcommands that is not a flag pair (`EnvFlag`,
    argparse's `BooleanOptionalAction`, or the hidden old spelling of one): a plain `store_true`
    (`--x` with no `--no-x`), or a boolean that takes a value (`--x [true|false]`)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += plain_booleans(sub)
        elif action.type is parse_bool or (
            action.nargs == 0 and not isinstance(action, (argparse._HelpAction, argparse._VersionAction))
        ):
            pair = isinstance(action, (EnvFlag, argparse.BooleanOptionalAction))
            if not pair and not (isinstance(action, RenamedOption) and isinstance(action.new, EnvFlag)):
                found.append(f"{parser.prog} {'/'.join(action.option_strings)}")
    return found


def test_every_boolean_option_of_every_command_is_a_flag_pair():
    assert plain_booleans(build_parser()) == [], "use add_option(..., action='store_true') (EnvFlag)"


def test_the_walk_finds_a_plain_store_true_in_a_subcommand():
    parser = argparse.ArgumentParser(prog="tiny")
    sub = parser.add_subparsers().add_parser("run")
    sub.add_argument("--fast", action="store_true")
    sub.add_argument("--quiet", action="store_const", const=True)
    add_option(sub, "--json", action="store_true")
    sub.add_argument("--color", action=argparse.BooleanOptionalAction)
    sub.add_argument("--dry-run", type=parse_bool, nargs="?", const=True)  # the old `--dry-run [BOOL]`
    assert plain_booleans(parser) == ["tiny run --fast", "tiny run --quiet", "tiny run --dry-run"]
