"""Options generated from config dataclasses (infra/options/configs.py): written once, parsed back,
forwarded."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from infra.options.configs import add_config_options, config_from_args, config_from_settings, config_to_argv
from infra.options.env import add_common_options, apply_env_defaults
from schemas.errors import AgentstreamError


class ExampleError(AgentstreamError):
    pass


@dataclass(frozen=True)
class Inner:
    margin: float = field(default=0.1, metadata={"help": "minimum margin"})
    strategy: Literal["best_worst", "all"] = field(default="best_worst", metadata={"help": "pairing"})


@dataclass(frozen=True)
class Example:
    computed: str = "not an option"  # no help: not on the command line
    count: int = field(default=3, metadata={"help": "how many"})
    kinds: tuple[str, ...] = field(default=("a", "b"), metadata={"help": "comma-separated kinds"})
    horizon: tuple[int, ...] = field(default=(), metadata={"help": "step horizons"})
    path: Path | None = field(
        default=None, metadata={"flag": "--file", "env": "EXAMPLE_FILE", "help": "a file"}
    )
    strict: bool = field(default=True, metadata={"help": "refuse bad rows"})
    inner: Inner = field(default_factory=Inner, metadata={"prefix": "dpo-"})

    def __post_init__(self):
        if self.count < 0:
            raise ExampleError(f"--count: must be >= 0, got {self.count!r}")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_options(parser, Example)
    args = parser.parse_args(argv)
    apply_env_defaults(parser, args)
    return args


def test_defaults_when_nothing_is_given():
    assert config_from_args(Example, parse([])) == Example()


def test_every_documented_field_is_an_option_with_its_help_and_env_var():
    parser = argparse.ArgumentParser()
    add_config_options(parser, Example)
    text = parser.format_help()
    for flag in ("--count", "--kinds", "--horizon", "--file", "--strict", "--dpo-margin", "--dpo-strategy"):
        assert flag in text
    assert "--computed" not in text
    assert "AGENTSTREAM_COUNT" in text and "EXAMPLE_FILE" in text and "AGENTSTREAM_DPO_MARGIN" in text


def test_values_are_converted_to_the_field_types():
    argv = "--count 7 --kinds x,y --horizon 8,12 --file /tmp/f --no-strict"
    argv += " --dpo-margin 0.5 --dpo-strategy all"
    args = parse(argv.split())
    config = config_from_args(Example, args)
    assert config == Example(
        count=7, kinds=("x", "y"), horizon=(8, 12), path=Path("/tmp/f"), strict=False, inner=Inner(0.5, "all")
    )


def test_environment_fills_what_the_command_line_left_out(monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_COUNT", "9")
    monkeypatch.setenv("AGENTSTREAM_DPO_MARGIN", "0.25")
    config = config_from_args(Example, parse(["--kinds", "z"]))
    assert (config.count, config.kinds, config.inner.margin) == (9, ("z",), 0.25)


def test_a_bad_choice_or_type_is_refused_by_the_parser():
    with pytest.raises(SystemExit):
        parse(["--dpo-strategy", "random"])
    with pytest.raises(SystemExit):
        parse(["--count", "many"])


def test_validation_stays_in_the_config_and_names_the_flag():
    with pytest.raises(ExampleError, match=r"--count: must be >= 0, got -1"):
        config_from_args(Example, parse(["--count", "-1"]))


def test_computed_values_override_options():
    assert config_from_args(Example, parse(["--count", "2"]), count=5, computed="x").count == 5


def test_config_to_argv_rebuilds_the_same_config_in_a_child():
    config = Example(
        count=4, kinds=("q",), horizon=(3,), path=Path("/p"), strict=False, inner=Inner(0.3, "all")
    )
    argv = config_to_argv(config)
    assert "--no-strict" in argv  # a boolean is a flag, never `--strict false`
    assert config_from_args(Example, parse(argv)) == config
    assert config_to_argv(Example()) == []  # defaults are not repeated


def test_a_bad_path_is_a_one_line_error_naming_it(tmp_path, capsys):
    from infra.cli.main import main

    (tmp_path / "f.txt").write_text("a file, not a directory")
    code = main(["schema", "export", str(tmp_path / "f.txt" / "sub")])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("agentstream: error: ") and err.count("\n") == 1, err
    assert "f.txt" in err and "Traceback" not in err


@dataclass(frozen=True)
class Connected:
    bootstrap_servers: str = ""
    clickhouse_url: str = ""
    batch: int = field(default=1, metadata={"help": "rows a batch"})


def test_config_from_settings_fills_the_connection_fields_a_config_has(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTSTREAM_BOOTSTRAP_SERVERS", "kafka:9092")
    parser = argparse.ArgumentParser()
    add_common_options(parser)
    add_config_options(parser, Connected)
    args = parser.parse_args(["--data-dir", str(tmp_path), "--batch", "4"])
    apply_env_defaults(parser, args)
    config = config_from_settings(Connected, args)
    # no data_dir field: not passed; the ClickHouse URL defaults to chDB under --data-dir
    assert config == Connected("kafka:9092", f"chdb://{(tmp_path / 'clickhouse').resolve()}", 4)
    assert (
        config_from_settings(Connected, args, clickhouse_url="http://ch:8123").clickhouse_url
        == "http://ch:8123"
    )
